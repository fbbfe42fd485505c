"""What users of `hf`, `b3sum` and `check-jsonschema` expect of every command: `-h`, `-o` with
the one overwrite rule, `--format` choices, 80-column tables, literal brackets, usage errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from exl3tool.cli.main import app
from exl3tool.docs_gen import command_names
from exl3tool.rules.registry import all_rules

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
R7, BASE, CART = EXAMPLES / "r7-tiny", EXAMPLES / "msrt-base-tiny", EXAMPLES / "cartridge-k3k4"
WIDE = {"COLUMNS": "1000", "NO_COLOR": "1", "GITHUB_ACTIONS": None}
NARROW = {"COLUMNS": None, "LINES": None, "NO_COLOR": "1", "GITHUB_ACTIONS": None}


def run(*args: object, env: dict | None = None):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, [str(a) for a in args], env=env or NARROW)


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An R7 checkpoint with a truncated expert shard (findings, not a crash)."""
    d = tmp_path_factory.mktemp("conv") / "r7"
    shutil.copytree(R7, d)
    shard = d / "r7-experts-layer-002.safetensors"
    shard.write_bytes(shard.read_bytes()[:4000])
    return d


@pytest.mark.parametrize("name", [None, *command_names()])
def test_dash_h_is_help_everywhere(name: str | None) -> None:
    args = ["-h"] if name is None else [name, "-h"]
    res = run(*args)
    assert res.exit_code == 0, res.output
    assert "Usage:" in res.output and "--help" in res.output


def test_help_documents_the_exit_codes() -> None:
    out = " ".join(run("--help").output.split())
    for text in ("0 clean", "1 findings", "2 usage error", "3 unreadable input", "130", "143"):
        assert text in out


@pytest.mark.parametrize(
    ("args", "choices"),
    [
        (["validate", R7], ("text", "json", "sarif", "junit")),
        (["check", R7], ("text", "json", "sarif", "junit")),
        (["inspect", R7], ("text", "json")),
        (["rules"], ("text", "json")),
        (["diff", R7, R7], ("text", "json")),
    ],
)
def test_format_lists_its_choices_in_help_and_errors(args: list, choices: tuple) -> None:
    help_text = run(args[0], "--help", env=WIDE).output
    wrong = run(*args, "--format", "yaml", env=WIDE)
    assert wrong.exit_code == 2
    for c in choices:
        assert c in help_text
        assert f"'{c}'" in wrong.output  # "'yaml' is not one of 'text', 'json', ..."


@pytest.mark.parametrize("command", ["validate", "check"])
def test_output_file_and_the_overwrite_rule(command: str, broken: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    first = run(command, broken, "-f", "json", "-o", out)
    assert first.exit_code == 1, first.output  # the findings decide the exit code
    doc = json.loads(out.read_text())
    assert doc["schema"] == "exl3tool-report/1" and doc["summary"]["errors"] >= 1
    out.write_text("keep me")
    again = run(command, broken, "-f", "json", "-o", out)
    assert again.exit_code == 1 and "pass --force" in again.output
    assert out.read_text() == "keep me"  # refused before any work, nothing replaced
    forced = run(command, broken, "-f", "json", "-o", out, "--force")
    assert forced.exit_code == 1
    assert json.loads(out.read_text())["summary"] == doc["summary"]


def test_identity_output_json_is_read_by_check_diff_and_the_gate(tmp_path: Path) -> None:
    record = tmp_path / "r7.identity.json"
    assert run("identity", R7, "-o", record).exit_code == 0  # *.json: JSON without --format
    doc = json.loads(record.read_text())
    assert doc["schema"] == "exl3tool-identity/1"
    assert run("identity", "--check", record, R7).exit_code == 0
    assert run("diff", record, R7).exit_code == 0
    toml = tmp_path / "exl3tool.toml"
    toml.write_text(
        'schema = "exl3tool-config/1"\nhash = false\n\n[[artifacts]]\nname = "r7"\n'
        f'path = "{R7}"\nidentity = "{record}"\n'
    )
    gate = run("check", "--config", toml, "-f", "json")
    assert gate.exit_code == 0, gate.output
    (art,) = json.loads(gate.stdout)["artifacts"]
    assert art["details"]["identity_file"] == str(record)
    assert {c["name"]: c["status"] for c in art["details"]["checks"]}["identity --check"] == "pass"


def test_identity_text_output_is_text(tmp_path: Path) -> None:
    out = tmp_path / "r7.txt"
    assert run("identity", R7, "-o", out).exit_code == 0
    assert out.read_text().splitlines()[1].startswith("root   ")


def _widths(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


@pytest.mark.parametrize(
    "args",
    [
        ["rules"],
        ["inspect", R7],
        ["inspect", BASE],
        ["validate", "PLACEHOLDER"],
        ["check", R7],
    ],
)
def test_text_tables_fit_80_columns(args: list, broken: Path) -> None:
    args = [broken if a == "PLACEHOLDER" else a for a in args]
    res = run(*args)
    assert res.exit_code in (0, 1), res.output
    assert res.stdout.strip() and _widths(res.stdout) <= 80


def test_rules_print_brackets_literally() -> None:
    out = run("rules", env=WIDE).stdout
    bracketed = [r for r in all_rules() if "[" in r.title + r.hint]
    assert bracketed  # the catalogue has some: data_offsets [begin, end], exl3tool[hf] ...
    for r in bracketed:
        assert r.title in out and r.hint in out, r.code
    assert "[begin, end]" in out and "exl3tool[hf]" in out


def test_rules_family() -> None:
    res = run("rules", "--family", "r7", "-f", "json")
    assert res.exit_code == 0
    codes = [r["code"] for r in json.loads(res.stdout)]
    assert codes and all(c.startswith("R7") for c in codes)
    bad = run("rules", "--family", "ZZ")
    assert bad.exit_code == 2 and "ZZ" in bad.output and "R7" in bad.output


def test_hints_say_hf_download() -> None:
    texts = " ".join(r.hint + r.why + r.title for r in all_rules())
    assert "huggingface-cli" not in texts
    assert any("hf download" in r.hint for r in all_rules() if r.code == "GT003")


def test_inspect_plot_refuses_to_overwrite(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "k.png"
    out.write_bytes(b"old")
    res = run("inspect", BASE, "--plot", out)
    assert res.exit_code == 1 and "pass --force" in res.output
    assert out.read_bytes() == b"old"
    assert run("inspect", BASE, "--plot", out, "--force").exit_code == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_inspect_plot_colours_are_discrete_k_values() -> None:
    pytest.importorskip("matplotlib")
    from exl3tool.actions.inspect_plot import _ticks, k_colours

    assert len(k_colours([2])) == 1  # a uniform K=2 base: one colour
    three = k_colours([2, 3, 5])
    assert len(set(three)) == 3  # one distinct colour per K present
    ticks = _ticks(40)
    assert all(isinstance(t, int) for t in ticks) and len(ticks) <= 12 and ticks[0] == 0
    assert _ticks(3) == [0, 1, 2]


def test_inspect_plot_of_a_uniform_base_uses_one_colour(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    images = []
    real = plt.Axes.imshow

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        images.append(real(self, *args, **kwargs))
        return images[-1]

    monkeypatch.setattr(plt.Axes, "imshow", spy)
    assert run("inspect", BASE, "--plot", tmp_path / "k.png").exit_code == 0
    assert images and all(im.cmap.N == 1 for im in images)
    axes = images[0].axes
    assert all(float(t).is_integer() for t in axes.get_xticks())


@pytest.mark.parametrize(
    ("command", "text"),
    [
        ("validate", "org/name[@revision]"),
        ("identity", "org/name[@revision]"),
        ("inspect", "org/name[@revision]"),
        ("diff", "org/name[@revision]"),
        ("slice", "org/name[@revision]"),
        ("stage-cartridge", "org/name[@revision]"),
        ("check", "org/name[@revision]"),
        ("decode", "exl3tool[runtime]"),
        ("verify-swap", "exl3tool[runtime]"),
    ],
)
def test_help_prints_brackets_literally(command: str, text: str) -> None:
    out = run(command, "--help", env=WIDE).output
    assert text in out


@pytest.mark.parametrize("command", ["validate", "check"])
def test_rule_selection_on_the_command_line(command: str, broken: Path) -> None:
    full = json.loads(run(command, broken, "-f", "json").stdout)
    codes = sorted({f["code"] for f in full["findings"] if f["severity"] == "error"})
    assert codes
    one = json.loads(run(command, broken, "-f", "json", "--select", codes[0]).stdout)
    assert {f["code"] for f in one["findings"]} == {codes[0]}
    none = run(command, broken, "-f", "json", "--ignore", ",".join(codes))
    assert none.exit_code == 0 and json.loads(none.stdout)["summary"]["errors"] == 0
    levels = [a for c in codes for a in ("--severity", f"{c}=warning")]
    soft = run(command, broken, "-f", "json", *levels)
    assert soft.exit_code == 0 and json.loads(soft.stdout)["summary"]["errors"] == 0
    assert run(command, broken, "-f", "json", "--strict", *levels).exit_code == 1
    bad = run(command, broken, "--select", "ZZ999")
    assert bad.exit_code == 2 and "ZZ999" in bad.output
