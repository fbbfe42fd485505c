"""verify-swap's progress in a log: one line per layer with its time and each phase's."""

import re

from exl3tool.runtime.layer_progress import LayerProgress

PHASES = ("decode base", "load", "cold pass", "checks")


def test_one_line_per_layer_with_the_split_by_phase(capsys) -> None:
    with LayerProgress(2, PHASES, enabled=True) as p:
        for layer in (3, 7):
            for name in PHASES:
                p.phase(layer, name)
            p.layer_done(layer, 1.5)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    split = r"\(decode base \d+\.\d\d, load \d+\.\d\d, cold pass \d+\.\d\d, checks \d+\.\d\d\)"
    assert re.fullmatch(
        rf"verify-swap: layer 3 done \(1/2\) in 1\.50 s {split}, \S+ s so far", lines[0]
    )
    assert lines[1].startswith("verify-swap: layer 7 done (2/2)")


def test_silent_unless_enabled(capsys) -> None:
    with LayerProgress(1, PHASES, enabled=False) as p:
        p.phase(0, "load")
        p.layer_done(0, 0.1)
    assert capsys.readouterr().err == ""
