"""Channel-bench runs over training seeds: the seed, not the item, is the unit.

One bench run's read moves between reruns by far more than its interval over items: the same
configuration on the same 512 rows and seed read C by −7.6 nats on one thread and by −1.0 on
two (docs/channels.md). So a configuration is judged on several training seeds, and two
configurations are compared paired by seed, with a t over the seeds (k − 1 df). Each seed
draws its own question/target pairing (``--permute-targets``), so the items are nested in the
seeds and each seed's mean already carries its items' noise.

    python -m musketeers.bench.channel_seeds \\
        --arm 512 a-s1.json a-s2.json a-s3.json --arm 2048 b-s1.json b-s2.json b-s3.json

Each file is a ``musketeers.bench.channel --save`` file of one channel. A file saved before
runs recorded their seed is named ``PATH@SEED``. Per arm it prints each seed's figures and the
read (own C − another item's C, gold NLL) over the seeds; for two arms, the second minus the
first, seed by seed.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict
from pathlib import Path

from musketeers.reports.stats import SeedTest, paired_seed_test

# what every run of one arm must share: a run differing in one of these is another arm
CONFIG = ("task", "team", "experts", "steps", "batch", "lr", "context_scale", "eval_items",
          "train_items", "standardize", "pooling", "channel", "token_layer", "token_positions",
          "warmup_policy_lr", "permute_targets", "permute_share")

# (label, how to read it from a run's results): the measures compared over seeds
MEASURES = {
    "own C's gold NLL": lambda r: r["val_nll_own"],
    "own − another's C (NLL)": lambda r: r["val_nll_own_minus_shuffled"]["diff"],
    "own − no C (NLL)": lambda r: r["val_nll_own_minus_none"]["diff"],
    "exact with own C (%)": lambda r: r["exact_own"],
}


def load_run(spec: str) -> dict:
    """One channel's results from ``PATH`` or ``PATH@SEED``, with its seed set. ValueError
    with the fix where the file is not a one-channel ``--save`` file or its seed is unknown
    or contradicted."""
    path, _, given = spec.partition("@")
    try:
        runs = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not a --save file of musketeers.bench.channel "
                         f"({exc})") from exc
    if not isinstance(runs, list) or len(runs) != 1 or "val_nll_own" not in runs[0]:
        raise ValueError(f"{path} must hold one channel's results; rerun musketeers.bench."
                         "channel with one --channel and --save")
    run = dict(runs[0])
    if given:
        try:
            seed = int(given)
        except ValueError:
            raise ValueError(f"{spec}: the seed after @ must be an integer") from None
        if run.get("seed", seed) != seed:
            raise ValueError(f"{spec}: the file says seed {run['seed']}; drop the @{given}")
        run["seed"] = seed
    elif "seed" not in run:
        raise ValueError(f"{path} does not record its seed; name it as {path}@SEED")
    run["file"] = path
    return run


def check_arm(label: str, runs: list[dict]) -> None:
    """One arm: distinct seeds, one configuration (threads and store may differ: they are
    the noise a seed family averages over). ValueError naming what differs."""
    seeds = [r["seed"] for r in runs]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"arm {label}: seed listed twice ({seeds}); give each seed once")
    configs = [config_of(r) for r in runs]
    for key in CONFIG:
        values = {c[key] for c in configs}
        if len(values) > 1:
            raise ValueError(f"arm {label}: its runs differ in {key} ({', '.join(sorted(values))})"
                             "; put each configuration in its own --arm")


def config_of(run: dict) -> dict[str, str]:
    """A run's ``CONFIG`` fields, each as comparable JSON text (None where it lacks one)."""
    return {k: json.dumps(run.get(k), sort_keys=True) for k in CONFIG}


def differing(a: list[dict], b: list[dict]) -> list[str]:
    """The configuration fields in which two arms differ (``check_arm`` made each arm one)."""
    ca, cb = config_of(a[0]), config_of(b[0])
    return [k for k in CONFIG if ca[k] != cb[k]]


def paired_by_seed(a: list[dict], b: list[dict]) -> dict[str, SeedTest]:
    """b − a per measure, paired by seed. ValueError unless both arms ran the same seeds."""
    sa, sb = {r["seed"]: r for r in a}, {r["seed"]: r for r in b}
    if set(sa) != set(sb):
        raise ValueError(f"the arms ran different seeds ({sorted(sa)} and {sorted(sb)}); "
                         "pair them on the same seeds")
    seeds = sorted(sa)
    return {name: paired_seed_test([get(sb[s]) - get(sa[s]) for s in seeds])
            for name, get in MEASURES.items()}


def _test(t: SeedTest) -> str:
    if not t.testable:
        return f"{t.diff:+.2f} (one seed: no interval)"
    return (f"{t.diff:+.2f} (95 % {t.low:+.2f} to {t.high:+.2f}; df {t.df:.0f}, "
            f"p {t.p:.3f}, MDE {t.mde:.2f})")


def arm_lines(label: str, runs: list[dict]) -> list[str]:
    """Markdown: one row per seed, then the read over the seeds."""
    runs = sorted(runs, key=lambda r: r["seed"])
    names = list(MEASURES)
    lines = [f"### arm {label}", "", "| seed | threads | " + " | ".join(names) + " |",
             "|---:|---:|" + "---:|" * len(names)]
    for r in runs:
        cells = " | ".join(f"{get(r):.2f}" for get in MEASURES.values())
        lines.append(f"| {r['seed']} | {r.get('threads', '?')} | {cells} |")
    # a mean of per-seed values against 0: a t over the seeds, k − 1 df
    read = paired_seed_test([MEASURES["own − another's C (NLL)"](r) for r in runs])
    return lines + ["", f"The read over {len(runs)} seed(s), own − another's C: {_test(read)}"]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", nargs="+", action="append", required=True,
                    metavar=("LABEL", "FILE"),
                    help="a label, then one --save file per seed (PATH or PATH@SEED)")
    ap.add_argument("--save", default=None, help="write the tests as JSON")
    args = ap.parse_args(argv)
    arms: dict[str, list[dict]] = {}
    try:
        for label, *files in args.arm:
            if not files:
                raise ValueError(f"--arm {label} lists no file; give one --save file per seed")
            arms[label] = [load_run(f) for f in files]
            check_arm(label, arms[label])
        if len(arms) > 2:
            raise ValueError("give one or two --arm: the second is compared with the first")
        pair = paired_by_seed(*arms.values()) if len(arms) == 2 else None
    except ValueError as exc:
        ap.error(str(exc))
    out: dict = {"arms": {k: [{"seed": r["seed"], "file": r["file"]} for r in v]
                          for k, v in arms.items()}}
    for label, runs in arms.items():
        print("\n".join(["", *arm_lines(label, runs)]))
    if pair is not None:
        (la, a), (lb, b) = arms.items()
        print(f"\n### {lb} − {la}, paired by seed (the arms differ in: "
              f"{', '.join(differing(a, b)) or 'nothing recorded'})\n")
        for name, t in pair.items():
            print(f"- {name}: {_test(t)}")
        out["paired"] = {name: {k: (None if isinstance(v, float) and math.isnan(v) else v)
                                for k, v in asdict(t).items()} for name, t in pair.items()}
    if args.save:
        Path(args.save).write_text(json.dumps(out, indent=1), encoding="utf-8")
    return out


if __name__ == "__main__":
    main()
