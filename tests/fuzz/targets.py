"""Seed artifacts (tiny `exl3tool.synth` builds, snapshotted as layouts) and the library entry
points a case calls on a mutated copy: validate (with and without --hash), identity, inspect,
stage-cartridge, and an identity record read back (`identity --check`, `diff`, and the layout
scan of records above 64 MiB). Every call's outcome is classified by `run_case`."""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.fuzz.entries import CALLS, identity_of
from tests.fuzz.mutate import Layout, Special, mutate

SEED_KINDS = (
    "exl3", "r7", "rank-sliced", "base", "cartridge", "cartridge-tp2", "record", "slices", "gate"
)  # fmt: skip
# `exl3tool check`: a base and a cartridge beside the config that declares them
GATE_TOML = """schema = "exl3tool-config/1"
hash = true
tp = [2]
threads = 1

[[artifacts]]
name = "base"
path = "base"
role = "base"

[[artifacts]]
name = "k"
path = "cartridge"
role = "cartridge"
base = "base"
"""


def build_seeds(root: Path) -> dict[str, Path]:
    """The tiny valid artifacts every case starts from (built once per campaign)."""
    from exl3tool.synth.exl3 import build_exl3
    from exl3tool.synth.msrt import build_adapter, build_base
    from exl3tool.synth.r7 import build_r7, build_rank_sliced

    root.mkdir(parents=True, exist_ok=True)
    base = build_base(root / "base", layers=(3,), experts=2, hidden=128, intermediate=256)
    seeds = {
        "exl3": build_exl3(root / "exl3"),
        "r7": build_r7(root / "r7"),
        "rank-sliced": build_rank_sliced(root / "rank-sliced"),
        "base": base,
        "cartridge": build_adapter(root / "cartridge", base),
        "cartridge-tp2": build_adapter(
            root / "cartridge-tp2", base, layout="rank-sharded", world_size=2
        ),
    }
    from exl3tool.tp.run import SliceOptions, slice_artifact

    seeds["slices"] = root / "slices"  # the base's TP 2 slices, as `slice -o` writes them
    slice_artifact(base, seeds["slices"], SliceOptions(tp=2, sha256=True))
    gate = seeds["gate"] = root / "gate"
    gate.mkdir()
    (gate / "exl3tool.toml").write_text(GATE_TOML)
    shutil.copytree(base, gate / "base")
    shutil.copytree(seeds["cartridge"], gate / "cartridge")
    seeds["record"] = root / "record"
    seeds["record"].mkdir()
    (seeds["record"] / "record.json").write_text(json.dumps(identity_of(base).to_json(), indent=2))
    return seeds


def snapshot(art: Path) -> Layout:
    out: Layout = {}
    for p in sorted(art.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[p.relative_to(art).as_posix()] = p.read_bytes()
    return out


def materialize(layout: Layout, root: Path) -> None:
    root.mkdir(parents=True)
    for rel, node in layout.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(node, bytes):
            with open(p, "wb") as fh:
                fh.write(node)
        elif isinstance(node, Special):
            if node.kind == "fifo":
                os.mkfifo(p)
            elif node.kind == "dir":
                p.mkdir()
            else:
                os.symlink(node.target, p)


@dataclass(frozen=True)
class Case:
    index: int
    kind: str
    entry: str
    what: str
    layout: Layout


# the identity as the CLI computes it (blake3, the compatibility block, two threads; and hashed
# by forked workers; and hashed ahead, compared with the same without), and with a layer selection and a `sha256sum -c` manifest; validate
# against a TP size
_MORE = (
    "identity-cli",
    "identity-forked",
    "identity-early",
    "identity-manifest",
    "identity-check",
    "validate-tp2",
)
_BASE = ("validate", "validate", "validate-hash", "identity", "stage-base", "load-index", *_MORE)
_CHECKPOINT = (
    "validate",
    "validate",
    "validate-hash",
    "identity",
    "inspect",
    "plan",
    "diff",
    "load-index",  # the index read by its groups vs. parsed
    *_MORE,
)
ENTRIES = {
    "exl3": (*_CHECKPOINT, "slice"),
    "r7": (*_CHECKPOINT, "slice", "validate-ahead"),  # its read-ahead worker vs. one thread
    "rank-sliced": _CHECKPOINT,
    "base": (*_BASE, "slice", "slice-rank-sliced", "slice-expert", "diff"),
    "cartridge": ("validate", "validate-base", "validate-hash", "stage", "stage-tp2"),
    "cartridge-tp2": ("validate", "validate-base", "validate-hash", "stage"),
    "record": ("record-check", "record-scan"),
    "slices": ("slice-verify", "slice-verify-alone", "validate", "identity"),
    "gate": ("check",),
}


def make_case(seed: int, index: int, seeds: dict[str, Layout]) -> Case:
    """Case `index` of campaign `seed`: a pure function of both (replayable)."""
    rng = random.Random(f"{seed}:{index}")
    kind = rng.choice(SEED_KINDS)
    entry = rng.choice(ENTRIES[kind])
    layout = dict(seeds[kind])
    what = mutate(rng, layout)
    return Case(index, kind, entry, what, layout)


def call_entry(case: Case, art: Path, pristine: dict[str, Path], out: Path) -> Any:
    """Call the library entry point of `case` on the mutated artifact at `art`."""
    return CALLS[case.entry](art, pristine, out, case.kind)


def crashed(result: Any) -> str | None:
    """A `check-crashed` finding (an exception the boundary caught) is a bug too."""
    from exl3tool.rules.registry import Findings

    for f in result if isinstance(result, Findings) else ():
        if f.rule.code.endswith("099"):
            return f"{f.rule.code} {f.message}"
    return None


def clean(path: Path) -> None:
    if path.exists() or path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
