# Sourced by gpu_serve_http.sh and gpu_serve_http_ab.sh. wait_ready LOG PID: prints the port that `ddtree-bench serve`
# (process PID, logging to LOG) announced on its "ready at" line once it is up; fails if the process ends or 120 s
# pass first. room_for_another START LAST: whether one more repetition of LAST seconds still ends within TIME_S
# seconds of START (epoch seconds; TIME_S unset: always; LAST = 0 before the first, which always runs), so a script under a device call's limit stops between
# repetitions and still summarises the ones that ran, instead of being cut mid-run with no summary.
# use_package CODE: checks that `python3 -m ddtree_bench` under PYTHONPATH=CODE runs CODE's package and prints
# that folder; fails with a line saying which package runs instead. `python3 -m` puts the working directory first
# on sys.path, so from the repo root any copy named on PYTHONPATH would lose to the repo's own package: the scripts
# export PYTHONSAFEPATH=1 (Python >= 3.11), which leaves it out, and check (on an older Python the check fails).
export PYTHONSAFEPATH=1
wait_ready() {
  local log=$1 pid=$2 port=""
  for _ in $(seq 1 240); do
    port=$(grep -o "ready at http://127.0.0.1:[0-9]*" "$log" | grep -o "[0-9]*$")
    [ -n "$port" ] && { echo "$port"; return 0; }
    kill -0 "$pid" 2> /dev/null || return 1
    sleep 0.5
  done
  return 1
}

room_for_another() {
  [ -z "${TIME_S:-}" ] && return 0
  [ $(( $(date +%s) - $1 + $2 )) -le "$TIME_S" ]
}

use_package() {
  local want got
  want=$(python3 -c 'import os, sys; print(os.path.abspath(sys.argv[1]))' "$1") || return 1
  got=$(PYTHONPATH="$want" python3 -c \
    'import os, ddtree_bench; print(os.path.dirname(os.path.dirname(os.path.abspath(ddtree_bench.__file__))))' 2> /dev/null)
  if [ "$got" != "$want" ]; then
    echo "PYTHONPATH=$1 does not run the ddtree_bench package in $want (python3 imports it from: ${got:-nowhere})" >&2
    return 1
  fi
  echo "$want"
}
