#!/usr/bin/env bash
# Install (or reuse) SGLang 0.5.23 in a virtual environment of its own, with this project's CPU shim, for the
# real-SGLang tests and for `ddtree-bench sweep --backends sglang --server-python VENV/bin/python` on a machine
# without a GPU.
#
#   bash scripts/install-sglang-cpu.sh            # -> ~/.cache/ddtree-bench/venv-sglang-cpu-0.5.23
#   DDTREE_BENCH_SGLANG_VENV=/opt/sglang bash scripts/install-sglang-cpu.sh
#
# Why this shape (docs/sglang-cpu.md): PyPI's sglang 0.5.23 pins CUDA torch 2.14.1 and CUDA-only kernels and
# PyPI has no CPU build of sgl-kernel. So: the CPU torch 2.13.0 wheel held by a constraints file, sglang with
# --no-deps, its requirements minus the CUDA/GPU ones (scripts/sglang_cpu_shim/requirements-cpu.txt), PyPI's
# torchvision (a CUDA build) with its two unconditional fake-op registrations guarded so it imports beside a
# CPU torch, and the shim (scripts/sglang_cpu_shim/: a stand-in `sgl_kernel` and import-time patches that are
# active only when DDTREE_BENCH_SGLANG_CPU_SHIM=1, which the bundled sglang profile sets on CPU). The shim goes
# into THIS venv only, never into the product's environment. ~5 min and ~3 GB on the first run; seconds when
# it is there (the shim is copied again every time, so an edit to it lands on the next run).
# Under CI=true a failure fails the run (the real-server tests must not skip in CI); elsewhere it warns and
# exits 0, and the tests that need SGLang skip and say why.
set -uo pipefail
PIN="0.5.23"
HERE="$(cd "$(dirname "$0")" && pwd)"
SHIM="$HERE/sglang_cpu_shim"
VENV="${DDTREE_BENCH_SGLANG_VENV:-$HOME/.cache/ddtree-bench/venv-sglang-cpu-$PIN}"
PY="$VENV/bin/python"
LOG="$VENV.install.log"

fail() {
  echo "install-sglang-cpu: $*" >&2
  if [ "${CI:-}" = "true" ]; then exit 1; fi
  echo "install-sglang-cpu: continuing without SGLang; the real-SGLang tests will skip" >&2
  exit 0
}

DONE="$VENV/.ddtree-bench-complete"   # written once every package step succeeded (a half install is redone)
check() { [ -f "$DONE" ] && "$PY" -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('sglang') == '$PIN' else 1)" 2>/dev/null; }
pip_c() { "$PY" -m pip install -q -c "$SHIM/constraints.txt" "$@" >>"$LOG" 2>&1; }

if [ -x "$PY" ] && check; then
  echo "install-sglang-cpu: reusing $VENV (sglang $PIN)"
else
  echo "install-sglang-cpu: installing sglang==$PIN (CPU) into $VENV (first time: a few minutes)"
  rm -rf "$VENV"
  : >"$LOG"
  python3 -m venv "$VENV" || fail "could not create the venv $VENV"
  pip_c "torch==2.13.0" || fail "pip install torch==2.13.0 (the CPU wheel) failed (log: $LOG)"
  pip_c --no-deps "sglang==$PIN" || fail "pip install --no-deps sglang==$PIN failed (log: $LOG)"
  pip_c -r "$SHIM/requirements-cpu.txt" || fail "SGLang's CPU requirements did not install (log: $LOG)"
  pip_c --no-deps "torchvision==0.28.0" || fail "pip install --no-deps torchvision==0.28.0 failed (log: $LOG)"
  touch "$DONE"
  check || fail "sglang $PIN is not installed after the install (log: $LOG)"
fi
# torchvision from PyPI is a CUDA build: its C++ ops do not load beside CPU torch, and its fake-op registrations
# for nms/qnms then fail at import. Guard them (idempotent; every run, a later pip run may restore the file).
"$PY" "$SHIM/fix_torchvision.py" || fail "could not patch torchvision's fake-op registrations in $VENV"
# The shim: copied into the venv's site-packages (a .pth line imports it at interpreter start; it does nothing
# unless DDTREE_BENCH_SGLANG_CPU_SHIM=1).
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || fail "no site-packages in $VENV"
rm -rf "$SITE/sgl_kernel" "$SITE/ddtree_sglang_cpu_shim"
cp -r "$SHIM/sgl_kernel" "$SHIM/ddtree_sglang_cpu_shim" "$SITE/" || fail "could not copy the CPU shim into $SITE"
cp "$SHIM/ddtree_sglang_cpu_shim.pth" "$SITE/" || fail "could not install the shim's .pth into $SITE"
find "$SITE/sgl_kernel" "$SITE/ddtree_sglang_cpu_shim" -name __pycache__ -prune -exec rm -rf {} +
DDTREE_BENCH_SGLANG_CPU_SHIM=1 SGLANG_USE_CPU_ENGINE=1 "$PY" -c "import sglang.launch_server, ddtree_sglang_cpu_shim as s; s.check_installed()" \
  >>"$LOG" 2>&1 || fail "sglang.launch_server does not import with the CPU shim in $VENV (log: $LOG)"
echo "install-sglang-cpu: ready: $PY"
