# Everyday commands. `make chat` and `make test` create the virtualenv when it is missing.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PYTHON ?= $(shell command -v python3.11 || command -v python3)

# llama-cpp-python builds llama.cpp from source. On Linux the build is portable: ggml's CPU
# kernels for every x86-64 (or Arm) level, the best loaded at run time (GGML_BACKEND_DL), so
# one build serves this virtualenv and the one-file binary on any machine; measured as fast
# as a -march=native build here (docs/binary.md). Elsewhere (macOS) the build is native.
# LLAMA_CMAKE_ARGS adds flags, e.g. a GPU backend: make install LLAMA_CMAKE_ARGS="-DGGML_CUDA=on".
LLAMA_CMAKE_ARGS ?=
ifeq ($(shell uname -s),Linux)
PORTABLE := -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DCMAKE_INSTALL_BINDIR=llama_cpp/lib -DCMAKE_INSTALL_LIBDIR=llama_cpp/lib
# The AMX variant is left out: some VMs list AMX without enabling it, and the variant then
# dies of an illegal instruction on its first matrix product (seen here). Consumer CPUs have
# no AMX; servers that do get the AVX-512 variants.
DROP := --drop llama_cpp/lib/libggml-cpu-sapphirerapids.so
endif
# ggml's RPC backend, for `edgeinfer worker` and --rpc (docs/rpc.md).
RPC := -DGGML_RPC=ON
# GPU backends, each a loadable library beside the CPU kernels (docs/gpu.md). Vulkan (AMD, Intel and
# NVIDIA GPUs) is built whenever its headers, SPIR-V headers and glslc are installed (Debian: libvulkan-dev,
# spirv-headers, glslc; mesa-vulkan-drivers adds a software device); VULKAN=0
# leaves it out. CUDA=1 builds CUDA with NVIDIA's compiler from PyPI (scripts/cuda_toolchain.sh).
# With CUDA, Vulkan stays out unless VULKAN=1 is given: both would list one card twice.
CUDA ?= 0
ifeq ($(CUDA),1)
VULKAN ?= 0
# Make passes its command line's variables to recipes, not to $(shell): hand the list on by name.
CUDA_FLAGS := $(shell CUDA_ARCHITECTURES='$(CUDA_ARCHITECTURES)' PYTHON=$(if $(wildcard $(PY)),$(PY),$(PYTHON)) scripts/cuda_toolchain.sh --cmake-args)
ifeq ($(CUDA_FLAGS),)
$(error CUDA=1: scripts/cuda_toolchain.sh could not install NVIDIA's compiler from PyPI (its message is above))
endif
endif
ifeq ($(shell uname -s),Linux)
VULKAN ?= $(shell pkg-config --exists vulkan SPIRV-Headers 2>/dev/null && command -v glslc >/dev/null && echo 1 || echo 0)
endif
GPU := $(if $(filter 1,$(VULKAN)),-DGGML_VULKAN=ON) $(CUDA_FLAGS)
CMAKE_FLAGS := $(strip $(PORTABLE) $(RPC) $(GPU) $(LLAMA_CMAKE_ARGS))
# The built wheel is kept in the user's cache, one folder per llama-cpp-python version and
# build flags (and CPU, for a native build), so every clone on this machine, CI's included,
# reuses it; a new machine or new flags build from source.
LLAMA_CPP_PYTHON := 0.3.36
CPU_KEY := $(if $(PORTABLE),portable,$(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | md5sum | cut -c1-8))
# The patches scripts/build_llama_wheel.py applies to llama.cpp's source are part of the key: a changed patch builds again.
PATCHES_KEY := $(shell $(PYTHON) scripts/build_llama_wheel.py --patches-key)
WHEEL_KEY := $(shell printf '%s|%s|%s|%s|%s' "$(CMAKE_FLAGS)" "$(DROP)" "$$(uname -m)" "$(CPU_KEY)" "$(PATCHES_KEY)" | md5sum | cut -c1-10)
WHEEL_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/edgeinfer/wheels
WHEELS := $(WHEEL_CACHE)/llama-cpp-python-$(LLAMA_CPP_PYTHON)-$(WHEEL_KEY)

# The virtualenv's stamp names the llama.cpp build it holds: new flags install again.
STAMP := $(VENV)/.installed-$(WHEEL_KEY)

.PHONY: install chat binary test test-fast lint format typecheck bench clean clean-wheels

$(STAMP): pyproject.toml scripts/build_llama_wheel.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) scripts/build_llama_wheel.py --package llama-cpp-python==$(LLAMA_CPP_PYTHON) --out "$(WHEELS)" \
	  --cmake-args "$(CMAKE_FLAGS)" $(DROP)
	$(PY) -m pip install -q --no-deps --force-reinstall --no-index --find-links "$(WHEELS)" llama-cpp-python==$(LLAMA_CPP_PYTHON)
	$(PY) -m pip install -q --find-links "$(WHEELS)" --only-binary llama-cpp-python -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

chat: $(STAMP)
	$(VENV)/bin/edgeinfer chat

# One file with Python, edgeinfer, llama.cpp and the default model (docs/binary.md).
BINARY_SOURCES := $(shell git ls-files edgeinfer models tui 2>/dev/null) pyproject.toml scripts/build_binary.py

binary: dist/edgeinfer

dist/edgeinfer: $(STAMP) $(BINARY_SOURCES)
	$(PY) scripts/build_binary.py --out $@

# The 25 slowest tests are listed at the end: where the suite's time goes, on every run. The suite keeps
# about 1.6 cores busy alone; TEST_WORKERS pytest workers (pytest-xdist), each taking one test file at a
# time (its module servers with it), keep them all busy, the costliest files first (tests/module_seconds.json,
# docs/testing.md).
TEST_WORKERS ?= 2
test: $(STAMP) dist/edgeinfer
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

# The pure tier only (no model may load: tests/conftest.py): the inner loop, in seconds.
test-fast: $(STAMP)
	$(PY) -m pytest -q --tier pure

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(VENV)/bin/edgeinfer bench --plot bench-chat.png --json bench-chat.json

clean:
	rm -rf $(VENV) .wheels build dist

# The cached llama.cpp wheels of every flag set (the next install builds again).
clean-wheels:
	rm -rf "$(WHEEL_CACHE)"
