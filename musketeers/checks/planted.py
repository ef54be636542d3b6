"""The planted-expert check: RLVR must learn to route to the one expert that knows the answer.

Task ``planted`` (musketeers.tasks): every prompt asks for a secret digit that the prompt does
not contain. A synthetic store, written with the cache's own writer (``layout``), gives three
"experts": ``oracle`` whose cached vector is a fixed random code of the digit plus noise, and
two experts of pure noise. A tiny random llama policy whose word-level vocabulary makes each
answer ``<answer>d</answer>`` one token (one new token per completion, so chance is 1/10) is
trained with the same ``train()`` and ``TrainConfig`` as every real run.

Expected: with C (``perceiver``) reward climbs well above chance, utilisation of ``oracle``
rises and ρ(reward, H) < 0; ``single`` stays at chance. Each of these is judged against the
``shuffled_reward`` control on the same seed (rewards permuted within each update: as much
gradient, none of its meaning): on every seed Ours must gain more reward than its control, and
over the seeds its paired differences in reward gain, oracle utilisation gain and ρ must clear
a paired t test at df = seeds − 1 (``check_rows``). Routing entropy is printed but is no
criterion: it falls under shuffled rewards too, so a falling entropy is no evidence that
reward shaped the routing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from musketeers.cache import from_memory, layout
from musketeers.cache import store as st
from musketeers.cache.errors import UserError
from musketeers.cache.items import items_fingerprint
from musketeers.checks.planted_chat import CHAT_STEPS, chat_overrides
from musketeers.checks.tiny_llama import tiny_llama
from musketeers.config import TrainConfig, resolve_config
from musketeers.reports.aggregate import mean_std

# No name below is known to the trainer: the team is a team file written beside the store and
# the policy a ``module:function`` factory, the paths any user's own team and model take.
TEAM_FILE = "planted.team.yaml"
POLICY = "musketeers.checks.planted:planted_policy"
EXPERTS = ("noise-a", "oracle", "noise-b")  # the informative one is not first
ORACLE = "oracle"
DIM = 32
SPECIALS = ("[PAD]", "[UNK]", "[EOS]")
ANSWERS = tuple(f"<answer>{d}</answer>" for d in range(10))
CHANCE = 0.1


def planted_vectors(digits: np.ndarray, seed: int, split: str = "train",
                    noise: float = 0.5) -> dict[str, np.ndarray]:
    """Per expert [N, DIM]: the oracle's code(digit) + noise; the others pure noise of the
    same per-dimension variance (1 + noise²).

    Equal variance keeps the oracle from standing out by its norm alone: when it was louder
    (the others N(0, 1)), its keys drew attention under shuffled rewards too, and that drift
    was most of the routing verdict's noise. The ten codes come from ``seed`` alone, so train
    and val share them (a trained run then scores on val); each split draws its own noise.
    """
    rng = np.random.default_rng(seed)
    codes = rng.standard_normal((10, DIM)).astype(np.float32)
    if split != "train":
        rng = np.random.default_rng([seed, *split.encode()])
    loud = np.float32(math.sqrt(1 + noise**2))
    out = {}
    for name in EXPERTS:
        eps = rng.standard_normal((len(digits), DIM)).astype(np.float32)
        out[name] = codes[digits] + noise * eps if name == ORACLE else loud * eps
    return out


def write_planted_store(cache_dir: Path, *, n_train: int = 512, n_val: int = 128,
                        seed: int = 0) -> Path:
    """The ``planted`` store under ``cache_dir`` (rebuilt each call), in the cache's format."""
    from musketeers.tasks import build_items, task_spec

    cache_dir = st.check_cache_dir(cache_dir)
    path = st.store_path(cache_dir, "planted")
    root = st.open_root(path, "planted", task_spec("planted"), force=True)
    for split, n in (("train", n_train), ("val", n_val)):
        items = build_items("planted", split, limit=n)
        sg = root.require_group(split)
        layout.write_items(sg, items, items_fingerprint(items), layout.CHUNK_ROWS)
        digits = np.array([int(it.answer) for it in items])
        for name, vec in planted_vectors(digits, seed, split).items():
            layers = np.stack([np.zeros_like(vec), vec], axis=1)  # L = 1: embeddings, then vec
            # no prompts: n_tokens, random_pos and truncated stay zeros
            arrays = {"last": vec, "first": vec, "random": vec, "layers_last": layers,
                      "layers_mean": layers}
            from_memory.write_expert(sg, name, arrays, fingerprint={"planted": name, "seed": seed},
                                     n_layers=1, d=DIM, dtype="float32")
    write_team_file(cache_dir)
    return path


def write_team_file(cache_dir: Path) -> Path:
    """``cache_dir/planted.team.yaml``: the synthetic experts as a team file. Their ``ref``
    is never loaded (training reads only the store); it names what produced the vectors."""
    import yaml

    entries = [{"name": name, "kind": "random", "ref": f"planted:{name}",
                "description": "planted-expert check: " + ("code of the answer digit + noise"
                                                           if name == ORACLE else "pure noise")}
               for name in EXPERTS]
    path = Path(cache_dir) / TEAM_FILE
    path.write_text(yaml.safe_dump({"experts": entries}, sort_keys=False))
    return path


def planted_tokenizer():
    """Word-level: each ``<answer>d</answer>`` is one token; a whole prompt is one [UNK].

    No pre-tokenizer, so the prompt (which carries no information by design) costs one
    position: sequences are [UNK] ‖ C ‖ answer, which keeps the check fast on a CPU."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + ANSWERS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                   eos_token="[EOS]")


def planted_policy(cfg: TrainConfig):
    """A tiny random llama (seeded by ``cfg.seed``) wrapped in the project's Policy."""
    from musketeers.method.policy import Policy

    tokenizer = planted_tokenizer()
    model = tiny_llama(cfg, tokenizer)
    return Policy(model, tokenizer, lora_r=cfg.lora_r, context_position=cfg.context_position)


def planted_config(method: str, seed: int, steps: int, cache_dir: Path, run_dir: Path,
                   variant: str = "plain", **overrides: Any) -> TrainConfig:
    """The planted run's TrainConfig: one new token, small batches, a fast adapter lr; the
    ``chat`` variant's policy, answer length and β from musketeers.checks.planted_chat."""
    values = dict(task="planted", team=None, team_file=str(Path(cache_dir) / TEAM_FILE),
                  method=method, pooling="last", policy=POLICY,
                  budget="smoke", seed=seed, cache_dir=str(cache_dir), run_dir=str(run_dir),
                  steps=steps, prompts_per_micro=32, grad_accum=1, group_size=8,
                  max_new_tokens=1, beta=0.0, lr=1e-2, adapter_lr=1e-2, weight_decay=0.0,
                  latents=4, d_model=64, heads=4, save_every=steps, eval_limit=128,
                  dtype="float32", device="cpu")
    values.update(variant_overrides(variant))
    values.update(overrides)
    return resolve_config(None, values)


def variant_overrides(variant: str) -> dict[str, Any]:
    if variant not in VARIANTS:
        raise UserError(f"unknown planted variant {variant!r}; valid: {', '.join(VARIANTS)}")
    return chat_overrides() if variant == "chat" else {}


METHODS = ("perceiver", "shuffled_reward", "single")
VARIANTS = ("plain", "chat")


def run_planted(seeds: list[int], steps: int, workdir: Path,
                methods: tuple[str, ...] = METHODS, variant: str = "plain"
                ) -> list[dict[str, Any]]:
    """Train every (method, seed) on one planted store; one summary row per run, tagged with
    ``variant`` (whose margins ``check_rows`` then applies)."""
    variant_overrides(variant)  # an unknown variant fails before any store is written
    from musketeers.run.launch import torch_threads
    from musketeers.run.runlog import read_metrics
    from musketeers.run.trainer import train

    workdir = Path(workdir)
    cache_dir = workdir / "stores"
    write_planted_store(cache_dir)
    rows = []
    # a 64-wide model gains nothing from intra-op threads, and on a shared CPU they cost 10x
    with torch_threads(1):
        for method in methods:
            for seed in seeds:
                name = "planted" if variant == "plain" else f"planted-{variant}"
                run_dir = workdir / "runs" / f"{name}-{method}-s{seed}"
                summary = train(planted_config(method, seed, steps, cache_dir, run_dir,
                                               variant=variant))
                row = _row(method, seed, summary, read_metrics(run_dir / "metrics.jsonl"))
                rows.append(dict(row, variant=variant))
    return rows


# Training length and seeds the check is sized for. Its dynamics are chaotic at the level of
# rounding (a change of summation order alone moves one seed across its control, and the
# same regime's routing verdict measured t = 4.6 on an AMD EPYC and 1.5 on an Intel Xeon), so
# each seed is asked only what held on every seed measured, and the rest is judged on the
# seeds' paired differences with a margin: 12 seeds, where 8 gave t = 2.4-5.8 for the oracle's
# utilisation across nearby regimes (docs/benchmarks-history.md, "the planted check's margin").
STEPS = 100
SEEDS = tuple(range(12))
MIN_SEEDS = 3  # fewer give no standard error worth the name

# What the check demands: of every seed, and of the mean over seeds of Ours minus its control.
MIN_REWARD_WITH_C = 3 * CHANCE  # mean over seeds of Ours' last reward
MAX_REWARD_SINGLE = 2 * CHANCE  # every seed of Single
MIN_REWARD_GAIN_OVER_CONTROL = 0.15  # mean paired difference, and beyond its t test
MIN_RHO_BELOW_CONTROL = 0.3  # mean paired difference, and beyond its t test
CONTROL = "shuffled_reward"


@dataclass(frozen=True)
class Margins:
    """What ``check_rows`` demands of one variant's runs, and the steps and seeds they are
    sized for."""

    steps: int
    seeds: tuple[int, ...]
    min_reward_with_c: float
    max_reward_single: float
    min_reward_gain_over_control: float
    min_rho_below_control: float


MARGINS = {
    "plain": Margins(STEPS, SEEDS, MIN_REWARD_WITH_C, MAX_REWARD_SINGLE,
                     MIN_REWARD_GAIN_OVER_CONTROL, MIN_RHO_BELOW_CONTROL),
    # The chat variant (musketeers.checks.planted_chat) is held to the same criteria, not
    # relaxed, at 80 steps (at 50, two seeds ended at reward 0.15-0.19 once the noise experts
    # were as loud as the oracle) and on the plain check's 12 seeds: on 5, its utilisation
    # verdict read t = 5.9 on an AMD EPYC and 1.5 on an Intel Xeon (docs/benchmarks-history.md).
    "chat": Margins(CHAT_STEPS, SEEDS, MIN_REWARD_WITH_C, MAX_REWARD_SINGLE,
                    MIN_REWARD_GAIN_OVER_CONTROL, MIN_RHO_BELOW_CONTROL),
}


def _gain(r: dict[str, Any], key: str) -> float:
    return r[f"{key}_last"] - r[f"{key}_first"]


def check_rows(rows: list[dict[str, Any]]) -> list[str]:
    """The failed claims of a planted run table (empty when the check passes).

    Ours (``perceiver``) is judged against the ``shuffled_reward`` run of the same seed and
    variant; a seed without its control fails, since its gains would then prove nothing.
    Of every seed: Single stays near chance, and Ours' reward gain exceeds its control's. Over
    the seeds (at least ``MIN_SEEDS``), the paired differences Ours − control must clear
    their margin and a t test (``paired_verdicts``): reward gain, oracle utilisation gain,
    and ρ(reward, H) (below).
    Each variant is held to its ``MARGINS`` (a row without one is ``plain``).
    """
    bad = []
    for variant in sorted({r.get("variant", "plain") for r in rows}):
        part = [r for r in rows if r.get("variant", "plain") == variant]
        bad += _check_variant(part, MARGINS[variant], "" if variant == "plain" else
                              f" ({variant})")
    return bad


def by_seed(rows: list[dict[str, Any]]
            ) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
    """({seed: Ours' row}, {seed: its control's row}): the runs a paired comparison reads."""
    return ({r["seed"]: r for r in rows if r["method"] == "perceiver"},
            {r["seed"]: r for r in rows if r["method"] == CONTROL})


def _check_variant(rows: list[dict[str, Any]], m: Margins, tag: str) -> list[str]:
    bad = []
    for r in rows:
        if r["method"] == "single" and r["reward_last"] > m.max_reward_single:
            bad.append(f"single seed {r['seed']}{tag}: reward {r['reward_last']:.3f} above "
                       "chance without C")
    ours, controls = by_seed(rows)
    for seed, r in sorted(ours.items()):
        c = controls.get(seed)
        if c is None:
            bad.append(f"perceiver seed {seed}{tag}: no {CONTROL} run on this seed, so no gain "
                       "is evidence")
        elif _gain(r, "reward") <= _gain(c, "reward"):
            bad.append(f"perceiver seed {seed}{tag}: reward gain {_gain(r, 'reward'):+.3f} "
                       f"does not exceed its control's {_gain(c, 'reward'):+.3f}")
    if not ours:
        return bad
    seeds = sorted(ours.keys() & controls.keys())
    if len(seeds) < MIN_SEEDS:
        return bad + [f"Ours{tag}: {len(seeds)} seed(s) with a {CONTROL} control; a verdict "
                      f"needs {MIN_SEEDS} (the standard error of their differences)"]
    reward = float(np.mean([ours[s]["reward_last"] for s in seeds]))
    if reward < m.min_reward_with_c:
        bad.append(f"Ours{tag}: mean reward {reward:.3f} < {m.min_reward_with_c:.2f} over "
                   f"{len(seeds)} seeds")
    return bad + [f"Ours{tag} − {CONTROL}, {v.line()}" for v in paired_verdicts(rows, m)
                  if not v.passed]


@dataclass(frozen=True)
class Verdict:
    """One paired comparison of Ours against its control over the seeds: it passes when the
    mean difference exceeds its floor and the two-sided 95 % t critical value (df = n − 1)
    times its standard error. ``t`` is the margin actually measured, in standard errors."""

    what: str
    mean: float
    se: float
    n: int
    floor: float

    @property
    def critical(self) -> float:
        from scipy import stats

        return float(stats.t.ppf(0.975, self.n - 1))

    @property
    def t(self) -> float:
        return self.mean / self.se if self.se > 0 else math.copysign(math.inf, self.mean)

    @property
    def passed(self) -> bool:
        return self.n >= MIN_SEEDS and self.mean > max(self.floor, self.critical * self.se)

    def line(self) -> str:
        verb = "clears" if self.passed else "does not clear"
        return (f"{self.what}: {self.mean:+.3f} over {self.n} seeds (SE {self.se:.3f}, "
                f"t = {self.t:.1f}) {verb} max({self.floor}, t{self.n - 1} 97.5 % = "
                f"{self.critical:.2f} SE = {self.critical * self.se:.3f})")


def paired_verdicts(rows: list[dict[str, Any]], m: Margins) -> list[Verdict]:
    """Ours − ``shuffled_reward`` on the seeds both ran (at least ``MIN_SEEDS``): reward
    gain, oracle utilisation gain, and −ρ(reward, H). Empty with fewer seeds."""
    ours, controls = by_seed(rows)
    seeds = sorted(ours.keys() & controls.keys())
    if len(seeds) < MIN_SEEDS:
        return []
    rho = [s for s in seeds if ours[s]["rho"] is not None and controls[s]["rho"] is not None]
    out = []
    for what, diffs, floor in (
            ("reward gain", [_gain(ours[s], "reward") - _gain(controls[s], "reward")
                             for s in seeds], m.min_reward_gain_over_control),
            ("oracle utilisation gain", [_gain(ours[s], "oracle") - _gain(controls[s], "oracle")
                                         for s in seeds], 0.0),
            ("-ρ(reward, H)", [controls[s]["rho"] - ours[s]["rho"] for s in rho],
             m.min_rho_below_control)):
        mean, sd = mean_std(diffs)  # paired over seeds: SE = sd / √n
        se = math.inf if sd is None or len(diffs) < 2 else sd / math.sqrt(len(diffs))
        out.append(Verdict(what, mean, se, len(diffs), floor))
    return out


def _window(values: list[float], frac: float, last: bool) -> float:
    k = max(1, int(len(values) * frac))
    return float(np.mean(values[-k:] if last else values[:k]))


def _row(method: str, seed: int, summary: dict, metrics: list[dict]) -> dict[str, Any]:
    reward = [m["reward_mean"] for m in metrics]
    row: dict[str, Any] = {"method": method, "seed": seed,
                           "reward_first": _window(reward, 0.2, last=False),
                           "reward_last": _window(reward, 0.2, last=True)}
    if "entropy" in metrics[0]:
        entropy = [m["entropy"] for m in metrics]
        oracle = [m["utilisation"][ORACLE] for m in metrics]
        row.update(entropy_first=_window(entropy, 0.2, last=False),
                   entropy_last=_window(entropy, 0.2, last=True),
                   oracle_first=_window(oracle, 0.2, last=False),
                   oracle_last=_window(oracle, 0.2, last=True),
                   rho=summary.get("spearman_reward_entropy"))
    return row


def print_table(rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    from musketeers.cache.progress import console as rich_console

    variants = sorted({r.get("variant", "plain") for r in rows})
    table = Table(title=f"planted-expert check, {'/'.join(variants)} (chance = {CHANCE:.2f})")
    cols = ("method", "seed", "reward_first", "reward_last", "oracle_first", "oracle_last",
            "entropy_first", "entropy_last", "rho")
    for c in cols:
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(*[_fmt(r.get(c)) for c in cols])
    rich_console().print(table)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)
