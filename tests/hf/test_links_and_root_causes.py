"""Symlinks that leave an artifact (PA006 warning for checkpoints and bases, PA002 error for
adapter files) and root cause first: a JSON syntax error or a truncated shard is the one finding,
not the start of a cascade (issue 12)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from exl3tool.actions.validate import validate_path
from exl3tool.checks.options import ValidateOptions

from .conftest import EXAMPLES


def findings(path: Path, **options: object) -> list[tuple[str, str, str]]:
    """(code, severity, file relative to `path`) of every finding of `validate path`."""
    _, found = validate_path(path, ValidateOptions(**options))
    out = []
    for f in found:
        file = f.location.file or ""
        rel = os.path.relpath(file, path) if file.startswith(str(path)) else file
        out.append((f.code, f.level.value, rel))
    return out


def errors_and_warnings(path: Path, **options: object) -> list[tuple[str, str, str]]:
    return [f for f in findings(path, **options) if f[1] != "info"]


@pytest.fixture
def copy(tmp_path: Path):  # type: ignore[no-untyped-def]
    def make(name: str) -> Path:
        return Path(shutil.copytree(EXAMPLES / name, tmp_path / name))

    return make


def move_out(art: Path, name: str, link: str = "absolute") -> Path:
    """Move `art/name` next to the artifact and leave a symlink in its place."""
    outside = art.parent / f"outside-{name}"
    shutil.move(art / name, outside)
    (art / name).symlink_to(outside if link == "absolute" else os.path.relpath(outside, art))
    return outside


# --- symlinks -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "file"),
    [("r7-tiny", "r7-experts-layer-001.safetensors"), ("msrt-base-tiny", "config.json")],
)
def test_a_link_leaving_a_checkpoint_is_one_warning(copy, name: str, file: str) -> None:
    art = copy(name)
    move_out(art, file, link="relative")
    assert errors_and_warnings(art) == [("PA006", "warning", file)]


def test_a_link_inside_the_artifact_is_a_file(copy) -> None:
    art = copy("msrt-base-tiny")
    (art / "sub").mkdir()
    shutil.move(art / "tier_bitmap.json", art / "sub" / "tier_bitmap.json")
    (art / "tier_bitmap.json").symlink_to("sub/tier_bitmap.json")
    before = errors_and_warnings(art)
    assert ("PA006", "warning", "tier_bitmap.json") not in before
    assert "MB015" in {c for c, _, f in before if f == "sub/tier_bitmap.json"}  # unlisted file


def test_a_nested_link_leaving_a_base_is_pa006(copy) -> None:
    art = copy("msrt-base-tiny")
    (art / "extra").mkdir()
    (art.parent / "far.txt").write_text("x")
    (art / "extra" / "far.txt").symlink_to(art.parent / "far.txt")
    got = errors_and_warnings(art)
    assert ("PA006", "warning", "extra/far.txt") in got


def test_a_dangling_link_in_a_base_is_mb015_not_a_crash(copy) -> None:
    art = copy("msrt-base-tiny")
    (art / "gone.json").symlink_to(art / "nothing-here.json")
    assert ("MB015", "error", "gone.json") in errors_and_warnings(art)


def test_an_adapter_file_leaving_the_adapter_is_one_error(copy) -> None:
    art = copy("cartridge-k3k4")
    move_out(art, "adapter_config.json")
    assert errors_and_warnings(art) == [("PA002", "error", "adapter_config.json")]


# --- root cause first ------------------------------------------------------------------------


def trailing_comma(path: Path) -> None:
    text = path.read_text().rstrip()
    assert text.endswith("}")
    path.write_text(text[:-1].rstrip() + ",\n}\n")


def test_a_base_config_with_a_trailing_comma_is_one_json_finding(copy) -> None:
    art = copy("msrt-base-tiny")
    trailing_comma(art / "config.json")
    assert findings(art) == [("JS001", "error", "config.json")]


def test_a_broken_config_of_an_r7_checkpoint_is_its_files_only_finding(copy) -> None:
    art = copy("r7-tiny")  # the kind still comes from quantization_config.json
    trailing_comma(art / "config.json")
    got = [f for f in findings(art) if f[2] == "config.json"]
    assert got == [("JS001", "error", "config.json")]  # no CK001 "missing or unusable"
    assert errors_and_warnings(art) == got  # nor a conformance guess without the tail


def test_a_broken_index_is_not_also_malformed(copy) -> None:
    art = copy("msrt-base-tiny")
    trailing_comma(art / "model.safetensors.index.json")
    got = [f for f in errors_and_warnings(art) if f[2] == "model.safetensors.index.json"]
    assert got == [("JS001", "error", "model.safetensors.index.json")]


@pytest.mark.parametrize(
    ("name", "shard"),
    [
        ("msrt-base-tiny", "model-layer-003.safetensors"),
        ("r7-tiny", "r7-experts-layer-001.safetensors"),
        ("r7-tiny", "model-carrier-00001-of-00001.safetensors"),
    ],
)
@pytest.mark.parametrize("hash_", [False, True])
def test_a_truncated_shard_is_one_finding(copy, name: str, shard: str, hash_: bool) -> None:
    art = copy(name)
    assert errors_and_warnings(art, hash=hash_) == []
    os.truncate(art / shard, (art / shard).stat().st_size * 2 // 3)
    assert errors_and_warnings(art, hash=hash_) == [("ST016", "error", shard)]


def test_an_independent_defect_next_to_a_truncated_shard_is_still_reported(copy) -> None:
    art = copy("msrt-base-tiny")
    shard = art / "model-layer-003.safetensors"
    os.truncate(shard, shard.stat().st_size * 2 // 3)
    (art / "stray.safetensors").write_bytes((art / "model-dense.safetensors").read_bytes())
    got = errors_and_warnings(art)
    assert ("ST016", "error", shard.name) in got
    assert ("CK006", "error", "stray.safetensors") in got  # not a consequence: still reported


@pytest.mark.parametrize("cut", [2 / 3, 1 / 2])
def test_a_truncated_cartridge_shard_is_one_finding(copy, cut: float) -> None:
    art = copy("cartridge-k3k4")
    shard = art / "model-layer-003-b000.safetensors"
    os.truncate(shard, int(shard.stat().st_size * cut))
    assert errors_and_warnings(art) == [("CA004", "error", shard.name)]


def test_a_missing_cartridge_shard_is_one_finding(copy) -> None:
    art = copy("cartridge-k3k4")
    (art / "model-layer-004-b000.safetensors").unlink()
    assert errors_and_warnings(art) == [("PA001", "error", "model-layer-004-b000.safetensors")]


def test_a_cartridge_shard_with_a_broken_header_is_one_finding(copy) -> None:
    art = copy("cartridge-k3k4")
    shard = art / "model-layer-003-b000.safetensors"
    data = bytearray(shard.read_bytes())
    data[8] = ord("[")  # the header is no JSON object any more; the size is unchanged
    shard.write_bytes(bytes(data))
    got = errors_and_warnings(art)
    assert len(got) == 1 and got[0][0].startswith("ST") and got[0][2] == shard.name, got


def _codes(path: Path) -> list[str]:
    _ref, findings = validate_path(path, ValidateOptions())
    return [f.code for f in findings]


def test_a_link_to_a_snapshot_reads_like_the_snapshot(tmp_path: Path) -> None:
    from .conftest import cache_layout

    snap = cache_layout(EXAMPLES / "r7-tiny", tmp_path / "hub", "org/tiny")
    link = tmp_path / "my-model"
    link.symlink_to(snap, target_is_directory=True)
    assert _codes(link) == _codes(snap)
    assert "PA006" not in _codes(link)


def test_a_folder_of_links_into_the_cache_blobs_is_not_pa006(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what an older `--local-dir` download leaves: the folder's files link into blobs/
    from .conftest import cache_layout

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))

    snap = cache_layout(EXAMPLES / "r7-tiny", tmp_path / "hub", "org/tiny")
    local = tmp_path / "local"
    local.mkdir()
    for entry in snap.iterdir():
        (local / entry.name).symlink_to(entry.resolve())
    assert "PA006" not in _codes(local)
    # a link out of the artifact that is not a cache blob still is
    outside = tmp_path / "elsewhere.json"
    outside.write_text("{}")
    (local / "extra.json").symlink_to(outside)
    assert "PA006" in _codes(local)


def test_a_shard_whose_blob_was_never_fetched_says_so(tmp_path: Path) -> None:
    from .conftest import cache_layout

    snap = cache_layout(EXAMPLES / "r7-tiny", tmp_path / "hub", "org/tiny")
    (snap / "r7-experts-layer-002.safetensors").resolve().unlink()  # an interrupted download
    _ref, findings = validate_path(snap, ValidateOptions())
    (f,) = [f for f in findings if f.code == "CK003"]
    assert "missing blob of the Hugging Face cache" in f.message


def test_a_blobs_folder_outside_the_configured_cache_is_no_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    art = tmp_path / "art"
    shutil.copytree(EXAMPLES / "r7-tiny", art)
    fake = tmp_path / "x" / "models--evil" / "blobs"
    fake.mkdir(parents=True)
    (art / "config.json").rename(fake / "cfg")
    (art / "config.json").symlink_to(fake / "cfg")
    assert "PA006" in _codes(art)


def test_a_snapshot_reads_its_own_repository_blobs_only(tmp_path: Path) -> None:
    from .conftest import cache_layout

    hub = tmp_path / "hub"
    snap = cache_layout(EXAMPLES / "r7-tiny", hub, "org/tiny")
    other = cache_layout(EXAMPLES / "msrt-base-tiny", hub, "org/other")
    target = (other / "config.json").resolve()  # a blob of another repository
    (snap / "tokenizer_config.json").symlink_to(target)
    assert "PA006" in _codes(snap)


def test_a_link_to_a_folder_in_place_of_a_shard_says_so(tmp_path: Path) -> None:
    art = tmp_path / "art"
    shutil.copytree(EXAMPLES / "r7-tiny", art)
    (art / "model-mtp.safetensors").unlink()
    (tmp_path / "d").mkdir()
    (art / "model-mtp.safetensors").symlink_to(tmp_path / "d")
    _ref, findings = validate_path(art, ValidateOptions())
    (f,) = [f for f in findings if f.code == "CK003"]
    assert "not a regular file" in f.message


@pytest.mark.parametrize("how", ["absent", "cut"])
def test_a_lost_base_shard_is_the_only_finding(tmp_path: Path, how: str) -> None:
    # a half-downloaded base: its layers are not "uncovered", its shard is missing
    base = tmp_path / "base"
    shutil.copytree(EXAMPLES / "msrt-base-tiny", base)
    shard = base / "model-layer-004.safetensors"
    if how == "absent":
        shard.unlink()
    else:
        os.truncate(shard, shard.stat().st_size // 2)
    _ref, findings = validate_path(base, ValidateOptions())
    assert [f.code for f in findings.errors()] == ["CK003" if how == "absent" else "ST016"]


@pytest.mark.parametrize("how", ["absent", "dangling"])
def test_a_lost_config_of_an_r7_checkpoint_is_the_only_error(tmp_path: Path, how: str) -> None:
    art = tmp_path / "r7"
    shutil.copytree(EXAMPLES / "r7-tiny", art)
    (art / "config.json").unlink()
    if how == "dangling":  # a snapshot whose config blob never came
        (art / "config.json").symlink_to(tmp_path / "never-fetched")
    _ref, findings = validate_path(art, ValidateOptions())
    assert [f.code for f in findings.errors()] == ["CK001"]
