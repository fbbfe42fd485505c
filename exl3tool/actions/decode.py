"""`exl3tool decode`: one EXL3 linear to fp16 safetensors in the Hugging Face orientation
(torch: `exl3tool[runtime]`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exl3tool.actions.inputs import resolve_input
from exl3tool.report.model import ArtifactRef, Report
from exl3tool.rules.errors import UsageError, missing_extra
from exl3tool.rules.registry import Findings


def require_torch(what: str) -> Any:
    """The torch module, or a one-line UsageError naming the extra (exit 2)."""
    try:
        import torch
    except ImportError:
        raise missing_extra("torch", "runtime", what) from None
    return torch


@dataclass(frozen=True)
class Options:
    path: str
    tensor: str  # the linear's prefix, e.g. model.layers.0.mlp.down_proj (".trellis" allowed)
    output: Path
    rotated: bool = False  # write the rotated weight instead of W
    device: str = "cpu"
    force: bool = False


@dataclass
class DecodeResult:
    path: Path
    findings: Findings = field(default_factory=Findings)
    name: str | None = None  # the tensor written, when written
    shape: list[int] | None = None

    def report(self) -> Report:
        return Report([ArtifactRef(str(self.path), "checkpoint", {})], self.findings)

    def exit_code(self) -> int:
        return 0 if self.name is not None else 1


def decode_linear(path: Path, prefix: str, *, rotated: bool, device: str, findings: Findings):
    """fp16 numpy [out, in] of PREFIX (W_eff, or Ŵ with rotated), or None with findings added."""
    from exl3tool.formats.checkpoint import load_checkpoint
    from exl3tool.io.views import TensorReader
    from exl3tool.rules import decode as dc

    ckpt = load_checkpoint(path, findings, need_config=False)
    if findings.has_errors():
        return None
    need = ("trellis",) if rotated else ("trellis", "suh", "svh")
    refs = {s: ckpt.tensors.get(f"{prefix}.{s}") for s in (*need, "mcg", "mul1")}
    for s in need:
        if refs[s] is None:
            findings.add(dc.DC_MISSING, f"{prefix}.{s} not found", tensor=f"{prefix}.{s}")
    if findings.has_errors():
        return None
    tr = refs["trellis"].info
    if tr.dtype != "I16" or len(tr.shape) != 3:
        findings.add(
            dc.DC_SHAPE,
            f"trellis is {tr.dtype} {list(tr.shape)}, expected I16 [k/16, n/16, 16K]",
            tensor=tr.name,
        )
        return None
    k, n = tr.shape[0] * 16, tr.shape[1] * 16
    for s, size in (("suh", k), ("svh", n)):
        ref = refs.get(s)
        if ref is not None and (ref.info.dtype != "F16" or list(ref.info.shape) != [size]):
            findings.add(
                dc.DC_SHAPE,
                f"{s} is {ref.info.dtype} {list(ref.info.shape)}, expected F16 [{size}]",
                tensor=ref.name,
            )
    if not rotated and (k % 128 or n % 128):
        findings.add(dc.DC_SHAPE, f"[{k}, {n}] is not a multiple of 128", tensor=tr.name)
    torch = require_torch("decode")
    from exl3tool import trellis as tc

    try:
        codebook = tc.codebook_from_markers(refs["mcg"] is not None, refs["mul1"] is not None)
        tc.check_rate_codebook(tc.rate_from_words(tr.shape[2]), codebook)
    except tc.TrellisError as exc:
        findings.add(dc.DC_RATE, str(exc), tensor=tr.name)
    if device == "cuda" and not torch.cuda.is_available():
        findings.add(dc.DC_DEVICE, "CUDA is not available here")
    if findings.has_errors():
        return None
    with TensorReader() as reader:
        arr = {s: reader.array(refs[s].shard, refs[s].info) for s in need}
        trellis = torch.from_numpy(arr["trellis"].copy())
        if rotated:
            w = tc.decode_rotated(trellis, codebook, device=device)
        else:
            suh = torch.from_numpy(arr["suh"].copy())
            svh = torch.from_numpy(arr["svh"].copy())
            w = tc.effective_weight(trellis, suh, svh, codebook, device=device)
    return w.t().contiguous().cpu().numpy()


def run(opts: Options) -> DecodeResult:
    from exl3tool.io.atomic import atomic_file
    from exl3tool.io.st_writer import write_arrays
    from exl3tool.report.render import check_output

    if opts.device not in ("cpu", "cuda"):
        raise UsageError(f"unknown --device {opts.device!r}; choose cpu or cuda")
    check_output(opts.output, opts.force, (opts.path,))
    require_torch("decode")
    path = resolve_input(opts.path)
    prefix = opts.tensor.removesuffix(".trellis")
    result = DecodeResult(path)
    weight = decode_linear(
        path, prefix, rotated=opts.rotated, device=opts.device, findings=result.findings
    )
    if weight is None or result.findings.has_errors():
        return result
    name = f"{prefix}.weight_rotated" if opts.rotated else f"{prefix}.weight"
    with atomic_file(opts.output, force=opts.force, inputs=(path,)) as fh:
        write_arrays(fh, {name: weight})
    result.name, result.shape = name, list(weight.shape)
    return result
