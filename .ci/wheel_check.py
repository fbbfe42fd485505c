"""CI checks of the package as users get it (run by .ci/run).

    python wheel_check.py contents WHEEL SRC  what the wheel built from SRC ships and requires
    python wheel_check.py hook YAML           the pre-commit hook installs without torch
    python wheel_check.py commands EXAMPLES   the core commands on copies of the bundled examples,
                                              from the current directory (outside the checkout),
                                              with an interpreter that has no torch

Each command's exit code is asserted, and a meta-path hook (installed through sitecustomize)
records every attempt to import torch, triton or exllamav3, even one that a caller catches.
"""

from __future__ import annotations

import email
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "triton", "exllamav3")

_HOOK = """
import os, sys

class _Heavy:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {heavy!r}:
            with open(os.environ["EXL3TOOL_CI_IMPORT_LOG"], "a") as fh:
                fh.write(name + "\\n")
        return None

sys.meta_path.insert(0, _Heavy())
"""


def contents(wheel: Path, source: Path = ROOT) -> None:
    """Every file of the package in `source` (schemas, data) is in the wheel; the core needs no
    torch."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(z.read(meta_name))
    shipped = {
        p.relative_to(source).as_posix()
        for p in (source / "exl3tool").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    missing = sorted(shipped - names)
    assert not missing, f"not in the wheel: {missing}"
    # native/*.c, compiled wherever setup.py found a C compiler (else the Python code runs)
    modules = ("_header_scan", "_spans")
    built = [m for m in modules
             if any(re.fullmatch(rf"exl3tool/io/{m}\..*\.so", n) for n in names)]  # fmt: skip
    native = len(built) == len(modules)
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    assert native or not (cc and shutil.which(cc[0])), f"a C compiler is here, built only {built}"
    requires = meta.get_all("Requires-Dist") or []
    core = [r for r in requires if "extra ==" not in r]
    assert not [r for r in core if re.match(r"(torch|exllamav3|triton)\b", r)], core
    extras = {e: [r for r in requires if f"extra == '{e}'" in r or f'extra == "{e}"' in r] for e in
              ("runtime", "cuda")}  # fmt: skip
    assert any(r.startswith("torch") for r in extras["runtime"]), extras
    assert any(r.startswith("exllamav3==") for r in extras["cuda"]), extras
    scan = "the C modules" if native else "no C compiler: the Python code"
    print(f"wheel: {len(names)} files, {scan}, core requires {', '.join(core)}")


def hook(path: Path) -> None:
    """The pre-commit hook installs like the wheel (language python: `pip install .`), with no
    extra dependency that would pull torch, and its entry is a module of the package."""
    import yaml

    (h,) = yaml.safe_load(path.read_text())
    assert h["language"] == "python", h
    extra = " ".join(h.get("additional_dependencies", []))
    assert not re.search(r"torch|exllamav3|\[(runtime|cuda)", extra), extra
    module = re.fullmatch(r"python -m (exl3tool(\.\w+)+)", h["entry"])
    assert module and (ROOT / (module.group(1).replace(".", "/") + ".py")).is_file(), h["entry"]
    print(f"pre-commit hook {h['id']}: language python, entry {h['entry']}")


def _run(argv: list[str], want: int, env: dict[str, str], says: str = "") -> str:
    out = subprocess.run(
        [sys.executable, "-m", "exl3tool", *argv], capture_output=True, text=True, env=env
    )
    shown = " ".join(argv)
    text = out.stdout + out.stderr
    if out.returncode != want or "Traceback" in text or says not in text:
        sys.exit(f"exl3tool {shown}: exit {out.returncode}, want {want} {says!r}\n{text}")
    print(f"ok  exit {want}  exl3tool {shown}")
    return out.stdout


def _check_config(ex: Path) -> Path:
    """examples/ci/exl3tool.toml without verify-swap (that one needs the runtime extra)."""
    text = (ex / "ci" / "exl3tool.toml").read_text()
    cfg = ex / "ci" / "exl3tool-core.toml"
    cfg.write_text("\n".join(ln for ln in text.splitlines() if "verify_swap" not in ln) + "\n")
    return cfg


def commands(ex: Path) -> None:
    here = Path.cwd().resolve()
    assert ROOT not in (here, *here.parents), f"run from outside the checkout, not {here}"
    hook_dir = Path(tempfile.mkdtemp())
    (hook_dir / "sitecustomize.py").write_text(_HOOK.format(heavy=HEAVY))
    log = hook_dir / "imports.log"
    env = {**os.environ, "PYTHONPATH": str(hook_dir), "EXL3TOOL_CI_IMPORT_LOG": str(log)}
    env.pop("PYTHONSAFEPATH", None)
    where = subprocess.run(
        [sys.executable, "-c", "import exl3tool; print(exl3tool.__file__)"],
        capture_output=True, text=True, env=env, check=True,
    ).stdout.strip()  # fmt: skip
    assert ROOT not in Path(where).resolve().parents, (
        f"exl3tool imported from the checkout: {where}"
    )
    # a compiled module the wheel ships must import (a failing one would leave the Python code
    # running unnoticed: the package suppresses the ImportError)
    compiled = sorted(p.name.split(".")[0] for p in Path(where).parent.joinpath("io").glob("_*.so"))
    for name in compiled:
        subprocess.run([sys.executable, "-c", f"import exl3tool.io.{name}"], env=env, check=True)
    r7, base, cart = ex / "r7-tiny", ex / "msrt-base-tiny", ex / "cartridge-k3k4"
    for art in (r7, base, cart):
        _run(["validate", str(art)], 0, env)
        _run(["identity", str(art)], 0, env)
        _run(["inspect", str(art)], 0, env)
    _run(["validate", "--hash", str(base)], 0, env)
    _run(["identity", str(r7), "-o", "r7.identity.json"], 0, env)
    _run(["diff", str(r7), "r7.identity.json"], 0, env)
    _run(["stage-cartridge", str(cart), "--base", str(base), "-o", "staged"], 0, env)
    _run(["slice", str(base), "--tp", "2", "-o", "sliced"], 0, env)
    for out in ("staged", "sliced", "sliced/rank-1"):  # what the writers produce validates
        _run(["validate", out], 0, env)
    _run(["rules"], 0, env)
    _run(["check", "--config", str(_check_config(ex))], 0, env)
    script = Path(sys.executable).parent / "exl3tool"  # the console entry point of the wheel
    out = subprocess.run([str(script), "validate", str(r7)], capture_output=True, env=env)
    assert out.returncode == 0, f"{script} validate: exit {out.returncode}\n{out.stderr!r}"
    print(f"ok  exit 0  {script.name} validate (console script)")
    hook = [sys.executable, "-m", "exl3tool.actions.gate.precommit", str(r7 / "config.json")]
    out = subprocess.run(hook, capture_output=True, text=True, env=env)
    assert out.returncode == 0, f"pre-commit hook entry: exit {out.returncode}\n{out.stderr}"
    print("ok  exit 0  pre-commit hook entry (python -m exl3tool.actions.gate.precommit)")
    heavy = log.read_text().split() if log.exists() else []
    assert not heavy, f"torch-free commands tried to import: {sorted(set(heavy))}"
    print("no command imported torch, triton or exllamav3")
    # the runtime commands look for torch and name their extra in one line (exit 2)
    _run(["verify-swap", str(base), str(cart)], 2, env, says="exl3tool[runtime]")


if __name__ == "__main__":
    what, *args = sys.argv[1:]
    {"contents": contents, "hook": hook, "commands": commands}[what](*map(Path, args))
