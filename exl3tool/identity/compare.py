"""Compare identities: `identity --check` findings and `diff` results (both over JSON documents)."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exl3tool.formats.tail import config_tail
from exl3tool.identity.engine import ALGORITHMS
from exl3tool.identity.fast import OTHER, SCHEMA, Identity, parse_layers
from exl3tool.io import jsonfile
from exl3tool.io.fs import read_document
from exl3tool.io.jsonfile import parse_json
from exl3tool.rules import identity as ir
from exl3tool.rules import io as io_rules
from exl3tool.rules.errors import InputError
from exl3tool.rules.registry import Findings

if TYPE_CHECKING:
    from exl3tool.identity.compat import CompatIdentity

_HEX = frozenset("0123456789abcdef")
_HEX_BYTES = b"0123456789abcdef"


def _is_hex(v: Any, n: int = 64) -> bool:
    return isinstance(v, str) and len(v) == n and set(v) <= _HEX


def _hex_map(v: Any) -> bool:
    """Every value a 64-digit lower-case hex string: C-level passes over all of them at once
    (a record of 10^6 tensors), not a test per value."""
    if not isinstance(v, dict):
        return False
    values = v.values()
    if not all(issubclass(t, str) for t in set(map(type, values))):
        return False
    if values and set(map(len, values)) != {64}:
        return False
    try:
        digits = "".join(values).encode("ascii")
    except UnicodeEncodeError:
        return False
    return not digits.translate(None, _HEX_BYTES)  # nothing left once hex digits are dropped


_TYPE_KEYS = frozenset(("dtype", "shape"))
_DTYPE_OF, _SHAPE_OF = itemgetter("dtype"), itemgetter("shape")


def _types_map(v: Any) -> bool:
    """Every value {"dtype": str, "shape": [int >= 0, ...]}: C-level passes over all of them
    (a record of 10^6 tensors; a record read by its layout shares one value per type)."""
    if not isinstance(v, dict):
        return False
    values = list({id(t): t for t in v.values()}.values())  # each shared value once
    # dict subclasses too: the strict parser's (a record with escapes in it is parsed by it)
    if not all(issubclass(t, dict) for t in set(map(type, values))):
        return False
    if not {2}.issuperset(map(len, values)):
        return False
    if not all(map(_TYPE_KEYS.issuperset, values)):
        return False
    shapes = list(map(_SHAPE_OF, values))
    if not {str}.issuperset(map(type, map(_DTYPE_OF, values))):
        return False
    if not {list}.issuperset(map(type, shapes)):
        return False
    dims = list(chain.from_iterable(shapes))
    return {int}.issuperset(map(type, dims)) and (not dims or min(dims) >= 0)


def record_problem(doc: Any) -> str | None:
    """Why `doc` is not a usable exl3tool-identity/1 document (None when it is)."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    if doc.get("schema") != SCHEMA:
        return f"schema is {doc.get('schema')!r}, expected {SCHEMA!r}"
    if doc.get("algorithm") not in ALGORITHMS:
        return f"algorithm {doc.get('algorithm')!r} is not one of {', '.join(ALGORITHMS)}"
    for key in ("tensors", "layers"):
        if not _hex_map(doc.get(key)):
            return f"{key!r} must map names to 64-digit lower-case hex digests"
    if "types" in doc and not _types_map(doc["types"]):
        return '\'types\' must map names to {"dtype": string, "shape": [integers >= 0]}'
    if not _is_hex(doc.get("root")):
        return "'root' must be a 64-digit lower-case hex digest"
    sel = doc.get("selection")
    if sel is not None:
        if not isinstance(sel, str):
            return "'selection' must be a --layers spec string"
        try:
            parse_layers(sel)
        except Exception:
            return f"'selection' {sel!r} is not a --layers spec"
    c = doc.get("compatibility")
    if c is None:
        return None
    from exl3tool.identity.compat import ROOT_SCHEMA  # hashlib and the K tables: only here

    if not (
        isinstance(c, dict)
        and c.get("schema") == ROOT_SCHEMA
        and _hex_map(c.get("layers"))
        and _is_hex(c.get("root"))
    ):
        return f"'compatibility' is not a {ROOT_SCHEMA} block"
    return None


# A record holds ~210-300 bytes per tensor: `identity` writes 201 MiB for one header of 10^6
# short-named tensors. Above the 64 MiB of other JSON documents a record is read by its layout
# (`record_scan`: about its own size in memory; at most ~4x for a hostile document).
RECORD_MAX_BYTES = 256 << 20


def load_record(path: Path, findings: Findings) -> dict[str, Any] | None:
    """Read an identity document; every defect is an ID009/JS finding."""
    label = str(path)
    try:
        data = read_document(path, RECORD_MAX_BYTES)
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        findings.add(io_rules.JS_TOO_LARGE, f"JSON file too large: {exc}", file=label)
        return None
    if len(data) <= jsonfile.DEFAULT_MAX_BYTES:
        doc = parse_json(data, findings, label)
    else:
        doc = _scanned(data, findings, label)
    del data
    if doc is None:
        if not any(f.location.file == label for f in findings):
            findings.add(ir.ID_FILE, "cannot be read", file=label)
        return None
    problem = record_problem(doc)
    if problem:
        findings.add(ir.ID_FILE, problem, file=label)
        return None
    return doc


def _scanned(data: bytes, findings: Findings, label: str) -> Any:
    """A document above the usual limit, read as an identity record (JS006 if it is not one)."""
    from exl3tool.identity.record_scan import NotARecord, scan_record

    try:
        return scan_record(data, lambda rest: parse_json(rest, findings, label))
    except NotARecord as exc:
        findings.add(
            io_rules.JS_TOO_LARGE,
            f"JSON file too large: {len(data)} bytes, above the {jsonfile.DEFAULT_MAX_BYTES} "
            f"of other JSON, and not an identity record in the layout `identity` writes ({exc})",
            file=label,
        )
        return None


def problem_findings(ident: Identity, findings: Findings, label: str) -> None:
    """Reassembly defects of the artifact itself (ID007/ID008)."""
    for p in ident.problems:
        r = ir.ID_REPLICA if p.kind == "replica" else ir.ID_SLICES
        findings.add(r, p.message, file=label, tensor=p.tensor)


def check(recorded: dict[str, Any], ident: Identity, findings: Findings, label: str) -> None:
    """Report every tensor, layer, root and compatibility difference as a finding."""
    cur = ident.to_json(per_tensor=False)
    rt, rtypes = recorded["tensors"], recorded.get("types") or {}
    if not _same_tensors(rt, rtypes, ident):
        _tensor_findings(rt, rtypes, ident, findings, label)
    rl, cl = recorded["layers"], cur["layers"]
    for key in sorted(
        rl.keys() | cl.keys(), key=lambda k: (k == OTHER, int(k) if k.isdigit() else 0)
    ):
        if rl.get(key) != cl.get(key):
            what = (
                "absent from the artifact"
                if key not in cl
                else "not in the record"
                if key not in rl
                else f"{cl[key]}, recorded {rl[key]}"
            )
            findings.add(ir.ID_LAYER_DIGEST, f"layer {key}: {what}", file=label)
    if recorded["root"] != cur["root"]:
        findings.add(ir.ID_ROOT, f"{cur['root']}, recorded {recorded['root']}", file=label)
    rc, cc = recorded.get("compatibility"), cur.get("compatibility")
    if rc is not None:
        if cc is None:
            findings.add(ir.ID_COMPAT, "recorded, but the experts no longer qualify", file=label)
        else:
            for key in sorted(rc["layers"].keys() | cc["layers"].keys()):
                if rc["layers"].get(key) != cc["layers"].get(key):
                    findings.add(ir.ID_COMPAT, f"layer {key} differs", file=label)
            if (rc.get("k"), rc["root"]) != (cc["k"], cc["root"]):
                findings.add(
                    ir.ID_COMPAT,
                    f"root {cc['root']} (k={cc['k']}), recorded {rc['root']} (k={rc.get('k')})",
                    file=label,
                )


_DTYPE, _SHAPE, _DIGEST = attrgetter("dtype"), attrgetter("shape"), attrgetter("digest")


def _same_tensors(rt: Any, rtypes: Any, ident: Identity) -> bool:
    """Whether the record's tensor digests and types are the identity's, without a finding to
    make: C-level passes over the names in order (a record of 10^6 tensors). False whenever
    anything differs or is malformed; the per-name comparison then says what."""
    cur = ident.tensors
    if type(rt) is not dict or list(rt) != list(cur):
        return False
    values = cur.values()
    if list(rt.values()) != list(map(_DIGEST, values)):
        return False
    if not rtypes:
        return True
    if type(rtypes) is not dict or list(rtypes) != list(cur):
        return False
    try:
        dtypes = list(map(_DTYPE_OF, rtypes.values()))
        shapes = list(map(_SHAPE_OF, rtypes.values()))
    except (KeyError, TypeError):
        return False
    if any(len(t) != 2 for t in rtypes.values()) or dtypes != list(map(_DTYPE, values)):
        return False
    return shapes == list(map(list, map(_SHAPE, values)))


def _tensor_findings(
    rt: dict[str, Any], rtypes: dict[str, Any], ident: Identity, findings: Findings, label: str
) -> None:
    cur = ident.to_json()
    ct, ctypes = cur["tensors"], cur["types"]
    for name in sorted(rt.keys() | ct.keys()):
        if name not in ct:
            findings.add(ir.ID_TENSOR_MISSING, "recorded but absent", file=label, tensor=name)
        elif name not in rt:
            findings.add(ir.ID_TENSOR_UNEXPECTED, "not in the record", file=label, tensor=name)
        else:
            if rt[name] != ct[name]:
                findings.add(
                    ir.ID_TENSOR_DIGEST,
                    f"{cur['algorithm']} {ct[name]}, recorded {rt[name]}",
                    file=label,
                    tensor=name,
                )
            if name in rtypes and rtypes[name] != ctypes[name]:
                a, b = rtypes[name], ctypes[name]
                findings.add(
                    ir.ID_TENSOR_TYPE,
                    f"{b.get('dtype')}{b.get('shape')}, recorded "
                    f"{a.get('dtype') if isinstance(a, dict) else a}"
                    f"{a.get('shape') if isinstance(a, dict) else ''}",
                    file=label,
                    tensor=name,
                )


def published_findings(config: Any, compat: CompatIdentity | None, findings: Findings) -> None:
    """ID012: an MSRT base's published §6 identity against the one its bytes give."""
    tail = config_tail(config)
    if tail is None or compat is None or compat.root is None:
        return
    pub_layers = tail.compatibility_by_layer
    if pub_layers is not None:
        for key in sorted(pub_layers.keys() | compat.layers.keys()):
            if pub_layers.get(key) != compat.layers.get(key):
                findings.add(
                    ir.ID_PUBLISHED_COMPAT,
                    f"layer {key}: published {pub_layers.get(key)}, bytes give "
                    f"{compat.layers.get(key)}",
                    file="config.json",
                    pointer=f"/hybrid_tr3_tail/compatibility_by_layer/{key}",
                )
    pub_root = tail.get("compatibility_sha256")
    if pub_root != compat.root:
        findings.add(
            ir.ID_PUBLISHED_COMPAT,
            f"published {pub_root}, bytes give {compat.root}",
            file="config.json",
            pointer="/hybrid_tr3_tail/compatibility_sha256",
        )


@dataclass
class Diff:
    """What differs between identities A and B."""

    algorithm: str
    roots: tuple[str, str]
    layers_changed: list[str] = field(default_factory=list)
    layers_only_a: list[str] = field(default_factory=list)
    layers_only_b: list[str] = field(default_factory=list)
    tensors_changed: list[str] = field(default_factory=list)
    tensors_only_a: list[str] = field(default_factory=list)
    tensors_only_b: list[str] = field(default_factory=list)
    types_changed: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    k_changed: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # trellis prefix -> Ks
    compat: tuple[Any, Any] = (None, None)  # (k, root) of each side

    @property
    def identical(self) -> bool:
        """Same roots and compatibility, and no tensor that differs: a record edited by hand
        (a digest changed, its root kept) is not identical to the one it came from."""
        per_tensor = (self.tensors_changed, self.tensors_only_a, self.tensors_only_b)
        return (
            self.roots[0] == self.roots[1]
            and self.compat[0] == self.compat[1]
            and not any(per_tensor)
            and not self.types_changed
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "exl3tool-diff/1",
            "algorithm": self.algorithm,
            "identical": self.identical,
            "root": {"a": self.roots[0], "b": self.roots[1]},
            "layers": {
                "changed": self.layers_changed,
                "only_a": self.layers_only_a,
                "only_b": self.layers_only_b,
            },
            "tensors": {
                "changed": self.tensors_changed,
                "only_a": self.tensors_only_a,
                "only_b": self.tensors_only_b,
                "type_changed": {n: {"a": a, "b": b} for n, (a, b) in self.types_changed.items()},
            },
            "k": {n: {"a": a, "b": b} for n, (a, b) in self.k_changed.items()},
            "compatibility": {
                "a": _compat_json(self.compat[0]),
                "b": _compat_json(self.compat[1]),
            },
        }


def _compat_json(c: Any) -> Any:
    return None if c is None else {"k": c[0], "root": c[1]}


def _k(t: Any) -> Any:
    shape = t.get("shape") if isinstance(t, dict) else None
    if isinstance(shape, list) and len(shape) == 3 and isinstance(shape[-1], int):
        from exl3tool.formats.exl3 import k_of_last_dim

        return k_of_last_dim(shape[-1])
    return None


def _layer_sort(k: str) -> tuple[bool, int]:
    return (k == OTHER, int(k) if k.isdigit() else 0)


def diff(a: dict[str, Any], b: dict[str, Any]) -> Diff:
    """Differences between two identity documents of the same algorithm."""
    out = Diff(a["algorithm"], (a["root"], b["root"]))
    la, lb = a["layers"], b["layers"]
    out.layers_only_a = sorted(la.keys() - lb.keys(), key=_layer_sort)
    out.layers_only_b = sorted(lb.keys() - la.keys(), key=_layer_sort)
    out.layers_changed = sorted(
        (k for k in la.keys() & lb.keys() if la[k] != lb[k]), key=_layer_sort
    )
    ta, tb = a["tensors"], b["tensors"]
    ya, yb = a.get("types") or {}, b.get("types") or {}
    if ta == tb and ya == yb:  # the usual answer, one C-level comparison: no tensor differs
        return _with_compat(out, a, b)
    out.tensors_only_a = sorted(ta.keys() - tb.keys())
    out.tensors_only_b = sorted(tb.keys() - ta.keys())
    both = sorted(ta.keys() & tb.keys())
    out.tensors_changed = [n for n in both if ta[n] != tb[n]]
    for n in both:
        if n in ya and n in yb and ya[n] != yb[n]:
            out.types_changed[n] = (ya[n], yb[n])
    for n in sorted(ta.keys() | tb.keys()):
        prefix, last = n.rsplit(".", 1) if "." in n else ("", n)
        if last != "trellis" and not last.startswith("trellis_"):
            continue
        ka, kb = _k(ya.get(n)), _k(yb.get(n))
        if ka != kb:
            out.k_changed[prefix if last == "trellis" else n] = (ka, kb)
    return _with_compat(out, a, b)


def _with_compat(out: Diff, a: dict[str, Any], b: dict[str, Any]) -> Diff:
    ca, cb = a.get("compatibility"), b.get("compatibility")
    out.compat = (
        None if ca is None else (ca.get("k"), ca["root"]),
        None if cb is None else (cb.get("k"), cb["root"]),
    )
    return out
