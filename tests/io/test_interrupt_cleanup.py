"""An interrupt never leaves a thread writing into a temporary that is being removed, a cleanup
half done, or a killed run's temporary for good."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from exl3tool.cli import signals
from exl3tool.io import atomic
from exl3tool.io.workers import Background, Worker, join_all, map_threads
from exl3tool.rules.errors import Interrupted, interrupts_deferred
from exl3tool.tp.pipeline import run_pipeline

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _interrupt_soon(delay: float = 0.05) -> threading.Timer:
    """SIGINT to the main thread in `delay` s (to the thread itself: a signal the kernel gave
    another thread would not wake it from its wait); Python raises it there."""
    main = threading.main_thread().ident
    assert main is not None
    timer = threading.Timer(delay, signal.pthread_kill, (main, signal.SIGINT))
    timer.start()
    return timer


def test_an_interrupt_while_joining_stops_and_waits_for_every_thread() -> None:
    stop = threading.Event()
    ended: list[str] = []

    def work(name: str) -> None:
        stop.wait(10)  # (bounded: a lost signal fails the test, never hangs it)
        time.sleep(0.05)  # what a writer does after it was asked to stop: finish its chunk
        ended.append(name)

    threads = [Worker(partial(work, n), f"test-{n}") for n in "ab"]
    for t in threads:
        t.start()
    _interrupt_soon()
    with pytest.raises(KeyboardInterrupt):
        join_all(threads, stop.set)
    assert sorted(ended) == ["a", "b"]  # every thread ended before the interrupt was raised


def test_map_threads_stops_the_items_under_way_on_an_interrupt() -> None:
    halted = threading.Event()
    started: list[int] = []

    def item(i: int) -> int:
        started.append(i)
        halted.wait(2)  # (bounded: a lost signal fails the test within 10 s, never hangs it)
        return i

    _interrupt_soon()
    with pytest.raises(KeyboardInterrupt):
        map_threads(item, range(10), 2, stop=halted.set)
    assert len(started) == 2  # no new item after the interrupt


def test_the_slicing_pipeline_raises_an_interrupt_only_once_its_threads_are_done() -> None:
    """The slice's reader and consumers write into a temporary output: none may still run
    when the interrupt reaches `atomic_dir`, which then removes the temporary."""
    taken: list[int] = []

    def read(b: int, buf: np.ndarray) -> None:
        time.sleep(0.01)
        buf[:] = b % 256

    def take(b: int, buf: np.ndarray) -> None:
        taken.append(b)

    _interrupt_soon(0.05)
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(
            range(1_000), read, [take, take], size=64, depth=2, threaded=True, done=lambda b: None
        )
    slicers = [t for t in threading.enumerate() if t.name.startswith("exl3slice")]
    assert all(isinstance(t, Worker) and t.finished.is_set() for t in slicers)
    assert 0 < len(taken) < 2_000


def test_a_signal_during_a_deferred_cleanup_is_raised_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(signals, "_fired", False)
    steps: list[str] = []
    with pytest.raises(Interrupted) as got, interrupts_deferred():
        signals._handler(signal.SIGTERM, None)  # as Python would call it, mid-cleanup
        steps.append("cleanup finished")
    assert steps == ["cleanup finished"] and got.value.exit_code == 143
    monkeypatch.setattr(signals, "_fired", False)
    with pytest.raises(Interrupted):  # outside a deferred block: raised at once
        signals._handler(signal.SIGINT, None)


def test_a_background_reader_is_left_by_an_interrupted_caller() -> None:
    gate = threading.Event()
    job = Background(lambda: gate.wait(5) and 42)
    gate.set()
    assert job.result() == 42
    failing = Background(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failing.result()


def test_a_killed_writers_temporary_file_is_removed_by_the_next_run(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    stale = tmp_path / ".report.json.tmp-killed"
    stale.write_bytes(b"half")
    os.utime(stale, (1e9, 1e9))
    live = tmp_path / ".report.json.tmp-live"
    live.write_bytes(b"writing")
    os.utime(live, (1e9, 1e9))  # old, but held by a run that is still writing it
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        atomic.write_bytes_atomic(target, b"{}")
    finally:
        os.close(fd)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".report.json.tmp-live", "report.json"]


def test_an_interrupt_at_the_lock_leaves_no_lock_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal arrives between creating `.NAME.lock` and holding it: held back, then
    raised with the file removed."""
    monkeypatch.setattr(signals, "_fired", False)
    real_flock = fcntl.flock

    def flock(fd: int, op: int) -> None:
        real_flock(fd, op)
        if op & fcntl.LOCK_NB:
            signals._handler(signal.SIGINT, None)

    monkeypatch.setattr(fcntl, "flock", flock)
    with pytest.raises(Interrupted):
        atomic.write_bytes_atomic(tmp_path / "out.json", b"{}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("at", ["mkdir", "lock"])
def test_an_interrupt_as_the_temporary_folder_is_made_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: str
) -> None:
    """The signal arrives right after `.NAME.tmp-*` is made, or as it is locked: held back,
    then raised with the folder removed (an empty one was left beside the output)."""
    monkeypatch.setattr(signals, "_fired", False)
    real_mkdir, real_lock = os.mkdir, atomic._lock_dir

    def mkdir(path: object, mode: int = 0o777) -> None:
        real_mkdir(path, mode)  # type: ignore[arg-type]
        if at == "mkdir":
            signals._handler(signal.SIGTERM, None)

    def lock(path: Path, *args: object, **kw: object) -> object:
        fd = real_lock(path, *args, **kw)  # type: ignore[arg-type]
        if at == "lock":
            signals._handler(signal.SIGTERM, None)
        return fd

    monkeypatch.setattr(atomic.os, "mkdir", mkdir)
    monkeypatch.setattr(atomic, "_lock_dir", lock)
    with pytest.raises(Interrupted), atomic.atomic_dir(tmp_path / "out") as tmp:
        (tmp / "x").write_bytes(b"never")
    assert list(tmp_path.iterdir()) == []


def test_only_the_main_thread_holds_interrupts_back() -> None:
    """Python runs signal handlers in the main thread: a cleanup in another thread must not
    make the main thread's interrupt wait for it (nor be raised in that thread)."""
    from exl3tool.rules.errors import defer_interrupt

    inside, seen = threading.Event(), []

    def cleanup() -> None:
        with interrupts_deferred():
            inside.set()
            time.sleep(0.2)

    t = threading.Thread(target=cleanup)
    t.start()
    inside.wait(5)
    seen.append(defer_interrupt(signal.SIGINT))
    t.join()
    assert seen == [False]


def test_a_signal_inside_an_import_is_delivered_again_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Raised inside the import system, Interrupted could leave an import lock held and hang
    the next thread that imports (a slice interrupted while a worker imported blake3 did): the
    handler sends the signal again once the import is done, then raises it."""
    import importlib
    import sys

    monkeypatch.setattr(signals, "_fired", False)
    monkeypatch.setattr(signals, "_retries", [0])
    sent: list[tuple[float, object]] = []

    class Timer:  # records the retry instead of sending a signal to the test process
        def __init__(self, delay: float, fn: object, args: tuple) -> None:
            sent.append((delay, args[1]))
            self.daemon = False

        def start(self) -> None:
            pass

    monkeypatch.setattr(threading, "Timer", Timer)
    other = threading.Event()
    worker = threading.Thread(target=other.wait, daemon=True)  # a thread that could wait
    worker.start()  # on a lock the interrupt left held
    (tmp_path / "interrupted_mid_import.py").write_text(
        "import signal, sys\n"
        "from exl3tool.cli import signals\n"
        "signals._handler(signal.SIGINT, sys._getframe())  # as Python would call it here\n"
        "DONE = True\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("interrupted_mid_import")
    assert mod.DONE and sent == [(signals.RETRY_S, signal.SIGINT)]
    sys.modules.pop("interrupted_mid_import", None)
    with pytest.raises(Interrupted):  # the signal sent again, outside any import
        signals._handler(signal.SIGINT, sys._getframe())
    monkeypatch.setattr(signals, "_fired", False)
    monkeypatch.setattr(signals, "_retries", [signals.MAX_RETRIES])
    with pytest.raises(Interrupted):  # the retries spent: raised even inside an import
        _import_raising(tmp_path, "interrupted_again")
    monkeypatch.setattr(signals, "_fired", False)
    monkeypatch.setattr(signals, "_retries", [0])
    other.set()
    worker.join()  # no other thread now: one started later could wait on a leaked lock too
    (tmp_path / "interrupted_alone.py").write_text(
        "import signal, sys\n"
        "from exl3tool.cli import signals\n"
        "signals._handler(signal.SIGTERM, sys._getframe())\n"
    )
    importlib.import_module("interrupted_alone")
    assert sent[-1] == (signals.RETRY_S, signal.SIGTERM)


def test_a_signal_in_set_name_or_in_threading_is_delivered_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Raised in a class body's `__set_name__`, Interrupted becomes a RuntimeError traceback;
    raised inside Thread.start, "release unlocked lock": both are sent again instead."""
    monkeypatch.setattr(signals, "_fired", False)
    monkeypatch.setattr(signals, "_retries", [0])
    sent: list[object] = []

    class Timer:
        def __init__(self, delay: float, fn: object, args: tuple) -> None:
            sent.append(args[1])
            self.daemon = False

        def start(self) -> None:
            pass

    monkeypatch.setattr(threading, "Timer", Timer)

    class Field:
        def __set_name__(self, owner: type, name: str) -> None:
            signals._handler(signal.SIGINT, sys._getframe())

    class Holder:  # its creation calls __set_name__
        f = Field()

    def in_thread_start() -> None:  # a frame of threading.py's Thread.start
        src = "def start():\n    signals._handler(signal.SIGINT, sys._getframe())\nstart()\n"
        exec(
            compile(src, threading.__file__, "exec"),
            {"signals": signals, "signal": signal, "sys": sys},
        )

    in_thread_start()
    assert sent == [signal.SIGINT, signal.SIGINT]
    with pytest.raises(Interrupted):  # a wait elsewhere in threading: raised as always
        src = "def wait():\n    signals._handler(signal.SIGINT, sys._getframe())\nwait()\n"
        exec(
            compile(src, threading.__file__, "exec"),
            {"signals": signals, "signal": signal, "sys": sys},
        )


def _import_raising(tmp_path: Path, name: str) -> None:
    import importlib

    (tmp_path / f"{name}.py").write_text(
        "import signal, sys\n"
        "from exl3tool.cli import signals\n"
        "signals._handler(signal.SIGINT, sys._getframe())\n"
    )
    importlib.import_module(name)


def test_a_signal_the_command_went_on_past_ends_it_as_interrupted(tmp_path: Path) -> None:
    """Sent again after the last import of a short command, the signal would come after the
    command ended: the entry point ends it as interrupted (130, one line) all the same."""
    child = (
        "import os, signal, sys\n"
        "class Hook:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'exl3tool.report.text':\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Hook())\n"
        "import threading; threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
        f"sys.argv = ['exl3tool', 'validate', {str(EXAMPLES / 'r7-tiny')!r}]\n"
        "from exl3tool.cli import entry\n"
        "entry()\n"
    )
    got = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert got.returncode == 130, got.stderr
    assert got.stderr.strip() == "exl3tool: interrupted"
