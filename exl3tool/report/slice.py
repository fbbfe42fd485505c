"""`exl3tool slice` as text: the plan per rank and what is replicated."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def human_bytes(n: int) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"


def plan_text(summary: dict[str, Any], out: Path | None, dry: bool) -> str:
    lines = [
        f"{'plan' if dry else 'sliced'}: {summary['kind']}, TP {summary['tp']}"
        + (f", mode {summary['mode']}, layout {summary['layout']}" if "mode" in summary else "")
        + (f" -> {out}" if out else "")
    ]
    for r in summary["ranks"]:
        lines.append(
            f"  rank {r['rank']}: {r['tensors']} tensors, {human_bytes(r['bytes'])}"
            f" ({r['replicated_tensors']} replicated, {human_bytes(r['replicated_bytes'])})"
        )
    if summary.get("reported"):
        lines.append(
            f"  {len(summary['reported'])} tensors replicated because no rule splits them:"
        )
        lines += [f"    {x['tensor']}: {x['reason']}" for x in summary["reported"]]
    return "\n".join(lines) + "\n"
