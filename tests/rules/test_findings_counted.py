"""Findings.add_counted: the first items named one by one, the rest counted at the next one."""

from __future__ import annotations

from exl3tool.rules import exl3 as ex
from exl3tool.rules.registry import Findings


def test_the_first_are_named_and_the_rest_counted_where_the_next_one_is() -> None:
    described: list[int] = []

    def describe(i: int) -> tuple[str, dict[str, str]]:
        described.append(i)
        return f"item {i}", {"file": f"f{i}", "tensor": f"t{i}"}

    f = Findings()
    f.add_counted(ex.EX_EXPERT_GEOMETRY, list(range(25)), describe, "{n} more items", 20)
    got = [(x.message, x.location.file, x.location.tensor) for x in f]
    assert got[:20] == [(f"item {i}", f"f{i}", f"t{i}") for i in range(20)]
    assert got[20:] == [("5 more items", "f20", "t20")]
    assert described == list(range(21))  # the other four are never described


def test_no_more_finding_when_all_are_named() -> None:
    f = Findings()
    f.add_counted(ex.EX_EXPERT_GEOMETRY, [1, 2], lambda i: (f"item {i}", {}), "{n} more", 2)
    assert [x.message for x in f] == ["item 1", "item 2"]
    f = Findings()
    f.add_counted(ex.EX_EXPERT_GEOMETRY, [], lambda i: ("x", {}), "{n} more", 2)
    assert list(f) == []
