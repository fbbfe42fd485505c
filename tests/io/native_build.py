"""Whether a compiled module of native/ should be importable here: setup.py builds each one
wherever a C compiler is; without one the install goes on and the Python code runs."""

from __future__ import annotations

import shutil
import sysconfig

import pytest


def c_compiler() -> str | None:
    """The compiler setup.py builds extensions with, when this machine has it."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    return shutil.which(cc[0]) if cc else None


def check_built(module: object, name: str, without: str) -> None:
    """Fail when `exl3tool.io.<name>` is missing although a C compiler is here; skip (saying
    `without`, what runs instead) when there is no compiler to build it."""
    if module is None and c_compiler() is None:
        pytest.skip(f"no C compiler on this machine: {without}")
    assert module is not None, f"exl3tool.io.{name} is missing: rebuild (make clean install)"
