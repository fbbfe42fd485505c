"""Open any artifact for hashing: a checkpoint or cartridge directory, or one shard file."""

from __future__ import annotations

from pathlib import Path

from exl3tool.formats.checkpoint import Checkpoint, ReadAhead, load_checkpoint
from exl3tool.formats.detect import Kind, detect
from exl3tool.rules import checkpoint as ck
from exl3tool.rules.registry import Findings

# Container findings that do not change which bytes an identity covers: a cartridge has no
# config.json or index, an index's bookkeeping does not decide what is stored.
_IRRELEVANT = frozenset(
    r.code
    for r in (
        ck.CK_CONFIG,
        ck.CK_NO_INDEX,
        ck.CK_UNMAPPED_TENSOR,
        ck.CK_UNREFERENCED_SHARD,
        ck.CK_TOTAL_SIZE,
        ck.CK_INDEX_MISSING_TENSOR,
    )
)


def open_artifact(path: Path, ahead: ReadAhead = None) -> tuple[Checkpoint, Kind, Findings]:
    """Headers of every shard (no payload read; `ahead`: see load_checkpoint), the artifact
    kind, and the container findings that matter for an identity (unreadable or duplicate
    tensors, broken headers)."""
    path = Path(path)
    kind = detect(path)
    if path.is_file() and path.name == "adapter_config.json":
        path = path.parent
    raw = Findings()
    ckpt = load_checkpoint(path, raw, need_config=False, ahead=ahead)
    kept = Findings(f for f in raw if f.code not in _IRRELEVANT)
    return ckpt, kind, kept
