"""`exl3tool rules`: the rule catalogue, whole or one family (or code prefix)."""

from __future__ import annotations

from dataclasses import dataclass

from exl3tool.rules.errors import UsageError
from exl3tool.rules.registry import Rule, all_rules, family_of


@dataclass(frozen=True)
class Options:
    family: str | None = None  # a family (R7, CA) or any longer prefix of codes (R70)


def run(opts: Options) -> list[Rule]:
    """The rules whose code starts with the family; an unknown family is a usage error."""
    rules = all_rules()
    if not opts.family:
        return rules
    prefix = opts.family.strip().upper()
    items = [r for r in rules if r.code.startswith(prefix)]
    if not items:
        families = ", ".join(sorted({family_of(r.code) for r in rules}))
        raise UsageError(f"--family {opts.family!r} matches no rule; families: {families}")
    return items


def to_json(rules: list[Rule]) -> list[dict[str, str]]:
    """The catalogue as JSON: one object per rule, with its example and family title."""
    return [
        {
            "code": r.code,
            "name": r.name,
            "severity": r.severity.value,
            "title": r.title,
            "why": r.why,
            "hint": r.hint,
            "example": r.example,
            "family": r.family,
            "family_title": r.family_title,
        }
        for r in rules
    ]
