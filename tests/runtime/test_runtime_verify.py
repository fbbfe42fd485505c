"""verify-swap on tiny synthetic artifacts: every check passes on valid input, and each can fail."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import jsonschema
import numpy as np
import torch

from exl3tool.formats import cartridge_tables as tables_mod
from exl3tool.io.safetensors import read_header
from exl3tool.rules.registry import Findings
from exl3tool.runtime import base as base_mod
from exl3tool.runtime import cold
from exl3tool.runtime import engine as engine_mod
from exl3tool.runtime.base import load_base
from exl3tool.runtime.distributed import Comm
from exl3tool.runtime.engine import SwapEngine
from exl3tool.runtime.verify import VerifyOptions, run_verify
from exl3tool.runtime.verify_parts import concat_check, tp_tolerance_check
from exl3tool.synth.msrt_edit import refresh_shards

SCHEMA = (
    Path(__file__).resolve().parents[2] / "exl3tool" / "schemas" / "exl3tool-verify-1.schema.json"
)


def checks(report) -> dict:
    return {c.name: c for c in report.checks}


def verify(artifacts, **kw):
    opts = dict(base=artifacts.base, adapter=artifacts.a, threads=1)
    opts.update(kw)
    return run_verify(VerifyOptions(**opts))


def test_every_check_passes_on_valid_artifacts(artifacts) -> None:
    report = verify(artifacts, adapter_b=artifacts.b, dense=artifacts.dense)
    c = checks(report)
    assert report.passed and report.exit_code() == 0
    for name in (
        "hot-load-equals-cold",
        "deactivate-restores-base",
        "failed-load-leaves-base",
        "swap-a-to-b-equals-cold-b",
        "quality-ladder",
    ):
        assert c[name].passed is True, (name, c[name].detail)
    assert c["deactivate-restores-base"].max_abs == 0.0
    assert c["exllamav3-agreement"].passed is None  # CPU: skipped with a note
    assert "skipped" in c["exllamav3-agreement"].detail
    doc = report.to_json()
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).validate(doc)
    # the ladder falls and the dense error falls with it
    q = [r for r in doc["quality"] if r["layer"] == 3]
    assert [r["label"] for r in q] == ["base", "k3", "k4"]
    assert q[1]["correction_ratio_max"] > q[2]["correction_ratio_max"]
    assert q[0]["rel_to_dense_max"] > q[1]["rel_to_dense_max"] > q[2]["rel_to_dense_max"]


def _wrap_tables(monkeypatch, edit) -> None:
    real = tables_mod.materialize_tables

    def wrapped(*a, **kw):
        out = real(*a, **kw)
        edit(out)
        return out

    monkeypatch.setattr(tables_mod, "materialize_tables", wrapped)


def test_wrong_inverse_scale_fails_hot_equals_cold(artifacts, monkeypatch) -> None:
    def edit(tables):
        inv = tables[3].inverse_scale["up_proj"]
        inv[0, 1] = np.nextafter(inv[0, 1], np.float32(np.inf))  # one FP32 ulp

    _wrap_tables(monkeypatch, edit)
    c = checks(verify(artifacts))["hot-load-equals-cold"]
    assert c.passed is False
    assert c.first_difference is not None and "layer 3" in c.first_difference["where"]
    assert c.max_abs > 0


def test_wrong_sparse_entry_fails_hot_equals_cold(artifacts, monkeypatch) -> None:
    def edit(tables):
        t = tables[4]
        s = t.stages.index("k4")
        assert t.tensor_name["down_proj"][s][2] is None  # expert 2 is sparse in stage k4
        t.inverse_scale["down_proj"][s, 2] = np.float32(0.5)

    _wrap_tables(monkeypatch, edit)
    report = verify(artifacts)
    c = checks(report)["hot-load-equals-cold"]
    assert c.passed is False and report.exit_code() == 1
    assert "layer 4" in c.first_difference["where"]


def test_rollback_that_forgets_a_layer_fails(artifacts, monkeypatch) -> None:
    def forgetful(self) -> None:
        for layer in sorted(self.active)[:-1]:  # BUG: the last layer stays active
            self.active.pop(layer).release()
        self.pending = {}

    monkeypatch.setattr(SwapEngine, "restore_base", forgetful)
    c = checks(verify(artifacts))
    assert c["failed-load-leaves-base"].passed is False
    assert c["failed-load-leaves-base"].first_difference is not None
    assert c["deactivate-restores-base"].passed is False


def test_staging_that_skips_verification_fails(artifacts, monkeypatch) -> None:
    def unverified(adapter, base, world_size, out, progress=None):
        shutil.copytree(adapter, out)  # BUG: no sha256 check, no validation
        return out, "0" * 64

    monkeypatch.setattr(engine_mod, "stage_adapter", unverified)
    c = checks(verify(artifacts))["failed-load-leaves-base"]
    assert c.passed is False
    assert "corrupted copy" in c.detail


def test_swap_that_keeps_old_layers_fails(artifacts, monkeypatch) -> None:
    def sticky_activate(self) -> None:  # BUG: layers B does not select stay active
        st = self._require_staged()
        self.active.update(self.pending)
        self.pending = {}
        self.adapter = st.info

    monkeypatch.setattr(SwapEngine, "activate", sticky_activate)
    c = checks(verify(artifacts, adapter_b=artifacts.b))["swap-a-to-b-equals-cold-b"]
    assert c.passed is False
    assert "still active" in c.detail


def _set_scale(adapter: Path, name: str, factor: float) -> None:
    manifest = json.loads((adapter / "adapter_config.json").read_text())
    for sh in manifest["shards"]:
        st = read_header(adapter / sh["path"], Findings())
        if name in st.tensors:
            begin, _end = st.span(name)
            with open(adapter / sh["path"], "r+b") as fh:
                fh.seek(begin)
                (old,) = struct.unpack("<f", fh.read(4))
                fh.seek(begin)
                fh.write(struct.pack("<f", old * factor))
            return
    raise AssertionError(name)


def test_tampered_stage_scale_resealed_fails_quality(artifacts, tmp_path) -> None:
    bad = tmp_path / "tampered"
    shutil.copytree(artifacts.a, bad)
    # stage k4's correction of one projection becomes 1000x larger; the manifest is re-sealed,
    # so staging accepts it and hot == cold still holds: only the quality ladder can see it
    _set_scale(bad, "model.layers.3.mlp.experts.1.gate_proj.rank0.scale_k4", 1e-3)
    refresh_shards(bad)
    c = checks(verify(artifacts, adapter=bad))
    assert c["hot-load-equals-cold"].passed is True
    assert c["quality-ladder"].passed is False
    assert "expert 1 gate_proj" in c["quality-ladder"].detail


class SoloComm(Comm):
    """One rank of a TP group, run in-process: collectives are the identity."""

    @property
    def distributed(self) -> bool:
        return False


def _rank_engines(artifacts, tmp_path, world: int) -> list[SwapEngine]:
    out = []
    for r in range(world):
        b = load_base(artifacts.base, [3, 4], r, world, torch.device("cpu"))
        eng = SwapEngine(b, SoloComm(r, world), torch.device("cpu"), work_root=tmp_path)
        eng.load(artifacts.a)
        out.append(eng)
    return out


def _pieces(engines) -> dict:
    pieces = {}
    for L in (3, 4):
        per_rank = [e.local_weights(L) for e in engines]
        for key in per_rank[0]:
            n = len(per_rank[0][key])
            pieces[(L, *key)] = [[pr[key][s] for pr in per_rank] for s in range(n)]
    return pieces


def test_rank_slices_concatenate_and_off_by_one_tile_fails(
    artifacts, tmp_path, monkeypatch
) -> None:
    full = cold.build(artifacts.base, artifacts.a, [3, 4], torch.device("cpu"))
    good = concat_check(_pieces(_rank_engines(artifacts, tmp_path, 2)), full, 2)
    assert good.passed is True, good.detail

    real = base_mod.cut_field

    def off_by_one_tile(proj, fld, t, first, last):
        if first and proj == "gate_proj" and fld == "trellis":  # BUG: one tile early
            return t[:, first // 16 - 1 : last // 16 - 1].contiguous()
        return real(proj, fld, t, first, last)

    monkeypatch.setattr(base_mod, "cut_field", off_by_one_tile)
    bad = concat_check(_pieces(_rank_engines(artifacts, tmp_path, 2)), full, 2)
    assert bad.passed is False
    assert "gate_proj base" in bad.first_difference["where"]


def test_tp_tolerance_check_passes_and_fails() -> None:
    g = torch.Generator().manual_seed(0)
    y = torch.randn(4, 8, generator=g).half()
    near = (y.float() + 1e-4).half()
    outs = {3: (y, y.float().unsqueeze(0))}
    ok = tp_tolerance_check({3: (near, near.float().unsqueeze(0))}, outs, 2)
    assert ok.passed is True and ok.max_abs > 0
    far = y.clone()
    far[1, 2] += 1.0
    bad = tp_tolerance_check({3: (far, y.float().unsqueeze(0))}, outs, 2)
    assert bad.passed is False and bad.first_difference["index"] == [1, 2]


def test_wrong_stage_k_in_the_tables_fails_hot_equals_cold(artifacts, monkeypatch) -> None:
    def edit(tables):
        tables[4].bits[0] += 1  # the table says K+1; the stage trellis holds K

    _wrap_tables(monkeypatch, edit)
    c = checks(verify(artifacts))["hot-load-equals-cold"]
    assert c.passed is False
    assert c.first_difference["where"].startswith("layer 4 ")
    assert c.first_difference["where"].endswith(" K")


def test_progress_writes_one_line_per_layer_off_a_terminal(artifacts, capsys) -> None:
    report = verify(artifacts, progress=True)
    assert report.passed
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("verify-swap:")]
    assert [x.split()[2] for x in lines] == ["3", "4"]
    assert all(" s (decode base " in x and x.endswith(" s so far") for x in lines)


def test_memory_estimate_refuses_with_vs001_and_a_larger_budget_runs(artifacts) -> None:
    import pytest

    from exl3tool.runtime.budget import ResourceRefused, parse_size

    with pytest.raises(ResourceRefused) as exc:
        verify(artifacts, max_memory=parse_size("64M"))
    assert exc.value.exit_code == 3 and str(exc.value).startswith("VS001 ")
    assert verify(artifacts, max_memory=parse_size("8G")).passed
    assert parse_size("1.5g") == 3 << 29 and parse_size("512M") == 512 << 20
    with pytest.raises(Exception, match="--max-memory"):
        parse_size("lots")
