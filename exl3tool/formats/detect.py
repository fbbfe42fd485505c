"""Which kind of artifact a path is (issue: foundation, 'detect the artifact kind')."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any

from exl3tool.formats.tail import config_tail
from exl3tool.io.jsonfile import read_json
from exl3tool.io.strict_json import loads
from exl3tool.rules.registry import Findings


class Kind(str, enum.Enum):
    EXL3 = "exl3"
    R7 = "r7"
    RANK_SLICED = "rank-sliced"
    MSRT_BASE = "msrt-base"
    CARTRIDGE = "cartridge"
    SAFETENSORS = "safetensors"
    TP_SLICES = "tp-slices"  # an `exl3tool slice` output directory (its rank folders inside)
    UNKNOWN = "unknown"


SLICES_MANIFEST = "exl3tool-slices.json"  # what `exl3tool slice` writes (tp/configs.py)


def _quiet_json(path: Path) -> Any:
    try:
        with open(path, "rb") as fh:
            value, _ = loads(fh.read(64 * 1024 * 1024))
        return value
    except OSError:
        return None


def kind_from_configs(config: Any, quant_config: Any) -> Kind:
    config = config if isinstance(config, dict) else {}
    tail = config_tail(config)
    if tail is not None and tail.is_msrt_base:
        return Kind.MSRT_BASE
    for q in (quant_config, config.get("quantization_config")):
        if isinstance(q, dict) and "r7_routed_experts" in q:
            return Kind.R7
    if tail is not None and tail.is_rank_sliced_format and "tensor_schema" in tail.raw:
        return Kind.RANK_SLICED
    for q in (quant_config, config.get("quantization_config")):
        if isinstance(q, dict) and ("tensor_storage" in q or q.get("quant_method") == "exl3"):
            return Kind.EXL3
    return Kind.UNKNOWN


def detect(path: Path) -> Kind:
    """Detect from the files present; never raises for a readable path."""
    path = Path(path)
    if path.is_file():
        if path.name == "adapter_config.json":
            return Kind.CARTRIDGE
        if path.suffix == ".safetensors":
            if (path.parent / "adapter_config.json").is_file():
                return Kind.CARTRIDGE
            return Kind.SAFETENSORS
        if path.name in ("config.json", "quantization_config.json"):
            return detect(path.parent)
        return Kind.UNKNOWN
    if (path / "adapter_config.json").is_file():
        return Kind.CARTRIDGE
    if (path / SLICES_MANIFEST).is_file() and not (path / "config.json").is_file():
        return Kind.TP_SLICES
    config = _quiet_json(path / "config.json") if (path / "config.json").is_file() else None
    qc_path = path / "quantization_config.json"
    quant = _quiet_json(qc_path) if qc_path.is_file() else None
    return kind_from_configs(config, quant)


def report_unusable_configs(path: Path, findings: Findings) -> bool:
    """Report the JSON defects of a directory's config.json / quantization_config.json that
    stopped `detect`; True when one of them could not be used (then it is the root cause and an
    "unknown kind" finding would only repeat it)."""
    unusable = False
    for name in ("config.json", "quantization_config.json"):
        p = Path(path) / name
        if not p.is_file():
            continue
        before = len(findings)
        if read_json(p, findings, name) is None and len(findings) > before:
            unusable = True
    return unusable
