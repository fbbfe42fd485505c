"""The one worker pool: order, parallelism, and errors raised in the caller's thread."""

from __future__ import annotations

import threading

import pytest

from exl3tool.io.workers import map_threads, run_threads


def test_map_keeps_input_order_and_uses_the_workers() -> None:
    names: set[str] = set()
    barrier = threading.Barrier(3, timeout=10)

    def square(x: int) -> int:
        names.add(threading.current_thread().name)
        if x < 3:
            barrier.wait()  # three calls are in flight at once: three threads
        return x * x

    assert map_threads(square, range(10), workers=3, name="t") == [x * x for x in range(10)]
    assert len(names) == 3 and all(n.startswith("t-") for n in names)


def test_map_of_nothing_and_one_worker() -> None:
    assert map_threads(str, [], workers=4) == []
    assert map_threads(str, [1, 2], workers=1) == ["1", "2"]


def test_errors_reach_the_caller() -> None:
    def boom(x: int) -> int:
        if x == 5:
            raise OSError("shard 5 vanished")
        return x

    with pytest.raises(OSError, match="shard 5"):
        map_threads(boom, range(10), workers=4)
    ran: list[int] = []
    with pytest.raises(ValueError, match="second"):
        run_threads([lambda: ran.append(1), lambda: (_ for _ in ()).throw(ValueError("second"))])
    assert ran == [1]
