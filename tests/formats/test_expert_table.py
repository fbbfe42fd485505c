"""formats/experts: the table built once per name prefix equals the one built name by name."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from exl3tool.formats.checkpoint import TensorRef
from exl3tool.formats.experts import ExpertTable, _add, expert_table
from exl3tool.io.safetensors import FileStamp, SafetensorsFile, TensorInfo

_SEGMENTS = st.sampled_from(
    ["model", "layers", "3", "03", "12", "mlp", "experts", "0", "7", "r7_shared", "shared_h",
     "gate_proj", "down_proj", "o_proj", "rank0", "rank1", "rank01", "rank", "trellis", "suh",
     "gate_up_suh", "x", ""]
)  # fmt: skip
_ST = SafetensorsFile(Path("m.safetensors"), "m.safetensors", 0, 0, FileStamp(0, 0, 0, 0, 0))


@st.composite
def _name(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        return ".".join(draw(st.lists(_SEGMENTS, min_size=1, max_size=10)))
    head = ["model", "layers", draw(st.sampled_from(["3", "12", "03"])), "mlp", "experts"]
    tail = draw(st.lists(_SEGMENTS, min_size=0, max_size=4))
    return ".".join(head + tail)


def _listed(t: ExpertTable) -> tuple[list, ...]:
    return (
        [(k, list(v.items())) for k, v in t.plain.items()],
        [(k, list(v.items())) for k, v in t.ranked.items()],
        list(t.layer_vectors.items()),
        list(t.other.items()),
    )


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.lists(_name(), max_size=30, unique=True))
def test_expert_table_equals_name_by_name(names: list[str]) -> None:
    tensors = {n: TensorRef(_ST, TensorInfo(n, "F16", (1,), 0, 2)) for n in names}
    want = ExpertTable()
    for name, ref in tensors.items():
        if ".mlp.experts." in name:
            _add(want, name, ref)
    assert _listed(expert_table(tensors)) == _listed(want)
