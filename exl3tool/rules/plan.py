"""Rules of the boot plan, `exl3tool plan` (PL): what the runtime allocates per rank before it
serves (docs/runtime-conformance.md)."""

from exl3tool.rules.registry import Severity, rule

E, W, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

PL_RANK_MEMORY = rule(
    "PL001",
    "rank-exceeds-gpu-memory",
    E,
    "A rank's resident weights exceed the GPU memory",
    "The runtime allocates every module's weights on its rank before serving; a rank whose "
    "weights alone exceed the GPU runs out of memory at boot.",
    "Raise --tp, use GPUs with more memory, or fix how the runtime claims the modules (PL002).",
)
PL_CONFIG_DISCARDED = rule(
    "PL002",
    "exl3-config-discarded",
    E,
    "The runtime would discard the EXL3 config",
    "Exl3Config.override_quantization_method claims a checkpoint only without a forced other "
    "--quantization, and only for a hybrid_tr3_tail (format exl3-trellis) or the R7 block; "
    "otherwise the quant_method stamp decides, the EXL3 metadata is ignored and the routed "
    "experts fall to the unquantized MoE method, which allocates them in BF16.",
    "Serve with --quantization exl3 (or none), and keep the R7 block or the tail in config.json.",
)
PL_UNCLAIMED = rule(
    "PL003",
    "exl3-module-unclaimed",
    W,
    "An EXL3 module the runtime would not claim as EXL3",
    "A linear is claimed as EXL3 only through tensor_storage and a MoE layer only through the R7 "
    "range, the tail's range or tensor_storage; an unclaimed module gets the unquantized method "
    "(BF16 allocation, and its trellis tensors have no parameter to load into).",
    "List the module in tensor_storage, or extend the R7 / tail layer range to it.",
)
