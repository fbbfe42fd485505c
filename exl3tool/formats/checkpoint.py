"""A checkpoint directory (or single safetensors file) as configs + a tensor index.

`load_checkpoint` reads JSON and safetensors headers only. Container defects (index vs shards,
unreadable files, duplicates) become CK/ST/JS findings; the model returned is best effort and
records what it rejected, so that checks which would only repeat a root cause (a JSON syntax
error, a truncated shard) are dropped (`Checkpoint.is_consequence`).

Files may be symlinks: a Hugging Face cache snapshot links every file into `../../blobs/`, and the
runtime follows links. A link that leaves both the artifact and the cache is a PA006 warning.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from pathlib import Path
from typing import Any, NamedTuple

from exl3tool.io.fs import read_document
from exl3tool.io.gcpause import paused_gc
from exl3tool.io.index_scan import IndexScan, holds_group, scan_index
from exl3tool.io.jsonfile import DEFAULT_MAX_BYTES, parse_json, read_json
from exl3tool.io.paths import link_escape, relative_path_problem
from exl3tool.io.safetensors import SafetensorsFile, TensorInfo, read_header
from exl3tool.rules import checkpoint as ck
from exl3tool.rules import io as io_rules
from exl3tool.rules.errors import InputError
from exl3tool.rules.registry import Finding, Findings

INDEX_NAME = "model.safetensors.index.json"


class TensorRef(NamedTuple):
    """A tensor and the shard that stores it (a tuple: one per tensor, 10^6 in a large header,
    made in C-level loops)."""

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
    # the index document, without its weight_map where `weight_map_matched`
    index: dict[str, Any] | None = None
    # the index's weight_map was compared with the headers by its groups (io/index_scan) and
    # maps exactly every tensor of `tensors` to its file: it is not built
    weight_map_matched: bool = False
    shards: dict[str, SafetensorsFile] = field(default_factory=dict)  # label -> header
    tensors: dict[str, TensorRef] = field(default_factory=dict)
    single_file: str | None = None  # set when the artifact is one .safetensors file
    # Root causes already reported while loading (see `is_consequence`): files that could not
    # be used at all, shards that lost entries (truncated, malformed), and the tensors that the
    # index maps to them but that they do not deliver.
    rejected_files: set[str] = field(default_factory=set)
    damaged_shards: set[str] = field(default_factory=set)
    rejected_tensors: set[str] = field(default_factory=set)
    _rejected_scopes: frozenset[str] | None = field(default=None, repr=False)

    @property
    def embedded_quant(self) -> Any:
        return (self.config or {}).get("quantization_config")

    def json_file(self, name: str, findings: Findings, **kw: Any) -> Any:
        """Read another JSON document of the artifact (manifests), if present."""
        if not present(self, name, findings):
            return None
        return _read_json(self, name, findings, **kw)

    def payload_bytes(self) -> int:
        """The bytes of every tensor's payload (C-level sums: 10^6 tensors)."""
        refs = self.tensors.values()
        return sum(map(_END, refs)) - sum(map(_BEGIN, refs))

    @property
    def incomplete(self) -> bool:
        """Some tensor could not be loaded: digests over the whole artifact or a layer would be
        computed from a partial set (checks that recompute them skip; the loader said why)."""
        shards = self.rejected_files - _LOADED
        return bool(self.rejected_tensors or self.damaged_shards or shards)

    def is_consequence(self, finding: Finding) -> bool:
        """True for a check's finding that only repeats a defect the loader reported: it names
        a rejected file, a damaged shard as a whole, or a rejected tensor (or the layer or
        module holding one: its facts were computed from an incomplete set)."""
        loc = finding.location
        if finding.rule.code.startswith(("JS", "PA")):
            return False  # the reason a document read during the checks was rejected: a root cause
        if loc.file in self.rejected_files:
            return True
        if loc.tensor is None:
            return loc.file in self.damaged_shards
        if self._rejected_scopes is None:
            scopes = set()
            for name in self.rejected_tensors:
                parts = name.split(".")
                scopes.update(".".join(parts[:i]) for i in range(2, len(parts) + 1))
            self._rejected_scopes = frozenset(scopes)
        return loc.tensor in self._rejected_scopes


def present(ckpt: Checkpoint, name: str, findings: Findings) -> bool:
    """Whether the artifact holds the regular file `name`. Anything else at that name (a FIFO,
    a directory, a device) is PA003, not "absent" (issue 15 item 6)."""
    p = ckpt.root / name
    try:
        if p.is_file():
            return True
        exists = p.exists()  # a dangling link: absent (the loaders report links)
    except OSError:  # a name too long for the file system, a loop of links
        exists = True
    if exists:
        findings.add(io_rules.PA_NOT_REGULAR, "not a regular file", file=name)
        if name in _LOADED:  # the loader's own files: what only repeats this is dropped
            ckpt.rejected_files.add(name)
    return False


# A shard's header read ahead elsewhere (see load_checkpoint), or None to read it here.
ReadAhead = Callable[[Path, str], "SafetensorsFile | None"] | None
_LOADED = frozenset(("config.json", "quantization_config.json", INDEX_NAME))
_END, _BEGIN = attrgetter("info.end"), attrgetter("info.begin")


def _read_json(
    ckpt: Checkpoint, name: str, findings: Findings, data: bytes | None = None, **kw: Any
) -> Any:
    """`read_json` (`parse_json` of `data` when it was read already), remembering a document
    that could not be used as a rejected file."""
    before = len(findings)
    if data is None:
        value = read_json(ckpt.root / name, findings, name, **kw)
    else:
        value = parse_json(data, findings, name, **kw)
    if value is None and len(findings) > before:
        ckpt.rejected_files.add(name)
    return value


def list_safetensors(root: Path) -> list[str]:
    """The names of the `*.safetensors` entries of `root` that are not folders, sorted."""
    return sorted(
        e.name for e in os.scandir(root) if e.name.endswith(".safetensors") and not e.is_dir()
    )


def _read_shard(
    ckpt: Checkpoint, label: str, findings: Findings, ahead: ReadAhead = None
) -> SafetensorsFile | None:
    try:
        st = ahead(ckpt.root / label, label) if ahead is not None else None
        if st is None:
            st = read_header(ckpt.root / label, findings, label)
    except OSError as exc:
        findings.add(ck.CK_SHARD_UNREADABLE, f"{exc.strerror or exc}", file=label)
        st = None
    if st is None:
        ckpt.rejected_files.add(label)
    elif st.invalid_entries:
        ckpt.damaged_shards.add(label)
    return st


def _report_links(root: Path, names: list[str], findings: Findings) -> None:
    """PA006 for each of `names` (relative to `root`) that is a symlink leaving the artifact and
    the hub cache; links inside either are read like files."""
    for name in names:
        problem = link_escape(root, root / name)
        if problem:
            findings.add(io_rules.PA_LINK_ESCAPE, problem, file=name)


def load_checkpoint(
    path: Path, findings: Findings, *, need_config: bool = True, ahead: ReadAhead = None
) -> Checkpoint:
    """Load configs, index and every shard header of a checkpoint directory or file.

    `ahead(path, label)`: a shard's header read elsewhere (io/headers_ahead), exactly as
    `read_header` reads it without a finding, or None to read it here."""
    with paused_gc():  # 10^6 tensor refs, no cycles among them
        return _load_checkpoint(Path(path), findings, need_config, ahead)


def _load_checkpoint(
    path: Path, findings: Findings, need_config: bool, ahead: ReadAhead
) -> Checkpoint:
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if path.is_file():
        ckpt = Checkpoint(root=path.parent, single_file=path.name)
        _report_links(path.parent, [path.name], findings)
        st = _read_shard(ckpt, path.name, findings)
        if st is not None:
            ckpt.shards[path.name] = st
            ckpt.tensors = dict(zip(st.tensors, _refs(st), strict=True))
        return ckpt
    if not path.is_dir():
        raise InputError(f"{path}: not a directory or regular file")
    try:
        names = list_safetensors(path)
        _report_links(path, sorted(e.name for e in os.scandir(path) if e.is_symlink()), findings)
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror}") from exc
    ckpt = Checkpoint(root=path)
    if present(ckpt, "config.json", findings):
        ckpt.config = _read_json(ckpt, "config.json", findings)
    if ckpt.config is None and need_config and "config.json" not in ckpt.rejected_files:
        findings.add(ck.CK_CONFIG, "config.json is missing or unusable", file="config.json")
        ckpt.rejected_files.add("config.json")  # what only repeats this is dropped
    if present(ckpt, "quantization_config.json", findings):
        ckpt.quant_config = _read_json(ckpt, "quantization_config.json", findings)
    if present(ckpt, INDEX_NAME, findings):
        _load_index(ckpt, names, findings, ahead)
    else:
        if not names:
            findings.add(ck.CK_NO_SHARDS, "no .safetensors file in the directory", file=".")
        elif len(names) > 1:
            findings.add(ck.CK_NO_INDEX, f"{len(names)} shards and no {INDEX_NAME}", file=".")
        for label in names:
            st = _read_shard(ckpt, label, findings, ahead)
            if st is not None:
                ckpt.shards[label] = st
        _collect(ckpt, findings)
    return ckpt


def _absent(path: Path) -> str:
    """Why `path` holds no regular file: absent, or a link whose target is missing (in a Hugging
    Face cache snapshot, a blob of its repository an interrupted download never fetched) or is
    not a regular file."""
    if not os.path.islink(path):
        return "absent"
    target = os.readlink(path)
    if os.path.exists(path):
        return f"is a link to {target}, which is not a regular file"
    from exl3tool.io.hf_cache import blob_root

    blobs = blob_root(path.parent)
    resolved = Path(os.path.abspath(os.path.join(path.parent, target)))
    if blobs is not None and resolved.parent == Path(os.path.abspath(blobs)):
        return (
            "is a link to a missing blob of the Hugging Face cache (an incomplete download: "
            "fetch it again)"
        )
    return f"is a link to {target}, which does not exist"


def _refs(st: SafetensorsFile) -> Iterator[TensorRef]:
    """A TensorRef of each of `st`'s tensors, in its order."""
    return map(tuple.__new__, repeat(TensorRef), zip(repeat(st), st.tensors.values()))


def _collect(ckpt: Checkpoint, findings: Findings) -> None:
    tensors = ckpt.tensors
    for label, st in ckpt.shards.items():
        if tensors.keys().isdisjoint(st.tensors):  # the usual case: no name seen before
            tensors.update(zip(st.tensors, _refs(st), strict=True))
            continue
        for name, info in st.tensors.items():
            prev = tensors.get(name)
            if prev is not None:
                findings.add(
                    ck.CK_DUPLICATE_TENSOR, f"also stored in {prev.file}", file=label, tensor=name
                )
                continue
            tensors[name] = TensorRef(st, info)


def _reject_tensors(ckpt: Checkpoint, wm: dict[str, str], findings: Findings) -> None:
    """Index entries of rejected or damaged shards are rejected tensors; a name its shard
    lacks is CK004."""
    for name, label in wm.items():
        st = ckpt.shards.get(label)
        if label in ckpt.rejected_files or (
            label in ckpt.damaged_shards and name not in st.tensors
        ):
            ckpt.rejected_tensors.add(name)  # the shard's own finding is the root cause
        elif st is not None and name not in st.tensors:
            _missing_tensor(findings, name, label)


def _missing_tensor(findings: Findings, name: str, label: str) -> None:
    findings.add(
        ck.CK_INDEX_MISSING_TENSOR,
        f"mapped to {label} but not in it",
        file=INDEX_NAME,
        tensor=name,
        pointer="/weight_map",
    )


def _load_index(ckpt: Checkpoint, present: list[str], findings: Findings, ahead: ReadAhead) -> None:
    """The index and the shards it names (and those it does not): by its weight_map's groups
    where they match the headers exactly (io/index_scan), else parsed and tested name by name,
    with the same findings either way."""
    try:
        data: bytes | None = read_document(ckpt.root / INDEX_NAME, DEFAULT_MAX_BYTES)
    except (ValueError, OSError):  # `_read_json` reads it again and says why it cannot
        data = None
    if data is not None:
        scan = scan_index(data)
        if scan is not None and _load_scanned(ckpt, present, findings, ahead, scan, data):
            return
    ckpt.index = _read_json(ckpt, INDEX_NAME, findings, data)
    _load_indexed(ckpt, present, findings, ahead)


def _load_scanned(
    ckpt: Checkpoint,
    present: list[str],
    findings: Findings,
    ahead: ReadAhead,
    scan: IndexScan,
    data: bytes,
) -> bool:
    """The shards of a scanned index. When each holds exactly the names the weight_map gives it
    and no other shard holds a tensor, there is nothing to test name by name. Else the index is
    parsed and tested so, with these shards; only one whose parse has a finding (a repeated
    name: the scan takes no other JSON issue) gives False, with the checkpoint as it was, for
    the caller to load it all again in the parse's order."""
    trial = Findings()
    rejected = set(ckpt.rejected_files)  # configs (no shard is read yet)
    _read_referenced(ckpt, sorted(scan.groups), present, trial, ahead)
    shards = ckpt.shards
    exact = ckpt.rejected_files == rejected and not ckpt.damaged_shards
    exact = exact and scan.entries == len(ckpt.tensors)  # no tensor but the named ones
    if exact and all(
        label in shards and holds_group(shards[label].tensors, group)
        for label, group in scan.groups.items()
    ):
        ckpt.index, ckpt.weight_map_matched = scan.document, True
        findings.extend(trial)
        _check_total_size(ckpt, ckpt.index, findings)
        return True
    parsed = Findings()
    index = parse_json(data, parsed, INDEX_NAME)
    if parsed or not isinstance(index, dict):
        ckpt.shards, ckpt.tensors = {}, {}
        ckpt.rejected_files, ckpt.damaged_shards, ckpt.rejected_tensors = rejected, set(), set()
        return False
    ckpt.index = index
    findings.extend(trial)
    wm = index["weight_map"]  # a dict of str (the scan read it)
    _check_names(ckpt, wm, set(wm.values()), findings)
    _check_total_size(ckpt, index, findings)
    return True


def _load_indexed(
    ckpt: Checkpoint, present: list[str], findings: Findings, ahead: ReadAhead
) -> None:
    idx = ckpt.index
    wm = idx.get("weight_map") if isinstance(idx, dict) else None
    # every value a str: tested per type, not per value (176,000 on GLM-5.2)
    if not isinstance(wm, dict) or not all(issubclass(t, str) for t in set(map(type, wm.values()))):
        if INDEX_NAME not in ckpt.rejected_files:  # else the JSON finding says why
            findings.add(
                ck.CK_INDEX_MALFORMED,
                "weight_map must map tensor names to shard files",
                file=INDEX_NAME,
                pointer="/weight_map",
            )
        for label in present:
            st = _read_shard(ckpt, label, findings, ahead)
            if st is not None:
                ckpt.shards[label] = st
        _collect(ckpt, findings)
        return
    mapped = set(wm.values())  # not `in wm.values()`: that is O(tensors) per shard
    _read_referenced(ckpt, sorted(mapped), present, findings, ahead)
    _check_names(ckpt, wm, mapped, findings)
    _check_total_size(ckpt, idx, findings)


def _check_names(
    ckpt: Checkpoint, wm: dict[str, str], mapped: set[str], findings: Findings
) -> None:
    """Every weight_map name in the shard it names (CK004), every tensor named (CK005)."""
    covered = False  # every weight_map name is a loaded tensor
    if not ckpt.rejected_files and not ckpt.damaged_shards:  # the usual case, one lookup each
        held = {label: st.tensors for label, st in ckpt.shards.items()}
        before = len(findings)
        for name, label in wm.items():
            names = held.get(label)
            if names is not None and name not in names:
                _missing_tensor(findings, name, label)
        covered = len(findings) == before and held.keys() >= mapped
    else:
        _reject_tensors(ckpt, wm, findings)
    # names are unique in both: when the index names only loaded tensors, equal counts mean
    # the same names (one length test instead of 10^5 lookups)
    same = covered and len(wm) == len(ckpt.tensors)
    unmapped = () if same or ckpt.tensors.keys() <= wm.keys() else ckpt.tensors.items()
    for name, ref in unmapped:
        if wm.get(name) != ref.file and name not in wm:
            findings.add(
                ck.CK_UNMAPPED_TENSOR, "not in the index weight_map", file=ref.file, tensor=name
            )


def _check_total_size(ckpt: Checkpoint, idx: dict[str, Any], findings: Findings) -> None:
    meta = idx.get("metadata")
    total = meta.get("total_size") if isinstance(meta, dict) else None
    if total is not None and not ckpt.rejected_tensors:
        actual = ckpt.payload_bytes()
        if type(total) is not int or total != actual:
            findings.add(
                ck.CK_TOTAL_SIZE,
                f"total_size {total!r}, tensors hold {actual} bytes",
                file=INDEX_NAME,
                pointer="/metadata/total_size",
            )


def _read_referenced(
    ckpt: Checkpoint,
    referenced: list[str],
    present: list[str],
    findings: Findings,
    ahead: ReadAhead,
) -> None:
    """The header of each shard the index names (`referenced`, sorted), then of each other
    `.safetensors` file present (CK006), and every tensor they hold into `ckpt.tensors`."""
    for label in referenced:
        # Lexical check only: checkpoint shards may be symlinks (a Hugging Face cache snapshot
        # links every file into ../../blobs); cartridges, which forbid links, use open_inside.
        problem = relative_path_problem(label)
        if problem:
            ckpt.rejected_files.add(label)
            findings.add(
                io_rules.PA_ESCAPE,
                f"shard path {label!r} {problem}",
                file=INDEX_NAME,
                pointer="/weight_map",
            )
            continue
        try:
            absent = "" if (ckpt.root / label).is_file() else _absent(ckpt.root / label)
        except OSError as exc:  # e.g. a name too long for the file system
            absent = exc.strerror or str(exc)
        if absent:
            ckpt.rejected_files.add(label)
            findings.add(
                ck.CK_INDEX_MISSING_SHARD,
                f"{label} is referenced but {absent}",
                file=INDEX_NAME,
                pointer="/weight_map",
            )
            continue
        if "/" in label:  # top-level links were reported by load_checkpoint
            _report_links(ckpt.root, [label], findings)
        st = _read_shard(ckpt, label, findings, ahead)
        if st is not None:
            ckpt.shards[label] = st
    mapped = set(referenced)
    for label in present:
        if label not in mapped and label not in ckpt.shards:
            findings.add(ck.CK_UNREFERENCED_SHARD, "no tensor of the index lives here", file=label)
            st = _read_shard(ckpt, label, findings, ahead)
            if st is not None:
                ckpt.shards[label] = st
    _collect(ckpt, findings)
