"""TP001 for `validate --tp N` and `plan --tp N`: the runtime's own split of EXL3 linears
(docs/formats/exl3.md §6).

The serving runtime gives each of N ranks an equal slice of a linear: column-parallel linears
(q/k/v, gate/up) their outputs, row-parallel ones (o_proj, down_proj) their inputs, routed
experts their intermediate channels. It cuts the trellis in whole 128-channel Hadamard blocks
and refuses a slice that does not start and end on one (`_slice_exl3_tensor`). K/V projections
with fewer KV heads than ranks are replicated per head group: a rank holds one head.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from exl3tool.formats.checkpoint import Checkpoint, TensorRef
from exl3tool.formats.exl3 import LinearGroup
from exl3tool.formats.experts import model_config
from exl3tool.formats.names import is_encoder_tower
from exl3tool.rules import tp as tp_rules
from exl3tool.rules.registry import Findings
from exl3tool.tp.plan import attention_geometry
from exl3tool.tp.ranges import HAD

COLUMN = frozenset(("q_proj", "gate_proj", "up_proj"))
ROW = frozenset(("o_proj", "down_proj"))
KV = frozenset(("k_proj", "v_proj"))
ATTENTION = frozenset(("q_proj", "k_proj", "v_proj", "o_proj"))
SPLIT = COLUMN | ROW  # an expert's projections
DENSE = COLUMN | ROW | KV
EXPERTS = ".mlp.experts."


def _config_sizes(config: Any) -> dict[tuple[str, str], int]:
    """The logical sizes config.json gives the split side of each linear kind: the runtime
    partitions those, not the trellis a converter padded to 128 (docs/formats/exl3.md §1.4)."""
    cfg = model_config(config)

    def num(key: str) -> int | None:
        v = cfg.get(key)
        return v if type(v) is int and v > 0 else None

    out: dict[tuple[str, str], int] = {}  # (linear kind, "in" | "out") -> channels
    if (inter := num("intermediate_size")) is not None:
        out[("gate_proj", "out")] = out[("up_proj", "out")] = out[("down_proj", "in")] = inter
    if (moe := num("moe_intermediate_size")) is not None:
        out[("expert", "out")] = out[("expert", "in")] = moe  # gate/up out, down in
    heads, kv, head_dim = num("num_attention_heads"), num("num_key_value_heads"), num("head_dim")
    if heads and not head_dim and num("hidden_size") and num("hidden_size") % heads == 0:
        head_dim = num("hidden_size") // heads  # type: ignore[operator]
    if heads and head_dim:
        out[("q_proj", "out")] = out[("o_proj", "in")] = heads * head_dim
        kv = kv or heads
        out[("k_proj", "out")] = out[("v_proj", "out")] = kv * head_dim
    return out


def _logical(stored: int, logical: int | None) -> int:
    """The logical size where config.json's is the one `stored` pads to 128, else `stored`
    (a linear the config does not describe, such as a shared expert's wider MLP)."""
    if logical is not None and -(-logical // HAD) * HAD == stored:
        return logical
    return stored


def _per_rank(leaf: str, k_in: int, n_out: int, tp: int, kv_heads: int | None) -> tuple[str, int]:
    """(what is split, its size) of one linear; size is channels over all ranks or, for K/V
    replicated per head, over `kv_heads` head groups."""
    if leaf in ROW:
        return "input", k_in
    if leaf in KV and kv_heads is not None and kv_heads < tp:
        return "output (one KV head per rank)", n_out * tp // kv_heads
    return "output", n_out


def trellises(
    tensors: Mapping[str, TensorRef], *, full_rank: bool = False
) -> Iterable[tuple[str, TensorRef]]:
    """(linear prefix, trellis) of every `{prefix}.trellis` tensor. `full_rank`: an MSRT base,
    whose `{prefix}.rank0.trellis` is the whole tensor each rank slices for itself."""
    for name, ref in tensors.items():
        if name.endswith(".trellis"):
            prefix = name[:-8]
            yield (prefix[:-6] if full_rank and prefix.endswith(".rank0") else prefix), ref


def of_groups(groups: Mapping[str, LinearGroup]) -> Iterable[tuple[str, TensorRef]]:
    """(linear prefix, trellis) of every group that has one."""
    return ((p, g.trellis) for p, g in groups.items() if g.trellis is not None)


def check_tp_slices(
    ckpt: Checkpoint,
    linears: Iterable[tuple[str, TensorRef]],
    tp: int | None,
    findings: Findings,
    *,
    experts: bool = True,
) -> None:
    """TP001 once per distinct refused geometry of `linears` ((prefix, trellis) pairs: the
    first linear named, the rest counted). `experts` False: routed experts are another
    profile's business (R7070)."""
    if tp is None or tp < 2:
        return
    geometry = attention_geometry(ckpt.config)
    kv_heads = geometry[0] if geometry else None
    sizes = _config_sizes(ckpt.config)
    refused: dict[str, list] = {}  # message -> [first tensor, file, count]
    for prefix, t in linears:
        if len(t.info.shape) != 3:
            continue
        if is_encoder_tower(prefix):
            continue  # an encoder tower: its own heads, and the runtime may replicate it
        leaf = prefix.rpartition(".")[2]
        kind = "expert" if EXPERTS in prefix else leaf
        k_in, n_out = t.info.shape[0] * 16, t.info.shape[1] * 16
        k_in = _logical(k_in, sizes.get((kind, "in")))
        n_out = _logical(n_out, sizes.get((kind, "out")))
        if EXPERTS in prefix:
            if not experts or leaf not in SPLIT:
                continue
            what = "expert intermediate"
            size = n_out if leaf in COLUMN else k_in
        elif leaf in DENSE:
            if geometry is None and leaf in ATTENTION:
                continue  # the heads decide the split, and config.json does not say them
            what, size = _per_rank(leaf, k_in, n_out, tp, kv_heads)
        else:
            continue  # lm_head and the rest: split by rules of their own (vocabulary padding)
        if size % (HAD * tp) == 0:
            continue
        msg = (
            f"{leaf} {what} size {size} over {tp} ranks gives {size / tp:g} channels per rank, "
            f"not a whole number of {HAD}-channel blocks: the runtime refuses the slice"
        )
        entry = refused.setdefault(msg, [t.name, t.file, 0])
        entry[2] += 1
    for msg, (tensor, file, count) in refused.items():
        more = f" ({count - 1} more linears with the same geometry)" if count > 1 else ""
        findings.add(tp_rules.TP_CUTS_HADAMARD, msg + more, file=file, tensor=tensor)
