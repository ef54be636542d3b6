"""Expert teams: the named registry (configs/teams.yaml), ``--experts`` lists and team files.

A team is a list of ``ExpertSpec``. Named teams (``default``, ``generalist``, ``naive``,
``llm``) come in rosters: ``paper`` (the paper's hub ids, for a GPU), ``pocket`` (models that
install from the package registry and run offline on a CPU; the default) and ``tiny`` (seeded
random test models). Users bring their own experts as a comma list (``--experts A,B,C``) or a
YAML team file; each entry is

* a registry name (``smollm2-135m-instruct``),
* an existing local folder (kind ``dir``; a folder wins over a hub id of the same spelling),
* a hub id ``org/name`` (kind ``hub``; loaded from the local HF cache only), or
* in a team file, a full spec mapping (``{name, kind, ref, file, sha256, tokenizer, config,
  seed, description}``).

Policies resolve through the same registry (``policy_spec``), so the trainer loads them with
the cache's loader.
"""

from __future__ import annotations

import re
from dataclasses import fields, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from musketeers.cache.errors import UserError
from musketeers.cache.experts import KINDS, ExpertSpec

ROSTERS: tuple[str, ...] = ("pocket", "paper", "tiny")
_SPEC_FIELDS = tuple(f.name for f in fields(ExpertSpec))
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@cache
def _registry() -> dict[str, Any]:
    text = resources.files("musketeers").joinpath("configs/teams.yaml").read_text("utf-8")
    return yaml.safe_load(text)


def _experts() -> dict[str, ExpertSpec]:
    return {name: ExpertSpec(name=name, **cfg) for name, cfg in _registry()["experts"].items()}


EXPERTS: dict[str, ExpertSpec] = _experts()
TEAMS: tuple[str, ...] = tuple(_registry()["teams"])
POLICIES: dict[str, str] = dict(_registry()["policies"])
DEFAULT_TEAM = "default"
DEFAULT_POLICY = "pocket"


def slug(text: str) -> str:
    """A filesystem-safe lower-case expert name (``Qwen/Qwen2.5-3B`` -> ``qwen2.5-3b``)."""
    s = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-.")
    return s or "expert"


def expert_spec(name_or_ref: str, base: Path | None = None) -> ExpertSpec:
    """The spec for a registry name, a local folder or a hub id; UserError otherwise.

    ``base`` is the folder relative paths are read against (a team file's folder), else CWD.
    """
    ref = name_or_ref.strip()
    if ref in EXPERTS:
        return EXPERTS[ref]
    path = Path(ref).expanduser()
    if base is not None and not path.is_absolute():
        path = base / path
    if path.is_dir():
        return ExpertSpec(name=slug(path.resolve().name), kind="dir", ref=str(path.resolve()),
                          description=f"local folder {path}")
    if _HUB_ID.match(ref):
        for spec in EXPERTS.values():  # a hub id of a registry expert is that expert
            if spec.kind == "hub" and spec.ref == ref:
                return spec
        return ExpertSpec(name=slug(ref.split("/", 1)[1]), kind="hub", ref=ref,
                          description=f"hub model {ref}")
    raise UserError(
        f"unknown expert {ref!r}: use a local folder, a hub id org/name, or one of: "
        + ", ".join(EXPERTS)
    )


def _spec_from_mapping(entry: dict[str, Any], base: Path | None) -> ExpertSpec:
    unknown = set(entry) - set(_SPEC_FIELDS)
    if unknown:
        raise UserError(f"expert entry has unknown keys {sorted(unknown)}; valid: "
                        + ", ".join(_SPEC_FIELDS))
    if "kind" not in entry or "ref" not in entry:
        if "ref" in entry and len(entry) <= 2:  # {ref: X} or {ref: X, name: Y}
            spec = expert_spec(str(entry["ref"]), base)
            return replace(spec, name=slug(str(entry.get("name", spec.name))))
        raise UserError(f"expert entry {entry} needs 'kind' and 'ref' (or just 'ref')")
    if entry["kind"] not in KINDS:
        raise UserError(f"expert entry kind {entry['kind']!r} is unknown; valid: "
                        + ", ".join(KINDS))
    entry = dict(entry)
    if entry["kind"] == "dir" and base is not None and not Path(entry["ref"]).is_absolute():
        entry["ref"] = str((base / entry["ref"]).resolve())
    entry["name"] = slug(str(entry.get("name") or Path(str(entry["ref"])).name))
    try:
        return ExpertSpec(**entry)
    except TypeError as exc:
        raise UserError(f"bad expert entry {entry}: {exc}") from None


def parse_experts(entries: list[Any] | str, base: Path | None = None) -> list[ExpertSpec]:
    """``--experts A,B,C`` (a comma string or list) or a team file's entries -> specs."""
    if isinstance(entries, str):
        entries = [e for e in entries.split(",") if e.strip()]
    specs = []
    for e in entries:
        if isinstance(e, dict):
            specs.append(_spec_from_mapping(e, base))
        elif isinstance(e, str):
            specs.append(expert_spec(e, base))
        else:
            raise UserError(f"expert entry {e!r} must be a name, folder, hub id or mapping")
    if not specs:
        raise UserError("the expert list is empty; name at least one expert")
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UserError(f"expert names repeat in the team: {', '.join(dupes)}; give each a "
                        "distinct 'name' in a team file")
    return specs


def load_team_file(path: str | Path) -> list[ExpertSpec]:
    """A YAML team file: ``experts: [...]`` (or a bare list) of names, folders, ids, specs."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"team file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text("utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"team file {path} is not UTF-8 text; pass a YAML team file") from None
    except yaml.YAMLError as exc:
        raise UserError(f"team file {path} is not valid YAML: {str(exc).splitlines()[0]}") \
            from None
    if isinstance(data, dict):
        unknown = set(data) - {"experts", "name", "description"}
        if unknown or "experts" not in data:
            raise UserError(f"team file {path}: expected keys experts (and optionally name, "
                            f"description), got {sorted(data)}")
        data = data["experts"]
    if not isinstance(data, list):
        raise UserError(f"team file {path}: 'experts' must be a list")
    return parse_experts(data, base=path.parent)


def _team(team: str, roster: str) -> dict[str, Any]:
    if team not in TEAMS:
        raise UserError(f"unknown team {team!r}; valid teams: {', '.join(TEAMS)}")
    if roster not in ROSTERS:
        raise UserError(f"unknown roster {roster!r}; valid rosters: {', '.join(ROSTERS)}")
    return _registry()["teams"][team]


def resolve_team(team: str | None = None, roster: str = "pocket",
                 experts: list[str] | str | None = None,
                 team_file: str | Path | None = None) -> list[ExpertSpec]:
    """The team's experts: a named team × roster, an ``--experts`` list or a team file."""
    given = [x for x in (team, experts, team_file) if x is not None]
    if len(given) > 1:
        raise UserError("give one of --team, --experts or --team-file, not several")
    if experts is not None:
        return parse_experts(experts)
    if team_file is not None:
        return load_team_file(team_file)
    names = _team(team or DEFAULT_TEAM, roster)["rosters"][roster]
    return [EXPERTS[n] for n in names]


def run_team(team: str | None, roster: str, experts: list[str] | str | None,
             team_file: str | Path | None) -> list[ExpertSpec]:
    """A run's experts: ``experts`` or ``team_file`` replace the named team (a run's config
    always holds a team, its default), the trainer's rule and the grid's."""
    if experts or team_file:
        return resolve_team(None, roster, experts or None, Path(team_file) if team_file else None)
    return resolve_team(team, roster)


def policy_spec(name: str | None = None) -> ExpertSpec:
    """The policy's spec: a ``POLICIES`` key, a registry expert, a folder or a hub id."""
    name = name or DEFAULT_POLICY
    if name in POLICIES:
        return EXPERTS[POLICIES[name]]
    try:
        return expert_spec(name)
    except UserError:
        raise UserError(f"unknown policy {name!r}: use a local folder, a hub id org/name, or "
                        f"one of: {', '.join([*POLICIES, *EXPERTS])}") from None


def describe(team: str, roster: str = "pocket") -> str:
    """Human-readable team card: members, size against the paper's, and any deviation."""
    info = _team(team, roster)
    members = resolve_team(team, roster)
    head = f"team {team} ({roster} roster): {info['description']}"
    size = f"{len(members)} of the paper's {info['size']} experts"
    lines = [head, size if len(members) != info["size"] else f"{len(members)} experts"]
    lines += [f"  - {s.name} [{s.kind}: {s.ref}] {s.description}" for s in members]
    note = info.get("notes", {}).get(roster)
    if note:
        lines.append(f"note: {note}")
    return "\n".join(lines)
