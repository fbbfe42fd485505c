"""Resolve `org/name[@revision]` to a snapshot of the local Hugging Face cache, offline.

Only the cache is read (`snapshot_download(local_files_only=True)`, the HF_HUB_OFFLINE=1
semantics): a release gate must check the bytes on this machine, never fetch others. An argument is
treated as a Hugging Face id only when it is not an existing local path.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from exl3tool.rules.check import GT_HF_NOT_CACHED, GT_HF_UNAVAILABLE
from exl3tool.rules.registry import Findings

# Hub repo ids: "org/name", each part 1-96 of [A-Za-z0-9._-], not starting/ending with '.'/'-';
# a revision is a branch, tag or commit (branches may contain '/').
_ID = re.compile(
    r"^(?P<repo>[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
    r"/[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?)"
    r"(?:@(?P<rev>[A-Za-z0-9._/-]{1,255}))?$"
)


@dataclass(frozen=True)
class HfRef:
    repo_id: str
    revision: str | None

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


def parse_hf_id(arg: str) -> HfRef | None:
    """An `HfRef` when `arg` reads as org/name[@revision] and is not an existing local path."""
    if Path(arg).exists():
        return None
    m = _ID.match(arg)
    if not m or ".." in arg or arg.startswith(("./", "../")):
        return None
    return HfRef(m.group("repo"), m.group("rev"))


def cache_dir() -> Path:
    """The hub cache directory, read from the environment now (not at import time)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def _cached_revisions(repo_id: str, cache: Path) -> list[str]:
    """Refs and commits of `repo_id` present in the cache, for a helpful message."""
    from huggingface_hub import scan_cache_dir

    try:
        info = scan_cache_dir(cache)
    except Exception:  # no cache dir, unreadable entries: the message just lists nothing
        return []
    out: list[str] = []
    for repo in info.repos:
        if repo.repo_id == repo_id and repo.repo_type == "model":
            for rev in sorted(repo.revisions, key=lambda r: r.commit_hash):
                refs = ",".join(sorted(rev.refs))
                out.append(f"{rev.commit_hash[:12]}" + (f" ({refs})" if refs else ""))
    return out


def _expand_short_commit(ref: HfRef, cache: Path) -> HfRef:
    """`org/name@abc1234` names a commit by prefix; the hub API needs all 40 hex digits."""
    rev = ref.revision
    if not rev or not re.fullmatch(r"[0-9a-f]{7,39}", rev):
        return ref
    snapshots = cache / ("models--" + ref.repo_id.replace("/", "--")) / "snapshots"
    try:
        hits = [p.name for p in snapshots.iterdir() if p.name.startswith(rev)]
    except OSError:
        return ref
    return HfRef(ref.repo_id, hits[0]) if len(hits) == 1 else ref


def resolve(ref: HfRef, findings: Findings, cache: Path | None = None) -> Path | None:
    """The local snapshot directory of `ref`, or None with a GT003/GT004 finding."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        findings.add(GT_HF_UNAVAILABLE, f"cannot resolve {ref}: huggingface_hub is not installed")
        return None
    cache = cache or cache_dir()
    ref = _expand_short_commit(ref, cache)
    try:
        folder = snapshot_download(
            ref.repo_id,
            revision=ref.revision,
            cache_dir=cache,
            local_files_only=True,
            repo_type="model",
        )
    except (LocalEntryNotFoundError, OSError, ValueError) as exc:
        cached = _cached_revisions(ref.repo_id, cache)
        have = f"; cached revisions: {', '.join(cached)}" if cached else "; nothing of it is cached"
        findings.add(
            GT_HF_NOT_CACHED,
            f"{ref} is not in the local Hugging Face cache {cache}{have}"
            + (f" ({type(exc).__name__})" if not isinstance(exc, LocalEntryNotFoundError) else ""),
            file=str(ref),
        )
        return None
    return Path(str(folder))
