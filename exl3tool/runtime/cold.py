"""Cold build of base + adapter: the plainest code, straight from the original files.

Deliberately independent of everything the hot path uses: no staging, no runtime tables, no TP
plan, no trellis slicing. It reads `adapter_config.json` with `json`, tensors with
`safetensors.safe_open`, decodes every FULL effective weight, computes `1/scale` in double and
rounds it to fp32 (msrt-cartridge-format.md §1.2), and applies the chain in manifest order. For a
TP rank it cuts the DECODED weights with plain arithmetic (`r·I/N`). Its forward performs the same
floating-point operations as the runtime (precision policy in `runtime.linear`), so a correct hot
load must match it bit for bit.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open

from exl3tool.trellis.weight import effective_weight

PROJS = ("gate_proj", "up_proj", "down_proj")
KEY = re.compile(
    r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)"
    r"\.rank(\d+)\.(trellis|scale)_(.+)$"
)


def read_all(directory: Path, files: list[str]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(Path(directory) / f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 - safe_open is not a mapping
                out[name] = st.get_tensor(name)
    return out


def base_tensors(base: Path, layers: list[int]) -> dict[str, torch.Tensor]:
    files = sorted(p.name for p in Path(base).glob("*.safetensors"))
    wanted = tuple(f"model.layers.{L}.mlp." for L in layers)
    return {n: t for n, t in read_all(base, files).items() if n.startswith(wanted)}


def adapter_stages(adapter: Path) -> tuple[dict, dict[tuple[int, int, str], list]]:
    """(manifest, {(layer, expert, proj): [(label, inverse scale fp32 [], full trellis)]})."""
    manifest = json.loads((Path(adapter) / "adapter_config.json").read_text())
    tensors = read_all(adapter, [s["path"] for s in manifest["shards"]])
    order = [c["label"] for c in manifest["chain"]]
    axis = {"gate_proj": 1, "up_proj": 1, "down_proj": 0}
    parts: dict[tuple[int, int, str, str], dict[int, torch.Tensor]] = {}
    scales: dict[tuple[int, int, str, str], torch.Tensor] = {}
    for name, t in tensors.items():
        m = KEY.match(name)
        layer, expert, proj, rank, comp, label = m.groups()
        key = (int(layer), int(expert), proj, label)
        if comp == "trellis":
            parts.setdefault(key, {})[int(rank)] = t
        else:
            scales[key] = t
    out: dict[tuple[int, int, str], list] = {}
    for key in sorted(parts, key=lambda k: (k[0], k[1], k[2], order.index(k[3]))):
        layer, expert, proj, label = key
        ranks = parts[key]
        trellis = torch.cat([ranks[r] for r in sorted(ranks)], dim=axis[proj])
        inv = torch.tensor(1.0 / float(scales[key]), dtype=torch.float32)
        out.setdefault((layer, expert, proj), []).append((label, inv, trellis))
    return manifest, out


@dataclass
class ColdLayer:
    """Full decoded weights of one layer: base `W_eff` and [(label, inv, stage W_eff)]."""

    base: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)
    stages: dict[tuple[int, str], list[tuple[str, torch.Tensor, torch.Tensor]]] = field(
        default_factory=dict
    )


def build(
    base: Path, adapter: Path | None, layers: list[int], device: torch.device
) -> dict[int, ColdLayer]:
    """Full-size cold weights of `layers` (adapter None = the base alone)."""
    bt = base_tensors(base, layers)
    stages = adapter_stages(adapter)[1] if adapter is not None else {}
    out: dict[int, ColdLayer] = {}
    for L in layers:
        cl = ColdLayer()
        e = 0
        while f"model.layers.{L}.mlp.experts.{e}.gate_proj.rank0.trellis" in bt:
            for p in PROJS:
                pre = f"model.layers.{L}.mlp.experts.{e}.{p}.rank0."
                suh, svh = bt[pre + "suh"].to(device), bt[pre + "svh"].to(device)
                t = bt[pre + "trellis"].to(device)
                cl.base[(e, p)] = effective_weight(t, suh, svh, "mcg")
                cl.stages[(e, p)] = [
                    (label, inv.to(device), effective_weight(ts.to(device), suh, svh, "mcg"))
                    for label, inv, ts in stages.get((L, e, p), [])
                ]
            e += 1
        out[L] = cl
    return out


def router(base: Path, layer: int) -> torch.Tensor | None:
    return base_tensors(base, [layer]).get(f"model.layers.{layer}.mlp.gate.weight")


def rank_cut(w: torch.Tensor, proj: str, rank: int, world: int) -> torch.Tensor:
    """This rank's part of a full decoded weight [in, out]: plain arithmetic, no TP plan."""
    if world == 1:
        return w
    if proj == "down_proj":
        n = w.shape[0] // world
        return w[rank * n : (rank + 1) * n].contiguous()
    n = w.shape[1] // world
    return w[:, rank * n : (rank + 1) * n].contiguous()


def expert_fn(cl: ColdLayer, rank: int, world: int):
    """fp32 partial down output of an expert, same operations as the runtime."""

    def proj32(e: int, p: str, x: torch.Tensor) -> torch.Tensor:
        y = x.float() @ rank_cut(cl.base[(e, p)], p, rank, world).float()
        for _label, inv, w in cl.stages[(e, p)]:
            y = y + inv * (x.float() @ rank_cut(w, p, rank, world).float())
        return y

    def fn(e: int, x16: torch.Tensor) -> torch.Tensor:
        g = proj32(e, "gate_proj", x16).half()
        u = proj32(e, "up_proj", x16).half()
        a = (F.silu(g.float()) * u.float()).half()
        return proj32(e, "down_proj", a)

    return fn
