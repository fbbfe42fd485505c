"""Generated docs must not drift from the code; docs/ci.md's tested commands must work.

(docs/rules.md's own drift test is tests/checks/test_docs_rules.py.)
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

# tests/gate is a package whose root pytest puts on sys.path: one conftest module, one memo.
from gate.conftest import REPO, run_cli, workspace_dir
from gate.test_hf import make_cache

from exl3tool.docs_gen import COMMANDS_DIR, RULES_MD, command_names, generated, stale_pages

CI_MD = REPO / "docs" / "ci.md"
README = REPO / "README.md"
FENCE = re.compile(r"^```bash tested\n(.*?)^```", re.S | re.M)


def test_command_pages_match_the_typer_app() -> None:
    pages = {p: t for p, t in generated().items() if p != RULES_MD}
    assert {p.stem for p in pages} == {*command_names(), "index"}
    for path, text in pages.items():
        assert path.is_file() and path.read_text() == text, "run: python -m exl3tool.docs_gen"
    assert stale_pages() == []


def test_a_page_shows_the_commands_help() -> None:
    text = (COMMANDS_DIR / "check.md").read_text()
    assert "Usage: exl3tool check [OPTIONS]" in text and "--config" in text
    assert "\x1b[" not in text and all(len(line) <= 100 for line in text.splitlines())


def _tested_commands() -> list[str]:
    blocks = [b for doc in (CI_MD, README) for b in FENCE.findall(doc.read_text())]
    lines = [ln.strip() for b in blocks for ln in b.splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


@pytest.mark.parametrize("doc", [CI_MD, README], ids=["docs-ci", "readme"])
def test_ci_doc_has_the_three_integrations(doc: Path) -> None:
    text = doc.read_text()
    assert "id: exl3tool-validate" in text and "code scanning" in text
    assert "examples/ci/github-actions.yml" in text and "org/name[@revision]" in text
    assert len(_tested_commands()) >= 3


@pytest.fixture(scope="session")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return workspace_dir(tmp_path_factory)


@pytest.mark.parametrize("line", _tested_commands())
def test_ci_doc_command_runs(line: str, workspace: Path, tmp_path: Path) -> None:
    argv = shlex.split(line)
    redirect = None
    if ">" in argv:
        redirect = argv[argv.index(">") + 1]
        argv = argv[: argv.index(">")]
    assert argv[0] == "exl3tool"
    env = {}
    hf = [a for a in argv if re.fullmatch(r"[\w-]+/[\w.-]+(@\w+)?", a)]
    if hf:  # an org/name id: a cache holding the bundled R7 example under that name
        repo = hf[0].split("@")[0]
        cache = make_cache(tmp_path / "hub", REPO / "examples" / "r7-tiny")
        shutil.move(cache / "models--org--name", cache / ("models--" + repo.replace("/", "--")))
        env["HF_HUB_CACHE"] = str(cache)
    run = run_cli(argv[1:], cwd=workspace, env=env)
    assert run.code == 0, run.stdout + run.stderr
    if redirect:
        (workspace / redirect).write_text(run.stdout)
        if redirect.endswith(".json"):
            assert json.loads(run.stdout)["summary"]["errors"] == 0
