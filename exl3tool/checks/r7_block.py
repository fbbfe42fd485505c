"""R7 block and config copies (docs/formats/r7.md §1-§2): the `r7_routed_experts` block's
schema and integer rules (as vLLM enforces them), embedded vs external quantization config."""

from __future__ import annotations

from typing import Any

from exl3tool.formats.checkpoint import Checkpoint
from exl3tool.formats.r7 import Block
from exl3tool.io.schemas import schema, schema_errors
from exl3tool.io.strict_json import is_json_int, pointer_join
from exl3tool.rules import checkpoint as ck
from exl3tool.rules import r7 as r7
from exl3tool.rules.registry import Findings

QC = "quantization_config.json"
BLOCK_SCHEMA = "r7-routed-experts.schema.json"
# The block fields vLLM validates, and the rule each one's defects fall under (§2.1).
BLOCK_RULES = {
    "schema": r7.R7_SCHEMA,
    "codebook": r7.R7_CODEBOOK_BITS,
    "bits": r7.R7_CODEBOOK_BITS,
    "moe_layers": r7.R7_MOE_LAYERS,
    "k_values": r7.R7_K_VALUES,
}


def check_block(block: Any, file: str, base: str, findings: Findings) -> Block | None:
    """Schema errors mapped to the rule of their field, then what JSON Schema cannot say:
    floats posing as ints (3.0) and last >= first."""
    if not isinstance(block, dict):
        findings.add(
            r7.R7_BLOCK_TYPE, "r7_routed_experts must be an object", file=file, pointer=base
        )
        return None
    reported: set[str] = set()
    errors = [] if surely_valid(schema(BLOCK_SCHEMA), block) else schema_errors(BLOCK_SCHEMA, block)
    for ptr, msg, path in errors:
        key = str(path[0]) if path else ""
        if key in reported:
            continue
        r = BLOCK_RULES.get(key, r7.R7_BLOCK_FIELD)
        if key in BLOCK_RULES:
            reported.add(key)
        findings.add(r, msg, file=file, pointer=base + ptr)
    ml, kv = block.get("moe_layers"), block.get("k_values")
    ok_layers = (
        isinstance(ml, list)
        and len(ml) == 2
        and all(is_json_int(x) and x >= 0 for x in ml)
        and ml[1] >= ml[0]
    )
    if not ok_layers and "moe_layers" not in reported:
        findings.add(
            r7.R7_MOE_LAYERS,
            f"moe_layers {ml!r}: two non-negative JSON integers [first, last] with last >= first",
            file=file,
            pointer=pointer_join(base, "moe_layers"),
        )
    ok_k = isinstance(kv, list) and kv and all(is_json_int(k) and k in (3, 4, 5) for k in kv)
    if not ok_k and "k_values" not in reported:
        findings.add(
            r7.R7_K_VALUES,
            f"k_values {kv!r}: non-empty JSON integers in {{3, 4, 5}}",
            file=file,
            pointer=pointer_join(base, "k_values"),
        )
    if not ok_layers:
        return None
    return Block(ml[0], ml[1], frozenset(kv) if ok_k else frozenset((3, 4, 5)), file, base)


# The keywords `surely_valid` understands; annotations constrain nothing.
_ANNOTATIONS = frozenset(("$schema", "$id", "title", "description"))
_TYPES = {"object": dict, "array": list, "string": str}


def surely_valid(sub: Any, value: Any) -> bool:
    """True only when the JSON Schema `sub` (keywords as in draft 2020-12) finds no error in
    `value`, by stricter tests than the schema's own (integers are `int` only, constants and
    enums are of their own type): the usual valid block needs no jsonschema import (~50 ms).
    False for anything else, also a keyword it does not know: jsonschema then decides."""
    if type(sub) is not dict:
        return False
    for key, want in sub.items():
        if key in _ANNOTATIONS:
            continue
        if key == "type":
            if want == "integer":
                ok = type(value) is int
            else:
                kind = _TYPES.get(want) if type(want) is str else None
                ok = kind is not None and isinstance(value, kind)
        elif key in ("const", "enum"):
            options = [want] if key == "const" else want
            ok = type(options) is list and any(
                type(o) in (str, int) and type(value) is type(o) and value == o for o in options
            )
        elif key == "minimum":
            ok = type(value) is int and type(want) is int and value >= want
        elif key in ("minItems", "maxItems"):
            ok = isinstance(value, list) and type(want) is int
            ok = ok and (len(value) >= want if key == "minItems" else len(value) <= want)
        elif key == "required":
            ok = isinstance(value, dict) and type(want) is list and all(k in value for k in want)
        elif key == "additionalProperties":
            ok = want is True
        elif key == "properties":
            ok = isinstance(value, dict) and type(want) is dict
            ok = ok and all(surely_valid(want[k], v) for k, v in value.items() if k in want)
        elif key == "prefixItems":
            ok = isinstance(value, list) and type(want) is list
            ok = ok and all(surely_valid(s, v) for s, v in zip(want, value, strict=False))
        elif key == "items":  # past prefixItems
            start = len(sub.get("prefixItems", ()))
            ok = isinstance(value, list) and all(surely_valid(want, v) for v in value[start:])
        else:
            return False
        if not ok:
            return False
    return True


def _diffs(a: Any, b: Any, ptr: str, out: list[str], limit: int = 5) -> None:
    if len(out) >= limit:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(pointer_join(ptr, k))
            elif a[k] != b[k] or type(a[k]) is not type(b[k]):
                _diffs(a[k], b[k], pointer_join(ptr, k), out, limit)
            if len(out) >= limit:
                return
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y or type(x) is not type(y):
                _diffs(x, y, pointer_join(ptr, i), out, limit)
    else:
        out.append(ptr)


def check_quant_configs(ckpt: Checkpoint, findings: Findings) -> tuple[dict | None, str, str]:
    """Embedded vs external copy (§1) and the quant_method stamp. Returns (config, file, ptr)."""
    ext, emb = ckpt.quant_config, ckpt.embedded_quant
    if ext is None:
        findings.add(ck.CK_QUANT_CONFIG, "quantization_config.json is missing", file=QC)
    if ckpt.config is not None and emb is None:
        findings.add(
            r7.R7_EMBEDDED_MISSING,
            "config.json has no quantization_config",
            file="config.json",
            pointer="/quantization_config",
        )
    if isinstance(ext, dict) and isinstance(emb, dict):
        diffs: list[str] = []
        _diffs(emb, ext, "", diffs)
        for ptr in diffs:
            findings.add(
                r7.R7_DRIFT,
                f"config.json /quantization_config{ptr} differs from {QC}{ptr or ' (root)'}",
                file="config.json",
                pointer="/quantization_config" + ptr,
            )
    if isinstance(ext, dict):
        qc, file, base = ext, QC, ""
    elif isinstance(emb, dict):
        qc, file, base = emb, "config.json", "/quantization_config"
    else:
        return None, QC, ""
    qm = qc.get("quant_method")
    if qm != "exl3":
        findings.add(
            r7.R7_QUANT_METHOD,
            f"quant_method {qm!r} is the carrier's producer stamp; vLLM serves the routed "
            "experts as exl3 because r7_routed_experts (v2 schema) is present, unless "
            "--quantization forces another method",
            file=file,
            pointer=base + "/quant_method",
        )
    return qc, file, base
