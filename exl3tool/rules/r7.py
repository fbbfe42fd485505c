"""Rules of R7 checkpoints (R7) and of the legacy rank-sliced profile (RS).

docs/formats/r7.md §1-§6 (R7) and §7.1 (RS).
"""

from exl3tool.rules.registry import Severity, rule

E, W, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

# --- the r7_routed_experts block (§2) ----------------------------------------------------------
R7_BLOCK_TYPE = rule(
    "R7001",
    "block-not-object",
    E,
    "r7_routed_experts is not an object",
    'vLLM rejects it: "r7_routed_experts must be an object" (§2.1).',
    "Write the block as a JSON object.",
)
R7_SCHEMA = rule(
    "R7002",
    "block-schema-id",
    E,
    "Unsupported R7 schema id",
    'vLLM requires schema == "r7-complete-v2-checkpoint-v1" and does not auto-select exl3 otherwise (§1, §2.1).',
    'Set "schema": "r7-complete-v2-checkpoint-v1".',
)
R7_CODEBOOK_BITS = rule(
    "R7003",
    "block-codebook-bits",
    E,
    "codebook/bits are not mcg/mixed_tensor",
    "\"R7 EXL3 requires codebook='mcg' and bits='mixed_tensor'\" (§2.1).",
    'Set "codebook": "mcg" and "bits": "mixed_tensor".',
)
R7_MOE_LAYERS = rule(
    "R7004",
    "block-moe-layers",
    E,
    "moe_layers is not [first, last] of JSON integers with 0 <= first <= last",
    "vLLM rejects bools and floats posing as ints and reversed ranges (§2.1); the range is inclusive.",
    "Write two non-negative JSON integers, e.g. [3, 77].",
)
R7_K_VALUES = rule(
    "R7005",
    "block-k-values",
    E,
    "k_values is not a non-empty list of JSON integers in {3, 4, 5}",
    "vLLM normalises k_values and rejects bools, floats and values outside {3, 4, 5} (§2.1).",
    "Write e.g. [3, 4, 5].",
)
R7_BLOCK_FIELD = rule(
    "R7006",
    "block-field",
    W,
    "An R7 producer field has an unexpected type",
    "The R7 assembler writes these fields with fixed types (§2.2); vLLM ignores them, other tools may not.",
    "Match the field types of schemas/r7-routed-experts.schema.json.",
)
R7_DRIFT = rule(
    "R7010",
    "embedded-drift",
    E,
    "config.json quantization_config differs from quantization_config.json",
    "The R7 assembler treats any difference as an error (embedded/external metadata drift, §1): "
    "HF reads one copy, vLLM the other.",
    "Write the same quantization_config into both files.",
)
R7_EMBEDDED_MISSING = rule(
    "R7011",
    "embedded-missing",
    E,
    "config.json has no quantization_config",
    "vLLM's automatic exl3 override reads config.json's quantization_config (§1).",
    "Embed the same quantization_config in config.json.",
)
R7_QUANT_METHOD = rule(
    "R7012",
    "quant-method-stamp",
    INFO,
    "quant_method names the carrier, not the payload",
    "R7 checkpoints inherit quant_method 'modelopt' from their NVFP4 carrier; vLLM overrides it to "
    "exl3 because the v2 r7_routed_experts block is present, unless the user forces "
    "--quantization to another method (§1).",
    "Nothing to fix; do not pass --quantization other than exl3 when serving.",
)
# --- tensors (§3) -------------------------------------------------------------------------------
R7_EXPERT_COUNT = rule(
    "R7020",
    "expert-count",
    E,
    "Routed expert count unknown",
    "config.json must give n_routed_experts, num_experts or num_local_experts to know which experts to expect.",
    "Add the architecture's expert-count field to config.json.",
)
R7_SIZES = rule(
    "R7021",
    "model-sizes",
    E,
    "hidden_size / moe_intermediate_size missing or not 128-aligned",
    "Expert trellis geometry follows from them; EXL3 needs multiples of 128 (docs/formats/exl3.md §1.4).",
    "Fix config.json (stored sizes are 128-aligned).",
)
R7_LAYER_MISSING = rule(
    "R7022",
    "layer-missing",
    E,
    "An MoE layer in moe_layers has no R7 expert tensors",
    "vLLM loads every layer of the declared range as R7 EXL3 and fails on a missing one.",
    "Ship r7-experts-layer-LLL.safetensors for every layer of moe_layers.",
)
R7_TENSOR_MISSING = rule(
    "R7023",
    "expert-tensor-missing",
    E,
    "A routed expert lacks a trellis, marker or scale vector",
    "Each (expert, projection) needs trellis + mcg, gate/up svh and down suh (§3.1).",
    "Re-assemble the layer shard.",
)
R7_K_UNDECLARED = rule(
    "R7024",
    "k-not-declared",
    E,
    "Payload K not in k_values",
    '"R7 … has bitrates [...] not declared by r7_routed_experts.k_values" (§3.2).',
    "Declare the K in k_values or re-quantize the projection.",
)
R7_GEOMETRY = rule(
    "R7025",
    "trellis-geometry",
    E,
    "Expert trellis shape does not match hidden/intermediate size",
    "gate/up are [hidden/16, I/16, 16K], down is [I/16, hidden/16, 16K] (§3.1, §3.2).",
    "Re-assemble the layer with the model's sizes.",
)
R7_MARKER = rule(
    "R7026",
    "codebook-marker",
    E,
    "Routed expert without the mcg marker (or with mul1)",
    "R7 experts are MCG-coded (§2.1 codebook 'mcg'); the marker selects the codebook.",
    "Write the mcg marker for every (expert, projection).",
)
R7_VECTOR = rule(
    "R7027",
    "expert-vector-shape",
    E,
    "Per-expert svh/suh has the wrong dtype or size",
    "gate/up svh and down suh are F16 [moe_intermediate_size] (§3.1).",
    "Re-assemble the layer shard.",
)
R7_SHARED = rule(
    "R7028",
    "shared-vectors",
    E,
    "r7_shared.gate_up_suh / down_svh missing or of the wrong size",
    "Hidden-side vectors are shared per layer: F16 [hidden_size] each (§3.1).",
    "Write both r7_shared vectors for every MoE layer.",
)
R7_UNEXPECTED_VECTOR = rule(
    "R7029",
    "unexpected-expert-vector",
    E,
    "Per-expert hidden-side vector in an R7 layer",
    "R7 layers have no per-expert gate/up suh or down svh; the loader uses r7_shared (§3.1). "
    "Expert 0's copy takes the r7_shared vectors' place, so it would be served for every "
    "expert's projection; another expert's copy is served by a layer of one K and ignored by a "
    "layer of several K tiers, so what is served depends on the layer's tiers. A byte-identical "
    "copy of the shared vector is only a warning: it is served the same either way.",
    "Drop the tensor or move it to r7_shared.",
)
R7_TIER = rule(
    "R7030",
    "layer-tier",
    INFO,
    "Per-layer tier (distinct K across gate/up/down)",
    "The tier decides the kernel path: 1 = ExLlamaV3 fallback, 2-3 = fused B12X (§3.3).",
    "Nothing to fix; informational.",
)
R7_OUT_OF_RANGE = rule(
    "R7031",
    "expert-out-of-range",
    E,
    "Expert tensor outside the declared layers or expert count",
    "The loader only maps layers in moe_layers (or the carried tail) and experts < the expert count.",
    "Fix moe_layers / the expert count, or drop the stray tensors.",
)
R7_SHARD_META = rule(
    "R7032",
    "shard-metadata",
    W,
    "R7 layer shard __metadata__ is not as the assembler writes it",
    'Shards carry {"format": "pt", "r7_schema": "2", "r7_layer": "L", "r7_marker": "CODEX_ROUND7"} (§3.1).',
    "Rewrite the shard header metadata.",
)
R7_WRONG_SHARD = rule(
    "R7033",
    "layer-in-wrong-shard",
    W,
    "Expert tensor stored outside its layer shard",
    "R7 keeps one shard per MoE layer, r7-experts-layer-LLL.safetensors (§3.1).",
    "Move the tensor into its layer's shard.",
)
R7_RANGE_MODEL = rule(
    "R7034",
    "moe-layers-beyond-model",
    E,
    "moe_layers exceeds the model's layers",
    "The range must lie within num_hidden_layers (+ MTP layers); GLM-5.2: 3..77 of 78.",
    "Fix moe_layers or num_hidden_layers.",
)
# --- per-layer manifests (§4) ---------------------------------------------------------------
R7_MANIFEST_MISSING = rule(
    "R7040",
    "layer-manifest-missing",
    E,
    "Per-layer manifest missing",
    "Each MoE layer has r7-experts-layer-LLL.json with its bit_map and digests (§4).",
    "Ship the manifest written by the assembler.",
)
R7_MANIFEST_LIST = rule(
    "R7041",
    "bit-map-manifests",
    E,
    "bit_map_manifests does not list exactly one manifest per layer",
    "The block lists r7-experts-layer-LLL.json for every layer of moe_layers (§2.2, §4).",
    "List one manifest per layer of moe_layers, in order.",
)
R7_MANIFEST_SCHEMA = rule(
    "R7042",
    "layer-manifest-schema",
    E,
    "Per-layer manifest violates its schema",
    "bit_map, allocation_bit_units, payload_sha256 and shard_sha256 are required with fixed types (schemas/r7-layer-manifest.schema.json).",
    "Regenerate the manifest.",
)
R7_BIT_MAP = rule(
    "R7043",
    "bit-map-mismatch",
    E,
    "bit_map disagrees with the payload K",
    "bit_map[prefix] must equal trellis.shape[2] // 16 for every (expert, projection) (§4).",
    "Regenerate the manifest from the shard.",
)
R7_ALLOCATION = rule(
    "R7044",
    "allocation-bit-units",
    E,
    "allocation_bit_units is not the sum of bit_map",
    "Σ bit_map == allocation_bit_units (§4); GLM-5.2: 2688 = 3.5 × 768.",
    "Regenerate the manifest.",
)
R7_PAYLOAD_SHA = rule(
    "R7045",
    "payload-sha256",
    E,
    "Tensor payload does not match payload_sha256",
    "The manifest pins every tensor's raw bytes (§4, §9); a mismatch is corruption or a stale manifest.",
    "Re-download the shard or regenerate the manifest.",
)
R7_SHARD_SHA = rule(
    "R7046",
    "shard-sha256",
    E,
    "Shard file does not match shard_sha256",
    "The manifest pins the whole shard file (§4).",
    "Re-download the shard or regenerate the manifest.",
)
R7_MANIFEST_LAYER = rule(
    "R7047",
    "layer-manifest-binding",
    E,
    "Manifest layer/shard/payload names do not match its layer",
    "A manifest describes exactly its layer's shard and tensors (§4).",
    "Regenerate the manifest.",
)
R7_PROVENANCE = rule(
    "R7048",
    "provenance-missing",
    INFO,
    "Optional provenance fields absent",
    "Manifest field sets vary between producer revisions (§4, §5); only digests and bit maps are needed for checks.",
    "Nothing to fix; informational.",
)
R7_HASH_SKIPPED = rule(
    "R7049",
    "digests-not-verified",
    INFO,
    "Declared digests were not verified",
    "Payload, shard and file digests are only recomputed with --hash (it reads every byte).",
    "Run again with --hash to verify payload_sha256, shard_sha256 and files_sha256.",
)
# --- MANIFEST.json / MANIFEST.sha256 (§5) ----------------------------------------------------
R7_CKPT_MANIFEST = rule(
    "R7050",
    "checkpoint-manifest",
    W,
    "MANIFEST.json missing or without files_sha256",
    "The assembler pins every file of the checkpoint in MANIFEST.json files_sha256 (§5).",
    "Ship MANIFEST.json and MANIFEST.sha256.",
)
R7_FILES_SHA = rule(
    "R7051",
    "files-sha256",
    E,
    "A file does not match MANIFEST.json files_sha256",
    "files_sha256 pins each file of the checkpoint (§5).",
    "Re-download the file or regenerate MANIFEST.json.",
)
R7_SEAL = rule(
    "R7052",
    "manifest-seal",
    E,
    "MANIFEST.sha256 does not seal MANIFEST.json",
    'MANIFEST.sha256 is the single line "<sha256(MANIFEST.json)>  MANIFEST.json" (§5).',
    "Regenerate MANIFEST.sha256 (sha256sum MANIFEST.json > MANIFEST.sha256).",
)
R7_FILES_LIST = rule(
    "R7053",
    "files-sha256-entry",
    E,
    "files_sha256 names an absent file or a malformed digest",
    "Every entry must name a file of the checkpoint and a 64-hex sha256 (§5).",
    "Regenerate MANIFEST.json.",
)
R7_LAYER_MANIFEST_SHA = rule(
    "R7054",
    "layer-manifest-sha256",
    E,
    "A layer manifest does not match r7_layer_manifest_sha256",
    "MANIFEST.json pins each r7-experts-layer-LLL.json (§5).",
    "Regenerate MANIFEST.json.",
)
# --- carried MTP layer (§6) and TP (§3.4) -----------------------------------------------------
R7_TAIL_ROLE = rule(
    "R7060",
    "carried-tail",
    E,
    "hybrid_tr3_tail in an R7 checkpoint is not the carried MTP layer",
    'The assembler keeps the legacy tail only for the MTP layer: r7_compat_role "carried_mtp78_only", '
    "moe_layers outside the R7 range (§6).",
    "Set r7_compat_role and a tail moe_layers that does not overlap r7_routed_experts.moe_layers.",
)
R7_TAIL_MIXED = rule(
    "R7061",
    "carried-tail-mixed",
    E,
    "Carried hybrid_tr3_tail with mixed bits in an R7 checkpoint",
    "With a rank-sliced tail present, the runtime sizes every EXL3 MoE layer, the R7 layers "
    "included, from the tail's per-layer bitrates (Exl3Config.rank_sliced_layer_bitrates); with "
    "bits \"mixed\" those come from the tail's bitmap, which covers only the tail's own layers, "
    "so the first R7 layer is refused at model construction.",
    'Give the carried tail the uniform K of its MTP layer (bits 3..6) instead of "mixed".',
)
R7_TP_ALIGN = rule(
    "R7070",
    "tp-alignment",
    E,
    "Expert intermediate size per rank is not a multiple of 128",
    "Each rank streams a slice of I/TP channels; slices must not cut a 128 Hadamard block (§3.4).",
    "Serve with a TP size that divides the intermediate size into multiples of 128.",
)
R7_ROUTER = rule(
    "R7071",
    "router-shape",
    E,
    "Router weight is not a float [experts, hidden] matrix",
    "Each MoE layer's `mlp.gate.weight` is [n_routed_experts, hidden_size] (and its optional "
    "`e_score_correction_bias` [n_routed_experts]) in F16, BF16 or F32; the loader fails at boot "
    "on any other shape.",
    "Store the router as [experts, hidden] (bias [experts]) in F16, BF16 or F32.",
)

# --- legacy rank-sliced profile (§7.1) ---------------------------------------------------------
RS_FIELD = rule(
    "RS001",
    "tail-field",
    E,
    "hybrid_tr3_tail field missing or invalid",
    "format, bits, codebook, experts_per_layer, moe_layers, tensor_schema and tp are required (§7.1).",
    "Write the tail as the R7 loader expects it.",
)
RS_SCHEMA = rule(
    "RS002",
    "tensor-schema",
    E,
    "tensor_schema is not the rank-sliced schema",
    "The loader accepts exactly model.layers.{L}.mlp.experts.{E}.{proj}.rank{r}.{trellis|suh|svh|mcg} (§7.1).",
    "Write the exact tensor_schema string.",
)
RS_EXPERTS = rule(
    "RS003",
    "experts-per-layer",
    E,
    "experts_per_layer differs from the model's expert count",
    "The loader requires experts_per_layer to equal the model's routed expert count (§7.1).",
    "Fix experts_per_layer or config.json.",
)
RS_TP = rule(
    "RS004",
    "checkpoint-tp",
    E,
    "Checkpoint tp differs from the runtime TP size",
    '"checkpoint TP does not match runtime": each rank\'s slice is baked into the file (§7.1).',
    "Serve with --tp equal to the checkpoint's tp, or re-slice the checkpoint.",
)
RS_MISSING = rule(
    "RS005",
    "rank-tensor-missing",
    E,
    "A rank slice of an expert tensor is missing",
    "Every rank r < tp needs trellis, suh, svh and mcg for every (expert, projection); under "
    "shared_h_v1 the H-side vector is the layer's experts.shared_h.{proj}.rank{r} one (§7.1).",
    "Re-slice the layer.",
)
RS_GEOMETRY = rule(
    "RS006",
    "slice-geometry",
    E,
    "Rank slice has the wrong shape",
    "gate/up split tile axis 1 and svh; down splits tile axis 0 and suh; H-side vectors replicate (§7.1).",
    "Re-slice the layer with the converter geometry.",
)
RS_RANK_RANGE = rule(
    "RS007",
    "rank-out-of-range",
    E,
    "Tensor for a rank >= tp",
    "The loader keeps only rank{local rank}; a rank beyond tp is dead weight or a wrong tp.",
    "Drop the stray ranks or fix tp.",
)
RS_K = rule(
    "RS008",
    "rank-k",
    E,
    "Rank-sliced trellis K disagrees with bits / k_values",
    "Uniform bits fix K for every tensor; mixed bits allow k_values in 3..6 (§7.1).",
    "Re-quantize or fix bits / k_values.",
)
RS_ALIGN = rule(
    "RS009",
    "slice-not-128",
    E,
    "Intermediate size per rank is not a multiple of 128",
    "I/W must be a multiple of 128: a slice must not cut a Hadamard block (§7.1).",
    "Slice for a TP size that keeps I/W a multiple of 128.",
)
RS_ROTATION = rule(
    "RS010",
    "rotation-layout",
    E,
    "Unknown rotation_layout or shared-H layout violated",
    'rotation_layout is "per_expert_v1" or "shared_h_v1"; shared_h_v1 needs shared_h_tensor_schema '
    "and forbids H-side vectors under expert ids; any other layout forbids that schema and every "
    "experts.shared_h vector; a shared vector is its projection's H side (suh of gate/up, svh of "
    "down) (§7.1).",
    "Fix rotation_layout or the tensors.",
)
RS_TIER_BITMAP = rule(
    "RS011",
    "tier-bitmap",
    E,
    "Mixed bits without a usable tier_bitmap.json / k_values",
    'bits "mixed" needs k_values (3..6) and bits_per_expert, a "file.json:field" reference (the '
    'producer writes "tier_bitmap.json:k"; the hardened public revision takes a bare file name '
    "only): an entry in that file for every layer of moe_layers whose field lists one integer K "
    "from k_values per expert (Exl3Config._load_rank_sliced_bitrates refuses to start "
    "otherwise; §7.1).",
    "Ship tier_bitmap.json with a K per expert for every MoE layer, and declare k_values.",
)
RS_REPLICA = rule(
    "RS012",
    "replica-mismatch",
    E,
    "A replicated rank copy differs from rank 0's copy (--hash)",
    "The H-side vector (suh of gate/up, svh of down) and mcg are byte-identical on every rank "
    "(§7.1); each rank loads its own copy, so a copy that differs makes the ranks serve "
    "different weights, with no error anywhere.",
    "Re-slice the layer from its source, or copy rank 0's tensor to the other ranks.",
)
RS_EXPERT_RANGE = rule(
    "RS013",
    "rank-slice-out-of-range",
    E,
    "Rank slice outside moe_layers or beyond experts_per_layer",
    "The model's weight loader maps experts 0 .. experts_per_layer - 1 only (experts_per_layer "
    "equals the model's count, RS003), and only the tail's moe_layers are rank-sliced MoE "
    "layers: any other rank slice has no parameter to load into (§7.1).",
    "Drop the stray tensors or fix experts_per_layer / moe_layers.",
)
R7_STORAGE_REQUIRED = rule(
    "R7080",
    "dense-tensor-storage-missing",
    E,
    "R7 checkpoint without a tensor_storage map and without a rank-sliced tail",
    "Unless config.json carries a hybrid_tr3_tail with format exl3-trellis, the runtime's config "
    "step (Exl3Config.maybe_update_config) hydrates quantization_config.json and refuses to start "
    "when its tensor_storage map is absent or empty.",
    "Ship quantization_config.json with the tensor_storage map of the EXL3 dense modules.",
)
RS_RUNTIME_K = rule(
    "RS020",
    "runtime-k",
    E,
    "Uniform rank-sliced bitrate the targeted runtime cannot serve",
    "A uniform rank-sliced layer runs only at an integral K: the public runtime revisions "
    "(Exl3MoEMethod._prepare_rank_sliced_weights) accept 3, 4, 5 and 6; the cartridge "
    "revision accepts 2..6 (see --runtime).",
    "Re-quantize the routed experts at K 3..6, or target the cartridge runtime (--runtime cartridge).",
)
RS_MIXED_TIERS = rule(
    "RS021",
    "mixed-tier-count",
    E,
    "Mixed rank-sliced layer without exactly two bitrates",
    "A layer whose experts use more than one K takes the one-grid mixed path "
    "(Exl3MoEMethod._prepare_mixed_rank_sliced_weights), which requires exactly two bitrates.",
    "Give each mixed layer exactly two K values in tier_bitmap.json.",
)
RS_TAIL_CODEBOOK = rule(
    "RS022",
    "tail-dense-codebook",
    E,
    "A dense EXL3 linear in the tail's MoE layers without the mcg codebook",
    "With a rank-sliced tail the runtime expects mcg of every module in a layer of its "
    "moe_layers, attention and shared experts included (Exl3Config.codebook_for_prefix answers "
    "mcg for the whole layer before it reads the linear's own record), and "
    "Exl3LinearMethod.process_weights_after_loading refuses a linear without the mcg marker.",
    "Quantize the dense linears of those layers with the mcg codebook (convert with --codebook "
    "mcg), or keep them unquantized.",
)
R7_MODEL_MOE = rule(
    "R7035",
    "model-moe-layers",
    E,
    "The model's MoE layers and the layers R7 claims disagree",
    "The model builds layer L as MoE when L >= first_k_dense_replace and L % moe_layer_freq == "
    "0 (its MTP layers too). A MoE layer that moe_layers, the carried tail and tensor_storage "
    "leave unclaimed gets the unquantized MoE method, whose experts nothing fills unless BF16 "
    "expert tensors are stored (the loader does not check); expert tensors on a dense layer "
    "have no parameter to load into.",
    "Make moe_layers (and the tail) cover exactly the model's MoE layers, or fix "
    "first_k_dense_replace / moe_layer_freq in config.json.",
)
