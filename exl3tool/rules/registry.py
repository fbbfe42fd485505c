"""Rules as data, and the findings they produce.

Every check in exl3tool reports a `Finding` of a registered `Rule`. Rules are declared at import
time of the module that checks them (``rule(...)``); `all_rules()` imports every such module so
that `exl3tool rules` and docs/rules.md list the whole catalogue.
"""

from __future__ import annotations

import enum
import importlib
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from exl3tool.rules.examples import EXAMPLES
from exl3tool.rules.families import family_title

# Modules that declare rules; `all_rules()` imports them. Add yours here.
RULE_MODULES: tuple[str, ...] = (
    "exl3tool.rules.io",
    "exl3tool.rules.checkpoint",
    "exl3tool.rules.exl3",
    "exl3tool.rules.r7",
    "exl3tool.rules.cartridge",
    "exl3tool.rules.base",
    "exl3tool.rules.decode",
    "exl3tool.rules.identity",
    "exl3tool.rules.tp",
    "exl3tool.rules.check",
    "exl3tool.rules.crash",
    "exl3tool.rules.verify",
    "exl3tool.rules.plan",
)


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        return {"error": 2, "warning": 1, "info": 0}[self.value]


@dataclass(frozen=True)
class Rule:
    """A stable, documented check: `code` never changes once published."""

    code: str
    name: str
    severity: Severity
    title: str
    why: str
    hint: str
    example: str = ""  # an artifact fragment that triggers the rule (rules/examples.py)

    @property
    def family(self) -> str:
        return family_of(self.code)

    @property
    def family_title(self) -> str:
        return family_title(self.family)


def family_of(code: str) -> str:
    """A rule code without its 3-digit number: ST001 -> ST, R7030 -> R7."""
    return code[:-3]


_REGISTRY: dict[str, Rule] = {}


def rule(code: str, name: str, severity: Severity | str, title: str, why: str, hint: str) -> Rule:
    """Declare (register) a rule; declaring the same code twice with other content is a bug."""
    r = Rule(code, name, Severity(severity), title, why, hint, EXAMPLES.get(code, ""))
    old = _REGISTRY.get(code)
    if old is not None and old != r:
        raise RuntimeError(f"rule code {code} declared twice with different content")
    _REGISTRY[code] = r
    return r


def get_rule(code: str) -> Rule:
    return _REGISTRY[code]


def all_rules() -> list[Rule]:
    """Every rule of the catalogue, sorted by code."""
    for mod in RULE_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:  # a family not built yet in this checkout
            if exc.name != mod:
                raise
    return sorted(_REGISTRY.values(), key=lambda r: r.code)


# Findings quote hostile input. Lone surrogates (JSON "\ud800" escapes) cannot be encoded as
# UTF-8 and would crash every renderer; control characters (ESC, C1) would drive the terminal.
# Both are carried in escaped form; newlines and tabs stay.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def _printable(text: str | None) -> str | None:
    if text is None or not _UNPRINTABLE.search(text):
        return text
    return _UNPRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


@dataclass(frozen=True)
class Location:
    """Where a finding points: a file, a tensor inside it, and/or a JSON pointer."""

    file: str | None = None
    tensor: str | None = None
    pointer: str | None = None

    def to_json(self) -> dict[str, str | None]:
        return {"file": self.file, "tensor": self.tensor, "pointer": self.pointer}


@dataclass(frozen=True)
class Finding:
    rule: Rule
    message: str
    location: Location = field(default_factory=Location)
    severity: Severity | None = None  # overrides the rule's default when set

    @property
    def code(self) -> str:
        return self.rule.code

    @property
    def level(self) -> Severity:
        return self.severity or self.rule.severity

    @property
    def hint(self) -> str:
        return self.rule.hint

    def to_json(self) -> dict:
        return {
            "code": self.code,
            "severity": self.level.value,
            "message": self.message,
            "location": self.location.to_json(),
            "hint": self.hint,
        }


_T = TypeVar("_T")


class Findings:
    """An append-only list of findings with a convenient `add`."""

    def __init__(self, items: Iterable[Finding] = ()) -> None:
        self._items: list[Finding] = list(items)

    def add(
        self,
        r: Rule,
        message: str,
        *,
        file: str | None = None,
        tensor: str | None = None,
        pointer: str | None = None,
        severity: Severity | str | None = None,
    ) -> Finding:
        f = Finding(
            r,
            _printable(message),
            Location(_printable(file), _printable(tensor), _printable(pointer)),
            Severity(severity) if severity else None,
        )
        self._items.append(f)
        return f

    def add_counted(
        self,
        r: Rule,
        items: Sequence[_T],
        describe: Callable[[_T], tuple[str, dict[str, Any]]],
        more: str,
        named: int,
    ) -> None:
        """A finding for each of the first `named` items (`describe` gives its message and
        `add`'s location keywords), then one that counts the rest: `more` with `{n}` in it,
        located at the first item left unnamed. Only the named items are described."""
        for item in items[:named]:
            message, where = describe(item)
            self.add(r, message, **where)
        if len(items) > named:
            self.add(r, more.format(n=len(items) - named), **describe(items[named])[1])

    def extend(self, items: Iterable[Finding]) -> None:
        self._items.extend(items)

    def __iter__(self) -> Iterator[Finding]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def codes(self) -> set[str]:
        return {f.code for f in self._items}

    def errors(self) -> list[Finding]:
        return [f for f in self._items if f.level is Severity.ERROR]

    def has_errors(self) -> bool:
        return any(f.level is Severity.ERROR for f in self._items)

    def count(self, severity: Severity) -> int:
        return sum(1 for f in self._items if f.level is severity)
