#!/usr/bin/env bash
# call 1 (2026-12-04 night): the server's chunk cost, new (this tree) vs base (f5c3592), through HTTP, A/B done right
set -u
O=$OUT
cp -r ddtree_bench/models ddtree_bench/data .ab/base/ddtree_bench/ 2> /dev/null
t0=$(date +%s)
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv; python3 -c 'import sys, torch, triton, aiohttp; print(sys.version.split()[0], torch.__version__, torch.version.cuda, triton.__version__, aiohttp.__version__)'; nproc; } > $O/env.txt 2>&1
for i in 1 2; do for arm in new base; do p=.; [ $arm = base ] && p=.ab/base
  echo "== $arm $i" >> $O/chunk_cost.txt
  PYTHONPATH=$p timeout 60 python3 benchmarks/serve_chunk_cost.py --reps 4 >> $O/chunk_cost.txt 2>&1
done; done
echo "chunk cost done $(( $(date +%s) - t0 )) s" >> $O/env.txt
OUT=/tmp/ab1 CODE_B=.ab/base METHOD=ar MAX_BATCH=1 ROUNDS=8 TIME_S=220 timeout 260 bash benchmarks/gpu_serve_http_ab.sh > $O/http_ab_mb1.txt 2>&1
echo "mb1 done $(( $(date +%s) - t0 )) s" >> $O/env.txt
OUT=/tmp/ab4 CODE_B=.ab/base METHOD=ar MAX_BATCH=4 ROUNDS=8 TIME_S=220 timeout 260 bash benchmarks/gpu_serve_http_ab.sh > $O/http_ab_mb4.txt 2>&1
echo "mb4 done $(( $(date +%s) - t0 )) s" >> $O/env.txt
