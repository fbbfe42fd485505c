"""`stage-cartridge`: turn an adapter into a verified, deployable, TP-ready directory.

Mirrors the runtime's staging step (docs/formats/msrt.md §9 A, §10.2): every shard is opened
and copied into a private directory while it is hashed (sha256 + blake3 read ahead of the copy,
blake3 of the bytes written; `_copy_one`), its size and sha256 are compared with the manifest and its
(dev, ino, size, mtime_ns, ctime_ns) before and after the copy must agree. Every validation then
runs on the verified private bytes against the base (whose identity is recomputed from its bytes).
A `full` adapter staged for `--tp N > 1` is converted to `rank-sharded` by
`exl3tool.tp.cartridge.shard_cartridge` and the result is validated again. The runtime tables of
every rank are materialized (dry run) and summarized in `exl3tool-staging.json`.

Publication is atomic (`io.atomic.atomic_dir`): everything is written in a hidden temporary
sibling `.OUT.tmp-*`, fsynced, then renamed. On any error nothing appears at OUT and an existing
OUT is untouched. A killed process can leave a hidden `.OUT.tmp-*` sibling; the next run removes
such leftovers when no live process holds them (`io.atomic.remove_stale_temps`).
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exl3tool import __version__
from exl3tool.checks.boundary import family_boundary
from exl3tool.checks.cartridge import BaseInfo, check_loaded, load_base_info
from exl3tool.checks.options import ValidateOptions
from exl3tool.formats import msrt_spec as spec
from exl3tool.formats.cartridge import Cartridge, ShardEntry, load_cartridge
from exl3tool.formats.cartridge_tables import TablesError, materialize_tables, max_residual_bits
from exl3tool.identity.engine import new_hasher
from exl3tool.io.atomic import atomic_dir, remove_stale_temps
from exl3tool.io.outputs import check_output_place
from exl3tool.io.paths import PathViolation, open_inside
from exl3tool.io.safetensors import FileStamp
from exl3tool.io.workers import Background, map_threads
from exl3tool.rules import cartridge as ca
from exl3tool.rules import io as io_rules
from exl3tool.rules.crash import CA_CRASH
from exl3tool.rules.errors import Exl3ToolError, OutputError, UsageError
from exl3tool.rules.registry import Findings

STAGING_SCHEMA = "exl3tool-staging/1"
STAGING_FILE = "exl3tool-staging.json"
CHUNK = 8 << 20  # §9 rule 5: the runtime copies in 8 MiB reads
_COPY_DIR = ".exl3tool-private-copy"

# Test hook: called after each chunk with (shard path, bytes copied so far). Tests monkeypatch it
# to modify a source mid-copy; EXL3TOOL_TEST_STAGE_SLEEP (seconds per chunk) slows the copy so a
# test can kill the process while it runs.
copy_hook: Callable[[str, int], None] | None = None


class StageError(Exl3ToolError):
    """Staging refused the adapter; `findings` say why (exit 1, nothing written at OUT)."""

    exit_code = 1

    def __init__(self, message: str, findings: Findings) -> None:
        super().__init__(message)
        self.findings = findings


@dataclass
class CopiedFile:
    path: str
    size: int
    sha256: str
    blake3: str


@dataclass
class StageResult:
    out: Path
    findings: Findings
    staging: dict[str, Any] = field(default_factory=dict)


def _copy_one(
    root: Path,
    entry: ShardEntry,
    dest_root: Path,
    progress: Any,
    stop: threading.Event,
    pool: _Buffers,
) -> tuple[CopiedFile | None, list[tuple]]:
    """Copy one shard while it is verified; returns (copied, problems as (rule, msg)).

    Two reads of one open file, each bounded by the size seen at open (a source that keeps
    growing cannot stall us): `_HashAhead` hashes the source (sha256, the manifest's digest, and
    blake3) in its own thread, ahead of the copy; the copy hashes with blake3 the bytes it writes.
    Equal blake3 digests prove that the written bytes are the ones whose sha256 matched. The
    whole-file sha256 is the only payload digest the manifest carries (msrt.md §4 field 15, §11),
    so a bad shard is known when the hash-ahead ends, not when its slower copy ends: then `stop`
    is set and every copy of this staging stops writing (nothing will be published), while every
    shard is still hashed in full (the findings do not depend on timing).
    """
    try:
        # Symlinks are followed (a Hugging Face cache snapshot links every file into blobs/): the
        # copy is made of real files, which is what the runtime opens without following links.
        fd = open_inside(root, entry.path, links="any")
    except PathViolation as exc:
        return None, [
            (io_rules.PA_SYMLINK if exc.kind == "symlink" else io_rules.PA_NOT_REGULAR, str(exc))
        ]
    dest = dest_root / entry.path
    try:
        before = FileStamp.of(os.fstat(fd))

        def bad(done: int, sha256: str) -> bool:
            return (type(entry.size) is int and done != entry.size) or sha256 != entry.sha256

        ahead = _HashAhead(fd, before.size, bad, stop, pool)
        written: tuple[int, str] | None = None
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o666)
            try:
                ahead.start()
                written = _write_copy(fd, out, before.size, entry.path, progress, stop, pool)
                if written is not None and ahead.wait() and not stop.is_set():
                    # flush now, overlapping the other shards' copies (atomic_dir's final fsync
                    # of the tree then finds clean pages); a refused copy is never flushed
                    os.fsync(out)
            finally:
                os.close(out)
        except BaseException as exc:
            ahead.abort.set()  # the copy failed: its hash is not wanted
            if ahead.ident is not None:
                ahead.join()
            if isinstance(exc, OSError):
                raise OutputError(f"cannot write {dest.name}: {exc.strerror or exc}") from exc
            raise
        ahead.join()  # a stopped copy still waits for its shard's whole hash (same findings)
        done, digest, b3 = ahead.result()  # the hash-ahead's read error, if any, is raised here
        after = FileStamp.of(os.fstat(fd))
    finally:
        os.close(fd)
    problems: list[tuple] = []
    linked = written is None or written == (done, b3)
    if after != before or done != before.size or not linked:
        problems.append(
            (
                io_rules.ST_CHANGED,
                "the source changed during the copy (dev, inode, size, mtime or ctime)",
            )
        )
    if type(entry.size) is int and done != entry.size:
        problems.append(
            (
                ca.CA_SHARD_SIZE,
                f"size does not match: copied {done} bytes, adapter_config.json says {entry.size}",
            )
        )
    if digest != entry.sha256:
        problems.append(
            (ca.CA_SHARD_SHA256, f"sha256 does not match adapter_config.json ({digest})")
        )
    return CopiedFile(entry.path, done, digest, b3), problems


_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_WRITERS = (
    2  # pwrite threads per shard: on the VM a write's page-cache pages cost more than the read
)
_BUFFERS = 4  # CHUNK buffers per copy in flight (RSS bound: _BUFFERS * CHUNK per shard copied)


class _Buffers:
    """CHUNK buffers shared by one staging's copies: made on demand (at most workers x
    (_BUFFERS + 2)) and reused from shard to shard, so the RSS does not depend on the shard count."""

    def __init__(self) -> None:
        self._free: queue.SimpleQueue[memoryview] = queue.SimpleQueue()

    def get(self) -> memoryview:
        try:
            return self._free.get_nowait()
        except queue.Empty:
            return memoryview(bytearray(CHUNK))

    def put(self, view: memoryview) -> None:
        self._free.put(view)


def _pread_into(fd: int, view: memoryview, offset: int) -> int:
    return os.preadv(fd, [view], offset)


class _HashAhead(threading.Thread):
    """sha256 and blake3 of the first `size` bytes of `fd`, read with pread into one buffer.

    Sets `stop` as soon as `bad(bytes read, sha256)` says the shard is refused; ends early only
    when `abort` is set (the copy failed)."""

    def __init__(
        self,
        fd: int,
        size: int,
        bad: Callable[[int, str], bool],
        stop: threading.Event,
        pool: _Buffers,
    ) -> None:
        super().__init__(name="exl3tool-stage-hash", daemon=True)
        self.fd, self.size, self.bad, self.stop, self.pool = fd, size, bad, stop, pool
        self.abort = threading.Event()
        self.finished = threading.Event()
        self._result: tuple[int, str, str] | None = None
        self._error: BaseException | None = None

    def run(self) -> None:
        try:
            sha, b3 = new_hasher("sha256"), new_hasher("blake3")
            views = [self.pool.get(), self.pool.get()]
            done = 0
            # sha256 is the slower hash and sets the pace: a helper runs blake3 of the same
            # chunk beside it, then reads the next chunk into the other buffer, so a shard costs
            # one sha256 pass, not the sum of hashes and reads (the refusal waits for it)
            beside = ThreadPoolExecutor(1, thread_name_prefix="exl3tool-stage-b3")

            def aside(cur: memoryview, n: int, nxt: memoryview, at: int) -> int:
                b3.update(cur[:n])
                want = min(CHUNK, self.size - at)
                return _pread_into(self.fd, nxt[:want], at) if want > 0 else 0

            try:
                n = _pread_into(self.fd, views[0][: min(CHUNK, self.size)], 0) if self.size else 0
                while n and not self.abort.is_set():
                    cur, nxt = views
                    pending = beside.submit(aside, cur, n, nxt, done + n)
                    sha.update(cur[:n])
                    n_next = pending.result()
                    done += n
                    n = n_next
                    views.reverse()
            finally:
                beside.shutdown(wait=True)
                for view in views:
                    self.pool.put(view)
            digest = sha.hexdigest()
            self._result = (done, digest, b3.hexdigest())
            if self.bad(done, digest):
                self.stop.set()
        except BaseException as exc:  # raised again by result() in the copying thread
            self._error = exc
        finally:
            self.finished.set()

    def wait(self) -> bool:
        """Wait for the digests; True when they were computed."""
        self.finished.wait()
        return self._result is not None

    def result(self) -> tuple[int, str, str]:
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


class _At:
    """A file descriptor written at a fixed offset (what `_write_all` writes to)."""

    def __init__(self, fd: int, offset: int) -> None:
        self.fd, self.offset = fd, offset

    def write(self, chunk: memoryview) -> int:
        n = os.pwrite(self.fd, chunk, self.offset)
        self.offset += n
        return n


def _write_copy(
    src: int,
    dst: int,
    size: int,
    label: str,
    progress: Any,
    stop: threading.Event,
    pool: _Buffers,
) -> tuple[int, str] | None:
    """Copy the first `size` bytes of `src` to `dst`: one reader, which hashes with blake3 what
    it hands on, and `_WRITERS` pwrite threads; (bytes, blake3), or None once `stop` is set."""
    sleep = float(os.environ.get("EXL3TOOL_TEST_STAGE_SLEEP", "0") or 0)
    b3 = new_hasher("blake3")
    free: queue.SimpleQueue[memoryview] = queue.SimpleQueue()
    views = [pool.get() for _ in range(_BUFFERS)]
    for view in views:
        free.put(view)
    jobs: queue.SimpleQueue[tuple[memoryview, int, int] | None] = queue.SimpleQueue()
    errors: list[BaseException] = []

    def writer() -> None:
        while (job := jobs.get()) is not None:
            view, n, offset = job
            try:
                if not errors and not stop.is_set():
                    _write_all(_At(dst, offset), view[:n])
            except BaseException as exc:
                errors.append(exc)
            finally:
                free.put(view)

    writers = [
        threading.Thread(target=writer, name="exl3tool-stage-write", daemon=True)
        for _ in range(_WRITERS)
    ]
    for t in writers:
        t.start()
    done = 0
    try:
        while done < size and not errors and not stop.is_set():
            view = free.get()
            n = _pread_into(src, view[: min(CHUNK, size - done)], done)
            if not n:
                free.put(view)
                break
            b3.update(view[:n])
            jobs.put((view, n, done))
            done += n
            if progress is not None:
                progress.advance(n)
            if copy_hook is not None:
                copy_hook(label, done)
            if sleep:
                time.sleep(sleep)
    finally:
        for _ in writers:
            jobs.put(None)
        for t in writers:
            t.join()
        for view in views:
            pool.put(view)
    if errors:
        raise errors[0]
    return None if stop.is_set() else (done, b3.hexdigest())


def _write_all(dst: Any, chunk: memoryview) -> None:
    while len(chunk):
        n = dst.write(chunk)
        chunk = chunk[n:]


def copy_verified(
    cart: Cartridge,
    dest: Path,
    findings: Findings,
    *,
    threads: int | None = None,
    progress: Any = None,
) -> list[CopiedFile]:
    """Copy every listed shard and the manifest bytes into `dest`, verifying as it goes.

    When a shard is refused (size or sha256), the copies stop early and `dest` holds partial
    files: the caller must not use them (findings has errors)."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / spec.ADAPTER_CONFIG).write_bytes(cart.manifest_bytes or b"")
    entries = sorted(cart.entries, key=lambda e: e.index)
    # every shard at once by default: the OS balances uneven shards over the cores (GIL released
    # by hashlib, blake3 and file I/O on large buffers)
    workers = max(1, min(threads or 4 * (os.cpu_count() or 1), len(entries) or 1))
    stop, pool = threading.Event(), _Buffers()
    results = map_threads(
        lambda e: _copy_one(cart.root, e, dest, progress, stop, pool), entries, workers,
        stop=stop.set,  # an interrupt: every copy stops writing, then it is raised
    )  # fmt: skip
    copied = []
    for entry, (cf, problems) in zip(entries, results, strict=True):
        for r, msg in problems:
            findings.add(r, msg, file=entry.path, pointer=f"/shards/{entry.index}")
        if cf is not None:
            copied.append(cf)
    return copied


def _file_hashes(root: Path, manifest: dict[str, Any]) -> list[CopiedFile]:
    from exl3tool.identity.engine import hash_files

    paths = [root / sh["path"] for sh in manifest["shards"]]
    b3 = hash_files(paths, "blake3")
    return [
        CopiedFile(sh["path"], sh["size"], sh["sha256"], b3[root / sh["path"]])
        for sh in manifest["shards"]
    ]


def _rank_files(
    cart: Cartridge, files: list[CopiedFile], world: int
) -> dict[int, list[CopiedFile]]:
    """Which files each rank reads: full -> all files for every rank; rank-sharded -> by key rank."""
    if cart.layout != "rank-sharded":
        return {r: list(files) for r in range(world)}
    by_rank: dict[int, list[CopiedFile]] = {r: [] for r in range(world)}
    for f in files:
        ranks = {k.rank for k in cart.stage_keys() if cart.keys[k.name].shard.label == f.path}
        for r in sorted(ranks):
            by_rank.setdefault(r, []).append(f)
    return by_rank


def staging_record(
    cart: Cartridge,
    files: list[CopiedFile],
    base: BaseInfo,
    world: int,
    source_manifest: bytes,
    converted: bool,
) -> dict[str, Any]:
    """The `exl3tool-staging/1` document (schemas/exl3tool-staging-1.schema.json)."""
    ranks = []
    mrb = 0
    for r, rfiles in sorted(_rank_files(cart, files, world).items()):
        tables = materialize_tables(cart, rank=r, world_size=world, num_experts=base.num_experts)
        mrb = max(mrb, max_residual_bits(tables))
        ranks.append(
            {
                "rank": r,
                "files": [
                    {"path": f.path, "size": f.size, "sha256": f.sha256, "blake3": f.blake3}
                    for f in rfiles
                ],
                "layers": [t.summary() for t in tables.values()],
            }
        )
    return {
        "schema": STAGING_SCHEMA,
        "tool_version": __version__,
        "adapter_manifest_sha256": hashlib.sha256(source_manifest).hexdigest(),
        "staged_manifest_sha256": hashlib.sha256(cart.manifest_bytes or b"").hexdigest(),
        "base": {"compatibility_sha256": base.root, "k": base.k},
        "tp_size": world,
        "layout": cart.layout,
        "converted": converted,
        "chain": cart.chain_labels,
        "max_residual_bits": mrb,
        "ranks": ranks,
    }


def _fail(findings: Findings, what: str) -> None:
    if findings.has_errors():
        raise StageError(f"{what}: {len(findings.errors())} errors; nothing was written", findings)


def stage_cartridge(
    adapter: Path,
    base: Path,
    *,
    out: Path,
    tp: int | None = None,
    force: bool = False,
    threads: int | None = None,
    progress: Any = None,
    reuse_base_identity: bool = False,
) -> StageResult:
    """Stage `adapter` for `base` at TP size `tp` into `out`; raise StageError with the findings.

    `reuse_base_identity`: verify the base's bytes once per process while its shards are
    unchanged (`identity.compat.cached_compat_identity`; verify-swap stages up to three times).
    """
    out = Path(out).absolute()
    if tp is not None and tp < 1:
        raise UsageError("--tp must be >= 1")
    check_output_place(out, force, (adapter, base), directory=True)
    remove_stale_temps(out)  # a killed run's leftovers; never a live run's
    findings = Findings()
    src = load_cartridge(Path(adapter), findings, links="any")
    if src.entry_file is not None and src.entry_file != spec.ADAPTER_CONFIG:
        raise UsageError("stage-cartridge takes the adapter directory, not a shard file")
    _fail(findings, "the adapter cannot be staged")
    assert src.manifest is not None
    world = tp if tp is not None else (src.world_size if src.layout == "rank-sharded" else 1)
    convert = src.layout == "full" and world > 1
    with atomic_dir(out, force=force, inputs=(adapter, base)) as tmp:
        private = tmp / _COPY_DIR if convert else tmp
        # the base's identity (a hash of its bytes) is computed beside the copy, which does not
        # depend on it; its findings still come first, and a refused base publishes nothing
        base_findings, copy_findings = Findings(), Findings()
        # the base is only read: an interrupt during the copy leaves its hashing to the exit,
        # while the copy's writers are stopped and waited for before the temporary goes
        base_info = Background(
            lambda: load_base_info(
                Path(base), base_findings, recompute=True, threads=threads,
                reuse=reuse_base_identity,
            ),
            name="exl3tool-stage-base",
        )  # fmt: skip
        copied = copy_verified(src, private, copy_findings, threads=threads, progress=progress)
        binfo = base_info.result()
        findings.extend(base_findings)
        _fail(findings, "the adapter or the base cannot be staged")
        assert binfo is not None
        findings.extend(copy_findings)
        _fail(findings, "copy verification failed")
        copy = load_cartridge(private, findings)
        with family_boundary(findings, CA_CRASH):  # a check's bug: a finding, not a traceback
            check_loaded(
                copy, findings, ValidateOptions(tp=world, threads=threads), base=binfo, hashed=True
            )
        _fail(findings, "validation failed")
        if convert:
            from exl3tool.tp.cartridge import shard_cartridge, verify_sharded

            try:
                shard_cartridge(copy, world, tmp)
            except OSError as exc:
                raise OutputError(f"cannot write {out}: {exc.strerror or exc}") from exc
            staged = load_cartridge(tmp, findings)
            findings.extend(verify_sharded(copy, staged))
            with family_boundary(findings, CA_CRASH):
                check_loaded(
                    staged,
                    findings,
                    ValidateOptions(tp=world, threads=threads),
                    base=binfo,
                    hashed=True,
                )
            _fail(findings, "the rank-sharded output does not validate")
            shutil.rmtree(private)
            files = _file_hashes(tmp, staged.manifest)
        else:
            staged, files = copy, copied
        try:
            record = staging_record(staged, files, binfo, world, src.manifest_bytes or b"", convert)
        except TablesError as exc:
            findings.add(ca.CA_K_UNIFORM, f"runtime tables cannot be materialized: {exc}")
            _fail(findings, "runtime tables")
            raise
        (tmp / STAGING_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        prove_unchanged(src, binfo, findings)
        _fail(findings, "an input changed while it was staged")
    return StageResult(out, findings, record)


def prove_unchanged(src: Cartridge, base: BaseInfo, findings: Findings) -> None:
    """The stability proof before publishing (issue 15 item 5): every adapter and base shard
    still has the (dev, inode, size, mtime_ns) it had when it was read; else ST023 findings (a
    staging record must not certify an identity the base no longer has)."""
    from exl3tool.io.views import same_content, stamp_of_path

    inputs = [(src.root / e.path, e.stamp, e.path) for e in src.entries]
    inputs += [(p, st, str(p)) for p, st in base.inputs.items()]
    for path, then, label in inputs:
        now = stamp_of_path(path)
        if now is None or not same_content(now, then):
            what = "removed" if now is None else "changed"
            findings.add(io_rules.ST_CHANGED, f"{what} while it was staged", file=label)
