#!/usr/bin/env bash
# Build llama.cpp's llama-server from the llama.cpp source that llama-cpp-python vendors,
# so the side-by-side benchmark (scripts/vs_llama_server.py) compares the same llama.cpp.
#
#   scripts/build_llama_server.sh [OUT_DIR]      (default: .llama-server)
#
# Extra CMake flags pick a GPU backend, as for `make install`:
#   LLAMA_CMAKE_ARGS="-DGGML_CUDA=on" scripts/build_llama_server.sh
# About 6 minutes on 2 cores. The binary lands in OUT_DIR/bin/llama-server.
set -euo pipefail

version=0.3.36
out=$(realpath -m "${1:-.llama-server}")
py=${PYTHON:-.venv/bin/python}
work="$out/src"
mkdir -p "$work"

if [ ! -d "$work/llama_cpp_python-$version" ]; then
  echo "fetching the llama-cpp-python $version source (it carries llama.cpp)..."
  "$py" -m pip download -q --no-deps --no-binary :all: --dest "$work" "llama-cpp-python==$version"
  tar -xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work"
fi
src="$work/llama_cpp_python-$version/vendor/llama.cpp"

# The same AMX opt-out as the Makefile: some VMs list AMX without enabling it.
flags=""
if [ "$(uname -m)" = x86_64 ]; then
  flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi

# shellcheck disable=SC2086  # LLAMA_CMAKE_ARGS is a list of flags
CFLAGS="$flags" CXXFLAGS="$flags" cmake -S "$src" -B "$out/build" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF ${LLAMA_CMAKE_ARGS:-} >/dev/null
cmake --build "$out/build" --target llama-server -j "$(nproc)"
mkdir -p "$out/bin"
cp "$out/build/bin/llama-server" "$out/bin/"
echo "built $out/bin/llama-server"
