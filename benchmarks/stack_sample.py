"""Run a Python script under a wall-clock stack sampler (every thread, low overhead).

    python benchmarks/stack_sample.py [--interval-ms 2] [--top 40] [--out FILE] SCRIPT [ARGS...]

cProfile slows Python-heavy code by 1.5-2x and sees only the main thread; this samples
`sys._current_frames()` from a background thread instead, so waits (GPU syncs, reads, locks)
show up as the wall time they cost. Prints, per thread name, the functions seen on the stack
(inclusive share) and at its top (exclusive share), as `file:line function`.
"""

from __future__ import annotations

import argparse
import collections
import runpy
import sys
import threading
import time
from pathlib import Path


def _where(code) -> str:
    return f"{Path(code.co_filename).name}:{code.co_firstlineno} {code.co_name}"


class Sampler(threading.Thread):
    def __init__(self, interval: float) -> None:
        super().__init__(name="stack-sampler", daemon=True)
        self.interval = interval
        self.stop = threading.Event()
        self.total: collections.Counter[str] = collections.Counter()
        self.inclusive: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        self.exclusive: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )

    def run(self) -> None:
        me = threading.get_ident()
        while not self.stop.wait(self.interval):
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                thread = names.get(ident, str(ident))
                self.total[thread] += 1
                self.exclusive[thread][_where(frame.f_code)] += 1
                seen = set()
                while frame is not None:
                    w = _where(frame.f_code)
                    if w not in seen:
                        seen.add(w)
                        self.inclusive[thread][w] += 1
                    frame = frame.f_back

    def report(self, top: int, wall: float) -> str:
        lines = [f"wall {wall:.2f} s, sampling every {self.interval * 1e3:.1f} ms"]
        for thread, n in self.total.most_common():
            lines.append(f"\n== thread {thread}: {n} samples (~{n * self.interval:.2f} s)")
            for title, table in (("inclusive", self.inclusive), ("exclusive", self.exclusive)):
                lines.append(f"-- {title}")
                for w, c in table[thread].most_common(top):
                    lines.append(f"{100 * c / n:6.1f}%  {c * self.interval:8.2f} s  {w}")
        return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interval-ms", type=float, default=2.0)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    sampler = Sampler(a.interval_ms / 1e3)
    sys.argv = [a.script, *a.args]
    sampler.start()
    t0 = time.perf_counter()
    code = 0
    try:
        runpy.run_path(a.script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    finally:
        sampler.stop.set()
        sampler.join()
        text = sampler.report(a.top, time.perf_counter() - t0)
        if a.out is not None:
            a.out.write_text(text + "\n")
        print(text, file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
