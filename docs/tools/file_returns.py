"""How often reading a training run's code returns to a file it had already left.

Traces one tiny training run (``musketeers.run.trainer.train`` on the test fixtures' store,
one step) with ``sys.settrace`` and follows each of the package's functions the first time it
is called, as a newcomer reading the code would: the files of those first calls, in call
order, with repeats of the same file merged. A return is a later entry naming a file that
already appeared earlier in that sequence (the reader had left it and comes back).

    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 python docs/tools/file_returns.py [REPO]

REPO (default: this checkout) must be importable as ``musketeers`` from that folder.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path


def main() -> None:
    repo = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parents[2]).resolve()
    sys.path.insert(0, str(repo / "tests"))
    import torch

    from musketeers.config import resolve_config
    from musketeers.run.trainer import train

    torch.set_num_threads(1)
    roots = (str(repo / "musketeers"), str(repo / "cache"), str(repo / "cli"))
    seen: set = set()
    files: list[str] = []

    def tracer(frame, event, arg):
        if event == "call":
            code = frame.f_code
            path = code.co_filename
            if path.startswith(roots) and code not in seen:
                seen.add(code)
                rel = str(Path(path).relative_to(repo))
                if not files or files[-1] != rel:
                    files.append(rel)
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
    returns = sum(1 for i, f in enumerate(files) if f in files[:i])
    print(f"{repo}: {len(files)} file visits over {len(set(files))} files, "
          f"{returns} returns to a file already left")


if __name__ == "__main__":
    main()
