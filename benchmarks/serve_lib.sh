# Sourced by gpu_serve_http.sh and gpu_serve_http_ab.sh. wait_ready LOG PID: prints the port that `ddtree-bench serve`
# (process PID, logging to LOG) announced on its "ready at" line once it is up; fails if the process ends or 120 s
# pass first. room_for_another START LAST: whether one more repetition of LAST seconds still ends within TIME_S
# seconds of START (epoch seconds; TIME_S unset: always; LAST = 0 before the first, which always runs), so a script under a device call's limit stops between
# repetitions and still summarises the ones that ran, instead of being cut mid-run with no summary.
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
