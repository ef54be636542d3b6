"""``musketeers precompute`` and ``musketeers cache info|verify``: thin wiring of the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from musketeers.cache.errors import UserError
from musketeers.cli.tasks import AllowOpt
from musketeers.run.features import CACHE_DIR_ENV, cache_root

TaskOpt = Annotated[str, typer.Option("--task", help="task name, or 'all'")]
# the team options precompute and probe share: a store is read by the team that wrote it
TeamOpt = Annotated[str | None, typer.Option(help="named team (default, naive, ...)")]
RosterOpt = Annotated[str, typer.Option(help="pocket, paper or tiny")]
ExpertsOpt = Annotated[str | None,
                       typer.Option(help="comma-separated names, hub ids or local folders")]
TeamFileOpt = Annotated[Path | None, typer.Option(help="YAML team file")]
CacheDirOpt = Annotated[
    Path | None, typer.Option("--cache-dir", help=f"stores root (env {CACHE_DIR_ENV}; ./stores)")
]

cache_app = typer.Typer(help="Inspect and check feature-cache stores.", no_args_is_help=True)


def precompute(
    task: TaskOpt = "logic",
    team: TeamOpt = None,
    roster: RosterOpt = "pocket",
    experts: ExpertsOpt = None,
    team_file: TeamFileOpt = None,
    limit: Annotated[int | None, typer.Option(help="items per split (> 0)")] = None,
    cache_dir: CacheDirOpt = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda")] = "auto",
    dtype: Annotated[str, typer.Option(
        help="auto, float32, bfloat16 or float16 (as train's --dtype)")] = "auto",
    hints: Annotated[bool, typer.Option(help="also store each expert's greedy answer")] = False,
    token_states: Annotated[str | None, typer.Option(
        help="comma-separated layers (0 = embeddings, -1 = last; write --token-states=-1): "
             "also store every prompt token's hidden state there, and with --hints every "
             "answer token's")] = None,
    force: Annotated[bool, typer.Option(help="rebuild what differs instead of refusing")] = False,
    gsm8k_dir: Annotated[
        Path | None, typer.Option(help="GSM8K jsonl folder (env MUSKETEERS_GSM8K_DIR)")
    ] = None,
    batch_tokens: Annotated[int, typer.Option(help="padded tokens per forward batch")] = 8192,
    chunk_rows: Annotated[
        int, typer.Option(help="rows per chunk: the unit of resume and of torchrun sharding")
    ] = 64,
    no_router: Annotated[bool, typer.Option("--no-router", help="skip MiniLM embeddings")] = False,
    compile: Annotated[
        str, typer.Option(help="torch.compile the backbone: auto (CUDA, ≥ 2000 prompts), on, off")
    ] = "auto",
    split: Annotated[list[str] | None, typer.Option(
        "--split", help="only this split (repeat it); `tasks headroom` reads val alone")] = None,
    allow_unadmitted_reward: AllowOpt = False,
) -> None:
    """Run every expert of a team once over a task's train and val items into the store."""
    from musketeers.cli.interrupt import on_interrupt
    from musketeers.run.features import expand_tasks, precompute_features
    from musketeers.tasks.admission import admit

    for each in expand_tasks(task):  # a reward that fails admission is refused before any work
        admit(each, allow_unadmitted_reward)
    on_interrupt("run the same command again to resume")  # finished chunks are kept
    names = [e.strip() for e in experts.split(",") if e.strip()] if experts else None
    precompute_features(
        task, team=team, roster=roster, experts=names, team_file=team_file, limit=limit,
        cache_dir=cache_dir, device=device, dtype=dtype, hints=hints, force=force,
        token_layers=parse_layers(token_states),
        gsm8k_dir=gsm8k_dir, batch_tokens=batch_tokens, chunk_rows=chunk_rows,
        router=not no_router, compile=compile, splits=tuple(split) if split else None)


def parse_layers(text: str | None) -> tuple[int, ...]:
    """``--token-states`` as layer indices; a one-line error naming the form it takes."""
    try:
        return tuple(int(k) for k in text.split(",") if k.strip()) if text else ()
    except ValueError:
        raise UserError(f"--token-states {text!r}: pass comma-separated layer indices, e.g. "
                        "--token-states 12 or --token-states=-1") from None


def _store_paths(task: str | None, cache_dir: Path | None) -> list[Path]:
    from musketeers.cache.store import precompute_command, store_path

    root = cache_root(cache_dir)
    if task:
        path = store_path(root, task)
        if not path.is_dir():
            raise UserError(f"no store for task {task!r} under {root}; run: "
                            f"{precompute_command(task, cache_dir=root)}")
        return [path]
    paths = sorted(root.glob("*.zarr")) if root.is_dir() else []
    if not paths:
        raise UserError(f"no stores under {root}; run: "
                        f"{precompute_command('TASK', cache_dir=root)}")
    return paths


@cache_app.command("info")
def info(task: Annotated[str | None, typer.Argument()] = None, cache_dir: CacheDirOpt = None):
    """What each store holds: splits, items, experts, poolings, dtype, size, completeness."""
    from rich.table import Table

    from musketeers.cache.describe import describe
    from musketeers.cache.progress import console as rich_console
    from musketeers.cache.store import disk_size, stored_task, verify_command
    from musketeers.cache.zarrio import Damaged

    console = rich_console()
    for path in _store_paths(task, cache_dir):
        if odd := _irregular(path):
            typer.echo(odd)
            continue
        try:
            store = describe(path)
        except Damaged:  # empty folder, unreadable root zarr.json
            typer.echo(f"{path}: not a readable store; run: "
                       f"{verify_command(stored_task(path), cache_dir)}")
            continue
        table = Table(title=f"{path} ({human_size(disk_size(path))}, "
                            f"format {store.format_version})")
        for col in ("split", "items", "group", "d", "layers", "dtype", "arrays", "complete",
                    "hints", "hint accuracy", "truncated"):
            table.add_column(col)
        for u in store.units:
            n = store.items.get(u.split, "?")
            items = "-" if n is None else str(n)
            if u.state == "damaged":
                table.add_row(u.split, items, f"{u.kind}/{u.name}", *["-"] * 4, "DAMAGED", "-",
                              "-", "-")
                continue
            table.add_row(u.split, items, f"{u.kind}/{u.name}", _attr(u.d), _attr(u.n_layers),
                          _attr(u.dtype), ",".join(u.arrays), _state(u.rows), _state(u.hints),
                          _accuracy(u.hint_accuracy), _truncated(u.truncated))
        console.print(table)
        if any(u.token_units for u in store.units):
            console.print(_token_table(store))
        if store.unsealed:
            typer.echo(f"{path.name}: WARNING: {_unsealed(store.unsealed, path, cache_dir)}")


def _token_table(store):
    """Each expert's token units (channels ``tokens`` and ``answer``) with their size on disk."""
    from rich.table import Table

    table = Table(title="token states")
    for col in ("split", "expert", "channel", "layer", "complete", "tokens", "size"):
        table.add_column(col)
    for u in store.units:
        for t in u.token_units:
            table.add_row(u.split, u.name, t.channel, str(t.layer),
                          "DAMAGED" if t.rows is None else _state(t.rows), str(t.tokens),
                          human_size(t.size))
    return table


def _accuracy(value: float | None) -> str:
    """An expert's own accuracy on the split (its hints' mean score), ``-`` where unscored."""
    return "-" if value is None else f"{100 * value:.1f}%"


def _irregular(path: Path) -> str | None:
    """One line naming a file of the store that is not a regular file (a FIFO would block
    every read of it), or None."""
    from musketeers.cache.zarrio import irregular_files

    odd = irregular_files(path)
    if not odd:
        return None
    more = f" (and {len(odd) - 1} more)" if len(odd) > 1 else ""
    return (f"{path.name}: {path / odd[0]}{more} is not a regular file (a FIFO, socket or "
            "device); remove it, then check the store again")


def _unsealed(groups: list[str], path: Path, cache_dir: Path | None) -> str:
    """The warning for groups without recorded digests, naming the rebuild that records them."""
    from musketeers.cache.store import (
        precompute_command,
        store_limit,
        stored_experts,
        stored_options,
        stored_task,
    )

    experts, hints = stored_experts(path)
    fix = precompute_command(stored_task(path), experts, cache_root(cache_dir), force=True,
                             limit=store_limit(path), hints=hints, options=stored_options(path))
    return (f"{len(groups)} group(s) have no checksum manifest ({', '.join(groups[:3])}"
            f"{', ...' if len(groups) > 3 else ''}): a chunk swapped for another valid one "
            f"cannot be detected; rebuild to record one: {fix}")


def _attr(value) -> str:
    return "-" if value is None else str(value)


def human_size(n_bytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n_bytes < 1024 or unit == "GiB":
            return f"{n_bytes:.0f} {unit}" if unit == "B" else f"{n_bytes:.1f} {unit}"
        n_bytes /= 1024
    raise AssertionError


def _state(progress) -> str:
    """``yes``, or ``NO (k/n chunks)`` so a user sees how far an interrupted run got; ``-``
    where there is nothing (no hints)."""
    if progress is None:
        return "-"
    if progress.complete:
        return "yes"
    return "NO" if progress.done is None else f"NO ({progress.done}/{progress.chunks} chunks)"


def _truncated(truncated: tuple[int, int] | None) -> str:
    """Prompts cut to the expert's context (kept their last tokens), out of the rows stored."""
    if truncated is None:
        return "-"
    cut, n = truncated
    return f"{cut}/{n}" + (f" ({100 * cut / n:.0f}%)" if cut else "")


UNVERIFIABLE = 3  # ``cache verify``'s exit status for a store it could not fully check


@cache_app.command("verify")
def verify(task: Annotated[str | None, typer.Argument()] = None, cache_dir: CacheDirOpt = None):
    """Re-read every chunk against its crc and the digests recorded at build time; report
    corrupt, swapped, non-finite or missing chunks, edited shapes, lost splits or experts,
    incomplete units. Exit 0: sound; 1: problems; 3: no problem found, but groups without
    digests could not be checked for swapped chunks (UNVERIFIABLE)."""
    from musketeers.cache.untrusted import printable
    from musketeers.cache.verify import inspect_store

    bad = unverifiable = 0
    for path in _store_paths(task, cache_dir):
        if odd := _irregular(path):  # before zarr opens anything: a FIFO blocks every read
            typer.echo(odd)
            bad += 1
            continue
        problems, notes = inspect_store(path)
        for p in problems:
            typer.echo(printable(f"{path.name}: {p}"))  # names read from the store
        if not problems and (edited := _edited_items(path, cache_dir)):
            typer.echo(printable(f"{path.name}: {edited}"))
            bad += 1
            continue
        if problems:
            typer.echo(f"{path.name}: {len(problems)} problem(s); repair: "
                       f"{repair_command(path, problems, cache_root(cache_dir))}")
        elif notes:  # checked by crc alone: a swapped chunk would pass
            typer.echo(printable(f"{path.name}: UNVERIFIABLE: "
                                 + _unsealed([n.where for n in notes], path, cache_dir)))
            unverifiable += 1
        else:
            typer.echo(f"{path.name}: OK")
        bad += len(problems)
    if bad:
        raise typer.Exit(1)
    if unverifiable:
        raise typer.Exit(UNVERIFIABLE)


@cache_app.command("probe")
def probe(
    task: Annotated[str, typer.Argument(help="task name, as given to precompute")],
    team: TeamOpt = None,
    roster: RosterOpt = "pocket",
    experts: ExpertsOpt = None,
    team_file: TeamFileOpt = None,
    cache_dir: CacheDirOpt = None,
    split: Annotated[str, typer.Option(help="train or val")] = "val",
    poolings: Annotated[str, typer.Option(
        help="comma-separated poolings (last, first_token, random_token, first_layer, "
             "random_layer, mean, layer:K)")] = "last,first_token,random_token,first_layer,"
                                                "random_layer,mean",
    samples: Annotated[Path | None, typer.Option(
        help="an untrained policy's eval_samples.jsonl: also probe whether it was right")] = None,
) -> None:
    """Linear probes of each expert's cached vectors: do they carry the item's answer, its
    dataset, whether the policy gets it right? Accuracy against the majority class."""
    from rich.table import Table

    from musketeers.cache import reader
    from musketeers.cache.progress import console as rich_console
    from musketeers.reports.probes import read_policy_right, run_probes
    from musketeers.tasks import read_checked_items
    from musketeers.teams import resolve_team

    names = [e.strip() for e in experts.split(",") if e.strip()] if experts else None
    specs = resolve_team(team, roster, names, team_file)
    root = cache_root(cache_dir)
    items = read_checked_items(root, task, split)  # what it labels, checked as training is
    right = read_policy_right(samples) if samples is not None else None
    vectors = {}
    for pooling in [p.strip() for p in poolings.split(",") if p.strip()]:
        arrays = reader.read_vectors(root, task, split, [s.name for s in specs], pooling)
        for spec, x in zip(specs, arrays, strict=True):
            vectors[spec.name + (" (CONTROL)" if spec.oracle else ""), pooling] = x
    table = Table(title=f"linear probes, {task}/{split}, {len(items)} items "
                        "(5-fold CV accuracy, 95 % Wilson interval)")
    for col in ("expert", "pooling", "target", "n", "probe", "interval", "majority", "beats",
                "identical"):
        table.add_column(col)
    for r in run_probes(vectors, items, right):
        table.add_row(r.expert, r.pooling, r.target, str(r.n), f"{100 * r.accuracy:.1f}",
                      f"{100 * r.low:.1f}-{100 * r.high:.1f}", f"{100 * r.majority:.1f}",
                      "yes" if r.beats_majority else "no", f"{100 * r.identical:.0f}%")
    rich_console().print(table)


def _edited_items(path: Path, cache_dir: Path | None) -> str | None:
    """Why the store's items are not the ones its task generates, or None when they are."""
    from musketeers.cache.layout import SPLITS
    from musketeers.cache.store import stored_task
    from musketeers.tasks import read_checked_items

    task = stored_task(path)
    root = cache_root(cache_dir)
    try:
        for split in SPLITS:
            read_checked_items(root, task, split)
    except UserError as exc:
        return str(exc)
    return None


def repair_command(path: Path, problems: list, cache_dir: Path) -> str:
    """The precompute that repairs ``problems``: it recomputes exactly the damaged experts
    (``--force`` only where the root itself is unreadable, which loses the task spec)."""
    from musketeers.cache.layout import expert_arg, expert_at
    from musketeers.cache.store import (
        precompute_command,
        store_limit,
        stored_experts,
        stored_options,
        stored_task,
    )

    task = stored_task(path)
    root_bad = any(p.where == str(path) and "partial" not in p.message for p in problems)
    experts = []
    for p in problems:
        if (at := expert_at(p.where)) is not None:
            experts.append(expert_arg(at[1], *_expert_ref(path, *at)))
    stored, hints = stored_experts(path)
    names = ",".join(dict.fromkeys(experts)) or stored
    return precompute_command(task, names, cache_dir, force=root_bad, limit=store_limit(path),
                              hints=hints, options=stored_options(path))


def _expert_ref(path: Path, split: str, name: str) -> tuple[str | None, str | None]:
    """(kind, ref) of an expert group from its fingerprint; (None, None) if unreadable."""
    from musketeers.cache import layout
    from musketeers.cache.store import open_part

    for where in dict.fromkeys((split, *layout.SPLITS)):  # a lost unit: its twin's reference
        try:
            return layout.expert_ref(open_part(path, where, layout.expert_path(name)))
        except Exception:  # noqa: BLE001 - damaged or absent group: try the next
            continue
    return None, None


def register(app: typer.Typer) -> None:
    app.command("precompute")(precompute)
    app.add_typer(cache_app, name="cache")
