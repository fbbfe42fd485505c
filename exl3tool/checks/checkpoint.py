"""What the EXL3, R7 and rank-sliced checks share: schemas, expert tables, marker and
finiteness reads over mmap views, and a lazy digest cache over the hashing engine."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from exl3tool.checks.options import ValidateOptions
from exl3tool.formats.checkpoint import TensorRef
from exl3tool.io.safetensors import SafetensorsFile, TensorInfo
from exl3tool.io.schemas import schema_errors, validator  # noqa: F401 (re-exported for the families)
from exl3tool.io.strict_json import is_json_int
from exl3tool.io.views import TensorReader

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
EXPERT_COUNT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")


# --- config helpers ------------------------------------------------------------------------


def expert_count(config: dict[str, Any] | None) -> tuple[str, int] | None:
    """(key, count) of the routed expert count, whichever field the architecture uses."""
    cfg = config or {}
    for src in (cfg, cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}):
        for key in EXPERT_COUNT_KEYS:
            v = src.get(key)
            if is_json_int(v) and v > 0:
                return key, v
    return None


def config_int(config: dict[str, Any] | None, key: str) -> int | None:
    v = (config or {}).get(key)
    return v if is_json_int(v) else None


# --- expert tensors ----------------------------------------------------------------------------


@dataclass
class ExpertTable:
    """Routed-expert tensors by position: (layer, expert, proj) -> field -> ref; rank-sliced ones
    by (layer, expert, proj, rank); layer-level vectors (r7_shared, shared_h) by (layer, name)."""

    plain: dict[tuple[int, int, str], dict[str, TensorRef]] = field(default_factory=dict)
    ranked: dict[tuple[int, int, str, int], dict[str, TensorRef]] = field(default_factory=dict)
    layer_vectors: dict[tuple[int, str], TensorRef] = field(default_factory=dict)
    other: dict[str, TensorRef] = field(default_factory=dict)  # `…mlp.experts.*` not parsed

    def layers(self) -> set[int]:
        out = {k[0] for k in self.plain} | {k[0] for k in self.ranked}
        return out | {k[0] for k in self.layer_vectors}


_PROJ = frozenset(("gate_proj", "up_proj", "down_proj"))


_SMALL = {str(i): i for i in range(1024)}  # layer/expert/rank indices: a dict hit, not a parse


def _index(s: str) -> int | None:
    """A decimal index without sign or leading zeros (as the loaders' regexes accept)."""
    i = _SMALL.get(s)
    if i is not None:
        return i
    if s.isdigit() and s.isascii() and s[0] != "0":
        return int(s)
    return None


def expert_table(tensors: dict[str, TensorRef]) -> ExpertTable:
    """Index every `model.layers.L.mlp.experts.…` tensor: one split per name (the hot path of a
    GLM-5.2 checkpoint, 176,000 names)."""
    table = ExpertTable()
    plain, ranked, vectors, other = table.plain, table.ranked, table.layer_vectors, table.other
    for name, ref in tensors.items():
        if ".mlp.experts." not in name:
            continue
        p = name.split(".")
        layer = _index(p[2]) if len(p) >= 6 else None
        if p[0] != "model" or p[1] != "layers" or p[3:5] != ["mlp", "experts"] or layer is None:
            other[name] = ref
            continue
        who = p[5]
        if who in ("r7_shared", "shared_h"):
            if len(p) > 6:
                vectors[(layer, ".".join(p[5:]))] = ref
            else:
                other[name] = ref
            continue
        expert = _index(who)
        if expert is None or len(p) not in (8, 9) or p[6] not in _PROJ:
            other[name] = ref
            continue
        if len(p) == 8:
            entry = plain.get((layer, expert, p[6]))
            if entry is None:
                entry = plain[(layer, expert, p[6])] = {}
            entry[p[7]] = ref
            continue
        rank = _index(p[7][4:]) if p[7].startswith("rank") else None
        if rank is None:
            other[name] = ref
            continue
        ranked.setdefault((layer, expert, p[6], rank), {})[p[8]] = ref
    return table


# --- payload reads (zero copy) -------------------------------------------------------------


class RandomAccessReader(TensorReader):
    """A TensorReader whose maps are advised MADV_RANDOM: the checks read 4-byte markers and
    small vectors scattered between large trellis payloads, and the kernel's default mmap
    readahead would otherwise pull in megabytes of trellis around every fault. Marker reads
    are deferred into `markers` and done in one gather per shard."""

    def __init__(self) -> None:
        super().__init__()
        self.markers = MarkerCheck()

    def _map(self, st: SafetensorsFile) -> Any:
        fresh = st.path not in self._maps
        m = super()._map(st)
        if fresh:
            m.advise_random()
        return m


def read_scalar_i32(reader: TensorReader, ref: TensorRef) -> int | None:
    """The int32 value of a 4-byte scalar tensor (read through the mmap view), or None."""
    if ref.info.nbytes != 4:
        return None
    try:
        return int.from_bytes(reader.payload(ref.shard, ref.info), "little", signed=True)
    except (ValueError, OSError):
        return None


def _data_view(reader: TensorReader, st: SafetensorsFile) -> np.ndarray | None:
    """The shard's whole data section as a zero-copy uint8 array (None if it cannot be mapped)."""
    span = TensorInfo("", "U8", (0,), 0, st.file_size - st.data_start)
    try:
        return np.frombuffer(reader.payload(st, span), dtype=np.uint8)
    except (ValueError, OSError):
        return None  # payloads beyond EOF are reported by the safetensors layer (ST016)


def _by_shard(items: list[tuple[TensorRef, Any]]) -> dict[Path, list[tuple[TensorRef, Any]]]:
    out: dict[Path, list[tuple[TensorRef, Any]]] = {}
    for ref, extra in items:
        out.setdefault(ref.shard.path, []).append((ref, extra))
    return out


class MarkerCheck:
    """Deferred reads of int32 scalar markers, one vectorised gather per shard (a GLM-5.2 R7
    checkpoint has 57,600 of them; a Python read each costs more than the page fault)."""

    def __init__(self) -> None:
        self._items: list[tuple[TensorRef, int]] = []

    def add(self, ref: TensorRef, expected: int) -> None:
        if ref.info.nbytes == 4 and ref.info.end + ref.shard.data_start <= ref.shard.file_size:
            self._items.append((ref, expected))

    def run(self, reader: TensorReader, report: Callable[[TensorRef, int, int], None]) -> None:
        """Call report(ref, value, expected) for every marker whose value differs."""
        for items in _by_shard(self._items).values():
            data = _data_view(reader, items[0][0].shard)
            if data is None:
                continue
            begins = np.fromiter((r.info.begin for r, _ in items), dtype=np.int64, count=len(items))
            want = np.fromiter((e for _, e in items), dtype=np.int64, count=len(items))
            got = data[begins[:, None] + np.arange(4)].view("<i4").ravel().astype(np.int64)
            for i in np.flatnonzero(got != want):
                report(items[i][0], int(got[i]), int(want[i]))


# word view and exponent mask per float dtype; all exponent bits set = NaN or Inf
_EXPONENT_BITS = {"F16": ("<u2", 0x7C00), "F32": ("<u4", 0x7F800000)}


class FiniteCheck:
    """Deferred NaN/Inf scan of F16/F32 vectors: per shard, one gather over every vector's
    elements through a zero-copy view, testing the exponent bits (all ones = NaN/Inf)."""

    def __init__(self) -> None:
        self._items: list[tuple[TensorRef, None]] = []

    def add(self, ref: TensorRef) -> None:
        end_ok = ref.info.end + ref.shard.data_start <= ref.shard.file_size
        if ref.info.dtype in _EXPONENT_BITS and ref.info.nbytes and end_ok:
            self._items.append((ref, None))

    def run(self, reader: TensorReader, report: Callable[[TensorRef], None]) -> None:
        for items in _by_shard(self._items).values():
            data = _data_view(reader, items[0][0].shard)
            if data is None:
                continue
            for dtype, (view, mask) in _EXPONENT_BITS.items():
                refs = [r for r, _ in items if r.info.dtype == dtype]
                if refs:
                    self._scan(data, refs, view, mask, report)

    @staticmethod
    def _scan(
        data: np.ndarray,
        refs: list[TensorRef],
        view: str,
        mask: int,
        report: Callable[[TensorRef], None],
    ) -> None:
        size = np.dtype(view).itemsize
        aligned = [r for r in refs if r.info.begin % size == 0]
        for r in refs:  # an odd offset cannot be viewed as a word array: check it alone
            if r.info.begin % size:
                words = data[r.info.begin : r.info.end].copy().view(view)
                if ((words & mask) == mask).any():
                    report(r)
        if not aligned:
            return
        words = data[: data.size - data.size % size].view(view)
        starts = np.fromiter((r.info.begin // size for r in aligned), np.int64, len(aligned))
        counts = np.fromiter((r.info.numel for r in aligned), np.int64, len(aligned))
        ends = np.cumsum(counts)
        index = np.repeat(starts - (ends - counts), counts) + np.arange(ends[-1])
        bad = (words[index] & mask) == mask
        if bad.any():
            for i in np.unique(np.searchsorted(ends, np.flatnonzero(bad), side="right")):
                report(aligned[i])


# --- digests (--hash) ----------------------------------------------------------------------


class Digests:
    """Lazy sha256 of whole files and tensor payloads through `exl3tool.identity.engine`; each
    file is hashed at most once per run (shard_sha256 and files_sha256 share results)."""

    def __init__(self, root: Path, options: ValidateOptions) -> None:
        self.root = root
        self.threads = options.threads
        self._files: dict[str, str | None] = {}

    def files(self, labels: Iterable[str]) -> dict[str, str | None]:
        """sha256 per relative file; None for a file that cannot be read."""
        from exl3tool.identity.engine import hash_files
        from exl3tool.io.progress import progress_bar
        from exl3tool.rules.errors import InputError

        todo = sorted({lb for lb in labels if lb not in self._files})
        ok = [lb for lb in todo if (self.root / lb).is_file()]
        for lb in set(todo) - set(ok):
            self._files[lb] = None
        if ok:
            total = sum((self.root / lb).stat().st_size for lb in ok)
            try:
                with progress_bar(total, "hashing files") as bar:
                    got = hash_files([self.root / lb for lb in ok], "sha256", self.threads, bar)
            except InputError:
                got = {}
            for lb in ok:
                self._files[lb] = got.get(self.root / lb)
        return {lb: self._files.get(lb) for lb in labels}

    def tensors(self, refs: Iterable[TensorRef]) -> dict[str, str]:
        from exl3tool.identity.engine import hash_tensors
        from exl3tool.io.progress import progress_bar

        items = [(r.name, r.shard, r.info) for r in refs]
        total = sum(i.nbytes for _, _, i in items)
        with progress_bar(total, "hashing tensors") as bar:
            return hash_tensors(items, "sha256", self.threads, bar)


def sha_ok(value: Any) -> bool:
    return isinstance(value, str) and bool(SHA256_RE.match(value))
