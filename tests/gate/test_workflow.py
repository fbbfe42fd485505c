"""examples/ci/github-actions.yml: its structure, and its `exl3tool` step run locally."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import yaml

from exl3tool.actions.gate.steps import swap_unavailable

from .conftest import REPO, run_cli, sarif_errors

WORKFLOW = REPO / "examples" / "ci" / "github-actions.yml"


def steps() -> list[dict]:
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert set(doc[True]) >= {"push", "pull_request"}  # YAML 1.1 reads the key `on` as True
    assert doc["permissions"]["security-events"] == "write"
    (job,) = doc["jobs"].values()
    return job["steps"]


def check_step() -> dict:
    (step,) = [s for s in steps() if s.get("run", "").startswith("exl3tool check")]
    return step


def test_workflow_installs_checks_uploads_and_fails() -> None:
    all_steps = steps()
    assert any("pip install" in s.get("run", "") and "exl3tool" in s["run"] for s in all_steps)
    check = check_step()
    argv = shlex.split(check["run"])
    assert argv[:2] == ["exl3tool", "check"] and check["continue-on-error"] is True
    out = argv[argv.index("--output") + 1]
    assert argv[argv.index("--format") + 1] == "sarif"
    (upload,) = [s for s in all_steps if s.get("uses", "").startswith("github/codeql-action/")]
    assert upload["uses"].startswith("github/codeql-action/upload-sarif@")
    assert upload["with"]["sarif_file"] == out and "always()" in upload["if"]
    (gate,) = [s for s in all_steps if s.get("if") == f"steps.{check['id']}.outcome == 'failure'"]
    assert "exit 1" in gate["run"]
    assert all_steps.index(check) < all_steps.index(upload) < all_steps.index(gate)


def local(argv: list[str], config: str) -> list[str]:
    """The workflow's command, with the repository's exl3tool.toml replaced by `config`."""
    argv = list(argv[2:])
    argv[argv.index("--config") + 1] = config
    return ["check", *argv]


def test_the_check_step_passes_on_the_examples(workspace: Path) -> None:
    argv = local(shlex.split(check_step()["run"]), "examples/ci/exl3tool.toml")
    run = run_cli(argv, cwd=workspace)
    # the workflow installs the runtime extra; without torch its declared verify-swap is a
    # GT012 warning, which the workflow's --strict fails
    assert run.code == (1 if swap_unavailable("cpu", 2) else 0), run.stderr
    assert run.stdout == ""  # the report went to --output
    log = json.loads((workspace / "exl3tool.sarif").read_text())
    assert sarif_errors(log) == []
    assert [r for r in log["runs"][0]["results"] if r["level"] == "error"] == []


def test_the_check_step_fails_on_a_broken_copy_with_annotations(tmp_path: Path) -> None:
    shutil.copytree(REPO / "examples" / "r7-tiny", tmp_path / "r7")
    (tmp_path / "r7" / "r7-experts-layer-002.safetensors").unlink()
    (tmp_path / "exl3tool.toml").write_text('[[artifacts]]\npath = "r7"\n')
    argv = local(shlex.split(check_step()["run"]), "exl3tool.toml")
    run = run_cli(argv, cwd=tmp_path, env={"GITHUB_ACTIONS": "true"})
    assert run.code == 1  # steps.check.outcome == 'failure' -> the gate step fails the job
    log = json.loads((tmp_path / "exl3tool.sarif").read_text())
    assert sarif_errors(log) == []
    errors = [r for r in log["runs"][0]["results"] if r["level"] == "error"]
    assert errors and {"CK003"} <= {r["ruleId"] for r in errors}
    assert "::error file=r7" in run.stderr and "title=CK003" in run.stderr
