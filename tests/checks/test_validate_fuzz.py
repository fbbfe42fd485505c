"""Properties: whatever a config, block or manifest holds, validation yields findings, never an
exception (no traceback for any artifact defect), and a value the format fixes is an error."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exl3tool.actions.validate import validate_path
from exl3tool.checks.options import ValidateOptions
from exl3tool.io.strict_json import loads

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
TARGETS = st.sampled_from(
    [
        ("config.json", ()),
        ("config.json", ("quantization_config",)),
        ("config.json", ("hybrid_tr3_tail",)),
        ("quantization_config.json", ("r7_routed_experts",)),
        ("r7-experts-layer-001.json", ()),
        ("MANIFEST.json", ()),
        ("model.safetensors.index.json", ()),
    ]
)


def _set(doc: object, path: tuple[str, ...], key: str, value: object) -> object:
    node = doc
    for p in path:
        if not isinstance(node, dict) or not isinstance(node.get(p), dict):
            return value  # replace the whole document
        node = node[p]
    node[key] = value
    return doc


# Values the pristine checkpoint's rules pin to what it holds (docs/formats/r7.md): any
# other value is an error. The block and the embedded copy are compared with each other (docs/formats/r7.md §1:
# any change to one is drift); the rest are sizes, counts and ranges the tensors fix.
PINNED = {
    ("config.json", ()): {"hidden_size", "n_routed_experts"},
    ("config.json", ("quantization_config",)): None,  # every key (docs/formats/r7.md §1 drift)
    ("quantization_config.json", ("r7_routed_experts",)): None,
    ("config.json", ("hybrid_tr3_tail",)): {"moe_layers", "tp", "format", "experts_per_layer"},
    ("r7-experts-layer-001.json", ()): {"layer", "shard", "bit_map", "allocation_bit_units"},
}


def _pinned(target: tuple[str, tuple[str, ...]], key: str, old: object, new: object) -> bool:
    """Whether replacing `old` (absent: _MISSING) by `new` at `key` must give an error."""
    keys = PINNED.get(target, set())
    if keys is not None and key not in keys:
        return False
    # == conflates 1 with 1.0 and 0 with False; such replacements are left to the unit tests
    return old is _MISSING or old != new


_MISSING = object()


def _get(doc: object, path: tuple[str, ...], key: str) -> object:
    node = doc
    for p in (*path, key):
        if not isinstance(node, dict) or p not in node:
            return _MISSING
        node = node[p]
    return node


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    target=TARGETS,
    key=st.sampled_from(
        [
            "moe_layers",
            "k_values",
            "schema",
            "bits",
            "bit_map",
            "payload_sha256",
            "tp",
            "weight_map",
            "files_sha256",
            "n_routed_experts",
            "hidden_size",
            "r7_routed_experts",
            "allocation_bit_units",
            "layer",
            "shard",
            "format",
            "experts_per_layer",
            "x",
        ]
    ),
    value=JSON,
    hash_=st.booleans(),
)
def test_random_json_never_crashes(pristine: dict[str, Path], target, key, value, hash_) -> None:
    name, path = target
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(shutil.copytree(pristine["r7"], Path(tmp) / "r7"))
        doc = json.loads((root / name).read_text())
        old = _get(doc, path, key)
        doc = _set(doc, path, key, value)
        (root / name).write_text(json.dumps(doc, allow_nan=True))
        ref, findings = validate_path(root, ValidateOptions(hash=hash_))
        assert ref.path == str(root)
        for f in findings:
            assert f.location.file
        if hash_:  # every target file is covered by files_sha256 or the MANIFEST.sha256 seal
            assert findings.has_errors(), (name, key, value)
        elif _pinned(target, key, old, value):
            assert findings.has_errors(), (name, path, key, value)


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.binary(max_size=64))
def test_garbage_json_files_never_crash(pristine: dict[str, Path], data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(shutil.copytree(pristine["r7"], Path(tmp) / "r7"))
        names = ("r7-experts-layer-002.json", "MANIFEST.json", "MANIFEST.sha256")
        for name in names:
            (root / name).write_bytes(data)
        _, findings = validate_path(root, ValidateOptions(hash=True))
        # each garbage file is named by an error: unreadable, not the schema, not the seal (the
        # seal is read only when MANIFEST.json is an object: it seals that document, docs/formats/r7.md §5)
        sealed = isinstance(loads(data)[0], dict)
        for name in names if sealed else names[:2]:
            assert any(Path(f.location.file or "").name == name for f in findings.errors()), (
                name,
                [(f.code, f.location.file) for f in findings],
            )


def test_pristine_is_clean(pristine: dict[str, Path]) -> None:
    """The baseline the properties above mutate has no error (so an error is the mutation's)."""
    for opts in (ValidateOptions(), ValidateOptions(hash=True)):
        _, findings = validate_path(pristine["r7"], opts)
        assert not findings.has_errors(), [f.code for f in findings.errors()]
