"""Threaded read-ahead of tensor bytes (runtime.reads) and the cold side's own (ColdIndex.experts)."""

import threading

import numpy as np
import pytest
import torch

from exl3tool.io.views import InputChanged, PayloadFile
from exl3tool.rules.errors import InputError
from exl3tool.runtime import cold, reads

CPU = torch.device("cpu")


def _file(tmp_path, n: int, seed: int = 0):
    data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    return path, data


class CountingFile(PayloadFile):
    """A PayloadFile that counts the reads started (from any thread)."""

    def __init__(self, path) -> None:
        super().__init__(path)
        self.started = 0
        self.lock = threading.Lock()

    def read_into(self, buf, start):
        with self.lock:
            self.started += 1
        return super().read_into(buf, start)


def test_groups_come_back_in_order_with_their_bytes_dtypes_and_shapes(tmp_path) -> None:
    path, data = _file(tmp_path, 1 << 16)
    f = PayloadFile(path)
    groups = [
        [reads.TensorRead(f, 64 * i, 32, torch.int16, (4, 4)),
         reads.TensorRead(f, 4096 + 8 * i, 8, torch.float16, (4,))]
        for i in range(20)
    ]  # fmt: skip
    got = list(reads.stream_groups(groups, CPU, threads=3, ahead=2))
    assert len(got) == 20
    for i, (a, b) in enumerate(got):
        assert a.dtype == torch.int16 and a.shape == (4, 4)
        assert a.numpy().tobytes() == data[64 * i : 64 * i + 32]
        assert b.dtype == torch.float16 and b.numpy().tobytes() == data[4096 + 8 * i : 4104 + 8 * i]
    f.close()


def test_reads_run_at_most_ahead_groups_before_the_consumer(tmp_path) -> None:
    path, _ = _file(tmp_path, 1 << 12)
    f = CountingFile(path)
    groups = [[reads.TensorRead(f, 16 * i, 16, torch.uint8, (16,))] for i in range(50)]
    it = reads.stream_groups(groups, CPU, threads=4, ahead=3)
    next(it)
    assert 1 <= f.started <= 3  # the first group and at most two more were submitted
    it.close()  # an abandoned stream cancels what it had queued and joins its threads
    assert f.started <= 4
    assert not [t for t in threading.enumerate() if t.name.startswith("exl3read")]
    f.close()


def test_a_file_that_shrank_is_input_changed_naming_it(tmp_path) -> None:
    path, _ = _file(tmp_path, 4096)
    f = PayloadFile(path)
    with open(path, "r+b") as fh:
        fh.truncate(1000)
    groups = [[reads.TensorRead(f, 512, 1024, torch.uint8, (1024,))]]
    with pytest.raises(InputChanged, match=r"blob\.bin: shrank while it was read"):
        list(reads.stream_groups(groups, CPU))
    f.close()


def test_bytes_that_do_not_make_the_shape_are_an_input_error(tmp_path) -> None:
    path, _ = _file(tmp_path, 4096)
    f = PayloadFile(path)
    with pytest.raises(InputError, match=r"30 bytes are not a torch\.int16 \[4, 4\]"):
        reads.read_all([reads.TensorRead(f, 0, 30, torch.int16, (4, 4))], CPU)
    f.close()


def test_read_all_keeps_the_order_of_many_reads(tmp_path) -> None:
    path, data = _file(tmp_path, 1 << 14, seed=3)
    f = PayloadFile(path)
    rs = [reads.TensorRead(f, (37 * i) % 8000, 24, torch.uint8, (2, 12)) for i in range(101)]
    got = reads.read_all(rs, CPU, threads=5)
    assert [t.numpy().tobytes() for t in got] == [data[r.offset : r.offset + 24] for r in rs]
    f.close()


def test_cold_read_ahead_builds_what_one_expert_at_a_time_builds(artifacts) -> None:
    index = cold.ColdIndex(artifacts.base, artifacts.a)
    ids = list(range(index.num_experts(4)))
    ahead = list(index.experts(4, ids, CPU, ahead=2))
    for e, ex in zip(ids, ahead, strict=True):
        one = index.expert(4, e, CPU)
        assert ex.expert == e
        for p in cold.PROJS:
            assert torch.equal(ex.base[p], one.base[p])
            assert [(s.label, s.k) for s in ex.stages[p]] == [(s.label, s.k) for s in one.stages[p]]
            for s, t in zip(ex.stages[p], one.stages[p], strict=True):
                assert torch.equal(s.weight, t.weight) and torch.equal(
                    s.inverse_scale, t.inverse_scale
                )
    assert any(ex.stages[p] for ex in ahead for p in cold.PROJS)  # stages were exercised
    index.release()
