"""A grid's published result: the report folder holds every finished run's small artefacts.

Run folders (``runs/``) and stores are machine-local and gitignored; a grid outlasts one
invocation and moves between machines. So after each grid call the report folder
(``reports/<budget>/``) gets ``<name>/`` in its pack ``runs.tar.xz`` (``pack.py``) with what a
report is rebuilt from — the resolved config, metrics.jsonl, warmup.jsonl, summary.json,
eval*.json, the evaluated completions, fingerprints — and the grid's wall-time ledger; never
checkpoints or stores. Committing ``reports/pocket/`` publishes the result; ``musketeers ablate
--budget pocket --report-only --runs-dir reports/pocket/runs`` rebuilds the report from it
anywhere (``runs`` stands for its pack), and the next ``ablate`` copies its runs into a fresh
``runs/``, skips them and goes on.
"""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

from musketeers.cache.errors import UserError
from musketeers.design.gridspec import Grid
from musketeers.grid.ledger import ledger_path
from musketeers.grid.pack import editing, opened, pack_of
from musketeers.grid.portable import REWRITES
from musketeers.grid.status import eval_sound, run_status
from musketeers.run.runfolder import is_finished
from musketeers.run.runlog import eval_files

ARTEFACTS = ("config.yaml", "metrics.jsonl", "warmup.jsonl", "summary.json", "fingerprints.json",
             "inputs.json", "error.txt", *eval_files(True), *eval_files(False))


def regular_file(path: Path, folder: Path) -> bool:
    """Whether ``path`` is a regular file inside ``folder``, not a link to anywhere: a
    published folder is committed, so a symlinked artefact would publish what it points at,
    and a hard link (a second name of a file elsewhere) what it shares."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return (stat.S_ISREG(st.st_mode) and st.st_nlink == 1
            and path.resolve().parent == folder.resolve())


def _check_dest(dest: Path) -> None:
    """Refuse to replace a folder that is a symlink: its contents lie somewhere else."""
    if dest.is_symlink():
        raise UserError(f"{dest} is a symlink, not a run folder; remove the link (its target "
                        "is kept) and run again")


def publish_run(src: Path, dest: Path, root: Path | None = None,
                eval_limit: int | None = None) -> None:
    """Copy one finished run's artefacts from ``src`` to ``dest`` (replaced if it exists);
    an artefact that is a symlink, a hard link or not a regular file is left behind, and so is an
    evaluation (result and samples together) not of the grid's size ``eval_limit`` or that
    disagrees with its samples (``eval_sound``). Paths in them are made relative to ``root``
    (default: the working folder) or dropped (``portable``)."""
    if src.is_symlink():
        return
    _check_dest(dest)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    unsound = {name for context in (True, False)
               for name in eval_files(context)
               if not eval_sound(src, eval_files(context)[0], eval_limit)}
    for name in ARTEFACTS:
        if not regular_file(src / name, src) or name in unsound:
            continue
        if name in REWRITES:
            text = (src / name).read_text(errors="replace")
            (dest / name).write_text(REWRITES[name](text, root or Path.cwd()))
        else:
            shutil.copyfile(src / name, dest / name, follow_symlinks=False)


def same_pack(runs_dir: Path, published: Path) -> bool:
    """Whether ``runs_dir`` is the published folder itself or its pack (a report rebuilt from
    the published runs has nothing to publish)."""
    return pack_of(runs_dir).resolve() == pack_of(published).resolve()


def publish_runs(grid: Grid, runs_dir: Path, dest: Path) -> list[str]:
    """Copy the artefacts of the grid's finished runs (and its ledger) into the pack of
    ``dest``; returns the names copied. A run already there is replaced, so a re-run updates
    it."""
    runs_dir, dest = Path(runs_dir), Path(dest)
    done = [run.name for run in grid.runs if is_finished(runs_dir / run.name)]
    if same_pack(runs_dir, dest) or not (done or ledger_path(runs_dir, grid.name).is_file()):
        return []
    with editing(dest) as folder:
        for name in done:
            publish_run(runs_dir / name, folder / name, eval_limit=grid.eval_limit)
        merge_ledger(grid, runs_dir, folder)
    return done


def publish_finished(grid: Grid, run_dir: Path, runs_dir: Path, dest: Path) -> None:
    """Publish one run as it ends, and the ledger with it, into the pack of ``dest``."""
    with editing(dest) as folder:
        publish_run(run_dir, folder / Path(run_dir).name, eval_limit=grid.eval_limit)
        merge_ledger(grid, runs_dir, folder)


def set_aside_published(published: Path, name: str, kept_as: str) -> Path | None:
    """Move the published copy of a run the grid set aside as stale to
    ``<published>/stale/<kept_as>`` (the local folder's name there), so the published folder
    holds only runs of the grid as it stands while the old result stays committed beside it
    (e.g. to compare the two settings), both in its pack; None when nothing was published
    under ``name``."""
    with opened(published) as folder:
        if not (folder / name).is_dir():
            return None
    with editing(published) as folder:
        dest = folder / "stale" / kept_as
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            shutil.rmtree(dest)
        (folder / name).rename(dest)
    return Path(published) / "stale" / kept_as


def publish_ledger(grid: Grid, runs_dir: Path, dest: Path) -> None:
    """Merge the local ledger into the one in ``dest``'s pack: every call once, the published
    calls first. Workers of one grid (``--shard``) publish into one pack, each its own calls
    (``editing`` takes them one at a time: two merging at once would lose calls)."""
    ledger = ledger_path(runs_dir, grid.name)
    if same_pack(runs_dir, dest) or not regular_file(ledger, ledger.parent):
        return
    with editing(dest) as folder:
        merge_ledger(grid, runs_dir, folder)


def merge_ledger(grid: Grid, runs_dir: Path, dest: Path) -> None:
    """Merge the local ledger into the one in folder ``dest``: every call once, the
    published calls first."""
    ledger, theirs = ledger_path(runs_dir, grid.name), ledger_path(dest, grid.name)
    # a symlinked ledger would publish whatever it points at, as artefacts would
    if not regular_file(ledger, ledger.parent) or ledger.resolve() == theirs.resolve():
        return
    seen = [line for line in theirs.read_text().splitlines() if line] \
        if regular_file(theirs, dest) else []
    known = set(seen)
    mine = [line for line in ledger.read_text().splitlines() if line and line not in known]
    theirs.write_text("".join(f"{line}\n" for line in [*seen, *mine]))


def adopt_published(grid: Grid, runs_dir: Path, published: Path) -> list[str]:
    """Copy into ``runs_dir`` every run of the grid that is done (trained and evaluated) in the
    published folder but not in ``runs_dir``, and merge the published ledger into the local
    one; returns the names adopted. This is how a grid goes on on another machine or in a later
    invocation: the committed report folder holds what earlier ones finished, the grid
    skips those runs (after the usual check that their settings are the grid's) and runs the
    rest. A local run folder is never overwritten."""
    runs_dir = Path(runs_dir)
    if same_pack(runs_dir, published):
        return []
    with opened(published) as folder:
        return _adopt(grid, runs_dir, folder)


def _adopt(grid: Grid, runs_dir: Path, published: Path) -> list[str]:
    """``adopt_published`` from the published runs unpacked into the folder ``published``."""
    if not published.is_dir():
        return []
    adopted = []
    for run in grid.runs:
        src, dst = published / run.name, runs_dir / run.name
        if dst.exists() or run_status(src, run.eval_no_context, grid.eval_limit) != "done":
            continue
        publish_run(src, dst, eval_limit=grid.eval_limit)
        adopted.append(run.name)
    theirs, ours = ledger_path(published, grid.name), ledger_path(runs_dir, grid.name)
    if regular_file(theirs, published):  # a symlink would read a file from anywhere
        mine = [line for line in ours.read_text().splitlines() if line] \
            if ours.is_file() else []
        new = [line for line in theirs.read_text().splitlines() if line and line not in mine]
        if new:  # earlier invocations' calls, each line once, before this one's
            ours.parent.mkdir(parents=True, exist_ok=True)
            ours.write_text("\n".join(new + mine) + "\n")
    return adopted
