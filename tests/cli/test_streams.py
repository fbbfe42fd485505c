"""Standard streams as the field hands them over: a reader that has gone (EPIPE), a closed
stdout, an encoding that cannot write "…" or "§", COLUMNS=0."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
R7 = str(EXAMPLES / "r7-tiny")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "PYTHONIOENCODING")}
    return {**env, "EXL3TOOL_NO_PROGRESS": "1", **extra}


def _run(args: list[str], **kw) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "exl3tool", *args]
    return subprocess.run(cmd, stderr=subprocess.PIPE, text=True, timeout=120, **kw)


@pytest.mark.parametrize(
    "args",
    [["rules"], ["validate", R7], ["validate", R7, "-f", "json"], ["inspect", R7], ["--help"]],
    ids=["rules", "validate", "validate-json", "inspect", "help"],
)
def test_a_reader_that_has_gone_is_exit_141_without_a_traceback(args: list[str]) -> None:
    r, w = os.pipe()
    os.close(r)  # every write of the child meets EPIPE
    try:
        got = _run(args, stdout=w, env=_env())
    finally:
        os.close(w)
    assert got.returncode == 141, got.stderr
    assert "Traceback" not in got.stderr


def test_a_closed_stdout_keeps_the_exit_code() -> None:
    got = _run(["validate", R7, "-f", "json"], preexec_fn=lambda: os.close(1), env=_env())
    assert got.returncode == 0, got.stderr
    assert "Traceback" not in got.stderr


@pytest.mark.parametrize(("encoding", "escape"), [("ascii", "\\xa7"), ("latin-1", "\\u2026")])
def test_an_encoding_without_the_characters_escapes_them(
    encoding: str, escape: str, tmp_path: Path
) -> None:
    # "§" is in --help; "…" ends a path cut to the width of the summary table
    long = tmp_path / ("d" * 120)
    shutil.copytree(R7, long)
    args = ["--help"] if encoding == "ascii" else ["validate", str(long)]
    cmd = [sys.executable, "-m", "exl3tool", *args]
    env = _env(PYTHONIOENCODING=encoding, COLUMNS="60")
    got = subprocess.run(cmd, capture_output=True, timeout=120, env=env)
    err = got.stderr.decode(encoding, "replace")
    assert got.returncode in (0, 3), err
    assert "Traceback" not in err
    assert escape in (got.stdout + got.stderr).decode(encoding)


def test_columns_zero_is_ignored() -> None:
    got = _run(["rules"], stdout=subprocess.PIPE, env=_env(COLUMNS="0"))
    assert got.returncode == 0 and " rules" in got.stdout.splitlines()[0]


@pytest.mark.parametrize(
    ("args", "code"),
    [(["validate", "/nonexistent"], 3), (["rules", "--format", "bogus"], 2), (["validate", R7], 0)],
)
def test_a_stderr_reader_that_has_gone_keeps_the_exit_code_and_stdout(
    args: list[str], code: int, tmp_path: Path
) -> None:
    r, w = os.pipe()
    os.close(r)
    out = tmp_path / "out"
    try:
        with open(out, "w") as fh:
            got = subprocess.run(
                [sys.executable, "-m", "exl3tool", *args], stdout=fh, stderr=w, env=_env(),
                timeout=120,
            )  # fmt: skip
    finally:
        os.close(w)
    assert got.returncode == code
    assert (out.stat().st_size > 0) is (code == 0)


def test_columns_of_zero_spelled_otherwise_is_ignored_too() -> None:
    got = _run(["rules"], stdout=subprocess.PIPE, env=_env(COLUMNS="00"))
    assert got.returncode == 0 and " rules" in got.stdout.splitlines()[0]
