"""MoE routers: a layer's `mlp.gate.weight` scores every routed expert from the hidden state.

It must be a 2-D float matrix [experts, hidden] (the runtime transposes it; a loader that finds
another shape fails at boot). DeepSeek-style routers may add `mlp.gate.e_score_correction_bias`,
a float vector [experts]. Shared by the MSRT base (MB019) and R7 (R7071) rule families.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from exl3tool.formats.checkpoint import Checkpoint
from exl3tool.rules.registry import Findings, Rule

FLOAT_DTYPES = frozenset(("F16", "BF16", "F32"))


def router_problem(
    dtype: str, shape: tuple[int, ...], experts: int | None, hidden: int | None, *, bias: bool
) -> str | None:
    """Why a router weight (or its correction bias) is unusable, or None."""
    want = (experts,) if bias else (experts, hidden)
    ok = (
        dtype in FLOAT_DTYPES
        and len(shape) == len(want)
        and all(w is None or s == w for s, w in zip(shape, want, strict=True))
    )
    if ok:
        return None
    shown = [w if w is not None else "?" for w in want]
    return f"{dtype}{list(shape)}, expected F16/BF16/F32 {shown}"


_ROUTER = re.compile(
    r"model\.layers\.(0|[1-9]\d{0,17})\.mlp\.gate\.(weight|e_score_correction_bias)"
)


_ENDINGS = (".mlp.gate.weight", ".mlp.gate.e_score_correction_bias")  # _ROUTER's, tested first


def check_routers(
    ckpt: Checkpoint,
    layers: Iterable[int],
    experts: int | None,
    hidden: int | None,
    *,
    rule: Rule,
    findings: Findings,
) -> None:
    """Report each stored router tensor of `layers` that is not [experts, hidden] / [experts].
    Work is sized by the router tensors present, never by the (declared) layer range."""
    wanted = layers if isinstance(layers, range) else set(layers)
    found = []
    for name, ref in ckpt.tensors.items():
        m = _ROUTER.fullmatch(name) if name.endswith(_ENDINGS) else None
        if m is not None and int(m.group(1)) in wanted:
            found.append((int(m.group(1)), m.group(2) != "weight", ref))
    for _layer, bias, ref in sorted(found, key=lambda f: (f[0], f[1])):
        why = router_problem(ref.info.dtype, ref.info.shape, experts, hidden, bias=bias)
        if why is not None:
            findings.add(rule, why, file=ref.file, tensor=ref.name)
