"""Checks of an MSRT cartridge (`fq-cartridge-adapter/3`), alone or against its base (§9 A-E).

Order: path hygiene and the key index (while loading), the JSON Schema, the semantic manifest
rules, the tensor rules, then with `options.base` the model-matching rules and with `options.tp`
the runtime TP contract. Shard sizes are always compared; shard sha256 only with `options.hash`
(`stage-cartridge` hashes while copying). With `--base`, the base's identity is the one it
publishes (its root must match its own map); with `--hash` it is recomputed from the bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exl3tool.checks.cartridge_manifest import check_manifest, ints
from exl3tool.checks.cartridge_tensors import Geometry, check_tensors
from exl3tool.checks.options import ValidateOptions
from exl3tool.formats import msrt_spec as spec
from exl3tool.formats.cartridge import Cartridge, load_cartridge
from exl3tool.io.safetensors import FileStamp
from exl3tool.io.strict_json import pointer_join
from exl3tool.rules import cartridge as ca
from exl3tool.rules.registry import Findings

KIND = "cartridge"


@dataclass
class BaseInfo:
    """What a cartridge is matched against: the base's verified identity and sizes."""

    path: Path
    k: int | None
    root: str | None
    layers: dict[str, str]
    hidden: int | None
    intermediate: int | None
    num_experts: int | None
    # each shard's stamp when its header was read: stage-cartridge proves them unchanged
    # before it publishes (issue 15 item 5)
    inputs: dict[Path, FileStamp] = field(default_factory=dict)

    @property
    def geometry(self) -> Geometry | None:
        if self.hidden is None or self.intermediate is None:
            return None
        return Geometry(self.hidden, self.intermediate, self.num_experts)


def load_base_info(
    base: Path,
    findings: Findings,
    *,
    recompute: bool,
    threads: int | None = None,
    reuse: bool = False,
) -> BaseInfo | None:
    """Read a base's profile; with `recompute` its identity comes from the tensor bytes (§6.4),
    with `reuse` at most once per process while the shards are unchanged (verify-swap).

    Problems with the base (not an exl3-msrt-base/1, identity not self-consistent or not matching
    its bytes) are CA070 findings: the runtime refuses a base without a verified identity.
    """
    from exl3tool.formats.checkpoint import load_checkpoint
    from exl3tool.formats.msrt_base import read_base_profile
    from exl3tool.identity.compat import cached_compat_identity, compat_identity, root_digest

    base = Path(base)
    local = Findings()
    ckpt = load_checkpoint(base, local)
    errors = local.errors()
    if errors:  # a base that does not load (a shard absent, cut, not safetensors): no match
        first = errors[0]
        where = f"{first.location.file}: " if first.location.file else ""
        findings.add(
            ca.CA_BASE_KIND,
            f"{base}: the base does not load ({len(errors)} errors; first {first.code} "
            f"{where}{first.message}); nothing is matched against it: run `exl3tool validate` "
            "on the base",
        )
        return None
    profile = read_base_profile(ckpt.config)
    if profile is None:
        findings.add(
            ca.CA_BASE_KIND,
            f"{base}: Model is not compatible with EXL3 cartridges (no exl3-msrt-base/1 profile)",
        )
        return None
    k, root, by_layer = profile.k, profile.root, dict(profile.by_layer)
    if k is None or root is None or root_digest(k, by_layer) != root:
        findings.add(
            ca.CA_BASE_KIND,
            f"{base}: the base's compatibility_sha256 does not match its compatibility_by_layer",
        )
    if recompute and k is not None:
        ident = (
            cached_compat_identity(ckpt, k=k, threads=threads)
            if reuse
            else compat_identity(ckpt, k=k, threads=threads)
        )
        if ident.root != root or ident.layers != by_layer:
            findings.add(
                ca.CA_BASE_KIND,
                f"{base}: Loaded EXL3 base has no verified compatibility_sha256 (its bytes give {ident.root})",
            )
            root, by_layer = ident.root, dict(ident.layers)
    hidden, inter, experts = profile.hidden, profile.intermediate, profile.experts_per_layer
    inputs = {st.path: st.stamp for st in ckpt.shards.values()}
    return BaseInfo(base, k, root, by_layer, hidden, inter, experts, inputs)


def _match_base(cart: Cartridge, base: BaseInfo, findings: Findings) -> None:
    """§6.4 and §9 E: root, per-layer digests, K, selected layers."""
    blk = cart.field("base")
    if not isinstance(blk, dict):
        return
    f = spec.ADAPTER_CONFIG
    if blk.get("compatibility_sha256") != base.root:
        findings.add(
            ca.CA_BASE_ROOT,
            f"EXL3 cartridge was encoded for a different base checkpoint (base root {base.root})",
            file=f,
            pointer="/base/compatibility_sha256",
        )
    if type(blk.get("k")) is int and base.k is not None and blk["k"] != base.k:
        findings.add(
            ca.CA_BASE_K,
            f"base.k {blk['k']} does not match the base's uniform K {base.k}",
            file=f,
            pointer="/base/k",
        )
    by_layer = blk.get("compatibility_by_layer")
    for L, digest in sorted(by_layer.items()) if isinstance(by_layer, dict) else []:
        have = base.layers.get(L)
        ptr = pointer_join("/base/compatibility_by_layer", L)
        if have is None:
            findings.add(
                ca.CA_BASE_LAYER_MISSING,
                f"layer {L} is not an MoE layer of the base",
                file=f,
                pointer=ptr,
            )
        elif have != digest:
            findings.add(
                ca.CA_BASE_LAYER,
                f"base compatibility identity differs at layer {L}",
                file=f,
                pointer=ptr,
            )
    for L in ints(cart.field("selected_layers")) or []:
        if str(L) not in base.layers and not (isinstance(by_layer, dict) and str(L) in by_layer):
            findings.add(
                ca.CA_BASE_LAYER_MISSING,
                f"selected layer {L} is not an MoE layer of the base",
                file=f,
                pointer="/selected_layers",
            )


def check_tp(cart: Cartridge, tp: int, intermediate: int | None, findings: Findings) -> None:
    """Rule 15 / §8: the runtime TP contract at TP size `tp`."""
    f = spec.ADAPTER_CONFIG
    if cart.layout == "rank-sharded" and cart.world_size != tp:
        findings.add(
            ca.CA_TP_SIZE,
            f"cartridge TP topology world_size={cart.world_size} does not match runtime TP {tp}",
            file=f,
            pointer="/tensor_parallel/world_size",
        )
        return
    if cart.layout == "full" and intermediate is not None:
        full = spec.ceil128(intermediate)
        if full % tp or (full // tp) % 128:
            findings.add(
                ca.CA_TP_ALIGN,
                f"intermediate size {intermediate} / TP {tp} = {full / tp:g} is not a multiple of 128",
                file=f,
                pointer="/tensor_parallel",
            )


def _intermediate_from_tensors(cart: Cartridge) -> int | None:
    for key in cart.stage_keys():
        if key.component == "trellis" and key.proj == "gate_proj":
            shape = cart.keys[key.name].info.shape
            if len(shape) == 3:
                return shape[1] * 16
    return None


def check_shard_hashes(cart: Cartridge, findings: Findings, threads: int | None = None) -> None:
    """Rule 5: each shard's sha256 equals the manifest (reads every byte)."""
    from exl3tool.identity.engine import hash_files

    entries = [e for e in cart.entries if isinstance(e.sha256, str)]
    stamps = {cart.root / e.path: e.stamp for e in entries}  # a shard replaced since: exit 3
    digests = hash_files(list(stamps), "sha256", threads, expected=stamps)
    for e in entries:
        got = digests[cart.root / e.path]
        if got != e.sha256:
            findings.add(
                ca.CA_SHARD_SHA256,
                f"sha256 does not match adapter_config.json ({got})",
                file=e.path,
                pointer=f"/shards/{e.index}/sha256",
            )


def check_loaded(
    cart: Cartridge,
    findings: Findings,
    options: ValidateOptions,
    *,
    base: BaseInfo | None = None,
    hashed: bool = False,
) -> None:
    """All rules on an already loaded cartridge (`stage-cartridge` reuses this on its copy)."""
    if cart.manifest is None:
        return
    check_manifest(cart.manifest, findings)
    if cart.manifest.get("schema") != spec.ADAPTER_SCHEMA or cart.damaged:
        return  # damaged shards: their own findings are the root cause; key checks would repeat it
    check_tensors(cart, findings, base.geometry if base is not None else None)
    if options.hash and not hashed:
        check_shard_hashes(cart, findings, options.threads)
    if base is not None:
        _match_base(cart, base, findings)
    if options.tp is not None:
        inter = (
            base.intermediate
            if base is not None and base.intermediate
            else _intermediate_from_tensors(cart)
        )
        check_tp(cart, options.tp, inter, findings)


def check_cartridge(path: Path, findings: Findings, options: ValidateOptions) -> str:
    """Validate the cartridge at `path` (directory or listed shard); returns its kind."""
    cart = load_cartridge(Path(path), findings)
    base = None
    if options.base is not None:
        base = load_base_info(
            Path(options.base), findings, recompute=options.hash, threads=options.threads
        )
    check_loaded(cart, findings, options, base=base)
    return KIND


def summary(cart: Cartridge) -> dict[str, Any]:
    """A few facts for a report's artifact details."""
    return {
        "layout": cart.layout,
        "world_size": cart.world_size,
        "chain": cart.chain_labels,
        "num_tensors": len(cart.keys),
        "bytes": cart.total_bytes(),
    }
