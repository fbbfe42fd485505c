"""The rank-sliced layout is a legacy `hybrid_tr3_tail` checkpoint that `validate --tp N` accepts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from exl3tool.actions.validate import validate_path
from exl3tool.checks.options import ValidateOptions
from exl3tool.tp.run import SliceOptions, slice_artifact


@pytest.mark.parametrize("src", ["r7", "base"])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_rank_sliced_output_passes_validate(
    sources: dict[str, Path], tmp_path: Path, src: str, tp: int
) -> None:
    out = tmp_path / "rs"
    slice_artifact(sources[src], out, SliceOptions(tp, layout="rank-sliced"))
    # a K2 base rank-sliced is served by the cartridge runtime only (RS020 on the public one)
    runtime = "cartridge" if src == "base" else "public"
    ref, findings = validate_path(out, ValidateOptions(tp=tp, runtime=runtime))
    assert ref.kind == "rank-sliced"
    assert [f.to_json() for f in findings if f.level.value != "info"] == []
    tail = json.loads((out / "config.json").read_text())["hybrid_tr3_tail"]
    assert tail["tp"] == tp and tail["tensor_schema"].endswith(".rank{r}.{trellis|suh|svh|mcg}")
    if src == "r7":
        assert tail["rotation_layout"] == "per_expert_v1" and tail["bits"] == "mixed"
    # the wrong runtime TP size is caught by validate
    if tp > 1:
        _, bad = validate_path(out, ValidateOptions(tp=tp // 2))
        assert bad.has_errors()


@pytest.mark.parametrize("src", ["r7", "base"])
def test_slice_warns_when_only_the_cartridge_revision_serves_the_output(
    sources: dict[str, Path], tmp_path: Path, src: str
) -> None:
    """TP013 at slice time says what a default validate of the output then says as RS020 (a
    uniform K2 layer); the R7 source (K 3..5) gets no such warning."""
    out = tmp_path / "rs"
    outcome = slice_artifact(sources[src], out, SliceOptions(2, layout="rank-sliced"))
    warned = [f for f in outcome.findings if f.rule.code == "TP013"]
    _, public = validate_path(out, ValidateOptions(tp=2))
    refused = [f for f in public if f.rule.code == "RS020"]
    assert bool(warned) == bool(refused) == (src == "base")
    if warned:
        assert warned[0].level.value == "warning" and "K=2" in warned[0].message
    # per-rank slices of the same base are served by every revision: no warning
    per_rank = slice_artifact(sources[src], None, SliceOptions(2))
    assert not [f for f in per_rank.findings if f.rule.code == "TP013"]


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda tb: tb.pop("2"), "no entry for MoE layer 2"),
        (lambda tb: tb["2"]["k"].append(3), "experts_per_layer"),
        (lambda tb: tb["2"]["k"].__setitem__(0, "x"), "not an integer"),
        (lambda tb: tb["2"]["k"].__setitem__(0, 3.5), "not an integer"),
        (lambda tb: tb["2"]["k"].__setitem__(0, True), "not an integer"),
        (lambda tb: tb["2"]["k"].__setitem__(0, f" {tb['2']['k'][0]}"), None),  # int() reads it
        (lambda tb: tb["2"]["k"].__setitem__(0, float(tb["2"]["k"][0])), None),
        (lambda tb: tb["2"]["k"].__setitem__(0, 6), "k_values declares"),
    ],
    ids=[
        "missing-layer",
        "extra-entry",
        "text-k",
        "fraction-k",
        "bool-k",
        "decimal-string-k",
        "integral-float-k",
        "undeclared-k",
    ],
)
def test_the_tier_bitmap_is_read_as_the_runtime_reads_it(
    sources: dict[str, Path], tmp_path: Path, edit: Any, says: str | None
) -> None:
    """Exl3Config._load_rank_sliced_bitrates refuses to start unless every MoE layer has a K
    per expert from k_values (RS011); its MTP overlay form (tail_tr3 per expert) is accepted."""
    out = tmp_path / "rs"
    slice_artifact(sources["r7"], out, SliceOptions(2, layout="rank-sliced"))
    tb_path = out / "tier_bitmap.json"
    tb = json.loads(tb_path.read_text())
    assert "2" in tb
    edit(tb)
    tb_path.write_text(json.dumps(tb))
    _, findings = validate_path(out, ValidateOptions(tp=2))
    hits = [f for f in findings if f.rule.code == "RS011"]
    if says is None:
        assert hits == []
    else:
        assert hits and says in hits[0].message and hits[0].location.pointer == "/2"


def test_mixed_bits_are_read_as_the_runtime_reads_them(
    sources: dict[str, Path], tmp_path: Path
) -> None:
    """Exl3Config compares `bits.strip().lower()` with "mixed": " Mixed" is a mixed tail, not
    an RS001 error; "mixd" is still one."""
    out = tmp_path / "rs"
    slice_artifact(sources["r7"], out, SliceOptions(2, layout="rank-sliced"))
    config = json.loads((out / "config.json").read_text())
    for bits, errors in ((" Mixed", set()), ("mixd", {"RS001"})):
        config["hybrid_tr3_tail"]["bits"] = bits
        (out / "config.json").write_text(json.dumps(config))
        _, findings = validate_path(out, ValidateOptions(tp=2))
        assert {f.rule.code for f in findings if f.level.value == "error"} >= errors, bits
        if not errors:
            assert not findings.has_errors(), [f.to_json() for f in findings]


@pytest.mark.parametrize("declared", [[3, 4, 5], [4, 5]])
def test_the_mtp_overlay_form_is_k_3_for_every_expert(
    sources: dict[str, Path], tmp_path: Path, declared: list[int]
) -> None:
    """A layer entry without `k` whose `tail_tr3` has one item per expert is read as K 3 for
    every expert: refused when k_values does not declare 3 (RS011), and each expert's slices
    are checked against K 3 (RS008 where they are not K 3)."""
    out = tmp_path / "rs"
    slice_artifact(sources["r7"], out, SliceOptions(2, layout="rank-sliced"))
    tb = json.loads((out / "tier_bitmap.json").read_text())
    ks = tb["2"]["k"]
    tb["2"] = {"tail_tr3": list(range(len(ks)))}
    (out / "tier_bitmap.json").write_text(json.dumps(tb))
    config = json.loads((out / "config.json").read_text())
    config["hybrid_tr3_tail"]["k_values"] = declared
    (out / "config.json").write_text(json.dumps(config))
    _, findings = validate_path(out, ValidateOptions(tp=2))
    rs011 = [f for f in findings if f.rule.code == "RS011" and f.location.pointer == "/2"]
    assert bool(rs011) == (3 not in declared)
    rs008 = [
        f for f in findings if f.rule.code == "RS008" and ".layers.2." in (f.location.tensor or "")
    ]
    assert bool(rs008) == any(k != 3 for k in ks)


@pytest.mark.parametrize(
    ("layer_ks", "warned", "refused"),
    [
        ({1: {3}, 2: {4}}, {}, False),  # mixed, every K in 3..6
        ({1: {3, 4}, 2: {3, 4}}, {}, False),
        ({1: {5}, 2: {5}}, {}, False),  # uniform K 5
        ({1: {2}, 2: {2}}, {1: 2, 2: 2}, False),  # uniform K 2: the cartridge revision only
        ({1: {2}, 2: {3}}, None, True),  # mixed with K 2: no revision
        ({1: {2, 3}, 2: {3}}, None, True),
        ({1: {8}, 2: {8}}, None, True),  # uniform K 8: no revision
        ({1: {7}}, None, True),
    ],
)
def test_the_output_tail_s_k_is_one_a_runtime_revision_serves(
    layer_ks: dict[int, set[int]], warned: dict[int, int] | None, refused: bool
) -> None:
    from exl3tool.tp.plan import _check_served_k
    from exl3tool.tp.slices import PlanRefused

    if refused:
        with pytest.raises(PlanRefused) as err:
            _check_served_k(layer_ks)
        assert [f.code for f in err.value.findings] == ["TP014"]
    else:
        assert _check_served_k(layer_ks) == warned


def test_a_k8_model_is_not_sliced_rank_sliced(tmp_path: Path) -> None:
    from exl3tool.synth.exl3 import build_exl3
    from exl3tool.tp.slices import PlanRefused

    src = build_exl3(tmp_path / "k8", codebook="mcg", k_values=(8,), moe_intermediate=256)
    with pytest.raises(PlanRefused) as err:
        slice_artifact(src, tmp_path / "out", SliceOptions(2, layout="rank-sliced"))
    assert [f.code for f in err.value.findings] == ["TP014"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("reference", "move_to", "error"),
    [
        ("bits.json:k", "bits.json", None),  # any 'file.json:field' the runtime can open
        ("bits.json:per_expert", "bits.json", None),
        # the hardened public revision takes a bare file name only (its security tests)
        ("sub/bits.json:per_expert", "sub/bits.json", "a bare file name"),
        ("tier_bitmap.json", None, "bits_per_expert"),  # no field
        ("../tier_bitmap.json:k", None, "bits_per_expert"),  # outside the checkpoint
        ("/etc/tier_bitmap.json:k", None, "bits_per_expert"),
        ("absent.json:k", None, "absent.json missing"),
        (7, None, "bits_per_expert"),
    ],
)
def test_bits_per_expert_names_the_bitmap_as_the_runtime_reads_it(
    sources: dict[str, Path],
    tmp_path: Path,
    reference: object,
    move_to: str | None,
    error: str | None,
) -> None:
    """Exl3Config._load_rank_sliced_bitrates splits bits_per_expert at its last ':' and reads
    that field of that file of the checkpoint (RS011 when it cannot)."""
    out = tmp_path / "rs"
    slice_artifact(sources["r7"], out, SliceOptions(2, layout="rank-sliced"))
    config = json.loads((out / "config.json").read_text())
    config["hybrid_tr3_tail"]["bits_per_expert"] = reference
    (out / "config.json").write_text(json.dumps(config))
    if move_to is not None:
        field = str(reference).rsplit(":", 1)[1]
        tb = json.loads((out / "tier_bitmap.json").read_text())
        dest = out / move_to
        dest.parent.mkdir(exist_ok=True)
        dest.write_text(json.dumps({k: {field: v["k"]} for k, v in tb.items()}))
    _, findings = validate_path(out, ValidateOptions(tp=2))
    rs011 = [f.message for f in findings if f.rule.code == "RS011"]
    if error is None:
        assert rs011 == [] and not findings.has_errors(), [f.to_json() for f in findings]
    else:
        assert any(error in m for m in rs011), rs011


@pytest.mark.parametrize(("runtime", "refused"), [("public", True), ("cartridge", False)])
def test_a_bitmap_in_a_subfolder_is_refused_by_the_hardened_revision_only(
    sources: dict[str, Path], tmp_path: Path, runtime: str, refused: bool
) -> None:
    """The hardened public revision refuses a bits_per_expert file name with a path separator
    (its security tests: "bare file name"); the cartridge-era revision opens it."""
    out = tmp_path / "rs"
    slice_artifact(sources["r7"], out, SliceOptions(2, layout="rank-sliced"))
    (out / "maps").mkdir()
    (out / "tier_bitmap.json").rename(out / "maps" / "tier_bitmap.json")
    config = json.loads((out / "config.json").read_text())
    config["hybrid_tr3_tail"]["bits_per_expert"] = "maps/tier_bitmap.json:k"
    (out / "config.json").write_text(json.dumps(config))
    _, findings = validate_path(out, ValidateOptions(tp=2, runtime=runtime))
    bare = [f for f in findings if f.rule.code == "RS011" and "bare file name" in f.message]
    assert bool(bare) is refused, [f.to_json() for f in findings]
    if refused:
        assert bare[0].location.pointer == "/hybrid_tr3_tail/bits_per_expert"
        assert Path(str(bare[0].location.file)).name == "config.json"
    else:
        assert not findings.has_errors(), [f.to_json() for f in findings]


@pytest.mark.parametrize(
    ("k_values", "refused"),
    [
        (["3", 4.0], False),  # int() reads each: the runtime's k_values (3, 4)
        ([" 3", "4", 5.0, 6], False),
        ([3, 4], False),
        ([3, 4.5], True),
        ([2, 3, 4], True),  # a mixed tail takes K 3..6 only
        ([], True),
        ("3,4", True),
        ([3, 4] * 20_000 + ["x"], True),  # long, and one K int() refuses
    ],
)
def test_k_values_are_read_as_the_runtime_reads_them(
    sources: dict[str, Path], tmp_path: Path, k_values: object, refused: bool
) -> None:
    out = tmp_path / "rs"
    slice_artifact(sources["r7"], out, SliceOptions(2, layout="rank-sliced"))
    config = json.loads((out / "config.json").read_text())
    assert config["hybrid_tr3_tail"]["k_values"] == [3, 4]
    config["hybrid_tr3_tail"]["k_values"] = k_values
    (out / "config.json").write_text(json.dumps(config))
    _, findings = validate_path(out, ValidateOptions(tp=2))
    said = [
        f for f in findings if f.rule.code == "RS011" and f.location.pointer.endswith("k_values")
    ]
    assert bool(said) == refused
    assert all(len(f.message) < 200 for f in said)
    if not refused:
        assert not findings.has_errors(), [f.to_json() for f in findings]
