"""The plain-text report is byte-for-byte what rich prints, or it declines (None)."""

from __future__ import annotations

import io
import random

import pytest
from rich.console import Console

from exl3tool.report import plain, text
from exl3tool.report.model import ArtifactRef, Report
from exl3tool.rules.registry import Findings, Severity, all_rules

WIDTHS = (12, 20, 33, 48, 49, 60, 79, 80, 81, 100, 137, 200)
_WORDS = ["a", "I16", "shape", "model.layers.0.mlp", "4096", "x" * 30, "y" * 95, "/a/b.c", "-"]
# Rendered literally by rich, or declined by plain (then rich prints them).
_ODD = ["[bold]", "[1, 2]", "\\", ":smile:", "a:b", "é", "\t", "\n", "[X]", "]", "a: b:", "[/"]


def _rich(report: Report, width: int, quiet: bool) -> str:
    buf = io.StringIO()
    text._render(report, Console(file=buf, width=width, color_system=None), quiet=quiet)
    return buf.getvalue()


def _phrase(rng: random.Random, odd: bool) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(0, 14))]
    if odd and rng.random() < 0.3:
        words.insert(rng.randint(0, len(words)), rng.choice(_ODD))
    seps = [rng.choice([" ", " ", " ", "  ", ""]) for _ in words]
    return "".join(w + s for w, s in zip(words, seps, strict=True))


def _report(rng: random.Random) -> Report:
    rules = all_rules()
    odd = rng.random() < 0.3
    arts = [
        ArtifactRef(rng.choice(["m", "models/ckpt", "/abs/" + "p" * rng.randint(1, 120)]), "exl3")
        for _ in range(rng.randint(1, 3))
    ]
    fs = Findings()
    for _ in range(rng.choice([0, 1, 2, 5, 20])):
        r = rng.choice(rules)
        file = rng.choice([None, arts[0].path + "/model.safetensors", "config.json"])
        tensor = rng.choice([None, "w.trellis", "model.layers.1.self_attn.q_proj.suh"])
        pointer = rng.choice([None, "/w/data_offsets"])
        severity = rng.choice([None, Severity.WARNING, Severity.INFO])
        fs.add(r, _phrase(rng, odd), file=file, tensor=tensor, pointer=pointer, severity=severity)
    notes = [_phrase(rng, odd) for _ in range(rng.choice([0, 0, 1, 2]))]
    return Report(arts, fs, notes=notes)


@pytest.mark.parametrize("seed", range(40))
def test_plain_text_is_what_rich_prints(seed: int) -> None:
    rng = random.Random(seed)
    declined = 0
    for _ in range(50):
        report, width, quiet = _report(rng), rng.choice(WIDTHS), rng.random() < 0.2
        got = plain.render(report, width, quiet)
        if got is None:
            declined += 1
            continue
        assert got == _rich(report, width, quiet), (seed, width, quiet)
    assert declined < 40  # most reports are rendered without rich


def test_it_declines_what_only_rich_renders_exactly() -> None:
    rule = all_rules()[0]
    for odd in ("[bold]", "[X]", "\\", ":smile:", "x:y:z", "é", "\t", "\n", "\x7f"):
        fs = Findings()
        fs.add(rule, f"value {odd} here")
        assert plain.render(Report([ArtifactRef("m", "exl3")], fs), 80) is None, odd
    wide = Report([ArtifactRef("p" * 60, "exl3")])
    assert plain.render(wide, 100) is not None and plain.render(wide, 80) is None
    assert plain.render(Report(), 80) is None  # no table rows


def test_wrap_folds_long_words_and_keeps_the_break_space_as_rich_does() -> None:
    assert plain.wrap("aaa bbb", 4) == ["aaa ", "bbb"]
    cases = [("x" * 10, 4), ("", 10), ("          fix: " + "w" * 12, 12), ("a  b   c", 3)]
    cases += [("  " + "word " * 30, w) for w in (1, 2, 7, 80)]
    for line, width in cases:
        buf = io.StringIO()
        Console(file=buf, width=width).print(line)
        assert plain.wrap(line, width) == buf.getvalue().split("\n")[:-1], (line, width)


def test_plain_width_follows_rich_console(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setenv("COLUMNS", "123")
    assert plain.plain_width(stream) == 123 == Console(file=stream).width
    monkeypatch.setenv("COLUMNS", "x")
    assert plain.plain_width(stream) == Console(file=stream).width
    monkeypatch.setenv("COLUMNS", "0")  # rich prints nothing at all then
    assert plain.plain_width(stream) is None and Console(file=stream).width == 0
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert plain.plain_width(stream) is None
    monkeypatch.delenv("FORCE_COLOR")

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert plain.plain_width(Tty()) is None


def test_counts_wider_than_their_header_are_right_justified_under_it() -> None:
    errors = Findings([Findings().add(all_rules()[0], "x")] * 1_234_567)
    lines = plain._table(Report([ArtifactRef("m", "exl3")], errors), 100)
    assert lines[2] == "┃ artifact ┃ kind ┃  errors ┃ warnings ┃ infos ┃"  # as rich prints it
    assert lines[4] == "│ m        │ exl3 │ 1234567 │        0 │     0 │"
