"""A plain `exl3tool identity` or `validate` line runs without typer (cli/plain.py) and gives the same
stdout, stderr, exit code and written files as typer's parse of the same line; anything else
goes through typer."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from exl3tool.cli.plain import _identity_args, _validate_args, plain_command
from exl3tool.synth.msrt import build_base

ROOT = Path(__file__).resolve().parents[2]

# `typer` mode makes plain_command decline every line, which is the entry point without it
PROBE = """
import atexit, sys
mode, *args = sys.argv[1:]
sys.argv = ["exl3tool", *args]
if mode == "typer":
    import exl3tool.cli.plain as plain
    plain.plain_command = lambda argv: None
atexit.register(lambda: sys.stderr.write("\\nPARSER " + ("typer" if "typer" in sys.modules
                                                     else "plain") + "\\n"))
from exl3tool.cli import entry
entry()
"""


def _env() -> dict[str, str]:
    """A bare environment (no locale: the child writes UTF-8), with what a Python that is not
    the system's needs to start (its libpython's folder)."""
    env = {"PYTHONPATH": str(ROOT), "EXL3TOOL_NO_PROGRESS": "1", "PATH": "/usr/bin:/bin"}
    if "LD_LIBRARY_PATH" in os.environ:
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    return env


def _run(mode: str, args: list[str], cwd: Path) -> tuple[int, str, str, str, dict[str, bytes]]:
    """(exit code, stdout, stderr, parser used, files in cwd afterwards)."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode, *args],
        capture_output=True,
        encoding="utf-8",  # what the child writes, whatever this process's locale
        errors="surrogateescape",
        env=_env(),
        cwd=cwd,
        timeout=120,
    )
    err, _, parser = out.stderr.rpartition("\nPARSER ")
    files = {p.name: _untimed(p.read_bytes()) for p in sorted(cwd.iterdir()) if p.is_file()}
    return out.returncode, _untimed(out.stdout), err, parser.strip(), files


def _untimed(text):
    """A report with its measured durations (JSON "seconds", JUnit time="…") blanked."""
    if isinstance(text, bytes):
        return _untimed(text.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
    text = re.sub(r'"seconds": [0-9.e+-]+', '"seconds": _', text)
    return re.sub(r'time="[0-9.e+-]+"', 'time="_"', text)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_base(tmp_path_factory.mktemp("b") / "base", layers=(3, 4), experts=2)


@pytest.fixture(scope="module")
def record(base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    rec = tmp_path_factory.mktemp("r") / "rec.json"
    subprocess.run(
        [sys.executable, "-m", "exl3tool", "identity", str(base), "-o", str(rec)],
        check=True,
        cwd=ROOT,
        env=_env(),
    )
    doc = json.loads(rec.read_text())
    bad = rec.with_name("bad.json")
    name = next(iter(doc["tensors"]))
    doc["tensors"][name] = "0" * 64
    bad.write_text(json.dumps(doc))
    return rec


PLAIN = [
    ["identity", "{base}"],
    ["identity", "{base}", "--no-compat", "--threads", "1"],
    ["identity", "--algo", "sha256", "{base}", "-f", "json"],
    ["identity", "{base}", "--algo", "blake3", "--compat", "--layers", "3"],
    ["identity", "{base}", "--layers", "4,other", "--format", "text", "--threads", "3"],
    ["identity", "{base}", "--layers", "nine"],  # a usage error of the action: exit 2
    ["identity", "{base}", "-f", "sarif"],  # sarif needs --check: exit 2
    ["identity", "{base}", "-o", "out.json"],
    ["identity", "{base}", "-o", "out.txt", "--no-compat"],
    ["identity", "{base}", "-o", "existing.json"],  # refused without --force: exit 1
    ["identity", "{base}", "-o", "existing.json", "--force"],
    ["identity", "{base}", "--sha256sum", "files.sha256"],
    ["identity", "{base}", "--sha256sum", "existing.json"],
    ["identity", "{base}", "--check", "{rec}"],
    ["identity", "{base}", "--check", "{rec}", "-f", "json"],
    ["identity", "{base}", "--check", "{bad}"],
    ["identity", "{base}", "--check", "{bad}", "-f", "sarif", "-o", "r.sarif"],
    ["identity", "{base}", "--check", "missing.json"],
    ["identity", "missing-dir"],  # unreadable input: exit 3
    ["identity", "garbage.safetensors"],  # a broken container
    ["identity", "{base}/config.json"],
    ["validate", "{base}"],
    ["validate", "{base}", "--no-hash", "-f", "json"],
    ["validate", "{base}", "{base}/config.json", "--strict", "--threads", "1"],
    ["validate", "--hash", "{base}", "-q"],
    ["validate", "{base}", "--tp", "2", "--runtime", "cartridge", "--format", "sarif"],
    ["validate", "{base}", "--tp", "3", "-f", "junit"],
    ["validate", "{base}", "--base", "{base}"],
    ["validate", "{base}", "-o", "out.json", "-f", "json"],
    ["validate", "{base}", "-o", "existing.json"],  # refused without --force
    ["validate", "{base}", "-o", "existing.json", "--force", "--quiet"],
    ["validate", "missing-dir"],  # unreadable input: exit 3
    ["validate", "garbage.safetensors", "{base}"],  # a broken container among good ones
]
TYPER = [
    ["identity"],
    ["identity", "-h"],
    ["identity", "{base}", "--help"],
    ["identity", "{base}", "--threads", "0"],
    ["identity", "{base}", "--threads=2"],
    ["identity", "{base}", "--threads", "two"],
    ["identity", "{base}", "--threads", "+2"],
    ["identity", "{base}", "--algo", "md5"],
    ["identity", "{base}", "-f", "yaml"],
    ["identity", "{base}", "{base}"],
    ["identity", "{base}", "--frobnicate"],
    ["identity", "{base}", "--threads", "1", "--threads", "2"],
    ["identity", "{base}", "--compat", "--no-compat"],
    ["identity", "{base}", "-o"],
    ["identity", "--", "{base}"],
    ["identity", "{base}", "-o", "-"],
    ["--version"],
    ["validate"],
    ["validate", "--help"],
    ["validate", "{base}", "--select", "ST"],
    ["validate", "{base}", "--ignore", "R7030"],
    ["validate", "{base}", "--tp", "zero"],
    ["validate", "{base}", "--tp", "0"],
    ["validate", "{base}", "--tp=2"],
    ["validate", "{base}", "--runtime", "private"],
    ["validate", "{base}", "--strict", "--strict"],
    ["validate", "{base}", "--hash", "--no-hash"],
    ["validate", "{base}", "-f", "yaml"],
    ["validate", "--", "{base}"],
    ["validate", "{base}", "--base"],
]


def _args(line: list[str], base: Path, rec: Path) -> list[str]:
    return [w.format(base=base, rec=rec, bad=rec.with_name("bad.json")) for w in line]


def _fresh(tmp_path: Path, name: str) -> Path:
    cwd = tmp_path / name
    cwd.mkdir()
    (cwd / "existing.json").write_text("{}\n")
    (cwd / "garbage.safetensors").write_bytes(b"\xff" * 64)
    return cwd


@pytest.mark.parametrize("line", PLAIN + TYPER, ids=" ".join)
def test_same_outputs_files_and_exit_code_as_typer(
    line: list[str], base: Path, record: Path, tmp_path: Path
) -> None:
    args = _args(line, base, record)
    code, out, err, parser, files = _run("plain", args, _fresh(tmp_path, "plain"))
    want = _run("typer", args, _fresh(tmp_path, "typer"))
    assert (code, out, err, files) == (*want[:3], want[4])
    assert want[3] == "typer"
    assert parser == ("plain" if line in PLAIN else "typer")


def test_an_unreadable_path_value_goes_through_typer(tmp_path: Path) -> None:
    rec = tmp_path / "rec.json"
    rec.write_text("{}")
    rec.chmod(0)
    kwargs = _identity_args(["x", "--check", str(rec)])
    # typer: "Path '...' is not readable." (exit 2); root reads anything, and typer agrees
    assert (kwargs is not None) == os.access(rec, os.R_OK)


def test_only_identity_and_validate_lines_are_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    assert plain_command(["slice", "x"]) is None
    assert plain_command(["validate", "x"]) is not None
    monkeypatch.setenv("_EXL3TOOL_COMPLETE", "bash_complete")  # click answers completion
    assert plain_command(["identity", "x"]) is None
    assert plain_command(["validate", "x"]) is None
    monkeypatch.delenv("_EXL3TOOL_COMPLETE")
    assert plain_command(["identity"]) is None
    assert plain_command(["validate"]) is None
    assert _identity_args(["x", "--no-compat", "--threads", "12", "-o", "o.json"]) == {
        "path": "x",
        "compat": False,
        "threads": 12,
        "output": Path("o.json"),
    }
    assert _validate_args(["a", "--no-hash", "b", "-q", "--tp", "4"]) == {
        "paths": ["a", "b"],
        "hash_": False,
        "quiet": True,
        "tp": 4,
    }
    assert _identity_args(["a", "b"]) is None  # identity takes one PATH
