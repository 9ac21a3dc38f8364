# Two commands do everything on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: setup demo test test-fast test-models test-dynamic test-ml test-gpu test-cross cross-tools lint bench bench-serve clean onnx-coverage \
	fuzz test-install
BENCH_STAMP := $(VENV)/.bench-stamp

# constraints.txt pins every version (pyproject.toml has the ranges users get), so runs are reproducible.
$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/python scripts/demo.py

test: $(STAMP)
	$(BIN)/ruff check svodc svodrt svodrt_gpu svodrt_strings svodrt_tools svodrt_serve tests scripts bench
	$(BIN)/python -m pytest -q -m "not gpu_sweep and not ml_slow" --ignore=tests/test_cross_emulated.py

# Everything but the end-to-end model tests and the conformance suite.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q --ignore=tests/test_light_models.py --ignore=tests/conformance \
		--ignore=tests/test_gpu_light_models.py --ignore=tests/test_cross_emulated.py

# All 9 light models for gfx942, gfx1100, sm_90 and sm_80, run on the stand-in driver with emulated
# kernels (make test runs two of them); and gfx1100 machine code run by the RDNA3 emulator
# (tests/gpu/rdna3/). No GPU needed; scripts/gpu_check.py is the on-hardware check.
test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q tests/test_gpu_light_models.py tests/test_gpu_codegen.py tests/test_gpu_runtime.py \
		tests/test_gpu_rdna3.py tests/test_rdna3_instructions.py tests/test_gpu_precision.py tests/test_gpu_check.py \
		tests/test_gpu_mma.py

# Cross-compiled code (aarch64, riscv64, ppc64le, s390x) executed under qemu-user: about 15 minutes
# on 2 idle cores (docs/architecture.md "Cross targets"), so not part of `make test`. Installs
# qemu-user and Debian's cross compilers with apt first.
cross-tools:
	bash scripts/install-cross-tools.sh

test-cross: $(STAMP) cross-tools
	$(BIN)/python -m pytest -q -rs --durations=0 tests/test_cross.py tests/test_cross_emulated.py

# The real models of ../shared/models against onnxruntime's outputs (also part of `make test`),
# with the max error per model printed.
test-ml: $(STAMP)
	$(BIN)/python -m pytest -q tests/test_ml_sklearn.py tests/test_ml_ops.py tests/test_string_ops.py

test-models: $(STAMP)
	$(BIN)/python -m pytest -q tests/test_models.py

# One bundle per model for a range of batch sizes (issue 12), against onnxruntime at every size, with
# the heavier models make test leaves out (mobilenetv2, ppocr cls: about 2 minutes on 2 cores).
test-dynamic: $(STAMP)
	$(BIN)/python -m pytest -q tests/test_dynamic.py tests/test_dynamic_models.py

# Run every onnx node test case and regenerate docs/onnx-coverage.md (also part of `make test`,
# which checks the pass count against tests/conformance/thresholds.json).
onnx-coverage: $(STAMP)
	$(BIN)/python -m tests.conformance

# 10,000 damaged bundles (a new seed each run; the test suite runs 2,000 with a fixed one).
fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzzing --count 10000

$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install -q -c constraints.txt -e '.[dev,bench]'
	touch $(BENCH_STAMP)

# Not a test: svod vs onnxruntime side by side; writes docs/benchmarks.md and docs/benchmarks.png.
bench: $(BENCH_STAMP)
	$(BIN)/python bench/run.py $(BENCH_ARGS)

# Not a test: `svodrt serve` under 8 concurrent clients x 250 requests (squeezenet, gpt2_small_random at seq 32),
# REST and gRPC, next to the in-process rate; writes docs/serving-bench.md (docs/serving.md).
bench-serve: $(STAMP)
	$(BIN)/python bench/serve.py $(BENCH_ARGS)

# The installs a user makes, each in a fresh venv (pip's cache or index; a few minutes, so not in `make
# test`): `pip install .` runs a bundle and its svodc names the extra; `pip install '.[compiler]'` compiles.
test-install:
	bash scripts/test_install.sh $(PY)

lint: $(STAMP)
	$(BIN)/ruff check svodc svodrt svodrt_gpu svodrt_strings svodrt_tools svodrt_serve tests scripts bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
