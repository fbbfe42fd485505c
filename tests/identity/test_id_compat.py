"""The MSRT base compatibility identity (docs/formats/msrt.md §6)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from identity_fixtures import expert_tensors, rank_slice, write_checkpoint, write_shard

from exl3tool.formats.checkpoint import load_checkpoint
from exl3tool.formats.exl3 import MCG_MARKER
from exl3tool.formats.names import PROJECTIONS
from exl3tool.identity.compat import compat_identity, layer_digest, root_digest, tensor_record
from exl3tool.rules.registry import Findings

LAYER_3 = "3518095ac1ae5fd32f775862acce5daa5f0c8a4c96fb308b45df4e95da377d58"
ROOT = "cbb1f591900487ad16f33fd2d33174beb09d55d301f164aff37ed829f712ce01"


def _vector_tensors() -> dict[str, np.ndarray]:
    out = {}
    for proj in PROJECTIONS:
        p = f"model.layers.3.mlp.experts.0.{proj}.rank0"
        out[f"{p}.trellis"] = np.zeros((8, 8, 32), np.int16)
        out[f"{p}.suh"] = np.zeros(128, np.float16)
        out[f"{p}.svh"] = np.zeros(128, np.float16)
        out[f"{p}.mcg"] = np.array(MCG_MARKER, np.int32)
    return out


def test_vector_from_records() -> None:
    z4096 = hashlib.sha256(bytes(4096)).hexdigest()
    z256 = hashlib.sha256(bytes(256)).hexdigest()
    mcg = hashlib.sha256(bytes.fromhex("ed1faccb")).hexdigest()
    assert mcg == "ade4fb124dda0f3537386cdd4a3cdcea3a223d386e506a4be89394bb33ee13fe"
    recs = []
    for proj in reversed(PROJECTIONS):  # order must not matter
        p = f"model.layers.3.mlp.experts.0.{proj}"
        recs += [
            tensor_record(f"{p}.trellis", "I16", (8, 8, 32), z4096),
            tensor_record(f"{p}.suh", "F16", (128,), z256),
            tensor_record(f"{p}.svh", "F16", (128,), z256),
            tensor_record(f"{p}.mcg", "I32", (), mcg),
        ]
    assert layer_digest(3, 2, recs) == LAYER_3
    assert root_digest(2, {3: LAYER_3}) == ROOT
    assert root_digest(2, {"3": LAYER_3}) == ROOT


def test_vector_from_checkpoint(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, _vector_tensors())
    ckpt = load_checkpoint(tmp_path, Findings())
    ident = compat_identity(ckpt)
    assert ident.problems == []
    assert (ident.k, ident.layers, ident.root) == (2, {"3": LAYER_3}, ROOT)


def test_layer_keys_sort_as_strings() -> None:
    a = root_digest(3, {10: "a" * 64, 3: "b" * 64})
    b = root_digest(3, {"3": "b" * 64, "10": "a" * 64})
    assert a == b


def test_rank0_plain_and_rank_sliced_agree(tmp_path: Path) -> None:
    full = expert_tensors([1, 10], 2, k=3)
    base = expert_tensors([1, 10], 2, k=3, rank0=True)
    write_checkpoint(tmp_path / "plain", full, shards=2)
    write_checkpoint(tmp_path / "base", base, shards=3)
    write_checkpoint(tmp_path / "sliced", rank_slice(full, 2), shards=2)
    ids = [
        compat_identity(load_checkpoint(tmp_path / d, Findings()))
        for d in ("plain", "base", "sliced")
    ]
    assert all(i.problems == [] for i in ids), [i.problems for i in ids]
    assert ids[0].k == 3 and set(ids[0].layers) == {"1", "10"}
    assert ids[0].root == ids[1].root == ids[2].root
    assert ids[0].layers == ids[1].layers == ids[2].layers


def test_problems_instead_of_crash(tmp_path: Path) -> None:
    t = _vector_tensors()
    del t["model.layers.3.mlp.experts.0.up_proj.rank0.svh"]
    t["model.layers.3.mlp.experts.0.down_proj.rank0.mcg"] = np.array(7, np.int32)
    write_shard(tmp_path / "m.safetensors", t)
    ident = compat_identity(load_checkpoint(tmp_path / "m.safetensors", Findings()))
    text = " ".join(p.message for p in ident.problems)
    assert "lacks svh" in text and "mcg marker" in text
    assert ident.root is not None and ident.layers["3"] != LAYER_3


def test_mixed_k_has_no_root(tmp_path: Path) -> None:
    t = expert_tensors([0], 1, k=2)
    t["model.layers.0.mlp.experts.0.up_proj.trellis"] = np.zeros((8, 16, 64), np.int16)
    write_shard(tmp_path / "m.safetensors", t)
    ident = compat_identity(load_checkpoint(tmp_path / "m.safetensors", Findings()))
    assert ident.k is None and ident.root is None
    assert any("one K" in p.message for p in ident.problems)
    forced = compat_identity(load_checkpoint(tmp_path / "m.safetensors", Findings()), k=2)
    assert forced.k == 2 and forced.root is not None


def test_no_experts(tmp_path: Path) -> None:
    write_shard(tmp_path / "m.safetensors", {"w": np.zeros(4, np.float32)})
    ident = compat_identity(load_checkpoint(tmp_path / "m.safetensors", Findings()))
    assert ident.root is None and ident.problems


def test_cached_identity_is_computed_once_for_concurrent_callers(
    tmp_path: Path, monkeypatch
) -> None:
    import threading
    import time

    from exl3tool.identity import compat

    write_checkpoint(tmp_path, _vector_tensors())
    ckpt = load_checkpoint(tmp_path, Findings())
    calls = []
    real = compat.compat_identity

    def slow(*args, **kwargs):
        calls.append(1)
        time.sleep(0.2)  # long enough for every thread to ask while it runs
        return real(*args, **kwargs)

    monkeypatch.setattr(compat, "compat_identity", slow)
    monkeypatch.setattr(compat, "_BASE_CACHE", {})
    out = []
    threads = [
        threading.Thread(target=lambda: out.append(compat.cached_compat_identity(ckpt, k=2)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(out) == 4 and all(o is out[0] for o in out)


def _advanced() -> tuple[list[int], object]:
    seen: list[int] = []

    class Bar:
        def advance(self, n: int = 1) -> None:
            seen.append(n)

    return seen, Bar()


def _passes(monkeypatch) -> list[str]:
    """Every hashing pass of the engine from now on: its algorithm, `+second` when fused."""
    from exl3tool.identity import engine

    passes: list[str] = []
    real = engine._hash

    def counted(jobs, algo, threads, progress, expected, also=None, known=None):
        passes.append(algo if also is None else f"{algo}+{also[0]}")
        return real(jobs, algo, threads, progress, expected, also, known)

    monkeypatch.setattr(engine, "_hash", counted)
    return passes


def test_the_identity_pass_gives_the_block_its_sha256(tmp_path: Path, monkeypatch) -> None:
    """`compute_identity` hashes the block's tensors with sha256 in its own blake3 pass: the
    block equals the one computed on its own, the vector included, no second pass is made,
    and a progress bar ends at its planned total."""
    from exl3tool.identity import fast
    from exl3tool.identity.logical import build_plan

    t = {**_vector_tensors(), "model.norm.weight": np.ones(8, np.float16)}
    write_checkpoint(tmp_path / "v", t)
    write_checkpoint(tmp_path / "mix", expert_tensors([0, 2], 3, k=4), shards=2)
    for d in ("v", "mix"):
        ckpt = load_checkpoint(tmp_path / d, Findings())
        alone = compat_identity(ckpt)
        assert alone.root is not None and alone.problems == []
        passes = _passes(monkeypatch)
        seen, bar = _advanced()
        ident = fast.compute_identity(ckpt, algo="blake3", progress=bar)
        monkeypatch.undo()
        assert passes == ["blake3+sha256"]
        c = ident.compatibility
        assert c is not None and (c.k, c.layers, c.root) == (alone.k, alone.layers, alone.root)
        assert c.problems == []
        assert sum(seen) == fast.planned_bytes(build_plan(ckpt), "blake3")
        plain = fast.compute_identity(ckpt, algo="blake3", compat=False)
        assert (ident.tensors, ident.root) == (plain.tensors, plain.root)
        if d == "v":
            assert (c.layers, c.root) == ({"3": LAYER_3}, ROOT)


def test_a_block_that_would_be_dropped_is_not_hashed(tmp_path: Path, monkeypatch) -> None:
    """Without `compat=True`, a block with problems found before hashing is dropped: its
    tensors are not hashed with sha256 at all; with it, the block is kept with its problems."""
    from exl3tool.identity import fast

    t = _vector_tensors()
    del t["model.layers.3.mlp.experts.0.up_proj.rank0.svh"]
    write_shard(tmp_path / "m.safetensors", t)
    ckpt = load_checkpoint(tmp_path / "m.safetensors", Findings())
    passes = _passes(monkeypatch)
    assert fast.compute_identity(ckpt, algo="blake3").compatibility is None
    assert passes == ["blake3"]
    kept = fast.compute_identity(ckpt, algo="blake3", compat=True).compatibility
    assert passes == ["blake3", "blake3+sha256"]
    assert kept is not None and any("lacks svh" in p.message for p in kept.problems)
    monkeypatch.undo()
    assert kept.root == compat_identity(ckpt).root
