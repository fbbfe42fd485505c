"""Small synthetic sources for the slicing tests (built once per test session)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from exl3tool.formats.checkpoint import Checkpoint, load_checkpoint
from exl3tool.rules.registry import Findings
from exl3tool.synth.exl3 import build_exl3
from exl3tool.synth.msrt import build_adapter, build_base
from exl3tool.synth.r7 import build_r7

INTER = 1024  # 8 x 128: splits at TP 1, 2, 4, 8


def exl3(root: Path) -> Path:
    """Plain EXL3 with MoE and dense layers; attention 8 KV heads x 128 (splits up to TP 8)."""
    p = build_exl3(
        root, hidden=1024, kv_dim=1024, intermediate=INTER, moe_intermediate=INTER,
        n_experts=4, k_values=(2, 3), shards=2, vocab=128,
    )  # fmt: skip
    cfg = json.loads((p / "config.json").read_text())
    cfg.update(num_attention_heads=8, num_key_value_heads=8, head_dim=128)
    (p / "config.json").write_text(json.dumps(cfg))
    return p


def r7(root: Path, uniform: bool = True) -> Path:
    """R7 with K per expert uniform over its projections and two K per layer (what the
    rank-sliced profile's runtime serves, TP012)."""
    k_map = {}
    if uniform:
        for layer in (1, 2):
            for e in range(4):
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    k_map[(layer, e, proj)] = 3 + (e + layer) % 2
    return build_r7(root, hidden=128, moe_intermediate=INTER, k_map=k_map)


def base(root: Path) -> Path:
    return build_base(root, intermediate=INTER, hidden=128)


def cartridge(root: Path, base_dir: Path) -> Path:
    return build_adapter(root, base_dir)


def load(path: Path) -> Checkpoint:
    f = Findings()
    ckpt = load_checkpoint(path, f, need_config=False)
    assert not f.has_errors(), [x.to_json() for x in f]
    return ckpt


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst
