#!/usr/bin/env bash
# The README's fresh-machine command, proven: a new venv, the README's first install exactly (the torch pin and
# `-e .`, no extras: so no Triton, no transformers), then a short form of the main job (`ddtree-bench sweep` on
# the embedded toy pair: AR, DFlash and one DDTree budget over 2 prompts, with its report). Fails if Triton is
# importable in that venv (then the check would prove nothing) or if the sweep does not exit 0 with its files.
#
#   bash scripts/fresh-machine-check.sh            # a temporary venv, removed afterwards; reuses pip's cache
#
# Same imports as the full main job: the grid is smaller, the code path is the same.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
t0=$(date +%s)
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q "torch==2.13.0" -e "$repo" >"$work/install.log" 2>&1 \
  || { tail -20 "$work/install.log" >&2; echo "fresh-machine-check: the README's install failed" >&2; exit 1; }
if "$work/venv/bin/python" -c "import triton" 2>/dev/null; then
  echo "fresh-machine-check: triton is importable in the fresh venv; this check needs an install without it" >&2
  exit 1
fi
t1=$(date +%s)
cd "$work"
"$work/venv/bin/ddtree-bench" sweep --limit 2 --max-new-tokens 16 --budgets 16 --out "$work/sweep" \
  >"$work/sweep.log" 2>&1 || { cat "$work/sweep.log" >&2; echo "fresh-machine-check: the main job failed" >&2; exit 1; }
for f in sweep/summary.csv sweep/sweep.json; do
  [ -s "$work/$f" ] || { cat "$work/sweep.log" >&2; echo "fresh-machine-check: $f missing" >&2; exit 1; }
done
compgen -G "$work/sweep*.html" >/dev/null || compgen -G "$work/reports/*.html" >/dev/null \
  || { cat "$work/sweep.log" >&2; echo "fresh-machine-check: the sweep wrote no report" >&2; exit 1; }
t2=$(date +%s)
grep -v '%|' "$work/sweep.log" | tail -8
echo "fresh-machine-check: ok (install $((t1 - t0)) s, main job $((t2 - t1)) s, no Triton, no extras)"
