"""The ranks start with SIGINT and SIGTERM blocked, even when the first spawn starts
multiprocessing's resource tracker (whose start unblocks both in the calling thread)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import signal
from multiprocessing import resource_tracker
from exl3tool.runtime.distributed import _signals_held

with _signals_held():
    resource_tracker.getfd()  # what the first spawned rank's launch does before its fork
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    print(signal.SIGINT in blocked, signal.SIGTERM in blocked)
print(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))
"""


def test_the_resource_tracker_start_keeps_the_signals_held() -> None:
    pytest.importorskip("torch")
    # a fresh interpreter: no resource tracker runs yet
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["True", "True", "False"], out.stderr
