"""Which rules report, and at which severity: `--select/--ignore/--severity` and exl3tool.toml.

The semantics follow ruff's rule selection. A selector is a rule code (`R7023`), a family
(`R7`, `CA`), a longer prefix of codes (`R70`), or `ALL`. For each finding the most specific
selector that matches its code decides (a longer prefix is more specific; `ALL` is the least
specific); at equal specificity `ignore` beats `select`. With no `select`, every rule is selected.
A severity override is chosen the same way: the most specific matching key wins.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from exl3tool.rules.errors import UsageError
from exl3tool.rules.registry import Finding, Findings, Severity, all_rules, family_of

ALL = "ALL"


def _known_codes() -> frozenset[str]:
    return frozenset(r.code for r in all_rules())


def check_selector(item: str, codes: frozenset[str] | None = None) -> str:
    """`item` normalised to upper case; an unknown code or prefix is a usage error."""
    if not isinstance(item, str) or not item.strip():
        raise UsageError(f"rule selector {item!r} is not a rule code or family")
    sel = item.strip().upper()
    if sel == ALL:
        return sel
    codes = _known_codes() if codes is None else codes
    families = {family_of(c) for c in codes}
    # a prefix must start with a whole family: "R" would mix R7 and RS
    if any(c.startswith(sel) and sel.startswith(family_of(c)) for c in codes):
        return sel
    hint = f"families: {', '.join(sorted(families))}; list the codes with `exl3tool rules`"
    raise UsageError(f"unknown rule code or family {item!r} ({hint})")


def _specificity(selector: str) -> int:
    return 0 if selector == ALL else len(selector)


def _best(code: str, selectors: Iterable[str]) -> int:
    """Specificity of the most specific selector matching `code`, -1 when none does."""
    return max(
        (_specificity(s) for s in selectors if s == ALL or code.startswith(s)),
        default=-1,
    )


@dataclass(frozen=True)
class RuleSelection:
    """Selected and ignored rules plus severity overrides; the default selects every rule."""

    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    severity: Mapping[str, Severity] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        codes = _known_codes() if self.select or self.ignore or self.severity else frozenset()
        object.__setattr__(self, "select", tuple(check_selector(s, codes) for s in self.select))
        object.__setattr__(self, "ignore", tuple(check_selector(s, codes) for s in self.ignore))
        levels: dict[str, Severity] = {}
        for key, value in dict(self.severity).items():
            try:
                levels[check_selector(key, codes)] = Severity(value)
            except ValueError:
                choices = ", ".join(s.value for s in Severity)
                raise UsageError(f"severity of {key} is {value!r}, not one of {choices}") from None
        object.__setattr__(self, "severity", MappingProxyType(levels))

    @property
    def is_default(self) -> bool:
        return not (self.select or self.ignore or self.severity)

    def selects(self, code: str) -> bool:
        """Whether findings of rule `code` are reported."""
        chosen = _best(code, self.select) if self.select else 0
        return chosen > _best(code, self.ignore)

    def level(self, code: str, default: Severity) -> Severity:
        """The severity findings of `code` report at (`default` without an override)."""
        best, level = -1, default
        for key, value in self.severity.items():
            spec = _specificity(key)
            if (key == ALL or code.startswith(key)) and spec > best:
                best, level = spec, value
        return level

    def apply_one(self, f: Finding) -> Finding | None:
        """The finding as reported, or None when its rule is not selected."""
        if not self.selects(f.code):
            return None
        level = self.level(f.code, f.level)
        return f if level is f.level else replace(f, severity=level)

    def apply(self, findings: Iterable[Finding]) -> Findings:
        """Keep the selected findings (in order), re-levelled by the severity overrides."""
        kept = (self.apply_one(f) for f in findings)
        return Findings(f for f in kept if f is not None)

    def overridden_by(self, other: RuleSelection) -> RuleSelection:
        """This selection (a config's) with `other` (the command line's) on top: a non-empty
        `select` replaces ours, `ignore` adds to ours, severity keys replace ours one by one."""
        return RuleSelection(
            select=other.select or self.select,
            ignore=(*self.ignore, *other.ignore),
            severity={**self.severity, **other.severity},
        )

    def to_mapping(self) -> dict[str, Any]:
        """The exl3tool.toml keys of this selection (empty ones left out)."""
        out: dict[str, Any] = {}
        if self.select:
            out["select"] = list(self.select)
        if self.ignore:
            out["ignore"] = list(self.ignore)
        if self.severity:
            out["severity"] = {k: v.value for k, v in self.severity.items()}
        return out

    @classmethod
    def from_config(cls, mapping: Mapping[str, Any]) -> RuleSelection:
        """Read the `select`, `ignore` and `severity` keys of an exl3tool.toml table."""

        def _list(key: str) -> tuple[str, ...]:
            value = mapping.get(key, ())
            if isinstance(value, str) or not isinstance(value, (list, tuple)):
                raise UsageError(f"config key {key!r} must be a list of rule codes or families")
            return tuple(value)

        levels = mapping.get("severity", {})
        if not isinstance(levels, Mapping):
            raise UsageError(
                "config key 'severity' must be a table of CODE = \"error|warning|info\""
            )
        return cls(select=_list("select"), ignore=_list("ignore"), severity=dict(levels))

    @classmethod
    def from_options(
        cls,
        select: Iterable[str] = (),
        ignore: Iterable[str] = (),
        severity: Iterable[str] = (),
    ) -> RuleSelection:
        """From command-line values: selectors may be comma-separated, severities `CODE=LEVEL`."""

        def _split(values: Iterable[str]) -> tuple[str, ...]:
            return tuple(p for v in values for p in v.split(",") if p.strip())

        levels: dict[str, str] = {}
        for item in _split(severity):
            code, sep, level = item.partition("=")
            if not sep:
                raise UsageError(f"--severity {item!r}: write CODE=LEVEL, e.g. R7023=warning")
            levels[code.strip()] = level.strip().lower()
        return cls(select=_split(select), ignore=_split(ignore), severity=levels)
