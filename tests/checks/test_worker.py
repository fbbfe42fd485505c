"""The forked check worker: its value equals the in-process one; a child that raises, dies or
does not answer is replaced by the parent's own run; the child is always reaped; an interrupt
still ends the command with 130/143; R7 manifests give the same findings forked or not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from checks_fixtures import copy, edit_json, edit_shard

from exl3tool.actions import validate
from exl3tool.actions.validate import validate_path
from exl3tool.checks.options import ValidateOptions
from exl3tool.checks.rows import from_rows, rows
from exl3tool.io import forked as worker
from exl3tool.io import views
from exl3tool.io.forked import Forked
from exl3tool.rules import r7 as r7_rules
from exl3tool.rules.registry import Findings

needs_fork = pytest.mark.skipif(
    sys.platform != "linux" or not hasattr(os, "fork"), reason="the worker forks on Linux only"
)


def _reaped(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


@pytest.fixture(autouse=True)
def _shards_written_long_ago(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fixtures' shards are copied just before each test: read ahead all the same."""
    monkeypatch.setattr(views, "RACY_NS", 0)


def _fork_for_any_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker forks for every checkpoint whatever its size (never with --threads 1)."""
    monkeypatch.setattr(worker, "can_fork", lambda threads: threads != 1)
    monkeypatch.setattr(validate, "PREFETCH_MIN_BYTES", 0)


@needs_fork
def test_value_comes_from_the_child_and_the_child_is_reaped() -> None:
    with Forked(os.getpid, parallel=True) as work:
        pid = work._pid
        got = work.result()
    assert got == pid != os.getpid()
    assert _reaped(pid)


def test_not_parallel_runs_in_process() -> None:
    with Forked(os.getpid, parallel=False) as work:
        assert work._pid == 0
        assert work.result() == os.getpid()


@needs_fork
@pytest.mark.parametrize("how", ["raise", "exit", "kill", "unpicklable"])
def test_a_failed_child_is_replaced_by_the_parent(how: str) -> None:
    parent = os.getpid()

    def fn() -> object:
        if os.getpid() != parent:
            if how == "raise":
                raise RuntimeError("child")
            if how == "exit":
                os._exit(3)
            if how == "kill":
                os.kill(os.getpid(), 9)
            return lambda: None  # cannot be pickled
        return "parent"

    with Forked(fn, parallel=True) as work:
        pid = work._pid
        assert work.result() == "parent"
    assert _reaped(pid)
    with Forked(fn, parallel=True) as work:
        pid = work._pid
        assert work.from_child("none") == "none"  # nothing computed in the parent
    assert _reaped(pid)


@needs_fork
def test_a_child_past_the_deadline_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "TIMEOUT_S", 0.2)
    parent = os.getpid()
    r, w = os.pipe()

    def fn() -> str:
        if os.getpid() != parent:
            os.read(r, 1)  # never written: blocks until killed
        return "parent"

    try:
        with Forked(fn, parallel=True) as work:
            pid = work._pid
            assert work.result() == "parent"
        assert _reaped(pid)
    finally:
        os.close(r)
        os.close(w)


@needs_fork
def test_an_exception_in_the_parent_kills_and_reaps_the_child() -> None:
    r, w = os.pipe()
    pid = 0
    try:
        with pytest.raises(KeyboardInterrupt), Forked(lambda: os.read(r, 1), parallel=True) as work:
            pid = work._pid
            raise KeyboardInterrupt
        assert pid and _reaped(pid)
    finally:
        os.close(r)
        os.close(w)


@needs_fork
@pytest.mark.parametrize(("sig", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_an_interrupt_exits_130_143_and_leaves_no_child(sig: str, code: int) -> None:
    script = textwrap.dedent(f"""
        import os, signal, sys
        from exl3tool.cli import signals
        from exl3tool.io.forked import Forked
        signals.install()
        r, w = os.pipe()
        work = None
        try:
            with Forked(lambda: os.read(r, 1), parallel=True) as work:
                os.kill(os.getpid(), signal.{sig})
                work.result()
        except BaseException as exc:
            try:
                os.waitpid(work._pid or -1, os.WNOHANG)
                print("child left")
            except ChildProcessError:
                print("reaped")
            sys.exit(signals.say(exc))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == code, proc.stderr
    assert proc.stdout.strip() == "reaped"


def test_rows_round_trip() -> None:
    f = Findings()
    f.add(r7_rules.R7_BIT_MAP, "m", file="a.json", tensor="t", pointer="/bit_map/t")
    f.add(r7_rules.R7_PROVENANCE, "p", file="a.json", severity="info")
    again = from_rows(rows(f))
    assert again == list(f)
    assert all(a.rule is b.rule for a, b in zip(again, f, strict=True))


def _manifest_mutations(root: Path) -> None:
    """Every kind of manifest defect: JSON, schema, identity, payload names, bit_map, files."""
    m1, m2 = root / "r7-experts-layer-001.json", root / "r7-experts-layer-002.json"

    def first(man: dict) -> None:
        bm = man["bit_map"]
        key = next(iter(bm))
        bm[key] = 9 - bm[key]
        bm["model.layers.1.mlp.experts.0.nope_proj"] = 2
        man["payload_sha256"]["model.layers.1.mlp.experts.999.x"] = "0" * 64
        man["layer"] = 7
        man.pop("recipe_version", None)

    edit_json(m1, first)
    text = m2.read_text()
    m2.write_text(text.replace('"layer"', '"layer": 2, "layer"', 1))  # a duplicate key


def _break_payload(tensors: dict) -> None:
    for i, name in enumerate(sorted(tensors)):
        dtype, arr = tensors[name]
        if name.endswith((".suh", ".svh")) and i % 3 == 0:
            arr = arr.copy()
            arr.reshape(-1)[i % arr.size] = float("nan") if i % 2 else float("inf")
            tensors[name] = (dtype, arr)
        elif name.endswith(".mcg") and i % 4 == 0:
            tensors[name] = (dtype, arr + 1)


def _report(root: Path, threads: int | None) -> list[dict]:
    ref, findings = validate_path(root, ValidateOptions(hash=False, threads=threads))
    ref.extra.pop("seconds")
    return [ref.extra, *(f.to_json() for f in findings)]


@needs_fork
@pytest.mark.parametrize(
    "defect", ["pristine", "mutated", "syntax", "missing", "fifo", "payload", "shard"]
)
def test_manifest_findings_are_the_same_forked_or_not(
    pristine: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, defect: str
) -> None:
    root = copy(pristine["r7"], tmp_path / "r7")
    m2 = root / "r7-experts-layer-002.json"
    if defect == "mutated":
        _manifest_mutations(root)
    elif defect == "syntax":
        m2.write_text(m2.read_text()[:-20])
    elif defect == "missing":
        m2.unlink()
    elif defect == "fifo":
        m2.unlink()
        os.mkfifo(m2)
    elif defect == "payload":  # NaN/Inf vectors and wrong markers, read ahead by the worker
        edit_shard(root, "r7-experts-layer-001.safetensors", _break_payload)
    elif defect == "shard":  # a layer shard the worker cannot read ahead
        (root / "r7-experts-layer-002.safetensors").write_bytes(b"\x00" * 4)
    forked = []
    original_start = Forked._start

    def start(self: Forked) -> None:
        original_start(self)
        forked.append(self._pid)

    monkeypatch.setattr(Forked, "_start", start)
    _fork_for_any_size(monkeypatch)
    alone = _report(root, threads=1)
    assert not forked
    both = _report(root, threads=None)
    assert forked and forked[0] > 0
    assert json.dumps(both) == json.dumps(alone)
    if defect != "pristine":
        assert len(alone) > 2


@needs_fork
def test_results_prefetched_for_another_block_are_not_used(
    pristine: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from exl3tool.checks import r7, r7_manifests
    from exl3tool.formats.r7 import Block

    root = copy(pristine["r7"], tmp_path / "r7")
    _manifest_mutations(root)
    edit_shard(root, "r7-experts-layer-001.safetensors", _break_payload)
    alone = _report(root, threads=1)
    wrong = Block(1, 1, frozenset({2}), "quantization_config.json", "/r7_routed_experts")
    empty = r7_manifests.ManifestResults((), (), frozenset())
    _fork_for_any_size(monkeypatch)
    monkeypatch.setattr(r7, "prefetch_r7", lambda root: r7.Prefetched(wrong, {}, empty))
    assert json.dumps(_report(root, threads=None)) == json.dumps(alone)


def test_read_ahead_stops_at_its_byte_cap(
    pristine: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from exl3tool.checks import payload, r7

    root = copy(pristine["r7"], tmp_path / "r7")
    edit_shard(root, "r7-experts-layer-002.safetensors", _break_payload)
    full = r7.prefetch_r7(root)
    assert full is not None and len(full.facts) == 2
    one = min(len(f.scanned) for f in full.facts.values())
    assert one
    monkeypatch.setattr(r7, "FACTS_MAX_TOTAL", 1)  # not even one vector: no facts at all
    capped = r7.prefetch_r7(root)
    assert capped is not None and not capped.facts
    assert payload.FACTS_MAX_TOTAL >= 1 << 20
    alone = _report(root, threads=1)
    _fork_for_any_size(monkeypatch)
    assert json.dumps(_report(root, threads=None)) == json.dumps(alone)


def test_a_shard_changed_just_before_it_is_read_ahead_gets_no_facts(
    pristine: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Facts are read before the header: a shard whose ctime is within RACY_NS of the read
    could change again in the same clock tick with its stamp kept, so the checks read it."""
    from exl3tool.checks import r7

    root = copy(pristine["r7"], tmp_path / "r7")
    assert r7.prefetch_r7(root).facts
    monkeypatch.setattr(views, "RACY_NS", 10**12)
    got = r7.prefetch_r7(root)
    assert got is not None and not got.facts and got.manifests.layers
    alone = _report(root, threads=1)
    _fork_for_any_size(monkeypatch)
    assert json.dumps(_report(root, threads=None)) == json.dumps(alone)


@needs_fork
def test_a_worker_that_dies_changes_nothing(
    pristine: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from exl3tool.checks import r7

    root = copy(pristine["r7"], tmp_path / "r7")
    _manifest_mutations(root)
    edit_shard(root, "r7-experts-layer-001.safetensors", _break_payload)
    alone = _report(root, threads=1)
    _fork_for_any_size(monkeypatch)
    monkeypatch.setattr(r7, "prefetch_r7", lambda root: os._exit(1))  # the parent never runs it
    assert json.dumps(_report(root, threads=None)) == json.dumps(alone)
