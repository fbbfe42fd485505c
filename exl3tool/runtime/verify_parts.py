"""What every part of verify-swap shares (runtime/verify runs them; verify_rank and
verify_layer_checks check): the options, check results and reports, timers, layer selection,
the failure drill's corrupt copies, the dense weights, and the TP checks (5) and their limits.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from exl3tool.io.layer_spec import ALL, parse_layer_spec
from exl3tool.rules.errors import InputError
from exl3tool.runtime.compare import Tally, compare
from exl3tool.runtime.engine import SwapEngine
from exl3tool.runtime.verify_steps import Outputs

SCHEMA = "exl3tool-verify/1"
# TP=N vs TP=1 (check 5): the row-parallel down projection sums N fp32 partials instead of one
# fp32 accumulation, and gate/up GEMMs of other widths may block K differently, so fp16 outputs
# can differ by a few ulps. Documented limits, relative to the TP=1 output:
TP_MAX_ABS_REL = 2.0**-7  # max |Δ| ≤ 2^-7 · max |y_tp1|  (≈ 16 fp16 ulps at the peak)
TP_REL_L2 = 1e-3  # ‖Δ‖₂ / ‖y_tp1‖₂


@dataclass
class VerifyOptions:
    base: Path
    adapter: Path
    adapter_b: Path | None = None
    tp: int = 1
    device: str = "cpu"
    layers: list[int] | None = None  # None: every layer the adapters select
    tokens: int = 8
    seed: int = 0
    dense: Path | None = None
    work_dir: Path | None = None
    threads: int | None = None  # CPU threads per rank (default: torch's, or cores / TP per rank)
    max_memory: int | None = None  # bytes per rank (VS001 above it); None: what the machine has
    progress: bool = False  # rank 0 draws a bar on a TTY, else one stderr line per layer
    # test hooks: a callable run on each rank's engine right after it is built (fault injection,
    # monkeypatching); must be picklable for spawned ranks (a module-level function)
    engine_hook: Callable[[SwapEngine], None] | None = None


@dataclass
class Check:
    name: str
    passed: bool | None  # None: skipped
    detail: str
    max_abs: float | None = None
    first_difference: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "passed": self.passed,
            "detail": self.detail,
            "max_abs": self.max_abs,
            "first_difference": self.first_difference,
        }
        out.update(self.extra)
        return out


@dataclass
class RankResult:
    rank: int
    checks: list[Check]
    quality: list[dict[str, Any]]
    timings: dict[str, float]
    layers: list[int]
    notes: list[str]


@dataclass
class VerifyReport:
    tp: int
    device: str
    layers: list[int]
    checks: list[Check]
    quality: list[dict[str, Any]]
    timings: dict[str, float]
    notes: list[str]

    @property
    def passed(self) -> bool:
        return all(c.passed is not False for c in self.checks)

    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "tp": self.tp,
            "device": self.device,
            "layers": self.layers,
            "passed": self.passed,
            "checks": [c.to_json() for c in self.checks],
            "quality": self.quality,
            "timings": {k: round(v, 4) for k, v in self.timings.items()},
            "notes": self.notes,
        }


# --- timing ---------------------------------------------------------------------------------


class Timer:
    """Wall time per category (decode / gemm / checks), synchronizing CUDA at the boundaries."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.total: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, what: str) -> Iterator[None]:
        self._sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.total[what] = self.total.get(what, 0.0) + time.perf_counter() - t0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


# --- helpers ---------------------------------------------------------------------------------


def parse_layers(spec: str | None) -> list[int] | None:
    """`3`, `3,5`, `3-6`, `all` (None): the grammar of io/layer_spec (UsageError otherwise)."""
    if spec is None or spec.strip() == "":
        return None
    parsed = parse_layer_spec(spec, (ALL,))
    return None if parsed.keywords else sorted(parsed.layers)


def adapter_layers(adapter: Path) -> list[int]:
    """`selected_layers` of a cartridge, read strictly: a defective manifest is an InputError,
    like a defective base (open_base), never a traceback or a hang on a FIFO."""
    from exl3tool.io.jsonfile import read_json
    from exl3tool.rules.registry import Findings

    path = Path(adapter) / "adapter_config.json"
    findings = Findings()
    try:
        m = read_json(path, findings, path.name) if path.is_file() else None
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or exc}") from exc
    layers = m.get("selected_layers", []) if m is not None else None
    if not isinstance(layers, list) or not all(type(x) is int for x in layers):
        errs = findings.errors()
        first = f"{errs[0].code} {errs[0].message}" if errs else "no usable selected_layers"
        raise InputError(f"{adapter}: not a readable MSRT cartridge ({first})")
    return sorted(layers)


def pick_layers(opts: VerifyOptions, moe_layers: list[int]) -> list[int]:
    wanted = set(adapter_layers(opts.adapter))
    if opts.adapter_b is not None:
        wanted |= set(adapter_layers(opts.adapter_b))
    if opts.layers is not None:
        wanted = set(opts.layers)
    missing = sorted(wanted - set(moe_layers))
    if missing:
        raise ValueError(f"layers {missing} are not MoE layers of the base")
    return sorted(wanted)


def _payload_start(path: Path) -> int | None:
    """Offset of the first payload byte of a safetensors file, None when it has none."""
    try:
        with open(path, "rb") as fh:
            start = 8 + int.from_bytes(fh.read(8), "little")
        return start if start < path.stat().st_size else None
    except OSError:
        return None


def _regular(path: Path) -> bool:
    """A regular file, links followed (a Hugging Face cache snapshot links its files into
    blobs/, and staging follows them too)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def corrupt_copy(adapter: Path, out: Path) -> Path:
    """A copy of `adapter` with one byte flipped in the payload of its smallest shard.

    Untouched shards are hard links (never written to); the flipped shard is a real copy. The
    smallest shard keeps the drill cheap: only it is copied, and staging refuses the adapter as
    soon as that shard's digest is known."""
    return corrupt_layout(adapter, out)()


def corrupt_layout(adapter: Path, out: Path) -> Callable[[], Path]:
    """`corrupt_copy` in two steps: the links now, and the returned step that writes the flipped
    shard. A new link changes its source's ctime, which a staging of `adapter` running at that
    moment reports as a changed source (ST023); writing the flipped shard only reads the source,
    so it may run beside such a staging."""
    import json

    from exl3tool.io.paths import relative_path_problem

    manifest = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    # verify-swap lays this out before staging has vetted the manifest: only plain relative
    # names of regular files are opened (a FIFO would block, `..` would escape the adapter)
    paths = [
        p
        for p in (s["path"] for s in manifest["shards"])
        if relative_path_problem(p) is None and _regular(adapter / p)
    ]
    if not paths:
        raise ValueError("no shard of the manifest is a regular file of the adapter")
    with_payload = [p for p in paths if _payload_start(adapter / p) is not None]
    first = (
        min(with_payload, key=lambda p: (adapter / p).stat().st_size) if with_payload else paths[0]
    )
    out.mkdir(parents=True)
    flipped: list[tuple[Path, Path]] = []
    for src in sorted(adapter.rglob("*")):
        rel = src.relative_to(adapter)
        dst = out / rel
        if src.is_dir():
            dst.mkdir(parents=True, exist_ok=True)
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if rel.as_posix() == first:
            flipped.append((src, dst))
            continue
        # a link to the file itself (a cache snapshot's link: to its blob), not a hard link: that
        # would change the input's link count and ctime (inputs are never modified)
        os.symlink(src.resolve(), dst)

    def write_flipped() -> Path:
        for src, dst in flipped:
            shutil.copyfile(src, dst)
            with open(dst, "r+b") as fh:
                header = int.from_bytes(fh.read(8), "little")
                fh.seek(8 + header)
                b = fh.read(1)
                fh.seek(8 + header)
                fh.write(bytes([b[0] ^ 0x01]))
        return out

    return write_flipped


def load_dense(path: Path, layers: list[int], device: torch.device) -> dict[int, dict]:
    """Dense HF weights `model.layers.{L}.mlp.experts.{E}.{proj}.weight` [out, in] -> [in, out]."""
    from exl3tool.runtime.cold import ShardTensors

    files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
    out: dict[int, dict] = {L: {} for L in layers}
    for f in files:
        st = ShardTensors(f.parent, [f.name])
        for name in st.where:
            parts = name.split(".")
            if len(parts) != 8 or parts[-1] != "weight" or parts[4] != "experts":
                continue
            L = int(parts[2])
            if L in out:
                out[L][(int(parts[5]), parts[6])] = st.get(name).t().float().to(device)
        st.release()
    return out


# --- checks shared with the tests ------------------------------------------------------


def check_from(
    name: str, tally: Tally, ok_detail: str, extra_ok: bool = True, why: str = ""
) -> Check:
    passed = tally.equal and extra_ok
    detail = ok_detail if passed else (why or f"outputs differ ({ok_detail})")
    return Check(name, passed, detail, tally.max_abs, tally.first_difference)


def concat_check(
    pieces: dict[tuple[int, int, str], list[list[torch.Tensor]]], cold_a: dict, world: int
) -> Check:
    """pieces: (layer, expert, proj) -> per weight (base, then stages) the rank slices in rank
    order; they must concatenate (gate/up on the output axis, down on the input axis) to the
    full TP=1 effective weights bit for bit."""
    tally = Tally()
    for (L, e, p), per_weight in sorted(pieces.items()):
        full = [cold_a[L].base[(e, p)], *(w for _l, _i, w in cold_a[L].stages[(e, p)])]
        if len(per_weight) != len(full):
            tally.add(
                compare(
                    torch.zeros(len(per_weight)),
                    torch.zeros(len(full)),
                    f"layer {L} expert {e} {p}: stage count",
                )
            )
            continue
        for s, (parts, ref) in enumerate(zip(per_weight, full, strict=True)):
            cat = torch.cat(parts, dim=0 if p == "down_proj" else 1)
            what = "base" if s == 0 else f"stage {s}"
            tally.add(compare(cat, ref, f"layer {L} expert {e} {p} {what} W_eff"))
    return check_from(
        "tp-weights-concatenate",
        tally,
        f"{tally.compared} effective weights: the {world} rank slices concatenate to the TP=1 "
        "weights bit for bit",
    )


def tp_tolerance_check(hot: Outputs, tp1: Outputs, world: int) -> Check:
    worst_abs, worst_rel, worst_ratio = 0.0, 0.0, 0.0
    first = None
    for L in sorted(tp1):
        for i, what in enumerate(("block output", "expert probe")):
            got, want = hot[L][i].double(), tp1[L][i].double()
            d = (got - want).abs()
            peak = float(want.abs().max())
            mx = float(d.max())
            rel = float((got - want).norm() / want.norm()) if float(want.norm()) > 0 else 0.0
            worst_abs, worst_rel = max(worst_abs, mx), max(worst_rel, rel)
            ratio = mx / peak if peak > 0 else 0.0
            worst_ratio = max(worst_ratio, ratio)
            if (ratio > TP_MAX_ABS_REL or rel > TP_REL_L2) and first is None:
                flat = int(torch.argmax(d.reshape(-1)))
                first = {
                    "where": f"layer {L} {what}",
                    "index": [int(x) for x in torch.unravel_index(torch.tensor(flat), d.shape)],
                    "got": float(got.reshape(-1)[flat]),
                    "want": float(want.reshape(-1)[flat]),
                }
    passed = first is None
    return Check(
        "tp-matches-tp1",
        passed,
        f"TP={world} vs TP=1: max_abs {worst_abs:.3g} ({worst_ratio:.3g} of the peak, limit "
        f"{TP_MAX_ABS_REL:.3g}), relative L2 {worst_rel:.3g} (limit {TP_REL_L2:g})",
        worst_abs,
        first,
        {"rel_l2": worst_rel},
    )
