"""The synthetic plain EXL3 builder: tensor_storage, markers of all three codebooks, sharding."""

from __future__ import annotations

import json
from pathlib import Path

from exl3tool.formats.detect import Kind, detect
from exl3tool.synth.exl3 import build_exl3


def test_plain_exl3_layout(tmp_path: Path) -> None:
    root = build_exl3(tmp_path / "e", shards=3, seed=1)
    assert detect(root) is Kind.EXL3
    idx = json.loads((root / "model.safetensors.index.json").read_text())
    assert len(set(idx["weight_map"].values())) == 3
    ts = json.loads((root / "quantization_config.json").read_text())["tensor_storage"]
    exl3 = {p: r for p, r in ts.items() if r.get("quant_format") == "exl3"}
    assert {"mcg_multiplier", "mul1_multiplier"} <= {k for r in exl3.values() for k in r}
    assert any(not ({"mcg_multiplier", "mul1_multiplier"} & r.keys()) for r in exl3.values())
    assert "model.layers.1.mlp.experts.3.down_proj" in exl3


def test_single_file_and_determinism(tmp_path: Path) -> None:
    a = build_exl3(tmp_path / "a", codebook="mul1", k_values=(2.5, 4))
    b = build_exl3(tmp_path / "b", codebook="mul1", k_values=(2.5, 4))
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert not (a / "model.safetensors.index.json").exists()
