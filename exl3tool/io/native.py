"""Whether the optional compiled modules (native/*.c, built where a C compiler is) may be used.

Each caller imports its C function where this says so, and keeps its Python code for where the
module is absent: the results are the same (tests/io/test_*_native.py, test_index_scan.py).
EXL3TOOL_PURE_SCAN=1 leaves every compiled module unused, to compare or rule them out.
"""

from __future__ import annotations

import os

ENABLED = os.environ.get("EXL3TOOL_PURE_SCAN", "0") in ("", "0")
