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
    (seeds["record"] / "record.json").write_text(json.dumps(_identity(base).to_json(), indent=2))
    return seeds


def _identity(art: Path) -> Any:
    from exl3tool.formats.checkpoint import load_checkpoint
    from exl3tool.identity.fast import compute_identity
    from exl3tool.rules.registry import Findings

    return compute_identity(load_checkpoint(art, Findings()), algo="sha256", threads=1)


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


# the identity as the CLI computes it (blake3, the compatibility block, two threads), and with a
# layer selection and a `sha256sum -c` manifest; validate against a TP size
_MORE = ("identity-cli", "identity-manifest", "identity-check", "validate-tp2")
_BASE = ("validate", "validate", "validate-hash", "identity", "stage-base", *_MORE)
_CHECKPOINT = (
    "validate",
    "validate",
    "validate-hash",
    "identity",
    "inspect",
    "plan",
    "diff",
    *_MORE,
)
ENTRIES = {
    "exl3": (*_CHECKPOINT, "slice"),
    "r7": (*_CHECKPOINT, "slice"),
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
    from exl3tool.actions.validate import validate_path
    from exl3tool.checks.options import ValidateOptions

    e = case.entry
    if e == "validate":
        return validate_path(art, ValidateOptions(threads=1))[1]
    if e == "validate-hash":
        return validate_path(art, ValidateOptions(hash=True, threads=1))[1]
    if e == "validate-tp2":
        return validate_path(art, ValidateOptions(tp=2, threads=1))[1]
    if e.startswith("identity-"):
        from exl3tool.actions.identity import Options as IdentityOptions
        from exl3tool.actions.identity import run as identity

        if e == "identity-cli":
            return identity(IdentityOptions(str(art), threads=2)).findings
        if e == "identity-check":  # the pristine seed's record against the mutant
            out.mkdir(parents=True, exist_ok=True)
            record = identity(IdentityOptions(str(pristine[case.kind]), threads=1))
            assert record.identity is not None
            (out / "record.json").write_text(json.dumps(record.identity.to_json()))
            return identity(
                IdentityOptions(str(art), threads=2, check=out / "record.json")
            ).findings
        opts = IdentityOptions(str(art), algo="sha256", layers="3,other", threads=1,
                               sha256sum=out / "SHA256SUMS")  # fmt: skip
        out.mkdir(parents=True, exist_ok=True)
        return identity(opts).findings
    if e == "validate-base":
        return validate_path(art, ValidateOptions(base=pristine["base"], threads=1))[1]
    if e == "inspect":
        from exl3tool.actions.inspect import describe

        return describe(art).findings
    if e == "identity":
        return _identity(art)
    if e.startswith("record-"):
        return _read_record(e, art / "record.json", pristine)
    if e == "plan":
        from exl3tool.actions.plan import PlanOptions
        from exl3tool.actions.plan import run as plan

        return plan(PlanOptions(str(art), tp=2, gpu_memory=1 << 30)).findings
    if e == "diff":
        from exl3tool.actions.diff import Options as DiffOptions
        from exl3tool.actions.diff import run as diff

        return diff(DiffOptions(str(art), str(pristine[case.kind]), threads=1))
    if e == "check":
        from exl3tool.actions.check import Options as CheckOptions
        from exl3tool.actions.check import run as check

        return check(CheckOptions(config=art / "exl3tool.toml", quiet=True)).report.findings
    if e.startswith("slice-verify"):
        from exl3tool.tp.run import verify_output

        source = pristine["base"] if e == "slice-verify" else None
        return verify_output(art, source, 1)
    if e.startswith("slice"):
        from exl3tool.actions.slice import Options as SliceOptions
        from exl3tool.actions.slice import run as slice_

        layout = "rank-sliced" if e == "slice-rank-sliced" else "per-rank"
        mode = "expert" if e == "slice-expert" else "tensor"
        opts = SliceOptions(str(art), tp=2, mode=mode, layout=layout, max_shard_size="64KiB",
                            verify=True, output=out, threads=1)  # fmt: skip
        return slice_(opts).findings
    from exl3tool.staging.stage import stage_cartridge

    if e == "stage-base":
        adapter, base, tp = pristine["cartridge"], art, None
    else:
        adapter, base, tp = art, pristine["base"], (2 if e == "stage-tp2" else None)
    return stage_cartridge(adapter, base, out=out, tp=tp, threads=1).findings


def _read_record(entry: str, path: Path, pristine: dict[str, Path]) -> Any:
    """`identity --check` and `diff` of a mutated record against its artifact (record-check);
    or the layout scan, whose value, when it gives one, must be what the strict reader gives
    (record-scan)."""
    from exl3tool.identity import compare
    from exl3tool.identity.record_scan import NotARecord, scan_record
    from exl3tool.io.jsonfile import parse_json, read_json_bytes
    from exl3tool.rules.errors import InputError
    from exl3tool.rules.registry import Findings

    findings = Findings()
    if entry == "record-scan":
        try:
            data = read_json_bytes(path, compare.RECORD_MAX_BYTES)
        except (OSError, ValueError):
            return findings
        try:
            value = scan_record(data, lambda rest: parse_json(rest, findings, "r"))
        except NotARecord:
            return findings
        if value is not None and value != parse_json(data, Findings(), "r"):
            raise AssertionError("the layout scan gave another value than the strict parse")
        return findings
    try:
        doc = compare.load_record(path, findings)
    except InputError:
        return findings
    if doc is not None:
        ident = _identity(pristine["base"])
        compare.check(doc, ident, findings, "base")
        compare.diff(doc, ident.to_json())
    return findings


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
