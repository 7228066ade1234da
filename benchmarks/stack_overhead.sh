#!/usr/bin/env bash
# What the service adds to the engine: the same agentic sessions through the whole stack
# (`dspark-serve up`: gateway + Ray workers, over HTTP, measured by `dspark-serve bench`) and
# through the offline engine in-process (benchmarks/offline_sessions.py), then the two side
# by side (`python -m services.bench.compare`). Greedy, plain decoding on both sides.
#
#   benchmarks/stack_overhead.sh OUT_DIR MODEL DEVICE CONCURRENCY NUM_REQUESTS [up options...]
#   e.g. benchmarks/stack_overhead.sh out /models/llama cuda 32,128 384 --kv-cache-memory-bytes 30000000000
#   (P/D on one GPU: add --worker-gpus 0.5 so that both workers fit it)
#
# Each bench writes its JSON before its plot, so a machine without matplotlib still gets the
# numbers; run the last step (compare) where it is installed.
# The up options are passed to the offline engine too where it takes them (--max-num-seqs,
# --max-model-len, --max-num-batched-tokens, --kv-cache-memory-bytes).
set -uo pipefail
out=$1 model=$2 device=$3 levels=$4 requests=$5
shift 5
mkdir -p "$out"
port=${PORT:-8011}
python=${PYTHON:-python3}
workload=(--workload agentic --concurrency "$levels" --num-requests "$requests" --temperature 0 --seed 0)
up_options=("$@")
engine_options=()
while (($#)); do
  case $1 in
    --max-num-seqs | --max-model-len | --max-num-batched-tokens | --kv-cache-memory-bytes)
      engine_options+=("$1" "$2")
      shift
      ;;
  esac
  shift
done

"$python" -m services.cli up --model "$model" --device "$device" --speculative off --port "$port" \
  "${up_options[@]}" >"$out/up.log" 2>&1 &
up_pid=$!
trap 'kill -TERM $up_pid 2>/dev/null || true' EXIT
ready=0
for _ in $(seq 900); do
  if "$python" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/ready', timeout=2)" 2>/dev/null; then
    ready=1
    break
  fi
  kill -0 $up_pid 2>/dev/null || { tail -30 "$out/up.log"; exit 1; }
  sleep 1
done
((ready)) || { echo "the stack did not become ready"; tail -30 "$out/up.log"; exit 1; }
"$python" -m services.cli bench --url "http://127.0.0.1:$port" --workload agentic --concurrency 4 \
  --num-requests 8 --temperature 0 --seed 1 --progress off --output-dir "$out/warmup" >/dev/null
scrape() { "$python" -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:$port/metrics').read().decode())"; }
mkdir -p "$out/service"
scrape >"$out/service/metrics-before.txt"
"$python" -m services.cli bench --url "http://127.0.0.1:$port" "${workload[@]}" --progress off \
  --label "service" --output-dir "$out/service"
scrape >"$out/service/metrics-after.txt"
# the gateway's own view of the same requests (queue, prefill, TTFT), all levels together
"$python" benchmarks/metrics_delta.py "$out/service/metrics-before.txt" "$out/service/metrics-after.txt"
kill -TERM $up_pid
wait $up_pid || true
trap - EXIT

"$python" benchmarks/offline_sessions.py --model "$model" --device "$device" --concurrency "$levels" \
  --num-requests "$requests" --temperature 0 --seed 0 "${engine_options[@]}" --output-dir "$out/offline" \
  2>"$out/offline.log"
"$python" -m services.bench.compare service="$out/service/bench_agentic.json" \
  offline="$out/offline/bench_agentic.json" --out "$out/overhead"
