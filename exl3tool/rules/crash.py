"""One "check crashed" rule per check family (issue 15): the exception boundary of a family
(`checks/boundary.py`) reports any exception escaping its checks as this finding, never as a
traceback. A finding of these rules is a bug of exl3tool's, triggered by the artifact."""

from __future__ import annotations

from exl3tool.rules.registry import Rule, Severity, rule

E = Severity.ERROR
_WHY = (
    "A check of this family raised an exception on this artifact; the checks after it did not "
    "run, so the artifact is not known to be valid."
)
_HINT = "Report it with the artifact's header and manifests; fix what the other findings name."


def _crash(code: str, what: str) -> Rule:
    return rule(code, "check-crashed", E, f"A {what} check crashed", _WHY, _HINT)


CK_CRASH = _crash("CK099", "checkpoint container")
EX_CRASH = _crash("EX099", "plain EXL3")
R7_CRASH = _crash("R7099", "R7")
RS_CRASH = _crash("RS099", "rank-sliced")
MB_CRASH = _crash("MB099", "MSRT base")
CA_CRASH = _crash("CA099", "cartridge")
ID_CRASH = _crash("ID099", "identity")

CK_DECLARED_COUNT = rule(
    "CK098",
    "declared-count-implausible",
    E,
    "Declared counts describe far more tensors than the artifact holds",
    "A config's layer, expert or rank count sizes the checks' work; one far beyond the tensors "
    "present is a defect (or hostile), and checking every declared slot would not finish.",
    "Fix the count in the config so that it matches the tensors the checkpoint stores.",
)
