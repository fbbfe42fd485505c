"""Digests of an `exl3-msrt-base/1` base (docs/formats/msrt.md §5-§6): the published
compatibility identity (self-consistency always, recomputed from the bytes under `--hash`) and
the MANIFEST.sha256 file list."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from exl3tool.checks.options import ValidateOptions
from exl3tool.formats.checkpoint import Checkpoint
from exl3tool.io.paths import link_escape
from exl3tool.io.strict_json import pointer_join
from exl3tool.rules import base as mb
from exl3tool.rules import io as io_rules
from exl3tool.rules.registry import Findings

_PTR = "/hybrid_tr3_tail"
_SUMLINE = re.compile(r"^([0-9a-f]{64}) [ *](.+)$")


def check_identity(
    ckpt: Checkpoint,
    tail: dict[str, Any],
    k: int | None,
    findings: Findings,
    options: ValidateOptions,
) -> None:
    from exl3tool.identity.compat import compat_identity, root_digest

    by_layer, root = tail.get("compatibility_by_layer"), tail.get("compatibility_sha256")
    cov = tail.get("moe_layer_coverage")
    if (
        isinstance(by_layer, dict)
        and isinstance(cov, list)
        and set(by_layer) != {str(x) for x in cov}
    ):
        findings.add(
            mb.MB_MAP_KEYS,
            f"keys {sorted(by_layer)} differ from moe_layer_coverage {cov}",
            file="config.json",
            pointer=_PTR + "/compatibility_by_layer",
        )
    if (
        k is not None
        and isinstance(by_layer, dict)
        and isinstance(root, str)
        and root_digest(k, by_layer) != root
    ):
        findings.add(
            mb.MB_ROOT,
            "compatibility_sha256 does not match its compatibility_by_layer map",
            file="config.json",
            pointer=_PTR + "/compatibility_sha256",
        )
    if not options.hash or k is None or ckpt.incomplete:  # incomplete: the loader said why
        return
    ident = compat_identity(ckpt, k=k, threads=options.threads)
    if ident.root is None:
        return
    for L, digest in sorted(ident.layers.items(), key=lambda kv: int(kv[0])):
        published = by_layer.get(L) if isinstance(by_layer, dict) else None
        if published != digest:
            findings.add(
                mb.MB_LAYER_DIGEST,
                f"layer {L}: published {published}, recomputed from the bytes {digest}: do not match compatibility digest",
                file="config.json",
                pointer=pointer_join(_PTR + "/compatibility_by_layer", L),
            )
    if isinstance(root, str) and root != ident.root:
        findings.add(
            mb.MB_ROOT,
            f"compatibility_sha256 {root} but the bytes give {ident.root}",
            file="config.json",
            pointer=_PTR + "/compatibility_sha256",
        )


def check_manifest(ckpt: Checkpoint, findings: Findings, options: ValidateOptions) -> None:
    root = ckpt.root
    path = root / "MANIFEST.sha256"
    if not path.is_file():
        findings.add(
            mb.MB_MANIFEST_ABSENT, "the base has no MANIFEST.sha256", file="MANIFEST.sha256"
        )
        return
    listed: dict[str, str] = {}
    for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        m = _SUMLINE.match(line)
        if not m:
            findings.add(
                mb.MB_MANIFEST, f"line {i} is not a sha256sum line", file="MANIFEST.sha256"
            )
            continue
        listed[m.group(2)] = m.group(1)
    present: set[str] = set()
    for dirpath, dirs, files in os.walk(root):
        for name in files + [d for d in dirs if (Path(dirpath) / d).is_symlink()]:
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            # A link to a file is that file (a Hugging Face cache snapshot links every file into
            # blobs/); one that leaves the base and the cache is PA006 (the loader reports the
            # top level).
            if p.is_symlink() and not p.is_file():
                findings.add(mb.MB_MANIFEST, "symlink to a directory or nothing", file=rel)
                continue
            if "/" in rel and link_escape(root, p):
                findings.add(io_rules.PA_LINK_ESCAPE, link_escape(root, p), file=rel)
            if rel != "MANIFEST.sha256" and not rel.startswith("."):
                present.add(rel)
    for rel in sorted(present - set(listed)):
        findings.add(mb.MB_MANIFEST, "file not listed in MANIFEST.sha256", file=rel)
    for rel in sorted(set(listed) - present):
        findings.add(mb.MB_MANIFEST, "listed in MANIFEST.sha256 but absent", file=rel)
    if options.hash:
        from exl3tool.identity.engine import hash_files

        names = sorted(set(listed) & present)
        digests = hash_files([root / n for n in names], "sha256", options.threads)
        for n in names:
            if digests[root / n] != listed[n]:
                findings.add(mb.MB_MANIFEST_HASH, "sha256 differs from MANIFEST.sha256", file=n)
