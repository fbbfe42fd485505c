"""The runtime-conformance map as data: which exl3tool rules predict which check of the serving
runtime (the vLLM fork's EXL3 loader and MSRT cartridge staging), and what each rule predicts.

docs/runtime-conformance.md is generated from this module (`python3 -m exl3tool.docs_gen`);
tests/conformance/test_map.py keeps it, the registry and the fixtures in step. Runtime functions
are named as in the public fork (`local-inference-lab/vllm`,
`vllm/model_executor/layers/quantization/exl3.py` and `exl3_lora_cartridge.py`, and the staging
functions that docs/formats/msrt.md §9 names); what they check is said in our own words.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType


class Outcome(str, enum.Enum):
    """What an artifact that breaks a rule does in the serving runtime."""

    REFUSAL = "refusal"  # the runtime refuses to start, load or stage it
    SILENT = "silent"  # the runtime loads it and serves wrong results
    CONTRACT = "contract"  # a producer-contract breach the runtime does not check
    TOOL = "tool"  # exl3tool's own inputs and outputs (gate, slicing, decode): no runtime role


OUTCOME_TEXT = MappingProxyType(
    {
        Outcome.REFUSAL: "predict a runtime refusal",
        Outcome.SILENT: "predict a silent wrong result",
        Outcome.CONTRACT: "are producer contract the runtime does not check",
        Outcome.TOOL: "concern exl3tool's own operation (no runtime counterpart)",
    }
)

EXL3 = "exl3.py"
CARTRIDGE = "exl3_lora_cartridge.py (staging)"
LOADER = "model loader"


@dataclass(frozen=True)
class RuntimeCheck:
    """One check the runtime makes before it serves, and the exl3tool rules that predict it."""

    function: str  # as named in the runtime's source
    source: str  # EXL3, CARTRIDGE or LOADER
    checks: str  # what it refuses, in our words
    rules: tuple[str, ...]  # empty: not predictable from the artifact (see `checks`)
    # tests/conformance/conformance_fixtures.py name; None only when `rules` is empty
    fixture: str | None


RUNTIME_CHECKS: tuple[RuntimeCheck, ...] = (
    RuntimeCheck(
        "Exl3Config.override_quantization_method", EXL3,
        "claims the checkpoint as EXL3 only for a hybrid_tr3_tail with format exl3-trellis (or "
        "the R7 block) and only when no other --quantization is forced; otherwise the EXL3 "
        "config is discarded and routed experts fall to the unquantized (BF16) MoE method",
        ("PL002", "PL001", "R7012"), "forced-quantization",
    ),
    RuntimeCheck(
        "Exl3Config.maybe_update_config", EXL3,
        "without a rank-sliced tail, hydrates quantization_config.json and refuses an absent or "
        "empty tensor_storage map",
        ("EX020", "R7080", "CK013"), "no-storage-no-tail",
    ),
    RuntimeCheck(
        "Exl3Config._validate_storage_metadata", EXL3,
        "every EXL3 record names trellis, suh|su and svh|sv and not both mcg and mul1; at least "
        "one EXL3 record",
        ("EX025", "EX030"), "storage-record-incomplete",
    ),
    RuntimeCheck(
        "Exl3Config.from_config (R7 block)", EXL3,
        "the r7_routed_experts block: an object with schema r7-complete-v2-checkpoint-v1, "
        "codebook mcg and bits mixed_tensor, moe_layers [first, last] of JSON integers, "
        "k_values a non-empty list of JSON integers in {3, 4, 5}",
        ("R7001", "R7002", "R7003", "R7004", "R7005"), "r7-block-schema",
    ),
    RuntimeCheck(
        "Exl3Config._configure_rank_sliced (rotation layout)", EXL3,
        "rotation_layout is per_expert_v1 (the default) or shared_h_v1; shared_h_v1 needs the "
        "exact shared_h_tensor_schema, and no other layout may carry one",
        ("RS010",), "rotation-layout",
    ),
    RuntimeCheck(
        "Exl3Config.normalize_rank_sliced_weight_name (shared H-side vectors)", EXL3,
        "the R7 revision refuses an `experts.shared_h.{proj}.rank{r}` vector unless the "
        "layout is shared_h_v1, one on the wrong side (suh of gate/up, svh of down), and under "
        "shared_h_v1 an H-side vector stored under an expert id",
        ("RS010",), "shared-h-per-expert",
    ),
    RuntimeCheck(
        "Exl3MoEMethod._r7_projection_tiers", EXL3,
        "an R7 layer's expert trellises use only the K values r7_routed_experts.k_values "
        "declares (the graph path's _prepare_r7_graph_weights checks the same per projection)",
        ("R7024",), "r7-k-undeclared",
    ),
    RuntimeCheck(
        "Exl3MoEParameter.load_exl3_weight", EXL3,
        "a rank-sliced slab holds one tensor shape for every expert of a layer: in a uniform "
        "layer, an expert whose trellis has another K or geometry is refused",
        ("RS008", "RS006"), "slab-shape",
    ),
    RuntimeCheck(
        "Exl3Config._configure_rank_sliced", EXL3,
        "the rank-sliced tail's required fields, the mcg codebook, moe_layers as [first, last], "
        "the exact tensor_schema, mixed k_values in 3..6 with a bits_per_expert reference",
        ("RS001", "RS002", "RS011"), "tail-schema",
    ),
    RuntimeCheck(
        "Exl3Config._load_rank_sliced_bitrates", EXL3,
        "mixed bits: the referenced bitmap (in the hardened public revision, a bare file name at "
        "the checkpoint's root) has every layer of the range, one K per expert, only declared K "
        "values",
        ("RS011", "RS008"), "mixed-without-bitmap",
    ),
    RuntimeCheck(
        "Exl3Config.rank_sliced_layer_bitrates", EXL3,
        "a uniform rank-sliced bitrate must be integral; with mixed bits, every EXL3 MoE layer "
        "(the R7 layers beside a carried tail too) must be in the tail's bitmap",
        ("RS020", "R7061"), "non-integral-bits",
    ),
    RuntimeCheck(
        "Exl3Config.normalize_rank_sliced_weight_name", EXL3,
        "keeps the `.rank{r}.` names of the local TP rank and drops the others (no refusal: a "
        "stray rank is ignored)",
        ("MB005", "RS007"), "stray-rank1",
    ),
    RuntimeCheck(
        "Exl3Config.get_quant_method", EXL3,
        "claims a linear as EXL3 through tensor_storage (else the unquantized method, which has "
        "no parameter for a trellis; with a rank-sliced tail only config.json's embedded map "
        "counts) and a MoE layer through tensor_storage, the R7 block or the tail's layer range",
        ("EX022", "TP011"), "linear-unlisted",
    ),
    RuntimeCheck(
        "Exl3LinearMethod.process_weights_after_loading", EXL3,
        "every claimed linear has trellis, suh and svh and exactly the codebook marker its own "
        "tensor_storage record promises (with a rank-sliced tail, mcg for every module of a "
        "layer in its moe_layers: Exl3Config.codebook_for_prefix)",
        ("EX004", "EX005", "EX006", "EX012", "EX021", "EX032", "RS022"), "linear-missing-suh",
    ),
    RuntimeCheck(
        "Exl3LinearMethod._validate_loaded_tensors", EXL3,
        "trellis int16 rank 3 with 16..128 words, suh/svh fp16 vectors of the trellis sizes, "
        "128-aligned sizes, one-element int32 markers with the right sentinel",
        ("EX001", "EX002", "EX007", "EX008", "EX009", "EX010", "EX011", "EX031"),
        "linear-bad-marker",
    ),
    RuntimeCheck(
        "Exl3LinearMethod._slice_exl3_tensor", EXL3,
        "a TP slice must start and end on a 128-channel Hadamard block (an R7 layer's experts "
        "are sliced at load on 16-channel steps instead, and the 128 rule then fails in "
        "_validate_moe_shapes and the tile configuration)",
        ("R7070", "RS009", "TP001"), "tp-not-128",
    ),
    RuntimeCheck(
        "Exl3MoEMethod.create_weights", EXL3,
        "a rank-sliced checkpoint's tp equals the runtime TP size and its experts_per_layer the "
        "model's expert count",
        ("RS004", "RS003"), "tp-mismatch",
    ),
    RuntimeCheck(
        "Exl3MoEMethod.process_weights_after_loading", EXL3,
        "every local expert of a claimed MoE layer has trellis, suh and svh for w1, w2 and w3",
        ("RS005", "R7022", "R7023", "MB006", "TP011"), "rank-slice-missing",
    ),
    RuntimeCheck(
        "Exl3MoEMethod._validate_codebooks", EXL3,
        "each expert projection has exactly the expected codebook marker with its sentinel",
        ("R7026", "MB008", "EX011"), "base-bad-mcg",
    ),
    RuntimeCheck(
        "Exl3MoEMethod._validate_moe_shapes", EXL3,
        "expert trellis, suh and svh dtypes, ranks and 128-aligned sizes agree",
        ("R7025", "R7027", "RS006", "MB007", "MB017"), "base-geometry",
    ),
    RuntimeCheck(
        "Exl3MoEMethod._prepare_rank_sliced_weights", EXL3,
        "a uniform rank-sliced layer runs at K 3, 4, 5 or 6 only (the cartridge revision: "
        "2..6) and its slabs have the planned geometry",
        ("RS020", "RS008", "TP013"), "rank-sliced-k2",
    ),
    RuntimeCheck(
        "Exl3MoEMethod._prepare_mixed_rank_sliced_weights", EXL3,
        "a mixed layer has exactly two bitrates",
        ("RS021", "TP012"), "three-tiers",
    ),
    RuntimeCheck(
        "Exl3MoEMethod._trellis_tile_config", EXL3,
        "hidden and per-rank intermediate sizes divisible by 128",
        ("R7021", "RS009", "MB017", "R7070"), "sizes-not-128",
    ),
    RuntimeCheck(
        "load_weights (expert_params_mapping)", LOADER,
        "every name under an expert projection maps onto an expert parameter (experts 0 .. "
        "the model's count - 1, known fields only)",
        ("CK030", "EX016", "RS013"), "unknown-expert-field",
    ),
    RuntimeCheck(
        "Exl3Config._require_enforce_eager", EXL3,
        "without a rank-sliced tail, the model is built only with --enforce-eager (exl3_gemm "
        "autotunes on its first call per shape, which CUDA-graph capture cannot take; later "
        "revisions allow decode-only graphs after priming)",
        ("EX036",), "serve-eager",
    ),
    RuntimeCheck(
        "Exl3Config._configure_rank_sliced (public revisions)", EXL3,
        "a rank-sliced tail names its tp; an MSRT base's tail has none, so only the cartridge "
        "revision serves a base",
        ("MB020",), "msrt-base-public",
    ),
    RuntimeCheck(
        "Exl3Config._linear_prefix_is_exl3", EXL3,
        "a fused module (qkv_proj, gate_up_proj, fused_qkv_a_proj) is EXL3 in every source "
        "linear or in none",
        ("EX034",), "packed-mixed",
    ),
    RuntimeCheck(
        "VocabParallelEmbedding (UnquantizedEmbeddingMethod)", LOADER,
        "every token embedding is built unquantized with a weight (the EXL3 config claims no "
        "embedding): quantized table rows and signs have nothing to load into",
        ("EX033",), "quantized-embedding",
    ),
    RuntimeCheck(
        "safe_open (safetensors weight iterator)", LOADER,
        "the safetensors header and data section are well formed "
        "(docs/safetensors-strictness.md)",
        ("ST001", "ST002", "ST004", "ST012", "ST013", "ST014", "ST016", "CK011"),
        "truncated-shard",
    ),
    RuntimeCheck(
        "_stage_adapter_contract (paths and files)", CARTRIDGE,
        "adapter path and shards: no symlinks, regular files, sizes and sha256 as the manifest "
        "says, stable while copied, at most 1 TiB",
        ("CA001", "CA002", "CA003", "CA004", "CA005", "CA006", "CA007"), "cartridge-shard-size",
    ),
    RuntimeCheck(
        "_stage_adapter_contract (manifest)", CARTRIDGE,
        "fq-cartridge-adapter/3 with exactly its fields, constants, labels, id lists, "
        "created_utc, base block, chain and tensor_parallel contract",
        tuple(f"CA0{n}" for n in range(10, 21)), "cartridge-created-lowercase-z",
    ),
    RuntimeCheck(
        "_index_cartridge_keys", CARTRIDGE,
        "tensor keys: no duplicates, only trellis and scale keys in pairs, canonical layer "
        "names, num_tensors",
        ("CA030", "CA031", "CA032", "CA033", "CA034", "CA035", "CA042"), "cartridge-num-tensors",
    ),
    RuntimeCheck(
        "_build_cartridge_from_entries", CARTRIDGE,
        "per-layer tensors: ranks and stages as declared, coverage and selections as observed, "
        "trellis geometry, stage K, complete (stage, expert) triples",
        ("CA036", "CA037", "CA038", "CA039", "CA050", "CA051", "CA053", "CA054", "CA055",
         "CA059"),
        "cartridge-stage-k",
    ),
    RuntimeCheck(
        "_validate_rank_scales", CARTRIDGE,
        "a rank-sharded cartridge of two or more ranks: every rank holds the same (label, "
        "expert, projection) set per layer, with byte-identical scales",
        ("CA040", "CA041"), "cartridge-rank-topology",
    ),
    RuntimeCheck(
        "Exl3LoraCartridge.set_stage_tensors", CARTRIDGE,
        "expert ids in range; scales finite and positive",
        ("CA052", "CA056", "CA057"), "cartridge-scale-zero",
    ),
    RuntimeCheck(
        "Exl3CUDAGraphCartridgeRuntime.materialize", CARTRIDGE,
        "inverse scales finite in FP32; stage K uniform across experts; uniform base bitrate",
        ("CA058", "CA060", "MB009"), "cartridge-inverse-scale",
    ),
    RuntimeCheck(
        "stage_exl3_cartridge_adapter", CARTRIDGE,
        "the loaded base is a verified exl3-msrt-base/1 whose identity matches the cartridge's "
        "base block, layer by layer, at the runtime TP size",
        ("CA070", "CA071", "CA072", "CA073", "CA074", "CA075", "CA076", "ID010"),
        "cartridge-other-base",
    ),
    RuntimeCheck(
        "verified_rank_sliced_layer_compatibility_sha256", CARTRIDGE,
        "the base's published compatibility identity equals its bytes (rank0 tensors)",
        ("MB010", "MB011", "MB012", "ID012"), "base-root-altered",
    ),
    RuntimeCheck(
        "_load_additive_exl3_ext", CARTRIDGE,
        "the additive extension's ABI version and entry points (an installation check: nothing "
        "in the artifact predicts it)",
        (), None,
    ),
    RuntimeCheck(
        "Exl3Config._configure_qkv_topology", EXL3,
        "explicit exl3_qkv_topology/1 metadata (a branch of the fork, publish-qkv-consumer, "
        "for one model geometry): not predicted by exl3tool yet",
        (), None,
    ),
)  # fmt: skip

# What breaking a rule does in the runtime: a default per family, then per-rule exceptions.
FAMILY_OUTCOME = MappingProxyType(
    {
        "ST": Outcome.REFUSAL,
        "JS": Outcome.REFUSAL,
        "PA": Outcome.REFUSAL,
        "CK": Outcome.REFUSAL,
        "EX": Outcome.REFUSAL,
        "R7": Outcome.REFUSAL,
        "RS": Outcome.REFUSAL,
        "MB": Outcome.REFUSAL,
        "CA": Outcome.REFUSAL,
        "ID": Outcome.CONTRACT,
        "PL": Outcome.REFUSAL,
        "DC": Outcome.TOOL,
        "GT": Outcome.TOOL,
        "TP": Outcome.TOOL,
        "VS": Outcome.TOOL,
    }
)
_C, _S, _R, _T = Outcome.CONTRACT, Outcome.SILENT, Outcome.REFUSAL, Outcome.TOOL
RULE_OUTCOME = MappingProxyType(
    {
        # safetensors: what the reference library accepts (docs/safetensors-strictness.md)
        "ST006": _C, "ST009": _C, "ST017": _C, "ST019": _C, "ST020": _C, "ST022": _C,
        "ST023": _T,
        # JSON: Python's json keeps the last duplicate and reads NaN and huge integers
        "JS002": _S, "JS003": _C, "JS004": _C, "JS005": _C, "JS006": _C,
        "PA002": _C,  # checkpoints and bases are read through links (CA001 for cartridges)
        # the index filters shard files; tensors inside a listed shard load anyway
        "CK005": _C, "CK006": _C, "CK007": _S, "CK008": _C, "CK010": _C,
        "EX013": _S,  # NaN rotations serve NaN
        "EX014": _C, "EX023": _C, "EX024": _C, "EX026": _C, "EX027": _C,
        "R7006": _C, "R7010": _C, "R7012": _C, "R7030": _C, "R7032": _C,
        "R7033": _C, "R7034": _C, "R7040": _C, "R7041": _C, "R7042": _C, "R7043": _C,
        "R7044": _C, "R7047": _C, "R7048": _C, "R7049": _C, "R7050": _C, "R7052": _C,
        "R7053": _C, "R7054": _C, "R7060": _C,
        "R7045": _S, "R7046": _S, "R7051": _S,  # bytes differ from what the producer sealed
        "R7035": _S,  # an unclaimed MoE layer serves experts nothing filled
        "R7029": _S,  # an expert's own hidden-side vector is served, or the shared one, by tiers
        "RS007": _C,  # ranks >= tp are dropped, never loaded
        "RS012": _S,  # ranks would serve different replicated weights
        "MB001": _C, "MB002": _C, "MB005": _C, "MB013": _C, "MB014": _C, "MB015": _C,
        "MB018": _C,
        "MB016": _S,  # bytes differ from the published MANIFEST.sha256
        "CA043": _C,
        "CA044": _S,  # the runtime keeps whichever aliased key it reads last
        "ID007": _S,  # ranks would serve different replicated weights
        "ID010": _R, "ID012": _R,  # staging verifies the base identity
        "TP001": _R, "TP011": _R, "TP012": _R,  # runtime refusals, predicted before slicing
        "TP013": _R, "TP014": _R,  # the public (TP013) or every (TP014) revision would refuse
        "EX035": _S,  # at TP 1 a wider trellis is truncated to the config's size (a narrower
        # one fails at the first forward, TP > 1 refuses the cut)
    }
)  # fmt: skip


def outcome(code: str) -> Outcome:
    """What breaking rule `code` does in the serving runtime. `X099` (check-crashed, any family)
    is exl3tool failing on an input, not a runtime prediction."""
    if code.endswith("099"):
        return Outcome.TOOL
    explicit = RULE_OUTCOME.get(code)
    return explicit if explicit is not None else FAMILY_OUTCOME.get(code[:-3], Outcome.CONTRACT)


def checks_predicted_by(code: str) -> list[RuntimeCheck]:
    """The runtime checks a rule predicts."""
    return [c for c in RUNTIME_CHECKS if code in c.rules]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown() -> str:
    """docs/runtime-conformance.md: runtime check -> rules, then rule -> outcome."""
    from exl3tool.rules.registry import all_rules

    rules = all_rules()
    counts = {o: sum(1 for r in rules if outcome(r.code) is o) for o in Outcome}
    out = [
        "# Runtime conformance",
        "",
        "Generated from `exl3tool/rules/conformance.py` by `python -m exl3tool.docs_gen`; do not "
        "edit by hand. `tests/conformance/` holds one fixture per runtime check (the artifact "
        "the runtime refuses) and checks that exl3tool reports a predicting rule for it.",
        "",
        "The serving runtime is the vLLM fork's EXL3 loader (`exl3.py`) and its MSRT cartridge "
        "staging (`exl3_lora_cartridge.py`); `validate --runtime auto|public|cartridge` picks "
        "the revision to predict (public: the strictest public one; auto, the default: the "
        "cartridge revision for an MSRT base, the only one that serves it, else public). "
        "`exl3tool plan` predicts what "
        "the runtime allocates per rank and how it claims each module.",
        "",
        "The map follows the `tensor_storage` line of `exl3.py` (the public revisions, the R7 "
        "revision and the cartridge revision). Two lines of the fork are outside it: a rewrite "
        "for B12X's `exl3-v1` container (`exl3-manifest.json` beside MXFP8 dense layers), which "
        "serves neither R7 checkpoints nor MSRT bases, and a Sparkinfer-era revision that read "
        "the tail's integers strictly and needed `trellis_bits_by_layer` for uniform layers "
        "(replaced by the unified fused-MoE API).",
        "",
        "## Checks the runtime makes before serving",
        "",
        "| runtime function | source | what it refuses | predicted by | fixture |",
        "|---|---|---|---|---|",
    ]
    for c in RUNTIME_CHECKS:
        rules_cell = ", ".join(c.rules) if c.rules else "(not predictable from the artifact)"
        out.append(
            f"| `{c.function}` | {c.source} | {_cell(c.checks)} | {rules_cell} | "
            f"{c.fixture or '-'} |"
        )
    out += [
        "",
        "## What each rule predicts",
        "",
        ", ".join(f"{counts[o]} rules {OUTCOME_TEXT[o]} ({o.value})" for o in Outcome) + ".",
        "",
        "| code | name | predicts | runtime check |",
        "|---|---|---|---|",
    ]
    for r in rules:
        where = ", ".join(f"`{c.function}`" for c in checks_predicted_by(r.code)) or "-"
        out.append(f"| {r.code} | {r.name} | {outcome(r.code).value} | {where} |")
    return "\n".join(out) + "\n"


__all__ = [
    "FAMILY_OUTCOME",
    "OUTCOME_TEXT",
    "RULE_OUTCOME",
    "RUNTIME_CHECKS",
    "Outcome",
    "RuntimeCheck",
    "checks_predicted_by",
    "outcome",
    "render_markdown",
]
