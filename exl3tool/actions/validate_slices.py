"""`validate` of `exl3tool slice` outputs (issue 12): the output directory and each of its rank
folders, checked as the TP slices they are (checks/slices.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exl3tool.actions.validate_checkpoint import check_checkpoint
from exl3tool.checks import slices
from exl3tool.checks.options import ValidateOptions
from exl3tool.formats.checkpoint import Checkpoint, load_checkpoint
from exl3tool.formats.detect import Kind, detect
from exl3tool.io.fs import shown
from exl3tool.io.paths import relative_path_problem
from exl3tool.rules import tp as tp_rules
from exl3tool.rules.registry import Findings


def check_rank(
    ckpt: Checkpoint,
    kind: Kind,
    rank: tuple[dict[str, Any], dict[str, Any]],
    findings: Findings,
    options: ValidateOptions,
) -> dict:
    """One rank folder: its tensors as the manifest lists them, then every family and
    conformance rule on the rank's view (slice geometry). Identities are over the whole source,
    so digests are the manifest's job: the family checks run without --hash."""
    from dataclasses import replace

    doc, rec = rank
    slices.check_rank_tensors(ckpt, rec, findings)
    facts = {"tp_rank": rec["rank"], "tp": doc["tp"], "mode": doc["mode"]}
    if doc["mode"] != "tensor":
        # expert-parallel slices hold a subset of experts: not a layout the runtime loads
        # (its EXL3 MoE method supports TP, not expert parallelism), so no family rule applies
        return {**facts, "family_checks": "skipped (expert-parallel slices)"}
    own = Findings()
    extra = check_checkpoint(
        slices.rank_view(ckpt, doc["tp"]), kind, own, replace(options, hash=False)
    )
    findings.extend(f for f in own if f.code not in slices.RELEASE_RULES)
    return {**extra, **facts}


def check_slices_dir(out: Path, findings: Findings, options: ValidateOptions) -> dict:
    """The output directory: every pinned file (sizes; digests with --hash), then each rank
    folder as `check_rank` checks it, its findings named under the rank folder."""
    doc = slices.read_slices_manifest(out, findings)
    if doc is None:
        return {}
    slices.check_files(out, doc, findings, digests=options.hash)
    kinds = set()
    for i, rec in enumerate(doc["ranks"]):
        folder = _rank_folder(out, rec["dir"], f"/ranks/{i}/dir", findings)
        if folder is None:
            continue
        sub = Findings()
        kind = detect(folder)
        kinds.add(kind.value)
        ckpt = load_checkpoint(folder, sub)
        check_rank(ckpt, kind, (doc, rec), sub, options)
        findings.extend(slices.relocate(sub, rec["dir"]))
    return {"tp": doc["tp"], "layout": doc["layout"], "ranks": len(doc["ranks"]),
            "rank_kinds": sorted(kinds)}  # fmt: skip


def _rank_folder(out: Path, rel: str, pointer: str, findings: Findings) -> Path | None:
    """The rank folder a manifest names, inside `out`; TP007 when the name is no relative path
    (`..`, absolute, too long) or the folder is not there."""
    problem = relative_path_problem(rel)
    folder = out / rel
    if problem is None:
        try:
            if folder.is_dir():
                return folder
        except OSError:  # the file system cannot reach it
            pass
        problem = "names no folder of the output"
    findings.add(
        tp_rules.TP_MANIFEST, f"rank folder {shown(rel)!r} {problem}", file=slices.SLICES_MANIFEST,
        pointer=pointer,
    )  # fmt: skip
    return None
