"""Issue 15 item 4: two publishers of one output, the first delayed between its final check and
its rename. The second must wait for the lock and then fail cleanly; nothing published is moved
aside or removed without force."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from exl3tool.io import atomic
from exl3tool.io.atomic import atomic_dir, atomic_file
from exl3tool.rules.errors import OutputError


def _race(target: Path, publish, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Run publisher A (delayed inside the critical section until B has tried or 1 s passed)
    and publisher B; return what each did."""
    a_inside, b_tried = threading.Event(), threading.Event()
    out: dict = {}

    def hook(t: Path) -> None:
        if threading.current_thread().name == "A":
            a_inside.set()
            b_tried.wait(1.0)  # B finishes at once when there is no lock (the old race)

    monkeypatch.setattr(atomic, "before_rename", hook)

    def run(name: str) -> None:
        if name == "B":
            a_inside.wait(5.0)
        try:
            publish(target, name)
            out[name] = "published"
        except OutputError as exc:
            out[name] = str(exc)
        except OSError as exc:  # the old publisher's ENOTEMPTY
            out[name] = f"OSError {exc}"
        finally:
            if name == "B":
                b_tried.set()

    threads = [threading.Thread(target=run, args=(n,), name=n) for n in "AB"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out


def _dir(target: Path, name: str) -> None:
    with atomic_dir(target) as tmp:
        (tmp / "who").write_text(name)


def _file(target: Path, name: str) -> None:
    with atomic_file(target, mode="w") as fh:
        fh.write(name)


def test_second_directory_publisher_gets_the_clean_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "out"
    out = _race(target, _dir, monkeypatch)
    assert out["A"] == "published"
    assert out["B"] == f"{target} exists; pass --force to replace it"
    assert (target / "who").read_text() == "A"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temp, trash or lock left


def test_second_file_publisher_never_replaces_without_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "out.json"
    out = _race(target, _file, monkeypatch)
    assert out["A"] == "published"
    assert "exists; pass --force" in out["B"]
    assert target.read_text() == "A"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_forced_publishers_serialize(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out"

    def forced(t: Path, name: str) -> None:
        with atomic_dir(t, force=True) as tmp:
            (tmp / "who").write_text(name)

    out = _race(target, forced, monkeypatch)
    assert out == {"A": "published", "B": "published"}
    assert (target / "who").read_text() == "B"  # B waited for A's rename, then replaced it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_stale_lock_file_of_a_killed_run_is_reused(tmp_path: Path) -> None:
    (tmp_path / ".out.lock").write_bytes(b"")
    _dir(tmp_path / "out", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
