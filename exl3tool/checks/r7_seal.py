"""R7 checkpoint manifest (docs/formats/r7.md §5): MANIFEST.json's files_sha256 and
r7_layer_manifest_sha256, and the MANIFEST.sha256 seal; digests recomputed under `--hash`."""

from __future__ import annotations

import re

from exl3tool.checks.digests import Digests, sha_ok
from exl3tool.formats.checkpoint import Checkpoint
from exl3tool.formats.r7 import layer_manifest
from exl3tool.io.paths import relative_path_problem
from exl3tool.io.strict_json import pointer_join
from exl3tool.rules import r7 as r7
from exl3tool.rules.registry import Findings

MF = "MANIFEST.json"
SEAL = "MANIFEST.sha256"
SEAL_RE = re.compile(r"^([0-9a-f]{64})  MANIFEST\.json\n?$")
CKPT_MANIFEST_OPTIONAL = (
    "marker", "recipe_version", "schema", "carrier", "carried_tensor_payload_sha256",
    "tensor_count", "r7_layer_manifest_sha256", "assembly_transaction_id",
)  # fmt: skip


def check_checkpoint_manifest(
    ckpt: Checkpoint, findings: Findings, digests: Digests | None
) -> None:
    """MANIFEST.json files_sha256 / r7_layer_manifest_sha256 and the MANIFEST.sha256 seal (§5)."""
    mf = ckpt.json_file(MF, findings)
    if mf is None:
        if not (ckpt.root / MF).is_file():
            findings.add(r7.R7_CKPT_MANIFEST, "MANIFEST.json is missing", file=MF)
        return
    files = mf.get("files_sha256")
    if not isinstance(files, dict):
        findings.add(
            r7.R7_CKPT_MANIFEST,
            "files_sha256 missing or not an object",
            file=MF,
            pointer="/files_sha256",
        )
        files = {}
    absent = [k for k in CKPT_MANIFEST_OPTIONAL if k not in mf]
    if absent:
        findings.add(
            r7.R7_PROVENANCE, f"absent: {', '.join(absent)}", file=MF, pointer="/" + absent[0]
        )
    good = _listed_files(ckpt, files, findings)
    seal = _read_seal(ckpt, findings)
    if digests is not None:
        _check_digests(good, seal, mf.get("r7_layer_manifest_sha256"), findings, digests)


def _listed_files(ckpt: Checkpoint, files: dict, findings: Findings) -> dict[str, str]:
    """files_sha256 entries that name an existing file by a safe path and give a sha256."""
    good: dict[str, str] = {}
    for rel, declared in files.items():
        ptr = pointer_join("/files_sha256", rel)
        problem = relative_path_problem(rel) if isinstance(rel, str) else "not a string"
        if not problem and rel in ckpt.rejected_files:
            continue  # the loader said it is missing or unusable (CK001, CK003)
        if problem or not (ckpt.root / rel).is_file():
            findings.add(
                r7.R7_FILES_LIST, f"{rel!r}: {problem or 'no such file'}", file=MF, pointer=ptr
            )
        elif not sha_ok(declared):
            findings.add(r7.R7_FILES_LIST, f"{declared!r} is not a sha256", file=MF, pointer=ptr)
        else:
            good[rel] = declared
    return good


def _read_seal(ckpt: Checkpoint, findings: Findings) -> str | None:
    seal_path = ckpt.root / SEAL
    if not seal_path.is_file():
        findings.add(r7.R7_CKPT_MANIFEST, "MANIFEST.sha256 is missing", file=SEAL)
        return None
    try:
        text = seal_path.read_bytes()[:4096].decode("utf-8")
    except (OSError, UnicodeDecodeError):
        text = ""
    m = SEAL_RE.match(text)
    if m is None:
        findings.add(r7.R7_SEAL, 'expected one line "<sha256>  MANIFEST.json"', file=SEAL)
        return None
    return m.group(1)


def _check_digests(
    good: dict[str, str], seal: str | None, lm: object, findings: Findings, digests: Digests
) -> None:
    names = set(good) | ({MF} if seal else set())
    if isinstance(lm, dict):
        names |= {layer_manifest(int(k)) for k in lm if str(k).isdigit()}
    got = digests.files(sorted(names))
    for rel, declared in good.items():
        if got.get(rel) is not None and got[rel] != declared:
            findings.add(
                r7.R7_FILES_SHA,
                f"{rel} sha256 {got[rel]}, MANIFEST.json says {declared}",
                file=MF,
                pointer=pointer_join("/files_sha256", rel),
            )
    if seal is not None and got.get(MF) != seal:
        findings.add(r7.R7_SEAL, f"MANIFEST.json sha256 {got.get(MF)}, seal says {seal}", file=SEAL)
    if not isinstance(lm, dict):
        return
    for key, declared in lm.items():
        if not str(key).isdigit():
            continue
        rel = layer_manifest(int(key))
        if got.get(rel) is not None and got[rel] != declared:
            findings.add(
                r7.R7_LAYER_MANIFEST_SHA,
                f"{rel} sha256 {got[rel]}, MANIFEST.json says {declared}",
                file=MF,
                pointer=pointer_join("/r7_layer_manifest_sha256", key),
            )
