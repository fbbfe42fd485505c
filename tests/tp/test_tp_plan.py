"""The pure plan: per-role field cuts, modes, reporting, refusals; and `slice_linear`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tp_fixtures as fx
from hypothesis import given, settings
from hypothesis import strategies as st

from exl3tool.formats.detect import Kind, detect
from exl3tool.formats.names import R7_SHARED_RE
from exl3tool.rules import tp as tp_rules
from exl3tool.tp.linear import slice_linear
from exl3tool.tp.plan import _Planner, attention_geometry, plan_slices, source_order
from exl3tool.tp.slices import PlanRefused, TensorSlice, new_slice


def _cuts(plan, name: str) -> list[tuple]:
    return [
        (r.rank, s.axis, s.start, s.stop, s.replicated)
        for r in plan.ranks
        for s in r.slices
        if s.source == name
    ]


def test_r7_tensor_mode_cuts(sources: dict[str, Path]) -> None:
    ckpt = fx.load(sources["r7"])
    plan = plan_slices(ckpt, Kind.R7, 2)
    e = "model.layers.1.mlp.experts.0"
    tiles = fx.INTER // 16
    assert _cuts(plan, f"{e}.gate_proj.trellis") == [
        (0, 1, 0, tiles // 2, False), (1, 1, tiles // 2, tiles, False)
    ]  # fmt: skip
    assert _cuts(plan, f"{e}.up_proj.svh") == [(0, 0, 0, 512, False), (1, 0, 512, 1024, False)]
    assert _cuts(plan, f"{e}.down_proj.trellis") == [
        (0, 0, 0, tiles // 2, False), (1, 0, tiles // 2, tiles, False)
    ]  # fmt: skip
    assert _cuts(plan, f"{e}.down_proj.suh") == [(0, 0, 0, 512, False), (1, 0, 512, 1024, False)]
    for name in (f"{e}.gate_proj.mcg", "model.layers.1.mlp.experts.r7_shared.gate_up_suh",
                 "model.layers.1.mlp.experts.r7_shared.down_svh"):  # fmt: skip
        assert _cuts(plan, name) == [(0, None, 0, 0, True), (1, None, 0, 0, True)]
    # each rank lists every source tensor once (per-rank layout, tensor mode)
    assert all(len(r.slices) == len(ckpt.tensors) for r in plan.ranks)
    assert plan.source_order == sorted(
        plan.source_order, key=lambda n: (ckpt.tensors[n].file, ckpt.tensors[n].info.begin)
    )


def test_expert_mode_whole_experts_contiguous(sources: dict[str, Path]) -> None:
    ckpt = fx.load(sources["base"])
    plan = plan_slices(ckpt, Kind.MSRT_BASE, 4, "expert")
    for r, rp in enumerate(plan.ranks):
        experts = {s.source.split(".")[5] for s in rp.slices if ".experts." in s.source}
        assert experts == {str(r)}
        assert all(s.axis is None for s in rp.slices)
    with pytest.raises(PlanRefused) as exc:
        plan_slices(ckpt, Kind.MSRT_BASE, 8, "expert")
    assert exc.value.findings.codes() == {"TP002"}


def test_dense_roles_attention_and_bias(sources: dict[str, Path]) -> None:
    ckpt = fx.load(sources["exl3"])
    assert attention_geometry(ckpt.config) == (8, 128)
    plan = plan_slices(ckpt, Kind.EXL3, 4)
    a = "model.layers.0.self_attn"
    quarters = [(0, 256), (256, 512), (512, 768), (768, 1024)]
    for proj in ("q_proj", "k_proj", "v_proj"):
        assert [c[1:4] for c in _cuts(plan, f"{a}.{proj}.svh")] == [(0, *q) for q in quarters]
        assert [c[1:4] for c in _cuts(plan, f"{a}.{proj}.trellis")] == [
            (1, x // 16, y // 16) for x, y in quarters
        ]
    assert [c[1:4] for c in _cuts(plan, f"{a}.o_proj.suh")] == [(0, *q) for q in quarters]
    assert [c[1:4] for c in _cuts(plan, f"{a}.o_proj.trellis")] == [
        (0, x // 16, y // 16) for x, y in quarters
    ]
    assert _cuts(plan, f"{a}.o_proj.svh")[0][1:] == (None, 0, 0, True)
    assert [c[1:4] for c in _cuts(plan, "model.layers.0.mlp.down_proj.suh")][1] == (0, 256, 512)
    assert [c[1:4] for c in _cuts(plan, "model.layers.0.mlp.gate_proj.svh")][3] == (0, 768, 1024)
    assert {r.tensor for r in plan.reported} >= {"lm_head.weight"}
    assert plan.findings().codes() == {"TP003"}


def test_attention_without_geometry_is_replicated_and_reported(tmp_path: Path) -> None:
    p = fx.build_exl3(tmp_path / "x", moe_intermediate=256)
    plan = plan_slices(fx.load(p), Kind.EXL3, 2)
    reported = {r.tensor for r in plan.reported}
    assert "model.layers.0.self_attn.q_proj.trellis" in reported
    assert all(c[4] for c in _cuts(plan, "model.layers.0.self_attn.q_proj.trellis"))


def test_refusals_are_findings_naming_tensor_and_sizes(sources: dict[str, Path]) -> None:
    ckpt = fx.load(sources["r7"])
    with pytest.raises(PlanRefused) as exc:
        plan_slices(ckpt, Kind.R7, 16)
    (f,) = [x for x in exc.value.findings if x.code == "TP001"]
    assert "1024 over 16 ranks gives 64" in f.message and f.location.tensor.endswith(".trellis")
    assert f.rule is tp_rules.TP_CUTS_HADAMARD


def test_rank_sliced_inputs_and_mixed_k_are_refused(sources: dict[str, Path]) -> None:
    ckpt = fx.load(sources["r7-mixed"])
    with pytest.raises(PlanRefused) as exc:
        plan_slices(ckpt, Kind.R7, 2, layout="rank-sliced")
    assert exc.value.findings.codes() == {"TP009"}
    with pytest.raises(PlanRefused):
        plan_slices(ckpt, Kind.RANK_SLICED, 2)
    with pytest.raises(PlanRefused):
        plan_slices(ckpt, Kind.R7, 2, "expert", layout="rank-sliced")


def test_rank_sliced_names(sources: dict[str, Path]) -> None:
    plan = plan_slices(fx.load(sources["r7"]), detect(sources["r7"]), 2, layout="rank-sliced")
    names = {s.target_name for s in plan.ranks[1].slices}
    assert "model.layers.1.mlp.experts.3.down_proj.rank1.trellis" in names
    assert "model.layers.1.mlp.experts.2.up_proj.rank1.suh" in names  # from r7_shared
    assert "model.layers.3.mlp.experts.0.gate_proj.rank1.trellis" in names  # carried MTP, tp 1
    assert not any(".rank" not in n for n in names)  # non-expert tensors live on rank 0 only


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["column", "row"]), st.integers(1, 4), st.data())
def test_slice_linear_views_concatenate_to_the_linear(role: str, tiles128: int, data) -> None:
    tp = data.draw(st.sampled_from([d for d in (1, 2, 4) if tiles128 * 2 % d == 0]))
    k, n = (
        256 if role == "column" else 128 * tiles128 * 2,
        128 * tiles128 * 2 if role == "column" else 256,
    )
    rng = np.random.default_rng(tiles128)
    arrays = {
        "trellis": rng.integers(-(2**15), 2**15, (k // 16, n // 16, 32), dtype=np.int16),
        "suh": rng.standard_normal(k).astype(np.float16),
        "svh": rng.standard_normal(n).astype(np.float16),
        "bias": rng.standard_normal(n).astype(np.float16),
        "mcg": np.array(-877912083, dtype=np.int32),
    }
    size = n if role == "column" else k
    per = size // tp
    parts = [slice_linear(arrays, role, r * per, (r + 1) * per) for r in range(tp)]
    axis = 1 if role == "column" else 0
    assert np.array_equal(np.concatenate([p["trellis"] for p in parts], axis), arrays["trellis"])
    vec = "svh" if role == "column" else "suh"
    assert np.array_equal(np.concatenate([p[vec] for p in parts]), arrays[vec])
    assert all(np.shares_memory(p["trellis"], arrays["trellis"]) for p in parts)
    if role == "row":
        assert "bias" in parts[0] and all("bias" not in p for p in parts[1:])
    with pytest.raises(ValueError):
        slice_linear(arrays, role, 0, 64)


def _plan_slice_by_slice(ckpt, kind: Kind, tp: int, mode: str) -> list[list[TensorSlice]]:
    """Every rank's slices built one by one from `_cuts` and the TensorSlice constructor:
    what `build` computed before it memoized a kind's rows."""
    planner = _Planner(ckpt, kind, tp, mode, "per-rank")
    planner.classify()
    out: list[list[TensorSlice]] = [[] for _ in range(tp)]
    for name in source_order(ckpt):
        info = ckpt.tensors[name].info
        group = planner.group_of.get(name)
        cut = planner.splits.get(group[0]) if group else None
        shared = R7_SHARED_RE.match(name)
        for r in range(tp):
            for target, axis, start, stop, rep in planner._cuts(
                name, group, cut, shared, r, tuple(info.shape)
            ):
                out[r].append(
                    TensorSlice(name, target, axis, start, stop, rep, info.dtype, tuple(info.shape))
                )
    return out


@pytest.mark.parametrize(
    ("source", "kind", "mode"),
    [
        ("r7", Kind.R7, "tensor"),
        ("r7-mixed", Kind.R7, "tensor"),
        ("exl3", Kind.EXL3, "tensor"),
        ("base", Kind.MSRT_BASE, "tensor"),
        ("base", Kind.MSRT_BASE, "expert"),
    ],
)
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_memoized_rows_are_the_slice_by_slice_plan(
    sources: dict[str, Path], source: str, kind: Kind, mode: str, tp: int
) -> None:
    ckpt = fx.load(sources[source])
    try:
        plan = plan_slices(ckpt, kind, tp, mode)
    except PlanRefused:
        with pytest.raises(PlanRefused):
            _plan_slice_by_slice(ckpt, kind, tp, mode)
            _Planner(ckpt, kind, tp, mode, "per-rank").build()
        return
    want = _plan_slice_by_slice(ckpt, kind, tp, mode)
    for rp, expected in zip(plan.ranks, want, strict=True):
        assert rp.slices == expected
        for got, exp in zip(rp.slices, expected, strict=True):
            # shape and nbytes came precomputed from the memo: the constructor's own values
            assert (got.shape, got.nbytes, got.layout) == (exp.shape, exp.nbytes, exp.layout)
            assert hash(got) == hash(exp)


def test_new_slice_is_the_constructors_slice() -> None:
    args = ("a.trellis", "a.trellis", 1, 2, 6, False, "I16", (4, 8, 64))
    made = TensorSlice(*args)
    fast = new_slice(*args, made.shape, made.nbytes)
    assert fast == made and hash(fast) == hash(made)
    assert (fast.shape, fast.nbytes, fast.layout) == ((4, 4, 64), 2048, made.layout)
    with pytest.raises(AttributeError):
        fast.start = 0  # type: ignore[misc]  # still frozen


def test_a_cut_past_a_shape_is_refused_naming_the_first_tensor_of_its_kind(
    sources: dict[str, Path],
) -> None:
    ckpt = fx.load(sources["r7"])
    name = "model.layers.1.mlp.experts.1.up_proj.svh"
    ref = ckpt.tensors[name]
    short = (ref.info.shape[0] // 2,)
    ckpt.tensors[name] = ref._replace(info=ref.info._replace(shape=short))
    with pytest.raises(PlanRefused) as exc:
        plan_slices(ckpt, Kind.R7, 2)
    (f,) = list(exc.value.findings)
    assert f.location.tensor == name and "exceeds shape" in f.message


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("model.layers.1.mlp.experts.1.up_proj.svh", ()),  # a column cut on axis 0
        ("model.layers.1.mlp.experts.1.down_proj.suh", ()),  # a row cut on axis 0
        ("model.layers.1.mlp.experts.1.gate_proj.trellis", (4,)),  # a column cut on axis 1
    ],
)
@pytest.mark.parametrize("layout", ["per-rank", "rank-sliced"])
def test_a_cut_on_an_axis_the_tensor_lacks_is_refused(
    sources: dict[str, Path], name: str, shape: tuple[int, ...], layout: str
) -> None:
    """A tensor of fewer axes than its field's cut (a scalar vector, a flattened trellis: a
    span that matches its shape passes the container checks) is a TP009 finding, not an
    IndexError."""
    ckpt = fx.load(sources["r7"])
    ref = ckpt.tensors[name]
    ckpt.tensors[name] = ref._replace(info=ref.info._replace(shape=shape))
    with pytest.raises(PlanRefused) as exc:
        plan_slices(ckpt, Kind.R7, 2, layout=layout)
    (f,) = list(exc.value.findings)
    assert f.code == "TP009" and f.location.tensor == name
    assert "is past the last axis of shape" in f.message
