"""Cold build of base + adapter: the plainest code, straight from the original files.

Deliberately independent of everything the hot path uses: no staging, no runtime tables, no TP
plan, no trellis slicing. It reads `adapter_config.json` with `json`, each shard's header with
plain `json` and its tensors with `os.pread` (never mmap: a shard truncated while it is read is an
InputError naming it, not a SIGBUS), decodes every FULL effective weight, computes `1/scale` in double and
rounds it to fp32 (docs/formats/msrt.md §1.2), takes each stage's K from its trellis shape
(last dim / 16) and applies the chain in manifest order. For a TP rank it cuts the DECODED
weights with plain arithmetic (`r·I/N`). Its forward performs the same floating-point operations
as the runtime (precision policy in `runtime.linear`), so a correct hot load matches it bit for bit.

Memory: `ColdIndex` maps tensor names to files once; `ColdIndex.experts(L, ids)` decodes one
expert of one layer at a time while threads read the next experts' files, so verify-swap holds one
cold expert and the raw bytes of two more (`build` still decodes whole layers for tests and small
tools).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from exl3tool.rules.errors import InputError
from exl3tool.trellis.weight import effective_weight

PROJS = ("gate_proj", "up_proj", "down_proj")
KEY = re.compile(
    r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)"
    r"\.rank(\d+)\.(trellis|scale)_(.+)$"
)
_AXIS = {"gate_proj": 1, "up_proj": 1, "down_proj": 0}  # a rank-sharded stage's cut axis


@dataclass(frozen=True)
class ColdStage:
    """One stage of one (expert, projection), from the adapter's own files."""

    label: str
    inverse_scale: torch.Tensor  # fp32 [], 1/scale in double rounded to fp32 (§1.2)
    k: int  # bits per weight of the stage trellis (its last dim / 16)
    weight: torch.Tensor  # fp16 [in, out], full size, decoded with the base's suh/svh (§1.1)


@dataclass
class ColdExpert:
    """Full decoded weights of one expert: base `W_eff` and its stages in chain order."""

    expert: int
    base: dict[str, torch.Tensor] = field(default_factory=dict)
    stages: dict[str, list[ColdStage]] = field(default_factory=dict)


# safetensors dtype names (docs/formats/exl3.md §2) -> torch dtypes; others are refused.
_DTYPES = {
    "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
    "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16, "I32": torch.int32,
    "I64": torch.int64, "BOOL": torch.bool,
}  # fmt: skip
_MAX_HEADER = 100_000_000


def read_header(path: str) -> tuple[int, dict[str, Any]]:
    """(payload start, header) of a safetensors file, with nothing but `json`: the cold build's
    own reader, independent of `io.safetensors`."""
    with open(path, "rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < n <= _MAX_HEADER:
            raise ValueError(f"header length {n}")
        text = fh.read(n)
    if len(text) != n:
        raise ValueError("file ends inside its header")
    header = json.loads(text)
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    header.pop("__metadata__", None)
    return 8 + n, header


class ShardTensors:
    """Tensors read on demand (name -> file) with `os.pread` into private buffers; a file is
    opened when first needed and closed by `release` (verify-swap calls it after each layer)."""

    def __init__(self, directory: Path, files: list[str]) -> None:
        self.where: dict[str, tuple[str, int, dict[str, Any]]] = {}
        self.handles: dict[str, int] = {}
        self._lock = threading.Lock()  # `get` runs on the read-ahead threads
        for f in files:
            path = str(Path(directory) / f)
            try:
                start, header = read_header(path)
            except (OSError, ValueError) as exc:  # `validate` names the defect exactly
                raise InputError(f"{path}: not a readable safetensors file ({exc})") from None
            for name, info in header.items():
                self.where[name] = (path, start, info)

    def get(self, name: str, pin: bool = False) -> torch.Tensor:
        """The tensor `name` in a private CPU tensor (page-locked when `pin`: for CUDA copies
        that do not wait)."""
        path, start, info = self.where[name]
        try:
            dtype = _DTYPES[info["dtype"]]
            begin, end = (int(x) for x in info["data_offsets"])
            shape = [int(d) for d in info["shape"]]
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{path}: tensor {name!r} has an unreadable header entry") from None
        if not 0 <= begin <= end:
            raise InputError(f"{path}: tensor {name!r} has an unreadable header entry")
        with self._lock:
            fd = self.handles.get(path)
            if fd is None:
                fd = self.handles[path] = os.open(path, os.O_RDONLY)
        # no zero fill: pread writes it all
        raw = torch.empty(end - begin, dtype=torch.uint8, pin_memory=pin)
        got = os.preadv(fd, [memoryview(raw.numpy())], start + begin) if end > begin else 0
        if got != end - begin:
            raise InputError(f"{path}: shrank while it was read ({name!r} ends past the file)")
        try:
            return raw.view(dtype).reshape(shape)
        except (ValueError, RuntimeError):  # size not a whole number of elements, or not `shape`
            raise InputError(f"{path}: tensor {name!r} does not match its shape") from None

    def release(self) -> None:
        for fd in self.handles.values():
            os.close(fd)
        self.handles.clear()


class ColdIndex:
    """Where every base and stage tensor lives; decodes one expert at a time."""

    def __init__(self, base: Path, adapter: Path | None) -> None:
        self.base = ShardTensors(base, sorted(p.name for p in Path(base).glob("*.safetensors")))
        self.manifest: dict[str, Any] = {}
        self.stage_keys: dict[tuple[int, int, str], list[tuple[str, dict[int, str], str]]] = {}
        if adapter is not None:
            self.manifest = json.loads((Path(adapter) / "adapter_config.json").read_text())
            self.adapter: ShardTensors | None = ShardTensors(
                adapter, [s["path"] for s in self.manifest["shards"]]
            )
            self._index_stages()
        else:
            self.adapter = None

    def _index_stages(self) -> None:
        assert self.adapter is not None
        order = [c["label"] for c in self.manifest["chain"]]
        parts: dict[tuple[int, int, str, str], dict[int, str]] = {}
        scales: dict[tuple[int, int, str, str], str] = {}
        for name in self.adapter.where:
            m = KEY.match(name)
            if m is None:
                continue
            layer, expert, proj, rank, comp, label = m.groups()
            key = (int(layer), int(expert), proj, label)
            if comp == "trellis":
                parts.setdefault(key, {})[int(rank)] = name
            else:
                scales[key] = name
        for key in sorted(parts, key=lambda k: (k[0], k[1], k[2], order.index(k[3]))):
            layer, expert, proj, label = key
            self.stage_keys.setdefault((layer, expert, proj), []).append(
                (label, parts[key], scales[key])
            )

    def release(self) -> None:
        """Close every open file (the next read reopens it)."""
        self.base.release()
        if self.adapter is not None:
            self.adapter.release()

    def num_experts(self, layer: int) -> int:
        e = 0
        while f"model.layers.{layer}.mlp.experts.{e}.gate_proj.rank0.trellis" in self.base.where:
            e += 1
        return e

    def _reads(self, layer: int, e: int) -> list[tuple[ShardTensors, str]]:
        """Every tensor one expert's cold build reads, in the order `_build` takes them."""
        out: list[tuple[ShardTensors, str]] = []
        for p in PROJS:
            pre = f"model.layers.{layer}.mlp.experts.{e}.{p}.rank0."
            out += [(self.base, pre + c) for c in ("suh", "svh", "trellis")]
            for _, ranks, scale in self.stage_keys.get((layer, e, p), []):
                assert self.adapter is not None
                out += [(self.adapter, ranks[r]) for r in sorted(ranks)]
                out.append((self.adapter, scale))
        return out

    def expert(self, layer: int, e: int, device: torch.device) -> ColdExpert:
        raw = [src.get(name) for src, name in self._reads(layer, e)]
        return self._build(layer, e, iter(raw), device)

    def experts(
        self, layer: int, ids: list[int], device: torch.device, *, ahead: int = 2
    ) -> Iterator[ColdExpert]:
        """`expert(layer, e)` for each of `ids` in order; the files of the next `ahead` experts
        are read on threads while the current one is decoded (the memory of `ahead` experts)."""
        pin = device.type == "cuda"
        pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="exl3cold")
        pending: deque[tuple[int, list[Future[torch.Tensor]]]] = deque()
        todo = iter(ids)
        try:
            while True:
                while len(pending) <= ahead:
                    e = next(todo, None)
                    if e is None:
                        break
                    reads = self._reads(layer, e)
                    pending.append((e, [pool.submit(src.get, n, pin) for src, n in reads]))
                if not pending:
                    return
                e, futures = pending.popleft()
                yield self._build(layer, e, (f.result() for f in futures), device)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _build(
        self, layer: int, e: int, raw: Iterator[torch.Tensor], device: torch.device
    ) -> ColdExpert:
        out = ColdExpert(e)
        for p in PROJS:
            suh, svh, trellis = (_to(next(raw), device) for _ in range(3))
            out.base[p] = effective_weight(trellis, suh, svh, "mcg")
            out.stages[p] = [
                self._stage(label, [next(raw) for _ in ranks], next(raw), p, suh, svh, device)
                for label, ranks, _ in self.stage_keys.get((layer, e, p), [])
            ]
        return out

    def _stage(
        self,
        label: str,
        parts: list[torch.Tensor],
        scale: torch.Tensor,
        proj: str,
        suh: torch.Tensor,
        svh: torch.Tensor,
        device: torch.device,
    ) -> ColdStage:
        trellis = torch.cat([_to(t, device) for t in parts], dim=_AXIS[proj])
        inv = torch.tensor(1.0 / float(scale), dtype=torch.float32)
        weight = effective_weight(trellis, suh, svh, "mcg")
        return ColdStage(label, inv.to(device), int(trellis.shape[-1]) // 16, weight)


def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    # from page-locked memory the copy need not wait: the caching host allocator keeps the
    # block until it is done
    return t.to(device, non_blocking=t.is_pinned())


@dataclass
class ColdLayer:
    """Full decoded weights of one layer: base `W_eff` and [(label, inv, stage W_eff)]."""

    base: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)
    stages: dict[tuple[int, str], list[tuple[str, torch.Tensor, torch.Tensor]]] = field(
        default_factory=dict
    )

    def add(self, ex: ColdExpert) -> None:
        for p in PROJS:
            self.base[(ex.expert, p)] = ex.base[p]
            self.stages[(ex.expert, p)] = [
                (s.label, s.inverse_scale, s.weight) for s in ex.stages[p]
            ]


def build(
    base: Path, adapter: Path | None, layers: list[int], device: torch.device
) -> dict[int, ColdLayer]:
    """Full-size cold weights of `layers` (adapter None = the base alone)."""
    index = ColdIndex(base, adapter)
    out: dict[int, ColdLayer] = {}
    for L in layers:
        cl = ColdLayer()
        for e in range(index.num_experts(L)):
            cl.add(index.expert(L, e, device))
        out[L] = cl
    return out


def rank_cut(w: torch.Tensor, proj: str, rank: int, world: int) -> torch.Tensor:
    """This rank's part of a full decoded weight [in, out]: plain arithmetic, no TP plan."""
    if world == 1:
        return w
    if proj == "down_proj":
        n = w.shape[0] // world
        return w[rank * n : (rank + 1) * n].contiguous()
    n = w.shape[1] // world
    return w[:, rank * n : (rank + 1) * n].contiguous()


def expert_weights_fn(ex: ColdExpert, rank: int, world: int):
    """fp32 partial down output of one cold expert, same operations as the runtime."""
    cut = {
        p: (
            rank_cut(ex.base[p], p, rank, world),
            [(s.inverse_scale, rank_cut(s.weight, p, rank, world)) for s in ex.stages[p]],
        )
        for p in PROJS
    }

    def proj32(p: str, x: torch.Tensor) -> torch.Tensor:
        w0, terms = cut[p]
        y = x.float() @ w0.float()
        for inv, w in terms:
            y = y + inv * (x.float() @ w.float())
        return y

    def fn(x16: torch.Tensor) -> torch.Tensor:
        g = proj32("gate_proj", x16).half()
        u = proj32("up_proj", x16).half()
        a = (F.silu(g.float()) * u.float()).half()
        return proj32("down_proj", a)

    return fn
