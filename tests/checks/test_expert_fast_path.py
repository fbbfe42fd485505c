"""The expert checks' inline path for a usual projection gives what `_check_projection` gives:
the same findings in the same order, and the same deferred reads, for every R7 defect case."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from checks_fixtures import copy, move_tensor
from test_rules import CASES, E0, L1, L2, _id, drop, f16, put, trellis

import exl3tool.checks.r7_experts as rx
from exl3tool.actions.validate import validate_path
from exl3tool.checks.options import ValidateOptions
from exl3tool.checks.rows import rows
from exl3tool.formats.names import PROJECTIONS


def _reference_layer(ctx: rx.ExpertsContext, layer: int, payload: rx.R7Payload) -> None:
    """`_check_layer` with every projection through `_check_projection`."""
    label = rx.layer_shard(layer)
    rx._check_shard_meta(ctx.shards.get(label), layer, ctx.findings)
    missing: list[str] = []
    for e in range(ctx.n_experts):
        head = f"model.layers.{layer}.mlp.experts.{e}."
        for proj in PROJECTIONS:
            parts = ctx.table.plain.get((layer, e, proj))
            if parts is None:
                missing.append(f"{head}{proj}.trellis")
                continue
            slot = rx.Slot(layer, e, proj, label, head + proj)
            rx._check_projection(ctx, slot, parts, missing, payload)
    rx._report_missing(ctx.findings, missing, layer, label)
    rx._check_shared_vectors(ctx, layer, label)
    rx._report_tier(ctx.findings, payload, layer, label)


MCG = np.array(-877912083, dtype="<i4")
EXTRA = [
    ("mcg-elsewhere", lambda r: move_tensor(r, f"{E0}.up_proj.mcg", L1, L2)),
    ("vector-elsewhere", lambda r: move_tensor(r, f"{E0}.down_proj.suh", L1, L2)),
    (
        "vector-f32-elsewhere",
        lambda r: (
            put(f"{E0}.gate_proj.svh", "F32", np.zeros(128, dtype="<f4"))(r),
            move_tensor(r, f"{E0}.gate_proj.svh", L1, L2),
        ),
    ),
    ("mul1", put(f"{E0}.up_proj.mul1", "I32", MCG)),
    ("mcg-shape", put(f"{E0}.up_proj.mcg", "I32", np.array([-877912083], dtype="<i4"))),
    ("mcg-dtype", put(f"{E0}.down_proj.mcg", "F32", np.array(1.0, dtype="<f4"))),
    ("trellis-2d", put(f"{E0}.up_proj.trellis", "I16", np.zeros((8, 64), dtype="<i2"))),
    ("trellis-dtype", put(f"{E0}.up_proj.trellis", "I32", np.zeros((8, 8, 64), dtype="<i4"))),
    (
        "trellis-shard",
        put("model.layers.1.mlp.experts.1.gate_proj.trellis", "I16", trellis(8, 8, 64), L2),
    ),
    ("down-svh", put(f"{E0}.down_proj.svh", "F16", f16(128))),
    ("vector-dtype", put(f"{E0}.gate_proj.svh", "F32", np.zeros(128, dtype="<f4"))),
    ("no-vector", drop(f"{E0}.down_proj.suh")),
    (
        "no-mcg-no-trellis",
        lambda r: (drop(f"{E0}.up_proj.mcg")(r), drop(f"{E0}.up_proj.trellis")(r)),
    ),
    (
        "trellis-in-l1",
        put("model.layers.2.mlp.experts.0.up_proj.trellis", "I16", trellis(8, 8, 64), L1),
    ),
]
R7_CASES = [(_id(c), c.mutate, c.options) for c in CASES if c.artifact == "r7"]
ALL = (
    R7_CASES + [(i, m, ValidateOptions()) for i, m in EXTRA] + [("valid", None, ValidateOptions())]
)


@pytest.mark.parametrize(("name", "mutate", "options"), ALL, ids=[a[0] for a in ALL])
def test_inline_path_equals_reference(
    pristine: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    mutate: object,
    options: ValidateOptions,
) -> None:
    root = copy(pristine["r7"], tmp_path / "ckpt")
    if mutate is not None:
        mutate(root)  # type: ignore[operator]
    ref_new, new = validate_path(root, options)
    monkeypatch.setattr(rx, "_check_layer", _reference_layer)
    ref_old, old = validate_path(root, options)
    assert rows(new) == rows(old)
    timing = ("seconds",)
    assert {k: v for k, v in ref_new.extra.items() if k not in timing} == {
        k: v for k, v in ref_old.extra.items() if k not in timing
    }
