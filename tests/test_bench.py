"""Helpers of the benchmark suite (not timings): FLOP counting, the report, the CLI output."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch

from musketeers.bench import report as rp
from musketeers.bench.precompute_bench import non_embedding_params, summarize
from musketeers.bench.train_bench import expert_flop_share


def _llama(tied: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1,
                      tie_word_embeddings=tied)
    return LlamaForCausalLM(cfg)


@pytest.mark.parametrize("tied", [True, False])
def test_non_embedding_params_excludes_embedding_tables(tied):
    model = _llama(tied)
    d, vocab, inter = 16, 100, 32
    # per layer: q (16x16), k,v (16x8 each: 1 kv head of dim 8), o (16x16), mlp 3·16·32, 2 norms
    per_layer = 16 * 16 + 2 * 16 * 8 + 16 * 16 + 3 * d * inter + 2 * d
    assert non_embedding_params(model) == 2 * per_layer + d  # + the final norm
    total = sum(p.numel() for p in model.parameters())
    assert total - non_embedding_params(model) == vocab * d * (1 if tied else 2)


def test_expert_flop_share_matches_hand_count():
    r = {"completions_per_step": 4, "prompt_len": 10.0, "context_tokens": 2,
         "completion_len": [8.0, 8.0], "beta": 0.04, "inner_iters": 1, "policy_params": 1000,
         "expert_params": [100, 200], "expert_tokens_per_prompt": [12.0, 15.0],
         "prompts_per_step": 2}
    # every policy pass runs the 2 prefixes once and the 4 completions' own tokens
    policy = (2 + 2 + 4) * 1000 * (2 * (10 + 2) + 4 * 8)
    experts = 2 * 100 * 12 * 2 + 2 * 200 * 15 * 2
    assert expert_flop_share(r) == pytest.approx(experts / (experts + policy))


@pytest.mark.parametrize(("ceiling", "share"), [("fp32", "50%"), ("bf16", "5%")])
def test_precompute_fraction_is_of_its_own_dtypes_ceiling(ceiling, share):
    # 2 · 1e6 params · 1000 tokens in 1 s = 2 GFLOP/s; ceilings fp32 4, bf16 40 GFLOP/s
    r = {"expert": "x", "ceiling": ceiling, "tokens": 1000, "prompts": 10, "mean_len": 100,
         "max_len": 120, "params_nonembed": 10**6, "fast_s": [1.0], "naive_s": [10.0]}
    rep = rp.Report({}, {}, "cmd")
    summarize(rep, r, {"fp32": [4e9], "bf16": [40e9]}, "precompute", {"x": 0.3})
    flops_row = next(row for row in rep.rows if "achieved FLOP/s" in row.metric)
    assert f"= {share} of {ceiling}" in flops_row.value
    check = next(row for row in rep.rows if row.metric.endswith(f"of {ceiling} matmul"))
    assert check.status == ("PASS" if ceiling == "fp32" else "MISS")


def test_check_pass_miss_and_direction():
    rep = rp.Report({}, {}, "cmd")
    rep.check("s", "higher", 6.0, 5.0, "{:.1f}×")
    rep.check("s", "lower", 0.02, 0.01, "{:.1%}", higher_is_better=False)
    rep.check("s", "nan", float("nan"), 1.0, "{:.1f}")
    assert [r.status for r in rep.rows] == ["PASS", "MISS", "MISS"]
    assert rep.rows[1].target == "≤ 1.0%"


def test_markdown_lists_every_repetition_and_keeps_attempts(tmp_path):
    machine = {"cpu": "X", "physical_cores": 2, "logical_cpus": 2, "avx512_bf16": True,
               "amx_bf16": False, "memory_gib": 8, "gpu": "no GPU"}
    rep = rp.Report(machine, {"torch": "2"}, "python -m musketeers.bench")
    rep.measure("matmul", "bf16", "FLOP/s", [3.0, 1.0, 2.0])
    rep.row("trl", "a | b", "1 | 2", "≥ 2.5×", "MISS")
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# old\n\n## Measured by hand\n\n- tried X: predicted 2×, got 1.1×\n")
    rp.write_markdown(rep, out)
    text = out.read_text()
    assert "| matmul | bf16 | FLOP/s | 2 | 3, 1, 2 |" in text
    assert "a \\| b" in text  # a pipe inside a cell cannot break the table
    assert "avx512_bf16=yes, amx_bf16=no" in text
    assert "- tried X: predicted 2×, got 1.1×" in text and "# old" not in text


def test_a_partial_run_keeps_the_other_sections_of_the_same_machine(tmp_path):
    machine = {"cpu": "X", "physical_cores": 2, "logical_cpus": 2, "memory_gib": 8,
               "gpu": "no GPU"}
    order = ("matmul", "reads", "trl")
    out = tmp_path / "BENCHMARKS.md"
    full = rp.Report(machine, {}, "python -m musketeers.bench", sections=order, date="D1")
    for sec, v in (("matmul", 1.0), ("reads", 2.0), ("trl", 3.0)):
        full.measure(sec, "m", "s", [v])
        full.row(sec, "r", f"old {sec}")
    full.notes.append("trl: a note on the old trl rows")
    rp.write_markdown(full, out, order)
    part = rp.Report(machine, {}, "python -m musketeers.bench --only reads",
                     sections=("reads",), date="D2")
    part.measure("reads", "m", "s", [9.0])
    part.row("reads", "r", "new reads")
    rp.write_markdown(part, out, order)
    text = out.read_text()
    summary = text.split("## Summary")[1].split("## Raw")[0]
    assert [ln.split("|")[3].strip() for ln in summary.splitlines() if ln.startswith("| ")][1:] \
        == ["old matmul", "new reads", "old trl"]  # the new rows in the suite's order
    assert "| reads | m | s | 9 | 9 |" in text and "| reads | m | s | 2 | 2 |" not in text
    assert f"{rp.KEPT}matmul, trl: D1, `python -m musketeers.bench`" in text
    assert "- trl: a note on the old trl rows" in text
    # another run of the same part names the first full run, not the partial one
    rp.write_markdown(part, out, order)
    assert text.count(rp.KEPT) == out.read_text().count(rp.KEPT) == 1
    assert f"{rp.KEPT}matmul, trl: D1," in out.read_text()
    # a section measured later by a third run: each kept section names its own run
    third = rp.Report(machine, {}, "--only trl", sections=("trl",), date="D3")
    third.row("trl", "r", "newest trl")
    rp.write_markdown(third, out, order)
    assert f"{rp.KEPT}matmul: D1," in out.read_text()
    assert f"{rp.KEPT}reads: D2, `python -m musketeers.bench --only reads`" in out.read_text()
    # another machine's figures are not kept beside this one's
    rp.write_markdown(rp.Report({**machine, "cpu": "Y"}, {}, "c", sections=("reads",)), out,
                      order)
    assert "old matmul" not in out.read_text() and rp.KEPT not in out.read_text()


def test_si_prefixes():
    assert rp.si(1.5e11, "FLOP/s") == "150 GFLOP/s"
    assert rp.si(float("nan")) == "n/a"


def test_quick_reads_run_writes_table_and_markdown(tmp_path, capsys):
    from musketeers.bench.__main__ import main

    out = tmp_path / "B.md"
    assert main(["--quick", "--only", "reads", "--read-rows", "300", "--out", str(out),
                 "--work-dir", str(tmp_path / "w")]) == 0
    text = out.read_text()
    assert "## Summary" in text and "load a run's vectors (300 rows" in text
    assert "| reads | lookup (300 rows × 3) | s/lookup |" in text
    assert "musketeers bench" in capsys.readouterr().out


def test_unknown_section_is_refused():
    from musketeers.bench.__main__ import parse

    with pytest.raises(SystemExit):
        parse(["--only", "matmul,nope"])
    assert torch.get_num_threads() >= 1


def test_dtype_replaces_the_regimes_on_both_sides(monkeypatch):
    """``--dtype`` changes only the dtype of the step both sides run; bf16 is refused where the
    CPU would only emulate it (its timing would measure the emulation)."""
    import musketeers.bench.__main__ as bench
    from musketeers.bench.trl_bench import regime

    for name in ("pocket", "smollm2"):
        changed = regime(name, "bfloat16" if regime(name)["dtype"] != "bfloat16" else "float32")
        assert changed["dtype"] != regime(name)["dtype"]
        assert {k: v for k, v in changed.items() if k != "dtype"} == {
            k: v for k, v in regime(name).items() if k != "dtype"}
    monkeypatch.setattr(bench, "cpu_has_bf16", lambda: False)
    with pytest.raises(SystemExit):
        bench.parse(["--only", "trl", "--dtype", "bfloat16"])
    assert bench.parse(["--only", "trl", "--dtype", "float32"]).dtype == "float32"
    monkeypatch.setattr(bench, "cpu_has_bf16", lambda: True)
    assert bench.parse(["--only", "trl", "--dtype", "bfloat16"]).dtype == "bfloat16"


def test_sharing_bench_runs_both_ways_and_they_agree():
    """The sharing rows compare the same passes with sharing off and on; on a tiny policy with
    the pocket task's chat prompts they must give the same log-probs and greedy completions."""
    from musketeers.bench.sharing_bench import bench_sharing

    r = bench_sharing("tiny", "arithmetic:easy@direct", reps=1, warmup=0, prompts=3, group=4,
                      new_tokens=6, eval_batch=12)
    assert all(len(r[k][m]) == 1 for k in ("ref_s", "policy_s", "eval_s") for m in ("off", "on"))
    assert r["max_dlogp"][0] < 1e-4
    assert r["eval_identical"] == [12]


def test_groups_with_signal_is_the_expectation_over_every_subset():
    from itertools import combinations

    import numpy as np

    from musketeers.bench.signal import groups_with_signal

    rng = np.random.default_rng(0)
    # partial-credit scores: a few distinct values per prompt, some prompts all alike
    scores = rng.choice([0.0, 0.5, 1.0], size=(6, 8), p=[0.6, 0.1, 0.3])
    scores[0] = 0.0
    scores[1, :] = 1.0
    scores[1, 3] = 0.5
    for g in (1, 2, 3, 8):
        brute = np.mean([[len(set(row[list(c)])) > 1 for c in combinations(range(8), g)]
                         for row in scores], axis=1).mean()
        assert groups_with_signal(scores, g) == pytest.approx(brute)
    # at the sampled size it is the plain share of groups whose rewards differ
    assert groups_with_signal(scores, 8) == pytest.approx(np.mean(scores.max(1) > scores.min(1)))
    assert groups_with_signal(scores, 1) == 0.0  # one sample never differs from itself
    assert groups_with_signal(scores, 2) < groups_with_signal(scores, 4)  # larger G, more signal


class _HalfRightPolicy:
    """Answers each prompt right in the first half of its group and wrong in the rest, and
    records the temperature it was asked to sample at."""

    eos_ids = [0]

    def __init__(self):
        self.temperatures: list[float] = []

    def encode_prompts(self, items):
        self.items = items
        return [[1] for _ in items]

    def generate(self, prompts, context, *, group_size, max_new_tokens, temperature, greedy,
                 generator):
        self.temperatures.append(temperature)
        return [[2 + 2 * (r // group_size) + (r % group_size >= group_size // 2), 0]
                for r in range(len(prompts) * group_size)]

    def decode(self, ids):
        if len(ids) < 2:  # cut before the answer token's eos: still an answer, but truncated
            ids = ids + [None]
        item = self.items[(ids[0] - 2) // 2]
        return f"<answer>{item.answer if ids[0] % 2 == 0 else 'nope'}</answer>"


def test_signal_bench_samples_at_the_temperature_asked_and_grades_each_group():
    from musketeers.bench.signal import main, markdown, measure

    policy = _HalfRightPolicy()
    rows = measure("arithmetic:easy@direct", policy, prompts=3, groups=[2, 4], budgets=[1, 2],
                   temperature=0.7)
    assert policy.temperatures == [0.7]
    full = [r for r in rows if r["max_new_tokens"] == 2]
    assert {r["temperature"] for r in rows} == {0.7}
    for r in full:
        assert r["exact"] == pytest.approx(0.5)
        assert r["truncated"] == 0.0
        assert r["signal_by_group"][4] == 1.0  # every group of 4 holds 2 right and 2 wrong
        assert r["signal_by_group"][2] == pytest.approx(4 / 6)  # 4 of the 6 pairs differ
    assert all(r["truncated"] == 1.0 for r in rows if r["max_new_tokens"] == 1)
    assert "| 0.7 |" in markdown(rows, "stub")
    with pytest.raises(SystemExit):  # bad input stops before any model loads
        main(["--tasks", "arithmetic", "--temperature", "0"])


class _OneSourceSolvedPolicy(_HalfRightPolicy):
    """Half right everywhere except on the first item's dataset, which every sample solves."""

    def decode(self, ids):
        item = self.items[(ids[0] - 2) // 2]
        if item.source == self.items[0].source:
            return f"<answer>{item.answer}</answer>"
        return super().decode(ids)


def test_signal_bench_by_source_splits_the_family_into_its_datasets():
    from musketeers.bench.signal import measure

    policy = _OneSourceSolvedPolicy()
    rows = measure("algorithmic:easy@direct", policy, prompts=12, groups=[4], budgets=[2],
                   by_source=True)
    rows = {r["source"]: r for r in rows if r["extraction"] == "strict"}
    solved = policy.items[0].source
    sources = {it.source for it in policy.items}
    assert len(sources) > 1 and set(rows) == sources | {"all"}
    assert sum(rows[s]["prompts"] for s in sources) == rows["all"]["prompts"] == 12
    assert rows[solved]["exact"] == 1.0 and rows[solved]["groups_with_signal"] == 0.0
    for s in sources - {solved}:
        assert rows[s]["exact"] == 0.5 and rows[s]["groups_with_signal"] == 1.0
    n_solved = rows[solved]["prompts"]
    assert rows["all"]["groups_with_signal"] == pytest.approx(1 - n_solved / 12)
    # the whole task's row is the same with or without the split
    whole = [r for r in measure("algorithmic:easy@direct", _OneSourceSolvedPolicy(), prompts=12,
                                groups=[4], budgets=[2]) if r["extraction"] == "strict"]
    assert [r["source"] for r in whole] == ["all"]
    assert whole[0]["exact"] == rows["all"]["exact"]


def test_trl_bench_pocket_step_is_the_step_the_pocket_grid_trains():
    """The single-vs-TRL ratio is claimed for the pocket regime: its step must be the one the
    grid runs (policy, task, dtype, prompts × G × tokens), not a copy that fell behind (the
    copy said ``dtype: auto`` after the grid pinned float32)."""
    from musketeers.bench.trl_bench import regime
    from musketeers.config import resolve_config
    from musketeers.design.gridspec import load_grid

    grid = load_grid("pocket")
    run = next(g for g in grid.runs if g.fields.get("method") == "single"
               and g.fields["task"].startswith("arithmetic"))
    cfg = resolve_config(overrides={k: v for k, v in run.fields.items() if k != "seed"})
    step = regime("pocket")
    assert (step["policy"], step["task"], step["dtype"]) == (cfg.policy, cfg.task, cfg.dtype)
    assert (step["prompts"], step["group_size"], step["max_new_tokens"]) == (
        cfg.prompts_per_micro * cfg.grad_accum, cfg.group_size, cfg.max_new_tokens)
    assert step["loss_rows"] == cfg.loss_rows > 0  # the memory check measures the grid's chunks


@pytest.mark.parametrize("tied", [True, False])
def test_model_shape_splits_the_matmuls_from_the_embeddings(tied):
    from musketeers.bench.roofline import model_shape

    s = model_shape(_llama(tied))
    assert s["linear"] == non_embedding_params(_llama(tied)) and s["head"] == 100 * 16
    assert (s["layers"], s["hidden"], s["kv_dim"], s["element_bytes"]) == (2, 16, 8, 4)


def test_the_roofline_of_each_phase_matches_a_hand_count():
    from musketeers.bench.roofline import ideal_seconds, phase_shares

    shape = {"linear": 1000, "head": 100, "layers": 2, "hidden": 8, "kv_dim": 4,
             "element_bytes": 4, "checkpointing": True}
    work = {"prefill_tokens": 10, "prefill_attention": 50, "decode_steps": 3, "decode_rows": 1,
            "decode_tokens": 3, "decode_context": 30, "logprob_tokens": 40,
            "logprob_completion_tokens": 12, "logprob_attention": 400,
            "reference_passes": 1, "forward_passes": 2}
    flops, bandwidth = 1e4, 1e4
    ideal = ideal_seconds(shape, work, flops, bandwidth)
    prefill = 2 * 1000 * 10 + 2 * 2 * 8 * 50
    decode_flops = 2 * 1100 * 3 + 4 * 2 * 8 * 30
    decode_bytes = 4 * (1100 * 3 + 2 * 2 * 4 * 30)  # weights once a step, KV per position
    assert decode_bytes > decode_flops  # one row: decoding is memory-bound
    many = ideal_seconds(shape, {**work, "decode_tokens": 3 * 64}, flops, bandwidth)
    assert many["sample"][1] == "decode compute"  # 64 rows share each read of the weights
    assert ideal["sample"] == (pytest.approx((prefill + decode_bytes) / 1e4), "decode memory")
    one = (2 * 1000 * 40 + 2 * 100 * 12 + 2 * 2 * 8 * 400) / 1e4
    assert ideal["reference"][0] == pytest.approx(one)
    assert ideal["forward"][0] == pytest.approx(2 * one)
    assert ideal["backward"][0] == pytest.approx(2 * 2 * one)  # dX, and a recompute
    # twice the measured time of the ideal: half the roofline
    phases = {p: 2 * ideal[p][0] for p in ("sample", "reference", "forward", "backward")}
    shares = phase_shares(shape, [(phases, work), (phases, work)], flops, bandwidth)
    assert all(s["share"] == pytest.approx(0.5) for s in shares.values())


def test_copy_bandwidth_counts_the_read_and_the_write():
    from musketeers.bench.roofline import copy_bandwidth

    rates = copy_bandwidth(mib=8, reps=2, min_seconds=0.01)
    assert len(rates) == 2 and all(1e8 < r < 1e13 for r in rates)


def test_the_roofline_section_reports_every_phase_of_real_steps(tmp_path):
    from musketeers.bench.__main__ import main

    out = tmp_path / "B.md"
    assert main(["--quick", "--only", "roofline", "--policy", "tiny", "--out", str(out),
                 "--work-dir", str(tmp_path / "w")]) == 0
    text = out.read_text()
    for phase in ("sample", "reference", "forward", "backward"):
        assert re.search(rf"\| roofline \| {phase}: share of its roofline \| \d+\.\d% \| "
                         r"≥ 60\.0% \| (PASS|MISS) \|", text), phase
    assert "| roofline | ceilings: float32 matmul \\| copy bandwidth |" in text
    # a tiny policy's phases are all overhead: each one below 60 % names its operations
    missed = re.findall(r"\| roofline \| (\w+): share of its roofline \| [\d.]+% \| "
                        r"≥ 60\.0% \| MISS \|", text)
    assert missed
    for phase in missed:
        assert re.search(rf"\| roofline \| {phase}: where its time goes \(own CPU time, "
                         r"profiled step\) \| [^|]*\d+%", text), phase


def test_phase_ops_bills_each_operation_to_the_outermost_phase_around_it():
    from musketeers.bench.phase_ops import PYTHON, PhaseOps, top_ops
    from musketeers.runtime.step_profile import PhaseClock

    clock = PhaseClock()
    a = torch.randn(64, 64)
    with PhaseOps() as ops:
        with clock.phase("forward"):
            (a @ a).sum()
            with clock.phase("backward"):  # nested (the loss's forward in the step's): forward
                torch.relu(a)
        with clock.phase("optimizer"):
            a.add_(1)
    with torch.profiler.profile() as later, clock.phase("sample"):  # no longer observed
        pass
    assert not [e for e in later.events() if e.name.startswith("musketeers.phase:")]
    assert set(ops.by_phase) == {"forward", "optimizer"}
    forward, optimizer = ops.by_phase["forward"], ops.by_phase["optimizer"]
    assert {"aten::mm", "aten::relu", PYTHON} <= set(forward["ops"])
    assert "aten::add_" in optimizer["ops"] and "aten::mm" not in optimizer["ops"]
    for entry in (forward, optimizer):  # own times add up to the phase's time
        assert sum(entry["ops"].values()) == pytest.approx(entry["s"], rel=1e-6)
    shares = top_ops(forward, n=2)
    assert len(shares) == 2 and shares[0][1] >= shares[1][1] > 0


def test_a_budgets_work_is_what_the_trainer_counts_for_such_a_step():
    """The paper-scale estimate counts a step as the trainer does (``step_work``)."""
    from types import SimpleNamespace

    from musketeers.bench.roofline import budget_work
    from musketeers.runtime.step_profile import step_work

    budget = {"prompts_per_micro": 2, "grad_accum": 3, "group_size": 4}
    rollouts = [SimpleNamespace(prompt_ids=[[1] * 10, [2] * 10], keep=torch.ones(2, dtype=bool),
                                completions=[[7] * 5] * 8) for _ in range(3)]
    counted = step_work(rollouts, 2, {"reference": 1, "forward": 1})
    assert budget_work(budget, 10, 5, 2) == counted


def test_a_phase_clock_bills_queued_device_work_to_the_phase_that_queued_it():
    """On a GPU kernels run after the call that queues them returns: without a sync at the
    phase's edges, the next phase that waits for a result is billed for them."""
    from musketeers.runtime.step_profile import PhaseClock

    queued: list[float] = []

    def sync() -> None:  # a stand-in for torch.cuda.synchronize: runs what was queued
        while queued:
            time.sleep(queued.pop())

    for clock, billed_to in ((PhaseClock(sync), "sample"), (PhaseClock(), "forward")):
        with clock.phase("sample"):
            queued.append(0.05)  # returns at once, like a kernel launch
        with clock.phase("forward"):
            sync()  # the next phase reads a result
        assert clock.seconds[billed_to] >= 0.05
        assert clock.seconds[billed_to] > clock.seconds[({"sample", "forward"} - {billed_to}).pop()]


def test_micro_batches_decoded_together_take_the_steps_of_their_longest_completion():
    from types import SimpleNamespace

    from musketeers.runtime.step_profile import decode_batches, step_work

    def rollout(length: int) -> SimpleNamespace:  # 2 prompts of 10 tokens, G = 4
        return SimpleNamespace(prompt_ids=[[1] * 10] * 2, keep=torch.ones(2, dtype=bool),
                               completions=[[7] * length] * 8)

    rollouts = [rollout(3), rollout(5), rollout(2)]
    assert decode_batches([2, 2, 2], 0) == [[0], [1], [2]]
    assert decode_batches([2, 2, 2], 4) == [[0, 1], [2]]  # never splits a micro-batch
    alone, together = (step_work(rollouts, 0, {}, n) for n in (0, 6))
    assert (alone["decode_steps"], together["decode_steps"]) == (3 + 5 + 2, 5)
    assert together["decode_tokens"] == 5 * 24 and alone["decode_tokens"] == 8 * (3 + 5 + 2)
    # each row attends to its prefix and what it decoded so far, for each step it runs
    assert together["decode_context"] == 24 * (5 * 10 + 5 * 4 // 2)
    for key in ("prefill_tokens", "decode_rows", "logprob_tokens", "logprob_attention"):
        assert alone[key] == together[key], key


def test_the_gpu_step_benchmark_trains_a_random_policy_of_the_shape_it_names(
        tmp_path, monkeypatch):
    """``bench.gpu_step`` on the CPU: the policy plugin builds random weights from a folder's
    config, resized by a named shape (per-layer fields follow the new depth), and the real
    training step runs on it against the fixture store."""
    from musketeers.bench import gpu
    from musketeers.bench import gpu_step as g
    from musketeers.cache.experts import resolve_local
    from musketeers.teams import expert_spec

    folder = resolve_local(expert_spec("tiny-qwen2"))
    monkeypatch.setenv(g.MODEL_DIR_ENV, folder)
    monkeypatch.setitem(gpu.PAPER_SHAPES, "deeper", {"num_hidden_layers": 3})
    store = Path(__file__).parent / "fixtures"
    for shape, layers in (("as-is", 2), ("deeper", 3)):
        r = g.measure(store, tmp_path / shape, "arithmetic", "smoke", shape, reps=1, warmup=0,
                      device="cpu")
        assert r["shape"]["layers"] == layers
        assert len(r["step_s"]) == 1 and r["completion_len"] == [16.0]  # full length
        (phases, work), = r["profile"]
        assert work["forward_passes"] == 1 and phases["backward"] > 0  # no skipped update


def test_a_ratio_is_printed_only_when_both_sides_are_steady():
    ratio, why = rp.steady_ratio([30.0, 31.0, 29.0], [10.0, 10.5, 9.6])
    assert ratio == pytest.approx(3.0) and "±" in why
    # one side's repetitions 2.5x apart (a busy machine): no ratio, and the text says so
    ratio, why = rp.steady_ratio([30.0, 31.0], [30.0, 75.0])
    assert ratio is None and "too noisy" in why
    assert rp.steady_ratio([], [1.0])[0] is None


def test_a_paired_ratio_judges_the_pairs_not_each_sides_spread():
    # the second step did twice the work on both sides: each side spreads ±33 %, the pairs not
    ratio, why = rp.paired_ratio([12.0, 24.0, 12.5], [10.0, 20.0, 10.0])
    assert ratio == pytest.approx(1.2) and "3 paired repetitions" in why
    assert rp.steady_ratio([12.0, 24.0, 12.5], [10.0, 20.0, 10.0])[0] is None
    # load on one side only: the pairs' ratios spread, no ratio
    ratio, why = rp.paired_ratio([12.0, 24.0], [10.0, 10.0])
    assert ratio is None and "too noisy" in why
    assert rp.paired_ratio([1.0], [1.0, 2.0]) == (None, "the repetitions do not pair up")


def test_alternating_rounds_keep_every_step_and_the_round_it_came_from():
    from musketeers.bench.rounds import merged

    rounds = [{"step_s": [1.0, 2.0], "peak_rss_mib": 5.0, "completion_len": [3]},
              {"step_s": [3.0], "peak_rss_mib": 7.0, "completion_len": [4]}]
    m = merged(rounds)
    assert m["step_s"] == [1.0, 2.0, 3.0] and m["round"] == [0, 0, 1]
    assert m["peak_rss_mib"] == 7.0
    assert merged([rounds[0], {"error": "no trl"}]) == {"error": "no trl"}


def test_the_channels_section_times_each_channel_against_pooled(tmp_path):
    """Each channel's step runs in its own children on a store precompute built with both
    token channels; tokens is judged against pooled (or the ratio withheld as too noisy), and
    the pocket grid's stores are sized."""
    from musketeers.bench.__main__ import main

    out = tmp_path / "B.md"
    assert main(["--quick", "--only", "channels", "--roster", "tiny", "--policy", "tiny",
                 "--out", str(out), "--work-dir", str(tmp_path / "w")]) == 0
    text = out.read_text()
    # the only SKIP a real run may print: a ratio withheld on a noisy machine (real timings)
    noisy = r"— \|  \| SKIP: the machine was too noisy: [^|]*"
    assert all(re.search(rf"÷ pooled step \| {noisy}\|", ln)
               for ln in text.splitlines() if "SKIP" in ln)
    assert re.search(r"\| channels \| tokens step ÷ pooled step \| (\d+\.\d\d× \| ≤ 1\.50× \| "
                     rf"(PASS|MISS) |{noisy})\|", text)
    assert re.search(r"\| channels \| spread of the repetitions pooled \\\| tokens \\\| answer \| "
                     r"±\d+% \\\| ±\d+% \\\| ±\d+% of the medians", text)
    assert re.search(r"\| channels \| answer peak RSS ÷ pooled \| \d+\.\d\d× \|", text)
    for channel in ("pooled", "tokens", "answer"):
        assert f"| channels | {channel} step | s/step |" in text
    for task in ("arithmetic:easier@direct", "algorithmic:easier@direct"):
        assert re.search(rf"\| channels \| store size {task} \(32 items, computed\)", text), task


def _fake_train_children(monkeypatch, seconds) -> list[tuple[str, str, str]]:
    """``run_child`` replaced by a fake ``train`` worker: a step of ``seconds(channel, round)``
    seconds; returns the calls as (kind, channel, run folder), in order."""
    from musketeers.bench import machine

    calls: list[tuple[str, str, str]] = []

    def run_child(kind, params, timeout=None):
        ch, folder = params["overrides"]["channel"], Path(params["run_dir"]).name
        k = sum(c[1] == ch for c in calls)  # this channel's round
        calls.append((kind, ch, folder))
        return {"step_s": [seconds(ch, k)] * params["reps"], "peak_rss_mib": 100.0 + k,
                "completion_len": [8.0], "policy": "tiny", "team": "default",
                "dtype": "float32", "completions_per_step": 4}

    monkeypatch.setattr(machine, "run_child", run_child)
    return calls


def test_the_channels_section_alternates_the_channels_in_rounds(tmp_path, monkeypatch):
    """Load that comes and goes must fall on every channel: each round runs pooled, tokens,
    answer once, in that order, a fresh child each, and each channel keeps every round's steps."""
    from musketeers.bench.channels_bench import bench_channels

    calls = _fake_train_children(monkeypatch, lambda ch, k: 1.0 + k)
    res = bench_channels(tmp_path, tmp_path / "runs", "arithmetic:easy@direct", "cpu", reps=2,
                         warmup=0, overrides={}, rounds=3)
    assert [c[1] for c in calls] == ["pooled", "tokens", "answer"] * 3
    assert {c[0] for c in calls} == {"train"}
    assert len({c[2] for c in calls}) == 9  # each child its own run folder
    for ch in ("pooled", "tokens", "answer"):
        assert res[ch]["step_s"] == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
        assert res[ch]["round"] == [0, 0, 1, 1, 2, 2] and res[ch]["peak_rss_mib"] == 102.0


@pytest.mark.parametrize(("noisy", "withheld"), [
    (None, ()), ("tokens", ("tokens",)), ("pooled", ("tokens", "answer")), ("all", ())])
def test_the_channels_section_prints_no_ratio_for_a_noisy_side(tmp_path, monkeypatch, noisy,
                                                                withheld):
    """A side whose steps, paired with pooled's, spread past 25 % of their median ratio (load
    on one side) gets no ratio to pooled, and tokens no PASS/MISS; the rows say the machine
    was too noisy. Load on every side alike (``all``) leaves the pairs' ratios steady."""
    from musketeers.bench import channels_bench as cb

    base = {"pooled": 10.0, "tokens": 12.0, "answer": 13.0}
    # the noisy side doubles its step in the second round: ±33 % of its median
    _fake_train_children(monkeypatch,
                         lambda ch, k: base[ch] * (1 + k * (noisy in (ch, "all"))))
    rep = rp.Report({}, {}, "cmd")
    cb.report(rep, cb.bench_channels(tmp_path, tmp_path / "runs", "t", "cpu", reps=2, warmup=0,
                                     overrides={}))
    rows = {r.metric: r for r in rep.rows}
    spreads = rows["spread of the repetitions pooled | tokens | answer"].value
    assert spreads.startswith(" | ".join("±33%" if noisy in (ch, "all") else "±0%"
                                         for ch in base))
    for ch, ratio in (("tokens", "1.20×"), ("answer", "1.30×")):
        row = rows[f"{ch} step ÷ pooled step"]
        if ch in withheld:
            assert row.value == "—" and row.status.startswith("SKIP: the machine was too noisy")
        else:
            assert row.value == ratio and not row.status.startswith("SKIP")
    tokens = rows["tokens step ÷ pooled step"]
    assert (tokens.status in ("PASS", "MISS")) == ("tokens" not in withheld)
    assert "PASS" not in rp.to_markdown(rep) or "tokens" not in withheld
    assert rows["answer peak RSS ÷ pooled"].value == "1.00×"  # peak RSS is reported either way


def test_the_computed_token_store_size_is_what_precompute_stores(tmp_path):
    """store_sizes' tokens figure (token counts × d × dtype bytes) equals the bytes of the
    ``tokens`` units precompute writes for the same items, in float32."""
    from musketeers.bench.channels_bench import store_sizes
    from musketeers.cache import layout, token_layout
    from musketeers.cache.precompute import PrecomputeConfig, precompute_task
    from musketeers.tasks import build_items, task_spec
    from musketeers.teams import resolve_team

    task, specs = "arithmetic:easy@direct", resolve_team("default", "tiny")
    splits = {s: build_items(task, s, limit=3) for s in ("train", "val")}
    path = precompute_task(tmp_path, task, task_spec(task), splits, specs,
                           PrecomputeConfig(router=False, token_layers=(-1,)))
    import zarr
    root = zarr.open_group(path, mode="r")
    stored = 0
    for split in splits:
        for spec in specs:
            g = layout.find_expert(root, split, spec.name)
            u = token_layout.find_token_unit(g, "tokens", -1)
            stored += sum(u["flat"][str(c)].nbytes for c in range(u["done"].shape[0]))
    sizes = store_sizes({"x": task}, specs, 3, "float32", 8)["x"]
    assert sizes["items"] == 6 and sizes["tokens"] == stored > 0


def test_the_hints_rows_time_both_cuts_and_print_their_ratio():
    import torch
    from conftest import make_items, tiny_specs

    from musketeers.bench.precompute_bench import bench_hints
    from musketeers.cache.experts import load_expert

    spec = next(s for s in tiny_specs() if s.name == "tiny-llama")
    model, tok = load_expert(spec, "cpu", torch.float32)
    got = bench_hints(model, tok, make_items(12), "cpu", reps=2)
    assert got["hint_batches"]["generation"] < got["hint_batches"]["prefill"]
    assert all(len(t) == 2 for t in got["hints_s"].values())
    r = {"expert": "x", "ceiling": "fp32", "tokens": 1000, "prompts": 12, "mean_len": 100,
         "max_len": 120, "params_nonembed": 10**6, "fast_s": [1.0], "naive_s": [10.0],
         **got, "hints_s": {"generation": [1.0, 1.2], "prefill": [3.0, 2.8]}}
    rep = rp.Report({}, {}, "cmd")
    summarize(rep, r, {"fp32": [4e9], "bf16": [40e9]}, "precompute", {})
    row = next(row for row in rep.rows if "hints (12 prompts" in row.metric)
    assert row.value.startswith("2.64× (") and "generate calls" in row.value


def test_every_timed_step_runs_its_update_whatever_the_rewards(tmp_path):
    """A tiny policy scores 0 on every completion: with the trainer's default a step would stop
    after sampling, and a row would compare steps of unequal work."""
    from musketeers.bench.train_bench import run_steps

    fixtures = Path(__file__).parent / "fixtures"
    r = run_steps({"task": "logic", "cache_dir": str(fixtures), "run_dir": str(tmp_path / "r"),
                   "device": "cpu", "reps": 2, "warmup": 0, "team": None,
                   "overrides": {"budget": "smoke", "policy": "tiny", "team": None,
                                 "experts": ["tiny-qwen2", "tiny-llama"], "max_new_tokens": 4,
                                 "dtype": "float32"}})
    assert len(r["profile"]) == 2
    for phases, work in r["profile"]:
        assert phases["backward"] > 0 and work["forward_passes"] >= 1
