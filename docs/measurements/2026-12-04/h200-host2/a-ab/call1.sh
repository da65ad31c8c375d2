#!/usr/bin/env bash
# call 1 (2026-12-04 evening 2): host A/B (lone AR, old = a9553b7 vs this tree), slot-ranges knob A/B, HTTP A/B
set -u
O=$OUT
cp -r ddtree_bench/models ddtree_bench/data .ab/old/ddtree_bench/ 2> /dev/null
t0=$(date +%s)
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv; python3 -c 'import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)'; } > $O/env.txt 2>&1
for i in 1 2; do for arm in old new; do p=.; [ $arm = old ] && p=.ab/old
  echo "== $arm $i" >> $O/host.txt
  PYTHONPATH=$p timeout 120 python3 benchmarks/gpu_host_profile.py --method ar --requests 6 --new 256 >> $O/host.txt 2>&1
done; done
for arm in new old; do p=.; [ $arm = old ] && p=.ab/old
  echo "== $arm consumer 100" >> $O/consumer.txt
  PYTHONPATH=$p timeout 120 python3 benchmarks/gpu_host_profile.py --method ar --requests 5 --new 256 --consumer-us 100 >> $O/consumer.txt 2>&1
done
echo "host done $(( $(date +%s) - t0 )) s" >> $O/env.txt
PYTHONPATH=. timeout 200 python3 benchmarks/gpu_batch_ab.py --points dflash,ddtree:16 --batches 2,4 --arm default \
  --arm "r14 DDTREE_TREE_SLOT_RANGES=14" --arm "r12 DDTREE_TREE_SLOT_RANGES=12" --arm "r24 DDTREE_TREE_SLOT_RANGES=24" > $O/batch_ab.txt 2>&1
echo "batch done $(( $(date +%s) - t0 )) s" >> $O/env.txt
OUT=/tmp/hab CODE_B=.ab/old METHOD=ar MAX_BATCH=4 ROUNDS=5 timeout 230 bash benchmarks/gpu_serve_http_ab.sh > $O/http_ab.txt 2>&1
echo "http done $(( $(date +%s) - t0 )) s" >> $O/env.txt
