"""Counts, sizes and names a hostile user passes are bounded before any work: a usage error
(exit 2) or a finding, never a traceback, a thread storm or a memory blow-up."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from exl3tool.cli.main import app

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BASE, R7 = EXAMPLES / "msrt-base-tiny", EXAMPLES / "r7-tiny"
ENV = {"NO_COLOR": "1", "GITHUB_ACTIONS": None}
HUGE = "9" * 400


def run(*args: object):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, [str(a) for a in args], env=ENV)


def _shard(path: Path, header: dict, payload: bytes) -> Path:
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + payload)
    return path


@pytest.mark.parametrize(
    "args",
    [
        ("plan", BASE, "--tp", 100_000_000),
        ("validate", BASE, "--tp", 2000),
        ("slice", BASE, "--tp", 2, "--dry-run", "--threads", 100_000),
        ("identity", BASE, "--threads", 5000),
        ("diff", BASE, BASE, "--threads", 1025),
        ("slice", BASE, "--tp", 2, "--dry-run", "--max-shard-size", HUGE),
        ("plan", R7, "--gpu-memory", HUGE + "GiB"),
        ("identity", BASE, "--layers", "0-4000000000"),
    ],
    ids=[
        "plan-tp",
        "validate-tp",
        "slice-threads",
        "identity-threads",
        "diff-threads",
        "shard-size",
        "gpu-memory",
        "layers",
    ],
)
def test_a_count_beyond_any_machine_is_a_usage_error(args: tuple) -> None:
    r = run(*args)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output


def test_a_shape_whose_size_no_float_holds_is_st013(tmp_path: Path) -> None:
    shard = _shard(
        tmp_path / "m.safetensors",
        {"w": {"dtype": "F32", "shape": [2**48 - 1] * 30, "data_offsets": [0, 4]}},
        bytes(4),
    )
    for cmd in ("validate", "identity", "inspect"):
        r = run(cmd, shard)
        assert r.exit_code == 1 and "ST013" in r.output and "Traceback" not in r.output, r.output


def test_a_record_with_escaped_names_reads_back(tmp_path: Path) -> None:
    shard = _shard(
        tmp_path / "m.safetensors",
        {"café.weight": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}},
        bytes(4),
    )
    rec = tmp_path / "rec.json"
    assert run("identity", shard, "-o", rec).exit_code == 0
    assert "\\u00e9" in rec.read_text()  # written with an escape: the strict parser reads it
    assert run("identity", shard, "--check", rec).exit_code == 0
    assert run("diff", rec, shard).exit_code == 0


def test_a_hostile_selection_in_a_record_is_a_finding(tmp_path: Path) -> None:
    rec = tmp_path / "rec.json"
    assert run("identity", BASE, "-o", rec).exit_code == 0
    doc = json.loads(rec.read_text())
    doc["selection"] = "0-4000000000"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    r = run("diff", rec, bad)
    assert r.exit_code in (1, 3) and "Traceback" not in r.output, r.output


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux /proc")
def test_a_document_that_fails_to_read_is_js009(tmp_path: Path) -> None:
    import shutil

    root = Path(shutil.copytree(BASE, tmp_path / "b"))
    (root / "model.safetensors.index.json").unlink()
    os.symlink("/proc/self/mem", root / "model.safetensors.index.json")
    r = run("validate", root)
    assert r.exit_code == 1 and "JS009" in r.output and "099" not in r.output, r.output


def test_a_failed_record_takes_its_manifest_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`identity --sha256sum F -o R`: when R cannot be written (a full disk), F is not left
    published alone."""
    import errno

    from exl3tool.report import render

    def full(*_a: object, **_k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(render, "write_output", full)
    sums, rec = tmp_path / "SHA256SUMS", tmp_path / "rec.json"
    r = run("identity", BASE, "--sha256sum", sums, "-o", rec)
    assert r.exit_code != 0
    assert not sums.exists() and not rec.exists()


def test_a_closed_stdout_keeps_the_manifest(tmp_path: Path) -> None:
    """Only a failed -o takes the manifest back: a reader that stops early (`| head`) leaves
    the --sha256sum file that was asked for."""
    import subprocess
    import sys

    sums = tmp_path / "SHA256SUMS"
    proc = subprocess.Popen(
        [sys.executable, "-m", "exl3tool", "identity", str(BASE), "--sha256sum", str(sums)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    proc.stdout.close()  # the reader is gone before anything is printed
    assert proc.wait(timeout=60) == 141
    assert sums.is_file() and sums.read_text().count("\n") > 3
