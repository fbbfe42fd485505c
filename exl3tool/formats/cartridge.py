"""A cartridge as manifest + shard headers + a key index (docs/formats/msrt.md §2-§4, §9 A/C).

`load_cartridge` reads `adapter_config.json` and every listed shard's safetensors header; payload
bytes are never read. Files are opened without following symlinks (`io.paths.open_inside`), except
links into the adapter itself or into the Hugging Face cache's blobs/ (a cache snapshot), which are
read like files; any other link is a PA002 error, since the runtime opens adapter files without
following links (`stage-cartridge`, which follows them, writes a real-file copy). Path and key-index
defects become findings, and the model returned is best effort so that later checks still run.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from exl3tool.formats import msrt_spec as spec
from exl3tool.io.jsonfile import drop_rejected, report_issues
from exl3tool.io.paths import Links, PathViolation, open_inside, relative_path_problem
from exl3tool.io.safetensors import FileStamp, SafetensorsFile, TensorInfo, read_header
from exl3tool.io.strict_json import loads
from exl3tool.rules import cartridge as ca
from exl3tool.rules import io as io_rules
from exl3tool.rules.errors import InputError
from exl3tool.rules.registry import Findings

_PATH_RULES = {
    "escape": io_rules.PA_ESCAPE,
    "symlink": io_rules.PA_SYMLINK,
    "missing": io_rules.PA_MISSING,
    "not-regular": io_rules.PA_NOT_REGULAR,
}


class KeyRef(NamedTuple):
    """A tensor key and the shard that stores it."""

    shard: SafetensorsFile
    info: TensorInfo


@dataclass(frozen=True)
class StageKey:
    """A parsed key `<layer_part>.{E}.{proj}.rank{r}.{component}_{label}` (§3)."""

    name: str
    layer_part: str
    layer: int | None  # None when the layer part is not canonical (rule 19)
    expert: int
    proj: str
    rank: int
    component: str
    label: str


def parse_key(name: str) -> StageKey | None:
    """Parse with the runtime's permissive regex; None = malformed (rule 17)."""
    m = spec.KEY_RE.match(name)
    if m is None:
        return None
    lm = spec.CANONICAL_LAYER_RE.fullmatch(m.group("layer_part"))
    return StageKey(
        name,
        m.group("layer_part"),
        int(lm.group("layer")) if lm else None,
        int(m.group("expert")),
        m.group("proj"),
        int(m.group("rank")),
        m.group("component"),
        m.group("label"),
    )


@dataclass(frozen=True)
class ShardEntry:
    """One `shards[]` entry whose path was acceptable and whose file was opened."""

    index: int
    path: str
    size: Any  # as declared (checked by the rules)
    sha256: Any
    stamp: FileStamp


@dataclass
class Cartridge:
    root: Path
    manifest: dict[str, Any] | None = None
    manifest_bytes: bytes | None = None
    entries: list[ShardEntry] = field(default_factory=list)
    shards: dict[str, SafetensorsFile] = field(default_factory=dict)  # manifest path -> header
    keys: dict[str, KeyRef] = field(default_factory=dict)
    entry_file: str | None = None  # a shard file passed instead of the directory
    links: Links = "cache"  # which symlinks are read like files (io.paths.Links)
    # Listed shards whose keys are not all known (wrong size, unusable header, dropped entries):
    # their own finding is the root cause, and the key checks are skipped (checks.cartridge).
    damaged: set[str] = field(default_factory=set)

    def field(self, name: str, default: Any = None) -> Any:
        m = self.manifest
        return m.get(name, default) if isinstance(m, dict) else default

    @property
    def layout(self) -> str | None:
        tp = self.field("tensor_parallel")
        return tp.get("layout") if isinstance(tp, dict) else None

    @property
    def world_size(self) -> int | None:
        tp = self.field("tensor_parallel")
        ws = tp.get("world_size") if isinstance(tp, dict) else None
        return ws if type(ws) is int else None

    @property
    def chain_labels(self) -> list[str]:
        chain = self.field("chain")
        if not isinstance(chain, list):
            return []
        return [
            c["label"] for c in chain if isinstance(c, dict) and isinstance(c.get("label"), str)
        ]

    def chain_k(self) -> dict[str, int]:
        chain = self.field("chain")
        out: dict[str, int] = {}
        for c in chain if isinstance(chain, list) else []:
            if isinstance(c, dict) and isinstance(c.get("label"), str) and type(c.get("k")) is int:
                out.setdefault(c["label"], c["k"])
        return out

    def stage_keys(self) -> list[StageKey]:
        """Every well-formed key (malformed ones are reported by the rules)."""
        return [k for k in (parse_key(n) for n in self.keys) if k is not None]

    def total_bytes(self) -> int:
        return sum(e.stamp.size for e in self.entries)


def _no_symlink_on_path(path: Path) -> str | None:
    """Rule 1: the path itself is no symlink and no component of it is one."""
    p = Path(os.path.abspath(path))
    for part in (p, *p.parents):
        if part.is_symlink():
            return f"{part} is a symlink"
    return None


def read_manifest(
    root: Path, findings: Findings, links: Links = "cache"
) -> tuple[dict[str, Any] | None, bytes | None]:
    """Rule 3: `adapter_config.json` regular, ≤ 16 MiB, unchanged while read, strict JSON."""
    label = spec.ADAPTER_CONFIG
    try:
        try:
            fd = open_inside(root, label, links=links)
        except PathViolation as exc:
            if exc.kind != "symlink" or links != "cache":
                raise
            # the runtime would refuse it (PA002); read the target so the other checks still run
            findings.add(io_rules.PA_SYMLINK, str(exc), file=label)
            fd = open_inside(root, label, links="any")
    except PathViolation as exc:
        findings.add(ca.CA_CONFIG, f"cannot open {label}: {exc}", file=label)
        return None, None
    with os.fdopen(fd, "rb") as fh:
        before = FileStamp.of(os.fstat(fh.fileno()))
        if before.size > spec.MAX_MANIFEST_BYTES:
            findings.add(
                ca.CA_CONFIG, f"{before.size} bytes, limit {spec.MAX_MANIFEST_BYTES}", file=label
            )
            return None, None
        data = fh.read(spec.MAX_MANIFEST_BYTES + 1)
        after = FileStamp.of(os.fstat(fh.fileno()))
    if len(data) > spec.MAX_MANIFEST_BYTES or after != before or len(data) != before.size:
        findings.add(ca.CA_CONFIG, "changed or grew while it was read", file=label)
        return None, None
    value, issues = loads(data)
    report_issues(issues, findings, label)
    value = drop_rejected(value, issues)
    if not isinstance(value, dict):
        if value is not None or not issues:  # a bare `null` parses without an issue
            what = "null" if value is None else f"a JSON {type(value).__name__}"
            findings.add(ca.CA_CONFIG, f"is {what}, not a JSON object", file=label, pointer="")
        return None, data
    return value, data


def _open_listed(cart: Cartridge, rel: str, findings: Findings, pointer: str) -> int:
    """Open a listed file; a link the runtime would refuse is PA002, and its target is still
    read so that the other checks judge the bytes instead of repeating "missing"."""
    try:
        return open_inside(cart.root, rel, links=cart.links)
    except PathViolation as exc:
        if exc.kind != "symlink" or cart.links != "cache":
            raise
        findings.add(io_rules.PA_SYMLINK, str(exc), file=rel, pointer=pointer)
        return open_inside(cart.root, rel, links="any")


def _open_shards(cart: Cartridge, findings: Findings) -> None:
    shards = cart.field("shards")
    if not isinstance(shards, list):
        return
    seen: dict[str, int] = {}
    for i, sh in enumerate(shards):
        ptr = f"/shards/{i}"
        if not isinstance(sh, dict) or "path" not in sh:
            continue  # the schema reports the shape
        rel = sh["path"]
        problem = relative_path_problem(rel)
        if problem:
            findings.add(
                io_rules.PA_ESCAPE, f"shard path {rel!r} {problem}", file=spec.ADAPTER_CONFIG,
                pointer=ptr + "/path",
            )  # fmt: skip
            continue
        norm = os.path.normpath(rel)
        if norm in seen:
            findings.add(
                io_rules.PA_DUPLICATE,
                f"shard {rel!r} is listed again (also /shards/{seen[norm]})",
                file=spec.ADAPTER_CONFIG,
                pointer=ptr + "/path",
            )
            continue
        seen[norm] = i
        try:
            fd = _open_listed(cart, rel, findings, ptr + "/path")
        except PathViolation as exc:
            findings.add(_PATH_RULES[exc.kind], str(exc), file=rel, pointer=ptr + "/path")
            cart.damaged.add(rel)
            continue
        try:
            st = FileStamp.of(os.fstat(fd))
        finally:
            os.close(fd)
        entry = ShardEntry(i, rel, sh.get("size"), sh.get("sha256"), st)
        cart.entries.append(entry)
        cart.damaged.add(rel)  # until its header is read whole
        if type(entry.size) is int and entry.size != st.size:
            findings.add(
                ca.CA_SHARD_SIZE,
                f"file has {st.size} bytes, adapter_config.json says {entry.size}",
                file=rel,
                pointer=ptr + "/size",
            )
            continue  # truncated or grown: its header and keys would only repeat this
        try:
            header = read_header(cart.root / rel, findings, rel)
        except OSError as exc:
            findings.add(io_rules.PA_MISSING, f"cannot read: {exc.strerror or exc}", file=rel)
            continue
        if header is None:
            continue
        if (header.stamp.dev, header.stamp.ino) != (st.dev, st.ino):
            findings.add(io_rules.ST_CHANGED, "file was replaced while it was opened", file=rel)
            continue
        if not header.invalid_entries:
            cart.damaged.discard(rel)
        cart.shards[rel] = header
    total = sum(e.stamp.size for e in cart.entries)
    if total > spec.MAX_TOTAL_BYTES:
        findings.add(
            ca.CA_TOTAL_SIZE,
            f"shards hold {total} bytes, limit {spec.MAX_TOTAL_BYTES}",
            file=spec.ADAPTER_CONFIG,
            pointer="/shards",
        )


def _index_keys(cart: Cartridge, findings: Findings) -> None:
    """Rule 16: one key, one shard."""
    for rel, header in cart.shards.items():
        for name, info in header.tensors.items():
            prev = cart.keys.get(name)
            if prev is not None:
                findings.add(
                    ca.CA_DUPLICATE_KEY,
                    f"also stored in {prev.shard.label}",
                    file=rel,
                    tensor=name,
                )
                continue
            cart.keys[name] = KeyRef(header, info)


def load_cartridge(path: Path, findings: Findings, *, links: Links = "cache") -> Cartridge:
    """Load an adapter directory, or one shard file that its adjacent manifest lists (rule 6).
    `links`: which symlinked files are read like files (io.paths.Links)."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or exc}") from exc
    problem = _no_symlink_on_path(path)
    if problem:
        findings.add(ca.CA_PATH, f"{problem}: the adapter path must not be or traverse a symlink")
        return Cartridge(root=path)
    entry_file = None
    if stat.S_ISDIR(st.st_mode):
        root = path
    elif stat.S_ISREG(st.st_mode):
        root, entry_file = path.parent, path.name
    else:
        findings.add(ca.CA_NOT_DIR_OR_FILE, f"{path} is neither a directory nor a regular file")
        return Cartridge(root=path)
    cart = Cartridge(root=root, entry_file=entry_file, links=links)
    cart.manifest, cart.manifest_bytes = read_manifest(root, findings, links)
    if cart.manifest is None:
        return cart
    if entry_file is not None and entry_file != spec.ADAPTER_CONFIG:
        listed = {
            os.path.normpath(sh["path"])
            for sh in cart.field("shards") or []
            if isinstance(sh, dict) and isinstance(sh.get("path"), str)
        }
        if entry_file not in listed:
            findings.add(
                ca.CA_UNLISTED_ENTRY,
                f"{entry_file} is not listed by the adjacent adapter_config.json",
                file=entry_file,
            )
    _open_shards(cart, findings)
    _index_keys(cart, findings)
    return cart
