"""Regenerate the bundled examples (deterministic bytes; tests compare them to a fresh build).

python examples/make_examples.py            # rewrites examples/r7-tiny
python examples/make_examples.py --check    # exit 1 if the committed bytes differ
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

from exl3tool.io.atomic import atomic_dir
from exl3tool.synth.r7 import R7Spec, build_r7

HERE = Path(__file__).resolve().parent
PROJ = ("gate_proj", "up_proj", "down_proj")


def r7_tiny_spec() -> R7Spec:
    """GLM-style R7: MoE layers 1..2 of 3, 4 experts, hidden 128, expert intermediate 128,
    carried MTP layer 3. Layer 1 mixes K 3/4/5 (tier 3), layer 2 uses K 3 and 5 (tier 2)."""
    k_map = {(2, e, p): (3 if (e + i) % 2 else 5) for e in range(4) for i, p in enumerate(PROJ)}
    return R7Spec(
        num_hidden_layers=3,
        first_moe_layer=1,
        n_experts=4,
        hidden=128,
        moe_intermediate=128,
        k_map=k_map,
        dense_width=16,
        vocab=32,
        seed=2026,
    )


EXAMPLES = {"r7-tiny": lambda root: build_r7(root, r7_tiny_spec())}


def build_all(dest: Path, force: bool = True) -> None:
    for name, build in EXAMPLES.items():
        with atomic_dir(dest / name, force=force) as tmp:
            tmp.rmdir()  # builders create their directory
            build(tmp)


def differs(a: Path, b: Path) -> list[str]:
    cmp = filecmp.dircmp(a, b)
    out = cmp.left_only + cmp.right_only + cmp.diff_files
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    return sorted(set(out + mismatch + errors))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args()
    if not args.check:
        build_all(HERE)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        build_all(Path(tmp))
        bad = {n: differs(HERE / n, Path(tmp) / n) for n in EXAMPLES}
    bad = {n: d for n, d in bad.items() if d}
    for n, d in bad.items():
        print(f"examples/{n}: differs from a fresh build: {', '.join(d)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
