"""Build the committed MSRT examples: a tiny `exl3-msrt-base/1` base and a 2-stage cartridge for it.

    python examples/make_msrt_examples.py            # (re)write examples/msrt-base-tiny, cartridge-k3k4
    python examples/make_msrt_examples.py --check    # build in a temp dir, compare with the committed bytes

Deterministic: the same code gives the same bytes (tests/cartridge/test_examples.py checks it).
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

from exl3tool.synth.msrt import build_adapter, build_base

HERE = Path(__file__).resolve().parent
BASE = "msrt-base-tiny"
CARTRIDGE = "cartridge-k3k4"


def build(root: Path) -> tuple[Path, Path]:
    """Base: layers 3-4, 4 experts, hidden 128, intermediate 256 (TP 2 leaves 128 per rank), K=2.
    Cartridge: stages k3 (K=1, every expert) and k4 (K=1, experts 0-2: a sparse stage)."""
    base = build_base(root / BASE, layers=(3, 4), experts=4, hidden=128, intermediate=256, k=2)
    cart = build_adapter(
        root / CARTRIDGE,
        base,
        chain=(("k3", 1), ("k4", 1)),
        experts=[[0, 1, 2, 3], [0, 1, 2]],
        assembly="tiny-k3k4",
    )
    return base, cart


def differences(a: Path, b: Path) -> list[str]:
    """Relative paths whose presence or bytes differ between two trees."""
    out = []
    names = {p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file()}
    names |= {p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file()}
    for n in sorted(names):
        pa, pb = a / n, b / n
        if not (pa.is_file() and pb.is_file() and filecmp.cmp(pa, pb, shallow=False)):
            out.append(n)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--check", action="store_true", help="compare a fresh build with the committed one"
    )
    args = ap.parse_args(argv)
    if not args.check:
        build(HERE)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp))
        diff = [f"{d}/{n}" for d in (BASE, CARTRIDGE) for n in differences(HERE / d, Path(tmp) / d)]
    for d in diff:
        print(f"differs: {d}", file=sys.stderr)
    return 1 if diff else 0


if __name__ == "__main__":
    raise SystemExit(main())
