"""Generate the trellis oracle vectors with the real exllamav3 1.6.5 kernels (needs CUDA + exllamav3).

    python benchmarks/make_oracle_vectors.py --out tests/data

Writes `oracle_trellis.json` (case descriptors + sha256 of every exllamav3 output) and
`oracle_trellis_arrays.npz` (a few full outputs for diagnosis). Inputs are regenerated from seeds by
tests/trellis/trellis_oracle_inputs.py, so only hashes need committing. At the end it compares
exl3tool's CPU path with every output and prints the mismatches (0 expected).
"""

# ruff: noqa: B023 - the closures handed to record() run immediately, inside their loop iteration

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "trellis"))

import trellis_oracle_inputs as inp  # noqa: E402

SHAPE_SMALL = (256, 384)  # every combination: Ŵ, W_eff, fused, slice, unpack, pack
SHAPE_ROW = (16, 512)  # single tile row: Ŵ
SHAPE_LARGE = (1024, 768)  # every combination: Ŵ; W_eff for a subset
LARGE_WEFF = {(4, "mul1"), (2.5, "mul1"), (3, "mcg"), (6, "3inst"), (1, "mul1"), (8, "mcg")}
HAD_SHAPES = ((64, 512), (3, 128))
FULL_ARRAYS = {(4, "mul1"), (2.5, "mul1"), (3, "mcg")}


def _ext():
    from exllamav3.ext import exllamav3_ext as ext

    return ext


def _linear(trellis, suh, svh, cb):
    from exllamav3.modules.quant.exl3 import LinearEXL3

    k, n = trellis.shape[0] * 16, trellis.shape[1] * 16
    dev = trellis.device
    mcg = torch.tensor(-877912083, dtype=torch.int32, device=dev) if cb == "mcg" else None
    mul1 = torch.tensor(-2082680531, dtype=torch.int32, device=dev) if cb == "mul1" else None
    return LinearEXL3(None, k, n, suh=suh, svh=svh, trellis=trellis, mcg=mcg, mul1=mul1)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _frac(K):
    return None if float(K).is_integer() else (int(K), 0xAAAA)


def generate(out_dir: Path, device: str = "cuda") -> dict:
    ext = _ext()
    dev = torch.device(device)
    cases: list[dict] = []
    arrays: dict[str, np.ndarray] = {}
    errors: list[str] = []

    def record(case: dict, fn):
        try:
            res = fn()
            case.update(res)
        except Exception as exc:
            case["error"] = f"{type(exc).__name__}: {exc}"
            errors.append(f"{case['kind']} {case.get('K')} {case.get('codebook')}: {case['error']}")
            traceback.print_exc()
        cases.append(case)

    # codebook tables through ext.decode (per-state codebook)
    for cb in ("3inst", "mcg", "mul1"):
        states = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(256, 256).to(dev)

        def lut(cb=cb, states=states):
            o = torch.empty((256, 256), dtype=torch.half, device=dev)
            ext.decode(states, o, cb == "mcg", cb == "mul1")
            return {"sha256": inp.sha(_np(o))}

        record({"kind": "lut", "codebook": cb}, lut)

    for K, cb in inp.COMBOS:
        mcg, mul1 = cb == "mcg", cb == "mul1"
        kf = float(K)
        for shape, salt in ((SHAPE_SMALL, 1), (SHAPE_ROW, 2), (SHAPE_LARGE, 3)):
            k, n = shape
            seed = inp.combo_seed(K, cb, salt)
            tr = torch.from_numpy(inp.trellis_np(seed, k, n, K)).to(dev)

            def rot(tr=tr, k=k, n=n, shape=shape):
                w = torch.empty((k, n), dtype=torch.half, device=dev)
                ext.reconstruct(w, tr, kf, mcg, mul1)
                res = {"w_rot": inp.sha(_np(w))}
                if (K, cb) in FULL_ARRAYS and shape != SHAPE_LARGE:
                    arrays[f"w_rot_{k}x{n}_K{K}_{cb}"] = _np(w)
                return res

            record({"kind": "rot", "K": K, "codebook": cb, "k": k, "n": n, "seed": seed}, rot)

            if shape == SHAPE_SMALL:

                def slice_(tr=tr, k=k):
                    w = torch.empty((k, 256), dtype=torch.half, device=dev)
                    ext.reconstruct_slice(w, tr, kf, mcg, mul1, 128)
                    return {"w_rot_slice": inp.sha(_np(w)), "n_offset": 128, "width": 256}

                record(
                    {"kind": "rot_slice", "K": K, "codebook": cb, "k": k, "n": n, "seed": seed},
                    slice_,
                )

                def unpacked(tr=tr):
                    u = torch.empty((*tr.shape[:2], 256), dtype=torch.int16, device=dev)
                    fr = _frac(K)
                    if fr is None:
                        ext.unpack_trellis(u, tr, int(K))
                    else:
                        ext.unpack_trellis_frac(u, tr, fr[0], fr[1])
                    return {"states": inp.sha(_np(u))}

                record(
                    {"kind": "unpack", "K": K, "codebook": cb, "k": k, "n": n, "seed": seed},
                    unpacked,
                )

                pseed = inp.combo_seed(K, cb, 7)

                def packed(pseed=pseed):
                    st = torch.from_numpy(inp.states_np(pseed, (4, 6))).to(dev)
                    pk = torch.zeros((4, 6, inp.words(K)), dtype=torch.int16, device=dev)
                    fr = _frac(K)
                    if fr is None:
                        ext.pack_trellis(pk, st.contiguous(), int(K))
                    else:
                        ext.pack_trellis_frac(pk, st.contiguous(), fr[0], fr[1])
                    return {"packed": inp.sha(_np(pk))}

                record({"kind": "pack", "K": K, "codebook": cb, "seed": pseed}, packed)

            if shape == SHAPE_SMALL or (shape == SHAPE_LARGE and (K, cb) in LARGE_WEFF):
                sseed = inp.combo_seed(K, cb, 11 + salt)
                suh = torch.from_numpy(inp.scales_np(sseed, k)).to(dev)
                svh = torch.from_numpy(inp.scales_np(sseed + 1, n)).to(dev)

                def weff(tr=tr, suh=suh, svh=svh, k=k, n=n, shape=shape):
                    lin = _linear(tr, suh, svh, cb)
                    w = lin.get_weight_tensor()
                    wf = torch.empty((k, n), dtype=torch.half, device=dev)
                    ext.reconstruct_had_slice(wf, tr, suh, svh, kf, mcg, mul1, 0)
                    res = {"w_eff": inp.sha(_np(w)), "w_fused": inp.sha(_np(wf))}
                    if (K, cb) in FULL_ARRAYS and shape == SHAPE_SMALL:
                        arrays[f"w_eff_{k}x{n}_K{K}_{cb}"] = _np(w)
                        arrays[f"w_fused_{k}x{n}_K{K}_{cb}"] = _np(wf)
                    return res

                record(
                    {
                        "kind": "eff",
                        "K": K,
                        "codebook": cb,
                        "k": k,
                        "n": n,
                        "seed": seed,
                        "scale_seed": sseed,
                    },
                    weff,
                )

    # had_r_128 (fp16): none / pre / post, two scales
    for hi, (rows, cols) in enumerate(HAD_SHAPES):
        for mode in ("none", "pre", "post"):
            for scale in (1.0, 0.5):
                seed = 5000 + hi * 100 + ("none", "pre", "post").index(mode) * 10 + int(scale * 2)
                x = torch.from_numpy(inp.fp16_np(seed, (rows, cols))).to(dev)
                sc = torch.from_numpy(inp.scales_np(seed + 1, cols)).to(dev)

                def had(x=x, sc=sc, mode=mode, scale=scale, rows=rows, cols=cols, seed=seed):
                    y = torch.empty_like(x)
                    ext.had_r_128(
                        x, y, sc if mode == "pre" else None, sc if mode == "post" else None, scale
                    )
                    if hi == 0 and scale == 1.0:
                        arrays[f"had_{mode}_{rows}x{cols}"] = _np(y)
                    return {"y": inp.sha(_np(y))}

                record(
                    {
                        "kind": "had",
                        "mode": mode,
                        "scale": scale,
                        "rows": rows,
                        "cols": cols,
                        "seed": seed,
                    },
                    had,
                )

    from exllamav3.version import __version__ as exllamav3_version

    meta = {
        "generator": "benchmarks/make_oracle_vectors.py",
        "exllamav3": exllamav3_version,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else str(dev),
        "errors": errors,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "oracle_trellis.json").write_text(
        json.dumps({"meta": meta, "cases": cases}, indent=1) + "\n"
    )
    np.savez_compressed(out_dir / "oracle_trellis_arrays.npz", **arrays)
    return {"meta": meta, "cases": cases}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data")
    ap.add_argument("--device", default="cuda", help="cpu only for a dry run with a stand-in ext")
    ap.add_argument("--no-check", action="store_true", help="skip comparing exl3tool's CPU path")
    args = ap.parse_args()
    t0 = time.perf_counter()
    data = generate(args.out, args.device)
    print(
        f"generated {len(data['cases'])} cases in {time.perf_counter() - t0:.1f} s; errors: {data['meta']['errors']}"
    )
    if args.no_check:
        return 0
    from oracle_check import check_cases  # tests/trellis/oracle_check.py

    bad = check_cases(data["cases"])
    print(f"exl3tool CPU path vs exllamav3: {len(bad)} mismatching cases")
    for b in bad[:50]:
        print("  MISMATCH", b)
    return 1 if bad or data["meta"]["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
