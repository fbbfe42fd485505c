"""typer's rich help renderer without the rich modules it imports but never uses here.

`typer.rich_utils` imports `rich.markdown` (markdown-it, pygments and its entry-point scan) and
`rich.traceback` (rich.pretty, attrs) at module level. exl3tool uses neither: its help is
rich markup, not markdown, and pretty exceptions are off. Importing `typer.rich_utils` with
those two names bound to stand-ins that load the real class on first use saves ~40 ms of every
`--help` and usage error; what is printed is the same (tests/cli/test_lean_rich.py).
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from typing import Any

_STAND_INS = {"rich.markdown": "Markdown", "rich.traceback": "Traceback"}
DISABLE = "EXL3TOOL_EAGER_RICH"  # set to import typer.rich_utils the ordinary way


class _Deferred(type):
    """Metaclass of a stand-in: class attributes (Traceback.from_exception) come from the real
    class, imported on first use."""

    def __getattr__(cls, attr: str) -> Any:
        return getattr(cls._real(), attr)  # type: ignore[attr-defined]


def _stand_in(module: str, name: str) -> type:
    def real(_cls: Any = None) -> Any:
        return getattr(importlib.import_module(module), name)

    def new(cls: type, *args: Any, **kwargs: Any) -> Any:
        return real()(*args, **kwargs)

    return _Deferred(name, (), {"__new__": new, "_real": staticmethod(real)})


def import_rich_utils() -> None:
    """Import `typer.rich_utils` with the stand-ins (once; a no-op if anything is already
    imported or the environment asks for the ordinary import)."""
    if os.environ.get(DISABLE) or "typer.rich_utils" in sys.modules:
        return
    if any(m in sys.modules for m in _STAND_INS):
        return
    placed = []
    try:
        for module, name in _STAND_INS.items():
            stub = types.ModuleType(module)
            setattr(stub, name, _stand_in(module, name))
            sys.modules[module] = stub
            placed.append(module)
        importlib.import_module("typer.rich_utils")
    finally:
        for module in placed:  # a later import of these modules loads the real ones
            if sys.modules.get(module) is not None and not hasattr(sys.modules[module], "__file__"):
                del sys.modules[module]
