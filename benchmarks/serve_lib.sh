# Sourced by gpu_serve_http.sh and gpu_serve_http_ab.sh. wait_ready LOG PID: prints the port that `ddtree-bench serve`
# (process PID, logging to LOG) announced on its "ready at" line once it is up; fails if the process ends or 120 s
# pass first.
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
