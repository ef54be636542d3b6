"""How often reading a training run's code returns to a file it had already left.

Traces one tiny training run (``musketeers.run.trainer.train`` on the test fixtures' store,
one step) with ``sys.settrace`` and follows each of the package's functions the first time it
is called, as a newcomer reading the code would: the files of those first calls, in call
order, with repeats of the same file merged. A return is a later entry naming a file that
already appeared earlier in that sequence (the reader had left it and comes back).

    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 python docs/tools/file_returns.py [REPO] [--what-if]

REPO (default: this checkout) must be importable as ``musketeers`` from that folder.
``--what-if`` also prints what the count would be with one function moved to another file of
the trace, or two files merged (with the merged file's lines): the best ten of each, so a
proposed restructuring can be weighed before it is made.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path


def returns(files: list[str]) -> tuple[int, int]:
    """(visits, returns) of a sequence of first-call files, repeats of one file merged."""
    visits = [f for i, f in enumerate(files) if i == 0 or files[i - 1] != f]
    return len(visits), sum(1 for i, f in enumerate(visits) if f in visits[:i])


def what_if(calls: list[tuple[str, str]], repo: Path) -> None:
    """The ten moves of one function, and the ten merges of two files, that save most."""
    base = returns([f for f, _ in calls])[1]
    files = sorted({f for f, _ in calls})
    moves = []
    for fn in sorted(set(calls)):
        for to in files:
            if to != fn[0]:
                saved = base - returns([to if c == fn else c[0] for c in calls])[1]
                moves.append((saved, f"{fn[0]}:{fn[1]} -> {to}"))
    lines = {f: len((repo / f).read_text().splitlines()) for f in files}
    merges = []
    for a in files:
        for b in files:
            if a < b:
                saved = base - returns([a if f == b else f for f, _ in calls])[1]
                merges.append((saved, f"{a} + {b} ({lines[a] + lines[b]} lines)"))
    for title, rows in (("moving one function", moves), ("merging two files", merges)):
        print(f"{title}, the best ten (returns saved):")
        for saved, what in sorted(rows, key=lambda r: -r[0])[:10]:
            print(f"  {saved:+d}  {what}")


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--what-if"]
    repo = Path(args[0] if args else Path(__file__).parents[2]).resolve()
    sys.path.insert(0, str(repo / "tests"))
    import torch

    from musketeers.config import resolve_config
    from musketeers.run.trainer import train

    torch.set_num_threads(1)
    roots = (str(repo / "musketeers"), str(repo / "cache"), str(repo / "cli"))
    seen: set = set()
    calls: list[tuple[str, str]] = []  # (file, function) of each function's first call

    def tracer(frame, event, arg):
        if event == "call":
            code = frame.f_code
            path = code.co_filename
            if path.startswith(roots) and code not in seen:
                seen.add(code)
                calls.append((str(Path(path).relative_to(repo)), code.co_name))
        return None

    with tempfile.TemporaryDirectory() as tmp:
        cfg = resolve_config(None, dict(
            task="logic", team=None, experts=["tiny-qwen2", "tiny-llama"], method="perceiver",
            policy="tiny", budget="smoke", steps=1, max_new_tokens=4,
            cache_dir=str(repo / "tests" / "fixtures"), run_dir=str(Path(tmp) / "run"),
            dtype="float32", device="cpu", skip_no_signal=False))
        sys.settrace(tracer)
        try:
            train(cfg)
        finally:
            sys.settrace(None)
    visits, back = returns([f for f, _ in calls])
    print(f"{repo}: {visits} file visits over {len({f for f, _ in calls})} files, "
          f"{back} returns to a file already left")
    if "--what-if" in sys.argv[1:]:
        what_if(calls, repo)


if __name__ == "__main__":
    main()
