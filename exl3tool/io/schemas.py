"""The one JSON Schema loader: every schema ships inside the package (`exl3tool/schemas/`).

Schemas are read with `importlib.resources`, so a wheel install finds them wherever it lives;
jsonschema is imported on first use only.
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from typing import Any

from exl3tool.io.strict_json import pointer_join

_REQUIRED = re.compile(r"'([^']*)' is a required property")


def schema_text(name: str) -> str:
    """The text of `exl3tool/schemas/<name>`."""
    return resources.files("exl3tool.schemas").joinpath(name).read_text(encoding="utf-8")


@functools.cache
def schema(name: str) -> dict[str, Any]:
    return json.loads(schema_text(name))


@functools.cache
def validator(name: str) -> Any:
    """A draft 2020-12 validator for `exl3tool/schemas/<name>`. In exl3tool's own documents
    (`exl3tool-*`) an integer is a JSON integer only: the draft also calls 8.0 one, which the
    code that slices and indexes with it would then meet as a float."""
    import jsonschema

    cls = jsonschema.validators.extend(
        jsonschema.Draft202012Validator, validators={"pattern": _pattern}
    )
    if name.startswith("exl3tool-"):
        checker = cls.TYPE_CHECKER.redefine("integer", _json_integer)
        cls = jsonschema.validators.extend(cls, type_checker=checker)
    return cls(schema(name))


def _json_integer(_checker: Any, value: Any) -> bool:
    return type(value) is int


def _pattern(validator: Any, pattern: str, instance: Any, _schema: Any) -> Any:
    """The `pattern` keyword with its regular expression read as JSON Schema reads it (ECMA-262):
    `$` is the end of the string. Python's `$` also matches before a final newline, so a digest
    or label with a trailing "\n" passed, which the runtime's full matches refuse."""
    from jsonschema import ValidationError

    if validator.is_type(instance, "string") and not ecma_regex(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


@functools.cache
def ecma_regex(pattern: str) -> re.Pattern[str]:
    """`pattern` compiled with every `$` outside a character class as `\\Z` (ECMA-262's `$`
    without the multiline flag: the end of the input only)."""
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern[i + 1 : i + 2] == "^":  # `[^` and a `]` right after `[` are literal
                out.append("[^")
                i += 2
                if pattern[i : i + 1] == "]":
                    out.append("]")
                    i += 1
                continue
            if pattern[i + 1 : i + 2] == "]":
                out.append("[]")
                i += 2
                continue
        elif c == "$":
            c = "\\Z"
        out.append(c)
        i += 1
    return re.compile("".join(out))


def error_pointer(err: Any) -> tuple[str, tuple[Any, ...]]:
    """The JSON pointer (and path) of one jsonschema error; `required` points at the missing member."""
    path = tuple(err.absolute_path)
    if err.validator == "required":
        missing = _REQUIRED.findall(err.message)
        path = (*path, *missing[:1])
    ptr = ""
    for tok in path:
        ptr = pointer_join(ptr, tok)
    return ptr, path


def schema_errors(name: str, value: Any) -> list[tuple[str, str, tuple[Any, ...]]]:
    """(JSON pointer, message, path) of every schema violation, sorted by pointer."""
    out = []
    for err in validator(name).iter_errors(value):
        ptr, path = error_pointer(err)
        out.append((ptr, err.message, path))
    return sorted(out, key=lambda e: e[0])
