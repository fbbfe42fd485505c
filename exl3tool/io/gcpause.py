"""The cyclic garbage collector paused while millions of acyclic objects are built.

Parsing a header of 10^6 tensors, planning and folding their digests create tens of millions
of tuples, strings and small dicts with no reference cycles; each full collection walks all of
them again, which costs ~40% of such a run. Reference counting frees them all the same.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic collection inside the block (nested blocks are fine).

    In a process that froze its start-up objects (the command line does, cli/__init__.py),
    what the block built is frozen too as it ends: the first collection after a pause would
    otherwise walk every object the pause left (the header of 10^6 tensors, its plan and
    digests: four such walks took 0.34 s of a 2-core identity run). Frozen objects are
    still freed by reference counting; only garbage in cycles would outlive the command."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count():
            gc.freeze()
        gc.enable()
