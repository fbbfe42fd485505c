"""`org/name[@revision]` where the other suites do not reach: decode and verify-swap read a
Hugging Face cache snapshot (relative links into blobs/) exactly like the plain copy."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from safetensors.numpy import load_file
from typer.testing import CliRunner

from exl3tool.cli.main import app

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
COMMIT = "0f" * 20
LINEAR = "model.layers.3.mlp.experts.0.down_proj.rank0"


def _store(src: Path, hub: Path, repo_id: str) -> None:
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        blob.write_bytes(f.read_bytes())
        link = repo / "snapshots" / COMMIT / f.relative_to(src)
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    hub = tmp_path_factory.mktemp("hub")
    for name in ("r7-tiny", "msrt-base-tiny", "cartridge-k3k4"):
        _store(EXAMPLES / name, hub, f"org/{name}")
    return hub


def run(hub: Path, *args: object):  # type: ignore[no-untyped-def]
    env = {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "GITHUB_ACTIONS": None}
    return CliRunner().invoke(app, [str(a) for a in args], env=env)


def test_decode_from_the_cache_equals_the_plain_copy(hub: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    a, b = tmp_path / "cache.safetensors", tmp_path / "plain.safetensors"
    assert run(hub, "decode", "org/msrt-base-tiny@main", "--tensor", LINEAR, "-o", a).exit_code == 0
    assert (
        run(hub, "decode", EXAMPLES / "msrt-base-tiny", "--tensor", LINEAR, "-o", b).exit_code == 0
    )
    wa, wb = load_file(str(a)), load_file(str(b))
    assert wa.keys() == wb.keys() == {f"{LINEAR}.weight"}
    assert wa[f"{LINEAR}.weight"].tobytes() == wb[f"{LINEAR}.weight"].tobytes()


def test_verify_swap_reads_base_and_cartridge_from_the_cache(hub: Path) -> None:
    pytest.importorskip("torch")
    res = run(hub, "verify-swap", "org/msrt-base-tiny", "org/cartridge-k3k4", "--threads", "1")
    assert res.exit_code == 0, res.output
    assert "all checks passed" in res.stdout


@pytest.mark.parametrize("command", ["decode", "verify-swap"])
def test_not_cached_exits_3_with_the_fetch_hint(hub: Path, command: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    args = {
        "decode": ["decode", "org/absent", "--tensor", LINEAR, "-o", tmp_path / "w.safetensors"],
        "verify-swap": ["verify-swap", "org/absent", "org/cartridge-k3k4"],
    }[command]
    res = run(hub, *args)
    assert res.exit_code == 3
    assert "org/absent" in res.stderr and "hf download" in res.stderr
    assert "Traceback" not in res.output
