"""A path argument no file system can look up (longer than NAME_MAX, a NUL byte) or a FIFO
posing as a config is one line and exit 3 (or 2 for the gate's config), never a traceback or
a hang; the message cuts the name (found by the fuzz campaign's gate entry)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from exl3tool.cli.main import app
from exl3tool.cli.plain import guarded
from exl3tool.io.fs import exists, read_document, shown

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ENV = {"NO_COLOR": "1", "GITHUB_ACTIONS": None}
LONG = "a" * 5000


def run(*args: object):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, [str(a) for a in args], env=ENV)


@pytest.mark.parametrize(
    "args",
    [
        ["validate", LONG],
        ["identity", LONG],
        ["inspect", LONG],
        ["plan", LONG],
        ["check", LONG],
        ["diff", LONG, EXAMPLES / "r7-tiny"],
        ["slice", LONG, "--tp", "2", "-o", "out"],
        ["stage-cartridge", LONG, "--base", LONG, "-o", "out"],
        ["validate", "ab/" * 2000],
        ["identity", EXAMPLES / "r7-tiny", "--check", LONG + ".json"],
    ],
)
def test_a_name_too_long_is_one_line_and_exit_3(args: list[object]) -> None:
    got = run(*args)
    assert got.exit_code == 3, got.output
    assert got.exception is None or isinstance(got.exception, SystemExit)
    lines = got.output.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) < 300 and "characters)" in lines[0]


def test_the_plain_lines_map_an_unreadable_file_to_exit_3(capsys: pytest.CaptureFixture) -> None:
    def boom() -> int:
        raise OSError(36, "File name too long", LONG)

    assert guarded(boom) == 3
    err = capsys.readouterr().err
    assert err.startswith("exl3tool: aaa") and err.endswith(": File name too long\n")
    assert len(err) < 300 and "(5001 characters)" in err


def test_a_fifo_config_is_unreadable_input_not_waited_on(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "exl3tool.toml")
    got = run("check", "--config", tmp_path / "exl3tool.toml")
    assert got.exit_code == 3 and "not a regular file" in got.output


def test_fs_helpers() -> None:
    assert not exists(LONG) and not exists("a\0b") and exists(EXAMPLES)
    assert shown("short") == "short" and len(shown(LONG)) < 200
    with pytest.raises(ValueError, match="limit 10"):
        read_document(EXAMPLES / "r7-tiny" / "config.json", 10)


def test_a_config_nested_too_deeply_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "exl3tool.toml").write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    got = run("check", "--config", tmp_path / "exl3tool.toml")
    assert got.exit_code == 2 and "nested too deeply" in got.output
