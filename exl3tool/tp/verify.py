"""Prove a slice output: every file as pinned, every source tensor reassembled byte for byte,
and the reassembly's logical identity equal to the source's (exl3tool/identity/fast.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from exl3tool.formats.checkpoint import Checkpoint, load_checkpoint
from exl3tool.identity.engine import Segment, hash_files, hash_segments
from exl3tool.io.jsonfile import read_json
from exl3tool.io.paths import relative_path_problem
from exl3tool.io.safetensors import SafetensorsFile, read_header
from exl3tool.rules import tp as tp_rules
from exl3tool.rules.errors import InputError
from exl3tool.rules.registry import Findings
from exl3tool.tp.configs import MANIFEST_NAME
from exl3tool.tp.slices import TensorSlice
from exl3tool.tp.stream import CHUNK, ChunkBuffers, SourceFiles, slice_chunks

SCHEMA_FILE = "exl3tool-slices-1.schema.json"


def _schema_errors(doc: Any) -> list[tuple[str, str]]:
    from exl3tool.io.schemas import schema_errors

    return [(ptr, msg) for ptr, msg, _ in schema_errors(SCHEMA_FILE, doc)]


def read_manifest(out: Path, findings: Findings) -> dict[str, Any] | None:
    path = Path(out) / MANIFEST_NAME
    if not path.is_file():
        findings.add(
            tp_rules.TP_MANIFEST, f"{MANIFEST_NAME} not found in {out}", file=MANIFEST_NAME
        )
        return None
    doc = read_json(path, findings, MANIFEST_NAME)
    if doc is None:
        findings.add(tp_rules.TP_MANIFEST, "unreadable JSON", file=MANIFEST_NAME)
        return None
    errors = _schema_errors(doc)
    for ptr, msg in errors:
        findings.add(tp_rules.TP_MANIFEST, msg, file=MANIFEST_NAME, pointer=ptr)
    return None if errors else doc


def _check_files(out: Path, files: list[dict], findings: Findings, threads: int | None) -> set[str]:
    """Size, blake3 (and sha256 where recorded) of every listed file; returns the paths present
    with the right size (a digest mismatch is reported, and the tensor comparison then names
    what changed)."""
    ok: list[str] = []
    for rec in files:
        rel = rec["path"]
        problem = relative_path_problem(rel)
        path = out / rel
        if problem:
            findings.add(tp_rules.TP_FILE_DIGEST, f"path {rel!r} {problem}", file=MANIFEST_NAME)
        elif not path.is_file():  # a link to a file is that file (HF cache snapshots)
            findings.add(tp_rules.TP_FILE_DIGEST, "missing", file=rel)
        elif path.stat().st_size != rec["size"]:
            findings.add(
                tp_rules.TP_FILE_DIGEST,
                f"{path.stat().st_size} bytes, manifest says {rec['size']}",
                file=rel,
            )
        else:
            ok.append(rel)
    by_rel = {r["path"]: r for r in files}
    digests = {
        a: hash_files([out / r for r in ok if a in by_rel[r]], a, threads)
        for a in ("sha256", "blake3")  # sha256 only where recorded (`slice --sha256`)
    }
    for rel in ok:
        rec = by_rel[rel]
        bad = [a for a in ("sha256", "blake3") if a in rec and digests[a][out / rel] != rec[a]]
        if bad:
            findings.add(tp_rules.TP_FILE_DIGEST, f"{'/'.join(bad)} differs", file=rel)
    return set(ok)


class _Comparer:
    """Source and output files read with pread (tp.stream.SourceFiles) into bounded buffers."""

    def __init__(self) -> None:
        self.files = SourceFiles()
        self.bufs = ChunkBuffers()
        self.dst = np.empty(CHUNK, dtype=np.uint8)

    def same(self, src: SafetensorsFile, s: TensorSlice, dst: SafetensorsFile, name: str) -> bool:
        """Bytes of `s` in the source == the target tensor's bytes, compared in bounded chunks."""
        a0, _ = src.span(s.source)
        b0, b1 = dst.span(name)
        lay = s.layout
        if b1 - b0 != lay.nbytes:
            return False
        sf, df = self.files.get(src.path, src.stamp), self.files.get(dst.path, dst.stamp)
        pos = b0
        for chunk in slice_chunks(sf, a0, lay, self.bufs):
            got = df.read_into(memoryview(self.dst)[: len(chunk)], pos)
            if not np.array_equal(np.frombuffer(chunk, np.uint8), np.frombuffer(got, np.uint8)):
                return False
            pos += len(chunk)
        return True


def _covers(records: list[TensorSlice], shape: tuple[int, ...]) -> str | None:
    """None when the records reassemble the tensor exactly, else why not."""
    if any(r.axis is None for r in records):
        return None
    axes = {r.axis for r in records}
    if len(axes) != 1:
        return f"sliced on several axes {sorted(axes)}"
    axis = axes.pop()
    pos = 0
    for r in sorted(records, key=lambda r: r.start):
        if r.start != pos:
            return f"axis {axis}: gap or overlap at {pos} (next slice starts at {r.start})"
        pos = r.stop
    if pos != shape[axis]:
        return f"axis {axis}: slices end at {pos}, size is {shape[axis]}"
    return None


def _reassembly_segments(
    records: list[tuple[TensorSlice, SafetensorsFile, str]], shape: tuple[int, ...]
) -> tuple[Segment, ...]:
    """Byte segments of the output files whose concatenation is the logical tensor."""
    whole = [(f, n) for s, f, n in records if s.axis is None]
    if whole:
        f, n = whole[0]
        return (Segment(f.path, *f.span(n)),)
    recs = sorted(records, key=lambda r: r[0].start)
    axis = recs[0][0].axis
    outer = math.prod(shape[:axis])
    if axis == 0 or outer <= 1:
        return tuple(Segment(f.path, *f.span(n)) for _, f, n in recs)
    segs: list[Segment] = []
    spans = [(f.path, f.span(n)[0], s.nbytes // outer) for s, f, n in recs]
    for o in range(outer):
        for path, begin, row in spans:
            segs.append(Segment(path, begin + o * row, begin + (o + 1) * row))
    return tuple(segs)


def _identity_check(
    src: Checkpoint,
    groups: dict[str, list[tuple[TensorSlice, SafetensorsFile, str]]],
    expected: str | None,
    findings: Findings,
    threads: int | None,
) -> None:
    from exl3tool.identity.fast import TensorDigest, fold
    from exl3tool.identity.logical import build_plan

    logical = {}
    for lname, lt in build_plan(src).tensors.items():
        if len(lt.sources) == 1:
            logical[lt.sources[0].name] = lname
    jobs = [
        (name, _reassembly_segments(recs, tuple(src.tensors[name].info.shape)))
        for name, recs in groups.items()
    ]
    digests = hash_segments(jobs, "blake3", threads)
    tensors = {}
    for name in groups:
        info = src.tensors[name].info
        tensors[logical.get(name, name)] = TensorDigest(
            info.dtype, tuple(info.shape), digests[name]
        )
    _layers, root = fold("blake3", tensors)
    if expected and root != expected:
        findings.add(
            tp_rules.TP_IDENTITY,
            f"reassembled root {root[:16]}…, source root {expected[:16]}…",
            file=MANIFEST_NAME,
        )


def verify_slices(
    out: Path, *, source: Path | None = None, threads: int | None = None, identity: bool = True
) -> Findings:
    """Every finding of the proof (empty = the output reassembles the source exactly)."""
    out = Path(out)
    findings = Findings()
    doc = read_manifest(out, findings)
    if doc is None:
        return findings
    good = _check_files(out, doc["files"], findings, threads)
    src_path = Path(source) if source is not None else Path(doc["source"]["path"])
    load_findings = Findings()
    src = load_checkpoint(src_path, load_findings, need_config=False)
    if load_findings.has_errors():
        for f in load_findings.errors():
            findings.add(
                tp_rules.TP_UNSUPPORTED,
                f"source: {f.code} {f.message}",
                file=f.location.file,
                tensor=f.location.tensor,
            )
        return findings
    sizes = {r["path"]: r["size"] for r in doc["source"]["files"]}
    for label, st in src.shards.items():
        if label in sizes and sizes[label] != st.file_size:
            findings.add(
                tp_rules.TP_SOURCE_CHANGED,
                f"{st.file_size} bytes, {sizes[label]} when sliced",
                file=label,
            )
    headers: dict[str, SafetensorsFile] = {}
    for rel in sorted(good):
        if rel.endswith(".safetensors"):
            hf = Findings()
            st = read_header(out / rel, hf, rel)
            if st is None or hf.has_errors():
                findings.extend(hf)
                continue
            headers[rel] = st
    claimed: set[tuple[str, str]] = set()
    groups: dict[str, list[tuple[TensorSlice, SafetensorsFile, str]]] = {}
    cmp = _Comparer()
    try:
        for rank in doc["ranks"]:
            for target, rec in rank["tensors"].items():
                st = headers.get(rec["file"])
                if st is None:
                    continue  # its file was already reported
                claimed.add((rec["file"], target))
                ref = src.tensors.get(rec["source"])
                if ref is None or target not in st.tensors:
                    where = "source" if ref is None else rec["file"]
                    findings.add(
                        tp_rules.TP_COVERAGE,
                        f"rank {rank['rank']}: {target} (from {rec['source']}) not in the {where}",
                        file=rec["file"],
                        tensor=target,
                    )
                    continue
                info = ref.info
                s = TensorSlice(
                    rec["source"], target, rec["axis"], rec["start"], rec["stop"],
                    rec["replicated"], info.dtype, tuple(info.shape),
                )  # fmt: skip
                t = st.tensors[target]
                bad_range = s.axis is not None and not (
                    0 <= s.axis < len(s.source_shape)
                    and 0 <= s.start < s.stop <= s.source_shape[s.axis]
                )
                if bad_range or (t.dtype, tuple(t.shape)) != (s.dtype, s.shape):
                    findings.add(
                        tp_rules.TP_MISMATCH,
                        f"{t.dtype}{list(t.shape)} where the source slice is "
                        f"{s.dtype}{list(s.shape) if not bad_range else '(invalid range)'}",
                        file=rec["file"],
                        tensor=target,
                    )
                    continue
                if not cmp.same(ref.shard, s, st, target):
                    findings.add(
                        tp_rules.TP_MISMATCH,
                        f"rank {rank['rank']}: bytes differ from {rec['source']} "
                        f"[{s.start}:{s.stop}] on axis {s.axis}",
                        file=rec["file"],
                        tensor=target,
                    )
                    continue
                groups.setdefault(rec["source"], []).append((s, st, target))
    finally:
        cmp.files.close()
    for rel, st in headers.items():
        for name in st.tensors:
            if (rel, name) not in claimed:
                findings.add(
                    tp_rules.TP_COVERAGE, "tensor not in the slice manifest", file=rel, tensor=name
                )
    for name, ref in src.tensors.items():
        recs = groups.get(name)
        why = (
            "no rank holds it" if not recs else _covers([r[0] for r in recs], tuple(ref.info.shape))
        )
        if why:
            findings.add(tp_rules.TP_COVERAGE, why, file=ref.file, tensor=name)
    if identity and not findings.has_errors():
        expected = doc["source"]["identity"]["root"]
        _identity_check(src, groups, expected, findings, threads)
    return findings


def require_output(out: Path) -> None:
    if not Path(out).is_dir():
        raise InputError(f"{out}: not a directory")
