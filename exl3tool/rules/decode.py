"""Rules of `exl3tool decode`: inputs the trellis codec cannot decode (docs/formats/exl3.md §1, §3)."""

from exl3tool.rules.registry import Severity, rule

E = Severity.ERROR

DC_MISSING = rule(
    "DC001",
    "decode-missing-companion",
    E,
    "A tensor of the EXL3 linear to decode is missing",
    "Decoding needs PREFIX.trellis, PREFIX.suh and PREFIX.svh (docs/formats/exl3.md §1); without them "
    "there is nothing, or only half a transform, to decode.",
    "Check the --tensor prefix (no trailing .trellis) against `exl3tool inspect`.",
)
DC_SHAPE = rule(
    "DC002",
    "decode-bad-shape",
    E,
    "A tensor of the EXL3 linear has the wrong dtype or shape",
    "trellis must be int16 [k/16, n/16, 16K], suh fp16 [k], svh fp16 [n], k and n multiples of "
    "128 (docs/formats/exl3.md §1, §1.4).",
    "The checkpoint is damaged or not EXL3; run `exl3tool validate` on it.",
)
DC_RATE = rule(
    "DC003",
    "decode-rate-codebook",
    E,
    "The trellis's bits per weight cannot be decoded with its codebook",
    "K = last dim / 16 must be 1..8, or 1.5/2.5/3.5 with the mul1 codebook; at most one of the "
    ".mcg / .mul1 markers may be present (docs/formats/exl3.md §1.1).",
    "Run `exl3tool validate`; re-convert the layer if its trellis or markers are damaged.",
)
DC_DEVICE = rule(
    "DC004",
    "decode-device",
    E,
    "The requested decode device is not available",
    "--device cuda needs a CUDA build of torch and a visible GPU.",
    "Use --device cpu (bit-identical, slower).",
)
