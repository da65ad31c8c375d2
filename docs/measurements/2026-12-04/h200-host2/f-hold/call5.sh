#!/usr/bin/env bash
set -u
O=$OUT; t0=$(date +%s)
cp -r ddtree_bench/models ddtree_bench/data .ab/old2/ddtree_bench/ 2> /dev/null
date -u > $O/env.txt
for arm in new old new old; do p=.; [ $arm = old ] && p=.ab/old2; echo "== $arm"
  PYTHONPATH=$p timeout 60 python3 benchmarks/gpu_host_profile.py --method ar --requests 5 --new 256 --consumer-us 100 --trace 2>&1 | grep -E "decode ms|^trace"
done > $O/trace.txt
for arm in new old; do p=.; [ $arm = old ] && p=.ab/old2; echo "== $arm"
  PYTHONPATH=$p timeout 60 python3 benchmarks/gpu_host_profile.py --method ar --requests 6 --new 256 2>&1 | grep -E "decode ms"
done >> $O/trace.txt
echo "host done $(( $(date +%s) - t0 )) s" >> $O/env.txt
OUT=/tmp/hab3 CODE_B=.ab/old2 METHOD=ar MAX_BATCH=4 ROUNDS=4 timeout 200 bash benchmarks/gpu_serve_http_ab.sh > $O/http_ab.txt 2>&1
echo "http done $(( $(date +%s) - t0 )) s" >> $O/env.txt
