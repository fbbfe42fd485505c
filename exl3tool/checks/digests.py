"""A lazy sha256 cache over the hashing engine (`--hash`): each file hashed once per run."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from exl3tool.checks.options import ValidateOptions
from exl3tool.formats.checkpoint import TensorRef

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class Digests:
    """Lazy sha256 of whole files and tensor payloads through `exl3tool.identity.engine`; each
    file is hashed at most once per run (shard_sha256 and files_sha256 share results)."""

    def __init__(self, root: Path, options: ValidateOptions, rejected: Iterable[str] = ()) -> None:
        self.root = root
        self.threads = options.threads
        # Files the loader rejected (truncated, unreadable): their digest mismatch would only
        # repeat that finding, so they count as unreadable here.
        self._files: dict[str, str | None] = dict.fromkeys(rejected)

    def files(self, labels: Iterable[str]) -> dict[str, str | None]:
        """sha256 per relative file; None for a file that cannot be read."""
        from exl3tool.identity.engine import hash_files
        from exl3tool.io.progress import progress_bar
        from exl3tool.rules.errors import InputError

        todo = sorted({lb for lb in labels if lb not in self._files})
        ok = [lb for lb in todo if (self.root / lb).is_file()]
        for lb in set(todo) - set(ok):
            self._files[lb] = None
        if ok:
            total = sum((self.root / lb).stat().st_size for lb in ok)
            try:
                with progress_bar(total, "hashing files") as bar:
                    got = hash_files([self.root / lb for lb in ok], "sha256", self.threads, bar)
            except InputError:
                got = {}
            for lb in ok:
                self._files[lb] = got.get(self.root / lb)
        return {lb: self._files.get(lb) for lb in labels}

    def tensors(self, refs: Iterable[TensorRef]) -> dict[str, str]:
        from exl3tool.identity.engine import hash_tensors
        from exl3tool.io.progress import progress_bar

        items = [(r.name, r.shard, r.info) for r in refs]
        total = sum(i.nbytes for _, _, i in items)
        with progress_bar(total, "hashing tensors") as bar:
            return hash_tensors(items, "sha256", self.threads, bar)


def sha_ok(value: Any) -> bool:
    return isinstance(value, str) and bool(SHA256_RE.fullmatch(value))
