"""validate --tp N of a plain EXL3 checkpoint (checks/exl3_tp.py): TP001 exactly where the
runtime's equal 128-aligned split of a linear fails, and nowhere else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exl3tool.actions.validate import validate_path
from exl3tool.checks.options import ValidateOptions
from exl3tool.synth.exl3 import build_exl3


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 heads of 128 (q 512), 2 KV heads (k/v 256), dense MLP 512, experts 256 wide."""
    root = build_exl3(
        tmp_path_factory.mktemp("tp") / "m",
        hidden=512,
        kv_dim=256,
        intermediate=512,
        moe_intermediate=256,
    )
    cfg = json.loads((root / "config.json").read_text())
    cfg.update(num_attention_heads=4, num_key_value_heads=2, head_dim=128)
    (root / "config.json").write_text(json.dumps(cfg))
    return root


def _tp001(root: Path, tp: int) -> list[str]:
    _, findings = validate_path(root, ValidateOptions(tp=tp))
    return sorted(f.message.split(" ")[0] for f in findings if f.code == "TP001")


def test_an_even_128_aligned_split_passes(model: Path) -> None:
    assert _tp001(model, 2) == []


def test_kv_heads_fewer_than_ranks_are_one_head_per_rank(model: Path) -> None:
    # TP 4: q/o/dense MLP 128 per rank, K/V one 128-wide head per rank; experts 64: refused
    assert _tp001(model, 4) == ["down_proj", "gate_proj", "up_proj"]


def test_every_split_below_128_is_refused(model: Path) -> None:
    # K/V: still one 128-wide head per rank (each head on four ranks)
    experts = ["gate_proj", "up_proj", "down_proj"]
    assert _tp001(model, 8) == sorted(["q_proj", "o_proj", *experts, *experts])


def test_without_heads_in_config_attention_is_not_judged(model: Path, tmp_path: Path) -> None:
    import shutil

    root = Path(shutil.copytree(model, tmp_path / "m"))
    cfg = json.loads((root / "config.json").read_text())
    for key in ("num_attention_heads", "num_key_value_heads", "head_dim"):
        cfg.pop(key)
    (root / "config.json").write_text(json.dumps(cfg))
    assert _tp001(root, 8) == sorted(["gate_proj", "up_proj", "down_proj"] * 2)


@pytest.mark.parametrize(("tp", "refused"), [(2, False), (3, True), (4, True)])
def test_an_msrt_base_is_judged_by_the_slice_each_rank_takes(tp: int, refused: bool) -> None:
    # rank0 holds whole experts (256 channels); each rank slices 256/TP of them for itself
    from exl3tool.actions import plan

    base = Path(__file__).resolve().parents[2] / "examples" / "msrt-base-tiny"
    assert bool(_tp001(base, tp)) is refused
    booted = plan.run(plan.PlanOptions(str(base), tp))
    assert ("TP001" in [f.code for f in booted.findings]) is refused


def test_the_runtime_splits_the_configs_sizes_not_the_padded_trellis(tmp_path: Path) -> None:
    # a 448-wide MLP stored padded to 512 (docs/formats/exl3.md §1.4): at TP 2 each rank's
    # slice is 224 channels of the logical 448, which the runtime refuses
    root = build_exl3(tmp_path / "m", hidden=512, kv_dim=256, intermediate=512, moe_layers=())
    cfg = json.loads((root / "config.json").read_text())
    cfg.update(num_attention_heads=4, num_key_value_heads=2, head_dim=128)
    (root / "config.json").write_text(json.dumps(cfg))
    assert _tp001(root, 2) == []
    cfg["intermediate_size"] = 448
    (root / "config.json").write_text(json.dumps(cfg))
    assert _tp001(root, 2) == ["down_proj", "gate_proj", "up_proj"]


def test_an_encoder_towers_attention_is_not_split_by_the_text_models_heads() -> None:
    from exl3tool.checks.exl3_tp import check_tp_slices
    from exl3tool.formats.checkpoint import Checkpoint, TensorRef
    from exl3tool.io.safetensors import FileStamp, SafetensorsFile, TensorInfo
    from exl3tool.rules.registry import Findings

    st = SafetensorsFile(Path("m.safetensors"), "m.safetensors", 0, 0, FileStamp(0, 0, 0, 0, 0))
    ckpt = Checkpoint(root=Path("."))
    ckpt.config = {"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}
    shape = (72, 72, 64)  # 1152 x 1152: a SigLIP-sized projection
    linears = [
        (p, TensorRef(st, TensorInfo(f"{p}.trellis", "I16", shape, 0, 0)))
        for p in (
            "model.vision_tower.encoder.layers.0.self_attn.q_proj",
            "model.visual.blocks.0.attn.k_proj",
        )
    ]
    findings = Findings()
    check_tp_slices(ckpt, linears, 4, findings)
    assert not findings
