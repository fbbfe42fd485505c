"""`exl3tool slice` outputs as artifacts (issue 12): the output directory (its
`exl3tool-slices.json` pins every file) and each rank folder, checked as the TP slice it is.

A rank folder keeps the source's config.json (the runtime reads the full sizes and slices at
load, or finds its slice there); the family checks see it through `rank_view`, whose sizes are
those of one rank, so their geometry rules check the slice shapes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from exl3tool.formats.checkpoint import Checkpoint
from exl3tool.formats.detect import SLICES_MANIFEST
from exl3tool.io.paths import relative_path_problem
from exl3tool.rules import tp as tp_rules
from exl3tool.rules.registry import Findings

SPLIT_SIZES = ("moe_intermediate_size", "intermediate_size")  # split along the intermediate axis
# The source's release manifests (R7 layer manifests and MANIFEST.json, the base's
# MANIFEST.sha256, the producer's shard naming) describe the whole source and are not carried
# into rank folders: exl3tool-slices.json pins the slices instead (check_files). The runtime
# reads none of them.
RELEASE_RULES = frozenset(
    {"R7032", "R7033", "R7048", "R7049", "MB015", "MB016", "MB018"}
    | {f"R70{n}" for n in range(40, 55)}
)


def read_slices_manifest(out: Path, findings: Findings) -> dict[str, Any] | None:
    """The schema-checked `exl3tool-slices.json` of an output directory (TP007 otherwise)."""
    from exl3tool.tp.verify import read_manifest

    return read_manifest(out, findings)


def rank_of_folder(path: Path) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(manifest, rank record) when `path` is a rank folder listed by its parent's manifest."""
    path = Path(path)
    if not (path.parent / SLICES_MANIFEST).is_file():
        return None
    doc = read_slices_manifest(path.parent, Findings())
    if doc is None:
        return None
    for rank in doc["ranks"]:
        if rank.get("dir") == path.name:
            return doc, rank
    return None


def check_files(out: Path, doc: dict[str, Any], findings: Findings, *, digests: bool) -> None:
    """Every file the manifest pins is there with its size (TP006); with `digests` (validate
    --hash) its blake3 (and sha256 where recorded) too."""
    from exl3tool.identity.engine import hash_files

    ok: list[dict[str, Any]] = []
    for rec in doc["files"]:
        rel = rec["path"]
        path = out / rel
        problem = relative_path_problem(rel)
        if problem:
            findings.add(tp_rules.TP_FILE_DIGEST, f"path {rel!r} {problem}", file=SLICES_MANIFEST)
        elif not path.is_file():  # a link to a file is that file (HF cache snapshots)
            findings.add(
                tp_rules.TP_FILE_DIGEST, "listed by exl3tool-slices.json, missing", file=rel
            )
        elif path.stat().st_size != rec["size"]:
            findings.add(
                tp_rules.TP_FILE_DIGEST,
                f"{path.stat().st_size} bytes, exl3tool-slices.json says {rec['size']}",
                file=rel,
            )
        else:
            ok.append(rec)
    if not digests:
        return
    for algo in ("blake3", "sha256"):
        recs = [r for r in ok if algo in r]
        got = hash_files([out / r["path"] for r in recs], algo, None)
        for r in recs:
            if got[out / r["path"]] != r[algo]:
                findings.add(tp_rules.TP_FILE_DIGEST, f"{algo} differs", file=r["path"])


def check_rank_tensors(ckpt: Checkpoint, rank: dict[str, Any], findings: Findings) -> None:
    """The rank folder holds exactly the tensors its manifest record lists (TP005)."""
    want, have = set(rank["tensors"]), set(ckpt.tensors)
    for name in sorted(want - have)[:20]:
        findings.add(tp_rules.TP_COVERAGE, "listed for this rank, absent", tensor=name)
    for name in sorted(have - want)[:20]:
        ref = ckpt.tensors[name]
        findings.add(tp_rules.TP_COVERAGE, "not listed for this rank", file=ref.file, tensor=name)


def rank_view(ckpt: Checkpoint, tp: int) -> Checkpoint:
    """The checkpoint as one rank holds it: intermediate sizes divided by `tp` (the slicer
    splits experts and MLPs along that axis), so geometry rules check slice shapes."""
    config = ckpt.config if isinstance(ckpt.config, dict) else None
    if config is None or tp <= 1:
        return ckpt
    local = dict(config)
    for key in SPLIT_SIZES:
        v = local.get(key)
        if type(v) is int and v % tp == 0:
            local[key] = v // tp
    return dataclasses.replace(ckpt, config=local)


def relocate(findings: Findings, folder: str) -> Findings:
    """Findings of a rank folder, their files named relative to the output directory."""
    out = Findings()
    for f in findings:
        file = f.location.file
        shown = folder if file in (None, "", ".") else f"{folder}/{file}"
        out.extend([dataclasses.replace(f, location=dataclasses.replace(f.location, file=shown))])
    return out


__all__ = [
    "RELEASE_RULES",
    "check_files",
    "check_rank_tensors",
    "rank_of_folder",
    "rank_view",
    "read_slices_manifest",
    "relocate",
]
