"""Tensor parallelism of the reference runtime: one process per rank, torch.distributed collectives.

* gloo on CPU, NCCL on CUDA (one GPU per rank, `cuda:LOCAL_RANK`);
* launched locally (`launch_local`: torch.multiprocessing spawn, a free port on 127.0.0.1 only) or
  externally by `torchrun` (`from_env`: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so
  the same code runs across hosts;
* partial fp32 outputs (row-parallel down projections) are summed with `all_reduce`.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from exl3tool.rules.errors import Exl3ToolError, Interrupted


@dataclass
class Comm:
    """This process's place in the TP group; with world_size 1 every collective is the identity."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.distributed:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def all_true(self, ok: bool) -> bool:
        """True on every rank only if `ok` is true on every rank (staging/transaction agreement)."""
        if not self.distributed:
            return ok
        t = torch.tensor([1 if ok else 0], dtype=torch.int32, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return bool(t.item())

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's equally shaped tensor, in rank order (bytes, so any dtype travels exactly)."""
        if not self.distributed:
            return [t]
        raw = t.contiguous().view(torch.uint8).reshape(-1)
        parts = [torch.empty_like(raw) for _ in range(self.world_size)]
        dist.all_gather(parts, raw)
        return [p.view(t.dtype).view(t.shape) for p in parts]

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's picklable object, in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


def backend_for(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def rank_device(device: str, local_rank: int) -> torch.device:
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def env_world() -> tuple[int, int, int] | None:
    """(rank, world_size, local_rank) when started by torchrun, else None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return rank, world, int(os.environ.get("LOCAL_RANK", rank))


def from_env(device: str) -> Comm:
    """Join the process group torchrun set up (env:// rendezvous through MASTER_ADDR/PORT)."""
    found = env_world()
    if found is None:
        return Comm(device=rank_device(device, 0))
    rank, world, local = found
    dev = rank_device(device, local)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(
            backend_for(device), init_method="env://", rank=rank, world_size=world
        )
    return Comm(rank, world, local, dev)


def free_port() -> int:
    """A TCP port free on the loopback interface (the local group never listens elsewhere)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _quiet_signals() -> None:
    """Ctrl-C reaches every rank (the terminal signals the whole process group), SIGTERM the
    ranks the parent stops: a rank then leaves at once and quietly (128 + signal); the parent
    prints the one line and removes the temporary files."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: os._exit(128 + signum))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while the ranks start. The ranks inherit the blocked mask (a
    Ctrl-C while they import torch would print a traceback per rank) and take a pending signal
    once `_quiet_signals` runs. This process defers its own (another thread may receive it) and
    raises it again once every rank has its start-up data, so none is lost or half-sent."""
    from multiprocessing import resource_tracker

    # The first spawn starts multiprocessing's resource tracker, whose start unblocks SIGINT and
    # SIGTERM in the calling thread: the ranks spawned after it would start unprotected.
    resource_tracker.ensure_running()
    held = (signal.SIGINT, signal.SIGTERM)
    main = threading.current_thread() is threading.main_thread()
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda n, _f: caught.append(n)) for s in held} if main else {}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, set(held))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if caught:
            signal.raise_signal(caught[0])


def _stop(processes: list[Any]) -> None:
    """Terminate the ranks still running and reap them (SIGKILL after 2 s: a rank still
    importing torch holds SIGTERM until it can leave quietly)."""
    for proc in processes:
        if proc.is_alive():
            proc.terminate()
    for proc in processes:
        proc.join(2)
        if proc.is_alive():
            proc.kill()
            proc.join()


def _worker(
    local_rank: int,
    world: int,
    port: int,
    device: str,
    fn: Callable[[Comm, Any], Any],
    arg: Any,
    result_dir: str,
) -> None:
    _quiet_signals()
    dev = rank_device(device, local_rank)
    if device == "cpu":  # ranks share the host's cores: do not oversubscribe them
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(
        backend_for(device),
        init_method=f"tcp://127.0.0.1:{port}",
        rank=local_rank,
        world_size=world,
    )
    try:
        try:
            result: Any = fn(Comm(local_rank, world, local_rank, dev), arg)
        except Exception as exc:  # hand it to the parent, which re-raises it (no rank traceback)
            result = RankFailure(exc, traceback.format_exc())
        with open(Path(result_dir) / f"rank{local_rank}.pkl", "wb") as fh:
            pickle.dump(result, fh)
    finally:
        dist.destroy_process_group()


def worker_died(rank: int, exit_code: int | None, signal_name: str | None) -> Exl3ToolError:
    """VS002: one finding for a rank that ended without a result (the others were stopped)."""
    from exl3tool.rules import verify as vs_rules
    from exl3tool.runtime.budget import ResourceRefused

    how = f"was killed by {signal_name}" if signal_name else f"exited with status {exit_code}"
    oom = " (SIGKILL: often the OOM killer)" if signal_name == "SIGKILL" else ""
    return ResourceRefused(
        vs_rules.VS_WORKER.code,
        f"rank {rank} {how}{oom}; the other ranks were stopped and temporary files removed; "
        f"{vs_rules.VS_WORKER.hint}",
    )


@dataclass
class RankFailure:
    """What a spawned rank raised."""

    error: Exception
    traceback: str


def launch_local(fn: Callable[[Comm, Any], Any], arg: Any, world: int, device: str) -> list[Any]:
    """Run `fn(comm, arg)` on `world` spawned ranks on this host; every rank's result, in order.

    fn and arg must be picklable (a module-level function). With world == 1 it runs in-process.
    """
    if world == 1:
        return [fn(Comm(device=rank_device(device, 0)), arg)]
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="exl3tool-tp-") as tmp:
        started: list[Any] = []
        try:
            with _signals_held():
                ctx = mp.start_processes(
                    _worker,
                    args=(world, free_port(), device, fn, arg, tmp),
                    nprocs=world,
                    join=False,
                    start_method="spawn",
                )
                started = ctx.processes
            while not ctx.join():
                pass
        except mp.ProcessExitedException as exc:  # killed (OOM killer, a signal) or exited
            _stop(started)
            if exc.exit_code == 143 or exc.signal_name == "SIGTERM":
                raise Interrupted(signal.SIGTERM) from None
            if exc.exit_code == 130 or exc.signal_name == "SIGINT":
                raise Interrupted(signal.SIGINT) from None
            raise worker_died(exc.error_index, exc.exit_code, exc.signal_name) from None
        except BaseException:  # Ctrl-C or SIGTERM in this process: stop the ranks, then unwind
            _stop(started)
            raise
        results = []
        for r in range(world):
            with open(Path(tmp) / f"rank{r}.pkl", "rb") as fh:
                results.append(pickle.load(fh))
    for r, res in enumerate(results):
        if isinstance(res, RankFailure):
            if isinstance(res.error, (Exl3ToolError, ValueError)):
                raise res.error
            raise RuntimeError(f"rank {r} failed:\n{res.traceback}")
    return results
