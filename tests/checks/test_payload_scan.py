"""checks/payload: the deferred marker reads and NaN/Inf scan, in C, with numpy and with Python
integers, equal a word-by-word reference, in the order the checks report them."""

from __future__ import annotations

import json
import random
import struct
from dataclasses import replace
from pathlib import Path

import pytest

from exl3tool.checks import payload
from exl3tool.checks.payload import FiniteCheck, MarkerCheck, RandomAccessReader, run_deferred
from exl3tool.formats.checkpoint import TensorRef, load_checkpoint
from exl3tool.rules.registry import Findings

MARKER = -877912083
_WORD = {"F16": (2, 0x7C00), "F32": (4, 0x7F800000)}


def _write(path: Path, seed: int) -> tuple[Path, dict[str, bytes]]:
    """A shard of F16/F32 vectors (some at odd offsets, some with NaN/Inf words, some with a
    trailing partial word), I32 markers (some wrong) and large I16 gaps between them."""
    rng = random.Random(seed)
    header: dict[str, dict] = {}
    blobs: dict[str, bytes] = {}
    at = 0
    for i in range(rng.randrange(5, 40)):
        kind = rng.choice(["F16", "F16", "F32", "mcg", "gap", "odd"])
        if kind == "gap":
            name, dtype, n = f"g{i}", "I16", rng.choice([10, 40_000, 70_000])
            raw = bytes(rng.getrandbits(8) for _ in range(2 * n)) if n < 100 else b"\xff" * (2 * n)
            shape = [n]
        elif kind == "odd":  # one byte: shifts what follows to an odd offset
            name, dtype, raw, shape = f"o{i}", "U8", b"\x00", [1]
        elif kind == "mcg":
            value = MARKER if rng.random() < 0.7 else rng.randrange(-(2**31), 2**31)
            name, dtype, raw, shape = f"m{i}", "I32", struct.pack("<i", value), []
        else:
            size, mask = _WORD[kind]
            n = rng.randrange(1, 300)
            words = []
            for _ in range(n):
                w = rng.getrandbits(8 * size)
                if rng.random() < 0.97:
                    w &= ~(mask & -mask)  # clear one exponent bit: finite
                words.append(w.to_bytes(size, "little"))
            raw = b"".join(words)
            name, dtype, shape = f"v{i}", kind, [n]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(raw)]}
        blobs[name] = raw
        at += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text + b"".join(blobs.values()))
    return path, blobs


def _reference(refs: list[TensorRef], blobs: dict[str, bytes]) -> tuple[list, list]:
    wrong = [
        (r.name, v, MARKER)
        for r in refs
        if r.info.dtype == "I32" and (v := struct.unpack("<i", blobs[r.name])[0]) != MARKER
    ]
    nonfinite: list[str] = []
    for dtype, (size, mask) in _WORD.items():
        sel = [r for r in refs if r.info.dtype == dtype]
        # vectors at an odd packed position are reported first (the packed gather keeps each
        # begin's alignment mod 16, so the parity of the file offset decides)
        for odd in (True, False):
            for r in sel:
                if bool(r.info.begin % size) is not odd:
                    continue
                raw = blobs[r.name]
                words = (
                    int.from_bytes(raw[i : i + size], "little")
                    for i in range(0, len(raw) - size + 1, size)
                )
                if any(w & mask == mask for w in words):
                    nonfinite.append(r.name)
    return wrong, nonfinite


def _facts(path: Path, numpy: bool) -> dict:
    """The shard's facts as the R7 worker reads them ahead (`fact_reads`, `read_facts`)."""
    planned = payload.fact_reads(path, path.name)
    assert planned is not None
    with RandomAccessReader() as reader:
        return {path: payload.read_facts(planned, reader, numpy)}


def _run(path: Path, facts: dict | None = None) -> tuple[list, list]:
    return _deferred(list(load_checkpoint(path, Findings()).tensors.values()), facts)


def _deferred(refs: list[TensorRef], facts: dict | None = None) -> tuple[list, list]:
    """(wrong markers, NaN/Inf vectors) the deferred checks report for `refs`, in order."""
    wrong: list = []
    nonfinite: list = []
    with RandomAccessReader() as reader:
        markers, finite = MarkerCheck(), FiniteCheck()
        for r in refs:
            if r.info.dtype == "I32":
                markers.add(r, MARKER)
            finite.add(r)
        run_deferred(
            reader,
            markers,
            finite,
            lambda r, v, e: wrong.append((r.name, v, e)),
            lambda r: nonfinite.append(r.name),
            facts,
        )
    return wrong, nonfinite


@pytest.mark.parametrize("seed", range(40))
def test_deferred_checks_equal_a_word_by_word_reference(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, blobs = _write(tmp_path / "m.safetensors", seed)
    want = _reference(list(load_checkpoint(path, Findings()).tensors.values()), blobs)
    assert _run(path) == want  # C where native/spans.c is built
    c_facts = _facts(path, False)
    assert _run(path, c_facts) == want
    monkeypatch.setattr(payload, "_native_special", None)
    monkeypatch.setattr(payload, "NUMPY_MIN_BYTES", 1 << 60)  # Python integers
    assert _run(path) == want
    monkeypatch.setattr(payload, "NUMPY_MIN_BYTES", 0)  # numpy
    assert _run(path) == want
    for numpy in (False, True):  # from facts read ahead, the same in the same order
        facts = _facts(path, numpy)
        assert facts == c_facts
        assert _run(path, facts) == want
        # facts that lack a deferred read, or of a shard that changed since, are not used
        (known,) = facts.values()
        lying = {k: v + 1 for k, v in known.values.items()}
        if known.values:
            partial = payload.ShardFacts(known.stamp, {}, known.scanned, known.scanned)
        else:
            partial = payload.ShardFacts(known.stamp, {}, frozenset(), known.scanned)
        assert _run(path, {path: partial}) == want
        stamp = replace(known.stamp, mtime_ns=known.stamp.mtime_ns + 1)
        stale = payload.ShardFacts(stamp, lying, known.scanned, known.scanned)
        assert _run(path, {path: stale}) == want
        if known.values:  # and facts that hold are used
            fresh = payload.ShardFacts(known.stamp, lying, known.scanned, known.failed)
            assert _run(path, {path: fresh}) != want


def test_small_scans_do_not_import_numpy(tmp_path: Path) -> None:
    """validate of a small artifact needs no numpy for its payload checks (start-up cost)."""
    import subprocess
    import sys

    path, _ = _write(tmp_path / "m.safetensors", 3)
    here, target = str(Path(__file__).parent), str(path)
    code = (
        f"import sys; from pathlib import Path; sys.path.insert(0, {here!r})\n"
        f"from test_payload_scan import _run; _run(Path({target!r}))\n"
        "assert 'numpy' not in sys.modules, 'numpy imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _scanned(r: TensorRef) -> bool:
    return r.info.dtype in _WORD and r.info.nbytes > 0


@pytest.mark.parametrize("seed", range(6))
def test_items_of_two_shards_interleaved_are_reported_per_shard(tmp_path: Path, seed: int) -> None:
    """Deferred items of two shards, added alternately (the checks usually add a shard's
    together): each shard's findings come together, shards in the order their first item of
    that kind came, items in the order they were added; the same from facts read ahead."""
    shards = []
    for i in range(2):
        path, blobs = _write(tmp_path / f"s{i}.safetensors", 100 + 2 * seed + i)
        refs = list(load_checkpoint(path, Findings()).tensors.values())
        shards.append((path, refs, _reference(refs, blobs)))
    a, b = shards[0][1], shards[1][1]
    mixed = [r for pair in zip(a, b, strict=False) for r in pair] + a[len(b) :] + b[len(a) :]

    def in_order(keep, part: int) -> list:  # the shards' expected findings, first seen first
        paths = dict.fromkeys(r.shard.path for r in mixed if keep(r))
        return [x for p in paths for path, _, want in shards if path == p for x in want[part]]

    want = (in_order(lambda r: r.info.dtype == "I32", 0), in_order(_scanned, 1))
    facts = {**_facts(shards[0][0], True), **_facts(shards[1][0], False)}
    for known in (None, facts):
        assert _deferred(mixed, known) == want


@pytest.mark.parametrize("step", [1, 7, 1 << 14])
@pytest.mark.parametrize("size", [2, 4])
def test_the_stepped_special_word_test_equals_the_whole_array_test(step: int, size: int) -> None:
    """`_any_special` tests the words in steps of SCAN_WORDS (small temporaries): the same
    answer as one whole-array test, wherever the one special word is."""
    import numpy as np

    mask = _WORD["F16" if size == 2 else "F32"][1]
    dtype = np.uint16 if size == 2 else np.uint32
    rng = np.random.default_rng(step * size)
    real = payload.SCAN_WORDS
    payload.SCAN_WORDS = step
    try:
        for n in (0, 1, step - 1, step, step + 1, 3 * step + 2, 40_000):
            words = (rng.integers(0, mask, max(n, 0), dtype=np.uint64) & (mask - 1)).astype(dtype)
            assert not payload._any_special(np, words, mask)
            for at in {0, n // 2, n - 1} if n else ():
                hit = words.copy()
                hit[at] |= mask
                assert payload._any_special(np, hit, mask) == bool(((hit & mask) == mask).any())
                assert payload._any_special(np, hit, mask)
    finally:
        payload.SCAN_WORDS = real
