"""What a grid needs from the feature cache, what is missing, and precomputing only that.

A run on a token channel (``channel: tokens`` or ``answer``) needs its experts' token states
at its ``token_layer`` (``precompute --token-states``), and the ``answer`` channel the hints'
pass they come out of (``--hints``): the grid precomputes those too, as the CLI would.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musketeers.cache import layout, token_layout
from musketeers.cache.errors import UserError
from musketeers.cache.layout import SPLITS
from musketeers.cache.tokens import ANSWER
from musketeers.cache.zarrio import Damaged
from musketeers.config import TrainConfig
from musketeers.design.gridspec import Grid
from musketeers.grid.ledger import precompute_name, timed
from musketeers.method import methods
from musketeers.run.features import cache_root

log = logging.getLogger(__name__)
FIXTURES = Path("tests/fixtures")  # where `make fixtures` writes the smoke grid's stores


@dataclass
class TaskNeed:
    """For one (task, cache root, roster): the experts, which need hints, which need token
    states (channel, layer), whether the router."""

    task: str
    cache_dir: str
    roster: str
    experts: dict[str, None] = field(default_factory=dict)  # ordered sets
    hint_experts: dict[str, None] = field(default_factory=dict)
    router: bool = False
    args: dict[str, str] = field(default_factory=dict)  # name -> what --experts takes for it
    token_units: dict[str, dict[tuple[str, int], None]] = field(default_factory=dict)

    def token_layers(self, name: str) -> tuple[int, ...]:
        """The ``--token-states`` layers (as runs ask for them) that expert ``name`` needs."""
        return tuple(sorted({k for _, k in self.token_units.get(name, {})}))


def _team_experts(team: str | None, roster: str) -> list[str]:
    from musketeers.teams import resolve_team

    return [spec.name for spec in resolve_team(team, roster)]


def grid_needs(grid: Grid, team_experts: Callable[[str | None, str], list[str]] | None = None
               ) -> list[TaskNeed]:
    """Union over the grid's runs of what each task's store must hold: what each run's method
    reads (the registry's ``reads``; a control reads what its method does)."""
    team_experts = team_experts or _team_experts
    needs: dict[tuple[str, str, str], TaskNeed] = {}
    items_only: dict[tuple[str, str], TaskNeed] = {}
    for run in grid.runs:
        f: dict[str, Any] = run.fields
        method = methods.get(str(f.get("method", TrainConfig.method)))
        roster = str(f.get("roster", "pocket"))
        # the trainer's own rule (option, else $MUSKETEERS_CACHE_DIR, else stores), so the
        # grid fills the folder its runs will read
        cache_dir = str(cache_root(f.get("cache_dir")))
        key = (str(f["task"]), cache_dir, roster)
        if not method.uses_experts:  # it still reads its items from the task's store
            items_only.setdefault(key[:2], TaskNeed(*key))
            continue
        need = needs.setdefault(key, TaskNeed(*key))
        # the run's own rule (``methods.token_channel``): None where it reads pooled vectors
        channel = methods.token_channel(method, str(f.get("channel", TrainConfig.channel)))
        layer = int(f.get("token_layer", TrainConfig.token_layer))
        # hints live in the experts' groups, so a method reading hints needs those too; the
        # answer channel's states come out of the hints' pass
        for name, arg in _run_experts(f, roster, team_experts):
            need.experts.setdefault(name, None)
            need.args.setdefault(name, arg)
            if "hints" in method.reads or channel == ANSWER:
                need.hint_experts.setdefault(name, None)
            if channel is not None:
                need.token_units.setdefault(name, {}).setdefault((channel, layer), None)
        need.router |= "router" in method.reads
    read = {k[:2] for k in needs}
    return [*needs.values(), *(n for k, n in items_only.items() if k not in read)]


def _run_experts(fields: dict[str, Any], roster: str,
                 team_experts: Callable[[str | None, str], list[str]]) -> list[tuple[str, str]]:
    """(name, --experts argument) of each expert a run reads: a custom grid's ``experts`` or
    ``team_file`` replace its team, as in training (``teams.run_team``)."""
    if not (fields.get("experts") or fields.get("team_file")):
        return [(name, name) for name in team_experts(fields.get("team"), roster)]
    from musketeers.cache.layout import expert_arg
    from musketeers.teams import run_team

    specs = run_team(None, roster, fields.get("experts"), fields.get("team_file"))
    return [(s.name, expert_arg(s.name, s.kind, s.ref)) for s in specs]


def open_task_store(need: TaskNeed) -> Any:
    """The task's store, or None when it does not exist yet (opened once per grid check)."""
    from musketeers.cache.reader import open_store

    try:
        return open_store(need.cache_dir, need.task)
    except UserError:
        return None


def check_items(need: TaskNeed, root: Any, limit: int | None) -> None:
    """Refuse a store holding fewer items per split than the grid precomputes (``limit``).

    Otherwise a store left by a smaller job (``make demo``: 16 items) would pass as ready and
    every run of the grid would quietly train and evaluate on it. ``root``: the task's store
    (``open_task_store``).
    """
    if limit is None or root is None:
        return  # no store yet: precompute builds it with the grid's limit
    for split in SPLITS:
        n = layout.item_count(layout.find_items(root, split)) or 0
        if n < limit:
            raise UserError(
                f"{need.cache_dir}/{need.task}.zarr holds {n} {split} items and the grid "
                f"precomputes {limit} per split; point the grid at another store folder "
                f"(--cache-dir DIR) or move that store away")


def check_dtype(need: TaskNeed, root: Any, dtype: str | None, device: str = "auto") -> None:
    """Refuse a store whose experts were computed in another dtype than the grid asks for.

    Completeness alone would pass them: a store left by a bf16 precompute (``auto`` on a CPU
    with avx512_bf16) would feed a float32 grid's runs states of other numerics than those
    its runs on another machine read. ``dtype``: the grid's ``precompute`` dtype (None or
    ``auto``: whatever this machine picks, so nothing to check across machines).
    """
    if root is None or dtype in (None, "auto"):
        return
    from musketeers.cache.devices import dtype_name, resolve_device, resolve_dtype

    want = dtype_name(resolve_dtype(dtype, resolve_device(device)))
    for name in need.experts:
        for split in SPLITS:
            g = layout.find_expert(root, split, name)
            have = (layout.fingerprint(g) or {}).get("dtype") if layout.is_complete(g) else None
            if have is not None and have != want:
                raise UserError(
                    f"{need.cache_dir}/{need.task}.zarr holds {name} computed in {have} and the "
                    f"grid precomputes in {want}; point the grid at another store folder "
                    f"(--cache-dir DIR) or move that store away")


def missing(need: TaskNeed, root: Any) -> tuple[list[str], list[str], bool]:
    """(experts absent/incomplete, experts lacking hints, router missing) in the task's store
    ``root`` (``open_task_store``; None: no store yet). Complete means what the reader means
    (``layout.is_complete``); an unreadable group counts as absent: precompute repairs it."""
    if root is None:
        return list(need.experts), [], need.router
    absent, no_hints, router = [], [], False
    for name in need.experts:
        for split in SPLITS:
            g = layout.find_expert(root, split, name)
            if not layout.is_complete(g):
                absent.append(name)
                break
            if name in need.hint_experts and not layout.hints_complete(g):
                no_hints.append(name)
                break
    if need.router:
        router = not all(layout.is_complete(layout.find_router(root, s)) for s in SPLITS)
    return absent, no_hints, router


def missing_tokens(need: TaskNeed, root: Any) -> list[str]:
    """Experts lacking a complete token unit (channel, layer) that a run reads, in the task's
    store ``root`` (None: no store yet); the layer resolved against each expert's depth as the
    reader resolves it (``reader.read_token_rows``)."""
    if root is None:
        return list(need.token_units)
    out = []
    for name, units in need.token_units.items():
        for split in SPLITS:
            g = layout.find_expert(root, split, name)
            n_layers = layout.expert_meta(g)[0] if g is not None else None
            if not isinstance(n_layers, int) or not all(
                    token_layout.is_complete(_token_unit(g, ch, layer, n_layers))
                    for ch, layer in units):
                out.append(name)
                break
    return out


def _token_unit(g: Any, channel: str, layer: int, n_layers: int) -> Any:
    """The expert unit's token unit of ``channel`` at ``layer``; None when absent or unreadable
    (precompute repairs it)."""
    k = token_layout.resolve_layer(layer, n_layers)
    try:
        return token_layout.token_unit(g, channel, k) if k is not None else None
    except Damaged:  # counts as absent
        return None


def ensure_cache(grid: Grid, settings: dict[str, Any] | None,
                 team_experts: Callable[[str | None, str], list[str]] | None = None,
                 gsm8k_dir: Path | None = None, ledger: Path | None = None) -> list[str]:
    """Precompute what the grid's runs need and the cache lacks; returns what was computed.

    ``settings`` is the grid's ``precompute`` mapping (``limit`` items per split, ``dtype``,
    ``device``), or None when the grid must find its stores ready (the smoke grid's fixtures).
    Each precompute call's wall time goes to ``ledger`` (``musketeers.grid.ledger``).
    """
    done, unfilled = [], []
    for need in grid_needs(grid, team_experts):
        root = open_task_store(need)
        settings_ = settings or {}
        check_items(need, root, settings_.get("limit"))
        check_dtype(need, root, settings_.get("dtype"), settings_.get("device", "auto"))
        absent, no_hints, router = missing(need, root)
        redo = dict.fromkeys(absent + no_hints + missing_tokens(need, root))
        # Hints cost a greedy generation per item, so only the experts whose runs read hints
        # (or answer states) get them; one call per (hints, token layers), plain ones first
        batches: dict[tuple[bool, tuple[int, ...]], list[str]] = {}
        for hints in (False, True):
            for e in redo:
                if (e in need.hint_experts) == hints:
                    batches.setdefault((hints, need.token_layers(e)), []).append(e)
        todo = [e for names in batches.values() for e in names]
        fresh = root is None  # no store: even a grid of runs without experts needs its items
        if not todo and not router and not fresh:
            continue
        if settings is None:
            what = ", ".join(todo) or ("router" if router else "its items")
            unfilled.append(f"{need.task} features ({what}) in {need.cache_dir}; run: "
                            f"{_fill_command(need, todo, any(h for h, _ in batches))}")
            continue
        from musketeers.run.features import precompute_features

        log.info("precompute %s: %s%s", need.task, ", ".join(todo) or "-",
                 " + router" if router else "")
        for (hints, layers), names in batches.items() or [((False, ()), [])]:
            what = precompute_name(need.task, names, hints)
            # router only: the grid's own experts (all complete: their fingerprints are checked,
            # nothing is recomputed), not another team's
            experts = [need.args.get(n, n) for n in names or need.experts]
            with timed(ledger, "precompute", what):
                precompute_features(
                    need.task, roster=need.roster, experts=experts or None,
                    team=None if experts else "default", cache_dir=Path(need.cache_dir),
                    limit=settings.get("limit"), hints=hints,
                    device=settings.get("device", "auto"), dtype=settings.get("dtype", "auto"),
                    gsm8k_dir=gsm8k_dir, router=router, token_layers=layers)
            router = False
        done.append(need.task)
    if unfilled:
        raise UserError(f"the {grid.budget} grid needs " + "; and ".join(unfilled))
    return done


def _fill_command(need: TaskNeed, todo: list[str], hints: bool) -> str:
    """What fills the store a grid without ``precompute:`` settings reads: the fixtures for the
    fixture folder, else the precompute of exactly those experts (with the token states their
    runs read), in that folder."""
    if Path(need.cache_dir).resolve() == FIXTURES.resolve():
        return "make fixtures"
    from musketeers.cache.store import precompute_command, store_limit, store_path, token_option

    path = store_path(need.cache_dir, need.task)
    limit = store_limit(path) if path.is_dir() else None
    experts = ",".join(need.args.get(n, n) for n in todo or need.experts) or None
    layers = sorted({k for n in todo for k in need.token_layers(n)})
    return precompute_command(need.task, experts, need.cache_dir, limit=limit, hints=hints,
                              options=token_option(layers), roster=need.roster)
