"""Rules of tensor-parallel slicing plans and their outputs (TP): docs/formats/exl3.md §6,
docs/formats/r7.md §3.4 / §7, docs/formats/msrt.md §8."""

from exl3tool.rules.registry import Severity, rule

E, W, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

TP_CUTS_HADAMARD = rule(
    "TP001",
    "split-cuts-hadamard",
    E,
    "TP split would cut a 128-channel Hadamard block",
    "EXL3 rotates weights in 128-wide Hadamard blocks: a slice boundary that is not a multiple "
    "of 128 decodes a correct Ŵ but a wrong effective weight (docs/formats/exl3.md §6).",
    "Pick a TP size that divides the size into multiples of 128, or use --mode expert.",
)
TP_EMPTY_RANK = rule(
    "TP002",
    "split-empty-rank",
    E,
    "TP split would give a rank zero channels or zero experts",
    "A rank without channels (or experts) of a module cannot run its part of the layer.",
    "Use a smaller TP size, or --mode expert when there are at least as many experts as ranks.",
)
TP_REPLICATED = rule(
    "TP003",
    "replicated-unsplittable",
    INFO,
    "Tensor replicated whole on every rank",
    "No TP rule applies to it (unknown role, unquantized linear, attention without head "
    "geometry in config.json), so every rank carries the full tensor.",
    "Nothing to do unless the memory matters; add num_key_value_heads/head_dim to config.json "
    "to split attention by KV heads.",
)
TP_MISMATCH = rule(
    "TP004",
    "slice-bytes-differ",
    E,
    "Reassembled slices differ from the source tensor",
    "Every rank's slice must be exactly the source bytes of its range; a difference means a "
    "corrupted or wrongly sliced output.",
    "Re-run `exl3tool slice --force`.",
)
TP_COVERAGE = rule(
    "TP005",
    "slice-coverage",
    E,
    "Slices do not cover the source tensor exactly",
    "The rank slices of a tensor must be disjoint and cover it (or be whole copies); tensors "
    "missing from, or unknown to, the slice manifest break the reassembly.",
    "Re-run `exl3tool slice --force`.",
)
TP_FILE_DIGEST = rule(
    "TP006",
    "slice-file-digest",
    E,
    "Output file missing or its size/digest differs from exl3tool-slices.json",
    "The manifest pins every output file by size, sha256 and blake3.",
    "Re-download the affected rank files or re-run the slice.",
)
TP_MANIFEST = rule(
    "TP007",
    "slice-manifest",
    E,
    "exl3tool-slices.json missing or malformed",
    "Verification reads the slice plan from the manifest (schemas/exl3tool-slices-1.schema.json).",
    "Point --verify-only at a directory written by `exl3tool slice`.",
)
TP_IDENTITY = rule(
    "TP008",
    "slice-identity-differs",
    E,
    "Logical identity of the reassembled slices differs from the source",
    "Reassembled tensors must give the same logical identity root as the source "
    "(exl3tool/identity).",
    "Re-run `exl3tool slice --force`; check that the source did not change.",
)
TP_UNSUPPORTED = rule(
    "TP009",
    "slice-unsupported-input",
    E,
    "Input cannot be sliced",
    "Slicing needs a readable EXL3, R7 or MSRT base checkpoint (or a cartridge) without "
    "container errors; already rank-sliced inputs are not re-sliced.",
    "Run `exl3tool validate` on the input and fix its errors first.",
)
TP_SOURCE_CHANGED = rule(
    "TP010",
    "slice-source-changed",
    E,
    "Source file changed since it was sliced",
    "The slices manifest records each source's size; a source of another size now was changed after slicing (a change during the pass is exit 3, naming the file).",
    "Do not modify the checkpoint while slicing it; re-run.",
)
TP_SPARSE_LAYERS = rule(
    "TP011",
    "rank-sliced-sparse-layers",
    E,
    "Rank-sliced layout of sparse MoE layers",
    "The legacy profile names its MoE layers as one range [first, last], and the runtime "
    "(Exl3Config._moe_prefix_is_exl3) claims every layer in it; a layer of the range without "
    "expert tensors fails the load (Exl3MoEMethod.process_weights_after_loading).",
    "Slice with --layout per-rank (the base profile keeps its layer coverage).",
)
TP_TIERS = rule(
    "TP012",
    "rank-sliced-tiers",
    E,
    "Rank-sliced layout of a layer with more than two bitrates",
    "A mixed rank-sliced layer runs on the one-grid mixed path, which requires exactly two "
    "bitrates (Exl3MoEMethod._prepare_mixed_rank_sliced_weights; RS021 once written).",
    "Slice with --layout per-rank (R7 layers keep their per-projection K there).",
)
TP_UNSERVED_K = rule(
    "TP014",
    "rank-sliced-unserved-k",
    E,
    "Rank-sliced layout at a K no runtime revision serves",
    "The output's tail is uniform (`bits` K) when every expert has one K, else mixed (`k_values` "
    "with a tier_bitmap.json). A uniform tail runs at K 3..6 (2..6 on the cartridge revision); "
    "a mixed one needs every K in 3..6 on every revision (Exl3Config._configure_rank_sliced).",
    "Slice with --layout per-rank.",
)
TP_CARTRIDGE_K = rule(
    "TP013",
    "rank-sliced-cartridge-k",
    W,
    "Rank-sliced layout of a layer only the cartridge runtime revision serves",
    "A uniform rank-sliced layer runs only at an integral K; the public runtime revisions "
    "accept 3..6, so a layer at K 2 loads only on the cartridge revision, and a default "
    "`validate` of the output says RS020 (docs/formats/r7.md §7.1).",
    "Slice with --layout per-rank, or deploy on the cartridge revision and validate the output "
    "with --runtime cartridge.",
)
