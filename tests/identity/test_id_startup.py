"""`exl3tool identity` (and header parsing) never imports numpy or torch: start-up stays fast."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from exl3tool.io.st_writer import SafetensorsStreamWriter, TensorSpec

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import runpy, sys
sys.argv = ["exl3tool", "identity", sys.argv[1], "--no-compat"]
try:
    runpy.run_module("exl3tool", run_name="__main__")
except SystemExit as exc:
    assert not exc.code, exc.code
print(sorted(m for m in ("numpy", "torch") if m in sys.modules))
"""


def test_identity_command_imports_neither_numpy_nor_torch(tmp_path: Path) -> None:
    shard = tmp_path / "t.safetensors"
    with open(shard, "wb") as fh:
        SafetensorsStreamWriter(fh, [TensorSpec("t", "U8", (8,))]).write(bytes(8))
    env = {"PYTHONPATH": str(REPO), "EXL3TOOL_NO_PROGRESS": "1", "PATH": "/usr/bin:/bin"}
    if "LD_LIBRARY_PATH" in os.environ:  # a Python that is not the system's finds libpython
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(shard)], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_numpy_dtypes_are_still_available() -> None:
    import numpy as np

    from exl3tool.io import dtypes

    assert dtypes.NUMPY["BF16"] == np.dtype("<u2")
    assert dtypes.numpy_dtype("F32") == np.dtype("<f4")
    assert set(dtypes.NUMPY) == set(dtypes.NUMPY_STR)
