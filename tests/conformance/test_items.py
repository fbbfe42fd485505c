"""Issue 14, items 1-6: each with the artifact that triggers it and its valid twin."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from checks_fixtures import edit_json, edit_shard
from conformance_paths import EXAMPLES

from exl3tool.actions.validate import validate_path
from exl3tool.checks.options import ValidateOptions


def codes(path: Path, **kw) -> set[str]:
    _ref, findings = validate_path(path, ValidateOptions(**kw))
    return findings.codes()


def copy(name_or_path, dst: Path) -> Path:
    src = EXAMPLES / name_or_path if isinstance(name_or_path, str) else name_or_path
    shutil.copytree(src, dst)
    return dst


# 1. neither tensor_storage nor hybrid_tr3_tail (Exl3Config.maybe_update_config)


def _drop_tail(root: Path) -> None:
    edit_json(root / "config.json", lambda c: c.pop("hybrid_tr3_tail"))


def test_r7_without_storage_or_tail_is_refused(tmp_path: Path) -> None:
    root = copy("r7-tiny", tmp_path / "r7")
    _drop_tail(root)
    assert "R7080" in codes(root)


def test_r7_with_tail_or_storage_passes(tmp_path: Path) -> None:
    assert "R7080" not in codes(EXAMPLES / "r7-tiny")
    root = copy("r7-tiny", tmp_path / "r7")
    _drop_tail(root)
    record = {
        "quant_format": "exl3",
        "stored_tensors": {
            f"model.layers.0.mlp.down_proj.{f}": {} for f in ("trellis", "suh", "svh")
        },
    }
    edit_json(
        root / "quantization_config.json",
        lambda q: q.update(tensor_storage={"model.layers.0.mlp.down_proj": record}),
    )
    assert not {"R7080", "EX030"} & codes(root)


def test_storage_without_exl3_record_is_refused(tmp_path: Path) -> None:
    root = copy("r7-tiny", tmp_path / "r7")
    _drop_tail(root)
    edit_json(
        root / "quantization_config.json",
        lambda q: q.update(tensor_storage={"lm_head": {"quant_format": "fp16"}}),
    )
    got = codes(root)
    assert "EX030" in got and "R7080" not in got


# 2. unknown tensor in a routed expert's namespace (load_weights expert mapping)


def _add_tensor(root: Path, label: str, name: str) -> None:
    edit_shard(root, label, lambda t: t.update({name: ("F16", np.zeros(4, np.float16))}))


def test_unknown_expert_field_is_refused(tmp_path: Path) -> None:
    root = copy("r7-tiny", tmp_path / "r7")
    _add_tensor(
        root, "r7-experts-layer-001.safetensors", "model.layers.1.mlp.experts.0.gate_proj.foo"
    )
    _ref, findings = validate_path(root, ValidateOptions())
    hits = [f for f in findings if f.code == "CK030"]
    assert [f.location.tensor for f in hits] == ["model.layers.1.mlp.experts.0.gate_proj.foo"]


def test_known_fields_and_unclaimed_layers_pass(tmp_path: Path) -> None:
    assert "CK030" not in codes(EXAMPLES / "r7-tiny")
    root = copy("r7-tiny", tmp_path / "r7")
    # layer 0 holds no EXL3 expert: the runtime does not claim it as EXL3
    _add_tensor(
        root, "r7-experts-layer-001.safetensors", "model.layers.0.mlp.experts.0.gate_proj.weight"
    )
    assert "CK030" not in codes(root)


# 3. legacy rank-sliced K=2 (Exl3MoEMethod._prepare_rank_sliced_weights)


def test_rank_sliced_k2_refused_by_public_runtime(built: dict[str, Path]) -> None:
    _ref, findings = validate_path(built["rank-sliced-k2"], ValidateOptions())
    hits = [f for f in findings if f.code == "RS020"]
    assert hits and "public R7 and main revisions" in hits[0].message


def test_rank_sliced_k2_loads_on_cartridge_runtime_and_k3_everywhere(
    built: dict[str, Path],
) -> None:
    assert "RS020" not in codes(built["rank-sliced-k2"], runtime="cartridge")
    assert "RS020" not in codes(built["rank-sliced-k3"])
    assert not codes(built["rank-sliced-k3"])


def test_non_integral_uniform_bits_refused_everywhere(
    built: dict[str, Path], tmp_path: Path
) -> None:
    root = copy(built["rank-sliced-k3"], tmp_path / "rs")
    edit_json(root / "config.json", lambda c: c["hybrid_tr3_tail"].update(bits=3.5))
    assert "RS020" in codes(root, runtime="cartridge")


def test_mixed_layer_with_three_bitrates(built: dict[str, Path], tmp_path: Path) -> None:
    root = copy(built["rank-sliced-k3"], tmp_path / "rs")
    cfg = json.loads((root / "config.json").read_text())
    first, last = cfg["hybrid_tr3_tail"]["moe_layers"]
    n = cfg["hybrid_tr3_tail"]["experts_per_layer"]
    tier = {str(L): {"k": [3] * n} for L in range(first, last + 1)}
    tier[str(first)]["k"][:3] = [3, 4, 5]
    edit_json(
        root / "config.json",
        lambda c: c["hybrid_tr3_tail"].update(
            bits="mixed", k_values=[3, 4, 5], bits_per_expert="tier_bitmap.json:k"
        ),
    )
    (root / "tier_bitmap.json").write_text(json.dumps(tier))
    _ref, findings = validate_path(root, ValidateOptions())
    hits = [f for f in findings if f.code == "RS021"]
    assert [f.location.pointer for f in hits] == [f"/{first}/k"]
    tier[str(first)]["k"][:3] = [3, 4, 4]
    (root / "tier_bitmap.json").write_text(json.dumps(tier))
    assert "RS021" not in codes(root)


# 4. created_utc with a lowercase z


def _cartridge_with_created(tmp_path: Path, value: str) -> Path:
    root = copy("cartridge-k3k4", tmp_path / "cart")
    edit_json(root / "adapter_config.json", lambda m: m.update(created_utc=value))
    return root


def test_lowercase_z_refused(tmp_path: Path) -> None:
    root = _cartridge_with_created(tmp_path, "2026-01-01T00:00:00z")
    assert "CA015" in codes(root)


@pytest.mark.parametrize("value", ["2026-01-01T00:00:00Z", "2026-01-01T00:00:00+02:00"])
def test_uppercase_z_and_offsets_pass(tmp_path: Path, value: str) -> None:
    assert "CA015" not in codes(_cartridge_with_created(tmp_path, value))


# 5. a stray .rank1. tensor in a base: MB005, and the runtime's (rank0) identity


def test_stray_rank1_is_mb005_not_mb011(tmp_path: Path) -> None:
    from exl3tool.formats.checkpoint import load_checkpoint
    from exl3tool.identity.compat import compat_identity
    from exl3tool.identity.fast import compute_identity
    from exl3tool.rules.registry import Findings

    root = copy("msrt-base-tiny", tmp_path / "base")
    published = json.loads((root / "config.json").read_text())["hybrid_tr3_tail"]
    src = "model.layers.3.mlp.experts.0.gate_proj.rank0.trellis"

    def add(t: dict) -> None:
        t[src.replace("rank0", "rank1")] = t[src]

    edit_shard(root, "model-layer-003.safetensors", add)
    got = codes(root, hash=True)
    assert "MB005" in got and "MB011" not in got and "MB010" not in got
    ckpt = load_checkpoint(root, Findings())
    assert compat_identity(ckpt, k=2).root == published["compatibility_sha256"]
    ident = compute_identity(ckpt, algo="sha256", compat=True)
    assert ident.compatibility.root == published["compatibility_sha256"]


# 6. slice --layout rank-sliced of a base with sparse MoE layers


def test_sparse_base_rank_sliced_refused(built: dict[str, Path]) -> None:
    from exl3tool.formats.checkpoint import load_checkpoint
    from exl3tool.rules.registry import Findings
    from exl3tool.tp.plan import plan_slices
    from exl3tool.tp.slices import PlanRefused

    ckpt = load_checkpoint(built["sparse-base"], Findings())
    with pytest.raises(PlanRefused) as err:
        plan_slices(ckpt, "msrt-base", 2, layout="rank-sliced")
    assert [f.code for f in err.value.findings] == ["TP011"]
    assert next(iter(err.value.findings)).location.tensor == "model.layers.4.mlp.experts"
    # the per-rank layout keeps the coverage: allowed
    assert plan_slices(ckpt, "msrt-base", 2, layout="per-rank").tp == 2


def test_contiguous_base_rank_sliced_allowed() -> None:
    from exl3tool.formats.checkpoint import load_checkpoint
    from exl3tool.rules.registry import Findings
    from exl3tool.tp.plan import plan_slices

    ckpt = load_checkpoint(EXAMPLES / "msrt-base-tiny", Findings())
    assert plan_slices(ckpt, "msrt-base", 2, layout="rank-sliced").tp == 2


def test_cli_runtime_option(built: dict[str, Path]) -> None:
    from typer.testing import CliRunner

    from exl3tool.cli.main import app

    path = str(built["rank-sliced-k2"])
    public = CliRunner().invoke(app, ["validate", path, "--format", "json"])
    cartridge = CliRunner().invoke(app, ["validate", path, "--runtime", "cartridge"])
    bogus = CliRunner().invoke(app, ["validate", path, "--runtime", "bogus"])
    assert public.exit_code == 1 and "RS020" in public.output
    assert cartridge.exit_code == 0
    assert bogus.exit_code == 2


def _r7_uniform_experts(root: Path, ks_per_layer: int) -> Path:
    from exl3tool.synth.r7 import build_r7

    k_map = {
        (layer, e, p): 3 + (e + layer) % ks_per_layer
        for layer in (1, 2)
        for e in range(4)
        for p in ("gate_proj", "up_proj", "down_proj")
    }
    return build_r7(root, hidden=128, moe_intermediate=256, k_map=k_map)


def test_rank_sliced_layout_with_three_bitrates_refused(tmp_path: Path) -> None:
    from exl3tool.formats.checkpoint import load_checkpoint
    from exl3tool.rules.registry import Findings
    from exl3tool.tp.plan import plan_slices
    from exl3tool.tp.slices import PlanRefused

    three = load_checkpoint(_r7_uniform_experts(tmp_path / "three", 3), Findings())
    with pytest.raises(PlanRefused) as err:
        plan_slices(three, "r7", 2, layout="rank-sliced")
    assert [f.code for f in err.value.findings] == ["TP012"]
    two = load_checkpoint(_r7_uniform_experts(tmp_path / "two", 2), Findings())
    assert plan_slices(two, "r7", 2, layout="rank-sliced").tp == 2
