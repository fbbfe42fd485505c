"""R7 checkpoint models (docs/formats/r7.md §2-§4): the routed-experts block and what the
payload says per layer. Models only; the R7 rules live in `checks/r7*.py`."""

from __future__ import annotations

from dataclasses import dataclass, field

from exl3tool.formats.checkpoint import TensorRef

SCHEMA_ID = "r7-complete-v2-checkpoint-v1"
MARKER = "CODEX_ROUND7"  # §3: shard __metadata__ r7_marker


def layer_shard(layer: int) -> str:
    """§3: the shard holding layer `layer`'s routed experts."""
    return f"r7-experts-layer-{layer:03d}.safetensors"


def layer_manifest(layer: int) -> str:
    """§4: the per-layer manifest next to that shard."""
    return f"r7-experts-layer-{layer:03d}.json"


@dataclass(frozen=True)
class Block:
    """A usable `r7_routed_experts` block (§2): its layer range and declared K values."""

    first: int
    last: int
    k_values: frozenset[int]
    file: str
    base: str  # JSON pointer of the block inside `file`

    @property
    def layers(self) -> range:
        return range(self.first, self.last + 1)


@dataclass(frozen=True)
class R7Payload:
    """What the payload says, per layer: K per (expert, proj), for manifests and `inspect`."""

    k: dict[tuple[int, int, str], int] = field(default_factory=dict)
    by_layer: dict[int, dict[str, int]] = field(default_factory=dict)  # layer -> prefix -> K
    trellis: dict[str, TensorRef] = field(default_factory=dict)  # prefix -> trellis

    def record(self, key: tuple[int, int, str], prefix: str, trellis: TensorRef, k: int) -> None:
        self.k[key] = k
        layer = self.by_layer.get(key[0])
        if layer is None:
            layer = self.by_layer[key[0]] = {}
        layer[prefix] = k
        self.trellis[prefix] = trellis

    def tiers(self) -> dict[int, int]:
        by_layer: dict[int, set[int]] = {}
        for (layer, _e, _p), k in self.k.items():
            by_layer.setdefault(layer, set()).add(k)
        return {layer: len(ks) for layer, ks in sorted(by_layer.items())}
