"""Where an output may be written (io/outputs): no --force ever destroys or changes an input."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from exl3tool.io.atomic import atomic_dir, atomic_file
from exl3tool.io.outputs import check_apart, check_target
from exl3tool.rules.errors import OutputError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "r7-tiny"


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture
def ck(tmp_path: Path) -> Path:
    root = tmp_path / "work" / "ck"
    shutil.copytree(EXAMPLE, root)
    return root


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "EXL3TOOL_NO_PROGRESS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "exl3tool", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "args",
    [
        ("validate", "ck", "-f", "json", "-o", ".", "--force"),  # the folder holding the input
        ("validate", "ck", "-f", "json", "-o", "ck", "--force"),  # the input itself
        ("validate", "ck", "-f", "json", "-o", "ck/config.json", "--force"),  # one of its files
        ("identity", "ck", "-o", "ck/../ck", "--force"),
        ("slice", "ck", "--tp", "2", "-o", "ck/sliced"),  # a folder output inside the input
        ("slice", "ck", "--tp", "2", "-o", ".", "--force"),
    ],
)
def test_no_output_replaces_or_enters_an_input(ck: Path, args: tuple[str, ...]) -> None:
    work = ck.parent
    (work / "notes.txt").write_text("mine")
    before = _tree(work)
    got = _cli(*args, cwd=work)
    assert got.returncode == 1, got.stderr
    assert "input" in got.stderr and "Traceback" not in got.stderr
    assert _tree(work) == before  # nothing written, nothing removed
    assert sorted(p.name for p in work.iterdir()) == ["ck", "notes.txt"]  # no temporary left


def test_a_new_file_beside_the_shards_is_allowed_and_may_be_replaced(ck: Path) -> None:
    """A `sha256sum -c` manifest inside the checkpoint is a publisher's habit: it is written,
    left out of itself (however its path is spelled), and replaced with --force."""
    work = ck.parent
    first = _cli("identity", "ck", "--sha256sum", "ck/SHA256SUMS", cwd=work)
    assert first.returncode == 0, first.stderr
    again = _cli("identity", "ck", "--sha256sum", "ck/x/../SHA256SUMS", "--force", cwd=work)
    assert (ck / "x").exists() is False and again.returncode != 0  # `x` does not exist
    (ck / "x").mkdir()
    again = _cli("identity", "ck", "--sha256sum", "ck/x/../SHA256SUMS", "--force", cwd=work)
    assert again.returncode == 0, again.stderr
    (ck / "x").rmdir()
    lines = (ck / "SHA256SUMS").read_text().splitlines()
    listed = {line.split("  ", 1)[1]: line.split("  ", 1)[0] for line in lines}
    assert "SHA256SUMS" not in listed and "config.json" in listed
    for name, digest in listed.items():  # what `sha256sum -c` checks
        assert hashlib.sha256((ck / name).read_bytes()).hexdigest() == digest


def test_check_apart_rules(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.safetensors").write_bytes(b"x")
    (src / "notes.txt").write_text("n")
    link = tmp_path / "link"
    link.symlink_to(src)
    refused = [
        (src, False),
        (tmp_path, False),
        (tmp_path, True),
        (src / "out", True),  # a folder output inside the input
        (src / "a.safetensors", False),  # replaces a shard
        (link / "a.safetensors", False),  # the same, through a link
    ]
    for target, directory in refused:
        with pytest.raises(OutputError):
            check_apart(target, [src], directory=directory)
    for target, directory in [
        (src / "SHA256SUMS", False),  # new, beside the shards
        (src / "notes.txt", False),  # not a file of the artifact
        (src / "new.json", False),  # a new file
        (tmp_path / "out", True),
        (link, True),  # the link itself is replaced, not followed
    ]:
        check_apart(target, [src, "org/name-on-the-hub"], directory=directory)


def test_force_replaces_outputs_not_whatever_is_at_the_path(tmp_path: Path) -> None:
    folder, file = tmp_path / "folder", tmp_path / "file"
    folder.mkdir()
    (folder / "keep").write_text("k")
    file.write_text("f")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target, directory in [(folder, False), (file, True), (fifo, False), (fifo, True)]:
        with pytest.raises(OutputError):
            check_target(target, True, directory=directory)
        with pytest.raises(OutputError):
            check_target(target, False, directory=directory)
    with pytest.raises(OutputError), atomic_file(folder, force=True) as fh:
        fh.write(b"never")
    assert (folder / "keep").read_text() == "k" and stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.parametrize("points_to", ["dir", "file", "dangling"])
def test_a_link_is_replaced_itself_and_leaves_nothing_behind(
    tmp_path: Path, points_to: str
) -> None:
    real = tmp_path / "real"
    if points_to == "dir":
        real.mkdir()
        (real / "keep").write_text("k")
    elif points_to == "file":
        real.write_text("k")
    out = tmp_path / "out"
    out.symlink_to(real)
    with atomic_dir(out, force=True) as tmp:
        (tmp / "new").write_text("n")
    assert not out.is_symlink() and (out / "new").read_text() == "n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["out"] + (["real"] if points_to != "dangling" else [])
    )
    if points_to == "dir":
        assert (real / "keep").read_text() == "k"  # nothing written through the link


def test_a_folder_output_is_made_as_mkdir_would(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        with atomic_dir(tmp_path / "out") as tmp:
            (tmp / "f").write_text("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "out").st_mode) == 0o750


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EDQUOT])
def test_a_full_or_read_only_output_is_an_output_error(tmp_path: Path, code: int) -> None:
    """Exit 1 (OutputError), not 3 ("cannot read input"), and nothing left behind."""
    target = tmp_path / "out.json"
    with pytest.raises(OutputError, match="cannot write"), atomic_file(target) as fh:
        fh.write(b"{}")
        raise OSError(code, os.strerror(code))
    with pytest.raises(OutputError, match="cannot write"), atomic_dir(tmp_path / "d"):
        raise OSError(code, os.strerror(code))
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OSError) as got, atomic_file(target) as fh:  # a read's error stays one
        raise OSError(errno.EIO, "input")
    assert not isinstance(got.value, OutputError)


def test_stage_refuses_an_output_inside_its_inputs(tmp_path: Path) -> None:
    examples = EXAMPLE.parent
    base, cart = tmp_path / "base", tmp_path / "cart"
    shutil.copytree(examples / "msrt-base-tiny", base)
    shutil.copytree(examples / "cartridge-k3k4", cart)
    before = _tree(tmp_path)
    for out in ("cart/staged", "base"):
        got = _cli("stage-cartridge", "cart", "--base", "base", "-o", out, "--force", cwd=tmp_path)
        assert got.returncode == 1 and "input" in got.stderr, got.stderr
    assert _tree(tmp_path) == before
    assert json.loads((cart / "adapter_config.json").read_text())


def test_a_target_made_by_a_writer_outside_the_lock_is_never_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the final check and the rename (the test hook), another program that takes no
    lock writes the target: without --force it is kept, and ours is an OutputError."""
    from exl3tool.io import atomic

    target = tmp_path / "out.json"
    monkeypatch.setattr(atomic, "before_rename", lambda t: t.write_text("theirs"))
    with pytest.raises(OutputError, match="exists"), atomic_file(target) as fh:
        fh.write(b"ours")
    assert target.read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def _examples(tmp: Path) -> Path:
    for name in ("r7-tiny", "msrt-base-tiny", "cartridge-k3k4"):
        shutil.copytree(EXAMPLE.parent / name, tmp / name)
    return tmp


@pytest.mark.parametrize(
    "args",
    [
        # `L/..` is the parent of where L points (inside the checkpoint), not `.`
        ("validate", "r7-tiny", "-o", "L/../config.json", "--force"),
        ("stage-cartridge", "cartridge-k3k4", "--base", "msrt-base-tiny", "-o", "B/../staged"),
        # a file naming its folder: the files beside it are the input's too
        ("validate", "msrt-base-tiny/config.json", "-o", "msrt-base-tiny/tier_bitmap.json", "-F"),
        # --base is an input as well
        ("validate", "cartridge-k3k4", "--base", "msrt-base-tiny", "-o", "msrt-base-tiny/t.json"),
        ("plan", "r7-tiny", "--tp", "1", "--plot", "r7-tiny/config.json", "-F"),
    ],
)
def test_no_path_spelling_reaches_an_input(tmp_path: Path, args: tuple[str, ...]) -> None:
    work = _examples(tmp_path)
    (work / "r7-tiny" / "inner").mkdir()
    (work / "L").symlink_to(work / "r7-tiny" / "inner")
    (work / "msrt-base-tiny" / "inner").mkdir()
    (work / "B").symlink_to(work / "msrt-base-tiny" / "inner")
    (work / "msrt-base-tiny" / "t.json").write_text("{}")
    args = tuple("--force" if a == "-F" else a for a in args)
    if "t.json" in args[-1]:
        args = (*args, "--force")
    before = _tree(work)
    got = _cli(*args, cwd=work)
    assert got.returncode == 1 and "input" in got.stderr, got.stderr
    assert _tree(work) == before


def test_a_link_to_an_input_is_replaced_not_followed(tmp_path: Path) -> None:
    work = _examples(tmp_path)
    (work / "out").symlink_to("r7-tiny")
    before = _tree(work / "r7-tiny")
    got = _cli("validate", "r7-tiny", "-f", "json", "-o", "out", "--force", cwd=work)
    assert got.returncode == 0, got.stderr
    assert not (work / "out").is_symlink() and json.loads((work / "out").read_text())
    assert _tree(work / "r7-tiny") == before


def test_a_hub_id_input_is_protected_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("huggingface_hub")
    from tests.hf.conftest import cache_layout

    hub = tmp_path / "hub"
    snap = cache_layout(EXAMPLE, hub, "org/tiny")
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    before = (snap / "config.json").read_bytes()
    got = subprocess.run(
        [sys.executable, "-m", "exl3tool", "validate", "org/tiny", "-o", str(snap / "config.json"),
         "--force"],
        env={**env, "EXL3TOOL_NO_PROGRESS": "1"}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert got.returncode == 1 and "input" in got.stderr, got.stderr
    assert (snap / "config.json").is_symlink() and (snap / "config.json").read_bytes() == before


@pytest.mark.parametrize("name", ["config.json", "r7-experts-layer-001.safetensors"])
@pytest.mark.parametrize("hub_id", [True, False])
def test_a_blob_an_input_links_to_is_never_replaced(
    tmp_path: Path, name: str, hub_id: bool
) -> None:
    pytest.importorskip("huggingface_hub")
    from tests.hf.conftest import cache_layout

    hub = tmp_path / "hub"
    snap = cache_layout(EXAMPLE, hub, "org/tiny")
    blob = (snap / name).resolve()  # the output named by the blob's own path
    before = blob.read_bytes()
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    source = "org/tiny" if hub_id else str(snap)
    got = subprocess.run(
        [sys.executable, "-m", "exl3tool", "identity", source, "-o", str(blob), "--force"],
        env={**env, "EXL3TOOL_NO_PROGRESS": "1"}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert got.returncode == 1 and "through a link" in got.stderr, got.stderr
    assert blob.read_bytes() == before


@pytest.mark.parametrize("name", ["MANIFEST.sha256", "tokenizer.model", "modeling_glm.py"])
def test_the_seal_and_other_artifact_files_are_not_replaced(ck: Path, name: str) -> None:
    (ck / name).write_bytes(b"kept")
    got = _cli("identity", "ck", "-o", f"ck/{name}", "--force", cwd=ck.parent)
    assert got.returncode == 1 and "input" in got.stderr, got.stderr
    assert (ck / name).read_bytes() == b"kept"


def test_a_temporary_file_stays_held_until_it_is_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another run's stale-temporary sweep, while this one publishes an old-looking temporary
    (a long fsync), leaves it alone: the output is published."""
    from exl3tool.io import atomic

    target = tmp_path / "report.json"

    def sweep(t: Path) -> None:
        for p in tmp_path.iterdir():
            if p.name.startswith(".report.json.tmp-"):
                os.utime(p, (1e9, 1e9))
        code = "import sys; from exl3tool.io.atomic import remove_stale_temps as r; r(sys.argv[1])"
        subprocess.run([sys.executable, "-c", code, str(t)], check=True, timeout=60)

    monkeypatch.setattr(atomic, "before_rename", sweep)
    atomic.write_bytes_atomic(target, b"{}")
    assert target.read_bytes() == b"{}"


@pytest.mark.parametrize("out", ["", ".", ".."])
@pytest.mark.parametrize("command", ["slice", "stage-cartridge"])
def test_force_never_replaces_the_current_folder(tmp_path: Path, out: str, command: str) -> None:
    """`-o "$OUTDIR" --force` with OUTDIR unset is `-o .`: the folder the user stands in (or
    one above it) is never replaced, whatever it holds."""
    examples = Path(__file__).resolve().parents[2] / "examples"
    here = tmp_path / "work" / "here"
    here.mkdir(parents=True)
    (here / "precious.txt").write_text("keep")
    if command == "slice":
        args = ("slice", str(examples / "msrt-base-tiny"), "--tp", "2", "-o", out, "--force")
    else:
        args = ("stage-cartridge", str(examples / "cartridge-k3k4"), "--base",
                str(examples / "msrt-base-tiny"), "-o", out, "--force")  # fmt: skip
    got = _cli(*args, cwd=here)
    assert got.returncode == 1, got.stderr
    assert "is the current folder or holds it" in got.stderr
    assert (here / "precious.txt").read_text() == "keep"
    assert sorted(p.name for p in here.iterdir()) == ["precious.txt"]
