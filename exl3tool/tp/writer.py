"""Write a slicing plan: per-rank directories or the legacy rank-sliced set, atomically.

`--layout per-rank` (default): `OUT/rank-{r}/model-rank-{r}-part-{p}.safetensors` holding rank r's
slice of every tensor under its original name, an index and the configs per rank.
`--layout rank-sliced`: one set of shards with `.rank{r}.` expert names and the legacy
`hybrid_tr3_tail` (docs/formats/r7.md §7.1). Both get `OUT/exl3tool-slices.json`
(schemas/exl3tool-slices-1.schema.json). Nothing appears at OUT unless everything (and, with
`verify`, the reassembly proof) succeeded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exl3tool import __version__
from exl3tool.formats.checkpoint import INDEX_NAME, Checkpoint
from exl3tool.formats.detect import Kind
from exl3tool.identity.engine import hash_files
from exl3tool.io.atomic import atomic_dir
from exl3tool.rules.errors import Exl3ToolError
from exl3tool.rules.registry import Findings
from exl3tool.tp import configs
from exl3tool.tp.configs import MANIFEST_NAME, dump_json
from exl3tool.tp.slices import SlicePlan, TensorSlice
from exl3tool.tp.stream import Part, split_parts, write_streams

SCHEMA = "exl3tool-slices/1"
DEFAULT_MAX_SHARD = 5 << 30
IDENTITY_ALGO = "blake3"
FILE_ALGOS = ("blake3",)  # per-file digests by default; `sha256=True` adds sha256


class SliceFailed(Exl3ToolError):
    """Writing or verifying the slices found errors (findings attached); nothing was published."""

    exit_code = 1

    def __init__(self, findings: Findings, what: str) -> None:
        self.findings = findings
        first = next(iter(findings.errors()), None)
        detail = (
            f": {first.code} {first.location.tensor or first.location.file or ''} {first.message}"
        )
        super().__init__(f"{what}{detail if first else ''}")


@dataclass
class WriteResult:
    out: Path
    manifest: dict[str, Any]
    parts: list[Part] = field(default_factory=list)


def rank_dir(r: int) -> str:
    return f"rank-{r}"


def per_rank_streams(plan: SlicePlan, max_size: int) -> list[list[Part]]:
    return [
        split_parts(
            rp.slices,
            max_size,
            lambda p, r=rp.rank: f"{rank_dir(r)}/model-rank-{r}-part-{p}.safetensors",
        )
        for rp in plan.ranks
    ]


def rank_sliced_stream(plan: SlicePlan, max_size: int) -> list[Part]:
    """One stream: in source order, each source tensor's targets for rank 0, 1, ..."""
    by_source: dict[str, list[TensorSlice]] = {}
    for rp in plan.ranks:
        for s in rp.slices:
            by_source.setdefault(s.source, []).append(s)
    merged = [s for name in plan.source_order for s in by_source.get(name, ())]
    parts = split_parts(merged, max_size, str)
    n = len(parts)
    for i, p in enumerate(parts):
        p.path = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
    return parts


def _file_records(
    root: Path, rels: list[str], parts: dict[str, Part], algos: tuple[str, ...], draft: _Draft
) -> list[dict[str, Any]]:
    """size and digests (`algos`) per output file: the rest hashed now, each part's filled in
    by `draft` once the pass has written (and hashed) it."""
    rest = [root / r for r in rels if r not in parts]
    digests = {a: hash_files(rest, a) if rest else {} for a in algos}
    out = []
    for rel in sorted(rels):
        p = parts.get(rel)
        if p is not None:
            rec: dict[str, Any] = {"path": rel}
            draft.slot(rec, "size", lambda p=p: p.size)
            for a in algos:
                draft.slot(rec, a, lambda p=p, a=a: getattr(p, a))
            out.append(rec)
        else:
            path = root / rel
            rec = {"path": rel, "size": path.stat().st_size}
            out.append({**rec, **{a: digests[a][path] for a in algos}})
    return out


class _Draft:
    """The manifest rendered while the pass runs, each value the pass produces (part sizes and
    digests, the identity root) held by a placeholder string of its own. `fill` sets the
    values and swaps each placeholder's JSON for the value's: both are scalars, which
    `pretty_json` renders with the same inline encoder wherever they stand, so the bytes equal
    a rendering of the filled manifest. A placeholder not found exactly once (the source path
    would have to contain one) has the filled manifest rendered again."""

    def __init__(self) -> None:
        self._salt = os.urandom(16).hex()
        self._slots: dict[str, tuple[dict[str, Any], str, Callable[[], Any]]] = {}

    def slot(self, holder: dict[str, Any], key: str, value: Callable[[], Any]) -> None:
        token = f"exl3tool-pending-{self._salt}-{len(self._slots)}"
        holder[key] = token
        self._slots[token] = (holder, key, value)

    def fill(self, manifest: dict[str, Any], text: bytes) -> bytes:
        """`text` (dump_json of `manifest` with the placeholders) with the values in; the
        manifest's placeholders are replaced by them too."""
        for holder, key, value in self._slots.values():
            holder[key] = value()
        for token, (holder, key, _value) in self._slots.items():
            old = json.dumps(token).encode()
            if text.count(old) != 1:
                return dump_json(manifest, depth=4)
            text = text.replace(old, json.dumps(holder[key], ensure_ascii=False).encode())
        return text


def _side_files(
    plan: SlicePlan, ckpt: Checkpoint, streams: list[list[Part]], tmp: Path
) -> tuple[list[str], dict[tuple[int, str], str]]:
    """Write the indexes and configs; their paths, and each (rank, tensor)'s part."""
    rels: list[str] = []
    file_of: dict[tuple[int, str], str] = {}
    if plan.layout == "per-rank":
        for r, stream in enumerate(streams):
            d = rank_dir(r)
            for p in stream:
                for s in p.slices:
                    file_of[(r, s.target_name)] = p.path
            (tmp / d).mkdir(parents=True, exist_ok=True)
            (tmp / d / INDEX_NAME).write_bytes(configs.index_json(stream, f"{d}/"))
            rels.append(f"{d}/{INDEX_NAME}")
            names = configs.write_rank_configs(ckpt, tmp / d, plan.ranks[r].slices)
            rels += [f"{d}/{n}" for n in names]
    else:
        where = {s.target_name: p.path for p in streams[0] for s in p.slices}
        for rp in plan.ranks:
            for s in rp.slices:
                file_of[(rp.rank, s.target_name)] = where[s.target_name]
        (tmp / INDEX_NAME).write_bytes(configs.index_json(streams[0]))
        rels.append(INDEX_NAME)
        rels += configs.write_rank_sliced_configs(ckpt, Kind(plan.kind), plan.tp, tmp)
    return rels, file_of


def _entry(s: TensorSlice, file: str) -> dict[str, Any]:
    """A slice's manifest entry: its `to_json()` and the file that holds it."""
    entry = s.to_json()
    entry["file"] = file
    return entry


def build_manifest(
    plan: SlicePlan,
    ckpt: Checkpoint,
    source: Path,
    files: list[dict[str, Any]],
    file_of: dict[tuple[int, str], str],
    max_shard_size: int,
    identity_root: str | None,
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "tool_version": __version__,
        "tp": plan.tp,
        "mode": plan.mode,
        "layout": plan.layout,
        "max_shard_size": max_shard_size,
        "source": {
            "path": str(Path(source).absolute()),
            "kind": plan.kind,
            "identity": {"algorithm": IDENTITY_ALGO, "root": identity_root},
            "files": [
                {"path": label, "size": st.file_size} for label, st in sorted(ckpt.shards.items())
            ],
        },
        "files": files,
        "ranks": [
            {
                "rank": rp.rank,
                "dir": rank_dir(rp.rank) if plan.layout == "per-rank" else ".",
                "bytes": rp.nbytes,
                "tensors": {
                    s.target_name: _entry(s, file_of[(rp.rank, s.target_name)]) for s in rp.slices
                },
            }
            for rp in plan.ranks
        ],
        "reported": [{"tensor": r.tensor, "reason": r.reason} for r in plan.reported],
    }


def source_identity_root(ckpt: Checkpoint, threads: int | None = None) -> str | None:
    """The source's logical blake3 identity root (exl3tool/identity/fast.py), in its own pass."""
    from exl3tool.identity.fast import compute_identity

    return compute_identity(ckpt, algo="blake3", threads=threads, compat=False).root or None


class _SourceIdentity:
    """The source identity taken during the slicing pass: each logical tensor that is one whole
    source tensor (and each replicated copy) is hashed from the pages the copy reads anyway;
    the rest (slices of a rank-sliced source, reassembled) is hashed afterwards."""

    def __init__(self, ckpt: Checkpoint) -> None:
        from exl3tool.identity.fast import identity_jobs
        from exl3tool.identity.logical import build_plan

        self.plan = build_plan(ckpt)
        by_span = {
            (ref.shard.path, *ref.shard.span(name)): name for name, ref in ckpt.tensors.items()
        }
        self.whole: dict[Any, str] = {}  # job key -> source tensor
        self.rest: list[tuple[Any, Any]] = []
        for key, segs in identity_jobs(self.plan):
            name = (
                by_span.get((segs[0].path, segs[0].start, segs[0].end)) if len(segs) == 1 else None
            )
            if name is None:
                self.rest.append((key, segs))
            else:
                self.whole[key] = name

    @property
    def tensors(self) -> set[str]:
        return set(self.whole.values())

    def root(self, digests: dict[str, str], threads: int | None) -> str | None:
        from exl3tool.identity.engine import hash_segments
        from exl3tool.identity.fast import identity_from_digests

        got: dict[Any, str] = {key: digests[name] for key, name in self.whole.items()}
        if self.rest:
            got.update(hash_segments(self.rest, IDENTITY_ALGO, threads))
        return identity_from_digests(self.plan, got, IDENTITY_ALGO).root or None


def write_plan(
    plan: SlicePlan,
    ckpt: Checkpoint,
    source: Path,
    out: Path,
    *,
    max_shard_size: int = DEFAULT_MAX_SHARD,
    force: bool = False,
    verify: bool = False,
    threads: int | None = None,
    progress: Any = None,
    identity: bool = True,
    sha256: bool = False,
) -> WriteResult:
    """Stream the plan's slices into OUT (atomic); with `verify`, prove the reassembly first.

    The source identity root is computed in the same pass as the copy (`identity`); per-file
    digests are blake3, plus sha256 with `sha256` (it costs about three times blake3).
    """
    if max_shard_size < 1:
        raise ValueError("max shard size must be positive")
    algos = ("sha256", *FILE_ALGOS) if sha256 else FILE_ALGOS
    src_id = _SourceIdentity(ckpt) if identity else None
    source = ckpt.root / ckpt.single_file if ckpt.single_file else ckpt.root
    with atomic_dir(out, force=force, inputs=(source,)) as tmp:
        if plan.layout == "per-rank":
            streams = per_rank_streams(plan, max_shard_size)
        else:
            streams = [rank_sliced_stream(plan, max_shard_size)]
        parts = {p.path: p for stream in streams for p in stream}
        draft = _Draft()
        drafted: list[Any] = []  # the manifest and its bytes, placeholders in
        root_digest: list[str | None] = [None]

        def meanwhile() -> None:
            """The indexes, configs and manifest, while the pass runs in other threads."""
            rels, file_of = _side_files(plan, ckpt, streams, tmp)
            files = _file_records(tmp, [*parts, *rels], parts, algos, draft)
            manifest = build_manifest(plan, ckpt, source, files, file_of, max_shard_size, None)
            if src_id is not None:
                draft.slot(manifest["source"]["identity"], "root", lambda: root_digest[0])
            drafted[:] = [manifest, dump_json(manifest, depth=4)]  # a line per tensor

        # a source shard that shrank or changed during the pass raises InputChanged (exit 3)
        passed = write_streams(
            ckpt,
            plan.source_order,
            streams,
            tmp,
            threads=threads,
            progress=progress,
            algos=algos,
            source_algo=IDENTITY_ALGO,
            source_tensors=src_id.tensors if src_id is not None else None,
            meanwhile=meanwhile,
        )
        if src_id is not None:
            root_digest[0] = src_id.root(passed.digests, threads)
        manifest, text = drafted
        (tmp / MANIFEST_NAME).write_bytes(draft.fill(manifest, text))
        if verify:
            from exl3tool.tp.verify import verify_slices

            findings = verify_slices(tmp, source=source, threads=threads)
            if findings.has_errors():
                raise SliceFailed(findings, "verification of the slices failed")
    return WriteResult(Path(out), manifest, [p for s in streams for p in s])
