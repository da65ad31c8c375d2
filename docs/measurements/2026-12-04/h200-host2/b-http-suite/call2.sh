#!/usr/bin/env bash
# call 2: host profile (this tree), serve_solo random, HTTP mb1 vs mb4 (AR, toy), the whole GPU suite
set -u
O=$OUT; t0=$(date +%s)
date -u > $O/env.txt
PYTHONPATH=. timeout 90 python3 benchmarks/gpu_host_profile.py --method ar --requests 6 --new 256 > $O/host.txt 2>&1
PYTHONPATH=. timeout 90 python3 benchmarks/gpu_host_profile.py --method ar --requests 5 --new 256 --consumer-us 100 >> $O/host.txt 2>&1
PYTHONPATH=. timeout 90 python3 benchmarks/gpu_serve_solo.py --shape random --dtype float32 --budgets 16 --slots 4 --requests 8 --new 256 --prefix-len 256 > $O/solo.txt 2>&1
echo "host+solo done $(( $(date +%s) - t0 )) s" >> $O/env.txt
OUT=/tmp/h_mb METHOD=ar REPS=5 timeout 170 bash benchmarks/gpu_serve_http.sh > $O/http_mb.txt 2>&1
echo "http done $(( $(date +%s) - t0 )) s" >> $O/env.txt
WHL=.whl-speed SUITE_TIMEOUT=300 bash benchmarks/gpu_suite.sh > $O/suite.txt 2>&1
echo "suite done $(( $(date +%s) - t0 )) s" >> $O/env.txt
