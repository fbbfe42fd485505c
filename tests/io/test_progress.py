"""The progress helper: a no-op off a terminal, a thread-safe rich bar on one."""

from __future__ import annotations

import io
import sys
import threading

import pytest

from exl3tool.io import progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_noop_when_stderr_is_not_a_tty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with progress.progress_bar(100, "hashing") as bar:
        bar.advance(10)
    assert bar is progress.NO_PROGRESS
    assert sys.stderr.getvalue() == ""


@pytest.mark.parametrize("how", ["quiet", "env", "dumb"])
def test_silenced(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    monkeypatch.setattr(sys, "stderr", _Tty())
    if how == "quiet":
        monkeypatch.setattr(progress, "_quiet", False)  # restored to this after the test
        progress.set_quiet(True)
    elif how == "env":
        monkeypatch.setenv("EXL3TOOL_NO_PROGRESS", "1")
    else:
        monkeypatch.setenv("TERM", "dumb")
    assert not progress.enabled()
    with progress.progress_bar(5, "x", unit="files") as bar:
        bar.advance()
    assert bar is progress.NO_PROGRESS


def test_bar_on_a_tty_counts_every_advance_from_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXL3TOOL_NO_PROGRESS", raising=False)
    monkeypatch.delenv("TERM", raising=False)
    monkeypatch.setattr(progress, "_quiet", False)
    monkeypatch.setattr(sys, "stderr", _Tty())
    assert progress.enabled()
    n_threads, per = 8, 500
    with progress.progress_bar(n_threads * per, "hashing") as bar:
        assert bar is not progress.NO_PROGRESS

        def work() -> None:
            for _ in range(per):
                bar.advance(1)

        threads = [threading.Thread(target=work) for _ in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        task = bar._progress.tasks[0]  # type: ignore[attr-defined]
        assert task.completed == n_threads * per


def test_a_callable_total_is_called_only_when_a_bar_is_drawn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []

    def total() -> int:
        calls.append(1)
        return 40

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with progress.progress_bar(total, "hashing") as bar:
        bar.advance(10)
    assert bar is progress.NO_PROGRESS and not calls
    monkeypatch.delenv("EXL3TOOL_NO_PROGRESS", raising=False)
    monkeypatch.delenv("TERM", raising=False)
    monkeypatch.setattr(progress, "_quiet", False)
    monkeypatch.setattr(sys, "stderr", _Tty())
    with progress.progress_bar(total, "hashing") as bar:
        bar.advance(10)
        assert bar._progress.tasks[0].total == 40  # type: ignore[attr-defined]
    assert calls == [1]
