# Sourced by the one-call GPU scripts (gpu_speed.sh, gpu_suite.sh, gpu_tree_attention.sh, gpu_feature_ab.sh): $OUT, the
# repo on PYTHONPATH, session.txt with timestamped `step` lines, the paper's tau per budget, and an env step
# (GPU, driver, torch / CUDA / Triton versions). DDTREE_TESTS_INSTAFAIL=1: a failing GPU test is named on stderr
# the moment it fails (tests/engine/gpu/conftest.py), so a call's time limit cannot swallow which one it was.
set -u
OUT=${OUT:-/tmp/ddtree-gpu}; mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 DDTREE_TESTS_INSTAFAIL=1
LOG="$OUT/session.txt"
step() { echo "== $* ($(date -u +%FT%TZ))" | tee -a "$LOG"; }
PAPER_TAU=16:8.6,32:9.3,64:9.75,128:10.2,256:10.4,512:10.73,1024:11.0
step env
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"; } 2>&1 | tee -a "$LOG"
