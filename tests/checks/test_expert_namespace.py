"""conformance.check_expert_namespace (CK030) finds what a regex parse of every name finds."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from exl3tool.checks.conformance import EXPERT_FIELDS, check_expert_namespace
from exl3tool.formats.checkpoint import Checkpoint, TensorRef
from exl3tool.formats.names import parse_expert
from exl3tool.io.safetensors import FileStamp, SafetensorsFile, TensorInfo
from exl3tool.rules.registry import Findings

_FIELDS = ["trellis", "suh", "svh", "su", "sv", "mcg", "mul1", "bias", "scale", "weight",
           "trellis\n", "x", "gate_up_suh"]  # fmt: skip


def _reference(ckpt: Checkpoint) -> list[str]:
    """The names CK030 refuses, by parse_expert of every name (the check before its fast path)."""
    claimed = {
        en.layer
        for n in ckpt.tensors
        if n.endswith(".trellis") and (en := parse_expert(n)) is not None
    }
    bad = []
    for name in ckpt.tensors:
        en = parse_expert(name) if ".mlp.experts." in name else None
        if en is None or en.layer not in claimed:
            continue
        if en.field not in EXPERT_FIELDS:
            bad.append(name)
    return bad


def _checkpoint(seed: int) -> Checkpoint:
    r = random.Random(seed)
    stamp = FileStamp(0, 0, 0, 0, 0)
    st = SafetensorsFile(Path("m.safetensors"), "m.safetensors", 0, 0, stamp)
    ckpt = Checkpoint(root=Path("."))
    for _ in range(r.randrange(1, 60)):
        layer = r.choice(["1", "2", "02"])
        who = r.choice(["0", "7", "r7_shared", "07"])
        proj = r.choice(["gate_proj", "down_proj", "o_proj"])
        rank = r.choice(["", "", ".rank0", ".rank1"])
        name = f"model.layers.{layer}.mlp.experts.{who}.{proj}{rank}.{r.choice(_FIELDS)}"
        ckpt.tensors[name] = TensorRef(st, TensorInfo(name, "F16", (1,), 0, 2))
    return ckpt


@pytest.mark.parametrize("seed", range(80))
def test_expert_namespace_equals_a_parse_of_every_name(seed: int) -> None:
    ckpt = _checkpoint(seed)
    findings = Findings()
    check_expert_namespace(ckpt, findings)
    want = _reference(ckpt)
    named = [f.location.tensor for f in findings][: len(want)]
    assert named == want[:20]
    assert len(findings) == min(len(want), 21)
