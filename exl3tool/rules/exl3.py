"""Rules of EXL3 linears and the `tensor_storage` map (EX); docs/formats/exl3.md §1-§2, docs/formats/r7.md §8."""

from exl3tool.rules.registry import Severity, rule

E, W, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

EX_TRELLIS_DTYPE = rule(
    "EX001",
    "trellis-dtype",
    E,
    "Trellis is not an I16 rank-3 tensor",
    "A trellis is int16 [k/16, n/16, 16*K] (docs/formats/exl3.md §1); kernels read it as such.",
    "Re-export the trellis as I16 with three dimensions.",
)
EX_TRELLIS_K = rule(
    "EX002",
    "trellis-k",
    E,
    "Trellis last dimension is not 16*K for a valid K",
    "K = last_dim/16 must be 1..8, or 1.5/2.5/3.5 (§1.1); bits_from_K rejects anything else.",
    "Re-quantize the linear with a supported bit width.",
)
EX_HALF_K = rule(
    "EX003",
    "half-k-needs-mul1",
    E,
    "Half-integer K without the mul1 codebook",
    "K = 1.5/2.5/3.5 exist only for the MUL1 codebook (§1.1); the kernels assert it.",
    "Add the .mul1 marker or re-quantize with an integer K.",
)
EX_MISSING_SUH = rule(
    "EX004",
    "missing-suh",
    E,
    "EXL3 linear without suh (or legacy su)",
    "The input-side scale is part of every EXL3 linear (§1); the loader needs it.",
    "Ship {prefix}.suh next to the trellis.",
)
EX_MISSING_SVH = rule(
    "EX005",
    "missing-svh",
    E,
    "EXL3 linear without svh (or legacy sv)",
    "The output-side scale is part of every EXL3 linear (§1); the loader needs it.",
    "Ship {prefix}.svh next to the trellis.",
)
EX_MISSING_TRELLIS = rule(
    "EX006",
    "missing-trellis",
    E,
    "suh/svh without a trellis",
    "The module is recognised as EXL3 from its scales but has no packed weights.",
    "Ship {prefix}.trellis or remove the orphan scales.",
)
EX_SUH_SHAPE = rule(
    "EX007",
    "suh-shape",
    E,
    "suh does not match the trellis input size",
    "suh is F16 [k] with k = 16*trellis.shape[0] (su: I16 [k/16]) (§1).",
    "Re-export suh with the trellis's input size.",
)
EX_SVH_SHAPE = rule(
    "EX008",
    "svh-shape",
    E,
    "svh does not match the trellis output size",
    "svh is F16 [n] with n = 16*trellis.shape[1] (sv: I16 [n/16]) (§1).",
    "Re-export svh with the trellis's output size.",
)
EX_DIM_128 = rule(
    "EX009",
    "dims-not-128-aligned",
    E,
    "Input or output size is not a multiple of 128",
    "The 128-wide block Hadamards need k % 128 == 0 and n % 128 == 0 (§1.4).",
    "Pad the linear to multiples of 128 before quantizing.",
)
EX_MARKER_DTYPE = rule(
    "EX010",
    "marker-dtype",
    E,
    "Codebook marker is not an I32 scalar",
    "mcg/mul1 markers are int32 scalars (§1); the loader reads exactly 4 bytes. A one-element "
    "int32 of another shape ([1]) is a warning: the runtime takes it, exllamav3 writes a scalar.",
    "Store the marker as I32 with shape [].",
)
EX_MARKER_VALUE = rule(
    "EX011",
    "marker-value",
    E,
    "Codebook marker has the wrong sentinel value",
    "exllamav3's loader raises unless mcg == 0xCBAC1FED and mul1 == 0x83DCD12D (§1).",
    "Write -877912083 (mcg) or -2082680531 (mul1) as int32.",
)
EX_BOTH_MARKERS = rule(
    "EX012",
    "both-markers",
    E,
    "Both mcg and mul1 markers present",
    "Exactly one marker or none selects the codebook (§1); both is ambiguous.",
    "Keep the marker of the codebook the trellis was quantized with.",
)
EX_NONFINITE = rule(
    "EX013",
    "scale-nonfinite",
    E,
    "suh/svh holds NaN or Inf",
    "A non-finite scale turns whole rows or columns of the weight into NaN.",
    "Re-export the scale vectors from the quantizer's output.",
)
EX_LEGACY_SIGNS = rule(
    "EX014",
    "legacy-sign-vectors",
    INFO,
    "Legacy packed sign vectors su/sv",
    "Old checkpoints store ±1 signs packed in I16 (§1.3); current writers never do.",
    "Nothing to fix; re-convert with a current exllamav3 to get suh/svh.",
)
EX_BIAS_SHAPE = rule(
    "EX015",
    "bias-shape",
    E,
    "Bias does not match the output size",
    "bias is F16 (or F32, converted on load) [n] (§1).",
    "Re-export the bias with the linear's output size.",
)
EX_OBSOLETE_SCALE = rule(
    "EX016",
    "obsolete-scale",
    E,
    "Obsolete {prefix}.scale tensor",
    "The loader asserts {prefix}.scale is absent on EXL3 linears (§1).",
    "Remove the .scale tensor.",
)
EX_NO_LINEARS = rule(
    "EX017",
    "no-exl3-linears",
    E,
    "No EXL3 linear in the checkpoint",
    "An EXL3 checkpoint without any trellis has nothing to decode.",
    "Check that the quantized shards are present.",
)
EX_STORAGE_MISSING = rule(
    "EX020",
    "tensor-storage-missing",
    E,
    "tensor_storage map missing or empty",
    "vLLM needs quantization_config.json with a non-empty tensor_storage map to find EXL3 modules (docs/formats/r7.md §8).",
    "Ship the quantization_config.json written by the converter.",
)
EX_STORAGE_ABSENT = rule(
    "EX021",
    "tensor-storage-absent-tensor",
    E,
    "tensor_storage lists a tensor that no shard holds",
    "The loader expects every stored tensor it was told about.",
    "Regenerate quantization_config.json from the shards.",
)
EX_STORAGE_UNLISTED = rule(
    "EX022",
    "tensor-storage-unlisted",
    E,
    "EXL3 tensor missing from tensor_storage",
    "vLLM finds EXL3 modules through tensor_storage; an unlisted linear is not loaded as EXL3.",
    "Regenerate quantization_config.json from the shards.",
)
EX_STORAGE_MISMATCH = rule(
    "EX023",
    "tensor-storage-mismatch",
    E,
    "tensor_storage shape, dtype or n_bytes disagree with the tensor",
    "tensor_storage is derived data; a disagreement means it describes another revision.",
    "Regenerate quantization_config.json from the shards.",
)
EX_STORAGE_BITS = rule(
    "EX024",
    "tensor-storage-bits",
    E,
    "bits_per_weight disagrees with the trellis K",
    "bits_per_weight must equal trellis.shape[-1]/16 of the module.",
    "Regenerate quantization_config.json from the shards.",
)
EX_STORAGE_RECORD = rule(
    "EX025",
    "tensor-storage-record",
    E,
    "Malformed tensor_storage record",
    "An exl3 record needs stored_tensors with trellis, suh|su and svh|sv, and not both mcg and mul1 (docs/formats/r7.md §8).",
    "Regenerate quantization_config.json from the shards.",
)
EX_STORAGE_MULTIPLIER = rule(
    "EX026",
    "tensor-storage-multiplier",
    W,
    "mcg_multiplier/mul1_multiplier disagree with the markers",
    "The record's multiplier is the uint32 marker value (§2) of the marker that is present.",
    "Regenerate quantization_config.json from the shards.",
)
EX_CONFIG_DRIFT = rule(
    "EX027",
    "quant-config-drift",
    W,
    "config.json quantization_config differs from quantization_config.json",
    "The converter writes the same dict into both (plus tensor_storage in the file, §2).",
    "Copy the embedded quantization_config into quantization_config.json (or back).",
)
EX_ROUTER = rule(
    "EX028",
    "router-shape",
    E,
    "Router weight is not a float [experts, hidden] matrix",
    "In a MoE layer (one holding `mlp.experts.*`), `mlp.gate.weight` is [routed experts, "
    "hidden_size] (its optional `e_score_correction_bias` [routed experts]) in F16, BF16 or F32.",
    "Store the router as [experts, hidden] (bias [experts]) in F16, BF16 or F32.",
)
EX_NO_RECORDS = rule(
    "EX030",
    "tensor-storage-no-exl3-record",
    E,
    "tensor_storage holds no record with quant_format exl3",
    "The runtime (Exl3Config._validate_storage_metadata) refuses a tensor_storage map without "
    "any EXL3 record.",
    "Regenerate quantization_config.json from the shards.",
)
EX_HALF_K_NOT_SERVED = rule(
    "EX031",
    "half-k-not-served",
    E,
    "Half-integer K: the serving runtime takes only K 1..8",
    "exllamav3 decodes K = 1.5/2.5/3.5 with the mul1 codebook (§1.1), but the serving runtime's "
    "EXL3 loaders refuse any trellis whose last dimension is not 16*K for an integer K in 1..8 "
    "(Exl3LinearMethod._validate_loaded_tensors, Exl3MoEMethod._validate_moe_shapes).",
    "For the vLLM fork, convert with whole bits per weight (exllamav3 itself loads K = 2.5).",
)
EX_STORAGE_CODEBOOK = rule(
    "EX032",
    "tensor-storage-codebook",
    E,
    "A tensor_storage record selects another codebook than its linear has",
    "The runtime takes a linear's codebook from the suffixes its own record lists (mcg, else "
    "mul1, else none: Exl3Config.codebook_for_prefix) and refuses a marker it did not expect or "
    "a missing one it did; a marker listed under another module's record misleads both.",
    "Regenerate quantization_config.json from the shards.",
)
EX_QUANTIZED_TABLE = rule(
    "EX033",
    "quantized-embedding",
    E,
    "A quantized embedding table (trellis rows + signs): the serving runtime has none",
    "exllamav3 stores a token embedding quantized with convert.py -eb (and its n-gram tables) as "
    "`<module>.trellis` (int16 rows) and `<module>.signs`, without a `.weight`. exllamav3 loads "
    "it; the serving runtime builds every embedding unquantized (VocabParallelEmbedding: the "
    "EXL3 config claims none) and has nothing to load these tensors into.",
    "For the vLLM fork, convert without -eb (exllamav3 itself loads it).",
)
EX_EXPERT_GEOMETRY = rule(
    "EX035",
    "expert-geometry",
    E,
    "A routed expert's trellis does not match config.json's sizes",
    "The runtime sizes an EXL3 MoE layer from config.json (hidden_size, moe_intermediate_size), "
    "not from the trellis: at TP 1 it pads the input and truncates the output to those sizes "
    "(Exl3MoEMethod._apply_expert: a wider trellis serves wrong results, a narrower one fails at "
    "the first forward), at TP > 1 it cuts each expert at the config's sizes. Padding to a "
    "multiple of 128 is expected (docs/formats/exl3.md §1.4).",
    "Fix config.json's hidden_size / moe_intermediate_size, or re-convert the experts.",
)
EX_SERVE_EAGER = rule(
    "EX036",
    "serve-eager",
    INFO,
    "The runtime serves this checkpoint only with --enforce-eager",
    "Without a rank-sliced tail every EXL3 linear runs through exl3_gemm, which autotunes with "
    "timing launches on its first call per shape; CUDA-graph capture cannot take them, so the "
    "runtime refuses to build the model unless eager execution is asked for "
    "(Exl3Config._require_enforce_eager).",
    "Serve with `vllm serve ... --enforce-eager` (enforce_eager=True).",
)
EX_PACKED_MIXED = rule(
    "EX034",
    "packed-module-mixed",
    E,
    "A fused module mixes EXL3 and unquantized sources",
    "vLLM builds q/k/v_proj as one qkv_proj, gate/up_proj as one gate_up_proj (DeepSeek's "
    "q_a_proj and kv_a_proj_with_mqa as fused_qkv_a_proj) with a single quantization method: "
    "Exl3Config._linear_prefix_is_exl3 refuses a fused module whose sources are partly EXL3 "
    "(older revisions load all of it unquantized, and the trellis tensors have nowhere to go).",
    "Quantize every source of the fused module the same way (all EXL3 or all unquantized).",
)
