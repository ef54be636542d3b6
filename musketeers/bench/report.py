"""The results of a bench run: raw repetitions, the ratio table, and BENCHMARKS.md.

A :class:`Measure` keeps every repetition (the markdown lists them all); a :class:`Row` is one
line of the summary table: a figure, its target and PASS/MISS (or a note when it was skipped).
The hand-written "Measured by hand" section of an existing BENCHMARKS.md is kept across runs,
and so are the rows of the sections a run left out (``--only``), when the same machine wrote
them: the summary then holds each section's latest figures, each with the run that took them.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musketeers.bench.machine import median

ATTEMPTS_MARK = "## Measured by hand"
# A ratio of two timed sides is printed only when every repetition of each side lies within
# this fraction of its side's median: past it, load on the machine moved the figure.
STEADY = 0.25
KEPT = "- kept from an earlier run on this machine, "


@dataclass
class Measure:
    section: str
    name: str
    unit: str
    reps: list[float]

    @property
    def median(self) -> float:
        return median(self.reps)


@dataclass
class Row:
    section: str
    metric: str
    value: str
    target: str = ""
    status: str = ""  # PASS, MISS, SKIP or ""


@dataclass
class Report:
    machine: dict[str, Any]
    versions: dict[str, str]
    command: str
    sections: tuple[str, ...] = ()  # the sections this run measured, in the suite's order
    date: str = field(default_factory=lambda: dt.datetime.now().isoformat(timespec="seconds"))
    measures: list[Measure] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def measure(self, section: str, name: str, unit: str, reps: list[float]) -> Measure:
        m = Measure(section, name, unit, list(reps))
        self.measures.append(m)
        return m

    def row(self, section: str, metric: str, value: str, target: str = "",
            status: str = "") -> None:
        self.rows.append(Row(section, metric, value, target, status))

    def check(self, section: str, metric: str, value: float, target: float, fmt: str,
              higher_is_better: bool = True) -> None:
        """A row with PASS/MISS against ``target``; ``fmt`` formats both, e.g. '{:.0%}'."""
        ok = value >= target if higher_is_better else value <= target
        sign = "≥" if higher_is_better else "≤"
        status = "MISS" if math.isnan(value) else ("PASS" if ok else "MISS")
        self.row(section, metric, fmt.format(value), f"{sign} {fmt.format(target)}", status)

    def skip(self, section: str, metric: str, why: str) -> None:
        self.row(section, metric, "—", "", f"SKIP: {why}")


def spread(reps: list[float]) -> float:
    """The largest distance of a repetition from the median, as a fraction of the median."""
    m = median(reps)
    return max(abs(r - m) for r in reps) / m if reps and m > 0 else math.nan


def steady_ratio(num: list[float], den: list[float], steady: float = STEADY
                 ) -> tuple[float | None, str]:
    """median(num) / median(den), or None when either side's repetitions spread past
    ``steady`` of their median; the text says each side's spread either way."""
    sa, sb = spread(num), spread(den)
    why = f"spread ±{sa:.0%} | ±{sb:.0%} of the medians (limit ±{steady:.0%})"
    if not (sa <= steady and sb <= steady):  # NaN (no or zero-time repetitions) is unsteady
        return None, f"the machine was too noisy: {why}"
    return median(num) / median(den), why


def paired_ratio(num: list[float], den: list[float], steady: float = STEADY
                 ) -> tuple[float | None, str]:
    """The median of ``num[i] / den[i]``, for repetitions that pair up: the same step of the
    same round, on the same items, run side by side. The work of a step varies with its items
    and falls on both sides alike, so only the pairs' ratios must lie within ``steady`` of
    their median; None, with the text saying why, when they do not."""
    if len(num) != len(den) or not num or min(den) <= 0:
        return None, "the repetitions do not pair up"
    ratios = [a / b for a, b in zip(num, den, strict=True)]
    apart = spread(ratios)
    why = (f"{len(ratios)} paired repetitions, their ratios within ±{apart:.0%} of the median "
           f"(limit ±{steady:.0%})")
    if not apart <= steady:
        return None, f"the machine was too noisy: {why}"
    return median(ratios), why


def si(x: float, unit: str = "") -> str:
    """1.23e11 → '123 G' + unit (three significant digits)."""
    if x is None or math.isnan(x):
        return "n/a"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}".strip()


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table; pipes inside cells are escaped."""
    def cell(s: Any) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def machine_line(m: dict[str, Any]) -> str:
    flags = f"avx512_bf16={'yes' if m.get('avx512_bf16') else 'no'}, " \
            f"amx_bf16={'yes' if m.get('amx_bf16') else 'no'}"
    return (f"- machine: {m.get('cpu')}, {m.get('physical_cores')} physical cores "
            f"({m.get('logical_cpus')} logical), {m.get('memory_gib')} GiB, {flags}; "
            f"GPU: {m.get('gpu')}")


def _table_rows(text: str, heading: str) -> list[str]:
    """The body lines of the first table under ``heading`` in ``text``."""
    i = text.find(f"\n{heading}\n")
    if i < 0:
        return []
    rows: list[str] = []
    for line in text[i:].splitlines()[2:]:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    return rows[2:]  # below the header and its rule


def _section_of(line: str) -> str:
    return line.split("|")[1].strip()


def kept_rows(report: Report, old: str) -> dict[str, Any]:
    """What an earlier BENCHMARKS.md measured in sections this run left out: its summary, raw
    and note lines and, per section, the run that took them. Nothing when another machine
    wrote it: figures from two machines in one table would read as one machine's."""
    lines = old.splitlines()
    if not report.sections or machine_line(report.machine) not in lines:
        return {"summary": [], "raw": [], "notes": [], "provenance": []}
    summary = [r for r in _table_rows(old, "## Summary")
               if _section_of(r) not in report.sections]
    kept = list(dict.fromkeys(_section_of(r) for r in summary))
    date = next((x.removeprefix("- date: ") for x in lines if x.startswith("- date: ")), "?")
    cmd = next((x.removeprefix("- command: ") for x in lines if x.startswith("- command: ")), "?")
    # per section, the run that took it: "sections: date, `command`"
    source = {sec: run for x in lines if x.startswith(KEPT)
              for secs, run in [x.removeprefix(KEPT).split(": ", 1)] for sec in secs.split(", ")}
    runs: dict[str, list[str]] = {}
    for sec in kept:
        runs.setdefault(source.get(sec, f"{date}, {cmd}"), []).append(sec)
    return {
        "summary": summary,
        "raw": [r for r in _table_rows(old, "## Raw figures") if _section_of(r) in kept],
        "notes": [x for x in lines if x.startswith("- ") and x[2:].split(":", 1)[0] in kept
                  and not x.startswith(KEPT)],
        "provenance": [f"{KEPT}{', '.join(secs)}: {run}" for run, secs in runs.items()],
    }


def _merged(new: str, old: list[str], order: tuple[str, ...]) -> str:
    """``new`` (a table) with ``old`` body lines added, every row in the suite's section order
    (a stable sort: within a section, rows keep their order)."""
    head, body = new.splitlines()[:2], new.splitlines()[2:] + old
    rank = {s: i for i, s in enumerate(order)}
    body.sort(key=lambda r: rank.get(_section_of(r), len(rank)))
    return "\n".join(head + body)


def to_markdown(report: Report, attempts: str = "", old: str = "",
                order: tuple[str, ...] = ()) -> str:
    kept = kept_rows(report, old)
    vers = ", ".join(f"{k} {v}" for k, v in report.versions.items())
    summary = md_table(["section", "metric", "value", "target", "status"],
                       [[r.section, r.metric, r.value, r.target, r.status] for r in report.rows])
    raw = md_table(["section", "measure", "unit", "median", "repetitions"],
                   [[x.section, x.name, x.unit, _fmt(x.median), ", ".join(_fmt(v) for v in x.reps)]
                    for x in report.measures])
    parts = [
        "# Benchmarks",
        "",
        "Written by `make bench` (`python -m musketeers.bench`); every ratio is measured side by "
        "side in the same run. Raw figures of every repetition are listed under the summary.",
        "",
        f"- date: {report.date}",
        f"- command: `{report.command}`",
        *kept["provenance"],
        machine_line(report.machine),
        f"- versions: {vers}",
        "",
        "## Summary",
        "",
        _merged(summary, kept["summary"], order),
        "",
        "## Raw figures",
        "",
        _merged(raw, kept["raw"], order),
        "",
    ]
    notes = [f"- {n}" for n in report.notes] + kept["notes"]
    if notes:
        parts += ["## Notes", ""] + notes + [""]
    parts.append(attempts.strip() + "\n" if attempts.strip() else
                 f"{ATTEMPTS_MARK}\n\n(none recorded yet)\n")
    return "\n".join(parts)


def write_markdown(report: Report, path: Path, order: tuple[str, ...] = ()) -> None:
    """BENCHMARKS.md from ``report``, keeping the old file's hand-written attempts log (from
    its heading on) and, by ``kept_rows``, the sections this run left out."""
    old = path.read_text() if path.is_file() else ""
    i = old.find(ATTEMPTS_MARK)
    attempts, measured = (old[i:], old[:i]) if i >= 0 else ("", old)
    text = to_markdown(report, attempts, measured, order)
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def print_table(report: Report) -> None:
    from rich.table import Table

    from musketeers.cache.progress import console as rich_console

    table = Table(title="musketeers bench (ratios measured side by side in this run)")
    for col in ("section", "metric", "value", "target", "status"):
        table.add_column(col)
    colors = {"PASS": "green", "MISS": "red"}
    for r in report.rows:
        color = colors.get(r.status, "yellow" if r.status.startswith("SKIP") else "")
        status = f"[{color}]{r.status}[/]" if color else r.status
        table.add_row(r.section, r.metric, r.value, r.target, status)
    rich_console().print(table)
    for n in report.notes:
        rich_console().print(f"[dim]- {n}[/]")
