"""Rules of cartridge-capable EXL3 bases `exl3-msrt-base/1` (MB; docs/formats/msrt.md §5-§6, P7-P9)."""

from exl3tool.rules.registry import Severity, rule

E, W, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

MB_FIELDS = rule(
    "MB001",
    "profile-fields",
    E,
    "hybrid_tr3_tail field set is not the closed exl3-msrt-base/1 set",
    "exl3-msrt-base/1 is closed: unknown fields (e.g. a legacy `tp`) and missing fields are rejected (§5).",
    "Write exactly the 12 profile fields of §5.",
)
MB_VALUE = rule(
    "MB002",
    "profile-value",
    E,
    "hybrid_tr3_tail field has the wrong value",
    "format, runtime_profile, codebook, tensor_schema, tensor_parallel and mcg_multiplier are fixed by the profile (§5).",
    "Write the value of §5.",
)
MB_LAYERS = rule(
    "MB003",
    "moe-layers",
    E,
    "moe_layers / moe_layer_coverage differ from the tensors",
    "moe_layers is [min, max] and moe_layer_coverage the exact sorted list of layers holding routed experts (§5).",
    "Regenerate both from the checkpoint's tensors.",
)
MB_EXPERTS = rule(
    "MB004",
    "experts-per-layer",
    E,
    "experts_per_layer differs from the tensors",
    "Every MoE layer must hold experts 0..experts_per_layer-1 (§5).",
    "Fix experts_per_layer or add the missing experts.",
)
MB_RANK = rule(
    "MB005",
    "rank0-storage",
    E,
    "Expert tensor is not rank0 storage",
    "exl3-msrt-base/1 stores only rank0 full logical tensors; the runtime slices at load (§5).",
    "Re-export the base with rank0 full tensors.",
)
MB_INCOMPLETE = rule(
    "MB006",
    "incomplete-expert",
    E,
    "Expert projection lacks trellis/suh/svh/mcg",
    "Every (expert, projection) has all four components and every expert all three projections (§6.1).",
    "Add the missing tensors.",
)
MB_COMPONENT = rule(
    "MB007",
    "component-shape",
    E,
    "Component dtype or shape is wrong",
    "trellis I16 [a, b, 16K], suh F16 [16a], svh F16 [16b], mcg I32 [] (§6.1).",
    "Re-export the tensor.",
)
MB_MCG = rule(
    "MB008",
    "mcg-marker",
    E,
    "mcg marker is not 0xCBAC1FED",
    "The mcg component holds int32 -877912083 (bytes ed1faccb) (§6.1).",
    "Write the MCG marker value.",
)
MB_K = rule(
    "MB009",
    "uniform-k",
    E,
    "Base K not uniform or not equal to bits",
    "The cartridge runtime requires a uniform base bitrate equal to hybrid_tr3_tail.bits, an integer 2..6 (§1.3, §6.2).",
    "Re-quantize at one K, or fix bits.",
)
MB_ROOT = rule(
    "MB010",
    "compatibility-root",
    E,
    "compatibility_sha256 does not match the identity",
    "The root must equal sha256 of the canonical {schema, k, layers} of compatibility_by_layer, and (with --hash) of the identity recomputed from the bytes (§6.2).",
    "Recompute the identity with `exl3tool identity`.",
)
MB_LAYER_DIGEST = rule(
    "MB011",
    "compatibility-layer",
    E,
    "Layer digest differs from the bytes",
    "Each compatibility_by_layer entry must equal the digest recomputed from that layer's routed-expert tensors (§6).",
    "Recompute the identity; the tensors or the map are stale.",
)
MB_MAP_KEYS = rule(
    "MB012",
    "compatibility-map-keys",
    E,
    "compatibility_by_layer keys differ from moe_layer_coverage",
    "The base publishes the full per-layer map (§6.4).",
    "Publish one digest per MoE layer.",
)
MB_QUANT = rule(
    "MB013",
    "quantization-config",
    E,
    "quantization_config differs from the profile",
    "The producer writes quantization_config = {quant_method: exl3, bits: K, codebook: mcg, version: rank-sliced} (§5).",
    "Write the profile's quantization_config.",
)
MB_TIER = rule(
    "MB014",
    "tier-bitmap",
    E,
    "tier_bitmap.json disagrees with the uniform K",
    "tier_bitmap.json entries k / bits_per_expert must equal the uniform K (§5).",
    "Regenerate tier_bitmap.json.",
)
MB_MANIFEST = rule(
    "MB015",
    "manifest-files",
    E,
    "MANIFEST.sha256 does not list exactly the files",
    "MANIFEST.sha256 lists every file; no unlisted files or symlinks may exist (P7).",
    "Regenerate MANIFEST.sha256.",
)
MB_MANIFEST_HASH = rule(
    "MB016",
    "manifest-sha256",
    E,
    "File differs from its MANIFEST.sha256 digest",
    "Every listed file is re-hashed against MANIFEST.sha256 (P7).",
    "Re-download the file, or regenerate MANIFEST.sha256.",
)
MB_GEOMETRY = rule(
    "MB017",
    "geometry",
    E,
    "Expert geometry differs from config.json sizes",
    "Trellis shapes must be the 128-aligned hidden/intermediate sizes of config.json (§3).",
    "Fix config.json sizes or the tensors.",
)
MB_MANIFEST_ABSENT = rule(
    "MB018",
    "manifest-absent",
    INFO,
    "No MANIFEST.sha256",
    "The producer pins a base through the sha256 of its MANIFEST.sha256 (P7); without one the files are not sealed.",
    "Write MANIFEST.sha256 in sha256sum format over every file.",
)
MB_PUBLIC_RUNTIME = rule(
    "MB020",
    "public-runtime",
    E,
    "An MSRT base checked against the public runtime revision, which cannot serve one",
    "Only the cartridge revision serves an exl3-msrt-base/1 base: the public revisions read its "
    "hybrid_tr3_tail as a legacy rank-sliced tail and refuse to start without its `tp` "
    "(Exl3Config._configure_rank_sliced), and run no K 2 expert.",
    "Deploy the base on the cartridge revision (validate's default for a base, or "
    "--runtime cartridge).",
)
MB_ROUTER = rule(
    "MB019",
    "router-shape",
    E,
    "Router weight is not a float [experts, hidden] matrix",
    "Each MoE layer's `mlp.gate.weight` scores every routed expert from the hidden state: a "
    "2-D F16/BF16/F32 tensor [experts_per_layer, hidden_size] (the runtime transposes it).",
    "Store the router as [experts, hidden] in F16, BF16 or F32.",
)
