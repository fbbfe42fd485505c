"""Dense fp16 reference weights a cartridge approximates (the runtime's quality ladder).

Needs torch and `exl3tool.trellis`, imported when called.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from exl3tool.synth import literals as lit
from exl3tool.synth.literals import PROJECTIONS
from exl3tool.synth.msrt import write_safetensors


def build_dense_reference(
    out: Path, base: Path, adapter: Path, *, noise: float = 0.01, seed: int = 0
) -> Path:
    """Write one safetensors file of dense fp16 HF weights `[out, in]` per (layer, expert, proj):
    `W_eff(base) + Σ_s W_eff(T_s; base suh/svh) / scale_s` plus Gaussian noise of `noise` × RMS.

    The "true" weights a cartridge approximates, for the runtime's quality ladder. Full-layout
    adapters only.
    """
    from exl3tool.formats.cartridge import load_cartridge
    from exl3tool.formats.checkpoint import load_checkpoint
    from exl3tool.io.views import TensorReader
    from exl3tool.rules.registry import Findings

    findings = Findings()
    cart = load_cartridge(Path(adapter), findings)
    ckpt = load_checkpoint(Path(base), findings)
    if cart.manifest["tensor_parallel"]["layout"] != "full":
        raise ValueError("build_dense_reference needs a full-layout adapter")
    out_t: dict[str, np.ndarray] = {}
    n_exp = lit.config_sizes(ckpt.config)[2] or 0
    with TensorReader() as rd:
        dense = _Dense(cart, ckpt, rd, noise, seed)
        for layer in cart.manifest["selected_layers"]:
            for e in range(n_exp):
                for pi, proj in enumerate(PROJECTIONS):
                    name = f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight"
                    out_t[name] = dense.weight(layer, e, pi)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_safetensors(out, out_t)
    return out


class _Dense:
    """The dense weight of one (layer, expert, projection) from a base and a full cartridge."""

    def __init__(self, cart: Any, ckpt: Any, rd: Any, noise: float, seed: int) -> None:
        self.cart, self.ckpt, self.rd, self.noise, self.seed = cart, ckpt, rd, noise, seed
        self.stages = [c["label"] for c in cart.manifest["chain"]]

    def _tensor(self, shard: Any, info: Any) -> Any:
        import torch

        return torch.from_numpy(np.array(self.rd.array(shard, info)))

    def weight(self, layer: int, e: int, pi: int) -> np.ndarray:
        import torch

        from exl3tool.trellis.weight import effective_weight

        proj = PROJECTIONS[pi]
        refs = [
            self.ckpt.tensors[lit.base_key(layer, e, proj, c)] for c in ("trellis", "suh", "svh")
        ]
        t, su, sv = (self._tensor(r.shard, r.info) for r in refs)
        w = effective_weight(t, su, sv, "mcg").to(torch.float32)
        for label in self.stages:
            tk = lit.stage_key(layer, e, proj, 0, "trellis", label)
            sk = lit.stage_key(layer, e, proj, 0, "scale", label)
            if tk not in self.cart.keys:
                continue
            ts = self._tensor(*self.cart.keys[tk])
            scale = float(np.array(self.rd.array(*self.cart.keys[sk])))
            w += effective_weight(ts, su, sv, "mcg").to(torch.float32) / scale
        rms = float(w.pow(2).mean().sqrt())
        key = hashlib.sha256(f"{self.seed}/{layer}/{e}/{pi}".encode()).digest()[:7]
        g = torch.Generator().manual_seed(int.from_bytes(key, "little"))
        w += torch.randn(w.shape, generator=g) * (self.noise * rms)
        return w.t().contiguous().to(torch.float16).numpy()
