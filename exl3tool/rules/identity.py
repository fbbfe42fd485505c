"""Rules of byte identities: `identity --check`, rank-slice reassembly, compatibility (ID)."""

from exl3tool.rules.registry import Severity, rule

E, W, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

ID_TENSOR_DIGEST = rule(
    "ID001",
    "tensor-digest-mismatch",
    E,
    "A tensor's payload differs from the recorded identity",
    "The bytes a loader would read are not the bytes that were published or verified.",
    "Re-download or restore the shard that holds the tensor; compare with `exl3tool diff`.",
)
ID_TENSOR_MISSING = rule(
    "ID002",
    "tensor-missing",
    E,
    "A tensor of the recorded identity is absent",
    "A loader that expects the tensor fails or falls back to a default.",
    "Restore the shard that held it, or record a new identity if the removal was intended.",
)
ID_TENSOR_UNEXPECTED = rule(
    "ID003",
    "tensor-unexpected",
    E,
    "The artifact holds a tensor the recorded identity does not list",
    "Extra tensors change what a loader reads and what the layer digest covers.",
    "Remove the tensor, or record a new identity if it belongs there.",
)
ID_TENSOR_TYPE = rule(
    "ID004",
    "tensor-type-changed",
    E,
    "A tensor's dtype or shape differs from the recorded identity",
    "Same bytes under another dtype or shape decode to different weights (and another K).",
    "Restore the original header, or record a new identity.",
)
ID_LAYER_DIGEST = rule(
    "ID005",
    "layer-digest-mismatch",
    E,
    "A layer's digest differs from the recorded identity",
    "Some tensor of the layer (bytes, dtype, shape or name) changed.",
    "See the ID001-ID004 findings of that layer; `exl3tool diff` lists the tensors.",
)
ID_ROOT = rule(
    "ID006",
    "root-mismatch",
    E,
    "The root digest differs from the recorded identity",
    "The root covers every layer; any change anywhere changes it.",
    "See the layer findings; if none, the recorded layer map itself is inconsistent.",
)
ID_REPLICA = rule(
    "ID007",
    "replica-mismatch",
    E,
    "A replicated rank copy differs from rank 0's copy",
    "Replicated tensors (suh/svh halves, mcg, scales) must be byte-identical on every TP rank; "
    "ranks would otherwise compute with different weights (docs/formats/msrt.md §8).",
    "Re-slice the artifact from its full-rank source.",
)
ID_SLICES = rule(
    "ID008",
    "rank-slices-inconsistent",
    E,
    "Rank slices do not reassemble into one logical tensor",
    "A missing rank or slices of mismatched shape cannot form the full tensor "
    "(docs/formats/r7.md §7.1), so its logical identity is undefined.",
    "Re-slice the artifact; every rank 0..W-1 needs a slice of the same geometry.",
)
ID_FILE = rule(
    "ID009",
    "identity-file-invalid",
    E,
    "The identity file is not a valid exl3tool-identity/1 document",
    "A check against an unreadable or foreign record proves nothing.",
    "Regenerate it with `exl3tool identity PATH --format json -o FILE`.",
)
ID_COMPAT = rule(
    "ID010",
    "compat-mismatch",
    E,
    "The MSRT compatibility identity differs from the recorded one",
    "Cartridges encoded for the recorded base will be rejected at staging (§6.4).",
    "Restore the base's expert tensors, or re-encode the cartridges for this base.",
)
ID_COMPAT_INCOMPLETE = rule(
    "ID011",
    "compat-incomplete",
    W,
    "The MSRT base compatibility identity cannot be computed cleanly",
    "An MSRT base needs every expert with all three projections and trellis/suh/svh/mcg at one "
    "K in 2..6 (docs/formats/msrt.md §6.1); otherwise no cartridge can be pinned to it.",
    "Fix the base's expert tensors; `exl3tool validate` names the defects.",
)
ID_PUBLISHED_COMPAT = rule(
    "ID012",
    "published-compat-mismatch",
    E,
    "The compatibility identity a base publishes differs from its bytes",
    "The loader recomputes each layer's digest while loading and refuses the base (§6.4).",
    "Recompute `compatibility_by_layer` / `compatibility_sha256` with `exl3tool identity`.",
)
