"""Time commands as an installed package runs them: from compiled modules.

pip compiles a wheel's modules when it installs it. A checkout where PYTHONDONTWRITEBYTECODE is
set (as on this project's VMs) compiles every module of exl3tool at every start instead, ~60 ms
of each command on two cores. `use_bytecode(tmp)` lets the children of this process cache
compiled modules in a PYTHONPYCACHEPREFIX under `tmp`; the first run of a command fills it, so
time it as a warm-up.
"""

from __future__ import annotations

import os
from pathlib import Path

HELP = (
    "cache compiled modules (in a temporary PYTHONPYCACHEPREFIX, filled by a warm-up run) even "
    "where PYTHONDONTWRITEBYTECODE is set, as an installed package has them"
)


def use_bytecode(tmp: Path) -> None:
    """Children started from now on cache their compiled modules under `tmp`."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")


def bytecode_state() -> str:
    """`on` when children keep compiled modules, else `off` (for a benchmark's first line)."""
    return "off" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "on"
