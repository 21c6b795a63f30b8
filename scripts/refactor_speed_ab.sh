#!/usr/bin/env bash
# A refactor must not change speed: the CPU engine (`bench engine`) and the HTTP server (`bench
# serve` against a server of each tree) for two trees in one run, interleaved, same flags.
#   scripts/refactor_speed_ab.sh BEFORE_TREE AFTER_TREE [OUT_DIR]
# Each tree is a checkout of kvserve (e.g. `git worktree add /tmp/before main`); the python of
# this repo's .venv runs both, with the tree first on sys.path.
set -uo pipefail
BEFORE=$(realpath "$1"); AFTER=$(realpath "$2"); OUT=${3:-/tmp/refactor-ab}; mkdir -p "$OUT"
PY=${PY:-$PWD/.venv/bin/python}  # not realpath: the venv is the symlink itself
ROUNDS=${ROUNDS:-2}
engine() {  # tree label round
  (cd "$1" && OMP_NUM_THREADS=2 "$PY" -m kvserve bench engine --model smollm2 --no-peer --threads 2 \
    --prefill-lens 512,2048 --concurrency 1,16 --decode-tokens 64 --repeats 1 \
    --json "$OUT/engine-$2-$3.json" > "$OUT/engine-$2-$3.log" 2>&1)
}
serve() {  # tree label round
  local port=$((8300 + RANDOM % 500))
  (cd "$1" && OMP_NUM_THREADS=2 exec "$PY" -m kvserve serve --model smollm2 --ctx 4096 --port $port \
    --no-kv-cache --generation-config none > "$OUT/server-$2-$3.log" 2>&1) &
  local pid=$!
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 1; done
  (cd "$AFTER" && "$PY" -m kvserve bench serve --url "http://127.0.0.1:$port" --model smollm2 \
    --dataset random --input-len 256 --output-len 64 --num-prompts 16 --max-concurrency 16 \
    --request-rate inf --seed 0 --no-progress --out "$OUT" --name "serve-$2-$3" > "$OUT/serve-$2-$3.log" 2>&1)
  kill $pid; wait $pid 2>/dev/null
}
for round in $(seq "$ROUNDS"); do
  for pair in "before:$BEFORE" "after:$AFTER"; do
    label=${pair%%:*}; tree=${pair#*:}
    engine "$tree" "$label" "$round"; serve "$tree" "$label" "$round"
  done
done
"$PY" - "$OUT" "$ROUNDS" <<'PY'
import json, sys, pathlib
out, rounds = pathlib.Path(sys.argv[1]), int(sys.argv[2])
for label in ("before", "after"):
    for r in range(1, rounds + 1):
        e = json.loads((out / f"engine-{label}-{r}.json").read_text())
        s = json.loads((out / f"serve-{label}-{r}.json").read_text())
        k = e["kvserve"]
        u = s["summary"]["url"]
        print(f"{label} {r}: engine prefill 512/2048 {k['prefill_tok_s']['512']:.0f}/{k['prefill_tok_s']['2048']:.0f}"
              f" decode x1/x16 {k['decode_tok_s']['1']:.1f}/{k['decode_tok_s']['16']:.1f} tok/s;"
              f" serve {u['output_throughput']:.1f} tok/s, median TTFT {u['median_ttft_ms']:.0f} ms,"
              f" TPOT {u['median_tpot_ms']:.0f} ms, failed {u['failed']}")
PY
