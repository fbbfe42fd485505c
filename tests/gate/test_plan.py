"""Resolution, inference and planning of a release (pure parts of the gate)."""

from __future__ import annotations

from pathlib import Path

from exl3tool.actions.gate.config import ArtifactSpec, GateConfig
from exl3tool.actions.gate.infer import infer
from exl3tool.actions.gate.run import Target, plan, resolve_targets
from exl3tool.rules.registry import Findings

from .conftest import Artifacts


def names(t: Target) -> list[str]:
    return [s.name for s in plan(t)]


def test_plan_orders_every_declared_check() -> None:
    t = Target("c", "c", Path("c"), "cartridge", "cartridge", base=Path("b"), hash=True,
               identity=Path("id.json"), tp=(2, 4), verify_swap=(1, 2))  # fmt: skip
    assert names(t) == [
        "validate --hash",
        "identity --check",
        "validate --tp 2",
        "slice-verify --tp 2",
        "validate --tp 4",
        "slice-verify --tp 4",
        "stage --tp 2",
        "stage --tp 4",
        "verify-swap --tp 1",
        "verify-swap --tp 2",
    ]


def test_plan_without_hash_and_for_presliced_artifacts() -> None:
    t = Target("r", "r", Path("r"), "rank-sliced", "checkpoint", hash=False, tp=(2,), sliced_for=2)
    assert names(t) == ["validate", "validate --tp 2"]
    assert plan(Target("x", "x", None, "unknown", "checkpoint")) == []


def test_resolve_targets_matches_bases_and_reports_problems(synth: Artifacts) -> None:
    cfg = GateConfig(
        artifacts=(
            ArtifactSpec(str(synth.base), name="base"),
            ArtifactSpec(str(synth.cartridge), name="good", base="base", verify_swap=True),
            ArtifactSpec(str(synth.cartridge), name="by-path", base=str(synth.base)),
            ArtifactSpec(str(synth.cartridge), name="lost", base="nope"),
            ArtifactSpec(str(synth.cartridge), name="alone"),
            ArtifactSpec(str(synth.r7), name="r7", kind="msrt-base", verify_swap=[2]),
            ArtifactSpec("does/not/exist/here", name="gone"),
        ),
        root=Path("/"),
    )
    findings = Findings()
    t = {x.label: x for x in resolve_targets(cfg, findings)}
    assert (t["base"].role, t["base"].kind) == ("base", "msrt-base")
    assert (t["good"].base, t["good"].verify_swap) == (synth.base, (1,))
    assert t["by-path"].base == synth.base and t["by-path"].verify_swap == ()
    assert t["lost"].base is None and t["alone"].base is None
    assert t["gone"].path is None
    by_code = {f.code: f for f in findings}
    assert set(by_code) == {"GT002", "GT005", "GT006", "GT007", "GT013"}
    assert "nope" in by_code["GT005"].message and "declared msrt-base" in by_code["GT007"].message


def test_inference_says_what_it_inferred(synth: Artifacts) -> None:
    got = infer([(str(p), p) for p in (synth.r7, synth.base, synth.cartridge)])
    specs = {s.name: s for s in got.config.artifacts}
    cart = specs[str(synth.cartridge)]
    assert (cart.role, cart.base, cart.verify_swap) == ("cartridge", str(synth.base), True)
    assert specs[str(synth.base)].role == "base"
    assert specs[str(synth.r7)].role == "checkpoint" and specs[str(synth.r7)].tp is None
    text = "\n".join(got.notes)
    assert f"inferred for {synth.r7} (r7): validate --hash, identity root" in text
    assert f"base match against {synth.base}" in text and "verify-swap --tp 1" in text
    assert "no TP sizes inferred" in text


def test_inference_without_a_base_says_so(synth: Artifacts) -> None:
    got = infer([(str(synth.cartridge), synth.cartridge)])
    assert got.config.artifacts[0].base is None
    assert "no base match (no MSRT base among the paths)" in got.notes[0]


def test_inference_reads_the_tp_size_of_a_rank_sharded_cartridge(
    synth: Artifacts, tmp_path: Path
) -> None:
    from exl3tool.synth.msrt import build_adapter

    sharded = build_adapter(tmp_path / "rs", synth.base, layout="rank-sharded", world_size=2)
    got = infer([(str(sharded), sharded)])
    assert got.config.artifacts[0].tp == (2,)
    assert "validate --tp 2 (the TP size it was sliced for)" in got.notes[0]
