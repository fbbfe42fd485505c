"""Settings of the machine running the tests that would change what the tool prints."""

from __future__ import annotations

import signal

import pytest


@pytest.fixture(autouse=True, scope="session")
def _ctrl_c_raises() -> object:
    """Ctrl-C raises KeyboardInterrupt in the test process, as in a terminal. A shell without
    job control starts a background job (`make test &`, some CI runners) with SIGINT ignored,
    and Python then installs no handler of its own: the tests that interrupt themselves would
    wait for a signal that never comes."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


@pytest.fixture(autouse=True)
def _plain_ci_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI runners set GITHUB_ACTIONS (annotations on stderr, typer forcing a coloured
    terminal); FORCE_COLOR and PY_COLORS force colour too; EXL3TOOL_NO_FORK, EXL3TOOL_NO_EARLY
    and EXL3TOOL_NO_LEASE change how identity reads. The tests that want any of them set it."""
    for var in (
        "GITHUB_ACTIONS",
        "FORCE_COLOR",
        "PY_COLORS",
        "EXL3TOOL_NO_FORK",
        "EXL3TOOL_NO_EARLY",
        "EXL3TOOL_NO_LEASE",
    ):
        monkeypatch.delenv(var, raising=False)
    try:
        import typer.rich_utils
    except ImportError:  # the wheel-check venv has typer; a bare one may not
        return
    monkeypatch.setattr(typer.rich_utils, "FORCE_TERMINAL", None)
