"""`exl3tool identity`, `--check`, `--sha256sum` (every ID rule is triggered here or in diff)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from typer.testing import CliRunner

from exl3tool.cli.main import app
from exl3tool.io.safetensors import read_header
from exl3tool.io.st_writer import write_arrays
from exl3tool.rules.registry import Findings
from exl3tool.synth.msrt import build_base

SHARD3 = "model-layer-003.safetensors"
TRELLIS = "model.layers.3.mlp.experts.1.up_proj.rank0.trellis"


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture(scope="module")
def base_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_base(tmp_path_factory.mktemp("b") / "base", layers=(3, 4), experts=2)


@pytest.fixture
def base(tmp_path: Path, base_src: Path) -> Path:
    return Path(shutil.copytree(base_src, tmp_path / "base"))


def rewrite(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    tensors = load_file(str(path))
    edit(tensors)
    with open(path, "wb") as fh:
        write_arrays(fh, tensors)


def flip(path: Path, name: str) -> None:
    st = read_header(path, Findings())
    assert st is not None
    lo, _ = st.span(name)
    with open(path, "r+b") as fh:
        fh.seek(lo + 5)
        b = fh.read(1)
        fh.seek(lo + 5)
        fh.write(bytes([b[0] ^ 1]))


def check_json(record: Path, path: Path) -> tuple[int, dict]:
    code, out, _ = run("identity", "--check", record, path, "--format", "json")
    return code, json.loads(out)


def codes(report: dict) -> dict[str, list]:
    out: dict[str, list] = {}
    for f in report["findings"]:
        out.setdefault(f["code"], []).append(f)
    return out


def test_json_and_published_compat(base: Path, tmp_path: Path) -> None:
    import jsonschema

    code, out, err = run("identity", base, "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    schema = json.loads(
        (Path(__file__).parents[2] / "exl3tool/schemas/exl3tool-identity-1.schema.json").read_text()
    )
    jsonschema.Draft202012Validator(schema).validate(doc)
    tail = json.loads((base / "config.json").read_text())["hybrid_tr3_tail"]
    assert doc["compatibility"]["root"] == tail["compatibility_sha256"]
    assert doc["compatibility"]["layers"] == tail["compatibility_by_layer"]
    assert "model.layers.3.mlp.experts.1.up_proj.trellis" in doc["tensors"]


def test_text_and_layers(base: Path) -> None:
    code, out, _ = run("identity", base, "--layers", "4")
    assert code == 0
    assert "layer       4" in out and "layer       3" not in out
    assert run("identity", base, "--layers", "4-x")[0] == 2
    assert run("identity", base, "--algo", "md5")[0] == 2


def test_layers_that_select_nothing_are_a_usage_error(base: Path) -> None:
    """`--layers 99` of a model without layer 99 is a typo, not the identity of nothing."""
    code, out, err = run("identity", base, "--layers", "99")
    assert code == 2 and not out
    assert "--layers 99 selects no tensor" in err and "layers 3-4 and other" in err
    assert run("identity", base, "--layers", "4,99")[0] == 0  # some of it is there


def test_check_with_layers_that_select_nothing_is_a_usage_error(base: Path, tmp_path: Path) -> None:
    rec = tmp_path / "id.json"
    assert run("identity", base, "-f", "json", "-o", rec)[0] == 0
    code, _, err = run("identity", "--check", rec, base, "--layers", "99")
    assert code == 2 and "--layers 99 selects no tensor" in err


def test_check_ok_prints_one_line(base: Path, tmp_path: Path) -> None:
    rec = tmp_path / "id.json"
    assert run("identity", base, "--algo", "sha256", "-f", "json", "-o", rec)[0] == 0
    code, out, _ = run("identity", "--check", rec, base)
    assert code == 0
    assert out.count("\n") == 1 and out.startswith("identity OK")
    assert run("identity", "--check", rec, base, "--algo", "blake3")[0] == 2


def test_check_names_flipped_byte(base: Path, tmp_path: Path) -> None:
    rec = tmp_path / "id.json"
    run("identity", base, "-f", "json", "-o", rec)
    flip(base / SHARD3, TRELLIS)
    code, report = check_json(rec, base)
    assert code == 1
    c = codes(report)
    assert [f["location"]["tensor"] for f in c["ID001"]] == [TRELLIS.replace(".rank0", "")]
    assert [f["message"].split(":")[0] for f in c["ID005"]] == ["layer 3"]
    assert len(c["ID006"]) == 1
    assert c["ID010"]  # the compatibility identity moved too
    assert c["ID012"]  # and no longer matches what the base publishes


def test_missing_unexpected_and_retyped(base: Path, tmp_path: Path) -> None:
    rec = tmp_path / "id.json"
    run("identity", base, "-f", "json", "-o", rec)

    def edit(t: dict) -> None:
        del t["model.layers.4.post_attention_layernorm.weight"]
        t["model.layers.4.extra.weight"] = np.zeros(4, np.float16)
        w = t["model.layers.4.input_layernorm.weight"]
        t["model.layers.4.input_layernorm.weight"] = w.reshape(2, -1)

    rewrite(base / "model-layer-004.safetensors", edit)
    code, report = check_json(rec, base)
    c = codes(report)
    assert code == 1
    assert [f["location"]["tensor"] for f in c["ID002"]] == [
        "model.layers.4.post_attention_layernorm.weight"
    ]
    assert [f["location"]["tensor"] for f in c["ID003"]] == ["model.layers.4.extra.weight"]
    assert [f["location"]["tensor"] for f in c["ID004"]] == [
        "model.layers.4.input_layernorm.weight"
    ]
    assert "ID001" not in c  # same bytes, other shape


def test_invalid_record(base: Path, tmp_path: Path) -> None:
    rec = tmp_path / "bad.json"
    rec.write_text(json.dumps({"schema": "exl3tool-identity/1", "algorithm": "md5"}))
    code, report = check_json(rec, base)
    assert code == 1 and "ID009" in codes(report)
    assert run("identity", "--check", tmp_path / "absent.json", base)[0] == 3


def test_base_defects(base: Path) -> None:
    cfg = json.loads((base / "config.json").read_text())
    cfg["hybrid_tr3_tail"]["compatibility_sha256"] = "0" * 64
    (base / "config.json").write_text(json.dumps(cfg))
    rewrite(
        base / SHARD3,
        lambda t: t.pop("model.layers.3.mlp.experts.0.gate_proj.rank0.svh"),
    )
    code, _, err = run("identity", base)
    assert code == 1
    assert "ID011" in err and "lacks svh" in err
    assert "ID012" in err


def _sliced(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    t = {}
    for r in range(2):
        p = f"model.layers.1.mlp.experts.0.gate_proj.rank{r}"
        t[f"{p}.trellis"] = rng.integers(-100, 100, (8, 4, 32), dtype=np.int16)
        t[f"{p}.suh"] = np.ones(128, np.float16) * (1 + r)  # replicated, but differs
        t[f"{p}.svh"] = np.ones(64, np.float16)
    t["model.layers.1.mlp.experts.0.down_proj.rank0.trellis"] = np.zeros((4, 8, 32), np.int16)
    (tmp_path / "s").mkdir()
    with open(tmp_path / "s" / "model.safetensors", "wb") as fh:
        write_arrays(fh, t)
    return tmp_path / "s"


def test_replica_and_slice_problems(tmp_path: Path) -> None:
    code, _, err = run("identity", _sliced(tmp_path))
    assert code == 1
    assert "ID007" in err and "gate_proj.suh" in err
    assert "ID008" in err and "down_proj.trellis" in err


def test_sha256sum_manifest(base: Path, tmp_path: Path) -> None:
    man = tmp_path / "MANIFEST.sha256"
    assert run("identity", base, "--sha256sum", man)[0] == 0
    lines = man.read_text().splitlines()
    assert any(line.endswith("  config.json") for line in lines)
    ok = subprocess.run(["sha256sum", "-c", "--quiet", man], cwd=base, capture_output=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    flip(base / SHARD3, TRELLIS)
    bad = subprocess.run(["sha256sum", "-c", "--quiet", man], cwd=base, capture_output=True)
    assert bad.returncode == 1 and SHARD3.encode() in bad.stdout


def test_outputs_are_not_clobbered(base: Path, tmp_path: Path) -> None:
    out = tmp_path / "id.txt"
    out.write_text("keep")
    assert run("identity", base, "-o", out)[0] == 1
    assert out.read_text() == "keep"
    assert run("identity", base, "-o", out, "--force")[0] == 0
    assert out.read_text().startswith(str(base))


def test_a_broken_artifact_in_json_gives_its_findings_as_json(base: Path, tmp_path: Path) -> None:
    shard = sorted(base.glob("model-layer-*.safetensors"))[0]
    shard.unlink()  # a half-downloaded base: no identity, but a JSON reader still gets JSON
    code, out, _err = run("identity", str(base), "--format", "json")
    assert code == 1
    got = json.loads(out)
    assert got["summary"]["errors"] >= 1 and "CK003" in {f["code"] for f in got["findings"]}
    record = tmp_path / "id.json"
    code, out, _err = run("identity", str(base), "--format", "json", "-o", str(record))
    assert code == 1 and not record.exists() and out == ""  # no answer written for it


def test_a_shard_changed_before_the_manifest_pass_is_exit_3_and_no_manifest(
    base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The `--sha256sum` manifest is hashed after the identity: a shard that changed in
    between would be described by a manifest of other bytes than the identity's."""
    from exl3tool.identity import engine

    real = engine.hash_files

    def append_first(paths, *args, **kw):  # type: ignore[no-untyped-def]
        with open(base / SHARD3, "ab") as fh:
            fh.write(b"\0" * 4096)
        return real(paths, *args, **kw)

    monkeypatch.setattr(engine, "hash_files", append_first)
    sums = tmp_path / "SHA256SUMS"
    code, _, err = run("identity", base, "--sha256sum", sums)
    assert code == 3 and SHARD3 in err
    assert not sums.exists()
