"""The malformed-file corpus: our finding per defect, and a differential against `safetensors`."""

from __future__ import annotations

from pathlib import Path

import corpus  # tests/io is on sys.path (pytest rootdir-relative import of this folder)
import make_strictness_doc
import pytest

from exl3tool.io.safetensors import read_header
from exl3tool.rules.registry import Findings, Severity


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> list[make_strictness_doc.Row]:
    return make_strictness_doc.evaluate(tmp_path_factory.mktemp("corpus"))


def test_corpus_has_at_least_20_distinct_defects() -> None:
    keys = [d.key for d in corpus.CORPUS]
    assert len(set(keys)) == len(keys) >= 20
    blobs = [d.build() for d in corpus.CORPUS]
    assert len(set(blobs)) == len(blobs)


@pytest.mark.parametrize("defect", corpus.CORPUS, ids=lambda d: d.key)
def test_each_defect_reports_its_rule(defect: corpus.Defect, tmp_path: Path) -> None:
    p = tmp_path / "f.safetensors"
    p.write_bytes(defect.build())
    fs = Findings()
    read_header(p, fs, "f.safetensors")  # must not raise
    assert defect.code in fs.codes(), [(f.code, f.message) for f in fs]
    assert all(f.location.file == "f.safetensors" for f in fs)


def test_library_never_stricter_than_us(rows: list[make_strictness_doc.Row]) -> None:
    for r in rows:
        if not r.library_accepts:  # the library rejects: so must we, as an error
            assert r.severity == Severity.ERROR.value, r
    # we really are stricter somewhere, and the library really rejects most of the corpus
    assert any(r.library_accepts and r.severity == "error" for r in rows)
    assert sum(not r.library_accepts for r in rows) >= 20


@pytest.mark.parametrize("key", sorted(corpus.VALID))
def test_valid_corpus_files_pass_both(key: str, tmp_path: Path) -> None:
    p = tmp_path / "v.safetensors"
    p.write_bytes(corpus.VALID[key]())
    fs = Findings()
    st = read_header(p, fs, "v")
    assert st is not None and not fs, [(f.code, f.message) for f in fs]
    assert corpus.library_verdict(p) == (True, "accepted")


def test_strictness_doc_is_current(rows: list[make_strictness_doc.Row]) -> None:
    doc = make_strictness_doc.DOC
    assert doc.exists(), "run python tests/io/make_strictness_doc.py"
    expected = make_strictness_doc.table_key(make_strictness_doc.render(rows))
    assert make_strictness_doc.table_key(doc.read_text()) == expected, (
        "docs/safetensors-strictness.md drifted; run python tests/io/make_strictness_doc.py"
    )
    assert len(expected) == len(corpus.CORPUS)
