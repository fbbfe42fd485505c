"""What the EXL3, R7 and rank-sliced checks share: schemas, expert tables, marker and
finiteness reads over mmap views, and a lazy digest cache over the hashing engine."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from exl3tool.checks.options import ValidateOptions
from exl3tool.formats.checkpoint import TensorRef
from exl3tool.io.safetensors import SafetensorsFile, TensorInfo
from exl3tool.io.strict_json import is_json_int
from exl3tool.io.views import TensorReader

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
EXPERT_COUNT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")

# model.layers.{L}.mlp.experts.{E|r7_shared|shared_h}.{...}; parsed once per tensor (hot path)
_EXPERTS_RE = re.compile(
    r"^model\.layers\.(0|[1-9][0-9]*)\.mlp\.experts\.(0|[1-9][0-9]*|r7_shared|shared_h)\.(.+)$"
)
_PROJ_RE = re.compile(r"^(gate_proj|up_proj|down_proj)(?:\.rank(0|[1-9][0-9]*))?\.([A-Za-z0-9_]+)$")


# --- JSON Schema -----------------------------------------------------------------------------


@functools.cache
def validator(name: str) -> Any:
    """A draft 2020-12 validator for `schemas/<name>` (jsonschema is imported on first use)."""
    import jsonschema

    schema = json.loads((SCHEMA_DIR / name).read_text())
    return jsonschema.Draft202012Validator(schema)


def schema_errors(name: str, value: Any) -> list[tuple[str, str, tuple[Any, ...]]]:
    """(JSON pointer, message, path) of every schema violation, sorted by pointer."""
    from exl3tool.io.strict_json import pointer_join

    out = []
    for err in validator(name).iter_errors(value):
        path = tuple(err.absolute_path)
        if err.validator == "required":  # point at the missing member, not its parent
            missing = re.findall(r"'([^']*)' is a required property", err.message)
            path = (*path, *missing[:1])
        ptr = ""
        for tok in path:
            ptr = pointer_join(ptr, tok)
        out.append((ptr, err.message, path))
    return sorted(out, key=lambda e: e[0])


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


def expert_table(tensors: dict[str, TensorRef]) -> ExpertTable:
    """Index every `model.layers.L.mlp.experts.…` tensor (one regex pass; the hot path)."""
    table = ExpertTable()
    match_experts, match_proj = _EXPERTS_RE.match, _PROJ_RE.match
    plain, ranked = table.plain, table.ranked
    for name, ref in tensors.items():
        if ".experts." not in name:
            continue
        m = match_experts(name)
        if m is None:
            if ".mlp.experts." in name:
                table.other[name] = ref
            continue
        layer_s, who, rest = m.groups()
        layer = int(layer_s)
        if who == "r7_shared" or who == "shared_h":
            table.layer_vectors[(layer, f"{who}.{rest}")] = ref
            continue
        p = match_proj(rest)
        if p is None:
            table.other[name] = ref
            continue
        proj, rank, fld = p.groups()
        if rank is None:
            plain.setdefault((layer, int(who), proj), {})[fld] = ref
        else:
            ranked.setdefault((layer, int(who), proj, int(rank)), {})[fld] = ref
    return table


# --- payload reads (zero copy) -------------------------------------------------------------


def read_scalar_i32(reader: TensorReader, ref: TensorRef) -> int | None:
    """The int32 value of a 4-byte scalar tensor (read through the mmap view), or None."""
    if ref.info.nbytes != 4:
        return None
    try:
        return int.from_bytes(reader.payload(ref.shard, ref.info), "little", signed=True)
    except (ValueError, OSError):
        return None


class FiniteCheck:
    """Collects F16/F32 vectors and checks them for NaN/Inf in as few numpy calls as possible:
    payloads adjacent in a shard are merged into one run (the R7 layout stores them together)."""

    def __init__(self) -> None:
        self._items: list[tuple[SafetensorsFile, TensorInfo]] = []

    def add(self, ref: TensorRef) -> None:
        if ref.info.dtype in ("F16", "F32") and ref.info.nbytes:
            self._items.append((ref.shard, ref.info))

    def run(self, reader: TensorReader, report: Callable[[TensorRef], None]) -> None:
        by_shard: dict[Path, list[tuple[SafetensorsFile, TensorInfo]]] = {}
        for st, info in self._items:
            by_shard.setdefault(st.path, []).append((st, info))
        for items in by_shard.values():
            items.sort(key=lambda x: x[1].begin)
            run: list[tuple[SafetensorsFile, TensorInfo]] = []
            for it in items:
                if run and (run[-1][1].end != it[1].begin or run[-1][1].dtype != it[1].dtype):
                    self._check_run(reader, run, report)
                    run = []
                run.append(it)
            if run:
                self._check_run(reader, run, report)

    @staticmethod
    def _check_run(
        reader: TensorReader,
        run: list[tuple[SafetensorsFile, TensorInfo]],
        report: Callable[[TensorRef], None],
    ) -> None:
        st, first = run[0]
        last = run[-1][1]
        dt = np.dtype("<f2") if first.dtype == "F16" else np.dtype("<f4")
        span = TensorInfo("", first.dtype, (0,), first.begin, last.end)
        try:
            buf = reader.payload(st, span)
        except (ValueError, OSError):
            return  # payloads beyond EOF are reported by the safetensors layer (ST016)
        arr = np.frombuffer(buf, dtype=dt)
        # NaN/Inf have an all-ones exponent: test the bits, cheaper than isfinite on fp16
        if dt.itemsize == 2:
            bad = (arr.view("<u2") & 0x7C00) == 0x7C00
        else:
            bad = (arr.view("<u4") & 0x7F800000) == 0x7F800000
        if not bad.any():
            return
        for _, info in run:
            lo = (info.begin - first.begin) // dt.itemsize
            if bad[lo : lo + info.numel].any():
                report(TensorRef(st, info))


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
        from exl3tool.errors import InputError
        from exl3tool.identity.engine import hash_files
        from exl3tool.report.progress import progress_bar

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
        from exl3tool.report.progress import progress_bar

        items = [(r.name, r.shard, r.info) for r in refs]
        total = sum(i.nbytes for _, _, i in items)
        with progress_bar(total, "hashing tensors") as bar:
            return hash_tensors(items, "sha256", self.threads, bar)


def sha_ok(value: Any) -> bool:
    return isinstance(value, str) and bool(SHA256_RE.match(value))
