"""`exl3tool plan`: the boot plan on the bundled examples and the BF16-fallback seed case."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from checks_fixtures import edit_json, edit_qc
from conformance_paths import EXAMPLES
from typer.testing import CliRunner

from exl3tool.actions import plan as action
from exl3tool.cli.main import app
from exl3tool.formats.checkpoint import load_checkpoint
from exl3tool.rules.errors import UsageError
from exl3tool.rules.registry import Findings


def run(path: Path, tp: int = 1, **kw) -> action.BootPlan:
    return action.run(action.PlanOptions(str(path), tp, **kw))


def stored_bytes(path: Path) -> int:
    ckpt = load_checkpoint(path, Findings())
    return sum(r.info.nbytes for r in ckpt.tensors.values())


@pytest.mark.parametrize("name", ["r7-tiny", "msrt-base-tiny"])
def test_tp1_keeps_every_stored_byte(name: str) -> None:
    plan = run(EXAMPLES / name)
    assert plan.exl3_config == "kept" and not plan.findings
    assert plan.totals() == [stored_bytes(EXAMPLES / name)]
    assert "unquantized MoE fallback (BF16)" not in plan.claims


def test_base_claims_and_tp_split() -> None:
    whole = stored_bytes(EXAMPLES / "msrt-base-tiny")
    plan = run(EXAMPLES / "msrt-base-tiny", tp=2)
    assert set(plan.claims) == {"rank-sliced tail", "unquantized"}
    assert plan.claims["rank-sliced tail"].modules  # every expert projection, one module each
    assert len(plan.claims["rank-sliced tail"].modules) == 2 * 4 * 3
    t0, t1 = plan.totals()
    assert t0 == t1 and whole / 2 < t0 < whole  # trellis split, hidden-side vectors replicated
    assert set(plan.ranks[0]) == {"routed K2", "unquantized"}


def _bf16_experts(path: Path, layers: int) -> int:
    cfg = json.loads((path / "config.json").read_text())
    return (
        layers * cfg["n_routed_experts"] * 3 * cfg["moe_intermediate_size"] * cfg["hidden_size"] * 2
    )


def test_forced_quantization_falls_back_to_bf16() -> None:
    root = EXAMPLES / "r7-tiny"
    plan = run(root, quantization="modelopt")
    assert plan.exl3_config == "discarded"
    assert [f.code for f in plan.findings] == ["PL002"]
    assert set(plan.claims) == {"unquantized", "unquantized MoE fallback (BF16)"}
    moe_layers = len(plan.claims["unquantized MoE fallback (BF16)"].modules)
    assert moe_layers == 3  # R7 layers 1-2 and the carried MTP layer 3
    assert plan.ranks[0]["routed BF16 (fallback)"] == _bf16_experts(root, moe_layers)
    kept = run(root, quantization="exl3")
    assert kept.exl3_config == "kept" and not kept.findings


def test_gpu_memory_finding_per_rank() -> None:
    root = EXAMPLES / "r7-tiny"
    fallback = run(root, quantization="modelopt").totals()[0]
    over = run(root, quantization="modelopt", gpu_memory=fallback - 1)
    assert [f.code for f in over.findings] == ["PL002", "PL001"]
    assert "rank 0" in over.findings.errors()[1].message
    fits = run(root, gpu_memory=fallback - 1)  # the EXL3 claim fits where BF16 does not
    assert not fits.findings


def test_sizes_beyond_a_float_are_reported_not_raised(tmp_path: Path) -> None:
    """A config whose sizes multiply past 1.8e308 bytes (fuzz seed 1206, case 154158: an
    OverflowError in the message): the figures are integers throughout."""
    root = shutil.copytree(EXAMPLES / "r7-tiny", tmp_path / "r7")
    edit_json(root / "config.json", lambda c: c.update(moe_intermediate_size=10**200,
                                                        hidden_size=10**200))  # fmt: skip
    plan = run(root, quantization="modelopt", gpu_memory=2**30)
    message = next(f.message for f in plan.findings if f.code == "PL002")
    assert "TiB of BF16 experts" in message
    assert action._gib(10**400).endswith(" TiB") and action._gib(3 * 2**29) == "1.50 GiB"


def test_quant_method_stamp_without_r7_block_or_tail(tmp_path: Path) -> None:
    root = shutil.copytree(EXAMPLES / "r7-tiny", tmp_path / "r7")
    edit_json(root / "config.json", lambda c: c.pop("hybrid_tr3_tail"))
    edit_qc(root, lambda q: q.pop("r7_routed_experts"))
    plan = run(root)
    assert plan.exl3_config == "discarded" and "'modelopt'" in plan.reason
    assert "PL002" in {f.code for f in plan.findings}


def test_unclaimed_moe_layer_is_a_warning(tmp_path: Path) -> None:
    root = shutil.copytree(EXAMPLES / "r7-tiny", tmp_path / "r7")
    edit_qc(root, lambda q: q["r7_routed_experts"].update(moe_layers=[1, 1]))
    plan = run(root)
    assert plan.exl3_config == "kept"
    hits = [f for f in plan.findings if f.code == "PL003"]
    assert len(hits) == 1 and "model.layers.2.mlp.experts" in hits[0].message


@pytest.mark.parametrize(
    ("text", "value"),
    [("96GiB", 96 * 2**30), ("80GB", 80 * 10**9), ("1.5TiB", int(1.5 * 2**40)), ("4096", 4096)],
)
def test_parse_memory(text: str, value: int) -> None:
    assert action.parse_memory(text) == value


@pytest.mark.parametrize("text", ["", "96XB", "-1GiB", "0"])
def test_parse_memory_refuses(text: str) -> None:
    with pytest.raises(UsageError):
        action.parse_memory(text)


def test_cli_json_plot_and_exit_codes(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    r = CliRunner()
    path = str(EXAMPLES / "r7-tiny")
    out = r.invoke(app, ["plan", path, "--format", "json"])
    assert out.exit_code == 0 and json.loads(out.output)["exl3_config"] == "kept"
    png = tmp_path / "plan.png"
    args = ["plan", path, "--quantization", "modelopt", "--gpu-memory", "1MiB", "--plot", str(png)]
    bad = r.invoke(app, args)
    assert bad.exit_code == 1 and "PL001" in bad.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert r.invoke(app, args).exit_code != 0 and r.invoke(app, [*args, "--force"]).exit_code == 1
    assert r.invoke(app, ["plan", path, "--tp", "0"]).exit_code == 2
    assert r.invoke(app, ["plan", str(tmp_path / "absent")]).exit_code == 3
    assert r.invoke(app, ["plan", str(EXAMPLES / "cartridge-k3k4")]).exit_code == 2


def test_a_split_the_runtime_refuses_is_tp001(tmp_path: Path) -> None:
    from exl3tool.synth.exl3 import build_exl3

    # experts 128 wide: 64 channels a rank at TP 2, which the runtime's 128-aligned slice refuses
    root = build_exl3(tmp_path / "m", moe_intermediate=128)
    codes = [f.code for f in run(root, tp=2).findings]
    assert codes.count("TP001") == 3  # gate, up and down; each names its first expert
    assert "TP001" not in [f.code for f in run(root, tp=1).findings]
