"""How much memory one verify-swap rank needs, estimated before any worker starts (issue 16).

A rank holds one layer at a time (`runtime.verify_rank`):

* the hot base layer: every expert's three decoded fp16 `W_eff` (this rank's TP cut) and their
  int16 trellises (on the decode device);
* the hot stage terms of that layer: one decoded fp16 matrix per (stage, expert, projection) the
  adapter applies (upper bound: the chain's expert lists);
* one cold expert at full size (base and stages) and the fp32 transients of its GEMMs;
* a fixed overhead (interpreter, torch, allocator slack; the CUDA context on a GPU).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from exl3tool.rules import verify as vs_rules
from exl3tool.rules.errors import Exl3ToolError, UsageError

FIXED_CPU = 768 << 20
FIXED_CUDA = 1 << 30
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class ResourceRefused(Exl3ToolError):
    """The run would not fit (VS001) or a rank died (VS002): exit 3, nothing left behind."""

    exit_code = 3

    def __init__(self, rule_code: str, message: str) -> None:
        super().__init__(f"{rule_code} {message}")
        self.rule_code = rule_code


def parse_size(text: str) -> int:
    """`4G`, `512M`, `1.5g`, `1073741824` -> bytes (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if m is None:
        raise UsageError(f"--max-memory {text!r}: expected a size such as 8G or 512M")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


@dataclass(frozen=True)
class Estimate:
    per_rank: int  # bytes on the rank's device (host RAM on CPU, VRAM on CUDA)
    host_per_rank: int  # host RAM per rank (equal to per_rank on CPU)
    layer_fp16: int  # the largest layer's decoded fp16 base weights on one rank

    def text(self) -> str:
        return f"{self.per_rank / 2**30:.2f} GiB per rank ({self.layer_fp16 / 2**30:.2f} GiB layer)"


def _stage_matrices(adapter: Path, experts: int) -> int:
    path = Path(adapter) / "adapter_config.json"
    if not path.is_file():  # a FIFO would block; staging reports what it is
        return 0
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
        return sum(len(c.get("experts") or range(experts)) for c in m["chain"]) * 3
    except (OSError, ValueError, KeyError, TypeError):
        return 0  # unreadable: staging reports it; the estimate assumes no stages


def estimate(
    geometry: tuple[int, int, int, int], adapters: list[Path], world: int, device: str
) -> Estimate:
    """geometry: (hidden, intermediate, experts, base K)."""
    hidden, inter, experts, k = geometry
    matrix = hidden * inter * 2  # one full fp16 W_eff
    local = matrix // world
    base = experts * 3 * local
    stages = max((_stage_matrices(a, experts) for a in adapters), default=0) * local
    s = max(1, stages // max(1, 3 * local))
    cold = 3 * matrix * (1 + s) + 4 * matrix  # one cold expert + fp32 GEMM transients
    trellis = experts * 3 * local * k // 16
    if device == "cuda":
        return Estimate(base + stages + cold + trellis + FIXED_CUDA, FIXED_CPU + 4 * matrix, base)
    need = base + stages + cold + trellis + FIXED_CPU
    return Estimate(need, need, base)


def capacity(device: str, world: int) -> int | None:
    """Bytes one rank can have on this machine: physical RAM (or the cgroup's limit) / ranks, or
    the smallest GPU's total memory. Totals, not what is free now: the refusal must not depend on
    what other processes happen to hold (a run that fits the machine is never refused)."""
    if device == "cuda":
        import torch

        # device properties, not mem_get_info: no CUDA context is created in the parent
        n = min(world, torch.cuda.device_count())
        totals = [torch.cuda.get_device_properties(i).total_memory for i in range(n)]
        return min(totals) if totals else None
    limits = []
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    limits.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        raw = Path("/sys/fs/cgroup/memory.max").read_text(encoding="ascii").strip()
        if raw.isdigit():
            limits.append(int(raw))
    except OSError:
        pass
    return min(limits) // world if limits else None


def check_budget(est: Estimate, device: str, world: int, max_memory: int | None) -> None:
    """Refuse (VS001) when the estimate exceeds --max-memory or what the machine has."""
    if max_memory is not None and est.per_rank > max_memory:
        raise ResourceRefused(
            vs_rules.VS_MEMORY.code,
            f"verify-swap needs about {est.text()}, more than --max-memory "
            f"{max_memory / 2**30:.2f} GiB; {vs_rules.VS_MEMORY.hint}",
        )
    have = capacity(device, world)
    if have is not None and est.per_rank > have:
        where = "GPU memory" if device == "cuda" else "memory per rank on this machine"
        raise ResourceRefused(
            vs_rules.VS_MEMORY.code,
            f"verify-swap needs about {est.text()}, more than the {have / 2**30:.2f} GiB of "
            f"{where}; {vs_rules.VS_MEMORY.hint}",
        )
