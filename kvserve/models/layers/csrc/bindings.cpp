#include "cpu_kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("lowbit_linear", &lowbit_linear, "low-bit weight-only linear, fp32 activations (AVX2)");
  m.def("lowbit_gemm", &lowbit_gemm, "int4 x int8 GEMM for prefill, fp32 in and out (AVX2)");
  m.def("decode_attention", &decode_attention, "RoPE, KV write and paged attention of one-token decodes (fp32)");
  bind_decode_stack(m);
}
