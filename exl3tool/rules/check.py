"""Rules of the pre-publish gate `exl3tool check`: its config, artifact resolution and steps (GT)."""

from exl3tool.rules.registry import Severity, rule

E, W, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

GT_CONFIG_SCHEMA = rule(
    "GT001",
    "config-invalid",
    E,
    "exl3tool.toml does not follow exl3tool-config/1",
    "A release gate that silently ignores a misspelt key checks less than its author believes.",
    "Fix the field named by the pointer; see schemas/exl3tool-config-1.schema.json.",
)
GT_ARTIFACT_MISSING = rule(
    "GT002",
    "artifact-missing",
    E,
    "Declared artifact path does not exist",
    "The release names an artifact that is not on disk, so nothing about it was checked.",
    "Fix the path (relative paths are resolved against the config file's directory).",
)
GT_HF_NOT_CACHED = rule(
    "GT003",
    "hf-not-cached",
    E,
    "Hugging Face id is not in the local cache",
    "check resolves org/name[@revision] offline, from the local Hugging Face cache only.",
    "Run `hf download org/name --revision REV` first, or pass a local directory.",
)
GT_HF_UNAVAILABLE = rule(
    "GT004",
    "hf-hub-missing",
    E,
    "huggingface_hub is not installed",
    "Resolving org/name[@revision] uses huggingface_hub's cache API.",
    "pip install 'exl3tool[hf]', or pass the snapshot directory itself.",
)
GT_BASE_UNKNOWN = rule(
    "GT005",
    "cartridge-base-unknown",
    E,
    "Cartridge names a base that is neither a declared artifact nor a path",
    "A cartridge is only safe on the exact base it was encoded for; without it, base matching "
    "and verify-swap cannot run.",
    "Set `base` to the name of a declared base artifact, or to the base's directory.",
)
GT_NO_BASE = rule(
    "GT006",
    "cartridge-base-not-given",
    W,
    "Cartridge checked without its base",
    "Base matching (compatibility identity, K, geometry) and verify-swap need the base.",
    'Declare the base artifact and `base = "<name>"` on the cartridge, or pass both paths.',
)
GT_KIND_MISMATCH = rule(
    "GT007",
    "kind-mismatch",
    E,
    "Artifact is not of the declared kind",
    "The config declares one kind but the files say another: the wrong directory is being published.",
    "Fix `kind` in the config or point `path` at the right artifact.",
)
GT_IDENTITY_FILE = rule(
    "GT008",
    "identity-file-unusable",
    E,
    "Identity file to match cannot be read",
    "The release asks to match a recorded identity, but the record is missing or malformed.",
    "Write it with `exl3tool identity PATH -o FILE` from the artifact you mean to publish.",
)
GT_STEP_FAILED = rule(
    "GT009",
    "step-failed",
    E,
    "A check step could not run to completion",
    "A step that stops early proves nothing about the artifact; the gate must not pass.",
    "Read the message; run the named command alone for details.",
)
GT_SLICE_VERIFY = rule(
    "GT010",
    "slice-verify-failed",
    E,
    "Slicing for a TP size does not reassemble to the source",
    "Each rank must read exactly its bytes; a slice that does not round-trip serves wrong weights.",
    "Run `exl3tool slice PATH --tp N --verify` and fix the reported tensors or the TP size.",
)
GT_VERIFY_SWAP = rule(
    "GT011",
    "verify-swap-failed",
    E,
    "verify-swap check failed",
    "A hot swap that differs from a cold load, or a rollback that does not restore the base, "
    "serves wrong numbers in production.",
    "Run `exl3tool verify-swap BASE ADAPTER --tp N` for the failing check and its first difference.",
)
GT_SKIPPED = rule(
    "GT012",
    "check-skipped",
    INFO,
    "A requested check was skipped",
    "Some checks need torch.distributed, CUDA or another component missing on this machine; a "
    "skip is reported, never silent. A declared check that did not run at all is a warning "
    "(`--strict` fails the gate); a part of a run that could not be checked here is an info.",
    "Run the gate where the missing component is available (the message names it).",
)
GT_NOT_APPLICABLE = rule(
    "GT013",
    "check-not-applicable",
    W,
    "A requested check does not apply to this artifact",
    "The config asks for a check the artifact kind does not support (e.g. verify-swap on a "
    "checkpoint), so it did not run.",
    "Remove the option for this artifact or check the artifact's kind.",
)
