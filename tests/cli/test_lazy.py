"""Commands are imported and built on lookup, and built exactly as typer builds them."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from exl3tool.cli.main import Commands, app

_PROBE = """
import sys
from exl3tool.cli import entry
sys.argv = ["exl3tool", *sys.argv[1:]]
try:
    entry()
finally:
    loaded = sorted(m for m in sys.modules if m.startswith("exl3tool.cli."))
    print("LOADED", ",".join(loaded), file=sys.stderr)
"""


def _loaded(args: list[str]) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=60
    )
    line = next(x for x in out.stderr.splitlines() if x.startswith("LOADED "))
    return {m.rsplit(".", 1)[1] for m in line[len("LOADED ") :].split(",")}


_MODULES = {t.partition(":")[0].rsplit(".", 1)[1] for t in Commands.table.values()}


def test_a_command_imports_only_its_own_module() -> None:
    assert _loaded(["identity", "--help"]) & _MODULES == {"identity"}
    assert _loaded(["rules", "--help"]) & _MODULES == {"rules_cmd"}


def test_root_help_imports_and_lists_every_command_in_order() -> None:
    assert _loaded(["--help"]) >= _MODULES
    out = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "100", "NO_COLOR": "1"}).stdout
    at = [out.index(f"│ {name} ") for name in Commands.table]
    assert at == sorted(at)


def _shape(obj: Any) -> Any:
    """What typer built, without the per-build callables: attributes, params, their types."""
    if isinstance(obj, list | tuple):
        return [_shape(x) for x in obj]
    if not hasattr(obj, "__dict__") or isinstance(obj, type):
        return obj
    fields = {k: _shape(v) for k, v in vars(obj).items() if not callable(v)}
    return type(obj).__name__, fields


def test_a_lazy_command_is_the_one_typer_would_build() -> None:
    group = typer.main.get_command(app)
    for name, target in Commands.table.items():
        module, _, attr = target.partition(":")
        ordinary = typer.Typer()
        ordinary.command(name)(getattr(__import__(module, fromlist=[attr]), attr))
        ordinary.command("other")(lambda: None)  # two commands: typer builds a group
        want = typer.main.get_command(ordinary).commands[name]  # type: ignore[attr-defined]
        got = group.commands[name]  # type: ignore[attr-defined]
        assert _shape(got) == _shape(want), name
        assert len(got.params) == len(want.params) > 0 and got.help == want.help
        assert got is group.commands[name]  # type: ignore[attr-defined]


def test_a_mistyped_command_is_still_suggested() -> None:
    result = CliRunner().invoke(app, ["valdate"], env={"COLUMNS": "100", "NO_COLOR": "1"})
    assert result.exit_code == 2
    assert "Did you mean 'validate'?" in result.output


def test_root_help_lists_commands_without_building_them_and_prints_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While the group's help is written, unbuilt commands are stand-ins holding what the
    listing reads, equal to the built command's; the help is the one every built command
    gives."""
    from exl3tool.cli.lazy import _Listed

    fresh = typer.main.get_command(app)
    commands = fresh.commands  # type: ignore[attr-defined]
    commands.listing = True
    listed = {name: commands[name] for name in Commands.table}
    commands.listing = False
    assert all(type(c) is _Listed for c in listed.values())
    assert not any(isinstance(v, typer.core.TyperCommand) for v in commands._items.values())
    for name, stand_in in listed.items():
        real = commands[name]
        for attr in ("name", "help", "short_help", "hidden", "deprecated", "rich_help_panel"):
            assert getattr(stand_in, attr) == getattr(real, attr), (name, attr)
        assert stand_in.params == real.params  # anything else: read from the built command
    env = {"COLUMNS": "100", "NO_COLOR": "1"}
    lazy = CliRunner().invoke(app, ["--help"], env=env).stdout
    from exl3tool.cli.lazy import LazyGroup

    monkeypatch.setattr(LazyGroup, "format_help", typer.core.TyperGroup.format_help)
    built = CliRunner().invoke(app, ["--help"], env=env).stdout  # every command built
    assert lazy == built and "identity" in lazy
