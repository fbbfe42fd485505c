"""Forked workers (io/forkpool): every unit once, results and progress in the parent, the first
error raised there with its type, a killed worker reported, and no worker left behind."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

from exl3tool.io import forkpool
from exl3tool.io.forkpool import ForkPool, WorkerDied
from exl3tool.rules.errors import InputError

pytestmark = pytest.mark.skipif(not forkpool.available(), reason="fork pools are Linux-only")


class Counter:
    def __init__(self) -> None:
        self.n = 0
        self._lock = threading.Lock()

    def advance(self, n: int) -> None:
        with self._lock:
            self.n += n


FORKED: list[int] = []  # the worker pids this test's pools forked


@pytest.fixture(autouse=True)
def _own_pids() -> None:
    FORKED.clear()


def _reaped(pids: Any) -> bool:
    """Whether each of `pids` is no longer a child of this process (it was waited for)."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue
        return False
    return True


def _no_children_left() -> bool:
    return _reaped(FORKED)


def _run(units: list[Any], work: Any, workers: int = 3) -> tuple[list[Any], Counter]:
    got: list[Any] = []
    progress = Counter()

    def start(forward: Any) -> Any:
        def one(unit: Any) -> Any:
            forward.advance(unit)
            return work(unit)

        return one

    pool = ForkPool(workers, units, start, got.append, progress)
    FORKED.extend(pool.pids)
    try:
        pool.wait()
    finally:
        pool.close()
    return got, progress


def test_every_unit_once_by_workers_that_are_other_processes() -> None:
    parent = os.getpid()

    def work(u: int) -> tuple[int, int, int]:
        time.sleep(0.005)  # 1 s of work in all: every worker takes some units, even under load
        return u, u * u, os.getpid()

    got, progress = _run(list(range(200)), work)
    assert sorted((u, sq) for u, sq, _ in got) == [(u, u * u) for u in range(200)]
    pids = {pid for *_, pid in got}
    assert parent not in pids and len(pids) == 3
    assert progress.n == sum(range(200))
    assert _no_children_left()


def test_more_workers_than_units_forks_one_per_unit() -> None:
    pool = ForkPool(8, ["a", "b"], lambda _: str.upper, lambda _: None, Counter())
    try:
        assert pool.size == 2
        pool.wait()
    finally:
        pool.close()


def test_no_units_fork_nothing() -> None:
    pool = ForkPool(4, [], lambda _: str, lambda _: None, Counter())
    assert pool.size == 0
    pool.wait()
    pool.close()


def test_a_worker_error_is_raised_with_its_type_and_the_others_stop() -> None:
    def work(u: int) -> int:
        if u == 7:
            raise InputError("shard-7: changed while it was read")
        time.sleep(0.05)
        return u

    t = time.monotonic()
    with pytest.raises(InputError, match="shard-7: changed"):
        _run(list(range(400)), work)
    assert time.monotonic() - t < 3  # 400 x 50 ms / 3 workers = 6.7 s had they not been stopped
    assert _no_children_left()


def test_an_error_that_cannot_be_pickled_still_reaches_the_parent() -> None:
    class Odd(Exception):
        def __init__(self, a: int, b: int) -> None:  # args that pickle cannot rebuild from
            super().__init__(f"odd {a} {b}")
            self.fn = lambda: a

    def work(u: int) -> int:
        raise Odd(u, 2)

    with pytest.raises(RuntimeError, match="Odd: odd"):
        _run([1, 2, 3], work)
    assert _no_children_left()


class NeedsTwo(Exception):
    def __init__(self, a: int, b: int) -> None:  # pickles, but cannot be rebuilt from args
        super().__init__(f"needs two: {a}")


def test_an_error_the_parent_could_not_rebuild_arrives_as_text() -> None:
    def work(u: int) -> int:
        raise NeedsTwo(u, 2)

    with pytest.raises(RuntimeError, match="NeedsTwo: needs two"):
        _run([1, 2, 3], work)
    assert _no_children_left()


def test_a_killed_worker_is_worker_died_exit_3() -> None:
    def work(u: int) -> int:
        if u == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return u

    with pytest.raises(WorkerDied, match="killed by signal 9") as info:
        _run(list(range(10)), work)
    assert info.value.exit_code == 3
    assert _no_children_left()


def test_close_stops_busy_workers_at_once() -> None:
    pool = ForkPool(3, list(range(30)), lambda _: time.sleep, lambda _: None, Counter())
    FORKED.extend(pool.pids)
    t = time.monotonic()
    pool.close()  # as after an interrupt in the parent: 30 units of 1 s are not waited for
    assert time.monotonic() - t < 5
    assert _no_children_left()


def test_a_worker_ignores_sigint_its_parent_stops_it() -> None:
    """Ctrl-C reaches the whole process group: a worker must not unwind into the caller's
    code; it keeps working until the parent stops it."""

    def work(u: int) -> int:
        if u == 0:
            os.kill(os.getpid(), signal.SIGINT)
        return u

    got, _ = _run(list(range(5)), work)
    assert sorted(got) == list(range(5))


def test_a_pool_forked_from_a_worker_thread() -> None:
    """A caller that hashes on a thread of its own forks from that thread: the worker sets its
    signals as the main thread of its own process."""
    out: list[Any] = []

    def caller() -> None:
        out.append(_run(list(range(20)), lambda u: u * 2)[0])

    t = threading.Thread(target=caller)
    t.start()
    t.join()
    assert sorted(out[0]) == [u * 2 for u in range(20)]
    assert _no_children_left()
