"""The Hugging Face cache is a first-class input (issue 12): a snapshot whose files are symlinks
into `blobs/` gets the verdicts and identities of a plain copy, by path and by `org/name`."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from exl3tool.cli.main import app
from exl3tool.io.hf_cache import NotCached, blob_root, resolve_artifact
from exl3tool.rules.errors import InputError

from .conftest import COMMIT, NAMES, snapshot

runner = CliRunner()


def invoke(*args: object):  # type: ignore[no-untyped-def]
    return runner.invoke(app, [str(a) for a in args])


def run(*args: object) -> tuple[int, str]:
    r = invoke(*args)
    return r.exit_code, r.stdout + (r.stderr or "")


def report(*args: object, where: str | Path) -> tuple[int, object]:
    """A command's JSON output with the artifact's path replaced and timings dropped."""
    r = invoke(*args, "--format", "json")
    text = r.stdout.replace(str(where), "<A>")
    value = json.loads(text)
    return r.exit_code, _without_timings(value)


def _without_timings(v: object) -> object:
    if isinstance(v, dict):
        return {k: _without_timings(x) for k, x in v.items() if k not in ("seconds", "elapsed")}
    if isinstance(v, list):
        return [_without_timings(x) for x in v]
    return v


def test_every_snapshot_file_is_a_link_into_blobs(hub: Path) -> None:
    for name in NAMES:
        snap = snapshot(hub, name)
        files = list(snap.iterdir())
        assert files and all(f.is_symlink() for f in files)
        assert blob_root(snap) == hub / f"models--org--{name}" / "blobs"
    assert blob_root(hub.parent / "plain" / "r7-tiny") is None


@pytest.fixture
def own_cache(hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the shared cache that a test may change."""
    mine = tmp_path / "hub"
    shutil.copytree(hub, mine, symlinks=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(mine))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return mine


def test_an_ambiguous_commit_prefix_is_said(own_cache: Path) -> None:
    snap = snapshot(own_cache, "r7-tiny")
    twin = snap.parent / (COMMIT[:8] + "0" * 32)
    shutil.copytree(snap, twin, symlinks=True)
    with pytest.raises(NotCached, match="ambiguous"):
        resolve_artifact(f"org/r7-tiny@{COMMIT[:8]}")
    assert resolve_artifact(f"org/r7-tiny@{COMMIT[:10]}") == snap  # enough digits: one


def test_a_ref_to_a_missing_snapshot_lists_the_snapshots_there(own_cache: Path) -> None:
    ref = own_cache / "models--org--r7-tiny" / "refs" / "main"
    ref.write_text("a" * 40)  # an interrupted update: main moved, its snapshot never came
    with pytest.raises(NotCached) as exc:
        resolve_artifact("org/r7-tiny")
    assert COMMIT[:12] in str(exc.value) and "nothing of it is cached" not in str(exc.value)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("command", [("validate",), ("validate", "--hash"), ("inspect",)])
def test_verdicts_equal_a_plain_copy(hub: Path, plain: Path, name: str, command: tuple) -> None:
    snap = snapshot(hub, name)
    want = report(*command, plain / name, where=plain / name)
    got = report(*command, snap, where=snap)
    assert got == want
    assert want[0] == 0


@pytest.mark.parametrize("name", NAMES)
def test_identities_equal_a_plain_copy(hub: Path, plain: Path, name: str) -> None:
    snap = snapshot(hub, name)
    want = report("identity", plain / name, where=plain / name)
    assert report("identity", snap, where=snap) == want
    assert want[0] == 0
    code, out = run("diff", plain / name, snap)
    assert code == 0, out


@pytest.mark.parametrize("name", NAMES)
def test_sha256sum_manifests_equal_a_plain_copy(
    hub: Path, plain: Path, tmp_path: Path, name: str
) -> None:
    a, b = tmp_path / "a.sha256", tmp_path / "b.sha256"
    assert run("identity", plain / name, "--sha256sum", a)[0] == 0
    assert run("identity", snapshot(hub, name), "--sha256sum", b)[0] == 0
    assert a.read_text() and a.read_text() == b.read_text()


def test_slice_from_a_snapshot_writes_the_same_real_files(
    hub: Path, plain: Path, tmp_path: Path
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert run("slice", plain / "msrt-base-tiny", "--tp", "2", "-o", a)[0] == 0
    assert run("slice", snapshot(hub, "msrt-base-tiny"), "--tp", "2", "-o", b)[0] == 0
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert any(f.name == "config.json" for f in files)  # carried although it is a link
    for rel in files:
        assert not (b / rel).is_symlink()
        if rel.name != "exl3tool-slices.json":  # records the source path
            assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


def test_a_slice_output_in_the_cache_validates_like_the_plain_one(
    hub: Path, plain: Path, tmp_path: Path
) -> None:
    from .conftest import cache_layout

    out = tmp_path / "sliced"
    assert run("slice", plain / "msrt-base-tiny", "--tp", "2", "-o", out)[0] == 0
    snap = cache_layout(out, tmp_path / "hub", "org/sliced")
    for sub in ("", "rank-0", "rank-1"):
        want = report("validate", "--hash", out / sub, where=out / sub)
        assert report("validate", "--hash", snap / sub, where=snap / sub) == want
        assert want[0] == 0, want


def test_stage_cartridge_from_a_snapshot_writes_real_files(
    hub: Path, plain: Path, tmp_path: Path
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    code, out = run("stage-cartridge", plain / "cartridge-k3k4", "--base", plain / "msrt-base-tiny", "-o", a)  # fmt: skip
    assert code == 0, out
    code, out = run(
        "stage-cartridge", snapshot(hub, "cartridge-k3k4"),
        "--base", snapshot(hub, "msrt-base-tiny"), "-o", b,
    )  # fmt: skip
    assert code == 0, out
    staged = [p for p in b.rglob("*") if p.is_file() or p.is_symlink()]
    assert staged and not [p for p in staged if p.is_symlink()]
    want = {p.relative_to(a): p.read_bytes() for p in a.rglob("*.safetensors")}
    assert want and {p.relative_to(b): p.read_bytes() for p in b.rglob("*.safetensors")} == want


def test_check_on_snapshots_equals_plain(hub: Path, plain: Path) -> None:
    names = ("r7-tiny", "msrt-base-tiny")
    a = invoke("check", *(plain / n for n in names), "--format", "json")
    b = invoke("check", *(snapshot(hub, n) for n in names), "--format", "json")
    assert a.exit_code == b.exit_code == 0, b.stdout
    codes = [sorted(f["code"] for f in json.loads(r.stdout)["findings"]) for r in (a, b)]
    assert codes[0] == codes[1]


# --- org/name[@revision] -------------------------------------------------------------------


@pytest.mark.parametrize("rev", ["", "@main", f"@{COMMIT}", f"@{COMMIT[:10]}"])
def test_resolve_artifact_reads_the_cache(in_cache: Path, rev: str) -> None:
    assert resolve_artifact(f"org/r7-tiny{rev}") == snapshot(in_cache, "r7-tiny")


def test_resolve_artifact_keeps_paths(in_cache: Path, tmp_path: Path) -> None:
    assert resolve_artifact(str(tmp_path)) == tmp_path
    assert resolve_artifact("./no/such/dir") == Path("./no/such/dir")


@pytest.mark.parametrize("arg", ["org/absent", "org/r7-tiny@v9", "org/r7-tiny@" + "f" * 40])
def test_not_cached_is_an_input_error(in_cache: Path, arg: str) -> None:
    with pytest.raises(NotCached) as exc:
        resolve_artifact(arg)
    assert isinstance(exc.value, InputError) and exc.value.exit_code == 3
    assert arg in str(exc.value) and "hf download" in str(exc.value)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("command", [("validate",), ("inspect",), ("identity",)])
def test_org_name_equals_the_snapshot_path(in_cache: Path, name: str, command: tuple) -> None:
    snap = snapshot(in_cache, name)
    want = report(*command, snap, where=snap)
    code, got = report(*command, f"org/{name}", where=snap)
    assert (code, json.loads(json.dumps(got).replace(f"org/{name}", "<A>"))) == want


def test_org_name_for_diff_stage_slice_and_check(in_cache: Path, tmp_path: Path) -> None:
    assert run("diff", "org/r7-tiny", snapshot(in_cache, "r7-tiny"))[0] == 0
    code, out = run("stage-cartridge", "org/cartridge-k3k4", "--base", "org/msrt-base-tiny", "-o", tmp_path / "s")  # fmt: skip
    assert code == 0, out
    code, out = run("slice", "org/msrt-base-tiny", "--tp", "2", "-o", tmp_path / "t")
    assert code == 0, out
    assert run("check", "org/r7-tiny", "org/msrt-base-tiny")[0] == 0


def test_an_uncached_id_exits_3_with_one_line(in_cache: Path) -> None:
    code, out = run("validate", "org/absent")
    assert code == 3
    assert re.search(r"org/absent is not in the local Hugging Face cache", out)
    assert "Traceback" not in out


def test_without_huggingface_hub_an_id_names_the_hf_extra(
    in_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import sys

    from exl3tool.rules.errors import UsageError

    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import raises ImportError
    assert resolve_artifact(str(tmp_path)) == tmp_path  # paths never need it
    with pytest.raises(UsageError, match=r"exl3tool\[hf\]") as exc:
        resolve_artifact("org/r7-tiny")
    assert exc.value.exit_code == 2


def test_without_huggingface_hub_a_missing_path_beside_its_folder_is_exit_3(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`models/llama-exl3` where models/ is a local folder is a path that is not there (exit
    3), not a Hub id that needs the extra; an id whose org is no local folder still names it."""
    import sys

    from exl3tool.actions.inputs import resolve_input
    from exl3tool.rules.errors import InputError, UsageError

    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import raises ImportError
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    with pytest.raises(InputError, match="models/llama-exl3: no such file or directory") as exc:
        resolve_input("models/llama-exl3")
    assert exc.value.exit_code == 3
    with pytest.raises(UsageError, match=r"exl3tool\[hf\]"):
        resolve_input("org/r7-tiny")
