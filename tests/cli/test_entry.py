"""The console entry point leaves the objects of a finished command frozen for shutdown."""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import atexit, gc, sys
from exl3tool.cli import entry
atexit.register(lambda: print("FROZEN", gc.get_freeze_count(), file=sys.stderr))
sys.argv = ["exl3tool", *sys.argv[1:]]
entry()
"""


def _frozen(args: list[str]) -> tuple[int, int, str]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=60
    )
    line = next(x for x in out.stderr.splitlines() if x.startswith("FROZEN "))
    return out.returncode, int(line.split()[1]), out.stdout


def test_objects_are_frozen_after_a_command_and_its_output_is_complete() -> None:
    code, frozen, stdout = _frozen(["rules"])
    assert code == 0 and frozen > 10_000
    assert stdout.rstrip().endswith("┘") and " rules" in stdout.splitlines()[0]


def test_a_usage_error_is_frozen_too() -> None:
    code, frozen, _ = _frozen(["identity", "--threads", "0", "x"])
    assert code == 2 and frozen > 0


_LATE = """
import signal, sys
from exl3tool.cli import entry, signals
real = signals.finish
def finish():  # the handler of a signal received as the command ended runs in here
    signals.finish = real
    raise signals.Interrupted(signal.SIGTERM)
signals.finish = finish
sys.argv = ["exl3tool", "rules"]
entry()
"""


def test_a_signal_handled_as_the_command_ends_is_said_not_a_traceback() -> None:
    out = subprocess.run([sys.executable, "-c", _LATE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 143, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
