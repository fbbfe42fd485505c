"""A sensible release declaration from bare PATH arguments (no exl3tool.toml), said out loud.

Per detected kind (docs/formats/msrt.md §8, docs/formats/r7.md for the TP fields):
every artifact gets `validate --hash` and its identity root; a rank-sliced checkpoint and a
rank-sharded cartridge are checked at the TP size they were sliced for; a cartridge is matched
against the one MSRT base among the arguments and, with it, verify-swap runs at TP 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exl3tool.actions.gate.config import ArtifactSpec, GateConfig
from exl3tool.formats.detect import Kind, detect
from exl3tool.formats.tail import config_tail
from exl3tool.io.hf_cache import parse_hf_id
from exl3tool.io.jsonfile import read_json
from exl3tool.rules.registry import Findings


def default_role(kind: str) -> str:
    return {"cartridge": "cartridge", "msrt-base": "base"}.get(kind, "checkpoint")


def _json(path: Path) -> Any:
    return read_json(path, Findings(), path.name) if path.is_file() else None


def artifact_dir(path: Path) -> Path:
    """The artifact directory of a path (a config.json, adapter_config.json or shard inside it)."""
    return path.parent if path.is_file() else path


def sliced_tp(path: Path, kind: str) -> int | None:
    """The TP size an artifact was sliced for, when its own metadata says (None otherwise)."""
    root = artifact_dir(path)
    if kind == Kind.RANK_SLICED.value:
        tail = config_tail(_json(root / "config.json"))
        return tail.tp if tail is not None else None  # docs/formats/r7.md §7.1
    if kind == Kind.CARTRIDGE.value:
        manifest = _json(root / "adapter_config.json")
        tpc = manifest.get("tensor_parallel") if isinstance(manifest, dict) else None
        if isinstance(tpc, dict) and tpc.get("layout") == "rank-sharded":
            ws = tpc.get("world_size")
            return ws if type(ws) is int and ws >= 1 else None
    return None


@dataclass(frozen=True)
class Inferred:
    config: GateConfig
    notes: list[str]


def infer(args: list[tuple[str, Path | None]], base: GateConfig | None = None) -> Inferred:
    """Specs for `(argument, resolved local path or None)` pairs; notes say what was inferred.

    `base` carries config-wide settings (hash, tmp_dir ...) when PATHs are added to a config.
    """
    cfg = base or GateConfig(root=Path.cwd())
    kinds = {arg: detect(p).value if p is not None else "unknown" for arg, p in args}
    bases = [arg for arg, _ in args if kinds[arg] == Kind.MSRT_BASE.value]
    bases += [a.label for a in cfg.artifacts if a.role == "base" or a.kind == "msrt-base"]
    specs: list[ArtifactSpec] = []
    notes: list[str] = []
    here = Path.cwd().resolve()
    for arg, path in args:
        kind = kinds[arg]
        if path is not None and not path.is_absolute() and cfg.root.resolve() != here:
            path = path.resolve()  # PATH arguments are relative to the cwd, not the config
        steps = ["validate --hash" if cfg.hash else "validate", "identity root"]
        tp: tuple[int, ...] | None = None
        cart_base: str | None = None
        swap: bool | None = None
        n = sliced_tp(path, kind) if path is not None else None
        if n is not None:
            tp = (n,)
            steps.append(f"validate --tp {n} (the TP size it was sliced for)")
        if kind == Kind.CARTRIDGE.value:
            if len(bases) == 1:
                cart_base = bases[0]
                swap = True
                steps += [f"base match against {cart_base}", "stage", "verify-swap --tp 1"]
            else:
                why = "no MSRT base among the paths" if not bases else "several MSRT bases given"
                steps.append(f"no base match ({why})")
        if path is None:
            steps = ["(not resolved)"]
        notes.append(f"inferred for {arg} ({kind}): {', '.join(steps)}")
        specs.append(
            ArtifactSpec(
                # an HF id stays an id: run_check resolves it again and reports its source
                path=arg if path is None or parse_hf_id(arg) else str(path),
                name=arg,
                role=default_role(kind),
                base=cart_base,
                tp=tp,
                verify_swap=swap,
            )
        )
    if not cfg.tp and not any(s.tp for s in specs):
        notes.append(
            "no TP sizes inferred: declare `tp = [2, 4]` in exl3tool.toml to validate and "
            "slice-verify for your deployment"
        )
    return Inferred(cfg.with_artifacts(specs), notes)
