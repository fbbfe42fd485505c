"""`org/name[@revision]` as an artifact: a snapshot of the local Hugging Face hub cache, offline.

Only the cache is read (`snapshot_download(local_files_only=True)`, the HF_HUB_OFFLINE=1
semantics): exl3tool checks the bytes on this machine and never fetches others. An argument is an
id only when it is not an existing local path, so a directory named `org/name` always wins.

A snapshot's files are relative symlinks into the repository's `blobs/`; `blob_root` names that
directory so that readers accept such links as files (`io.paths.link_target`).
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from exl3tool.io.fs import exists
from exl3tool.rules.errors import InputError, missing_extra

# Hub repo ids: "org/name", each part 1-96 of [A-Za-z0-9._-], not starting/ending with '.'/'-';
# a revision is a branch, tag or commit (branches may contain '/').
_ID = re.compile(
    r"^(?P<repo>[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
    r"/[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?)"
    r"(?:@(?P<rev>[A-Za-z0-9._/-]{1,255}))?$"
)
_SHORT_COMMIT = re.compile(r"[0-9a-f]{7,39}")


@dataclass(frozen=True)
class HfRef:
    repo_id: str
    revision: str | None

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


class NotCached(InputError):
    """`org/name[@revision]` has no snapshot in the local cache (exit 3)."""


def parse_hf_id(arg: str) -> HfRef | None:
    """An `HfRef` when `arg` reads as org/name[@revision] and is not an existing local path."""
    if exists(arg):
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


def cached_revisions(repo_id: str, cache: Path) -> list[str]:
    """Refs and commits of `repo_id` present in the cache, for a helpful message."""
    from huggingface_hub import scan_cache_dir

    out: list[str] = []
    try:
        info = scan_cache_dir(cache)
    except Exception:  # a ref to a commit without a snapshot (an interrupted update), …
        info = None
    for repo in info.repos if info is not None else ():
        if repo.repo_id == repo_id and repo.repo_type == "model":
            for rev in sorted(repo.revisions, key=lambda r: r.commit_hash):
                refs = ",".join(sorted(rev.refs))
                out.append(f"{rev.commit_hash[:12]}" + (f" ({refs})" if refs else ""))
    if not out:  # what the folder itself holds, when the scan could not say
        snapshots = cache / ("models--" + repo_id.replace("/", "--")) / "snapshots"
        with contextlib.suppress(OSError):
            out = sorted(p.name[:12] for p in snapshots.iterdir() if p.is_dir())
    return out


def _expand_short_commit(ref: HfRef, cache: Path) -> HfRef:
    """`org/name@abc1234` names a commit by prefix; the hub API needs all 40 hex digits."""
    rev = ref.revision
    if not rev or not _SHORT_COMMIT.fullmatch(rev):
        return ref
    snapshots = cache / ("models--" + ref.repo_id.replace("/", "--")) / "snapshots"
    try:
        hits = sorted(p.name for p in snapshots.iterdir() if p.name.startswith(rev))
    except OSError:
        return ref
    if len(hits) > 1:
        raise NotCached(
            f"{ref}: the commit prefix {rev} is ambiguous in the local Hugging Face cache "
            f"({', '.join(h[:12] for h in hits)}); give more digits"
        )
    return HfRef(ref.repo_id, hits[0]) if hits else ref


def snapshot_of(ref: HfRef, cache: Path | None = None) -> Path:
    """The local snapshot directory of `ref`. Raises NotCached (exit 3), or a UsageError (exit 2)
    naming the `hf` extra when huggingface_hub is not installed."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise missing_extra("huggingface_hub", "hf", f"resolving {ref}") from None
    try:
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:  # huggingface_hub before 0.25 (the extra allows 0.23)
        from huggingface_hub.utils import LocalEntryNotFoundError
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
        cached = cached_revisions(ref.repo_id, cache)
        have = f"; cached revisions: {', '.join(cached)}" if cached else "; nothing of it is cached"
        why = "" if isinstance(exc, LocalEntryNotFoundError) else f" ({type(exc).__name__})"
        raise NotCached(
            f"{ref} is not in the local Hugging Face cache {cache}{have}{why}"
            " (fetch it with `hf download`, or pass a directory)"
        ) from None
    return Path(str(folder))


def resolve_artifact(arg: str) -> Path:
    """The path an artifact argument names: an existing path, or the cached snapshot of
    `org/name[@revision]`. Anything else is returned as a path (the command reports it)."""
    ref = parse_hf_id(str(arg))
    return Path(arg) if ref is None else snapshot_of(ref)


def blob_root(root: Path) -> Path | None:
    """The `blobs/` directory of the hub-cache repository that `root` lies in (a snapshot or a
    folder inside one), or None when `root` is not inside a cache snapshot."""
    # as named, then as resolved: a link to a snapshot (`ln -s …/snapshots/<rev> my-model`)
    for p in dict.fromkeys((Path(os.path.abspath(root)), Path(os.path.realpath(root)))):
        for snap in (p, *p.parents):
            parent = snap.parent
            if parent.name == "snapshots" and parent.parent.name.startswith("models--"):
                blobs = parent.parent / "blobs"
                return blobs if blobs.is_dir() else None
    return None


def is_cache_blob(path: Path) -> bool:
    """Whether `path` (resolved) is a file of a repository's `blobs/` store in the configured hub
    cache (`cache_dir()`), where an older `--local-dir` download or a folder of links into the
    cache points. A `models--*/blobs/` folder elsewhere on disk is not the cache."""
    parent = path.parent
    if parent.name != "blobs" or not parent.parent.name.startswith("models--"):
        return False
    cache = Path(os.path.realpath(cache_dir()))
    return Path(os.path.realpath(parent.parent.parent)) == cache
