"""`exl3tool decode`: one EXL3 linear to fp16 safetensors in the Hugging Face orientation."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from exl3tool.cli.common import EXIT_FINDINGS, EXIT_USAGE, fail, handle_errors
from exl3tool.rules.registry import Findings


def _emit(path: Path, findings: Findings) -> None:
    from exl3tool.report.model import ArtifactRef, Report
    from exl3tool.report.render import emit

    emit(Report([ArtifactRef(str(path), "checkpoint", {})], findings), "text")


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
    import torch

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


@handle_errors
def decode(
    path: Annotated[Path, typer.Argument(help="Checkpoint directory or one .safetensors file.")],
    tensor: Annotated[
        str, typer.Option("--tensor", help="Linear prefix, e.g. model.layers.0.mlp.down_proj.")
    ],
    output: Annotated[Path, typer.Option("-o", "--output", help="Output .safetensors file.")],
    rotated: Annotated[
        bool, typer.Option("--rotated", help="Write Ŵᵀ (PREFIX.weight_rotated) instead of W.")
    ] = False,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda (bit-identical).")] = "cpu",
    force: Annotated[bool, typer.Option("--force", help="Replace an existing output.")] = False,
) -> None:
    """Decode one EXL3 linear to fp16 in HF orientation (out, in), bit-exact with exllamav3."""
    from exl3tool.io.atomic import atomic_file
    from exl3tool.io.st_writer import write_arrays

    if device not in ("cpu", "cuda"):
        fail(f"unknown --device {device!r}; choose cpu or cuda", EXIT_USAGE)
    prefix = tensor.removesuffix(".trellis")
    findings = Findings()
    weight = decode_linear(path, prefix, rotated=rotated, device=device, findings=findings)
    if weight is None or findings.has_errors():
        _emit(path, findings)
        raise typer.Exit(EXIT_FINDINGS)
    name = f"{prefix}.weight_rotated" if rotated else f"{prefix}.weight"
    with atomic_file(output, force=force) as fh:
        write_arrays(fh, {name: weight})
    sys.stdout.write(f"wrote {name} {list(weight.shape)} fp16 -> {output}\n")
