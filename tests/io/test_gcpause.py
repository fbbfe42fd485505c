"""io/gcpause: no collection inside a pause; what it built is frozen only where the process
froze its start-up objects (the command line), so library callers keep a plain collector."""

from __future__ import annotations

import gc

from exl3tool.io.gcpause import paused_gc


def _built(n: int) -> list[list[int]]:
    return [[i] for i in range(n)]  # tracked containers


def test_a_pause_disables_the_collector_and_nests() -> None:
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_pause_freezes_only_in_a_process_that_froze_before() -> None:
    gc.unfreeze()  # whatever an earlier test froze goes back to the oldest generation
    try:
        with paused_gc():
            kept = _built(5000)
        assert gc.get_freeze_count() == 0 and gc.isenabled()
        gc.freeze()  # as the command line does after its imports
        before = gc.get_freeze_count()
        with paused_gc():
            more = _built(5000)
        assert gc.get_freeze_count() >= before + 5000
        assert gc.isenabled() and len(kept) == len(more) == 5000
    finally:
        gc.unfreeze()
