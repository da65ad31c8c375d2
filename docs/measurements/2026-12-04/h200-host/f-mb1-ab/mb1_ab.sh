#!/usr/bin/env bash
# serve --max-batch 1 (the single loop through HTTP), old vs new package alternating; AR on the toy pair.
set -u
for i in $(seq 1 "${ROUNDS:-6}"); do
  for arm in old new; do
    pp=.; [ $arm = old ] && pp=.ab/old
    d=/tmp/mb1ab/$arm-$i; mkdir -p $d
    PYTHONPATH=$pp python3 -m ddtree_bench serve --model toy --method ar --device cuda --dtype float32 --cuda-graphs \
      --max-batch 1 --port 0 > $d/serve.log 2>&1 &
    srv=$!; port=""
    for _ in $(seq 1 120); do port=$(grep -o "ready at http://127.0.0.1:[0-9]*" $d/serve.log | grep -o "[0-9]*$"); [ -n "$port" ] && break; sleep 0.5; done
    PYTHONPATH=$pp python3 -m ddtree_bench run --backend standalone --url "http://127.0.0.1:$port" --model toy --method ar \
      --suite gsm8k --limit 16 --max-new-tokens 256 --concurrency 1 --warmup 2 --out $d/run -q > /dev/null 2>&1
    kill $srv; wait $srv 2> /dev/null
    python3 -c "import json,sys; s=json.load(open('$d/run/summary.json')); print('$arm', $i, 'tpot_p50_ms %.4f tok_s %.1f' % (s['tpot_ms']['p50'], s['output_throughput_tok_s']))"
  done
done
