"""The lighter import of typer's help renderer prints exactly what the ordinary import prints."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from exl3tool.cli.lean_rich import DISABLE


def _run(args: list[str], eager: bool) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "100", "TERM": "dumb"}
    env.pop(DISABLE, None)
    if eager:
        env[DISABLE] = "1"
    code = (
        "import sys; from exl3tool.cli import entry; sys.argv[0] = 'exl3tool'\n"
        "try:\n    entry()\nfinally:\n"
        "    print('LOADED', 'markdown_it' in sys.modules, file=sys.stderr)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=60
    )


@pytest.mark.parametrize("args", [[], ["--help"], ["validate", "--help"], ["identity", "-h"]])
def test_help_is_the_same_without_the_unused_rich_modules(args: list[str]) -> None:
    lean, eager = _run(args, eager=False), _run(args, eager=True)
    assert lean.stdout == eager.stdout and lean.returncode == eager.returncode
    assert "Usage" in lean.stdout
    assert "LOADED False" in lean.stderr  # markdown-it (rich.markdown) never imported
    assert "LOADED True" in eager.stderr  # the ordinary import does load it: the test can fail


def test_stand_ins_load_the_real_classes() -> None:
    code = (
        "from exl3tool.cli.lean_rich import import_rich_utils; import_rich_utils()\n"
        "import typer.rich_utils as r, rich.markdown, rich.traceback\n"
        "assert type(r.Markdown('# x')) is rich.markdown.Markdown\n"
        "assert r.Traceback.from_exception == rich.traceback.Traceback.from_exception\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
