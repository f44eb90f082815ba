#!/usr/bin/env bash
# NVIDIA's CUDA compiler, runtime and cuBLAS from PyPI's wheels, laid out as one toolkit folder that
# CMake takes: a CUDA build of llama.cpp with no system CUDA toolkit (docs/gpu.md).
#
#   scripts/cuda_toolchain.sh               install it once (about 1.1 GB) and print its folder
#   scripts/cuda_toolchain.sh --cmake-args  the same, then print llama.cpp's CMake flags for it
#   make install CUDA=1                     what uses the second form
#
# CUDA 13's wheels all unpack into one tree (nvidia/cu13/{bin,include,lib}), which is what CMake's
# FindCUDAToolkit looks for. The GPUs compiled for, CUDA_ARCHITECTURES, default to consumer cards:
# 86 (RTX 30), 89 (RTX 40), 120a (RTX 50) as machine code, and 75 (RTX 20 and newer, data-centre
# cards such as the H100/H200 included) as PTX that the driver compiles at first load.
# Progress goes to stderr; stdout is only the answer.
set -euo pipefail

CUDA_MAJOR=13
ARCHS=${CUDA_ARCHITECTURES:-75-virtual;86-real;89-real;120a-real}
PYTHON=${PYTHON:-python3}
root=${XDG_CACHE_HOME:-$HOME/.cache}/edgeinfer/cuda-$CUDA_MAJOR
toolkit=$root/nvidia/cu$CUDA_MAJOR

if [ ! -x "$toolkit/bin/nvcc" ]; then
  echo "CUDA $CUDA_MAJOR toolchain: installing NVIDIA's wheels from PyPI into $root (about 1.1 GB, once)" >&2
  rm -rf "$root.partial"
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --target "$root.partial" \
    "nvidia-cuda-nvcc==$CUDA_MAJOR.*" "nvidia-nvvm==$CUDA_MAJOR.*" "nvidia-cuda-runtime==$CUDA_MAJOR.*" \
    "nvidia-cublas==$CUDA_MAJOR.*" "nvidia-cuda-cccl==$CUDA_MAJOR.*" >&2
  # The wheels ship the versioned libraries the runtime loads; linking needs the plain names.
  for lib in cudart cublas cublasLt; do
    ln -sf "$(basename "$(ls "$root.partial/nvidia/cu$CUDA_MAJOR/lib/lib$lib.so."*)")" \
      "$root.partial/nvidia/cu$CUDA_MAJOR/lib/lib$lib.so"
  done
  # CMake looks for the libraries in lib64 as well as lib.
  ln -sfn lib "$root.partial/nvidia/cu$CUDA_MAJOR/lib64"
  rm -rf "$root"
  mv "$root.partial" "$root"
fi

if [ "${1:-}" = "--cmake-args" ]; then
  # GGML_CUDA_NO_VMM: no link against the driver's libcuda, which the wheels do not have (the
  # driver installs it); memory pools then grow without virtual memory management.
  echo "-DGGML_CUDA=ON -DGGML_CUDA_NO_VMM=ON -DCMAKE_CUDA_COMPILER=$toolkit/bin/nvcc" \
    "-DCUDAToolkit_ROOT=$toolkit -DCMAKE_CUDA_ARCHITECTURES=$ARCHS"
else
  echo "$toolkit"
fi
