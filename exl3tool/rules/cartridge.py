"""Rules of MSRT cartridges `fq-cartridge-adapter/3` (CA; docs/formats/msrt.md §9 A-E).

Path hygiene reuses PA001-PA005, JSON syntax JS0xx and safetensors structure ST0xx.
"""

from exl3tool.rules.registry import Severity, rule

E = Severity.ERROR

CA_PATH = rule(
    "CA001",
    "adapter-path-symlink",
    E,
    "Adapter path is or traverses a symlink",
    "The runtime refuses a cartridge path that is a symlink or passes through one (rule 1): a link can be swapped under the reader.",
    "Pass the real directory path, with no symlink on the way.",
)
CA_NOT_DIR_OR_FILE = rule(
    "CA002",
    "adapter-not-dir-or-file",
    E,
    "Adapter path is neither a directory nor a regular file",
    "FIFOs, sockets and devices are rejected (rule 2).",
    "Point at the adapter directory or one of its shard files.",
)
CA_CONFIG = rule(
    "CA003",
    "adapter-config-unreadable",
    E,
    "adapter_config.json missing, oversized, unstable or not an object",
    "The runtime opens adapter_config.json as a regular file of at most 16 MiB that must not change while read (rule 3).",
    "Ship a regular adapter_config.json (≤ 16 MiB) next to the shards.",
)
CA_SHARD_SIZE = rule(
    "CA004",
    "shard-size",
    E,
    "Shard size differs from the manifest",
    "The runtime compares each shard's byte size with shards[].size before use (rule 5).",
    "Regenerate shards[] (size, sha256) from the files.",
)
CA_SHARD_SHA256 = rule(
    "CA005",
    "shard-sha256",
    E,
    "Shard sha256 differs from the manifest",
    "The runtime hashes each shard while copying it into private staging and refuses a mismatch (rule 5).",
    "Re-download the shard or regenerate shards[].sha256.",
)
CA_TOTAL_SIZE = rule(
    "CA006",
    "shards-total-size",
    E,
    "Shards exceed 1 TiB together",
    "Producer and runtime cap the total shard size at 1 TiB (§2, rule 6).",
    "Split the cartridge into narrower products.",
)
CA_UNLISTED_ENTRY = rule(
    "CA007",
    "entry-file-unlisted",
    E,
    "Shard file passed is not listed by the manifest",
    "A file given as adapter_path must be one of the adjacent manifest's shards (rule 6).",
    "Pass the adapter directory, or a shard listed in adapter_config.json.",
)
CA_SCHEMA_VERSION = rule(
    "CA010",
    "schema-version",
    E,
    "Not an fq-cartridge-adapter/3 manifest",
    "The runtime checks `schema` first and rejects older or unversioned cartridges (rule 7).",
    "Re-export the cartridge with a producer that writes fq-cartridge-adapter/3.",
)
CA_FIELDS = rule(
    "CA011",
    "manifest-fields",
    E,
    "Manifest field set is not exactly the 24 fields",
    "The manifest is closed: unknown and missing fields are both errors (rule 7).",
    "Write exactly the 24 fields of §4.",
)
CA_CONSTANT = rule(
    "CA012",
    "manifest-constant",
    E,
    "Manifest constant has the wrong value",
    "format, runtime_profile, rotation_ownership, standard_lora_compatible, runtime_operation, codebook, mcg_multiplier, mcg_ownership and scale_shape are fixed (rule 8).",
    "Write the constant value of §4.",
)
CA_LABEL = rule(
    "CA013",
    "invalid-label",
    E,
    "Invalid label",
    "Labels must match ^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$ (1-32 characters, first alphanumeric; rule 9).",
    "Rename the assembly/base/stage label.",
)
CA_ID_LIST = rule(
    "CA014",
    "id-list",
    E,
    "Invalid id list",
    "Id lists must be non-empty lists of unique JSON integers ≥ 0; booleans are not integers (rule 10).",
    "Write unique non-negative integers.",
)
CA_CREATED_UTC = rule(
    "CA015",
    "created-utc",
    E,
    "created_utc is not RFC 3339 with a timezone",
    "The runtime parses created_utc with fromisoformat and requires tzinfo (rule 11).",
    "Write e.g. 2025-01-01T00:00:00Z.",
)
CA_SHAPE = rule(
    "CA016",
    "manifest-shape",
    E,
    "Manifest field has the wrong shape",
    "The JSON Schema of fq-cartridge-adapter/3 fixes each field's type (shards, coverage, campaign, source_assembly, num_tensors, ...; rule 11).",
    "Fix the field as the message and pointer say.",
)
CA_BASE_BLOCK = rule(
    "CA017",
    "base-block",
    E,
    "Invalid base compatibility identity block",
    "`base` is closed: label, k in 2..6, sha256 digests, and compatibility_by_layer keys equal to selected_layers (rule 12).",
    "Copy the base identity from the base's config.json for exactly the selected layers.",
)
CA_CHAIN = rule(
    "CA018",
    "chain",
    E,
    "chain is not a parent-linked stage path",
    "chain must be non-empty, start at base.label, link each stage to the previous one, use closed stage objects, k in 1..6, valid experts and unique labels (rule 14).",
    "Order the chain stages from the base outwards.",
)
CA_COVERAGE_KEYS = rule(
    "CA019",
    "coverage-keys",
    E,
    "coverage keys differ from the chain labels",
    "Every chain stage has a coverage entry and nothing else does (rule 14).",
    "Make coverage's keys the chain labels.",
)
CA_TP_CONTRACT = rule(
    "CA020",
    "tensor-parallel-contract",
    E,
    "Invalid tensor_parallel contract",
    "layout full means world_size 1 and ranks [0]; ranks must be exactly 0..world_size-1; axis_by_projection is fixed (rule 15).",
    "Rewrite tensor_parallel as §4 row 14 says.",
)
CA_DUPLICATE_KEY = rule(
    "CA030",
    "duplicate-key",
    E,
    "Tensor key stored in two shards",
    "The runtime rejects a key present in two shards (rule 16).",
    "Keep each key in exactly one shard.",
)
CA_MALFORMED_KEY = rule(
    "CA031",
    "malformed-key",
    E,
    "Malformed cartridge key",
    "Only model.layers.{L}.mlp.experts.{E}.{proj}.rank{r}.trellis_<label> / scale_<label> keys are allowed (rule 17).",
    "Remove or rename the tensor.",
)
CA_PROTOTYPE_KEY = rule(
    "CA032",
    "prototype-companion",
    E,
    "Leftover suh_/svh_/mcg_/mul1_ stage companion",
    "Cartridges reuse the base's rotations and codebook marker; per-stage suh/svh/mcg/mul1 are the obsolete prototype layout (rule 17).",
    "Drop the companion tensors; re-encode if the stages used their own rotations.",
)
CA_NO_SCALE = rule(
    "CA033",
    "trellis-without-scale",
    E,
    "Trellis without its scale",
    "Each stage trellis needs a scalar scale_<label> companion (rule 18).",
    "Add the scale tensor.",
)
CA_ORPHAN_SCALE = rule(
    "CA034",
    "orphan-scale",
    E,
    "Scale without its trellis",
    "A scale_<label> with no trellis_<label> is rejected (rule 18).",
    "Remove the scale or add the trellis.",
)
CA_LAYER_NAME = rule(
    "CA035",
    "layer-name",
    E,
    "Non-canonical layer name",
    "The layer part must be exactly model.layers.{L}.mlp.experts; wrapped prefixes are rejected inside a cartridge (rule 19).",
    "Rename the keys to the canonical prefix.",
)
CA_COVERAGE = rule(
    "CA036",
    "coverage-mismatch",
    E,
    "coverage differs from the tensors",
    "coverage must equal the observed stage -> layer -> experts map exactly (rule 20).",
    "Regenerate coverage from the shards.",
)
CA_SELECTED = rule(
    "CA037",
    "selected-mismatch",
    E,
    "selected_layers / selected_experts differ from the tensors",
    "They must equal the layers and experts seen in trellis keys (rule 20).",
    "Regenerate selected_layers and selected_experts.",
)
CA_PARENT_CLOSURE = rule(
    "CA038",
    "not-parent-closed",
    E,
    "Coverage is not parent-closed",
    "Each stage's experts at a layer must be a subset of the previous stage's (§7, rule 20).",
    "Drop the experts the parent stage does not cover.",
)
CA_CHAIN_EXPERTS = rule(
    "CA039",
    "chain-experts",
    E,
    "chain[].experts differs from the stage's coverage",
    'chain[].experts must equal the union of its coverage; "all" must equal selected_experts (§7: "declares all experts but coverage is sparse").',
    "Write the explicit expert list.",
)
CA_TOPOLOGY = rule(
    "CA040",
    "rank-topology",
    E,
    "Inconsistent stage topology across ranks",
    "Every rank of a rank-sharded cartridge must carry the same (layer, label, expert, projection) set (rule 21).",
    "Re-shard from the full cartridge.",
)
CA_SCALES_DIFFER = rule(
    "CA041",
    "rank-scales-differ",
    E,
    "Scales differ across TP ranks",
    "Scales are replicated byte-identically into every rank (rule 21).",
    "Re-shard from the full cartridge.",
)
CA_NUM_TENSORS = rule(
    "CA042",
    "num-tensors",
    E,
    "num_tensors differs from the key count",
    "num_tensors must equal the total number of keys across shards (rule 22).",
    "Set num_tensors to the key count.",
)
CA_RANKS = rule(
    "CA050",
    "tensor-ranks",
    E,
    "Tensor ranks differ from the manifest ranks",
    "The ranks in the keys must equal tensor_parallel.ranks; full layout holds only rank0 (rule 23).",
    "Re-shard, or fix tensor_parallel.",
)
CA_UNKNOWN_STAGE = rule(
    "CA051",
    "unknown-stage",
    E,
    "Tensor stage absent from the chain",
    "Every label in a key must be a chain stage (rule 24).",
    "Remove the tensors or add the stage to chain and coverage.",
)
CA_EXPERT_RANGE = rule(
    "CA052",
    "expert-out-of-range",
    E,
    "Expert id not in the base",
    "Expert ids must lie in [0, experts of the base) (rule 25).",
    "Check the base, or drop the experts.",
)
CA_TRELLIS_DTYPE = rule(
    "CA053",
    "trellis-dtype",
    E,
    "Trellis is not int16 rank 3 with 16·K words",
    "A stage trellis is int16 [tiles_in, tiles_out, 16·K] with K in 1..6 (rule 26).",
    "Re-encode the stage.",
)
CA_TRELLIS_GEOMETRY = rule(
    "CA054",
    "trellis-geometry",
    E,
    "Trellis shape differs from the base geometry",
    "The packed dims must equal the 128-aligned logical in/out sizes of the base (full or per-rank; rule 26).",
    "Encode against this base's sizes, or re-shard for the right TP size.",
)
CA_STAGE_K = rule(
    "CA055",
    "stage-k",
    E,
    "Trellis K differs from the chain's K",
    "The stage K declared in chain must equal every trellis's K of that stage (rule 27).",
    "Fix chain[].k or re-encode.",
)
CA_SCALE_DTYPE = rule(
    "CA056",
    "scale-dtype",
    E,
    "Scale is not a float32 scalar",
    "scale_<label> is a float32 tensor of shape [] (rule 28).",
    "Store the scale as float32 with shape [].",
)
CA_SCALE_VALUE = rule(
    "CA057",
    "scale-value",
    E,
    "Scale is not finite and positive",
    "A stage scale must be finite and > 0 (rule 28).",
    "Re-encode the stage.",
)
CA_INVERSE_SCALE = rule(
    "CA058",
    "inverse-scale",
    E,
    "Inverse scale is not finite in FP32",
    "The runtime stores 1/scale as FP32; a tiny scale (e.g. 1e-40) overflows it (rule 28).",
    "Re-encode the stage with a sane residual RMS floor.",
)
CA_INCOMPLETE = rule(
    "CA059",
    "incomplete-stage-expert",
    E,
    "(stage, expert) lacks a projection",
    "Each (stage, expert) of a layer must have gate, up and down (rule 29).",
    "Add the missing projections or drop the expert from the stage.",
)
CA_K_UNIFORM = rule(
    "CA060",
    "stage-k-uniform",
    E,
    "Stage K differs across experts",
    "The runtime's bit table holds one K per (stage, projection) (rule 30).",
    "Encode every expert of a stage at the same K.",
)
CA_BASE_KIND = rule(
    "CA070",
    "base-not-msrt",
    E,
    "Base is not a verified exl3-msrt-base/1",
    "Cartridges load only on an exl3-msrt-base/1 base with a verified compatibility identity (rules 13, 31).",
    "Use the base the cartridge was encoded for.",
)
CA_BASE_ROOT = rule(
    "CA071",
    "base-root",
    E,
    "Cartridge was encoded for a different base",
    "base.compatibility_sha256 must equal the base's root identity (rule 13).",
    "Use the matching base, or re-encode.",
)
CA_BASE_LAYER = rule(
    "CA072",
    "base-layer-digest",
    E,
    "Base identity differs at a layer",
    "Each base.compatibility_by_layer entry must equal the base's digest of that layer (§6.4, rule 34).",
    "Use the matching base, or re-encode.",
)
CA_BASE_K = rule(
    "CA073",
    "base-k",
    E,
    "base.k differs from the base's bitrate",
    "base.k must equal the base's uniform K (§6.4).",
    "Use the matching base, or re-encode.",
)
CA_BASE_LAYER_MISSING = rule(
    "CA074",
    "base-layer-missing",
    E,
    "Selected layer is not a base MoE layer",
    "The cartridge must select layers the base holds (rule 33).",
    "Use the matching base.",
)
CA_TP_SIZE = rule(
    "CA075",
    "tp-size",
    E,
    "Rank-sharded world size differs from the runtime TP size",
    "A rank-sharded cartridge serves only at TP = world_size (rule 15).",
    "Stage it with --tp world_size, or re-shard from the full cartridge.",
)
CA_TP_ALIGN = rule(
    "CA076",
    "tp-alignment",
    E,
    "Local intermediate size is not 128-aligned at this TP size",
    "Each rank's slice must be a multiple of 128 channels (§8).",
    "Choose a TP size that divides the intermediate size into multiples of 128.",
)
CA_REASSEMBLY = rule(
    "CA043",
    "rank-reassembly",
    E,
    "Rank slices do not reassemble the full cartridge",
    "Concatenating a rank-sharded cartridge's trellis slices (gate/up tile axis 1, down tile axis 0) must reproduce the full cartridge byte for byte (§8).",
    "Re-shard from the full cartridge with exl3tool.",
)
CA_ALIASED_KEY = rule(
    "CA044",
    "aliased-key",
    E,
    "Two cartridge keys name the same stage tensor",
    "The runtime reads a key's expert and rank as integers and keeps one tensor per (layer, "
    "expert, projection, rank, component, stage): `experts.07` and `experts.7` (or `rank00` and "
    "`rank0`) are one slot, and whichever it reads last silently replaces the other (§3).",
    "Write expert and rank numbers without leading zeros, one key per stage tensor.",
)
