#!/usr/bin/env bash
# Build (or reuse) llama.cpp's `llama-server` from the llama.cpp source vendored in PyPI's pinned
# llama-cpp-python sdist, plus a small venv for the GGUF converter, for the real-llama.cpp tests and for
# `ddtree-bench sweep --backends llamacpp --llama-server BIN`.
#
#   bash scripts/install-llama-cpp.sh            # -> ~/.cache/ddtree-bench/llama.cpp-0.3.36/
#   DDTREE_BENCH_LLAMA_CPP_DIR=/opt/llama bash scripts/install-llama-cpp.sh
#
# Only the `llama-server` target is built (Release, no libcurl, one job per core or DDTREE_BENCH_LLAMA_CPP_JOBS,
# at nice 10: run the script itself un-niced, nested nice starves the compiler). GGML_NATIVE=ON compiles for this
# machine's CPU (AVX2/AVX-512 where present): right for a developer machine and for CI, which runs on the machine
# that built the cache. A cache copied to another CPU may stop with an illegal instruction: the reuse check runs
# the binary, so such a cache is rebuilt; DDTREE_BENCH_LLAMA_CPP_NATIVE=OFF builds a portable binary instead.
# The converter venv (CACHE/venv-convert) sees the installing interpreter's packages (torch, transformers,
# numpy: the project's own dependencies) and adds the sdist's own gguf-py, so the converter and the server come
# from one llama.cpp commit. Run this with the Python that runs ddtree-bench (PYTHON=... to choose another).
# Under CI=true a failure fails the run; elsewhere it warns and exits 0, and the tests that need llama-server
# skip and say why. Figures (cold build, size, warm reuse) are in docs/llama-cpp.md.
set -uo pipefail
PIN="0.3.36"
CACHE="${DDTREE_BENCH_LLAMA_CPP_DIR:-$HOME/.cache/ddtree-bench/llama.cpp-$PIN}"
NATIVE="${DDTREE_BENCH_LLAMA_CPP_NATIVE:-ON}"
PYTHON="${PYTHON:-python3}"
SRC="$CACHE/src/llama_cpp_python-$PIN"
BUILD="$CACHE/build"
BIN="$BUILD/bin/llama-server"
VENV="$CACHE/venv-convert"
STAMP="$CACHE/build.stamp"   # what the binary was built from: pin and native flag

fail() {
  echo "install-llama-cpp: $*" >&2
  if [ "${CI:-}" = "true" ]; then exit 1; fi
  echo "install-llama-cpp: continuing without llama-server; the real-llama.cpp tests will skip" >&2
  exit 0
}

binary_ok() { [ -x "$BIN" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$PIN native=$NATIVE" ] && "$BIN" --version >/dev/null 2>&1; }
venv_ok() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import gguf, numpy, sentencepiece, torch, transformers" >/dev/null 2>&1; }

mkdir -p "$CACHE" || fail "cannot create $CACHE"

if [ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]; then
  echo "install-llama-cpp: downloading the llama-cpp-python==$PIN sdist from PyPI"
  rm -rf "$CACHE/src" "$CACHE/sdist"
  mkdir -p "$CACHE/src" "$CACHE/sdist"
  # The sdist only (--no-binary for this package; its build backend may come as a wheel: pip prepares metadata).
  "$PYTHON" -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$PIN" \
      -d "$CACHE/sdist" >"$CACHE/download.log" 2>&1 \
    || fail "pip download llama-cpp-python==$PIN failed (log: $CACHE/download.log)"
  tar -xzf "$CACHE"/sdist/llama_cpp_python-"$PIN".tar.gz -C "$CACHE/src" \
    || fail "could not unpack the sdist in $CACHE/sdist"
  [ -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ] || fail "the sdist has no vendor/llama.cpp (looked in $SRC)"
fi

if binary_ok; then
  echo "install-llama-cpp: reusing $BIN"
else
  for tool in cmake make c++; do
    command -v "$tool" >/dev/null 2>&1 || fail "$tool is not installed (apt-get install cmake build-essential)"
  done
  echo "install-llama-cpp: building llama-server into $BUILD (first time: ~15 min on 2 cores)"
  start=$(date +%s)
  rm -f "$STAMP"   # the build directory is kept: an interrupted or reconfigured build resumes where it stopped
  nice -n 10 cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE="$NATIVE" \
      -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
      >"$CACHE/build.log" 2>&1 \
    || fail "cmake configure failed (log: $CACHE/build.log)"
  nice -n 10 cmake --build "$BUILD" --target llama-server -j "${DDTREE_BENCH_LLAMA_CPP_JOBS:-$(nproc)}" \
      >>"$CACHE/build.log" 2>&1 \
    || fail "building llama-server failed (log: $CACHE/build.log)"
  echo "$PIN native=$NATIVE" >"$STAMP"
  binary_ok || fail "$BIN does not run after the build (log: $CACHE/build.log)"
  echo "install-llama-cpp: built in $(( $(date +%s) - start )) s; $(du -sh "$BUILD/bin" | cut -f1) in $BUILD/bin"
fi

if venv_ok; then
  echo "install-llama-cpp: reusing the converter venv $VENV"
else
  echo "install-llama-cpp: creating the converter venv $VENV"
  rm -rf "$VENV"
  "$PYTHON" -m venv --system-site-packages "$VENV" || fail "could not create the venv $VENV"
  # sentencepiece: the converter imports it for Qwen-family vocabularies even when there is no tokenizer.model
  "$VENV/bin/python" -m pip install -q "$SRC/vendor/llama.cpp/gguf-py" "sentencepiece>=0.1.98,<0.3.0" \
      >"$VENV.install.log" 2>&1 \
    || fail "pip install gguf-py sentencepiece failed (log: $VENV.install.log)"
  venv_ok || fail "the converter venv cannot import gguf, numpy, sentencepiece, torch and transformers (install torch and \
transformers into $PYTHON first: pip install -e .)"
fi
echo "install-llama-cpp: converter: $VENV/bin/python $SRC/vendor/llama.cpp/convert_hf_to_gguf.py"
echo "install-llama-cpp: ready: $BIN"
