"""`full` -> `rank-sharded` conversion of MSRT cartridges (docs/formats/msrt.md §8).

The one implementation: `exl3tool slice` and `exl3tool stage-cartridge` both call
`shard_cartridge`. Each trellis is split on its tile axis (gate/up axis 1, down axis 0) into W
equal parts, each scale is replicated byte-identically under every `rank{r}`; `tensor_parallel`,
`shards` and `num_tensors` are rewritten, every other manifest field is kept as is.

Streaming: payload slices are read from the source shard with pread (`io.views.PayloadFile`: a
shard that shrinks is InputChanged, never SIGBUS) and written to the output file (no tensor
is loaded whole into Python objects) and hashed as they are written.
Output bytes depend only on the source bytes and W.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from exl3tool.formats import msrt_spec as spec
from exl3tool.formats.cartridge import Cartridge, StageKey, load_cartridge, parse_key
from exl3tool.identity.engine import new_hasher
from exl3tool.io.safetensors import SafetensorsFile, TensorInfo
from exl3tool.io.st_writer import SafetensorsStreamWriter, TensorSpec
from exl3tool.io.views import PayloadFile
from exl3tool.rules import cartridge as ca
from exl3tool.rules.errors import InputError, OutputError, UsageError
from exl3tool.rules.registry import Findings

TILES_PER_128 = 8  # 128 channels = 8 tiles of 16 (§3)


@dataclass(frozen=True)
class _Piece:
    """One output tensor: its new name, spec, and the source byte ranges that make it up."""

    spec: TensorSpec
    ranges: tuple[tuple[int, int], ...]  # absolute [start, end) offsets in the source shard


def rank_shard_path(path: str, rank: int) -> str:
    """`dir/name.safetensors` -> `dir/name-rank{r}.safetensors`."""
    p = PurePosixPath(path)
    stem, suffix = (p.stem, p.suffix) if p.suffix == ".safetensors" else (p.name, "")
    return str(p.with_name(f"{stem}-rank{rank}{suffix}"))


def rank_name(key: StageKey, rank: int) -> str:
    return spec.stage_key(key.layer or 0, key.expert, key.proj, rank, key.component, key.label)


def _slice_ranges(
    header: SafetensorsFile, info: TensorInfo, axis: int, rank: int, world: int
) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """Shape and byte ranges of rank `rank`'s part of a 3-D int16 trellis split on `axis`."""
    a, b, w = info.shape
    item = 2
    base = header.data_start + info.begin
    if axis == 0:
        part = a // world
        row = b * w * item
        start = base + rank * part * row
        return (part, b, w), ((start, start + part * row),)
    part = b // world
    seg = part * w * item
    row = b * w * item
    ranges = tuple(
        (base + i * row + rank * seg, base + i * row + rank * seg + seg) for i in range(a)
    )
    return (a, part, w), ranges


def plan_shard(cart: Cartridge, header: SafetensorsFile, rank: int, world: int) -> list[_Piece]:
    """The tensors of one output shard (source key order), or raise on an unsplittable input."""
    pieces = []
    for name, info in header.tensors.items():
        key = parse_key(name)
        if key is None or key.layer is None or key.rank != 0:
            raise InputError(f"{header.label}: {name!r} is not a rank0 cartridge key")
        new = rank_name(key, rank)
        if key.component == "scale":
            pieces.append(
                _Piece(
                    TensorSpec(new, info.dtype, info.shape),
                    ((header.data_start + info.begin, header.data_start + info.end),),
                )
            )
            continue
        if key.component != "trellis" or info.dtype != "I16" or len(info.shape) != 3:
            raise InputError(f"{header.label}: {name!r} is not an int16 rank-3 trellis")
        axis = spec.SPLIT_AXIS[key.proj]
        tiles = info.shape[axis]
        if tiles % (world * TILES_PER_128):
            raise UsageError(
                f"{name}: {tiles} tiles on axis {axis} cannot be split into {world} ranks of "
                f"whole 128-channel blocks (needs a multiple of {world * TILES_PER_128})"
            )
        shape, ranges = _slice_ranges(header, info, axis, rank, world)
        pieces.append(_Piece(TensorSpec(new, "I16", shape), ranges))
    return pieces


class _HashingWriter:
    """A file object that hashes what it writes (sha256, one pass)."""

    def __init__(self, fh: Any) -> None:
        self._fh = fh
        self.hasher = new_hasher("sha256")
        self.size = 0

    def write(self, data: bytes | memoryview) -> int:
        self.hasher.update(data)
        self.size += len(data)
        return self._fh.write(data)


def _write_shard(
    src: PayloadFile, pieces: list[_Piece], dest: Path, progress: Any
) -> tuple[int, str]:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "xb") as fh:
        hw = _HashingWriter(fh)
        w = SafetensorsStreamWriter(hw, [p.spec for p in pieces])  # type: ignore[arg-type]
        for p in pieces:
            for start, end in p.ranges:
                w.write(src.buffer(start, end))
                if progress is not None:
                    progress.advance(end - start)
        w.close()
        fh.flush()
        os.fsync(fh.fileno())
    return hw.size, hw.hasher.hexdigest()


def _load_full(cartridge: Cartridge | Path) -> Cartridge:
    if isinstance(cartridge, Cartridge):
        return cartridge
    findings = Findings()
    cart = load_cartridge(Path(cartridge), findings)
    if findings.has_errors() or cart.manifest is None:
        first = findings.errors()[0] if findings.errors() else None
        raise InputError(
            f"{cartridge}: not a loadable cartridge"
            + (f" ({first.code} {first.message})" if first else "")
        )
    return cart


def sharded_manifest(
    manifest: dict[str, Any], world: int, shards: list[dict[str, Any]], num_tensors: int
) -> dict[str, Any]:
    """§8: rewrite tensor_parallel, shards and num_tensors; leave every other field unchanged."""
    out = copy.deepcopy(manifest)
    tp = out["tensor_parallel"]
    tp["layout"] = "rank-sharded"
    tp["world_size"] = world
    tp["ranks"] = list(range(world))
    out["shards"] = shards
    out["num_tensors"] = num_tensors
    return out


def shard_cartridge(
    cartridge: Cartridge | Path, world_size: int, out_dir: Path, *, progress: Any = None
) -> dict[str, Any]:
    """Write a rank-sharded copy of a full cartridge into `out_dir` (its files must not exist yet); return its
    manifest (also written as `out_dir/adapter_config.json`, last).

    One output shard per (source shard, rank), named `<stem>-rank{r}.safetensors`. Atomic
    publication is the caller's job (write into a temporary directory, then rename).
    """
    if type(world_size) is not int or world_size < 1:
        raise UsageError(f"world size must be an integer >= 1, got {world_size!r}")
    cart = _load_full(cartridge)
    if cart.layout != "full":
        raise InputError(
            f"{cart.root}: layout is {cart.layout!r}; only a full cartridge can be sharded"
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if (out_dir / spec.ADAPTER_CONFIG).exists():
        raise OutputError(f"{out_dir} already holds a cartridge")
    # plan everything first so an unsplittable tensor fails before any byte is written
    plans = [
        (
            e,
            cart.shards[e.path],
            [plan_shard(cart, cart.shards[e.path], r, world_size) for r in range(world_size)],
        )
        for e in sorted(cart.entries, key=lambda e: e.index)
        if e.path in cart.shards
    ]
    shards: list[dict[str, Any]] = []
    count = 0
    for entry, header, per_rank in plans:
        # opened against the header's stamp, proven unchanged after: else InputChanged (exit 3)
        with PayloadFile(header.path, header.stamp) as src:
            src.advise_sequential()
            for r, pieces in enumerate(per_rank):
                rel = rank_shard_path(entry.path, r)
                size, digest = _write_shard(src, pieces, out_dir / rel, progress)
                shards.append({"path": rel, "size": size, "sha256": digest})
                count += len(pieces)
            src.verify_unchanged()
    manifest = sharded_manifest(cart.manifest, world_size, shards, count)
    (out_dir / spec.ADAPTER_CONFIG).write_bytes(spec.dump_manifest(manifest))
    return manifest


def _rank_keys(cart: Cartridge) -> Iterator[tuple[StageKey, Any]]:
    for name, ref in cart.keys.items():
        key = parse_key(name)
        if key is not None:
            yield key, ref


def verify_sharded(source: Cartridge | Path, sharded: Cartridge | Path) -> Findings:
    """Check that the rank slices reassemble the source byte for byte and scales are replicated."""
    findings = Findings()
    src = source if isinstance(source, Cartridge) else load_cartridge(Path(source), findings)
    dst = sharded if isinstance(sharded, Cartridge) else load_cartridge(Path(sharded), findings)
    world = dst.world_size or 0
    by_logical: dict[tuple, dict[int, Any]] = {}
    for key, ref in _rank_keys(dst):
        logical = (key.layer, key.expert, key.proj, key.component, key.label)
        by_logical.setdefault(logical, {})[key.rank] = ref
    maps: dict[Path, PayloadFile] = {}

    def payload(ref: Any) -> memoryview:
        mf = maps.get(ref.shard.path)
        if mf is None:
            mf = maps[ref.shard.path] = PayloadFile(ref.shard.path)
        s = ref.shard.data_start
        return mf.buffer(s + ref.info.begin, s + ref.info.end)

    try:
        seen = set()
        for key, ref in _rank_keys(src):
            logical = (key.layer, key.expert, key.proj, key.component, key.label)
            seen.add(logical)
            ranks = by_logical.get(logical, {})
            if sorted(ranks) != list(range(world)):
                findings.add(
                    ca.CA_TOPOLOGY,
                    f"ranks {sorted(ranks)} hold this tensor, expected 0..{world - 1}",
                    tensor=key.name,
                )
                continue
            whole = payload(ref)
            if key.component == "scale":
                if any(payload(ranks[r]) != whole for r in ranks):
                    findings.add(
                        ca.CA_SCALES_DIFFER, "a rank's scale bytes differ", tensor=key.name
                    )
                continue
            axis = spec.SPLIT_AXIS[key.proj]
            ok = True
            for r in range(world):
                rinfo = ranks[r].info
                shape, ranges = _slice_ranges(ref.shard, ref.info, axis, r, world)
                if tuple(rinfo.shape) != shape:
                    ok = False
                    break
                expect = b"".join(
                    bytes(
                        whole[
                            s - ref.shard.data_start - ref.info.begin : e
                            - ref.shard.data_start
                            - ref.info.begin
                        ]
                    )
                    for s, e in ranges
                )
                if bytes(payload(ranks[r])) != expect:
                    ok = False
                    break
            if not ok:
                findings.add(
                    ca.CA_REASSEMBLY,
                    f"the {world} rank slices do not reassemble the source trellis",
                    tensor=key.name,
                )
        for logical in sorted(set(by_logical) - seen, key=str):
            findings.add(ca.CA_TOPOLOGY, f"{logical} is not in the source cartridge")
    finally:
        for m in maps.values():
            m.close()
    return findings
