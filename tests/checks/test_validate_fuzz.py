"""Property: whatever a config, block or manifest holds, validation yields findings, never an
exception (no traceback for any artifact defect)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exl3tool.actions.validate import validate_path
from exl3tool.checks.options import ValidateOptions

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


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
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
        doc = _set(doc, path, key, value)
        (root / name).write_text(json.dumps(doc, allow_nan=True))
        ref, findings = validate_path(root, ValidateOptions(hash=hash_, tp=2))
        assert ref.path == str(root)
        for f in findings:
            assert f.location.file


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=64))
def test_garbage_json_files_never_crash(pristine: dict[str, Path], data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(shutil.copytree(pristine["r7"], Path(tmp) / "r7"))
        for name in ("r7-experts-layer-002.json", "MANIFEST.json", "MANIFEST.sha256"):
            (root / name).write_bytes(data)
        validate_path(root, ValidateOptions(hash=True))
