"""The fuzz harness: a short seeded campaign finds nothing bad (part of `make test`), and the
harness itself tells a crash, a timeout, a memory blow-up and a signal death apart."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.fuzz import runner
from tests.fuzz.mutate import dumps, join_safetensors, split_safetensors
from tests.fuzz.runner import Limits, run

SHORT_CASES = 2000  # ~10-20 s on two cores


def test_short_campaign_has_nothing_bad() -> None:
    summary = run(SHORT_CASES, seed=15, workers=2)
    assert summary.cases == SHORT_CASES
    assert summary.n_bad == 0, summary.bad


def _hostile_entry(case, art, pristine, out):
    i = case.index
    if i == 3:
        raise ValueError("a bug")
    if i == 5:
        time.sleep(30)  # a Python-level hang: the worker's SIGALRM
    if i == 7:
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
        time.sleep(30)  # the alarm cannot interrupt: the parent's watchdog
    if i == 9:
        os.kill(os.getpid(), signal.SIGSEGV)
    if i == 11:
        return bytearray(3 << 30)  # beyond RLIMIT_AS: MemoryError
    return None


def test_harness_classifies_every_kind_of_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "call_entry", _hostile_entry)
    limits = Limits(timeout=0.5, memory=1 << 30, grace=0.5)
    summary = run(14, seed=0, workers=2, batch=7, limits=limits)
    got = {b["case"]: b["class"] for b in summary.bad}
    assert got == {3: "uncaught", 5: "timeout", 7: "timeout", 9: "signal", 11: "memory"}
    assert summary.cases == 14 and summary.counts["ok"] == 9


def test_mutations_are_a_function_of_seed_and_index() -> None:
    from tests.fuzz.targets import SEED_KINDS, make_case

    seeds = {k: {"config.json": b'{"a": [1, 2, {"b": 3}]}'} for k in SEED_KINDS}
    a = [make_case(4, i, seeds) for i in range(50)]
    b = [make_case(4, i, seeds) for i in range(50)]
    assert [(c.kind, c.entry, c.what, c.layout) for c in a] == [
        (c.kind, c.entry, c.what, c.layout) for c in b
    ]
    assert len({c.what for c in a}) > 10


def test_safetensors_round_trip_and_hostile_json() -> None:
    data = join_safetensors({"t": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}, b"ab")
    header, payload = split_safetensors(data)
    assert header["t"]["shape"] == [2] and payload == b"ab"
    assert dumps([float("nan"), "\ud800"]) == '[NaN, "\\ud800"]'


def test_cases_do_not_depend_on_the_cases_before(tmp_path) -> None:
    """Mutations edit values in place: a shared hostile value must never carry over from one
    case to the next (3000 cases changed HOSTILE before values were copied)."""
    from tests.fuzz import mutate
    from tests.fuzz.runner import World
    from tests.fuzz.targets import make_case

    world = World(tmp_path)
    before = repr(mutate.HOSTILE)
    first = [make_case(8, i, world.layouts) for i in range(20)]
    for i in range(20, 3000):
        make_case(8, i, world.layouts)
    assert repr(mutate.HOSTILE) == before
    again = [make_case(8, i, world.layouts) for i in range(20)]
    assert [(c.what, c.layout) for c in first] == [(c.what, c.layout) for c in again]


def test_a_shape_left_null_by_one_mutation_survives_the_next() -> None:
    """Case 109034 of seed 1203 doubled a shape whose element an earlier mutation had set to
    null: the harness itself raised (a 'harness' bad case in a 200,000-case campaign). Every
    shape edit of such an entry, doubling included, now gives a shape."""
    import random

    from tests.fuzz.mutate import _edit_entry

    doubled = 0
    for seed in range(400):
        entry = {"dtype": "F16", "shape": [None, 4, {"x": 1}], "data_offsets": [0, 8]}
        if _edit_entry(random.Random(seed), entry, 8) == "shape":
            doubled += entry["shape"] == [None, 8, {"x": 1}]
    assert doubled > 0  # the doubling was drawn, and kept what it cannot double


def test_every_entry_a_seed_names_has_its_call() -> None:
    from tests.fuzz.entries import CALLS
    from tests.fuzz.targets import ENTRIES, SEED_KINDS

    assert set(ENTRIES) == set(SEED_KINDS)
    assert {e for entries in ENTRIES.values() for e in entries} == set(CALLS)


def test_tensor_sweep_slices_an_expert_trellis_changed_every_way_without_a_traceback() -> None:
    """The sweep (`python3 -m tests.fuzz.sweep_tensors`) on the case that crashed the slicer:
    an expert gate_proj trellis (its column cut is on axis 1) flattened, as a scalar, retyped
    and emptied; `slice --tp 2` of each."""
    from tests.fuzz.sweep_tensors import sweep

    lines: list[str] = []
    runs, bad = sweep(["r7"], only="gate_proj.trellis", commands={"slice"}, log=lines.append)
    assert runs >= 10 and bad == [] and lines == []
