"""A checkpoint directory (or single safetensors file) as configs + a tensor index.

`load_checkpoint` reads JSON and safetensors headers only. Container defects (index vs shards,
unreadable files, duplicates) become CK/ST/JS findings; the model returned is best effort.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exl3tool.io.jsonfile import read_json
from exl3tool.io.paths import relative_path_problem
from exl3tool.io.safetensors import SafetensorsFile, TensorInfo, read_header
from exl3tool.rules import checkpoint as ck
from exl3tool.rules import io as io_rules
from exl3tool.rules.errors import InputError
from exl3tool.rules.registry import Findings

INDEX_NAME = "model.safetensors.index.json"


@dataclass(frozen=True)
class TensorRef:
    """A tensor and the shard that stores it."""

    shard: SafetensorsFile
    info: TensorInfo

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def file(self) -> str:
        return self.shard.label


@dataclass
class Checkpoint:
    root: Path
    config: dict[str, Any] | None = None
    quant_config: dict[str, Any] | None = None  # quantization_config.json
    index: dict[str, Any] | None = None
    shards: dict[str, SafetensorsFile] = field(default_factory=dict)  # label -> header
    tensors: dict[str, TensorRef] = field(default_factory=dict)
    single_file: str | None = None  # set when the artifact is one .safetensors file

    @property
    def embedded_quant(self) -> Any:
        return (self.config or {}).get("quantization_config")

    def json_file(self, name: str, findings: Findings, **kw: Any) -> Any:
        """Read another JSON document of the artifact (manifests), if present."""
        p = self.root / name
        if not p.is_file():
            return None
        return read_json(p, findings, name, **kw)


def _list_safetensors(root: Path) -> list[str]:
    return sorted(
        e.name for e in os.scandir(root) if e.name.endswith(".safetensors") and not e.is_dir()
    )


def _read_shard(root: Path, label: str, findings: Findings) -> SafetensorsFile | None:
    try:
        return read_header(root / label, findings, label)
    except OSError as exc:
        findings.add(ck.CK_SHARD_UNREADABLE, f"{exc.strerror or exc}", file=label)
        return None


def load_checkpoint(path: Path, findings: Findings, *, need_config: bool = True) -> Checkpoint:
    """Load configs, index and every shard header of a checkpoint directory or file."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if path.is_file():
        ckpt = Checkpoint(root=path.parent, single_file=path.name)
        st = _read_shard(path.parent, path.name, findings)
        if st is not None:
            ckpt.shards[path.name] = st
            ckpt.tensors = {n: TensorRef(st, t) for n, t in st.tensors.items()}
        return ckpt
    if not path.is_dir():
        raise InputError(f"{path}: not a directory or regular file")
    try:
        names = _list_safetensors(path)
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror}") from exc
    ckpt = Checkpoint(root=path)
    cfg = path / "config.json"
    if cfg.is_file():
        ckpt.config = read_json(cfg, findings, "config.json")
    if ckpt.config is None and need_config:
        findings.add(ck.CK_CONFIG, "config.json is missing or unusable", file="config.json")
    qc = path / "quantization_config.json"
    if qc.is_file():
        ckpt.quant_config = read_json(qc, findings, "quantization_config.json")
    index_path = path / INDEX_NAME
    if index_path.is_file():
        ckpt.index = read_json(index_path, findings, INDEX_NAME)
        _load_indexed(ckpt, names, findings)
    else:
        if not names:
            findings.add(ck.CK_NO_SHARDS, "no .safetensors file in the directory", file=".")
        elif len(names) > 1:
            findings.add(ck.CK_NO_INDEX, f"{len(names)} shards and no {INDEX_NAME}", file=".")
        for label in names:
            st = _read_shard(path, label, findings)
            if st is not None:
                ckpt.shards[label] = st
        _collect(ckpt, findings)
    return ckpt


def _collect(ckpt: Checkpoint, findings: Findings) -> None:
    for label, st in ckpt.shards.items():
        for name, info in st.tensors.items():
            prev = ckpt.tensors.get(name)
            if prev is not None:
                findings.add(
                    ck.CK_DUPLICATE_TENSOR, f"also stored in {prev.file}", file=label, tensor=name
                )
                continue
            ckpt.tensors[name] = TensorRef(st, info)


def _load_indexed(ckpt: Checkpoint, present: list[str], findings: Findings) -> None:
    idx = ckpt.index
    wm = idx.get("weight_map") if isinstance(idx, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        findings.add(
            ck.CK_INDEX_MALFORMED,
            "weight_map must map tensor names to shard files",
            file=INDEX_NAME,
            pointer="/weight_map",
        )
        for label in present:
            st = _read_shard(ckpt.root, label, findings)
            if st is not None:
                ckpt.shards[label] = st
        _collect(ckpt, findings)
        return
    referenced = sorted(set(wm.values()))
    for label in referenced:
        # Lexical check only: checkpoint shards may be symlinks (a Hugging Face cache snapshot
        # links every file into ../../blobs); cartridges, which forbid links, use open_inside.
        problem = relative_path_problem(label)
        if problem:
            findings.add(
                io_rules.PA_ESCAPE,
                f"shard path {label!r} {problem}",
                file=INDEX_NAME,
                pointer="/weight_map",
            )
            continue
        try:
            absent = "" if (ckpt.root / label).is_file() else "absent"
        except OSError as exc:  # e.g. a name too long for the file system
            absent = exc.strerror or str(exc)
        if absent:
            findings.add(
                ck.CK_INDEX_MISSING_SHARD,
                f"{label} is referenced but {absent}",
                file=INDEX_NAME,
                pointer="/weight_map",
            )
            continue
        st = _read_shard(ckpt.root, label, findings)
        if st is not None:
            ckpt.shards[label] = st
    mapped = set(referenced)  # not `in wm.values()`: that is O(tensors) per shard
    for label in present:
        if label not in mapped and label not in ckpt.shards:
            findings.add(ck.CK_UNREFERENCED_SHARD, "no tensor of the index lives here", file=label)
            st = _read_shard(ckpt.root, label, findings)
            if st is not None:
                ckpt.shards[label] = st
    _collect(ckpt, findings)
    for name, label in wm.items():
        st = ckpt.shards.get(label)
        if st is not None and name not in st.tensors:
            findings.add(
                ck.CK_INDEX_MISSING_TENSOR,
                f"mapped to {label} but not in it",
                file=INDEX_NAME,
                tensor=name,
                pointer="/weight_map",
            )
    for name, ref in ckpt.tensors.items():
        if wm.get(name) != ref.file and name not in wm:
            findings.add(
                ck.CK_UNMAPPED_TENSOR, "not in the index weight_map", file=ref.file, tensor=name
            )
    meta = idx.get("metadata")
    total = meta.get("total_size") if isinstance(meta, dict) else None
    if total is not None:
        actual = sum(r.info.nbytes for r in ckpt.tensors.values())
        if type(total) is not int or total != actual:
            findings.add(
                ck.CK_TOTAL_SIZE,
                f"total_size {total!r}, tensors hold {actual} bytes",
                file=INDEX_NAME,
                pointer="/metadata/total_size",
            )
