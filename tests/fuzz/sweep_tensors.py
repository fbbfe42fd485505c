"""`python3 -m tests.fuzz.sweep_tensors`: every command over tensors whose bytes still match
their header (a sweep, not a random campaign).

The campaign's mutations mostly break a header's own consistency, which the container checks
catch first. This sweep keeps every span valid and changes what a tensor *is*: reshaped (the
same element count in another rank: flattened, a leading or trailing 1, merged or swapped last
axes, its first element as a scalar), retyped (the same bytes read as another dtype, the last axis scaled) or
emptied (a zero-length first or last axis). One tensor of each role (trellis, scale vectors,
markers, R7's shared vectors, norms, embeddings) of the R7, EXL3 and MSRT-base fixtures, and
of a cartridge (and, with `--kinds rank-sliced`, a legacy rank-sliced checkpoint), is changed
in turn; every command that reads the artifact runs as a process.
A run that prints a traceback or exits other than 0-3 is reported; exit 1 if any did.
Needs torch (bf16 tensors are rewritten through safetensors.torch).

    python3 -m tests.fuzz.sweep_tensors [--kinds r7,exl3,base,cartridge,rank-sliced] [--variants N]
                                        [--only NAME_PART] [--commands slice,validate,...]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script path: make `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tp"))

import tp_fixtures as fx

from exl3tool.synth.r7 import build_rank_sliced

ROLES = (
    ".trellis", ".suh", ".svh", ".mcg", ".mul1", ".scale", "gate_up_suh", "down_svh",
    "norm.weight", "embed_tokens.weight",
)  # fmt: skip
BUILDERS: dict[str, Callable[[Path], Path]] = {
    "r7": fx.r7, "exl3": fx.exl3, "base": fx.base, "rank-sliced": build_rank_sliced,
}  # fmt: skip


def variants(t: Any) -> dict[str, Any]:
    """The changed tensors of `t` (a torch tensor): reshaped, retyped, emptied."""
    import torch

    shape = tuple(t.shape)
    n = t.numel()
    out: dict[str, Any] = {"flat": t.reshape(n), "lead1": t.reshape(1, *shape)}
    out["tail1"] = t.reshape(*shape, 1)
    if len(shape) >= 2:
        out["merge"] = t.reshape(*shape[:-2], shape[-2] * shape[-1])
        out["swap"] = t.reshape(*shape[:-2], shape[-1], shape[-2])
    if n:
        out["scalar"] = t.reshape(-1)[:1].reshape(())  # its first element alone
    last = shape[-1] if shape else 1
    raw = t.contiguous().reshape(*(shape or (1,))).view(torch.uint8)
    for dt in (torch.uint8, torch.int16, torch.float16, torch.bfloat16, torch.int32, torch.float32,
               torch.float64):  # fmt: skip
        size = torch.empty((), dtype=dt).element_size()
        if dt == t.dtype or (last * t.element_size()) % size:
            continue
        out[f"as-{str(dt).split('.')[-1]}"] = raw.view(dt)
    out["bool"] = raw > 0
    out["empty-first"] = torch.empty((0, *shape[1:]), dtype=t.dtype)
    out["empty-last"] = torch.empty((*shape[:-1], 0), dtype=t.dtype)
    return out


def _commands(kind: str, src: Path, pristine: Path, base: Path | None, name: str, out: Path):
    if kind == "cartridge":
        assert base is not None
        return [
            ["validate", src, "--base", base],
            ["validate", src],
            ["stage-cartridge", src, "--base", base, "--tp", "2", "-o", out / "staged"],
            ["slice", src, "--tp", "2", "-o", out / "sliced"],
            ["identity", src],
            ["inspect", src],
            ["diff", pristine, src],
        ]
    return [
        ["validate", src],
        ["validate", src, "--tp", "2"],
        ["inspect", src],
        ["plan", src, "--tp", "2"],
        ["identity", src],
        ["diff", pristine, src],
        ["slice", src, "--tp", "2", "-o", out / "sliced"],
        ["decode", src, "--tensor", name.rsplit(".", 1)[0], "-o", out / "w.safetensors"],
    ]


def _artifact(kind: str, root: Path) -> tuple[Path, Path | None]:
    if kind == "cartridge":
        base = fx.base(root / "base")
        return fx.cartridge(root / "cartridge", base), base
    return BUILDERS[kind](root / kind), None


def _picks(src: Path) -> Iterator[tuple[Path, str]]:
    """(shard, name) of one tensor per role in each routed-expert projection and one among the
    rest (the middle one of each, in name order)."""
    from safetensors import safe_open

    where = {}
    for p in sorted(src.rglob("*.safetensors")):
        with safe_open(str(p), "pt") as f:
            where.update(dict.fromkeys(f.keys(), p))
    names = sorted(where)
    seen: set[str] = set()
    for role in ROLES:
        # a cartridge's fields carry their K: `trellis_k3`, `scale_k3`
        hits = [n for n in names if n.endswith(role) or role.strip(".") in n.rsplit(".", 1)[-1]]
        for family in ("gate_proj", "up_proj", "down_proj", None):
            routed = [n for n in hits if ".mlp.experts." in n and "r7_shared" not in n]
            group = (
                [n for n in routed if family in n] if family else sorted(set(hits) - set(routed))
            )
            if group and (name := group[len(group) // 2]) not in seen:
                seen.add(name)
                yield where[name], name


def sweep(
    kinds: list[str],
    max_variants: int | None = None,
    *,
    only: str | None = None,
    commands: set[str] | None = None,
    log: Callable[[str], object] = print,
) -> tuple[int, list[str]]:
    """Run the sweep (`only`: tensors whose name holds it; `commands`: these commands only);
    returns (command runs, the bad ones as lines)."""
    from safetensors.torch import load_file, save_file

    runs, bad = 0, []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            root = Path(tmp) / kind
            pristine, base = _artifact(kind, root)
            for shard, name in _picks(pristine):
                if only is not None and only not in name:
                    continue
                tensors = load_file(str(shard))
                for label, new in list(variants(tensors[name]).items())[:max_variants]:
                    work = Path(tmp) / "work"
                    src = work / pristine.name
                    shutil.copytree(pristine, src)
                    changed = src / shard.relative_to(pristine)
                    save_file({**tensors, name: new.contiguous()}, str(changed))
                    for cmd in _commands(kind, src, pristine, base, name, work):
                        if commands is not None and cmd[0] not in commands:
                            continue
                        p = subprocess.run(
                            [sys.executable, "-m", "exl3tool", *map(str, cmd)],
                            capture_output=True, text=True, timeout=300,
                        )  # fmt: skip
                        runs += 1
                        text = p.stdout + p.stderr
                        if "Traceback" in text or p.returncode not in (0, 1, 2, 3):
                            last = text.strip().splitlines()[-1][:200] if text.strip() else ""
                            line = f"{kind} {name} {label} {cmd[0]}: exit {p.returncode}: {last}"
                            bad.append(line)
                            log("BAD " + line)
                    shutil.rmtree(work)
    return runs, bad


def main() -> int:
    ap = argparse.ArgumentParser(
        prog="tests.fuzz.sweep_tensors", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--kinds", default="r7,exl3,base,cartridge")
    ap.add_argument("--variants", type=int, default=None, help="at most this many per tensor")
    ap.add_argument("--only", default=None, help="tensors whose name holds this")
    ap.add_argument("--commands", default=None, help="e.g. slice,validate (default: all)")
    args = ap.parse_args()
    cmds = set(args.commands.split(",")) if args.commands else None
    runs, bad = sweep(args.kinds.split(","), args.variants, only=args.only, commands=cmds)
    print(f"{runs} command runs, {len(bad)} bad")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
