"""The streaming writer: the source identity taken during the copy equals a separate identity
pass; outputs do not depend on threads or batch sizes; per-file sha256 only when asked."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import tp_fixtures as fx

from exl3tool.identity.fast import compute_identity
from exl3tool.tp import stream
from exl3tool.tp.run import SliceOptions, slice_artifact, verify_output


def _files(out: Path) -> dict[str, bytes]:
    return {
        p.relative_to(out).as_posix(): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name != "exl3tool-slices.json"
    }


@pytest.mark.parametrize("src", ["r7", "base", "exl3"])
def test_in_pass_identity_equals_identity_pass(
    sources: dict[str, Path], tmp_path: Path, src: str
) -> None:
    slice_artifact(sources[src], tmp_path / "o", SliceOptions(2, "expert"))
    doc = json.loads((tmp_path / "o" / "exl3tool-slices.json").read_text())
    want = compute_identity(fx.load(sources[src]), algo="blake3", compat=False).root
    assert doc["source"]["identity"] == {"algorithm": "blake3", "root": want}


def test_source_identity_of_a_rank_sliced_layout(sources: dict[str, Path], tmp_path: Path) -> None:
    """Logical tensors reassembled from several rank slices are not whole source tensors: they
    are hashed after the pass, and the root still equals the identity pass."""
    from exl3tool.identity.engine import hash_tensors
    from exl3tool.tp.writer import _SourceIdentity

    mid = tmp_path / "mid"
    slice_artifact(sources["r7"], mid, SliceOptions(2, layout="rank-sliced"))
    ckpt = fx.load(mid)
    sid = _SourceIdentity(ckpt)
    assert sid.rest and sid.whole
    whole = hash_tensors(
        ((n, ckpt.tensors[n].shard, ckpt.tensors[n].info) for n in sid.tensors), "blake3"
    )
    want = compute_identity(ckpt, algo="blake3", compat=False).root
    assert sid.root(whole, threads=2) == want


@pytest.mark.parametrize(("layout", "block"), [("per-rank", 4096), ("rank-sliced", 1 << 15)])
def test_threads_and_blocks_do_not_change_bytes(
    sources: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    layout: str,
    block: int,
) -> None:
    """Small blocks (tensors cut into row blocks; rows over 4 KiB read by each stream on its
    own), two pooled buffers (many hand-offs between the threads) give the same files."""
    ref = tmp_path / "ref"
    slice_artifact(sources["r7"], ref, SliceOptions(4, threads=1, layout=layout))
    monkeypatch.setattr(stream, "chunk_size", lambda consumers: block)
    monkeypatch.setattr(stream, "DEPTH", 2)
    monkeypatch.setattr(stream, "WRITEBACK", 8192)
    out = tmp_path / "mt"
    slice_artifact(sources["r7"], out, SliceOptions(4, threads=4, verify=True, layout=layout))
    assert _files(out) == _files(ref)
    a, b = (json.loads((d / "exl3tool-slices.json").read_text()) for d in (ref, out))
    assert a["files"] == b["files"] and a["source"]["identity"] == b["source"]["identity"]


def test_many_cores_split_the_hashing_without_changing_a_digest(
    sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 cores at TP 2: 7 consumers share the source identity, each output stream hashes with
    a 4-thread blake3 hasher; roots and file digests equal the one-thread run and the files."""
    import blake3

    assert stream._share_cores(16, 2, True) == stream._CoreShare(16, 7, 4)
    monkeypatch.setattr(stream, "chunk_size", lambda consumers: 1 << 16)  # several blocks
    ref, out = tmp_path / "ref", tmp_path / "mt"
    slice_artifact(sources["r7"], ref, SliceOptions(2, threads=1))
    slice_artifact(sources["r7"], out, SliceOptions(2, threads=16))
    assert _files(out) == _files(ref)
    a, b = (json.loads((d / "exl3tool-slices.json").read_text()) for d in (ref, out))
    assert a["files"] == b["files"] and a["source"]["identity"] == b["source"]["identity"]
    for r in b["files"]:
        assert r["blake3"] == blake3.blake3((out / r["path"]).read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("cores", "streams", "want"),
    [
        (1, 2, (1, 1, 1)),
        (2, 2, (2, 1, 1)),
        (2, 1, (2, 1, 1)),
        (8, 8, (8, 1, 1)),
        (16, 4, (16, 6, 2)),
    ],
)
def test_core_share(cores: int, streams: int, want: tuple[int, int, int]) -> None:
    assert stream._share_cores(cores, streams, True) == stream._CoreShare(*want)
    assert stream._share_cores(cores, streams, False).source_hashers == 0


def test_sha256_only_when_asked(sources: dict[str, Path], tmp_path: Path) -> None:
    plain, full = tmp_path / "plain", tmp_path / "full"
    slice_artifact(sources["r7"], plain, SliceOptions(2))
    slice_artifact(sources["r7"], full, SliceOptions(2, sha256=True))
    recs = json.loads((plain / "exl3tool-slices.json").read_text())["files"]
    assert recs and all("sha256" not in r and len(r["blake3"]) == 64 for r in recs)
    for r in json.loads((full / "exl3tool-slices.json").read_text())["files"]:
        assert r["sha256"] == hashlib.sha256((full / r["path"]).read_bytes()).hexdigest()
    assert list(verify_output(plain)) == [] and list(verify_output(full)) == []


def test_recorded_sha256_is_checked(sources: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "o"
    slice_artifact(sources["r7"], out, SliceOptions(2, sha256=True))
    path = out / "exl3tool-slices.json"
    doc = json.loads(path.read_text())
    doc["files"][0]["sha256"] = "0" * 64
    path.write_text(json.dumps(doc))
    assert verify_output(out).codes() == {"TP006"}
