"""Rules of the checkpoint container: configs, shard set, index (CK)."""

from exl3tool.rules.registry import Severity, rule

E, W, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

CK_CONFIG = rule(
    "CK001",
    "config-missing",
    E,
    "config.json missing or unusable",
    "Every loader starts from config.json (architecture, sizes, quantization_config).",
    "Ship the model's config.json at the checkpoint root.",
)
CK_NO_SHARDS = rule(
    "CK002",
    "no-safetensors",
    E,
    "No safetensors files",
    "A checkpoint without tensors cannot load.",
    "Add the model's .safetensors shards.",
)
CK_INDEX_MISSING_SHARD = rule(
    "CK003",
    "index-missing-shard",
    E,
    "Index names a shard that is absent",
    "Loaders fail (or silently load garbage) when a referenced shard is missing.",
    "Upload the shard or regenerate model.safetensors.index.json.",
)
CK_INDEX_MISSING_TENSOR = rule(
    "CK004",
    "index-missing-tensor",
    E,
    "Index maps a tensor that its shard does not hold",
    "The loader looks the tensor up in that shard and fails.",
    "Regenerate the index.",
)
CK_UNMAPPED_TENSOR = rule(
    "CK005",
    "unmapped-tensor",
    E,
    "Shard tensor missing from the index",
    "Loaders only load what the index maps: this tensor is silently ignored.",
    "Regenerate the index so it maps every tensor.",
)
CK_UNREFERENCED_SHARD = rule(
    "CK006",
    "unreferenced-shard",
    E,
    "Shard file not referenced by the index",
    "A leftover shard is downloaded but never loaded: usually a stale file from another revision.",
    "Delete the stale shard or add its tensors to the index.",
)
CK_DUPLICATE_TENSOR = rule(
    "CK007",
    "tensor-in-two-shards",
    E,
    "Tensor stored in two shards",
    "Which copy wins depends on the loader.",
    "Keep the tensor in exactly one shard.",
)
CK_TOTAL_SIZE = rule(
    "CK008",
    "index-total-size",
    W,
    "metadata.total_size is wrong",
    "Some loaders pre-allocate from total_size.",
    "Set total_size to the sum of tensor bytes.",
)
CK_INDEX_MALFORMED = rule(
    "CK009",
    "index-malformed",
    E,
    "Index file is malformed",
    "model.safetensors.index.json needs a weight_map of tensor name -> shard file.",
    "Regenerate the index.",
)
CK_NO_INDEX = rule(
    "CK010",
    "index-absent",
    W,
    "Several shards but no index",
    "Loaders use model.safetensors.index.json to find tensors across shards.",
    "Write model.safetensors.index.json.",
)
CK_SHARD_UNREADABLE = rule(
    "CK011",
    "shard-unreadable",
    E,
    "Shard cannot be read",
    "The file exists but cannot be opened or read.",
    "Check permissions and the download.",
)
CK_UNKNOWN_KIND = rule(
    "CK012",
    "unknown-artifact",
    E,
    "Not a recognised EXL3 artifact",
    "No quantization_config tensor_storage, r7_routed_experts, hybrid_tr3_tail or adapter_config.",
    "Point exl3tool at an EXL3/R7 checkpoint, an MSRT base or a cartridge directory.",
)
CK_QUANT_CONFIG = rule(
    "CK013",
    "quant-config-missing",
    E,
    "quantization_config.json missing",
    "vLLM reads tensor_storage (and the R7 block) from quantization_config.json.",
    "Ship quantization_config.json next to config.json.",
)
CK_EXPERT_FIELD = rule(
    "CK030",
    "expert-namespace-unknown",
    E,
    "Unknown tensor in a routed expert's namespace",
    "The model's weight loader maps every `…mlp.experts.{E}.{proj}.*` name onto an expert "
    "parameter; a field that is not trellis, suh, svh, su, sv, mcg or mul1 (rank-sliced: "
    "`.rank{r}.` + trellis|suh|svh|mcg|mul1) has no parameter and fails the load.",
    "Remove the tensor (and its index entry), or store it outside the expert namespace.",
)
