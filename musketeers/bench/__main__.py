"""``python -m musketeers.bench`` (``make bench``): every section, one table, BENCHMARKS.md.

    python -m musketeers.bench                  # the full suite (~30 min on a 2-core CPU)
    python -m musketeers.bench --quick          # one repetition of everything, small inputs
    python -m musketeers.bench --only matmul,reads

A section that cannot run (a missing model, TRL not installable) becomes a SKIP row naming
why; the others still run.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
import tempfile
from pathlib import Path

from musketeers.bench import report as rp
from musketeers.bench.machine import OFFLINE_ENV, machine_info, median, set_threads, versions
from musketeers.bench.trl_bench import REGIMES
from musketeers.cache.devices import cpu_has_bf16

log = logging.getLogger("musketeers.bench")
SECTIONS = ("matmul", "precompute", "reads", "train", "channels", "trl", "roofline", "sharing",
            "gpu")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m musketeers.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="1 repetition, 8 prompts, 1 training step: a smoke run, not figures")
    p.add_argument("--reps", type=int, default=3, help="repetitions per measurement (≥ 3)")
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of {SECTIONS}")
    p.add_argument("--task", default="logic", help="task whose prompts precompute/train use")
    p.add_argument("--prompts", type=int, default=64, help="prompts per precompute pass")
    p.add_argument("--team", default="default", help="pocket team of the precompute/train rows")
    p.add_argument("--roster", default="pocket", help="roster of the team (tiny: test models)")
    p.add_argument("--policy", default=None, help="policy of the train rows (default: budget's)")
    p.add_argument("--trl-regime", default="pocket", choices=REGIMES,
                   help="what a step is in the single-vs-TRL rows (trl_bench.regime)")
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                   help="dtype of the single-vs-TRL and roofline step (default: the regime's)")
    p.add_argument("--read-rows", type=int, default=16000, help="rows of the cache-read store")
    p.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"))
    p.add_argument("--work-dir", type=Path, default=None,
                   help="where stores and runs go (default: a temporary folder)")
    args = p.parse_args(argv)
    if args.quick:
        args.reps, args.prompts, args.read_rows = 1, min(args.prompts, 8), min(args.read_rows, 2000)
    if args.dtype == "bfloat16" and not cpu_has_bf16() and not args.quick:
        p.error("--dtype bfloat16 needs a CPU with native bf16 (avx512_bf16 or AMX): elsewhere "
                "it would time emulation; use --dtype float32")
    unknown = set(args.only.split(",")) - set(SECTIONS)
    if unknown:
        p.error(f"unknown sections {sorted(unknown)}; use {SECTIONS}")
    return args


def section_matmul(rep: rp.Report, args, ctx: dict) -> None:
    from musketeers.bench.matmul import ceilings

    ceil = ceilings("cpu", 2048, args.reps)
    ctx["ceil"] = ceil
    for k, v in ceil.items():
        rep.measure("matmul", f"2048² {k}", "FLOP/s", v)
        rep.row("matmul", f"{k} ceiling (2048², {ctx['threads']} threads)", rp.si(median(v),
                "FLOP/s"))


def section_precompute(rep: rp.Report, args, ctx: dict) -> None:
    import time

    from musketeers.bench.precompute_bench import TARGETS, bench_expert, summarize
    from musketeers.cache.precompute import PrecomputeConfig, precompute_task, resolve_dtype
    from musketeers.tasks import build_items, task_spec
    from musketeers.teams import resolve_team

    specs = resolve_team(args.team, args.roster)
    items = build_items(args.task, "train", limit=args.prompts)
    dtype = resolve_dtype("auto", "cpu")
    rep.notes.append(f"precompute: {len(items)} {args.task} train prompts per pass, dtype "
                     f"{str(dtype).removeprefix('torch.')}; FLOPs = 2 · non-embedding params · "
                     "tokens (attention's T² term not counted)")
    for spec in specs:
        r = bench_expert(spec, items, "cpu", dtype, args.reps, args.reps)
        summarize(rep, r, ctx["ceil"], "precompute", TARGETS)
    # the store the training rows read, built by the real command path (timed once)
    t0 = time.perf_counter()
    precompute_task(ctx["work"] / "stores", args.task, task_spec(args.task), {"train": items},
                    specs, PrecomputeConfig(dtype=dtype, router=False))
    rep.measure("precompute", f"precompute_task end to end ({len(specs)} experts, with loads "
                "and Zarr writes)", "s", [time.perf_counter() - t0])
    ctx["store_ready"] = True


def section_reads(rep: rp.Report, args, ctx: dict) -> None:
    from musketeers.bench.reads_bench import bench_reads

    r = bench_reads(ctx["work"] / "reads", args.read_rows, args.reps, batch_rows=4)
    for key, unit in (("read_vectors_s", "s"), ("load_split_s", "s"), ("lookup_s", "s/lookup")):
        rep.measure("reads", f"{key.removesuffix('_s')} ({r['rows']} rows × {r['experts']})",
                    unit, r[key])
    rep.row("reads", f"load a run's vectors ({r['rows']} rows × 3 experts, {r['mib']:.0f} MiB)",
            f"{median(r['load_split_s']):.2f} s (read_vectors alone "
            f"{median(r['read_vectors_s']):.2f} s)")
    ctx["reads"] = r


def reads_fraction(rep: rp.Report, ctx: dict) -> None:
    """Per-step read time (row lookups + the one-off load amortised over the pocket run's
    steps) over the cached step time."""
    from musketeers.budgets import BUDGETS

    r, step = ctx.get("reads"), ctx.get("cached_step_s")
    if r is None:
        return
    if step is None:
        rep.skip("reads", "per-step read / step time", "no cached training step measured")
        return
    b = BUDGETS["pocket"]
    per_step = median(r["lookup_s"]) * b["grad_accum"] + median(r["load_split_s"]) / b["steps"]
    rep.check("reads", f"per-step read ({per_step * 1e3:.2f} ms) / step time",
              per_step / step, 0.01, "{:.3%}", higher_is_better=False)


def section_train(rep: rp.Report, args, ctx: dict) -> None:
    from musketeers.bench.train_bench import bench_train, expert_flop_share

    if not ctx.get("store_ready"):
        rep.skip("train", "cached vs live", "needs the precompute section's store")
        return
    overrides = {"team": args.team, "roster": args.roster, **step_size(args)}
    res = bench_train(ctx["work"] / "stores", ctx["work"] / "runs", args.task, "cpu",
                      args.reps, 0 if args.quick else 1, overrides)
    for side, r in res.items():
        if "error" in r:
            rep.skip("train", f"{side} step", r["error"])
            return
    c, lv, pr = res["cached"], res["live"], res["paired"]
    rep.measure("train", "cached step (alternating with live)", "s/step", pr["step_s"])
    rep.measure("train", "live step (right after each cached one)", "s/step", pr["live_step_s"])
    rep.measure("train", "experts' time in each live step", "s", pr["live_expert_s"])
    for side in ("cached", "live"):
        rep.measure("train", f"{side} peak RSS (own process, 1 step)", "MiB",
                    [res[side]["peak_rss_mib"]])
    ctx["cached_step_s"] = median(pr["step_s"])
    rep.row("train", f"policy {c['policy']}, team {c['team']}, {c['dtype']}",
            f"{c['completions_per_step']} completions × {c['completion_len'][0]:.0f} tokens/step")
    rep.row("train", "s/step cached | live (alternating)",
            f"{median(pr['step_s']):.1f} | {median(pr['live_step_s']):.1f} (experts "
            f"{median(pr['live_expert_s']):.2f} s of it)")
    # per pair: the live step right after a cached one sees the same machine speed
    savings = [1 - a / b for a, b in zip(pr["step_s"], pr["live_step_s"], strict=True)]
    time_share = [e / b for e, b in zip(pr["live_expert_s"], pr["live_step_s"], strict=True)]
    rep.row("train", "time saved per pair | experts' time share of the live step",
            f"{', '.join(f'{x:.1%}' for x in savings)} | "
            f"{', '.join(f'{x:.1%}' for x in time_share)}")
    share = expert_flop_share(pr)
    rep.check("train", "time saved by the cache (vs experts' FLOP share)", median(savings),
              share, "{:.1%}")
    saved_mib = lv["peak_rss_mib"] - c["peak_rss_mib"]
    rep.row("train", "peak RSS cached | live",
            f"{c['peak_rss_mib']:.0f} | {lv['peak_rss_mib']:.0f} MiB")
    rep.check("train", "memory saved (vs experts' weights)", saved_mib,
              lv["experts_weights_mib"], "{:.0f} MiB")


def section_channels(rep: rp.Report, args, ctx: dict) -> None:
    """A pocket step on each channel in alternating rounds, against pooled's, and the pocket
    grid's store sizes."""
    from musketeers.bench import channels_bench as cb
    from musketeers.cache.precompute import resolve_dtype
    from musketeers.design.grid_yaml import read_grid_yaml
    from musketeers.design.gridspec import grid_file
    from musketeers.tasks import build_items
    from musketeers.teams import resolve_team

    specs, hint_tokens = resolve_team(args.team, args.roster), 8 if args.quick else 128
    grid = read_grid_yaml(grid_file("pocket"))
    limit = 16 if args.quick else grid["precompute"]["limit"]  # items per split
    dtype = grid["precompute"]["dtype"]
    cb.report_sizes(rep, cb.store_sizes(grid["tasks"], specs, limit, dtype, hint_tokens), dtype,
                    hint_tokens)
    stores = ctx["work"] / "channel-stores"
    cb.build_store(stores, args.task, build_items(args.task, "train", limit=args.prompts),
                   specs, resolve_dtype("auto", "cpu"), hint_tokens)
    overrides = {"team": args.team, "roster": args.roster, **step_size(args)}
    cb.report(rep, cb.bench_channels(stores, ctx["work"] / "runs", args.task, "cpu",
                                     args.reps, 0 if args.quick else 1, overrides))


def step_size(args) -> dict:
    """The train and channels rows' policy, and in ``--quick`` a step of a few tokens."""
    out = {"policy": args.policy} if args.policy else {}
    if args.quick:
        out.update(prompts_per_micro=2, grad_accum=1, group_size=2, max_new_tokens=8)
    return out


def section_trl(rep: rp.Report, args, ctx: dict) -> None:
    from musketeers.bench.trl_bench import bench_trl, regime

    res = bench_trl(ctx["work"] / "stores", ctx["work"] / "runs", args.trl_regime, args.reps,
                    0 if args.quick else 1, dtype=args.dtype)
    for side, r in res.items():
        if "error" in r:
            rep.skip("trl", f"{side} step", r["error"])
        else:
            rep.measure("trl", f"{side} step ({args.trl_regime})", "s/step", r["step_s"])
            rep.measure("trl", f"{side} peak RSS", "MiB", [r["peak_rss_mib"]])
    if "error" not in res["single"]:
        single = res["single"]
        # the process's own ru_maxrss (a child per side), and where in the step it was reached
        rep.check("trl", "peak RSS single (pocket step)", single["peak_rss_mib"] / 1024, 6.0,
                  "{:.1f} GiB", higher_is_better=False)
        rows = regime(args.trl_regime, args.dtype).get("loss_rows", 0)
        rep.row("trl", "single peak RSS by phase", ", ".join(
            f"{k} {v:.0f}" for k, v in single.get("phase_peak_rss_mib", {}).items())
            + f" MiB (loss_rows {rows or 'all'})")
    if any("error" in r for r in res.values()):
        return
    ctx["single_steps"] = res["single"]
    ours, trl = median(res["single"]["step_s"]), median(res["trl"]["step_s"])
    rep.row("trl", "s/step single | TRL GRPOTrainer (interleaved rounds)",
            f"{ours:.1f} | {trl:.1f}")
    rep.row("trl", "peak RSS single | TRL", f"{res['single']['peak_rss_mib']:.0f} | "
            f"{res['trl']['peak_rss_mib']:.0f} MiB")
    rep.row("trl", "completion lengths single | TRL",
            f"{res['single']['completion_len']} | {res['trl']['completion_len']}")
    ratio, why = rp.steady_ratio(res["trl"]["step_s"], res["single"]["step_s"])
    if ratio is None:
        rep.skip("trl", "steps/s single ÷ TRL (equal work)", why)
    else:
        rep.check("trl", "steps/s single ÷ TRL (equal work)", ratio, 3.5, "{:.2f}×")
        rep.row("trl", "repetitions single | TRL", why)
    stock, last = median(res["single_stock"]["step_s"]), median(
        [t for t, k in zip(res["single"]["step_s"], res["single"]["round"], strict=True)
         if k == max(res["single"]["round"])])
    rep.row("trl", "s/step single, stock decode | prepacked (last round)",
            f"{stock:.1f} | {last:.1f}: {stock / last:.2f}× from the prepacked weights")


def section_roofline(rep: rp.Report, args, ctx: dict) -> None:
    """Each phase of the single step the TRL rows time (or of its own steps when they did
    not run) as a share of this machine's roofline (``bench.roofline``)."""
    import torch

    from musketeers.bench.machine import run_child
    from musketeers.bench.matmul import matmul_flops
    from musketeers.bench.roofline import copy_bandwidth, phase_shares
    from musketeers.bench.trl_bench import write_items_store

    res = ctx.get("single_steps")
    if res is None:
        r = step_regime(args)
        write_items_store(ctx["work"] / "stores", r["task"], 64)
        res = run_child("single", {"cache_dir": str(ctx["work"] / "stores"), "regime": r,
                                   "policy": r["policy"], "device": "cpu", "reps": args.reps,
                                   "warmup": 0 if args.quick else 1,
                                   "run_dir": str(ctx["work"] / "runs" / "roofline")})
    if "error" in res:
        rep.skip("roofline", "phases", res["error"])
        return
    bf16 = res["resolved_dtype"] == "bfloat16"
    # only the dtype in use: bf16 matmuls on a CPU without it take minutes to time
    flops = median(ctx["ceil"]["bf16" if bf16 else "fp32"] if "ceil" in ctx else matmul_flops(
        2048, torch.bfloat16 if bf16 else torch.float32, reps=args.reps))
    bandwidth = copy_bandwidth(reps=args.reps)
    rep.measure("roofline", "copy bandwidth (256 MiB)", "B/s", bandwidth)
    rep.row("roofline", f"ceilings: {res['resolved_dtype']} matmul | copy bandwidth",
            f"{rp.si(flops, 'FLOP/s')} | {rp.si(median(bandwidth), 'B/s')}")
    shares = phase_shares(res["shape"], res["profile"], flops, median(bandwidth))
    for phase, s in shares.items():
        if s["share"] is None:
            rep.row("roofline", f"{phase}: measured | ideal", "did not run")
            continue
        rep.row("roofline", f"{phase}: measured | ideal ({s['bound']})",
                f"{s['measured_s']:.2f} | {s['ideal_s']:.2f} s/step")
        rep.check("roofline", f"{phase}: share of its roofline", s["share"], 0.6, "{:.1%}")
    slow = [p for p, s in shares.items() if s["share"] is not None and s["share"] < 0.6]
    if slow:
        phase_profile(rep, args, ctx, slow)


def step_regime(args) -> dict:
    """The roofline's step: the TRL rows' regime in ``--dtype``, with ``--policy`` if given."""
    from musketeers.bench.trl_bench import regime

    return {**regime(args.trl_regime, args.dtype),
            **({"policy": args.policy} if args.policy else {})}


def phase_profile(rep: rp.Report, args, ctx: dict, slow: list[str]) -> None:
    """Where each phase below 60 % of its roofline spends its time: the operations with the
    most own CPU time in one more step, run under torch's profiler (``bench.phase_ops``)."""
    from musketeers.bench.machine import run_child
    from musketeers.bench.phase_ops import top_ops

    r = step_regime(args)
    out = run_child("single", {"cache_dir": str(ctx["work"] / "stores"), "regime": r,
                               "policy": r["policy"], "device": "cpu", "reps": 0,
                               "warmup": 1, "profile": True,
                               "run_dir": str(ctx["work"] / "runs" / "profile")})
    if "error" in out:
        rep.skip("roofline", "profile of the slow phases", out["error"])
        return
    for phase in slow:
        entry = out["phase_ops"].get(phase)
        if entry is None:
            continue
        rep.row("roofline", f"{phase}: where its time goes (own CPU time, profiled step)",
                ", ".join(f"{name} {share:.0%}" for name, share in top_ops(entry)))


def section_sharing(rep: rp.Report, args, ctx: dict) -> None:
    from musketeers.bench.sharing_bench import bench_sharing
    from musketeers.bench.trl_bench import regime

    pocket = regime("pocket")
    r = bench_sharing(args.policy or pocket["policy"], pocket["task"], args.reps,
                      0 if args.quick else 1)
    for key, what in (("ref_s", "reference log-probs"),
                      ("policy_s", "policy log-probs + backward"),
                      ("eval_s", "greedy evaluation, 64 val prompts")):
        for mode in ("off", "on"):
            rep.measure("sharing", f"{what}, sharing {mode}", "s", r[key][mode])
        ratio = median(r[key]["off"]) / median(r[key]["on"])
        rep.row("sharing", f"{what}: off ÷ on", f"{ratio:.2f}×")
    passes = [a + b for a, b in zip(r["ref_s"]["off"], r["policy_s"]["off"], strict=True)]
    shared = [a + b for a, b in zip(r["ref_s"]["on"], r["policy_s"]["on"], strict=True)]
    rep.row("sharing", f"log-prob passes of a step ({r['policy']}, {r['dtype']}): off ÷ on",
            f"{median(passes) / median(shared):.2f}× (completions "
            f"{', '.join(f'{x:.1f}' for x in r['completion_len'])} tokens on average)")
    rep.row("sharing", "agreement: max |Δ log p| | identical greedy completions",
            f"{max(r['max_dlogp']):.1e} | {', '.join(map(str, r['eval_identical']))} of 64")


def section_gpu(rep: rp.Report, args, ctx: dict) -> None:
    import torch

    if not torch.cuda.is_available():
        rep.row("gpu", "CUDA", "no GPU")
        return
    from musketeers.bench.gpu import PAPER_SHAPES, bench_gpu_expert
    from musketeers.bench.matmul import ceilings
    from musketeers.bench.precompute_bench import summarize

    name = torch.cuda.get_device_name(0)
    ceil = ceilings("cuda", 8192, args.reps)
    for k, v in ceil.items():
        rep.measure("gpu", f"8192² {k} on {name}", "FLOP/s", v)
        rep.row("gpu", f"{k} matmul ceiling ({name})", rp.si(median(v), "FLOP/s"))
    lengths = ctx.get("lengths") or [180 + (37 * i) % 220 for i in range(256)]
    rep.notes.append("gpu: paper-roster shapes built from config with RANDOM weights "
                     "(throughput only, meaningless for accuracy)")
    for shape in PAPER_SHAPES:
        summarize(rep, bench_gpu_expert(shape, lengths, args.reps, 1), ceil, "gpu", {})


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    os.environ.update(OFFLINE_ENV)
    threads = set_threads()
    command = "python -m musketeers.bench " + shlex.join(sys.argv[1:] if argv is None else argv)
    rep = rp.Report(machine_info(), versions(), command.strip())
    wanted = args.only.split(",")
    with tempfile.TemporaryDirectory(prefix="musketeers-bench-") as tmp:
        work = args.work_dir or Path(tmp)
        ctx = {"threads": threads, "work": work}
        if "matmul" not in wanted and "precompute" in wanted:
            wanted.insert(0, "matmul")  # precompute's fractions need the ceiling
        rep.sections = tuple(s for s in SECTIONS if s in wanted)
        for name in rep.sections:
            log.info("bench section %s", name)
            try:
                globals()[f"section_{name}"](rep, args, ctx)
            except Exception as exc:  # noqa: BLE001 - one failed section must not hide the rest
                log.exception("section %s failed", name)
                rep.skip(name, "section", f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
        reads_fraction(rep, ctx)
    rp.print_table(rep)
    rp.write_markdown(rep, args.out, SECTIONS)
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
