"""A swap engine mirroring the serving transaction (docs/formats/msrt.md §10).

    load(A):  stage (verify everything, before any change) → pause → prepare → activate → resume
    deactivate(): pause → release every cartridge runtime (the base path) → resume
    swap A → B: a load while A is active; runtimes of layers common to A and B are reused and
                refilled, the others released (§10.5)

Any failure after the pause rolls back to the base (§10.3: deactivate everything, then resume) and
is re-raised as `RolledBack`; a staging failure raises `StagingFailed` with nothing paused and
nothing changed. Unlike the serving runtime, `status()` names the active adapter (manifest sha256,
assembly and stage labels). `fault_at` names a step at which a test injects a failure; it fires
midway through that step (after its first layer), so a rollback has partial work to undo.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from exl3tool.formats.names import PROJECTIONS
from exl3tool.identity.engine import default_threads
from exl3tool.io.views import TensorReader
from exl3tool.runtime import reads
from exl3tool.runtime.base import BaseModel, cut_field
from exl3tool.runtime.distributed import Comm
from exl3tool.runtime.moe import Routing, expert_mlp, expert_probe, moe_forward
from exl3tool.runtime.msrt import CartridgeLayer, build_layer, project32

STEPS = ("stage", "pause", "prepare", "activate", "resume", "deactivate", "discard")


class InjectedFault(RuntimeError):
    """The failure a test asked for with `fault_at`."""


class TransactionError(RuntimeError):
    """A load that did not complete; `step` is where it failed."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step


class StagingCancelled(RuntimeError):
    """A staging started ahead that nobody will use was told to stop."""


class StagingFailed(TransactionError):
    """Staging rejected the adapter before the pause: nothing changed."""


class RolledBack(TransactionError):
    """A step after the pause failed; the base was restored."""


@dataclass(frozen=True)
class AdapterInfo:
    path: str
    manifest_sha256: str  # the source adapter_config.json
    staged_manifest_sha256: str  # the private staged copy's (rewritten for TP)
    assembly: str
    labels: tuple[str, ...]
    layers: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "manifest_sha256": self.manifest_sha256,
            "staged_manifest_sha256": self.staged_manifest_sha256,
            "assembly": self.assembly,
            "labels": list(self.labels),
            "layers": list(self.layers),
        }


@dataclass
class Staged:
    info: AdapterInfo
    private_dir: Path
    cartridge: Any  # cartridge.model.Cartridge of the private copy
    tables: dict[int, Any]  # layer -> cartridge.tables.LayerTables (this rank's)


def stage_adapter(
    adapter: Path, base: Path, world_size: int, out: Path, progress: Any = None
) -> tuple[Path, str]:
    """Verified private copy via `stage-cartridge`'s code (every §9 check against the base,
    rank-sharded for TP); returns it and the source manifest's sha256 it recorded."""
    from exl3tool.staging.stage import stage_cartridge

    # copy threads: each holds an 8 MiB buffer; ranks share the cores (a fixed memory overhead)
    threads = max(2, default_threads() // world_size)
    result = stage_cartridge(
        Path(adapter),
        Path(base),
        out=out,
        tp=world_size,
        threads=threads,
        progress=progress,
        reuse_base_identity=True,
    )
    return out, str(result.staging["adapter_manifest_sha256"])


def stage_local(
    adapter: Path,
    base: Path,
    rank: int,
    world_size: int,
    num_experts: int,
    work_root: Path | None,
    progress: Any = None,
    prepare: Callable[[], None] | None = None,
) -> tuple[Path, Staged | None, str | None]:
    """This rank's part of staging, with no collective: the verified private copy and every
    layer's tables. Returns (temp dir, staged, None) or (temp dir, None, error). `prepare()` runs
    first (the drill writes its corrupted copy); `progress.advance(n)` is told each copied chunk
    and may raise to stop the staging."""
    from exl3tool.formats.cartridge import load_cartridge
    from exl3tool.formats.cartridge_tables import materialize_tables
    from exl3tool.rules.registry import Findings

    tmp = Path(tempfile.mkdtemp(prefix=f"exl3tool-stage-r{rank}-", dir=work_root))
    try:
        if prepare is not None:
            prepare()
        # source_sha: the identity a publisher knows, the sha256 of the adapter_config.json it
        # ships (a TP-ready staged copy rewrites its manifest, §8)
        private, source_sha = stage_adapter(adapter, base, world_size, tmp / "adapter", progress)
        findings = Findings()
        cart = load_cartridge(private, findings)
        if findings.has_errors() or cart.manifest is None or cart.manifest_bytes is None:
            raise ValueError(f"staged copy does not load: {findings.errors()[:1]}")
        tables = materialize_tables(cart, rank=rank, world_size=world_size, num_experts=num_experts)
        info = AdapterInfo(
            str(adapter),
            source_sha,
            hashlib.sha256(cart.manifest_bytes).hexdigest(),
            str(cart.manifest.get("assembly")),
            tuple(c["label"] for c in cart.manifest["chain"]),
            tuple(sorted(tables)),
        )
        return tmp, Staged(info, tmp, cart, tables), None
    except Exception as exc:  # reported by every rank's agreement (§10.2 step 1)
        error = f"{type(exc).__name__}: {exc}"
        found = getattr(exc, "findings", None)
        if found:
            error += " [" + "; ".join(f"{f.code} {f.message}" for f in list(found)[:3]) + "]"
        return tmp, None, error


def _cut_to(staged: Staged, layers: list[int]) -> Staged:
    """The same staging, for the layers of `layers` only (it may select none of them)."""
    chosen = tuple(L for L in staged.info.layers if L in layers)
    info = dataclasses.replace(staged.info, layers=chosen)
    return Staged(info, staged.private_dir, staged.cartridge, {L: staged.tables[L] for L in chosen})


class StageAhead(threading.Thread):
    """`stage_local` of an adapter on a thread started before the engine that will use it
    exists: verify-swap overlaps staging (bound by one sha256 pass per shard) with the base
    decode. A staging nobody will use is cancelled (`discard`) and stops at its next chunk."""

    def __init__(
        self,
        adapter: Path,
        base: Path,
        rank: int,
        world_size: int,
        num_experts: int,
        work_root: Path | None,
        prepare: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(name=f"exl3tool-stage-ahead-r{rank}", daemon=True)
        self.adapter = Path(adapter)
        self._cancel = threading.Event()
        self._args = (base, rank, world_size, num_experts, work_root, self, prepare)
        self._out: tuple[Path, Staged | None, str | None] | None = None
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self._out = stage_local(self.adapter, *self._args)
        except BaseException as exc:  # raised again by result()
            self._error = exc

    def result(self) -> tuple[Path, Staged | None, str | None]:
        self.join()
        if self._error is not None:
            raise self._error
        assert self._out is not None
        return self._out

    def advance(self, n: int = 1) -> None:
        """The staging's progress: a cancelled one stops at its next chunk."""
        if self._cancel.is_set():
            raise StagingCancelled("the staging was cancelled")

    def discard(self, cancel: bool = False) -> None:
        """Wait for it (cancelled first when `cancel`) and remove what it staged."""
        if cancel:
            self._cancel.set()
        self.join()
        if self._out is not None:
            shutil.rmtree(self._out[0], ignore_errors=True)


@dataclass
class SwapEngine:
    base: BaseModel
    comm: Comm
    device: torch.device
    work_root: Path | None = None
    fault_at: str | None = None
    active: dict[int, CartridgeLayer] = field(default_factory=dict)
    adapter: AdapterInfo | None = None
    staged: Staged | None = None
    pending: dict[int, CartridgeLayer] = field(default_factory=dict)
    paused: bool = False
    events: list[str] = field(default_factory=list)
    reused_layers: list[int] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per step (benchmarks)

    @contextlib.contextmanager
    def _timed(self, step: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.seconds[step] = self.seconds.get(step, 0.0) + time.perf_counter() - t0

    # --- transaction steps -------------------------------------------------------------------

    def _fault(self, step: str) -> None:
        if self.fault_at == step:
            raise InjectedFault(f"fault injected at {step}")

    def stage(self, adapter: Path, ahead: StageAhead | None = None) -> Staged:
        """Copy, verify and materialize this rank's tables; changes nothing that serves.
        `ahead`: this staging, already started on a thread (`StageAhead`)."""
        self.events.append("stage")
        with self._timed("stage"):
            return self._stage(adapter, ahead=ahead)

    def stage_once(self, adapter: Path, ahead: StageAhead | None = None) -> Staged:
        """Stage `adapter` for reuse: every layer's tables, whichever layers this engine holds.

        verify-swap stages each adapter once per rank and hands the result to `load_staged` for
        every layer and drill; the private copy lives until `drop_staged`."""
        self.events.append("stage")
        with self._timed("stage"):
            return self._stage(adapter, every_layer=True, ahead=ahead)

    def _stage(
        self, adapter: Path, every_layer: bool = False, ahead: StageAhead | None = None
    ) -> Staged:
        if ahead is not None:
            if ahead.adapter != Path(adapter):
                raise ValueError(f"the staging started ahead is {ahead.adapter}, not {adapter}")
            tmp, staged, error = ahead.result()
        else:
            tmp, staged, error = stage_local(
                adapter,
                self.base.path,
                self.comm.rank,
                self.comm.world_size,
                self.base.num_experts,
                self.work_root,
            )
        if staged is not None and not every_layer:  # only the layers this engine holds
            staged = _cut_to(staged, self.base.layers)
        if staged is not None and not staged.info.layers:
            staged, error = (
                None,
                "ValueError: the adapter does not select any layer of this runtime",
            )
        if self.fault_at == "stage":
            error = "InjectedFault: fault injected at stage"
        if not self.comm.all_true(error is None):  # every rank agrees before anything changes
            shutil.rmtree(tmp, ignore_errors=True)
            raise StagingFailed("stage", error or "staging failed on another rank")
        if not every_layer:
            self.staged = staged
        assert staged is not None
        return staged

    def load_staged(self, staged: Staged) -> AdapterInfo:
        """The load transaction from an adapter `stage_once` already verified (no copy).

        Only the layers this engine holds are prepared; an adapter that selects none of them
        loads as "nothing active" (its other layers live in other engines). The private copy is
        kept for the next load."""
        self.staged = _cut_to(staged, self.base.layers)
        return self._transaction(keep=True)

    @staticmethod
    def drop_staged(staged: Staged) -> None:
        shutil.rmtree(staged.private_dir, ignore_errors=True)

    def pause(self) -> None:
        self.events.append("pause")
        self.paused = True
        self._fault("pause")

    def prepare(self) -> None:
        """Build runtimes from the verified private bytes only (§10.2 step 4)."""
        self.events.append("prepare")
        with self._timed("prepare"):
            self._prepare()

    def _prepare(self) -> None:
        st = self._require_staged()
        self.pending = {}
        self.reused_layers = []
        threads = reads.read_threads(self.comm.world_size)
        with TensorReader() as rd:

            def read_stages(wanted: list[tuple[str, str]]) -> list[torch.Tensor]:
                refs = [st.cartridge.keys[name] for _, name in wanted]
                got = reads.read_all(
                    [reads.tensor_read(rd, ref.shard, ref.info) for ref in refs],
                    self.device,
                    threads=threads,
                )
                if st.cartridge.layout != "full" or self.comm.world_size == 1:
                    return got
                first, last = self.base.first, self.base.last
                return [
                    cut_field(proj, "trellis", t, first, last)
                    for (proj, _), t in zip(wanted, got, strict=True)
                ]

            for i, layer in enumerate(st.info.layers):
                reuse = self.active.get(layer)
                if reuse is not None:
                    self.reused_layers.append(layer)
                self.pending[layer] = build_layer(
                    layer,
                    st.tables[layer],
                    range(self.base.num_experts),
                    read_stages,
                    self.base.rotations(layer),
                    self.device,
                    into=reuse,
                )
                if i == 0:
                    self._fault("prepare")

    def activate(self) -> None:
        """Make the prepared runtimes live; layers the new adapter does not select are released."""
        self.events.append("activate")
        st = self._require_staged()
        for layer in [L for L in self.active if L not in self.pending]:
            self.active.pop(layer).release()
        for i, (layer, rt) in enumerate(sorted(self.pending.items())):
            self.active[layer] = rt
            if i == 0:
                self._fault("activate")
        if sorted(self.active) != sorted(self.pending):
            raise RuntimeError("prepare/activate mismatch")
        self.pending = {}
        self.adapter = st.info

    def resume(self) -> None:
        self.events.append("resume")
        self.paused = False

    def discard(self) -> None:
        self.events.append("discard")
        if self.staged is not None:
            shutil.rmtree(self.staged.private_dir, ignore_errors=True)
        self.staged = None

    def restore_base(self) -> None:
        """Release every cartridge runtime, active or pending: the compressed base path (§10.3)."""
        for layer in list(self.active):
            self.active.pop(layer).release()
        for rt in self.pending.values():
            rt.release()
        self.pending = {}
        self.adapter = None

    # --- transactions ------------------------------------------------------------------------

    def load(self, adapter: Path, ahead: StageAhead | None = None) -> AdapterInfo:
        """The whole load transaction; a swap when an adapter is already active."""
        self.stage(adapter, ahead)  # StagingFailed: no pause, no resume
        return self._transaction(keep=False)

    def _transaction(self, keep: bool) -> AdapterInfo:
        """pause → prepare → activate → resume on what is staged; rollback on any failure."""
        self.pause()
        try:
            error: str | None = None
            try:
                self.prepare()
                self.activate()
                self._fault("resume")
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
            if not self.comm.all_true(error is None):
                self.events.append("rollback")
                self.restore_base()
                raise RolledBack("load", error or "another rank failed")
        finally:
            if keep:  # a reusable staging (load_staged): forget it, keep its files
                self.staged = None
            else:
                self.discard()
            self.resume()
        assert self.adapter is not None
        return self.adapter

    def deactivate(self) -> int:
        """Back to the base; returns the number of layers released (0: nothing was active)."""
        if not self.active:
            return 0
        self.pause()
        self.events.append("deactivate")
        n = len(self.active)
        self.restore_base()
        self.resume()
        return n

    def status(self) -> dict[str, Any]:
        return {
            "active": bool(self.active),
            "adapter": self.adapter.to_json() if self.adapter else None,
            "layers": sorted(self.active),
            "paused": self.paused,
            "rank": self.comm.rank,
            "world_size": self.comm.world_size,
        }

    def _require_staged(self) -> Staged:
        if self.staged is None:
            raise RuntimeError("nothing is staged")
        return self.staged

    # --- forward -----------------------------------------------------------------------------

    def expert_fn(self, layer: int):
        lin = self.base.linears[layer]
        rt = self.active.get(layer)

        def terms(e: int, p: str):
            return rt.terms_for(e, p) if rt is not None else []

        def fn(e: int, x16: torch.Tensor) -> torch.Tensor:
            return expert_mlp(
                lambda p, x: project32(lin[(e, p)].linear, terms(e, p), x).half(),
                lambda a: project32(lin[(e, "down_proj")].linear, terms(e, "down_proj"), a),
                x16,
            )

        return fn

    def _serving(self) -> None:
        if self.paused:
            raise RuntimeError("the engine is paused")

    def forward(self, layer: int, x16: torch.Tensor, routing: Routing) -> torch.Tensor:
        """fp16 MoE block output of `layer` (all-reduced over TP ranks)."""
        self._serving()
        return moe_forward(
            x16, routing, self.expert_fn(layer), self.comm.all_reduce_sum, self.base.hidden
        )

    def probe(self, layer: int, x16: torch.Tensor, experts: list[int]) -> torch.Tensor:
        """fp32 per-expert outputs of every listed expert on every token (all-reduced)."""
        self._serving()
        return expert_probe(x16, experts, self.expert_fn(layer), self.comm.all_reduce_sum)

    def local_weights(self, layer: int) -> dict[tuple[int, str], list[torch.Tensor]]:
        """This rank's decoded weights per (expert, proj): [base, stage terms in order]."""
        rt = self.active.get(layer)
        out = {}
        for (e, p), b in self.base.linears[layer].items():
            ts = rt.terms_for(e, p) if rt is not None else []
            out[(e, p)] = [b.linear.weight, *(t.linear.weight for t in ts)]
        return out


__all__ = [
    "PROJECTIONS",
    "STEPS",
    "AdapterInfo",
    "InjectedFault",
    "RolledBack",
    "StagingFailed",
    "SwapEngine",
]
