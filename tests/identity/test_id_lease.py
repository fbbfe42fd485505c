"""Hashing from mappings under a read lease (io/lease): a writer or a truncate that arrives
while a file is hashed is exit 3 naming it, never SIGBUS; where no lease can be held the
engine reads with pread and gives the same digests."""

from __future__ import annotations

import hashlib
import mmap
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import blake3
import numpy as np
import pytest
from identity_fixtures import force_fork, write_shard

from exl3tool.identity import engine
from exl3tool.identity.engine import Segment, hash_files, hash_segments, hash_tensors
from exl3tool.io.lease import LeasedMap, LeaseRefused
from exl3tool.io.safetensors import read_header
from exl3tool.rules.registry import Findings

# truncate(2), which waits for a lease (coreutils' truncate opens with O_NONBLOCK and fails)
TRUNCATE = "import os, sys; os.truncate(sys.argv[1], int(sys.argv[2]))"


def _lease_works(path: Path) -> bool:
    try:
        LeasedMap(path).close()
    except LeaseRefused:
        return False
    return True


@pytest.fixture(params=["lease", "pread"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "pread":
        monkeypatch.setenv("EXL3TOOL_NO_LEASE", "1")
    else:
        monkeypatch.delenv("EXL3TOOL_NO_LEASE", raising=False)
    return str(request.param)


@pytest.mark.parametrize("algo", ["sha256", "blake3"])
@pytest.mark.parametrize("threads", [1, 3, "3 forked"])
def test_mapped_windows_hash_like_reference(
    tmp_path: Path, algo: str, threads: int | str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tiny windows and batches: a job spans many mappings, windows of interleaved files are
    remapped in any order, batches never cross their hull; read with pread, a blake3 job too
    large for a READ batch is hashed alone; the same by forked workers."""
    forked = force_fork(monkeypatch) if threads == "3 forked" else None
    if forked is None:
        monkeypatch.setenv("EXL3TOOL_NO_FORK", "1")
    threads = 3 if forked is not None else int(threads)
    monkeypatch.setattr(engine, "READ", 6000)
    monkeypatch.setattr(engine, "SMALL", 3000)
    monkeypatch.setattr(engine, "MAP_WINDOW", 8192)
    monkeypatch.setattr(engine, "MAP_BATCH", 5000)
    monkeypatch.setattr(engine, "MT_READ", 12288)
    monkeypatch.setattr(engine, "MT_MIN", 30_000)
    rng = np.random.default_rng(3)
    tensors = {f"t{i}": rng.integers(0, 255, int(n), dtype=np.uint8) for i, n in
               enumerate(rng.integers(0, 40_000, 30))}  # fmt: skip
    tensors["empty"] = np.zeros(0, np.uint8)
    write_shard(tmp_path / "s.safetensors", tensors)
    st = read_header(tmp_path / "s.safetensors", Findings())
    assert st is not None
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(rng.bytes(70_001))
    b.write_bytes(rng.bytes(30_000))
    ref = {"sha256": hashlib.sha256, "blake3": blake3.blake3}[algo]
    raw = (tmp_path / "s.safetensors").read_bytes()
    got = hash_tensors(((n, st, t) for n, t in st.tensors.items()), algo, threads=threads)
    assert got == {n: ref(raw[slice(*st.span(n))]).hexdigest() for n in st.tensors}
    rows = [Segment(p, o, o + 700) for o in range(0, 28_000, 700) for p in (a, b)]
    jobs = [("rows", rows), ("a", [Segment(a, 0, 70_001)]), ("back", [Segment(a, 60_000, 69_000),
            Segment(a, 5, 6000)])]  # fmt: skip
    data = {a: a.read_bytes(), b: b.read_bytes()}
    want = {k: ref(b"".join(data[p][s:e] for p, s, e in segs)).hexdigest() for k, segs in jobs}
    assert hash_segments(jobs, algo, threads=threads) == want
    assert forked is None or (forked and min(forked) >= 1), forked


def test_a_writer_holding_the_file_open_means_pread(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(os.urandom(100_000))
    with open(p, "r+b"):
        with pytest.raises(LeaseRefused, match=r"EAGAIN|F_SETLEASE|not local|break"):
            LeasedMap(p)
        assert hash_files([p], "blake3")[p] == blake3.blake3(p.read_bytes()).hexdigest()


def test_lease_refused_for_what_is_not_a_regular_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(LeaseRefused):
        LeasedMap(tmp_path / "fifo")
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(LeaseRefused):
        LeasedMap(tmp_path / "empty")


def test_lease_holds_a_truncate_back_until_released(tmp_path: Path) -> None:
    """The kernel's side of the contract: truncate(2) waits while the lease is held, and the
    lease shows as broken meanwhile."""
    p = tmp_path / "f"
    p.write_bytes(os.urandom(1 << 20))
    try:
        m = LeasedMap(p)
    except LeaseRefused as exc:  # no leases here: the engine reads with pread (tests below)
        assert re.search("EINVAL|EACCES|EPERM|not local|Linux|lease-break-time", str(exc))
        return
    cut = subprocess.Popen([sys.executable, "-c", TRUNCATE, str(p), "10"])
    try:
        for _ in range(1000):
            if not m.intact():
                break
            time.sleep(0.01)
        assert not m.intact()
        assert cut.poll() is None and p.stat().st_size == 1 << 20  # still waiting
    finally:
        m.close()
    assert cut.wait(timeout=30) == 0
    assert p.stat().st_size == 10


# The child hashes a shard; on its first progress report it starts another process that
# truncates the shard (or opens it for writing) and waits until that process either finished
# or is held back by the lease (/proc/locks shows it BREAKING); then every worker hashes on.
# "batch": the same from inside one mapped batch (its 20th tensor), not between windows.
CHILD = """
import os, subprocess, sys, threading, time
from pathlib import Path
from exl3tool.identity import engine
from exl3tool.io.views import InputChanged
engine.DROP_EVERY = engine.MAP_WINDOW = engine.MAP_BATCH = engine.READ = 1 << 16
engine.SMALL = 1 << 15
path, what, api = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
ino = os.stat(path).st_ino
other = []
cmd = [sys.executable, "-c", sys.argv[4], str(path), "4096"] if what == "truncate" else [
    "sh", "-c", ': >> "$0"', str(path)]

lock, ready = threading.Lock(), threading.Event()


def breaking():
    try:
        with open("/proc/locks") as fh:
            return any("BREAKING" in ln and f":{ino} " in ln for ln in fh)
    except OSError:  # no /proc/locks: no leases either
        return False


class Progress:  # every worker waits here until the other process is done or held back
    def advance(self, n=1):
        with lock:
            if not other:
                other.append(subprocess.Popen(cmd))
        end = time.monotonic() + 30
        while not ready.is_set() and time.monotonic() < end:
            if other[0].poll() is not None or breaking():
                ready.set()
            time.sleep(0.005)


if api == "batch forked":  # the same in a forked worker (the other workers hash on)
    from exl3tool.io import forkpool
    engine.FORK_MIN_THREADS, engine.FORK_MIN_BYTES, engine.FORK_BYTES_PER_RSS = 2, 0, 0
    api, real = "batch", forkpool.ForkPool

    def counted(*args, **kwargs):
        print("FORKED", flush=True)
        return real(*args, **kwargs)

    forkpool.ForkPool = counted
else:
    os.environ["EXL3TOOL_NO_FORK"] = "1"
if api == "batch":  # one mapped batch holds the whole shard: the break comes inside it
    import blake3
    engine.MAP_BATCH = engine.MAP_RESIDENT = 1 << 23
    made = []

    def ctor(data):
        made.append(1)
        if len(made) == 20:
            Progress().advance()
        return blake3.blake3(data)

    engine._constructor = lambda algo: ctor
try:
    if api == "files":
        out = engine.hash_files([path], "blake3", threads=2, progress=Progress())
    else:
        from exl3tool.io.safetensors import read_header
        from exl3tool.rules.registry import Findings
        st = read_header(path, Findings())
        out = engine.hash_tensors([(n, st, t) for n, t in st.tensors.items()], "blake3",
                                  threads=2, progress=Progress())
except InputChanged as exc:
    print("CHANGED", exc)
    sys.exit(3)
finally:
    if other:
        other[0].wait(60)
print("DIGESTS", len(out))
"""


@pytest.mark.parametrize("api", ["files", "tensors", "batch", "batch forked"])
@pytest.mark.parametrize("what", ["truncate", "open for writing"])
def test_change_while_hashed_is_exit_3_never_sigbus(
    tmp_path: Path, mode: str, what: str, api: str
) -> None:
    """Issue 15 under leases: a second process that truncates the shard while it is hashed
    gives exit 3 naming it (with or without a lease), never a signal; one that only opens it
    for writing breaks the lease (exit 3) or, read with pread, changes nothing (digests)."""
    shard = tmp_path / "m.safetensors"
    rng = np.random.default_rng(5)
    write_shard(shard, {f"t{i}": rng.integers(0, 255, 40_000, dtype=np.uint8) for i in range(100)})
    leased = mode == "lease" and _lease_works(shard)
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(shard), what.split()[0], api,
         TRUNCATE],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode >= 0, f"killed by signal {signal.Signals(-r.returncode).name}: {r.stderr}"
    assert ("FORKED" in r.stdout) == (api == "batch forked"), r.stdout
    if what == "truncate" or leased:
        assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
        assert "CHANGED" in r.stdout and "m.safetensors" in r.stdout
    else:
        assert r.returncode == 0 and "DIGESTS" in r.stdout, (r.returncode, r.stdout, r.stderr)


def test_the_harness_sees_sigbus(tmp_path: Path) -> None:
    """Control: the same truncation under an unguarded mapping is a signal death, which the
    test above would report."""
    p = tmp_path / "f"
    p.write_bytes(os.urandom(1 << 20))
    code = (
        "import mmap, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
        "m = mmap.mmap(fd, 0, access=mmap.ACCESS_READ); os.truncate(sys.argv[1], 0); m[500_000]"
    )
    r = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, timeout=60)
    assert r.returncode == -signal.SIGBUS


def _resident_kb(path: Path) -> int:
    """Resident kB of this process's mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
            inside = len(head) >= 6 and head[5] == str(path)
        elif inside and line.startswith("Rss:"):
            total += int(head[1])
    return total


def _evict(path: Path) -> None:
    """Write `path` back and drop its cached pages (where the file system allows)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_the_whole_mapping_drops_the_pages_it_was_done_with(tmp_path: Path) -> None:
    p = tmp_path / "f"
    data = os.urandom(8 << 20)
    p.write_bytes(data)
    try:
        m = LeasedMap(p)
    except LeaseRefused:
        pytest.skip("no read lease on this file system: the engine reads with pread")
    try:
        view = m.whole()
        assert m.whole() is view  # mapped once for every reader
        assert blake3.blake3(view).digest() == blake3.blake3(data).digest()
        assert _resident_kb(p) >= 7 << 10
        m.drop(4096 + 1, 6 << 20)  # from inside the second page
        assert 1 << 10 < _resident_kb(p) < 3 << 10
        m.drop(0, 8 << 20)
        assert _resident_kb(p) == 0
        assert bytes(view[5 << 20 : (5 << 20) + 64]) == data[5 << 20 : (5 << 20) + 64]  # read again
    finally:
        view.release()
        m.close()
    assert _resident_kb(p) == 0  # unmapped


def test_a_drop_covers_every_large_folio_its_range_touches(tmp_path: Path) -> None:
    """A fault maps the whole page-cache folio it lands in (up to 2 MiB; Linux 6.16+ builds
    them for ext4 files written tensor by tensor). A drop widened to 64 KiB left the part of
    the folio below its block mapped at every drop point: 16 GB hashed by 16 workers kept ~40
    MB more resident, growing with the bytes hashed. The range is widened to 2 MiB blocks."""
    p = tmp_path / "f"
    p.write_bytes(bytes(9 << 20))
    try:
        m = LeasedMap(p)
    except LeaseRefused:
        pytest.skip("no read lease on this file system: the engine reads with pread")
    calls: list[tuple[int, int]] = []
    try:
        view = m.whole()
        real = m._map
        assert real is not None

        class Spy:
            def madvise(self, advice: int, start: int, length: int) -> None:
                assert advice == mmap.MADV_DONTNEED
                calls.append((start, start + length))
                real.madvise(advice, start, length)

        m._map = Spy()  # type: ignore[assignment]
        try:
            m.drop((3 << 20) + 5000, (5 << 20) + 1)  # inside 2 MiB blocks 1 and 2
            m.drop((8 << 20) + 1, 9 << 20)  # the last block ends at the file's end
            m.drop(7, 7)  # nothing
        finally:
            m._map = real
    finally:
        view.release()
        m.close()
    assert calls == [(2 << 20, 6 << 20), (8 << 20, 9 << 20)]


def test_a_mapped_batch_drops_its_pages_as_it_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One 16 MB batch of a leased shard: the pages a worker hashed are dropped every
    MAP_RESIDENT / threads bytes, not only when the batch ends (resident memory stays near
    MAP_RESIDENT whatever the batch size), none stays resident once hashed (resident memory
    that grew with the input's size) and every digest is still right."""
    p = tmp_path / "m.safetensors"
    rng = np.random.default_rng(11)
    write_shard(
        p, {f"t{i:02d}": rng.integers(0, 255, 256 << 10, dtype=np.uint8) for i in range(64)}
    )
    try:
        LeasedMap(p).close()
    except LeaseRefused:
        pytest.skip("no read lease on this file system: the engine reads with pread")
    _evict(p)  # read back through readahead, which builds large folios where the kernel can
    monkeypatch.delenv("EXL3TOOL_NO_LEASE", raising=False)
    monkeypatch.setattr(engine, "MAP_WINDOW", 1 << 20)
    monkeypatch.setattr(engine, "MAP_RESIDENT", 1 << 20)
    resident: list[int] = []

    def ctor(data: object) -> object:
        resident.append(_resident_kb(p))
        return blake3.blake3(data)

    monkeypatch.setattr(engine, "_constructor", lambda algo: ctor)
    batches: list[int] = []
    batch = engine._Worker.batch

    def counted(self: engine._Worker, b: engine._Batch, out: list[object]) -> None:
        batches.append(len(b.jobs))
        batch(self, b, out)

    monkeypatch.setattr(engine._Worker, "batch", counted)
    at_close: list[int] = []
    close_all = engine._close_all

    def closing(files: dict[Path, engine._File]) -> None:
        at_close.append(_resident_kb(p))
        close_all(files)

    monkeypatch.setattr(engine, "_close_all", closing)
    st = read_header(p, Findings())
    assert st is not None
    got = hash_tensors(((n, st, t) for n, t in st.tensors.items()), "blake3", threads=1)
    assert batches == [64]  # one mapped batch (MAP_BATCH), however small MAP_RESIDENT is
    raw = p.read_bytes()
    assert got == {
        n: blake3.blake3(raw[st.data_start + t.begin : st.data_start + t.end]).hexdigest()
        for n, t in st.tensors.items()
    }
    assert len(resident) == 64 and max(resident) >= 512  # the batch was hashed mapped
    assert max(resident) < 4 << 10, resident  # 1 MB between drops, plus a tensor and a window
    # nothing left behind: a drop covers the pages a fault mapped beyond its range's edges
    # (the fault-around block, or the whole large folio of Linux 6.16+ ext4 and tmpfs)
    assert at_close == [0]
