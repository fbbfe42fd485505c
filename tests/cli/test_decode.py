"""`exl3tool decode`: a tiny EXL3 linear to fp16 safetensors, and the DC rules."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from typer.testing import CliRunner

from exl3tool.cli.main import app

PREFIX = "model.layers.0.mlp.down_proj"
# docs/formats/exl3.md §12.3 (128 x 256, K = 3, MCG)
W_ROT = "2a86716b9c0413128e424c552339a08a2ebbccb771dc585001fb7558d81ccd97"
W_EFF = "336c5d73c4d371568e9560506d68842940f389daff2298db7f22e428957f7102"


def _linear(words: int = 48, marker: str | None = "mcg") -> dict[str, np.ndarray]:
    count = 8 * 16 * words
    u = ((np.arange(count, dtype=np.int64) + 1) * 0x1357) % 65536
    r, c = np.arange(128), np.arange(256)
    t = {
        f"{PREFIX}.trellis": u.astype(np.uint16).view(np.int16).reshape(8, 16, words),
        f"{PREFIX}.suh": ((1 + r / 256) * np.where(r % 2 == 1, -1.0, 1.0)).astype(np.float16),
        f"{PREFIX}.svh": (0.5 + c / 512).astype(np.float16),
    }
    if marker == "mcg":
        t[f"{PREFIX}.mcg"] = np.array(-877912083, dtype=np.int32)
    elif marker == "mul1":
        t[f"{PREFIX}.mul1"] = np.array(-2082680531, dtype=np.int32)
    return t


def _sha_t(a: np.ndarray) -> str:
    """sha256 of the [k, n] matrix whose transpose `a` is."""
    return hashlib.sha256(np.ascontiguousarray(a.T).tobytes()).hexdigest()


def _run(*args: str):
    return CliRunner().invoke(app, ["decode", *args])


@pytest.mark.parametrize("as_dir", [False, True])
def test_decode_effective_and_rotated(tmp_path, as_dir):
    src = tmp_path / "ckpt"
    src.mkdir()
    save_file(_linear(), str(src / "model.safetensors"))
    path = str(src if as_dir else src / "model.safetensors")
    out = tmp_path / "w.safetensors"
    res = _run(path, "--tensor", PREFIX, "-o", str(out))
    assert res.exit_code == 0, res.output
    w = load_file(str(out))[f"{PREFIX}.weight"]
    assert w.dtype == np.float16 and w.shape == (256, 128)  # [out, in]
    assert _sha_t(w) == W_EFF
    out_r = tmp_path / "r.safetensors"
    res = _run(path, "--tensor", PREFIX + ".trellis", "--rotated", "-o", str(out_r))
    assert res.exit_code == 0, res.output
    wr = load_file(str(out_r))[f"{PREFIX}.weight_rotated"]
    assert wr.shape == (256, 128) and _sha_t(wr) == W_ROT
    assert _run(path, "--tensor", PREFIX, "-o", str(out)).exit_code != 0  # exists, no --force
    assert _run(path, "--tensor", PREFIX, "-o", str(out), "--force").exit_code == 0


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (lambda t: t.pop(f"{PREFIX}.svh"), "DC001"),
        (lambda t: t.update({f"{PREFIX}.suh": np.zeros(64, np.float16)}), "DC002"),
        (lambda t: t.update({f"{PREFIX}.trellis": np.zeros((8, 16, 40), np.int16)}), "DC003"),
        (lambda t: t.update({f"{PREFIX}.trellis": np.zeros((8, 16, 20), np.int16)}), "DC003"),
        (lambda t: t.update({f"{PREFIX}.mul1": np.array(-2082680531, np.int32)}), "DC003"),
    ],
)
def test_decode_bad_input(tmp_path, mutate, code):
    tensors = _linear()
    mutate(tensors)
    src = tmp_path / "model.safetensors"
    save_file(tensors, str(src))
    out = tmp_path / "w.safetensors"
    res = _run(str(src), "--tensor", PREFIX, "-o", str(out))
    assert res.exit_code == 1, res.output
    assert code in res.output
    assert not out.exists()


def test_decode_rules_registered():
    from exl3tool.rules.registry import all_rules

    codes = {r.code for r in all_rules()}
    assert {"DC001", "DC002", "DC003", "DC004"} <= codes
