"""Checks of R7 checkpoints (R7 rules; docs/formats/r7.md §1-§6, §9): the entry point.

Order: the block (schema, then the integer rules vLLM enforces; `r7_block`), embedded vs external
copies, every routed expert of every layer (`r7_experts`), per-layer manifests (`r7_manifests`),
MANIFEST.json and its seal (`r7_seal`), the carried MTP tail (`rank_sliced`), TP alignment.
Digests are recomputed only under `--hash`.

What needs only the files (the per-layer manifests, the layer shards' markers and small
vectors) may be read ahead by a worker forked before the checkpoint loads (`prefetch_r7`,
`io/forked`); the findings and their order are the same either way.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path

from exl3tool.checks.digests import Digests
from exl3tool.checks.exl3_linear import check_linears, check_tables, flush_payload_checks
from exl3tool.checks.exl3_tp import check_tp_slices, of_groups
from exl3tool.checks.options import ValidateOptions
from exl3tool.checks.payload import (
    FACTS_MAX_TOTAL,
    NUMPY_MIN_BYTES,
    FiniteCheck,
    RandomAccessReader,
    Scan,
    ShardFacts,
    fact_reads,
    read_facts,
)
from exl3tool.checks.r7_block import check_block, check_quant_configs
from exl3tool.checks.r7_experts import ExpertsContext, check_experts, check_out_of_range
from exl3tool.checks.r7_manifests import (
    ManifestResults,
    check_layer_manifests,
    layer_results,
    prefetch_block,
)
from exl3tool.checks.r7_model import check_model_moe_layers
from exl3tool.checks.r7_seal import check_checkpoint_manifest
from exl3tool.checks.rank_sliced import (
    TailContext,
    check_tail,
    report_missing_expert_count,
)
from exl3tool.checks.replicas import check_replicas
from exl3tool.checks.routers import check_routers
from exl3tool.formats.checkpoint import Checkpoint
from exl3tool.formats.exl3 import group_linears
from exl3tool.formats.experts import expert_count, expert_table
from exl3tool.formats.r7 import Block, R7Payload, layer_shard
from exl3tool.formats.tail import POINTER, Tail, parse_tail, raw_tail
from exl3tool.io.forked import Forked
from exl3tool.io.strict_json import is_json_int, pointer_join
from exl3tool.io.views import changed_lately
from exl3tool.rules import r7 as r7
from exl3tool.rules.registry import Findings


def _sizes(config: dict, findings: Findings) -> tuple[int | None, int | None]:
    out = []
    for key in ("hidden_size", "moe_intermediate_size"):
        v = config.get(key)
        if not is_json_int(v) or v <= 0 or v % 128:
            findings.add(
                r7.R7_SIZES,
                f"{key} {v!r}: a positive multiple of 128",
                file="config.json",
                pointer="/" + key,
            )
            out.append(None)
        else:
            out.append(v)
    return out[0], out[1]


def _check_model_range(config: dict, block: Block, findings: Findings) -> None:
    n_layers = config.get("num_hidden_layers")
    mtp = config.get("num_nextn_predict_layers", 0)
    limit = n_layers + (mtp if is_json_int(mtp) else 0) if is_json_int(n_layers) else None
    if limit is not None and block.last >= limit:
        findings.add(
            r7.R7_RANGE_MODEL,
            f"moe_layers ends at {block.last}, the model has {limit} layers",
            file=block.file,
            pointer=pointer_join(block.base, "moe_layers"),
        )


@dataclass(frozen=True)
class Prefetched:
    """What a worker reads while the checkpoint loads (`prefetch_r7`), for `block`."""

    block: Block
    facts: dict[Path, ShardFacts]  # the layer shards' marker values and NaN/Inf vectors
    manifests: ManifestResults


_LAYER_SHARD = re.compile(r"r7-experts-layer-(\d{3,18})\.safetensors")


def prefetch_r7(root: Path) -> Prefetched | None:
    """Read ahead what the R7 checks read from files only: the payload facts of every layer
    shard of the block the configs declare, and its per-layer manifests. Run by a worker forked
    before the checkpoint loads; `check_r7` uses it only for the block it finds itself."""
    got = prefetch_block(root)
    if got is None:
        return None
    lite, block = got
    facts: dict[Path, ShardFacts] = {}
    names = sorted(os.listdir(root))
    held = ((n, _LAYER_SHARD.fullmatch(n)) for n in names)
    labels = [n for n, m in held if m and int(m[1]) in block.layers and layer_shard(int(m[1])) == n]
    planned, total = [], 0
    for label in labels:
        began = time.time_ns()
        try:
            reads = fact_reads(root / label, label)
        except OSError:  # no facts for this shard: the checks read it themselves
            continue
        if reads is None or changed_lately(reads.shard.stamp, began):
            continue  # (read before its header: a shard changed just before may keep its stamp)
        n = reads.vector_bytes()
        if total + n <= FACTS_MAX_TOTAL:
            planned.append(reads)
            total += n
    numpy = total >= NUMPY_MIN_BYTES
    with RandomAccessReader() as reader:
        for reads in planned:
            try:
                facts[reads.shard.path] = read_facts(reads, reader, numpy)
            except Exception:  # no facts for this shard: the checks read it themselves
                continue
    return Prefetched(block, facts, layer_results(lite, block, keep=False))


def check_r7(
    ckpt: Checkpoint,
    findings: Findings,
    options: ValidateOptions,
    *,
    prefetched: Forked[Prefetched | None] | None = None,
) -> R7Payload:
    """Every R7 rule; returns the payload K table (used by `inspect`). `prefetched`: a worker
    under way with `prefetch_r7`."""
    qc, file, base = check_quant_configs(ckpt, findings)
    config = ckpt.config or {}
    payload = R7Payload()
    if qc is None or "r7_routed_experts" not in qc:
        return payload
    block = check_block(qc["r7_routed_experts"], file, base + "/r7_routed_experts", findings)
    count = expert_count(config)
    if count is None:
        report_missing_expert_count(findings)
    n_exp = count[1] if count is not None else None
    hidden, inter = _sizes(config, findings)
    table = expert_table(ckpt.tensors)
    raw = raw_tail(config)
    tail = parse_tail(raw)
    if block is not None:
        _check_model_range(config, block, findings)
    finite = FiniteCheck()
    rejected = ckpt.damaged_shards | ckpt.rejected_files
    digests = Digests(ckpt.root, options, rejected) if options.hash else None
    run_manifests = block is not None and n_exp is not None
    run_manifests = run_manifests and isinstance(qc["r7_routed_experts"], dict)
    # The manifests are checked last (`layer_results` may come from a worker), their findings
    # still in their place: before the tail's (`later`).
    later = Findings() if run_manifests else findings
    with RandomAccessReader() as reader:
        scan = Scan(findings, reader, finite)
        if block is not None and n_exp is not None:
            ctx = ExpertsContext(table, block, n_exp, hidden, inter, ckpt.shards, scan)
            payload = check_experts(ctx)
            check_out_of_range(table, block, n_exp, tail.moe_layers if tail else None, findings)
            check_model_moe_layers(ckpt, block, tail.moe_layers if tail else None, table, findings)
        scan = replace(scan, findings=later)
        if raw is not None:
            if tail is not None:
                _check_tail_role(tail, block, later)
            tail_ctx = TailContext("config.json", POINTER, hidden, inter, n_exp, options.tp)
            check_tail(ckpt, raw, table, tail_ctx, scan)
        if block is not None:
            check_routers(ckpt, block.layers, n_exp, hidden, rule=r7.R7_ROUTER, findings=later)
        others = {n: r for n, r in ckpt.tensors.items() if ".mlp.experts." not in n}
        tables: list[str] = []
        dense = group_linears(others, tables)
        check_tables(tables, ckpt.tensors, later)
        check_linears(dense, ckpt.tensors, later, reader, finite)
        check_tp_slices(ckpt, of_groups(dense), options.tp, later, experts=False)  # experts: R7070
        # what the worker read ahead, if it gave it (else everything is read here, as always)
        got = prefetched.from_child(None) if prefetched is not None and digests is None else None
        pre = got if got is not None and block is not None and got.block == block else None
        flush_payload_checks(reader, finite, later, pre.facts if pre else None)
    if run_manifests:
        results = pre.manifests if pre else None
        check_layer_manifests(ckpt, block, qc, payload, findings, digests=digests, results=results)
        findings.extend(later)
    check_checkpoint_manifest(ckpt, findings, digests)
    if digests is not None and table.ranked:  # the carried tail's rank copies
        check_replicas(ckpt, findings, digests)
    if digests is None:
        findings.add(
            r7.R7_HASH_SKIPPED,
            "payload_sha256, shard_sha256, files_sha256 and the MANIFEST.sha256 seal were not recomputed",
            file="MANIFEST.json",
        )
    _check_tp_align(inter, options.tp, findings)
    return payload


def _check_tp_align(inter: int | None, tp: int | None, findings: Findings) -> None:
    if tp is None or inter is None:
        return
    part, rem = divmod(inter, tp)
    if rem or part % 128:
        findings.add(
            r7.R7_TP_ALIGN,
            f"moe_intermediate_size {inter} / tp {tp} = {inter / tp:g} per rank, "
            "not a multiple of 128",
            file="config.json",
            pointer="/moe_intermediate_size",
        )


def _check_tail_role(tail: Tail, block: Block | None, findings: Findings) -> None:
    """§6: the legacy tail survives only for the carried MTP layer."""
    role = tail.get("r7_compat_role")
    if role != "carried_mtp78_only":
        findings.add(
            r7.R7_TAIL_ROLE,
            f"r7_compat_role {role!r}, expected 'carried_mtp78_only'",
            file="config.json",
            pointer="/hybrid_tr3_tail/r7_compat_role",
        )
    rng = tail.moe_layers
    if rng is not None and block is not None and rng[0] <= block.last and block.first <= rng[1]:
        findings.add(
            r7.R7_TAIL_ROLE,
            f"tail moe_layers {list(rng)} overlaps r7_routed_experts.moe_layers "
            f"[{block.first}, {block.last}]",
            file="config.json",
            pointer="/hybrid_tr3_tail/moe_layers",
        )
