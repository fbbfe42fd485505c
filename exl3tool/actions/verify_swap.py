"""`exl3tool verify-swap`: hot swap, rollback and TP checks on the reference runtime.

A thin adapter over `exl3tool.runtime.verify` (torch: `exl3tool[runtime]`). What can be refused
before any rank process starts is refused here: usage, missing inputs, a missing torch or CUDA,
and a TP size the geometry does not divide (the findings `validate --tp N` gives).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exl3tool.actions.counts import check_counts
from exl3tool.actions.decode import require_torch
from exl3tool.actions.inputs import resolve_input, resolve_optional
from exl3tool.report.model import Report
from exl3tool.rules.errors import UsageError
from exl3tool.rules.registry import Findings


@dataclass(frozen=True)
class Options:
    base: str
    adapter: str
    adapter_b: str | None = None  # a second cartridge: also check the swap A -> B
    tp: int = 1
    device: str = "cpu"  # cpu (gloo) or cuda (NCCL)
    layers: str | None = None  # 3,5 or 3-6 (default: the layers the adapters select)
    tokens: int = 8
    seed: int = 0
    dense: str | None = None  # dense reference weights
    threads: int | None = None  # CPU threads per rank (default: cores / TP)
    max_memory: str | None = None  # per rank, "8G" / "512M" (VS001 above it; default: the machine)
    progress: bool = True  # rank 0: a bar on a TTY, else one stderr line per layer


@dataclass(frozen=True)
class VerifyResult:
    verify: Any | None  # runtime.verify.VerifyReport; None when refused before the run
    refused: Report | None = None  # the findings that refused the TP size
    prints: bool = True  # under torchrun only rank 0 prints

    def exit_code(self) -> int:
        return 1 if self.verify is None else self.verify.exit_code()


def _threads(opts: Options) -> int | None:
    if opts.threads is not None or opts.device != "cpu":
        return opts.threads
    # ranks share the cores; oversubscribed OpenMP spin-waits are catastrophic on small hosts
    local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", opts.tp)))
    return max(1, (os.cpu_count() or 1) // max(opts.tp, local))


def _max_memory(opts: Options) -> int | None:
    from exl3tool.runtime.budget import parse_size

    return parse_size(opts.max_memory) if opts.max_memory is not None else None


def _check_usage(opts: Options) -> None:
    if opts.device not in ("cpu", "cuda"):
        raise UsageError(f"--device must be cpu or cuda, not {opts.device!r}")
    check_counts(opts.tp, opts.threads)
    if opts.tokens < 1:
        raise UsageError("--tokens must be at least 1")


def _check_device(device: str, tp: int) -> None:
    torch = require_torch("verify-swap")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is available")
        if tp > torch.cuda.device_count():
            raise UsageError(f"--tp {tp} needs {tp} GPUs, {torch.cuda.device_count()} visible")


def tp_refusal(base: Path, adapters: list[Path], tp: int) -> Report | None:
    """The errors `validate --tp N` gives beyond those of `validate` (a TP size the geometry
    does not divide), or None when TP `tp` is possible."""
    from exl3tool.actions.validate import validate_path
    from exl3tool.checks.options import ValidateOptions

    if tp == 1:
        return None
    report = Report()
    for path in [base, *adapters]:
        with_base = None if path == base else base
        ref, at_tp = validate_path(path, ValidateOptions(tp=tp, base=with_base))
        _, plain = validate_path(path, ValidateOptions(base=with_base))
        known = {(f.code, f.message, f.location) for f in plain}
        extra = Findings(f for f in at_tp.errors() if (f.code, f.message, f.location) not in known)
        if extra:
            report.artifacts.append(ref)
            report.add_findings(extra)
    if not report.findings:
        return None
    report.notes.append(f"verify-swap --tp {tp} refused before any rank started")
    return report


def run(opts: Options) -> VerifyResult:
    _check_usage(opts)
    base, adapter = resolve_input(opts.base), resolve_input(opts.adapter)
    adapter_b, dense = resolve_optional(opts.adapter_b), resolve_optional(opts.dense)
    _check_device(opts.device, opts.tp)
    from exl3tool.runtime.distributed import env_world
    from exl3tool.runtime.verify import VerifyOptions, run_verify
    from exl3tool.runtime.verify_parts import parse_layers

    selected = parse_layers(opts.layers)  # a malformed spec is a UsageError (io/layer_spec)
    refused = tp_refusal(base, [a for a in (adapter, adapter_b) if a is not None], opts.tp)
    if refused is not None:
        return VerifyResult(None, refused)
    vopts = VerifyOptions(
        base, adapter, adapter_b, opts.tp, opts.device, selected, opts.tokens, opts.seed, dense,
        threads=_threads(opts), max_memory=_max_memory(opts), progress=opts.progress,
    )  # fmt: skip
    try:
        report = run_verify(vopts)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    found = env_world()
    return VerifyResult(report, prints=found is None or found[0] == 0)
