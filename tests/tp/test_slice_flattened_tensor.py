"""A tensor stored with fewer axes than its field's cut, its span matching its shape (so the
container checks pass it): `exl3tool slice` reports TP009 and exits 1, with no traceback and
nothing written (the plan used to index the missing axis: an IndexError and a traceback)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file


def _with_shape(src: Path, dst: Path, name: str, shape: tuple[int, ...]) -> Path:
    """A copy of `src` whose tensor `name` holds as many elements in `shape`."""
    shutil.copytree(src, dst)
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    shard = dst / index["weight_map"][name]
    tensors = load_file(str(shard))
    tensors[name] = tensors[name].reshape(shape) if shape else np.zeros((), tensors[name].dtype)
    save_file(tensors, str(shard))
    return dst


@pytest.mark.parametrize(
    ("name", "flatten"),
    [
        ("model.layers.1.mlp.experts.1.gate_proj.trellis", True),
        ("model.layers.1.mlp.experts.1.up_proj.svh", False),
    ],
)
def test_slice_reports_a_tensor_without_the_cut_axis(
    sources: dict[str, Path], tmp_path: Path, name: str, flatten: bool
) -> None:
    shape = load_file(str(next(sources["r7"].glob("r7-experts-layer-001.safetensors"))))[name].shape
    src = _with_shape(
        sources["r7"], tmp_path / "src", name, (int(np.prod(shape)),) if flatten else ()
    )
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "exl3tool", "slice", str(src), "--tp", "2", "-o", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    text = run.stdout + run.stderr
    assert run.returncode == 1, text
    assert "Traceback" not in text
    assert "TP009" in text and name in text and "is past the last axis of shape" in text
    assert not out.exists() and list(tmp_path.iterdir()) == [src]  # nothing written, no temp
