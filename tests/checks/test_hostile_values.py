"""Issue 15 items 2 and 3: hostile declared counts are bounded by the tensors present (one CK098
finding, never a hang or MemoryError), and the 9 sites that raised are findings now (no
`check-crashed` X099 finding either)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from exl3tool.actions.validate import validate_path
from exl3tool.checks.options import ValidateOptions
from exl3tool.formats.checkpoint import load_checkpoint
from exl3tool.identity.logical import build_plan
from exl3tool.io.st_writer import write_arrays
from exl3tool.rules import base as mb
from exl3tool.rules.registry import Findings
from exl3tool.synth.exl3 import build_exl3
from exl3tool.synth.msrt import build_adapter, build_base
from exl3tool.synth.r7 import build_r7, build_rank_sliced
from tests.fuzz.mutate import dumps, join_safetensors, split_safetensors


def _edit_json(path: Path, edit: Callable[[dict], None]) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(dumps(doc), encoding="utf-8", errors="surrogatepass")


def _edit_header(path: Path, edit: Callable[[dict], None]) -> None:
    header, payload = split_safetensors(path.read_bytes())
    edit(header)
    path.write_bytes(join_safetensors(header, payload))


def _codes(art: Path, **kw) -> set[str]:
    _, findings = validate_path(art, ValidateOptions(threads=1, **kw))
    codes = {f.rule.code for f in findings}
    assert not {c for c in codes if c.endswith("099")}, [f.message for f in findings]
    return codes


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_base(tmp_path_factory.mktemp("b") / "base")


# --- item 2: declared counts ------------------------------------------------------------------


def test_r7_billion_routed_experts(tmp_path: Path) -> None:
    art = build_r7(tmp_path / "r7")
    _edit_json(art / "config.json", lambda c: c.__setitem__("n_routed_experts", 10**9))
    assert "CK098" in _codes(art)


def test_rank_sliced_billion_layers(tmp_path: Path) -> None:
    art = build_rank_sliced(tmp_path / "rs")
    _edit_json(
        art / "config.json", lambda c: c["hybrid_tr3_tail"].__setitem__("moe_layers", [0, 10**9])
    )
    assert "CK098" in _codes(art)


def test_tail_moe_layers_far_beyond_the_model_names_a_few_layers(tmp_path: Path) -> None:
    """moe_layers [1, 4000] over a 3-layer model (within the slot budget): each layer without
    any rank slice is one RS005 finding, the first MAX_MISSING named and the rest counted in
    one more (it was 21 findings a layer: 83,979)."""
    from exl3tool.checks.r7_experts import MAX_MISSING

    art = build_r7(tmp_path / "r7", num_hidden_layers=3, first_moe_layer=1, n_experts=4)
    _edit_json(art / "config.json", lambda c: c["hybrid_tr3_tail"].update(moe_layers=[1, 4000]))
    found = validate_path(art, ValidateOptions(threads=1))[1]
    missing = [f for f in found if f.code == "RS005"]
    empty = 4000 - 1  # every layer of 1..4000 but the tail's own layer 3
    assert len(missing) == MAX_MISSING + 1
    assert missing[0].location.tensor == "model.layers.1.mlp.experts"
    assert (
        missing[-1].message
        == f"{empty - MAX_MISSING} more layers of moe_layers without any rank slice"
    )


def test_base_experts_per_layer_beyond_memory(tmp_path: Path) -> None:
    art = build_base(tmp_path / "b")
    _edit_json(
        art / "config.json", lambda c: c["hybrid_tr3_tail"].__setitem__("experts_per_layer", 10**15)
    )
    assert mb.MB_EXPERTS.code in _codes(art)  # the layers hold fewer experts


def test_cartridge_world_size_beyond_memory(tmp_path: Path, base: Path) -> None:
    art = build_adapter(tmp_path / "c", base)
    _edit_json(
        art / "adapter_config.json",
        lambda m: m["tensor_parallel"].update(world_size=10**15, layout="rank-sharded"),
    )
    assert "CA020" in _codes(art)


def test_identity_plan_rank_from_a_name(tmp_path: Path) -> None:
    """`world` comes from `rank999999999` in a tensor name: the plan lists a few missing ranks."""
    import numpy as np

    name = "model.layers.0.mlp.experts.0.gate_proj.rank{}.suh"
    with open(tmp_path / "m.safetensors", "wb") as fh:
        v = np.zeros(16, np.float16)
        write_arrays(fh, {name.format(0): v, name.format(999_999_999): v})
    plan = build_plan(load_checkpoint(tmp_path / "m.safetensors", Findings()))
    (p,) = [p for p in plan.problems if "missing" in p.message]
    assert "and 999999990 more" in p.message


# --- item 3: the 9 sites ------------------------------------------------------------------------


@pytest.mark.parametrize("label", [{"a": 1}, ["k4"]], ids=["object", "list"])
def test_chain_label_not_a_string(tmp_path: Path, base: Path, label: object) -> None:
    art = build_adapter(tmp_path / "c", base)
    _edit_json(art / "adapter_config.json", lambda m: m["chain"][1].__setitem__("label", label))
    assert "CA036" in _codes(art)  # the schema names it


def test_list_in_bit_map_manifests(tmp_path: Path) -> None:
    art = build_r7(tmp_path / "r7")
    qc = art / "quantization_config.json"
    _edit_json(qc, lambda q: q["r7_routed_experts"]["bit_map_manifests"].append(["x"]))
    assert "R7010" in _codes(art)


def test_shape_element_count_overflows_a_float(tmp_path: Path) -> None:
    art = build_exl3(tmp_path / "e")
    shard = next(art.glob("*.safetensors"))

    def edit(h: dict) -> None:
        h[next(k for k in h if k != "__metadata__")]["shape"] = [10**200, 10**200]

    _edit_header(shard, edit)
    assert "ST011" in _codes(art)


def test_300_character_tensor_name(tmp_path: Path) -> None:
    art = build_r7(tmp_path / "r7")
    shard = next(art.glob("r7-experts-*.safetensors"))

    def edit(h: dict) -> None:
        k = next(k for k in h if k != "__metadata__")
        h[k + "x" * 300] = h.pop(k)

    _edit_header(shard, edit)
    assert _codes(art)


@pytest.mark.parametrize(
    "path", ["\ud800.safetensors", "x" * 300 + ".safetensors"], ids=["surrogate", "long"]
)
def test_hostile_shard_path(tmp_path: Path, base: Path, path: str) -> None:
    art = build_adapter(tmp_path / "c", base)
    _edit_json(art / "adapter_config.json", lambda m: m["shards"][0].__setitem__("path", path))
    assert "PA004" in _codes(art)


@pytest.mark.parametrize("bits", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_bits_not_finite_rank_sliced(tmp_path: Path, bits: float) -> None:
    art = build_rank_sliced(tmp_path / "rs")
    _edit_json(art / "config.json", lambda c: c["hybrid_tr3_tail"].__setitem__("bits", bits))
    assert {"JS003", "RS001"} <= _codes(art)


@pytest.mark.parametrize("bits", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_bits_not_finite_base(tmp_path: Path, bits: float) -> None:
    art = build_base(tmp_path / "b")
    _edit_json(art / "config.json", lambda c: c["hybrid_tr3_tail"].__setitem__("bits", bits))
    assert {"JS003", "MB009"} <= _codes(art)


def test_valid_twins_are_clean(tmp_path: Path, base: Path) -> None:
    for art in (build_r7(tmp_path / "r7"), build_rank_sliced(tmp_path / "rs"), base):
        assert "CK098" not in _codes(art)


def test_r7_moe_layers_beyond_memory(tmp_path: Path) -> None:
    """bit_map_manifests compared with a layer range of 10^12: the expected list was built."""
    art = build_r7(tmp_path / "r7")
    qc = art / "quantization_config.json"
    _edit_json(qc, lambda q: q["r7_routed_experts"].__setitem__("moe_layers", [1, 10**12]))
    assert "R7010" in _codes(art)


def test_stage_on_a_base_declaring_10_12_experts(tmp_path: Path, base: Path) -> None:
    """The runtime tables are [stages, experts]: a declared 10^12 experts is refused."""
    from exl3tool.staging.stage import StageError, stage_cartridge

    cart = build_adapter(tmp_path / "c", base)
    big = build_base(tmp_path / "big")
    _edit_json(
        big / "config.json", lambda c: c["hybrid_tr3_tail"].__setitem__("experts_per_layer", 10**12)
    )
    with pytest.raises(StageError) as err:
        stage_cartridge(cart, big, out=tmp_path / "out", threads=1)
    assert not [f for f in err.value.findings if f.rule.code.endswith("099")]


def test_r7_router_check_sized_by_routers_present(tmp_path: Path) -> None:
    """check_routers and the per-layer manifests walked every layer of a declared 10^12."""
    art = build_r7(tmp_path / "r7")
    _edit_json(art / "config.json", lambda c: c.__setitem__("num_hidden_layers", 10**12))
    qc = art / "quantization_config.json"
    _edit_json(qc, lambda q: q["r7_routed_experts"].__setitem__("moe_layers", [1, 10**12 - 1]))
    assert "CK098" in _codes(art)
