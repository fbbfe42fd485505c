"""Pages a hashing pass leaves mapped behind its page drops, by drop alignment (issue 17's
< 300 MB target; docs in exl3tool/io/lease.py `DROP_ALIGN`).

    python3 benchmarks/drop_residue_probe.py SHARD [SHARD ...] [--span-mb 4] [--align-kb 64,2048]

Hashes every tensor of each shard in this process as one worker of a 16-worker pool does
(a page drop every --span-mb MB, MAP_RESIDENT / 16), once per drop alignment (64 KiB was
the alignment before 2 MiB), and prints how many pages of the mapping were still resident
when the pass closed it (/proc/self/pagemap) and how many of those were parts of large page
cache folios (/proc/kpageflags, where readable). The result depends on how the file's pages
sit in the page cache: a file written by a writer of ~100 KB - 1 MB pieces, or read back
under memory pressure, has folios of many sizes; one written in one piece has 2 MiB folios.
Linux only.
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exl3tool.identity import engine  # noqa: E402
from exl3tool.io import lease  # noqa: E402
from exl3tool.io.safetensors import read_header  # noqa: E402
from exl3tool.rules.registry import Findings  # noqa: E402

PAGE = 4096


def _resident(path: Path) -> tuple[int, int]:
    """(resident pages, of them parts of large folios or -1) of this process's map of path."""
    lines = [
        ln for ln in Path("/proc/self/maps").read_text().splitlines() if ln.endswith(str(path))
    ]
    if not lines:
        return 0, 0
    lo, hi = (int(x, 16) for x in lines[-1].split()[0].split("-"))
    with open("/proc/self/pagemap", "rb") as pm:
        pm.seek(lo // PAGE * 8)
        n = (hi - lo) // PAGE
        entries = struct.unpack(f"{n}Q", pm.read(n * 8))
    present = [e for e in entries if e >> 63 & 1]
    try:
        with open("/proc/kpageflags", "rb") as kf:
            large = 0
            for e in present:
                kf.seek((e & ((1 << 55) - 1)) * 8)
                flags = struct.unpack("Q", kf.read(8))[0]
                large += (flags >> 15 | flags >> 16) & 1  # COMPOUND_HEAD or COMPOUND_TAIL
    except OSError:
        large = -1
    return len(present), large


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shards", type=Path, nargs="+")
    ap.add_argument("--span-mb", type=float, default=4.0)
    ap.add_argument("--align-kb", default="64,2048")
    ap.add_argument(
        "--evict", action="store_true", help="drop the shards' cached pages before each pass"
    )
    args = ap.parse_args()
    engine.MAP_RESIDENT = int(args.span_mb * (1 << 20))  # one thread: a drop every span
    for kb in map(int, args.align_kb.split(",")):
        lease.DROP_ALIGN = engine.DROP_ALIGN = kb << 10
        pages = large = 0
        for path in args.shards:
            if args.evict:
                _evict(path)
            st = read_header(path, Findings())
            if st is None:
                raise SystemExit(f"{path}: not a readable safetensors file")
            close_all = engine._close_all

            def closing(files: dict, path: Path = path, close_all=close_all) -> None:
                nonlocal pages, large
                p, g = _resident(path)
                pages, large = pages + p, large + g if g >= 0 and large >= 0 else -1
                close_all(files)

            engine._close_all = closing
            try:
                jobs = [(n, (engine.tensor_segment(st, t),)) for n, t in st.tensors.items()]
                engine.hash_segments(jobs, "blake3", 1, expected={path: st.stamp})
            finally:
                engine._close_all = close_all
        print(
            f"drop alignment {kb:5d} KiB, a drop every {args.span_mb:g} MB: "
            f"{pages * PAGE / 1e6:8.2f} MB left mapped at close "
            f"({'?' if large < 0 else f'{large * PAGE / 1e6:.2f} MB'} in large folios)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
