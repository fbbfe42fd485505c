"""Rules of `exl3tool verify-swap`: runs the reference runtime refuses or cannot finish."""

from exl3tool.rules.registry import Severity, rule

E = Severity.ERROR

VS_MEMORY = rule(
    "VS001",
    "verify-swap-memory",
    E,
    "verify-swap would need more memory than allowed or available",
    "verify-swap streams one layer at a time; each rank holds the decoded fp16 weights of the "
    "largest selected layer (base and stage terms) plus one cold expert and a fixed overhead. "
    "It estimates that before starting and refuses rather than be killed by the OOM killer.",
    "Raise --max-memory, lower --tp on a shared host, or run on a machine with more memory.",
)
VS_WORKER = rule(
    "VS002",
    "verify-swap-worker-died",
    E,
    "A verify-swap rank process died",
    "A rank ended without a result (killed by a signal, e.g. the OOM killer, or it exited); "
    "the other ranks are stopped and every temporary directory is removed.",
    "Re-run with --tp 1 or more memory; dmesg tells whether the OOM killer ended it.",
)
