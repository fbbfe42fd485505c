"""The campaign engine: cases run in forked workers, one fork per batch, with a watchdog.

Each case is classified as `ok` (findings or a clean exl3tool error: exit 1/2/3), `uncaught`
(an exception other than exl3tool's own, or a `check-crashed` finding of a family boundary),
`timeout` (over `timeout` seconds: a per-case SIGALRM in the worker, and a parent watchdog for
code that never returns to Python), `memory` (MemoryError under RLIMIT_AS, or a peak RSS that
grew by over `memory` bytes from the fork) or `signal` (the worker died: SIGBUS, SIGSEGV, ...).
A worker that dies or is killed is replaced; its batch goes on after the culprit case.
"""

from __future__ import annotations

import contextlib
import os
import resource
import selectors
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fuzz.targets import (
    build_seeds,
    call_entry,
    clean,
    crashed,
    make_case,
    materialize,
    snapshot,
)

BAD = ("uncaught", "timeout", "memory", "signal", "harness")


class CaseTimeout(BaseException):
    """Raised by the per-case SIGALRM (a BaseException: `except Exception` cannot swallow it)."""


@dataclass(frozen=True)
class Limits:
    timeout: float = 10.0
    memory: int = 1 << 30
    grace: float = 5.0  # the parent kills a worker silent for timeout + grace seconds


@dataclass
class Summary:
    seed: int
    cases: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    by_entry: dict[str, int] = field(default_factory=dict)
    bad: list[dict[str, Any]] = field(default_factory=list)
    max_case_s: float = 0.0
    max_rss: int = 0
    seconds: float = 0.0
    started: float = field(default_factory=time.perf_counter)

    def record(self, index: int, cls: str, seconds: float, rss: int, detail: str) -> None:
        self.cases += 1
        self.counts[cls] = self.counts.get(cls, 0) + 1
        self.max_case_s = max(self.max_case_s, seconds)
        self.max_rss = max(self.max_rss, rss)
        if cls in BAD and len(self.bad) < 200:
            self.bad.append({"case": index, "class": cls, "seconds": seconds, "detail": detail})

    @property
    def n_bad(self) -> int:
        return sum(self.counts.get(c, 0) for c in BAD)

    def to_json(self) -> dict[str, Any]:
        seconds = self.seconds or time.perf_counter() - self.started  # 0 while running
        return {
            "seed": self.seed,
            "cases": self.cases,
            "counts": self.counts,
            "bad": self.n_bad,
            "max_case_seconds": round(self.max_case_s, 3),
            "max_rss_mib": round(self.max_rss / 2**20, 1),
            "seconds": round(seconds, 1),
            "cases_per_second": round(self.cases / seconds, 1) if seconds else None,
            "bad_cases": self.bad,
        }


class World:
    """Seeds and their pristine copies (the base a cartridge is staged on and the reverse, what
    `diff` compares a mutant with), built once in the parent and inherited by every fork."""

    def __init__(self, root: Path) -> None:
        self.root = root
        arts = build_seeds(root / "seeds")
        self.layouts = {k: snapshot(p) for k, p in arts.items()}
        self.pristine = dict(arts)


def _one(world: World, seed: int, index: int, work: Path, limits: Limits) -> tuple[str, str]:
    from exl3tool.rules.errors import Exl3ToolError

    try:
        case = make_case(seed, index, world.layouts)
        clean(work)
        art = work / "a"
        materialize(case.layout, art)
    except Exception as exc:  # a bug of the harness, not of exl3tool: reported apart
        return "harness", f"{type(exc).__name__}: {exc!s:.200}"
    signal.setitimer(signal.ITIMER_REAL, limits.timeout)
    try:
        hit = crashed(call_entry(case, art, world.pristine, work / "out"))
        return ("uncaught", f"{case.entry} {case.what} -> {hit}") if hit else ("ok", "")
    except Exl3ToolError:
        return "ok", ""
    except CaseTimeout:
        return "timeout", f"{case.entry} {case.what}"
    except MemoryError:
        return "memory", f"{case.entry} {case.what}"
    except Exception as exc:
        tb = traceback.extract_tb(exc.__traceback__)[-3:]
        at = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb))
        return "uncaught", f"{case.entry} {case.what} -> {type(exc).__name__}: {exc!s:.200} at {at}"
    finally:  # an alarm landing here (after the call returned) is not the case's
        with contextlib.suppress(CaseTimeout):
            signal.setitimer(signal.ITIMER_REAL, 0)


def _alarm(signum: int, frame: Any) -> None:
    raise CaseTimeout()


def _child(world: World, seed: int, cases: list[int], work: Path, wfd: int, limits: Limits) -> None:
    import faulthandler

    faulthandler.disable()  # a signal death is classified here, not dumped on pytest's stderr
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    signal.signal(signal.SIGALRM, _alarm)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    with open("/proc/self/statm") as fh:
        vm = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (vm + limits.memory, vm + limits.memory))
    # a fork starts with its parent's resident pages (a large pytest process: 1 GiB and more)
    # and reports them as its own: a case's memory is its growth beyond them
    start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    for i in cases:
        t0 = time.perf_counter()
        cls, detail = _one(world, seed, i, work, limits)
        dt = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        if rss - start_rss > limits.memory and cls == "ok":
            cls, detail = "memory", f"peak RSS {rss >> 20} MiB (from {start_rss >> 20} MiB)"
        detail = detail.replace("\t", " ").replace("\n", " ").encode("ascii", "backslashreplace")
        os.write(wfd, f"{i}\t{cls}\t{dt:.4f}\t{rss}\t".encode() + detail + b"\n")
        if cls in ("memory", "timeout"):
            break  # a fresh process for the rest of the batch
    clean(work)


@dataclass
class _Slot:
    pid: int
    fd: int
    pending: list[int]
    work: Path
    last: float
    buf: bytes = b""
    killed: bool = False  # by the watchdog, after its culprit was recorded


def _fork(world: World, seed: int, cases: list[int], work: Path, limits: Limits) -> _Slot:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(r)
            _child(world, seed, cases, work, w, limits)
        except BaseException:
            code = 70
        finally:
            os._exit(code)
    os.close(w)
    return _Slot(pid, r, list(cases), work, time.monotonic())


def _drain(slot: _Slot, summary: Summary) -> bool:
    """Read what the worker reported; False at EOF."""
    data = os.read(slot.fd, 1 << 16)
    if not data:
        return False
    slot.last = time.monotonic()
    slot.buf += data
    *lines, slot.buf = slot.buf.split(b"\n")
    for line in lines:
        i, cls, dt, rss, detail = line.decode("ascii").split("\t", 4)
        summary.record(int(i), cls, float(dt), int(rss), detail)
        slot.pending.remove(int(i))
    return True


def _reap(slot: _Slot, summary: Summary) -> list[int]:
    """The worker ended: the first unreported case is the culprit; returns the rest."""
    _, status = os.waitpid(slot.pid, 0)
    os.close(slot.fd)
    if not slot.pending or slot.killed:
        return slot.pending
    culprit, rest = slot.pending[0], slot.pending[1:]
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        summary.record(culprit, "signal", -1.0, 0, f"worker died of {name}")
    elif os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0:
        summary.record(culprit, "uncaught", -1.0, 0, f"worker exit {os.WEXITSTATUS(status)}")
    else:
        return slot.pending  # it stopped early by itself (after a memory or timeout case)
    return rest


def run(
    cases: int,
    seed: int,
    workers: int,
    *,
    start: int = 0,
    batch: int = 250,
    limits: Limits = Limits(),
    root: Path | None = None,
    progress: Any = None,
    deadline: float | None = None,
) -> Summary:
    """Run cases [start, start + cases) of campaign `seed` on `workers` forked workers;
    after `deadline` seconds no new batch starts (the summary says how many cases ran)."""
    shm = Path("/dev/shm")
    tmp = Path(tempfile.mkdtemp(prefix="exl3fuzz-", dir=root or (shm if shm.is_dir() else None)))
    summary = Summary(seed)
    t0 = time.perf_counter()
    try:
        world = World(tmp)
        _warm(world, seed, tmp / "warm", limits)
        queue = [
            list(range(a, min(a + batch, start + cases)))
            for a in range(start, start + cases, batch)
        ]
        stop = None if deadline is None else time.monotonic() + deadline
        _loop(world, seed, queue, workers, tmp, limits, summary, progress, stop)
    finally:
        clean(tmp)
        summary.seconds = time.perf_counter() - t0
    return summary


def _warm(world: World, seed: int, work: Path, limits: Limits) -> None:
    """Import every entry point's modules before forking (each fork starts warm)."""
    for i in range(12):
        with contextlib.suppress(BaseException):
            _one(world, seed, -1 - i, work, limits)
    clean(work)


def _loop(
    world: World,
    seed: int,
    queue: list[list[int]],
    workers: int,
    tmp: Path,
    limits: Limits,
    summary: Summary,
    progress: Any,
    stop: float | None = None,
) -> None:
    sel = selectors.DefaultSelector()
    free = [tmp / f"w{n}" for n in range(workers)]
    live: dict[int, _Slot] = {}
    while queue or live:
        if stop is not None and time.monotonic() > stop:
            queue.clear()  # the deadline: live batches finish, no new one starts
        while queue and free:
            slot = _fork(world, seed, queue.pop(0), free.pop(), limits)
            live[slot.fd] = slot
            sel.register(slot.fd, selectors.EVENT_READ)
        for key, _ in sel.select(timeout=min(1.0, limits.grace)):
            slot = live[key.fd]
            if not _drain(slot, summary):
                sel.unregister(slot.fd)
                del live[slot.fd]
                rest = _reap(slot, summary)
                if rest:
                    queue.insert(0, rest)
                free.append(slot.work)
                if progress is not None:
                    progress(summary)
        now = time.monotonic()
        for slot in list(live.values()):
            if now - slot.last > limits.timeout + limits.grace:  # stuck outside Python: kill it
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.pid, signal.SIGKILL)
                slot.last = now + 3600
                _killed_case(slot, summary)


def _killed_case(slot: _Slot, summary: Summary) -> None:
    slot.killed = True
    if slot.pending:
        culprit = slot.pending.pop(0)
        summary.record(culprit, "timeout", -1.0, 0, "killed by the watchdog")
