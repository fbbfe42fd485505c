"""The runtime reads a layer's router as fp16 [experts, hidden], whatever float dtype it is
stored in, and refuses any other shape with the rule MB019 (never a torch traceback)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from exl3tool.formats.checkpoint import load_checkpoint
from exl3tool.io.st_writer import SafetensorsStreamWriter, TensorSpec
from exl3tool.io.views import TensorReader
from exl3tool.rules.errors import InputError
from exl3tool.rules.registry import Findings
from exl3tool.runtime.base import router_weight

NAME = "model.layers.1.mlp.gate.weight"


def _router_file(tmp_path: Path, dtype: str, shape: tuple[int, ...], payload: bytes) -> Path:
    path = tmp_path / "r.safetensors"
    with open(path, "wb") as fh:
        w = SafetensorsStreamWriter(fh, [TensorSpec(NAME, dtype, shape)])
        w.write(payload)
        w.close()
    return path


def _load(path: Path, experts: int, hidden: int) -> torch.Tensor:
    ckpt = load_checkpoint(path, Findings(), need_config=False)
    with TensorReader() as rd:
        return router_weight(rd, ckpt.tensors[NAME], path, experts, hidden)


@pytest.mark.parametrize("dtype", ["F16", "BF16", "F32"])
def test_float_routers_become_the_same_fp16(tmp_path: Path, dtype: str) -> None:
    want = torch.from_numpy(np.random.default_rng(3).standard_normal((4, 8), np.float32))
    want = want.to(torch.bfloat16).to(torch.float32)  # exactly representable in all three
    stored = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}[dtype]
    raw = want.to(stored).contiguous().view(torch.uint8).numpy().tobytes()
    got = _load(_router_file(tmp_path, dtype, (4, 8), raw), 4, 8)
    assert got.dtype == torch.float16 and torch.equal(got, want.to(torch.float16))


@pytest.mark.parametrize(
    ("dtype", "shape"), [("F16", (4, 2, 4)), ("F16", (3, 8)), ("F16", (4, 9)), ("I16", (4, 8))]
)
def test_other_routers_are_refused(tmp_path: Path, dtype: str, shape: tuple[int, ...]) -> None:
    n = int(np.prod(shape)) * 2
    with pytest.raises(InputError, match="MB019"):
        _load(_router_file(tmp_path, dtype, shape, bytes(n)), 4, 8)
