#!/usr/bin/env bash
# The whole GPU test suite in one device call: `pytest -m gpu tests/engine/gpu tests/perf`, every test, no -x.
# On the H200 image pytest-xdist and pytest-timeout are not installed: carry them as wheels in $WHL (default
# .whl-speed: pytest_xdist, execnet, pytest_timeout; see the device README's Notes) and this installs them under
# /tmp. With xdist, WORKERS processes (default 8) share the one GPU: the suite's time is mostly Triton compiling
# kernels on the CPU (16 cores there), one process compiles one kernel at a time between its tests; tests marked
# with one xdist_group (those that compile the same tree kernel) run on one worker, so it is compiled once. With
# pytest-timeout, one test that runs past TEST_TIMEOUT s (default 240) fails alone and the rest still run;
# SUITE_TIMEOUT (default 480) bounds the whole run: at it pytest gets a Ctrl-C (SIGINT), so a cut run still prints
# how many passed and failed and the slowest tests (killed 30 s later if it does not stop). Prints pytest's summary,
# the 25 slowest tests, and "gpu suite: exit RC in S s" last.
# Run from the repo root:  WHL=.whl-speed bash benchmarks/gpu_suite.sh
set -u
WHL=${WHL:-.whl-speed}
if ls "$WHL"/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-suite "$WHL"/*.whl \
    && export PYTHONPATH=/tmp/site-suite${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 DDTREE_TESTS_INSTAFAIL=1
args=()
python3 -c "import xdist" 2> /dev/null && args+=(-n "${WORKERS:-8}" --dist loadgroup)
python3 -c "import pytest_timeout" 2> /dev/null && args+=(--timeout "${TEST_TIMEOUT:-240}")
echo "gpu suite: $(python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA")') ${args[*]}"
t0=$(date +%s)
timeout -s INT -k 30 "${SUITE_TIMEOUT:-480}" python3 -m pytest -p no:cacheprovider -m gpu -q -rfEs --durations=25 "${args[@]}" \
  tests/engine/gpu tests/perf
rc=$?
[ "$rc" = 124 ] && echo "gpu suite: cut at SUITE_TIMEOUT=${SUITE_TIMEOUT:-480} s; the counts above are the tests that ran"
echo "gpu suite: exit $rc in $(( $(date +%s) - t0 )) s"
exit $rc
