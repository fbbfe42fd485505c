"""R7035: the model's own MoE layers against what claims them (docs/formats/r7.md §2.1a).

A DeepSeek-style model (GLM-5.2 included) builds layer L, its multi-token-prediction layers
after `num_hidden_layers` too, as a MoE layer when `L >= first_k_dense_replace` and
`L % moe_layer_freq == 0`, else as a dense MLP. The runtime claims a MoE layer's experts as EXL3
through the R7 block's `moe_layers`, the carried tail's range or tensor_storage records of its
expert 0; an unclaimed MoE layer gets the unquantized MoE method, whose experts only BF16
tensors fill (the loader does not check that anything did), and a dense layer has no experts
parameter for expert tensors stored there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exl3tool.checks.conformance import claims_linear, runtime_storage
from exl3tool.formats.checkpoint import Checkpoint
from exl3tool.formats.experts import ExpertTable
from exl3tool.formats.r7 import Block
from exl3tool.io.layer_spec import layers_text
from exl3tool.io.strict_json import is_json_int
from exl3tool.rules import r7 as r7
from exl3tool.rules.registry import Findings

MAX_LAYERS = 1 << 16  # a model with more layers is not judged (a hostile count sizes no loop)
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
MAX_SCANNED = 4  # MTP layers without expert tensors looked for among all names (models have 1-3)


def model_moe_layers(
    config: Any, shipped: Callable[[int], bool] = lambda _layer: True
) -> tuple[set[int], set[int], str] | None:
    """(MoE layers, every layer the model builds, how they were derived) from a DeepSeek-style
    config, or None when it does not say (no first_k_dense_replace, or counts that are not plain
    integers). MTP layers count only where `shipped(layer)`: without their weights the target
    model loads without them (only a speculative draft would build them)."""
    if not isinstance(config, dict):
        return None
    first, n, mtp = (config.get(k) for k in ("first_k_dense_replace", "num_hidden_layers",
                                             "num_nextn_predict_layers"))  # fmt: skip
    freq = config.get("moe_layer_freq", 1)
    mtp = 0 if mtp is None else mtp
    if not all(is_json_int(v) for v in (first, n, mtp, freq)) or freq < 1 or first < 0:
        return None
    if not 0 < n + mtp <= MAX_LAYERS or mtp < 0:
        return None
    built = set(range(n)) | {layer for layer in range(n, n + mtp) if shipped(layer)}
    how = f"first_k_dense_replace {first}, moe_layer_freq {freq}"
    return {layer for layer in built if layer >= first and layer % freq == 0}, built, how


def check_model_moe_layers(
    ckpt: Checkpoint,
    block: Block,
    tail: tuple[int, int] | None,
    table: ExpertTable,
    findings: Findings,
) -> None:
    """R7035 both ways: a MoE layer nothing claims, and expert tensors on a dense layer."""
    with_experts = table.layers()
    scans = MAX_SCANNED  # name scans left: a hostile MTP count sizes no loop over the tensors

    def shipped(layer: int) -> bool:
        nonlocal scans
        if layer in with_experts:
            return True
        if scans <= 0:
            return False
        scans -= 1
        head = f"model.layers.{layer}."
        return any(name.startswith(head) for name in ckpt.tensors)

    got = model_moe_layers(ckpt.config, shipped)
    if got is None:
        return
    moe, built, how = got
    storage = runtime_storage(ckpt)[0]
    bf16 = {layer for (layer, _e, _p), parts in table.plain.items() if "weight" in parts}

    def covered(layer: int) -> bool:
        if block.first <= layer <= block.last or (tail and tail[0] <= layer <= tail[1]):
            return True
        prefix = f"model.layers.{layer}.mlp.experts.0"
        return bool(storage) and all(claims_linear(storage, f"{prefix}.{p}") for p in PROJECTIONS)

    uncovered = [layer for layer in sorted(moe) if not covered(layer) and layer not in bf16]
    if uncovered:
        verb = "is a MoE layer" if len(uncovered) == 1 else "are MoE layers"
        findings.add(
            r7.R7_MODEL_MOE,
            f"{layers_text(uncovered)} {verb} of the model ({how}) that neither moe_layers "
            f"[{block.first}, {block.last}] nor the carried tail covers and no tensor_storage "
            "record claims: the runtime builds their experts unquantized, and no BF16 expert "
            "tensors fill them",
            file="config.json",
            pointer="/first_k_dense_replace",
        )
    dense = [layer for layer in sorted(with_experts) if layer in built and layer not in moe]
    if dense:
        findings.add(
            r7.R7_MODEL_MOE,
            f"{layers_text(dense)} {'holds' if len(dense) == 1 else 'hold'} expert tensors but "
            f"{'is a dense layer' if len(dense) == 1 else 'are dense layers'} of the model "
            f"({how}): the weight loader has no experts parameter there",
            file="config.json",
            pointer="/first_k_dense_replace",
        )
