# Everyday commands. `make chat` and `make test` create the virtualenv when it is missing.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PYTHON ?= $(shell command -v python3.11 || command -v python3)

# llama-cpp-python builds llama.cpp from source. Extra CMake flags select a GPU backend,
# e.g. make install LLAMA_CMAKE_ARGS="-DGGML_CUDA=on" (see README, GPU builds).
LLAMA_CMAKE_ARGS ?=
# On x86-64 the native build would use AMX tile instructions wherever the CPU lists them;
# some VMs list AMX without enabling it, and llama.cpp then crashes on its first matrix
# product. Consumer CPUs have no AMX, so it is left out.
ifeq ($(shell uname -m),x86_64)
NOAMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
endif
WHEELS := .wheels/$(shell printf '%s|%s' "$(NOAMX)" "$(LLAMA_CMAKE_ARGS)" | md5sum | cut -c1-8)

.PHONY: install chat test test-fast lint format typecheck bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@if ! ls $(WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1; then \
	  echo "Building llama.cpp through llama-cpp-python (about 5 minutes on 2 cores)..."; \
	  CFLAGS="$(NOAMX)" CXXFLAGS="$(NOAMX)" CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip wheel -q --no-deps --no-cache-dir -w $(WHEELS) llama-cpp-python==0.3.36; \
	fi
	$(PY) -m pip install -q --find-links $(WHEELS) --only-binary llama-cpp-python -e '.[dev]'
	touch $@

install: $(VENV)/.installed

chat: $(VENV)/.installed
	$(VENV)/bin/edgeinfer chat

test: $(VENV)/.installed
	$(PY) -m pytest -q

# The pure tests only (no model loaded): the inner loop, in seconds.
test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -m "not model"

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: $(VENV)/.installed
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

typecheck: $(VENV)/.installed
	$(VENV)/bin/mypy

bench: $(VENV)/.installed
	$(VENV)/bin/edgeinfer bench --plot bench-chat.png --json bench-chat.json

clean:
	rm -rf $(VENV) .wheels
