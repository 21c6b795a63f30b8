// A decoder stack's one-token decode step in one call: for every layer, the four fused low-bit
// linears (lowbit_linear.cpp) and the paged attention (decode_attention.cpp), in the order and with
// the arguments of DecoderLayer._forward_lowbit, so the output is bit for bit that path's. Gemma 3's
// layers add q/k norms, norms of the attention and MLP outputs, GELU-tanh, and two RoPE tables
// (sliding and global layers): each layer names its table.
//
// Why: a small model's step is ~150 such calls (5 per layer), and each costs tens of microseconds
// in Python (module dispatch, the path checks, argument conversion): several milliseconds a token
// at SmolLM2's ~20 ms. The layers' tensors are handed over once (DecodeStack.add_layer) and stay.
#include "cpu_kernels.h"

#include <vector>

namespace {

using Opt = c10::optional<torch::Tensor>;

struct Linear {
  torch::Tensor qweight, scales;
  Opt bias;
  int64_t bits;
  Opt packed;  // lowbit_x4.h's layout of the same weights, or None

  torch::Tensor operator()(const torch::Tensor& x, const Opt& residual, const Opt& norm, double eps,
                           bool gated, int64_t act = 0, const Opt& out_norm = c10::nullopt,
                           double out_eps = 1e-6) const {
    return lowbit_linear(x, qweight, scales, bits, bias, residual, norm, eps, gated, true, packed, act,
                         out_norm, out_eps);
  }
};

struct Layer {
  Linear qkv, o, gate_up, down;
  torch::Tensor input_norm, post_norm, cache;  // post_norm: the MLP's input norm
  double input_eps, post_eps, scale;
  int64_t window;
  int64_t act;                     // lowbit_linear's gated activation: 0 SiLU, 1 GELU-tanh
  Opt attn_out_norm, mlp_out_norm;  // Gemma: norms of the attention and MLP outputs, else None
  double out_eps;
  Opt q_norm, k_norm;  // Qwen3 / Gemma: per-head q/k norm scales, else None
  double qk_eps;
  int64_t rope;  // index of this layer's (cos, sin) in forward's lists
};

}  // namespace

class DecodeStack {
 public:
  DecodeStack(int64_t num_heads, int64_t num_kv_heads) : num_heads_(num_heads), num_kv_heads_(num_kv_heads) {}

  // linears: (qweight, scales, bias or None, bits, packed or None) of qkv, o, gate_up, down.
  void add_layer(const std::vector<std::tuple<torch::Tensor, torch::Tensor, Opt, int64_t, Opt>>& linears,
                 const torch::Tensor& input_norm, double input_eps, const torch::Tensor& post_norm,
                 double post_eps, const torch::Tensor& cache, double scale, int64_t window, int64_t act,
                 const Opt& attn_out_norm, const Opt& mlp_out_norm, double out_eps, const Opt& q_norm,
                 const Opt& k_norm, double qk_eps, int64_t rope) {
    TORCH_CHECK(linears.size() == 4, "qkv, o, gate_up, down");
    Linear l[4];
    for (int i = 0; i < 4; ++i) {
      const auto& [qweight, scales, bias, bits, packed] = linears[i];
      l[i] = Linear{qweight, scales, bias, bits, packed};
    }
    TORCH_CHECK(rope >= 0, "rope: an index into forward's tables");
    layers_.push_back(Layer{l[0], l[1], l[2], l[3], input_norm, post_norm, cache, input_eps, post_eps, scale,
                            window, act, attn_out_norm, mlp_out_norm, out_eps, q_norm, k_norm, qk_eps, rope});
  }

  // x [B, hidden] (one token per sequence) -> the last layer's output [B, hidden] (before the final norm).
  // cos / sin: the RoPE tables of this step, one per layer type (Layer::rope picks one).
  torch::Tensor forward(torch::Tensor x, const std::vector<torch::Tensor>& cos, const std::vector<torch::Tensor>& sin,
                        const torch::Tensor& slot_mapping, const torch::Tensor& block_tables,
                        const torch::Tensor& seq_lens) const {
    TORCH_CHECK(cos.size() == sin.size(), "one sin per cos");
    x = x.contiguous();
    for (const Layer& l : layers_) {
      TORCH_CHECK(l.rope < static_cast<int64_t>(cos.size()), "a layer's RoPE table is missing");
      const torch::Tensor qkv = l.qkv(x, c10::nullopt, l.input_norm, l.input_eps, false);
      const torch::Tensor attn =
          decode_attention(qkv, cos[l.rope], sin[l.rope], l.cache, slot_mapping, block_tables, seq_lens, num_heads_,
                           num_kv_heads_, l.scale, l.window, l.q_norm, l.k_norm, l.qk_eps);
      const torch::Tensor h = l.o(attn, x, c10::nullopt, 1e-6, false, 0, l.attn_out_norm, l.out_eps);  // x + attn
      const torch::Tensor act = l.gate_up(h, c10::nullopt, l.post_norm, l.post_eps, true, l.act);
      x = l.down(act, h, c10::nullopt, 1e-6, false, 0, l.mlp_out_norm, l.out_eps);  // h + mlp
    }
    return x;
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

 private:
  int64_t num_heads_, num_kv_heads_;
  std::vector<Layer> layers_;
};

void bind_decode_stack(pybind11::module& m) {
  pybind11::class_<DecodeStack>(m, "DecodeStack")
      .def(pybind11::init<int64_t, int64_t>())
      .def("add_layer", &DecodeStack::add_layer)
      .def("forward", &DecodeStack::forward)
      .def_property_readonly("num_layers", &DecodeStack::num_layers);
}
