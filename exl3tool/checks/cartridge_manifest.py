"""Manifest contract of `fq-cartridge-adapter/3` (docs/formats/msrt.md §4, §7, §9 B).

The JSON Schema (`schemas/fq-cartridge-adapter-3.schema.json`) runs first; each schema error
becomes a finding of the rule that owns the field, with its JSON pointer. The semantic rules the
schema cannot express follow (integers that are not floats, parent links, ranks, key-set
equalities, created_utc's timezone, parent closure); a pointer already reported by the schema is
not reported again.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from exl3tool.formats import msrt_spec as spec
from exl3tool.io import schemas
from exl3tool.io.strict_json import pointer_join
from exl3tool.rules import cartridge as ca
from exl3tool.rules.registry import Findings, Rule

SCHEMA_FILE = "fq-cartridge-adapter-3.schema.json"
_ID_LISTS = ("selected_experts", "selected_layers")


def validator() -> Any:
    return schemas.validator(SCHEMA_FILE)


class _Reporter:
    """Adds findings on adapter_config.json, at most one per (rule, pointer)."""

    def __init__(self, findings: Findings) -> None:
        self.findings = findings
        self.seen: set[str] = set()

    def add(self, r: Rule, message: str, pointer: str) -> None:
        if pointer in self.seen:
            return
        self.seen.add(pointer)
        self.findings.add(r, message, file=spec.ADAPTER_CONFIG, pointer=pointer)


def _pointer(path: Iterable[Any]) -> str:
    p = ""
    for token in path:
        p = pointer_join(p, token)
    return p


def _rule_for(error: Any) -> Rule:
    path = list(error.absolute_path)
    if error.validator == "pattern" and error.validator_value == spec.LABEL_RE.pattern:
        return ca.CA_LABEL
    if not path:
        return (
            ca.CA_FIELDS if error.validator in ("required", "additionalProperties") else ca.CA_SHAPE
        )
    top = path[0]
    if top == "schema":
        return ca.CA_SCHEMA_VERSION
    if top in spec.ADAPTER_CONSTANTS:
        return ca.CA_CONSTANT
    if top in _ID_LISTS:
        return ca.CA_ID_LIST
    if top == "created_utc":
        return ca.CA_CREATED_UTC
    if top == "base":
        return ca.CA_BASE_BLOCK
    if top == "chain":
        return ca.CA_ID_LIST if len(path) >= 3 and path[2] == "experts" else ca.CA_CHAIN
    if top == "tensor_parallel":
        return ca.CA_TP_CONTRACT
    if top == "coverage" and len(path) >= 3:
        return ca.CA_ID_LIST
    if top == "campaign" and len(path) >= 2 and path[1] == "moe_layers":
        return ca.CA_ID_LIST
    return ca.CA_SHAPE


def schema_findings(manifest: Any, rep: _Reporter) -> None:
    if isinstance(manifest, dict) and "assembly" in manifest:
        # the runtime's only reading of it: _LABEL_RE.fullmatch(str(config.get("assembly"))),
        # so 20261204 passes as the label "20261204" (and 1.5 fails as "1.5")
        value = manifest["assembly"]
        if not isinstance(value, str | dict | list):
            manifest = {**manifest, "assembly": str(value)}
    errors = sorted(
        validator().iter_errors(manifest), key=lambda e: list(map(str, e.absolute_path))
    )
    for error in errors:
        r = _rule_for(error)
        pointer = _pointer(error.absolute_path)
        msg = error.message if len(error.message) < 300 else error.message[:297] + "..."
        if r is ca.CA_FIELDS:
            pointer = ""
            msg = _field_set_message(manifest)
        rep.add(r, msg, pointer)


def _field_set_message(manifest: dict[str, Any]) -> str:
    missing = [f for f in spec.ADAPTER_FIELDS if f not in manifest]
    unexpected = sorted(set(manifest) - set(spec.ADAPTER_FIELDS))
    return f"manifest fields do not match fq-cartridge-adapter/3: missing={missing}, unexpected={unexpected}"


# ---------------------------------------------------------------------------------------------
# semantic rules


def _int_slots(m: dict[str, Any]) -> Iterable[tuple[str, Any, Rule]]:
    """(pointer, value, rule) of every place §4 requires a JSON integer."""
    base = m.get("base")
    if isinstance(base, dict) and "k" in base:
        yield "/base/k", base["k"], ca.CA_BASE_BLOCK
    chain = m.get("chain")
    for i, st in enumerate(chain if isinstance(chain, list) else []):
        if isinstance(st, dict):
            if "k" in st:
                yield f"/chain/{i}/k", st["k"], ca.CA_CHAIN
            ex = st.get("experts")
            for j, v in enumerate(ex if isinstance(ex, list) else []):
                yield f"/chain/{i}/experts/{j}", v, ca.CA_ID_LIST
    tp = m.get("tensor_parallel")
    if isinstance(tp, dict):
        if "world_size" in tp:
            yield "/tensor_parallel/world_size", tp["world_size"], ca.CA_TP_CONTRACT
        for j, v in enumerate(tp.get("ranks") if isinstance(tp.get("ranks"), list) else []):
            yield f"/tensor_parallel/ranks/{j}", v, ca.CA_TP_CONTRACT
    for i, sh in enumerate(m.get("shards") if isinstance(m.get("shards"), list) else []):
        if isinstance(sh, dict) and "size" in sh:
            yield f"/shards/{i}/size", sh["size"], ca.CA_SHAPE
    if "num_tensors" in m:
        yield "/num_tensors", m["num_tensors"], ca.CA_SHAPE
    for f in _ID_LISTS:
        for j, v in enumerate(m.get(f) if isinstance(m.get(f), list) else []):
            yield f"/{f}/{j}", v, ca.CA_ID_LIST
    cov = m.get("coverage")
    for label, layers in cov.items() if isinstance(cov, dict) else []:
        for L, es in layers.items() if isinstance(layers, dict) else []:
            for j, v in enumerate(es if isinstance(es, list) else []):
                yield (
                    pointer_join(pointer_join(pointer_join("/coverage", label), L), j),
                    v,
                    ca.CA_ID_LIST,
                )
    camp = m.get("campaign")
    if isinstance(camp, dict):
        if "block_size" in camp:
            yield "/campaign/block_size", camp["block_size"], ca.CA_SHAPE
        ml = camp.get("moe_layers")
        for j, v in enumerate(ml if isinstance(ml, list) else []):
            yield f"/campaign/moe_layers/{j}", v, ca.CA_ID_LIST


def _check_ints(m: dict[str, Any], rep: _Reporter) -> None:
    # jsonschema accepts 1.0 as an "integer"; §4 wants true JSON integers
    for pointer, value, r in _int_slots(m):
        if isinstance(value, float):
            rep.add(
                r, f"{value!r} must be a JSON integer, not a number with a fraction part", pointer
            )


def ints(value: Any) -> list[int] | None:
    """A list of true ints, else None."""
    if isinstance(value, list) and all(type(v) is int for v in value):
        return value
    return None


def _check_created(m: dict[str, Any], rep: _Reporter) -> None:
    value = m.get("created_utc")
    if not isinstance(value, str):
        return
    if value.endswith("z"):
        # RFC 3339 §5.6 allows a lowercase z; the runtime's fromisoformat refuses it
        rep.add(
            ca.CA_CREATED_UTC,
            f"{value!r} ends in a lowercase 'z': RFC 3339 allows it, the runtime refuses it",
            "/created_utc",
        )
        return
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        rep.add(ca.CA_CREATED_UTC, f"{value!r} is not an RFC 3339 date-time", "/created_utc")
        return
    if parsed.tzinfo is None:
        rep.add(ca.CA_CREATED_UTC, f"{value!r} has no timezone", "/created_utc")


def _check_base(m: dict[str, Any], rep: _Reporter) -> None:
    base, layers = m.get("base"), ints(m.get("selected_layers"))
    if not isinstance(base, dict) or layers is None:
        return
    by_layer = base.get("compatibility_by_layer")
    if isinstance(by_layer, dict) and set(by_layer) != {str(L) for L in layers}:
        rep.add(
            ca.CA_BASE_BLOCK,
            f"compatibility_by_layer keys {sorted(by_layer, key=_num)} must equal selected_layers "
            f"{sorted(layers)}: invalid base compatibility identity",
            "/base/compatibility_by_layer",
        )


def _num(s: str) -> tuple[int, str]:
    return (int(s), s) if s.isdigit() else (1 << 62, s)


def _check_chain(m: dict[str, Any], rep: _Reporter) -> None:
    chain, base = m.get("chain"), m.get("base")
    if not isinstance(chain, list):
        return
    parent = base.get("label") if isinstance(base, dict) else None
    labels: list[Any] = []
    for i, st in enumerate(chain):
        if not isinstance(st, dict):
            return
        label = st.get("label")
        if label in labels:
            rep.add(ca.CA_CHAIN, f"stage label {label!r} appears twice", f"/chain/{i}/label")
        if isinstance(parent, str) and st.get("parent") != parent:
            what = "base.label" if i == 0 else f"chain[{i - 1}].label"
            rep.add(
                ca.CA_CHAIN,
                f"parent {st.get('parent')!r} must be {what} {parent!r}: the chain is a parent-linked path",
                f"/chain/{i}/parent",
            )
        labels.append(label)
        parent = label if isinstance(label, str) else None


def _check_coverage_keys(m: dict[str, Any], rep: _Reporter) -> None:
    chain, cov = m.get("chain"), m.get("coverage")
    if not isinstance(chain, list) or not isinstance(cov, dict):
        return
    labels = [st.get("label") for st in chain if isinstance(st, dict)]
    if not all(isinstance(x, str) for x in labels):
        return  # a rejected label (the schema reports it): nothing to compare with
    if set(cov) != set(labels):
        rep.add(
            ca.CA_COVERAGE_KEYS,
            f"coverage keys {sorted(cov)} must equal the chain labels {sorted(map(str, labels))}",
            "/coverage",
        )


def _is_iota(ranks: list[int], n: int) -> bool:
    """ranks == [0 .. n-1], without building a list of the declared n (issue 15)."""
    return len(ranks) == n and all(r == i for i, r in enumerate(ranks))


def _check_tp(m: dict[str, Any], rep: _Reporter) -> None:
    tp = m.get("tensor_parallel")
    if not isinstance(tp, dict):
        return
    ws, ranks, layout = tp.get("world_size"), tp.get("ranks"), tp.get("layout")
    if type(ws) is int and ws >= 1 and ints(ranks) is not None and not _is_iota(ranks, ws):
        rep.add(
            ca.CA_TP_CONTRACT,
            f"ranks {ranks} must be exactly [0 .. {ws - 1}]: invalid tensor_parallel contract",
            "/tensor_parallel/ranks",
        )
    if layout == "full" and ws != 1:
        rep.add(
            ca.CA_TP_CONTRACT,
            f"layout full requires world_size 1, got {ws!r}",
            "/tensor_parallel/world_size",
        )


def coverage_sets(m: dict[str, Any]) -> dict[str, dict[int, set[int]]] | None:
    """coverage as {label: {layer: experts}}, None when malformed."""
    cov = m.get("coverage")
    if not isinstance(cov, dict):
        return None
    out: dict[str, dict[int, set[int]]] = {}
    for label, layers in cov.items():
        if not isinstance(layers, dict):
            return None
        out[label] = {}
        for L, es in layers.items():
            if not spec.LAYER_KEY_RE.fullmatch(L) or ints(es) is None:
                return None
            out[label][int(L)] = set(es)
    return out


def _check_closure(m: dict[str, Any], rep: _Reporter) -> None:
    """§7: parent closure, and chain[].experts against the stage's coverage."""
    cov, chain = coverage_sets(m), m.get("chain")
    if cov is None or not isinstance(chain, list):
        return
    selected = ints(m.get("selected_experts"))
    prev: dict[int, set[int]] | None = None
    for i, st in enumerate(chain):
        # a rejected (non-string) label: the schema reports it; nothing after it can be checked
        if not isinstance(st, dict) or not isinstance(st.get("label"), str):
            return
        if st["label"] not in cov:
            return
        label = st["label"]
        stage = cov[label]
        if prev is not None:
            for L, es in sorted(stage.items()):
                extra = es - prev.get(L, set())
                if extra:
                    rep.add(
                        ca.CA_PARENT_CLOSURE,
                        f"stage {label} layer {L} covers experts {sorted(extra)} that its parent "
                        "does not: coverage is not parent-closed",
                        pointer_join(pointer_join("/coverage", label), L),
                    )
        union = set().union(*stage.values()) if stage else set()
        experts = st.get("experts")
        if experts == "all":
            if selected is not None and union != set(selected):
                rep.add(
                    ca.CA_CHAIN_EXPERTS,
                    f"stage {label} declares all experts but coverage is sparse "
                    f"({sorted(union)} of {sorted(selected)})",
                    f"/chain/{i}/experts",
                )
        elif ints(experts) is not None and set(experts) != union:
            rep.add(
                ca.CA_CHAIN_EXPERTS,
                f"stage {label} lists experts {sorted(experts)} but its coverage holds {sorted(union)}",
                f"/chain/{i}/experts",
            )
        prev = stage


def check_manifest(manifest: Any, findings: Findings) -> None:
    """Every §9 B rule (7-15) and the manifest-only parts of §7 on a parsed manifest."""
    rep = _Reporter(findings)
    if not isinstance(manifest, dict):
        return
    if manifest.get("schema") != spec.ADAPTER_SCHEMA:
        rep.add(
            ca.CA_SCHEMA_VERSION,
            f"schema {manifest.get('schema')!r}: unversioned cartridge tensors are not supported "
            f"(only {spec.ADAPTER_SCHEMA})",
            "/schema",
        )
        return  # the runtime checks schema first and stops
    schema_findings(manifest, rep)
    _check_ints(manifest, rep)
    _check_created(manifest, rep)
    _check_base(manifest, rep)
    _check_chain(manifest, rep)
    _check_coverage_keys(manifest, rep)
    _check_tp(manifest, rep)
    _check_closure(manifest, rep)
