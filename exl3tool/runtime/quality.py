"""Quality ladder of a cartridge: how much each stage changes the effective weight.

For each (layer, expert, projection) with stages, in fp32 on the full decoded weights:

    W_0 = W_eff(base);  c_s = inv_scale_s · W_eff(T_s; base suh/svh);  W_s = W_0 + Σ_{j≤s} c_j
    correction ratio   r_s = ‖c_s‖ / ‖W_0‖
    relative to next   ‖W_s − W_{s+1}‖ / ‖W_{s+1}‖
    relative to dense  ‖W_s − D‖ / ‖D‖            (with --dense: D = the unquantized weight)

Pass criteria (documented limits, docs/formats/msrt.md §1.1: each residual stage encodes what
the previous levels left, so a valid encode has a falling ladder):

* r_1 ≤ RATIO_MAX: the first correction is an estimate of the base's own quantization error; a
  correction larger than the base weight itself is not a refinement;
* r_{s+1} ≤ LADDER_SLACK · r_s: each stage corrects less than the one before (a tampered stage scale
  inflates its correction far above the base's quantization error and fails here);
* with a dense reference: the error against it must not grow along the ladder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

RATIO_MAX = 1.0
LADDER_SLACK = 1.0
DENSE_SLACK = 1.0 + 1e-6


@dataclass
class StageStats:
    layer: int
    stage: int  # 0 = the base
    label: str
    k: int
    experts: set[int] = field(default_factory=set)
    ratio: list[float] = field(default_factory=list)
    rel_next: list[float] = field(default_factory=list)
    rel_dense: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        def mx(v: list[float]) -> float | None:
            return max(v) if v else None

        return {
            "layer": self.layer,
            "stage": self.stage,
            "label": self.label,
            "k": self.k,
            "experts": len(self.experts),
            "correction_ratio_max": mx(self.ratio),
            "correction_ratio_mean": sum(self.ratio) / len(self.ratio) if self.ratio else None,
            "rel_to_next_max": mx(self.rel_next),
            "rel_to_dense_max": mx(self.rel_dense),
            "passed": not self.failures,
            "failures": self.failures[:5],
        }


def _norm(t: torch.Tensor) -> float:
    return float(t.double().norm())


def ladder(
    layer: int,
    base_label: str,
    base_k: int,
    chain_k: dict[str, int],
    weights: dict[
        tuple[int, str], tuple[torch.Tensor, list[tuple[str, torch.Tensor, torch.Tensor]]]
    ],
    dense: dict[tuple[int, str], torch.Tensor] | None,
) -> list[StageStats]:
    """Per-stage statistics of one layer. weights: (expert, proj) -> (base W_eff, [(label, inv,
    stage W_eff)]); dense: (expert, proj) -> dense weight [in, out] (fp32), when given."""
    labels = [base_label, *chain_k]
    stats = {
        s: StageStats(layer, s, lab, base_k if s == 0 else chain_k[lab])
        for s, lab in enumerate(labels)
    }
    for (e, p), (w0, terms) in sorted(weights.items()):
        if not terms:
            continue
        where = f"expert {e} {p}"
        w = w0.float()
        n0 = _norm(w)
        ladder_w = [w]
        prev_ratio = None
        for label, inv, ws in terms:
            s = labels.index(label)
            c = inv * ws.float()
            ratio = _norm(c) / n0 if n0 > 0 else float("inf")
            st = stats[s]
            st.experts.add(e)
            st.ratio.append(ratio)
            if prev_ratio is None and not ratio <= RATIO_MAX:
                st.failures.append(f"{where}: correction {ratio:.3g}x the base weight")
            if prev_ratio is not None and not ratio <= LADDER_SLACK * prev_ratio:
                st.failures.append(
                    f"{where}: correction {ratio:.3g}x the base weight exceeds the previous "
                    f"stage's {prev_ratio:.3g}x"
                )
            prev_ratio = ratio
            w = w + c
            ladder_w.append(w)
        used = [0] + [labels.index(lab) for lab, _i, _w in terms]
        for i in range(len(ladder_w) - 1):
            nxt = _norm(ladder_w[i + 1])
            rel = _norm(ladder_w[i] - ladder_w[i + 1]) / nxt if nxt > 0 else float("inf")
            stats[used[i]].rel_next.append(rel)
            stats[used[i]].experts.add(e)
        if dense is not None and (e, p) in dense:
            d = dense[(e, p)].float()
            nd = _norm(d)
            errs = [_norm(x - d) / nd if nd > 0 else float("inf") for x in ladder_w]
            for i, err in enumerate(errs):
                stats[used[i]].rel_dense.append(err)
                if i and not err <= errs[i - 1] * DENSE_SLACK:
                    stats[used[i]].failures.append(
                        f"{where}: error vs dense rises from {errs[i - 1]:.3g} to {err:.3g}"
                    )
    return [st for st in stats.values() if st.experts]
