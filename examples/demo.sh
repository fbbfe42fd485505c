#!/usr/bin/env bash
# exl3tool demo: real reports on the bundled examples (make demo runs this after installing).
set -euo pipefail
cd "$(dirname "$0")/.."
# The interpreter `make` installed into (make PYTHON=...); `exl3tool` itself is `python -m exl3tool`.
PY="${PYTHON:-python3}"
x() { "$PY" -m exl3tool "$@"; }

echo "### exl3tool validate examples/r7-tiny"
x validate examples/r7-tiny

echo
echo "### exl3tool validate --hash (recompute every payload, shard and file digest)"
x validate --hash --quiet examples/r7-tiny && echo "digests verified"

echo
echo "### exl3tool inspect examples/r7-tiny"
x inspect examples/r7-tiny

echo
echo "### a defect: k_values with a bool posing as an int, in both copies of quantization_config"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r examples/r7-tiny "$work/r7-broken"
"$PY" - "$work/r7-broken" <<'PY'
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
for name in ("config.json", "quantization_config.json"):
    doc = json.loads((root / name).read_text())
    (doc.get("quantization_config") or doc)["r7_routed_experts"]["k_values"] = [True, 4, 5]
    (root / name).write_text(json.dumps(doc, indent=2))
PY
status=0
x validate --quiet "$work/r7-broken" || status=$?
echo "exit status $status (1 = errors found)"

echo
echo "### MSRT: validate the 2-stage cartridge against its base, for TP 2"
x validate --hash --tp 2 --base examples/msrt-base-tiny examples/cartridge-k3k4

echo
echo "### exl3tool stage-cartridge --tp 2 (verified copy, full -> rank-sharded, runtime tables)"
OUT="${DEMO_OUT:-demo-out}"  # where the staged copy goes (the tests: a temporary folder)
mkdir -p "$OUT"
x stage-cartridge examples/cartridge-k3k4 --base examples/msrt-base-tiny --tp 2 -o "$OUT/staged-tp2" --force

echo
echo "### the staged output validates too"
x validate --hash --tp 2 --base examples/msrt-base-tiny "$OUT/staged-tp2"

echo
echo "### exl3tool verify-swap --tp 2: hot load == cold build, unload and rollback bit for bit (gloo, 2 ranks)"
x verify-swap examples/msrt-base-tiny examples/cartridge-k3k4 --tp 2
