"""Data-parallel training on 2 gloo ranks (spawned processes) against one process.

N ranks make the same run as one rank: the same completions and rewards at every step, and
the same loss and parameters. A rank that dies stops the run with one line naming it, and the
run resumes (on any number of ranks); ranks started with different configs are refused.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from musketeers.cache.errors import UserError
from musketeers.checks.planted import planted_config
from musketeers.run import checkpoint as ckpt
from musketeers.runtime.distributed import World

pytestmark = pytest.mark.usefixtures("one_thread")
TIMING = {"time_s", "phase_s", "work"}  # this rank's time, and the work it did
# 2 prompts per micro-batch, 2 micro-batches: one rank runs both, each of 2 ranks one
SIZES = dict(prompts_per_micro=2, grad_accum=2, group_size=4, max_new_tokens=2, beta=0.04,
             inner_iters=2, skip_no_signal=False, save_every=1)


def config(store: Path, run: Path, steps: int = 3, seed: int = 0):
    return planted_config("perceiver", seed, steps, store, run, **SIZES)


def _spy(record: list[dict[str, Any]]):
    """Wrap the trainer's sampling pass: each prompt's completions and rewards, by (step,
    position in the update)."""
    import musketeers.run.trainer as trainer

    real = trainer.sample

    def sample(cfg, step, policy, adapter, data, chunks, *rest):
        rollouts = real(cfg, step, policy, adapter, data, chunks, *rest)
        g = cfg.group_size
        for (_, positions), r in zip(chunks, rollouts, strict=True):
            for b, pos in enumerate(positions):
                record.append({"step": step, "position": pos,
                               "completions": r.completions[b * g:(b + 1) * g],
                               "rewards": r.rewards[b].tolist()})
        return rollouts

    trainer.sample = sample
    return real


def _join(rank: int, world: int, port: int) -> None:
    """What torchrun sets for each rank."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)


def _rank(rank: int, world: int, port: int, cfgs: list, out: str, die_at: int | None) -> None:
    """One spawned rank: train its config, write what it sampled and any error to ``out``."""
    _join(rank, world, port)
    from musketeers.run.trainer import train

    record: list[dict[str, Any]] = []
    _spy(record)

    def fault(step: int, name: str, t: torch.Tensor) -> torch.Tensor:
        if die_at is not None and rank == 1 and step == die_at:
            os._exit(9)  # killed: no message, no clean-up
        return t

    result: dict[str, Any] = {"record": record}
    try:
        train(cfgs[rank], fault=fault)
    except UserError as exc:
        result["error"] = str(exc)
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))


def _eval_rank(rank: int, world: int, port: int, run: str, out: str) -> None:
    _join(rank, world, port)
    from musketeers.run.evaluate import evaluate

    result = evaluate(Path(run), batch_size=4)  # 16 val items: 4 batches, 2 per rank
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(cfgs: list, out: Path, die_at: int | None = None) -> list[dict[str, Any]]:
    """Train on ``len(cfgs)`` ranks to their end (none is killed when another fails)."""
    return _spawn(_rank, len(cfgs), out, cfgs, str(out), die_at)


def _spawn(fn, n: int, out: Path, *args) -> list[dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    ctx = mp.spawn(fn, args=(n, _free_port(), *args), nprocs=n, join=False)
    for p in ctx.processes:
        p.join(300)
        assert p.exitcode is not None, "a rank hung"
    return [json.loads(f.read_text()) if (f := out / f"rank{r}.json").exists() else {}
            for r in range(n)]


def metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def weights(run: Path) -> dict[str, torch.Tensor]:
    last = ckpt.latest_checkpoint(run)
    return {**load_file(last / "lora" / "adapter_model.safetensors"),
            **{f"adapter.{k}": v for k, v in load_file(last / "adapter.safetensors").items()}}


def assert_same_rows(rows: list[dict], want: list[dict]) -> None:
    assert len(rows) == len(want)
    for got, row in zip(rows, want, strict=True):
        assert got.keys() == row.keys()
        for k, v in row.items():
            if isinstance(v, float):
                assert got[k] == pytest.approx(v, rel=1e-5, abs=1e-7), (row["step"], k)
            else:
                assert got[k] == v, (row["step"], k)


def assert_same_weights(run: Path, want: Path) -> None:
    got, ref = weights(run), weights(want)
    assert got.keys() == ref.keys()
    for k, v in ref.items():
        assert torch.allclose(got[k], v, rtol=1e-5, atol=1e-6), k


def by_prompt(record: list[dict[str, Any]]) -> dict[tuple[int, int], dict[str, Any]]:
    return {(r["step"], r["position"]): r for r in record}


@pytest.fixture(scope="module")
def one_rank(planted_store, tmp_path_factory) -> tuple[Path, list[dict[str, Any]]]:
    """The reference: the same run in this process, one rank."""
    from musketeers.run.trainer import train

    run = tmp_path_factory.mktemp("one") / "run"
    record: list[dict[str, Any]] = []
    real, threads = _spy(record), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(config(planted_store, run))
    finally:
        import musketeers.run.trainer as trainer

        trainer.sample = real
        torch.set_num_threads(threads)
    return run, record


def test_two_ranks_make_the_same_run_as_one(planted_store, one_rank, tmp_path):
    run1, record1 = one_rank
    run2 = tmp_path / "run"
    ranks = spawn([config(planted_store, run2)] * 2, tmp_path / "out")
    assert all("error" not in r for r in ranks), ranks
    # every prompt of every step was sampled once, by one rank, exactly as one rank samples it
    record2 = ranks[0]["record"] + ranks[1]["record"]
    assert len(record2) == len(record1) == 3 * 4
    assert {p for _, p in by_prompt(ranks[0]["record"])} == {0, 1}
    assert by_prompt(record2) == by_prompt(record1)
    # rank 0 alone wrote the metrics (one row a step): the same rewards, loss and KL
    assert [r["step"] for r in metrics(run2)] == [1, 2, 3]
    assert_same_rows(metrics(run2), metrics(run1))
    # groups with a reward signal entered the loss: advantages moved the weights
    assert any(r["zero_var_frac"] < 1 for r in metrics(run1))
    assert_same_weights(run2, run1)
    assert json.loads((run2 / "inputs.json").read_text())["ranks"] == 2


def test_an_update_decoded_as_one_batch_samples_what_its_micro_batches_sample(
        planted_store, one_rank, tmp_path, monkeypatch):
    """``decode_prompts`` sets how many rows share a decode step, not what any row draws."""
    from dataclasses import replace

    import musketeers.run.trainer as trainer
    from musketeers.method.policy import Policy
    from musketeers.run.trainer import train

    run1, record1 = one_rank
    batches: list[int] = []
    generate = Policy.generate

    def counted(self, prompt_ids, *args, **kwargs):
        batches.append(len(prompt_ids))
        return generate(self, prompt_ids, *args, **kwargs)

    monkeypatch.setattr(Policy, "generate", counted)
    record: list[dict[str, Any]] = []
    real = _spy(record)
    try:
        train(replace(config(planted_store, tmp_path / "run"), decode_prompts=4))
    finally:
        trainer.sample = real
    assert batches[:3] == [4, 4, 4]  # each update's 2 micro-batches of 2 prompts, together
    assert by_prompt(record) == by_prompt(record1)
    assert_same_rows(metrics(tmp_path / "run"), metrics(run1))


def test_dead_rank_is_named_and_the_run_resumes_on_one_rank(planted_store, one_rank, tmp_path):
    from musketeers.run.trainer import train

    run1, _ = one_rank
    run = tmp_path / "run"
    ranks = spawn([config(planted_store, run)] * 2, tmp_path / "out", die_at=1)
    assert ranks[1] == {}  # killed
    error = ranks[0]["error"]
    assert "\n" not in error
    assert "rank 1" in error and "died" in error and "--resume" in error
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step-000001"]
    train(config(planted_store, run), resume=True)  # one rank continues the 2-rank run
    assert_same_rows(metrics(run), metrics(run1))
    assert_same_weights(run, run1)


def test_eval_split_across_ranks_equals_one_process(one_rank, tmp_path):
    from musketeers.run.evaluate import evaluate

    run, _ = one_rank
    one = evaluate(run, batch_size=4)
    samples = (run / "eval_samples.jsonl").read_text()
    (run / "eval_samples.jsonl").unlink()
    ranks = _spawn(_eval_rank, 2, tmp_path / "out", str(run), str(tmp_path / "out"))
    assert ranks[0] == ranks[1] == one  # every rank returns rank 0's result
    assert (run / "eval_samples.jsonl").read_text() == samples  # rank 0 wrote every item


def test_ranks_with_different_configs_are_refused(planted_store, tmp_path):
    run = tmp_path / "run"
    ranks = spawn([config(planted_store, run), config(planted_store, run, seed=1)],
                  tmp_path / "out")
    for r in ranks:
        assert "started with another config" in r["error"] and "seed" in r["error"]
    assert not (run / "metrics.jsonl").exists()


def test_one_rank_world_is_a_no_op():
    world = World()
    assert world.all_gather({"a": 1}) == [{"a": 1}]
    assert world.shard(5) == slice(0, 5)
    assert world.total(0.25) == 0.25


def test_shards_cover_the_update_in_rank_order():
    shards = [World(rank, 3).shard(8) for rank in range(3)]
    assert shards == [slice(0, 3), slice(3, 6), slice(6, 8)]


def test_more_ranks_than_prompts_are_refused(planted_store, tmp_path):
    from musketeers.run.trainer import check_world

    cfg = config(planted_store, tmp_path / "run")  # 2 × 2 prompts per update
    with pytest.raises(UserError, match="^5 ranks for an update of 4 prompts"):
        check_world(cfg, World(0, 5), resume=False, stop_after=None)
