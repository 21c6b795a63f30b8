#include "cpu_kernels.h"

#include <ATen/Parallel.h>

#include <mutex>
#include <set>
#include <thread>

namespace {

// How many OS threads one at::parallel_for of this build runs on: the kernels' parallel_for is
// OpenMP, and a build without -fopenmp runs it serially (tests/models/test_cpu_ext_build.py).
int64_t parallel_width(int64_t tasks) {
  std::mutex lock;
  std::set<std::thread::id> seen;
  at::parallel_for(0, tasks, 1, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> hold(lock);
    seen.insert(std::this_thread::get_id());
  });
  return static_cast<int64_t>(seen.size());
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("lowbit_linear", &lowbit_linear, "low-bit weight-only linear, fp32 activations (AVX2)");
  m.def("lowbit_gemm", &lowbit_gemm, "int4 x int8 GEMM for prefill, fp32 in and out (AVX2)");
  m.def("decode_attention", &decode_attention, "RoPE, KV write and paged attention of one-token decodes (fp32)");
  m.def("prefill_attention", &prefill_attention,
        "causal attention of one sequence's prompt rows over its paged KV (fp32 or bf16; AMX for bf16)");
  m.def("parallel_width", &parallel_width, "threads one at::parallel_for of `tasks` tasks ran on");
  bind_decode_stack(m);
}
