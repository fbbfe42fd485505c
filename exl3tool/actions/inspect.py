"""`exl3tool inspect`: what a checkpoint holds (kind, layers, experts, K, tiers, sizes), or the
findings that say why it cannot be described."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exl3tool.actions.inputs import resolve_input
from exl3tool.actions.validate import CHECKPOINT_KINDS, anchor, check_readable
from exl3tool.formats.checkpoint import Checkpoint, load_checkpoint
from exl3tool.formats.detect import Kind, detect
from exl3tool.io.gcpause import paused_gc
from exl3tool.report.model import ArtifactRef, Report
from exl3tool.rules import checkpoint as ck
from exl3tool.rules.errors import UsageError
from exl3tool.rules.registry import Findings

Grid = dict[tuple[int, int, str], int]  # K per (layer, expert, projection)


@dataclass(frozen=True)
class Options:
    path: str
    plot: Path | None = None  # a layers x experts heatmap of K per projection (PNG)
    force: bool = False  # replace an existing plot


@dataclass
class InspectResult:
    info: dict[str, Any]
    grid: Grid = field(default_factory=dict)
    findings: Findings = field(default_factory=Findings)

    def report(self) -> Report:
        """The findings that stopped the description, as a report."""
        return Report([ArtifactRef(self.info["path"], self.info["kind"])], self.findings)

    def exit_code(self) -> int:
        return 1 if self.findings.has_errors() else 0


def _facts(ckpt: Checkpoint) -> dict[str, Any]:
    return {
        "shards": len(ckpt.shards),
        "tensors": len(ckpt.tensors),
        "bytes": sum(r.info.nbytes for r in ckpt.tensors.values()),
        "file_bytes": sum(st.file_size for st in ckpt.shards.values()),
    }


def _grid(ckpt: Checkpoint) -> tuple[Grid, int, int]:
    """K per routed expert projection (rank slices count once), and weights and bits over all
    slices for the bits per weight."""
    from exl3tool.formats.experts import expert_table

    table = expert_table(ckpt.tensors)
    entries = list(table.plain.items()) + [((k[0], k[1], k[2]), p) for k, p in table.ranked.items()]
    grid: Grid = {}
    weights = bits = 0
    for key, parts in entries:
        t = parts.get("trellis")
        if t is None or len(t.info.shape) != 3 or t.info.shape[2] % 16:
            continue
        s0, s1, s2 = t.info.shape
        grid.setdefault(key, s2 // 16)
        weights += s0 * s1 * 256
        bits += s0 * s1 * 16 * s2
    return grid, weights, bits


def describe(path: Path) -> InspectResult:
    """Facts for `exl3tool inspect`: kind, layers, experts, K histogram per projection, average
    bits per weight of the routed experts, tier per layer, sizes; and K per (layer, expert, proj)
    for plots. An artifact that is not a checkpoint, or whose container has errors, gets its
    findings instead of a description (exit 1)."""
    from exl3tool.formats.names import PROJECTIONS

    path = Path(path)
    check_readable(path)
    kind = detect(path)
    result = InspectResult({"path": str(path), "kind": kind.value})
    if kind is Kind.CARTRIDGE:
        return _describe_cartridge(path, result)
    if kind not in CHECKPOINT_KINDS:
        found = Findings()
        ckpt = load_checkpoint(path, found, need_config=False)  # the root cause, when there is one
        result.findings.extend(found.errors())
        if not result.findings:
            result.findings.add(
                ck.CK_UNKNOWN_KIND, "not an EXL3, R7, rank-sliced or MSRT checkpoint", file="."
            )
        result.findings = anchor(path, result.findings)
        return result
    found = Findings()
    ckpt = load_checkpoint(path, found)
    if found.has_errors():
        result.findings = anchor(path, Findings(found.errors()))
        return result
    result.info.update(_facts(ckpt))
    grid, weights, bits = _grid(ckpt)
    hist: dict[str, Counter[int]] = {p: Counter() for p in PROJECTIONS}
    per_layer: dict[int, set[int]] = {}
    for (layer, _e, proj), k in grid.items():
        hist[proj][k] += 1
        per_layer.setdefault(layer, set()).add(k)
    info = result.info
    info["layers"] = sorted(per_layer)
    info["experts"] = len({key[1] for key in grid})
    info["k_histogram"] = {p: {str(k): n for k, n in sorted(c.items())} for p, c in hist.items()}
    info["routed_bpw"] = round(bits / weights, 4) if weights else None
    info["tiers"] = {str(layer): len(ks) for layer, ks in sorted(per_layer.items())}
    result.grid = grid
    return result


def _describe_cartridge(path: Path, result: InspectResult) -> InspectResult:
    """What a cartridge declares and holds: its base pin, its chain of stages, its layers and
    layout (`validate` checks it; its container errors are the findings here)."""
    from exl3tool.formats.cartridge import load_cartridge

    found = Findings()
    cart = load_cartridge(path, found)
    if found.has_errors() or cart.manifest is None:
        result.findings = anchor(path, Findings(found.errors()))
        if not result.findings:
            result.findings.add(ck.CK_UNKNOWN_KIND, "no readable adapter_config.json", file=".")
        return result
    keys = cart.stage_keys()
    base = cart.field("base")
    base = base if isinstance(base, dict) else {}
    stages = []
    chain = cart.field("chain")
    for c in chain if isinstance(chain, list) else []:
        if isinstance(c, dict):
            experts = c.get("experts")
            stages.append(
                {
                    "label": c.get("label"),
                    "k": c.get("k"),
                    "parent": c.get("parent"),
                    "experts": len(experts) if isinstance(experts, list) else None,
                }
            )
    result.info.update(
        {
            "schema": cart.field("schema"),
            "shards": len(cart.shards),
            "tensors": len(cart.keys),
            "bytes": sum(ref.info.nbytes for ref in cart.keys.values()),
            "file_bytes": cart.total_bytes(),
            "layers": sorted({k.layer for k in keys if k.layer is not None}),
            "experts": len({(k.layer, k.expert) for k in keys}),
            "base": {
                "label": base.get("label"),
                "k": base.get("k"),
                "compatibility_sha256": base.get("compatibility_sha256"),
            },
            "chain": stages,
            "layout": cart.layout,
            "world_size": cart.world_size,
            "codebook": cart.field("codebook"),
        }
    )
    return result


def run(opts: Options) -> InspectResult:
    """Describe the artifact; with `plot`, also draw the K heatmap (refusing an existing file
    without `force`, and a missing matplotlib with the extra to install)."""
    from exl3tool.report.render import check_output

    path = resolve_input(opts.path)
    if opts.plot is not None:
        if detect(path) is Kind.CARTRIDGE:
            raise UsageError("--plot draws a checkpoint's K per expert; a cartridge has none")
        check_output(opts.plot, opts.force, (opts.path,))
        from exl3tool.actions.inspect_plot import require_matplotlib

        require_matplotlib()
    with paused_gc():  # per-tensor tables, no cycle among them
        result = describe(path)
    if opts.plot is not None and not result.findings:
        from exl3tool.actions.inspect_plot import plot_k

        plot_k(result.grid, opts.plot, result.info["path"], force=opts.force)
        result.info["plot"] = str(opts.plot)
    return result
