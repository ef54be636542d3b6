"""The pre-registered pocket-where grid: the default team through the answer channel on the
task and pairing the headroom measurement chose, with the cells, seeds and family it fixes."""

from __future__ import annotations

from pathlib import Path

from musketeers.design.comparisons import COMPARISONS, arm
from musketeers.design.gridspec import load_grid

GRID = Path(__file__).parent.parent / "musketeers/configs/ablations/pocket-where.yaml"
TASK = "arithmetic:easier@direct"


def test_the_where_grid_loads_the_cells_it_registers():
    grid = load_grid(GRID)
    assert grid.name == "pocket-where" and grid.seeds == [0, 1, 2]
    cells = {(r.fields["method"], r.fields.get("team"), r.fields.get("channel"), r.fields["seed"])
             for r in grid.runs}
    team = {(m, "default", "answer", s) for m in ("perceiver", "shuffled_experts",
                                                  "shuffled_reward") for s in range(3)}
    want = {(m, None, None, s) for m in ("single", "warmup_only") for s in range(3)} | team | {
        ("perceiver", "oracle", "answer", s) for s in range(3)}
    assert cells == want
    assert len({r.name for r in grid.runs}) == len(grid.runs) == 18
    assert grid.estimate.startswith(f"{len(grid.runs)} runs")
    # the pairing and the RL budget the pilots chose, the same for every arm
    for r in grid.runs:
        f = r.fields
        assert (f["task"], f["policy"], f["beta"], f["lr"]) == (TASK, "smollm2", 0.0, 5e-4)
        assert f["prompts_per_micro"] == 8  # G stays the pocket budget's 8
        assert f["adapter_warmup"] == 80 and f["steps"] == (1 if f["method"] == "warmup_only"
                                                            else 100)


def test_the_where_grid_registers_every_arm_its_family_compares():
    grid = load_grid(GRID)
    pre = grid.prereg
    assert pre is not None and not pre.implicit and pre.primary == "exact"
    assert pre.seeds == (0, 1, 2)
    assert set(pre.confirmatory) == {"Ours (answer) > Single", "Ours (answer) > shuffled experts",
                                     "oracle (answer) > Single", "RL: Single > warm-up only"}
    ran = {arm(dict(method=r.fields["method"], team=r.fields.get("team"))) for r in grid.runs}
    assert set(pre.arms) == ran
    for c in COMPARISONS:
        if c.name in pre.confirmatory:
            assert {arm(c.tested), arm(c.control)} <= ran, c.name
