"""The routed experts of a plain EXL3 checkpoint against config.json's sizes (EX035).

The runtime sizes an EXL3 MoE layer from config.json (hidden_size, moe_intermediate_size) and
not from the trellis: at TP 1 it pads the input and truncates the output to those sizes
(Exl3MoEMethod._apply_expert), so a wider trellis serves wrong results and a narrower one fails
at the first forward; at TP > 1 it cuts each expert at the config's intermediate size over the
ranks (_shard_tensors_for_tensor_parallel). A converter pads a size to the next multiple of 128
(docs/formats/exl3.md §1.4): that padding is expected.
"""

from __future__ import annotations

from typing import Any

from exl3tool.formats.checkpoint import Checkpoint, TensorRef
from exl3tool.formats.experts import model_config
from exl3tool.formats.names import parse_expert
from exl3tool.io.strict_json import is_json_int
from exl3tool.rules import exl3 as ex
from exl3tool.rules.registry import Findings

HAD = 128  # the converter pads each side to a whole number of Hadamard blocks
NAMED = 8  # mismatches named one by one; the rest are counted


def _padded(n: int) -> int:
    return -(-n // HAD) * HAD


def _sizes(config: Any) -> tuple[int, int, str] | None:
    """(hidden, expert intermediate, the key it came from) of config.json: an MoE model's
    moe_intermediate_size, else (Mixtral, gpt-oss) its intermediate_size."""
    cfg = model_config(config)
    hidden = cfg.get("hidden_size")
    key = "moe_intermediate_size" if "moe_intermediate_size" in cfg else "intermediate_size"
    inter = cfg.get(key)
    if is_json_int(hidden) and is_json_int(inter) and hidden > 0 and inter > 0:
        return hidden, inter, key
    return None


def check_expert_geometry(ckpt: Checkpoint, findings: Findings) -> None:
    """Each expert trellis [in/16, out/16, 16K] covers config.json's sizes, padded to 128:
    gate/up hidden -> intermediate, down intermediate -> hidden."""
    sizes = _sizes(ckpt.config)
    if sizes is None:
        return
    hidden, inter, key = sizes
    want = {
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }
    bad = []
    for name, ref in ckpt.tensors.items():
        if not name.endswith(".trellis") or ".mlp.experts." not in name:
            continue
        e = parse_expert(name)
        shape = ref.info.shape
        if e is None or e.proj not in want or len(shape) != 3:
            continue  # the linear checks say what is wrong with it
        k_in, n_out = want[e.proj]
        got = (shape[0] * 16, shape[1] * 16)
        if got not in ((k_in, n_out), (_padded(k_in), _padded(n_out))):
            bad.append((ref, e.proj, got))

    def describe(item: tuple[TensorRef, str, tuple[int, int]]) -> tuple[str, dict[str, Any]]:
        ref, proj, (k_in_got, n_out_got) = item
        k_in, n_out = want[proj]
        message = f"{proj} trellis is {k_in_got} -> {n_out_got}; config.json says {k_in} -> "
        message += f"{n_out} (hidden_size, {key})"
        return message, {"file": ref.file, "tensor": ref.name}

    more = "{n} more expert trellises that config.json's sizes do not describe"
    findings.add_counted(ex.EX_EXPERT_GEOMETRY, bad, describe, more, NAMED)
