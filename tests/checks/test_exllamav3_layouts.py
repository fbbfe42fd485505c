"""Layouts exllamav3's own converter writes (1.6.5): a quantized embedding table (-eb), MTP and
vision linears without tensor_storage records, experts with biases (gpt-oss). Each is judged
by what the serving runtime does with it, with the finding that says so, and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from checks_fixtures import copy, edit_json, edit_shard

from exl3tool.actions.validate import validate_path
from exl3tool.checks.options import ValidateOptions
from exl3tool.report.model import Report
from exl3tool.rules.registry import Severity

LINEAR = "model.layers.0.mlp.down_proj"  # an mcg linear of the plain EXL3 fixture


def _validate(root: Path) -> Report:
    return Report([], validate_path(root, ValidateOptions())[1])


def _shard(root: Path, name: str) -> str:
    return json.loads((root / "model.safetensors.index.json").read_text())["weight_map"][name]


def _clone_linear(root: Path, new_prefix: str) -> None:
    """`new_prefix`'s tensors: a copy of LINEAR's, with no tensor_storage record for it."""

    def add(t: dict) -> None:
        for name in [n for n in t if n.startswith(LINEAR + ".")]:
            t[new_prefix + name[len(LINEAR) :]] = t[name]

    edit_shard(root, _shard(root, f"{LINEAR}.trellis"), add)


def test_a_quantized_embedding_table_is_ex033_and_no_linear(
    pristine: dict[str, Path], tmp_path: Path
) -> None:
    root = copy(pristine["exl3"], tmp_path / "ck")

    def quantize_embedding(t: dict) -> None:
        t.pop("model.embed_tokens.weight")
        t["model.embed_tokens.trellis"] = ("I16", np.zeros((64, 65), "<i2"))
        t["model.embed_tokens.signs"] = ("F16", np.ones((1, 256), np.float16))

    edit_shard(root, _shard(root, "model.embed_tokens.weight"), quantize_embedding)

    def record(q: dict) -> None:  # as exllamav3 writes it: no quant_format
        q["tensor_storage"]["model.embed_tokens"] = {
            "stored_tensors": {
                "model.embed_tokens.trellis": {
                    "shape": [64, 65],
                    "n_bytes": 8320,
                    "dtype": "torch.int16",
                },
                "model.embed_tokens.signs": {
                    "shape": [1, 256],
                    "n_bytes": 512,
                    "dtype": "torch.float16",
                },
            }
        }

    edit_json(root / "quantization_config.json", record)
    report = _validate(root)
    hits = [f for f in report.findings if f.location.tensor == "model.embed_tokens.trellis"]
    assert [f.code for f in hits] == ["EX033"]
    assert "model.embed_tokens" in hits[0].message and "I16 64x65" in hits[0].message
    assert not [f for f in report.findings if "embed_tokens" in (f.location.tensor or "")][1:]
    assert report.exit_code() == 1


def test_a_rank_2_trellis_without_signs_is_still_a_broken_linear(
    pristine: dict[str, Path], tmp_path: Path
) -> None:
    root = copy(pristine["exl3"], tmp_path / "ck")
    edit_shard(
        root,
        _shard(root, f"{LINEAR}.trellis"),
        lambda t: t.update({f"{LINEAR}.trellis": ("I16", np.zeros((8, 8), "<i2"))}),
    )
    assert "EX001" in _validate(root).findings.codes()


def test_an_mtp_linear_without_a_record_is_one_warning(
    pristine: dict[str, Path], tmp_path: Path
) -> None:
    root = copy(pristine["exl3"], tmp_path / "ck")
    edit_json(root / "config.json", lambda c: c.update(num_nextn_predict_layers=1))
    layers = json.loads((root / "config.json").read_text())["num_hidden_layers"]
    mtp = f"model.layers.{layers}.eh_proj"  # the layer after the last decoder layer
    _clone_linear(root, mtp)
    report = _validate(root)
    hits = [f for f in report.findings if f.code == "EX022"]
    assert len(hits) == 1 and hits[0].level is Severity.WARNING
    assert hits[0].location.tensor.startswith(mtp + ".")
    assert "speculative draft" in hits[0].message and "(4 tensors)" in hits[0].message
    assert report.exit_code() == 0


def test_a_vision_or_decoder_linear_without_a_record_stays_an_error(
    pristine: dict[str, Path], tmp_path: Path
) -> None:
    root = copy(pristine["exl3"], tmp_path / "ck")
    _clone_linear(root, "model.visual.blocks.0.mlp.fc1")
    _clone_linear(root, "model.layers.1.mlp.extra_proj")
    hits = [f for f in _validate(root).findings if f.code == "EX022"]
    vision = [f for f in hits if ".visual." in f.location.tensor]
    decoder = [f for f in hits if ".extra_proj." in f.location.tensor]
    assert len(vision) == 4 and len(decoder) == 4  # trellis, suh, svh, mcg each
    assert all(f.level is Severity.ERROR for f in hits)
    assert all("no record for vision modules" in f.message for f in vision)
    assert not any("vision" in f.message for f in decoder)


def test_expert_biases_say_the_runtime_has_none(pristine: dict[str, Path], tmp_path: Path) -> None:
    root = copy(pristine["r7"], tmp_path / "ck")
    shard = "r7-experts-layer-001.safetensors"
    name = "model.layers.1.mlp.experts.0.down_proj.bias"
    edit_shard(root, shard, lambda t: t.update({name: ("F16", np.zeros(64, np.float16))}))
    hits = [f for f in _validate(root).findings if f.code == "CK030"]
    assert [f.location.tensor for f in hits] == [name]
    assert "no expert biases" in hits[0].message


def test_only_declared_mtp_layers_of_the_decoder_are_downgraded(
    pristine: dict[str, Path], tmp_path: Path
) -> None:
    """Past num_hidden_layers without num_nextn_predict_layers, or a vision encoder's own
    `layers.N`, is no MTP head: the runtime refuses those linears (errors)."""
    root = copy(pristine["exl3"], tmp_path / "ck")
    layers = json.loads((root / "config.json").read_text())["num_hidden_layers"]
    _clone_linear(root, f"model.layers.{layers}.extra_proj")  # no MTP layer declared
    _clone_linear(root, f"vision_model.encoder.layers.{layers}.mlp.fc1")
    hits = [f for f in _validate(root).findings if f.code == "EX022"]
    assert len(hits) == 8 and all(f.level is Severity.ERROR for f in hits)
    edit_json(root / "config.json", lambda c: c.update(num_nextn_predict_layers=1))
    hits = [f for f in _validate(root).findings if f.code == "EX022"]
    warned = [f for f in hits if f.level is Severity.WARNING]
    assert [f.location.tensor.rsplit(".", 1)[0] for f in warned] == [
        f"model.layers.{layers}.extra_proj"
    ]
    assert all(".encoder." in f.location.tensor for f in hits if f.level is Severity.ERROR)


def test_a_broken_projection_with_signs_is_still_checked_as_a_linear(
    pristine: dict[str, Path], tmp_path: Path
) -> None:
    root = copy(pristine["exl3"], tmp_path / "ck")

    def break_it(t: dict) -> None:
        t[f"{LINEAR}.trellis"] = ("I16", np.zeros((8, 8), "<i2"))
        t[f"{LINEAR}.signs"] = ("F16", np.ones((1, 256), np.float16))
        t.pop(f"{LINEAR}.suh")

    edit_shard(root, _shard(root, f"{LINEAR}.trellis"), break_it)
    codes = _validate(root).findings.codes()
    assert {"EX001", "EX004"} <= codes and "EX033" not in codes
