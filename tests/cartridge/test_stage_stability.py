"""Issue 15 item 5: stage-cartridge proves every input unchanged before it publishes. A base
shard rewritten after its identity was hashed (24 of 24 stages exited 0 and certified an
identity the base no longer had) is ST023 and nothing is published."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from exl3tool.staging import stage
from exl3tool.staging.stage import StageError, stage_cartridge
from exl3tool.synth.msrt import build_adapter, build_base


@pytest.fixture()
def pair(tmp_path: Path) -> tuple[Path, Path]:
    base = build_base(tmp_path / "base")
    return base, build_adapter(tmp_path / "cart", base)


def _rewrite(path: Path) -> None:
    """Same size, other bytes, a later mtime (what a concurrent re-download does)."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    st = os.stat(path)
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def test_base_changed_after_its_identity_was_hashed(
    pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, cart = pair
    shard = sorted(base.glob("*layer*.safetensors"))[0]
    done: list[str] = []
    hashed = threading.Event()  # the base's identity is computed beside the copy
    load_base_info = stage.load_base_info

    def identity_then_signal(*a, **k):
        try:
            return load_base_info(*a, **k)
        finally:
            hashed.set()

    def hook(path: str, n: int) -> None:  # during the adapter copy, once the identity is hashed
        if not done:
            done.append(path)
            assert hashed.wait(60)
            _rewrite(shard)

    monkeypatch.setattr(stage, "load_base_info", identity_then_signal)
    monkeypatch.setattr(stage, "copy_hook", hook)
    out = tmp_path / "out"
    with pytest.raises(StageError) as err:
        stage_cartridge(cart, base, out=out, threads=1)
    hits = [f for f in err.value.findings if f.rule.code == "ST023"]
    assert [f.location.file for f in hits] == [str(shard)]
    assert not out.exists() and not list(tmp_path.glob(".out.*"))


def test_adapter_shard_replaced_after_it_was_copied(
    pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, cart = pair
    shard = sorted(cart.glob("*.safetensors"))[0]
    monkeypatch.setattr(stage, "copy_hook", lambda p, n: None)
    original = stage.copy_verified

    def copy_then_replace(*a, **k):  # the copy verified the old bytes; then a rename lands
        got = original(*a, **k)
        other = shard.with_name("other")
        other.write_bytes(shard.read_bytes())
        os.rename(other, shard)
        return got

    monkeypatch.setattr(stage, "copy_verified", copy_then_replace)
    out = tmp_path / "out"
    with pytest.raises(StageError) as err:
        stage_cartridge(cart, base, out=out, threads=1)
    assert [f.location.file for f in err.value.findings if f.rule.code == "ST023"] == [shard.name]
    assert not out.exists()


def test_unchanged_inputs_publish(pair: tuple[Path, Path], tmp_path: Path) -> None:
    base, cart = pair
    res = stage_cartridge(cart, base, out=tmp_path / "out", threads=1)
    assert (res.out / stage.STAGING_FILE).is_file()
    assert not [f for f in res.findings if f.rule.code == "ST023"]


def test_a_crashing_check_is_a_finding_not_a_traceback(
    pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, cart = pair

    def boom(*_a, **_k):
        raise KeyError("label")

    monkeypatch.setattr(stage, "check_loaded", boom)
    with pytest.raises(StageError) as err:
        stage_cartridge(cart, base, out=tmp_path / "out", threads=1)
    assert [f.rule.code for f in err.value.findings if f.rule.code == "CA099"] == ["CA099"]
    assert not (tmp_path / "out").exists()


def test_the_command_says_a_changed_input_is_exit_3_naming_it(
    pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`stage-cartridge` ends as every command does for an input that changed while it was
    read: exit 3 and one line naming the file (README's exit codes), nothing at OUT."""
    from exl3tool.actions import stage as action
    from exl3tool.io.views import InputChanged

    base, cart = pair
    shard = sorted(cart.glob("*.safetensors"))[0]
    done: list[str] = []

    def hook(path: str, n: int) -> None:  # during the copy of the adapter's shards
        if not done:
            done.append(path)
            _rewrite(shard)

    monkeypatch.setattr(stage, "copy_hook", hook)
    out = tmp_path / "out"
    with pytest.raises(InputChanged) as err:
        action.run(action.Options(cart, base, out, None, False, 1))
    assert err.value.exit_code == 3 and shard.name in str(err.value)
    assert not out.exists()
