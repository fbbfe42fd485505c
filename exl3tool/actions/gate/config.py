"""The release declaration `exl3tool check` runs: exl3tool.toml / [tool.exl3tool] (exl3tool-config/1).

A malformed file (not TOML, unreadable) is a usage error; a well-formed file that breaks the schema
gives GT001 findings (with a JSON pointer), so that CI shows every mistake at once.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from exl3tool.io.fs import read_document
from exl3tool.io.strict_json import pointer_join
from exl3tool.rules.check import GT_CONFIG_SCHEMA
from exl3tool.rules.errors import InputError, UsageError
from exl3tool.rules.registry import Findings
from exl3tool.rules.selection import RuleSelection

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    try:
        import tomli as tomllib
    except ImportError:  # only reading a config needs it
        tomllib = None  # type: ignore[assignment]

SCHEMA_ID = "exl3tool-config/1"
CONFIG_NAME = "exl3tool.toml"
ROLES = ("checkpoint", "base", "cartridge")


SCHEMA_FILE = "exl3tool-config-1.schema.json"


@dataclass(frozen=True)
class ArtifactSpec:
    """One artifact of a release and what to check on it (None: the config-wide default)."""

    path: str
    name: str | None = None
    kind: str | None = None
    role: str | None = None
    base: str | None = None
    identity: str | None = None
    hash: bool | None = None
    tp: tuple[int, ...] | None = None
    verify_swap: bool | tuple[int, ...] | None = None

    @property
    def label(self) -> str:
        return self.name or self.path


@dataclass(frozen=True)
class GateConfig:
    artifacts: tuple[ArtifactSpec, ...] = ()
    hash: bool = True
    strict: bool = False
    tp: tuple[int, ...] = ()
    verify_swap: bool | tuple[int, ...] = False
    device: str = "cpu"  # where verify-swap runs
    threads: int | None = None
    tmp_dir: str | None = None
    rules: RuleSelection = field(default_factory=RuleSelection)  # select / ignore / severity
    root: Path = field(default_factory=Path)  # relative paths are resolved against it
    source: Path | None = None  # the file it came from; None when inferred from PATH arguments

    def resolve(self, rel: str) -> Path:
        p = Path(rel).expanduser()
        return p if p.is_absolute() else self.root / p

    def with_artifacts(self, extra: list[ArtifactSpec]) -> GateConfig:
        return replace(self, artifacts=(*self.artifacts, *extra))


def _tp(value: Any) -> tuple[int, ...] | None:
    return None if value is None else tuple(value)


def _swap(value: Any) -> bool | tuple[int, ...] | None:
    return value if value is None or isinstance(value, bool) else tuple(value)


def _rules(data: dict[str, Any], label: str) -> RuleSelection:
    """The select / ignore / severity keys; an unknown code or family is a usage error."""
    try:
        return RuleSelection.from_config(data)
    except UsageError as exc:
        raise UsageError(f"{label}: {exc}") from None


def from_mapping(data: Any, *, root: Path, source: Path | None, findings: Findings) -> GateConfig:
    """Validate `data` against the schema (GT001 per violation) and build the config."""
    from exl3tool.io import schemas

    label = str(source) if source else "exl3tool config"
    validator = schemas.validator(SCHEMA_FILE)
    bad = False
    for err in sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path))):
        bad = True
        pointer = ""
        for part in err.absolute_path:
            pointer = pointer_join(pointer, str(part))
        findings.add(GT_CONFIG_SCHEMA, err.message, file=label, pointer=pointer or "/")
    if bad:
        return GateConfig(root=root, source=source)
    assert isinstance(data, dict)
    arts = []
    seen: dict[str, int] = {}
    for i, a in enumerate(data.get("artifacts", [])):
        spec = ArtifactSpec(
            path=a["path"],
            name=a.get("name"),
            kind=a.get("kind"),
            role=a.get("role"),
            base=a.get("base"),
            identity=a.get("identity"),
            hash=a.get("hash"),
            tp=_tp(a.get("tp")),
            verify_swap=_swap(a.get("verify_swap")),
        )
        if spec.label in seen:
            findings.add(
                GT_CONFIG_SCHEMA,
                f"artifact name {spec.label!r} is used twice (artifacts {seen[spec.label]} and {i})",
                file=label,
                pointer=f"/artifacts/{i}/name",
            )
        seen[spec.label] = i
        arts.append(spec)
    return GateConfig(
        artifacts=tuple(arts),
        hash=data.get("hash", True),
        strict=data.get("strict", False),
        tp=tuple(data.get("tp", ())),
        verify_swap=_swap(data.get("verify_swap", False)),  # type: ignore[arg-type]
        device=data.get("device", "cpu"),
        threads=data.get("threads"),
        tmp_dir=data.get("tmp_dir"),
        rules=_rules(data, label),
        root=root,
        source=source,
    )


CONFIG_MAX_BYTES = 16 << 20  # an exl3tool.toml, or the pyproject.toml that holds its table


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        raw = read_document(path, CONFIG_MAX_BYTES)
    except OSError as exc:  # absent, unreadable: an input that cannot be read (exit 3)
        raise InputError(f"cannot read config {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"cannot read config {path}: {exc}") from None
    if tomllib is None:  # pragma: no cover - Python 3.10 without tomli
        raise UsageError("reading exl3tool.toml on Python 3.10 needs tomli: pip install tomli")
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"config {path} is not valid TOML: {exc}") from None
    except RecursionError:  # tomllib's parser recurses per nested array or inline table
        raise UsageError(f"config {path} is not valid TOML: nested too deeply") from None


def _tool_table(data: dict[str, Any]) -> Any:
    """pyproject.toml's [tool.exl3tool] table, or None (absent, or `tool` is not a table)."""
    tool = data.get("tool")
    return tool.get("exl3tool") if isinstance(tool, dict) else None


def load_config(path: Path, findings: Findings) -> GateConfig:
    """Load exl3tool.toml, or the [tool.exl3tool] table of a pyproject.toml."""
    path = Path(path)
    data: Any = _read_toml(path)
    if path.name == "pyproject.toml":
        data = _tool_table(data)
        if data is None:
            raise UsageError(f"{path} has no [tool.exl3tool] table")
    return from_mapping(data, root=path.resolve().parent, source=path, findings=findings)


def discover(cwd: Path) -> Path | None:
    """exl3tool.toml in `cwd`, else a pyproject.toml there that has a [tool.exl3tool] table."""
    candidate = cwd / CONFIG_NAME
    if candidate.is_file():
        return candidate
    pyproject = cwd / "pyproject.toml"
    if pyproject.is_file() and _tool_table(_read_toml(pyproject)) is not None:
        return pyproject
    return None
