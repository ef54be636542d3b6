"""GSM8K from local jsonl files: the official train/test split (test is our ``val``).

The data is not shipped (MIT licence, openai/grade-school-math): the folder comes from
``--gsm8k-dir`` or ``MUSKETEERS_GSM8K_DIR`` and must hold ``train.jsonl`` and ``test.jsonl``,
one ``{"question": ..., "answer": "... #### 42"}`` per line. Lines are parsed one by one (not
through ``datasets``) so a malformed line is reported with its file and line number.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from musketeers.cache.errors import UserError
from musketeers.cache.items import Item

FILES = {"train": "train.jsonl", "val": "test.jsonl"}
ENV = "MUSKETEERS_GSM8K_DIR"
WHERE = ("get them from github.com/openai/grade-school-math, grade_school_math/data/; or use "
         "--task gsm_symbolic, generated offline")


def gsm8k_folder(gsm8k_dir: str | Path | None) -> Path:
    """The GSM8K folder from the argument, else the environment; UserError naming both."""
    folder = gsm8k_dir if gsm8k_dir is not None else os.environ.get(ENV)
    if not folder:
        raise UserError(
            f"GSM8K needs its jsonl files: pass --gsm8k-dir DIR or set {ENV} to a folder with "
            f"train.jsonl and test.jsonl ({WHERE})"
        )
    return Path(folder).expanduser()


def final_answer(solution: str) -> str:
    """The number after ``####`` with thousands separators removed (``1,000`` -> ``1000``)."""
    if "####" not in solution:
        raise ValueError("no '####' final answer")
    final = solution.rsplit("####", 1)[1].strip().replace(",", "")
    if not final:
        raise ValueError("empty final answer after '####'")
    return final


def _parse_line(line: str) -> dict[str, Any]:
    row = json.loads(line)
    if not isinstance(row, dict):
        raise ValueError("not a JSON object")
    q, a = row.get("question"), row.get("answer")
    if not isinstance(q, str) or not isinstance(a, str):
        raise ValueError("needs string fields 'question' and 'answer'")
    return {"question": q, "answer": a, "final": final_answer(a)}


def read_split(folder: Path, split: str, limit: int | None = None) -> list[dict[str, Any]]:
    """Rows of one split, in file order; stops after ``limit`` rows. Blank lines are skipped."""
    path = folder / FILES[split]
    if not path.is_file():
        raise UserError(
            f"GSM8K file not found: {path}; point --gsm8k-dir or {ENV} at a folder with "
            f"train.jsonl and test.jsonl ({WHERE})"
        )
    rows: list[dict[str, Any]] = []
    # Bytes decoded line by line: invalid UTF-8 is reported with its line here, not found
    # later by the store's string codec halfway through writing the items.
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if limit is not None and len(rows) >= limit:
                break
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(f"{path}:{lineno}: not valid UTF-8 (byte {exc.start}); fix "
                                f"the line or download the file again ({WHERE})") from None
            if not line.strip():
                continue
            try:
                rows.append(_parse_line(line))
            except (ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
                msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise UserError(f"{path}:{lineno}: malformed GSM8K line ({msg})") from None
    if not rows:
        raise UserError(f"{path} holds no GSM8K rows; download the file again ({WHERE})")
    return rows


def build_gsm8k_items(split: str, limit: int | None, gsm8k_dir: str | Path | None,
                      system: str) -> list[Item]:
    rows = read_split(gsm8k_folder(gsm8k_dir), split, limit)
    return [
        Item(
            id=f"gsm8k-{split}-{i:05d}",
            question=r["question"],
            system=system,
            answer=r["final"],
            entry=json.dumps(r, sort_keys=True, ensure_ascii=False),
            source="gsm8k",
        )
        for i, r in enumerate(rows)
    ]


def gsm8k_task_spec(prompt: str = "DeepSeekZero") -> dict[str, Any]:
    return {
        "task": "gsm8k",
        "source": "openai/grade-school-math (local jsonl)",
        "files": dict(FILES),
        "answer": "number after '####', commas removed",
        "scorer": "exact numeric match of the last <answer>",
        "system_prompt": prompt,
    }
