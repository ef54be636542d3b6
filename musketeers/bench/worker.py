"""Child-process entry: ``python -m musketeers.bench.worker KIND JSON`` → one result line.

A child builds and times one configuration and reports its own peak RSS, so measurements
that compare memory never share a process.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback


def main(argv: list[str]) -> int:
    from musketeers.bench.machine import emit

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    kind, params = argv[0], json.loads(argv[1])
    try:
        if kind == "train":
            from musketeers.bench.train_bench import run_steps as fn
        elif kind == "single":
            from musketeers.bench.trl_bench import run_single as fn
        elif kind == "trl":
            from musketeers.bench.trl_bench import run_trl as fn
        else:
            raise ValueError(f"unknown bench worker {kind!r}")
        emit(fn(params))
    except Exception as exc:  # noqa: BLE001 - the parent reports it as a skipped row
        traceback.print_exc()
        emit({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
