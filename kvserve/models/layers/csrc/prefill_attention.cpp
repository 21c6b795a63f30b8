// Causal attention of one sequence's prompt rows over its paged KV, on the CPU, in fp32 or bf16.
//
// Why not torch's SDPA (what attention/torch_ref.py does otherwise): a prompt chunk with context
// needs an explicit mask there, because CPU SDPA's `is_causal` aligns the triangle to the top left.
// That mask (queries x keys, 38 MB in bf16 for 1,536 folded rows over 12,500 keys) is read once per
// KV head per layer, keys above the diagonal are computed and then masked, and the paged blocks are
// first gathered and widened into a contiguous copy. Here the causal (and sliding-window) mask is a
// comparison of positions, key blocks no row of a tile can see are skipped, and the keys and values
// are read from the cache's blocks into packed per-block buffers once per call.
//
// The bits of a row do not depend on how the prompt was chunked (nor on prefix-cache hits): its
// keys are taken in blocks of `key_block` aligned to absolute positions, always that many per block
// (the keys past the sequence's end are zero and masked), in the same order, and a masked key adds
// an exact 0 to every sum. (Skipping a block that a row cannot see leaves its sums unchanged too:
// such a block would add 0 and rescale by exp(0) = 1.) A GEMM's rows are independent of each other
// (each output row is its own sequence of FMAs or tile products over K), so a short tile at the end
// of a chunk gives its rows the bits a full one would; tests/models/test_prefill_attention_cpu.py
// checks this bit for bit over odd chunkings.
//
// The GEMMs are torch's batch-reduce GEMM (at::native::cpublas::brgemm, oneDNN's ukernel): AMX
// tiles for bf16 where the CPU has them, else AVX512-BF16 dot products (`vnni`: B operands packed
// as [K/2, N, 2] for both), AVX2/AVX-512 FMA for fp32. The softmax runs here in fp32, on AVX-512
// where the CPU has it, else on AVX2.
//
// Layouts: q [KVH, G, T, D] (the G query heads of a KV head, T prompt rows each), fp32 or bf16;
// cache [2, num_blocks, block_size, KVH, D] in fp16, bf16 or fp32; block_table [n] int64, the
// sequence's blocks from position 0; query row t sits at position context_len + t. Returns
// [KVH, G, T, D] fp32.
#include "cpu_kernels.h"
#include "hreduce.h"
#include "vec_exp.h"

#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

using bf16 = c10::BFloat16;
using half_bits = uint16_t;

// One row of D cache values as fp32.
inline void widen(const half_bits* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = _cvtsh_ss(src[i]);
}
inline void widen(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }
inline void widen(const bf16* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// fp32 -> the GEMM operand type; bf16 rounds to nearest even on the bits (c10::BFloat16's rounding
// for finite values, which is what torch's .to(torch.bfloat16) gives).
inline __m128i bf16x8(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}
inline void narrow_row(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }
inline void narrow_row(const float* src, bf16* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), bf16x8(_mm256_loadu_ps(src + i)));
  for (; i < n; ++i) dst[i] = bf16(src[i]);
}

struct Geometry {
  int64_t kv_heads, group, rows, dim;  // rows: T, the prompt rows of this call
  int64_t block_size, context_len, seq_len, window;
  int64_t cache_plane;  // elements of the cache's K half (V starts there)
  int64_t query_tile, key_block;
  int64_t lowest_key;  // keys below it are outside every row's window
  int64_t first_key_block, num_key_blocks;  // the key blocks packed (those some row can see)
};

// Packs key block b of KV head h: K as the B operand of S = Q K^T ([D, key_block]) and V as the B
// operand of O = P V ([key_block, D]), row-major, or VNNI ([K/2, N, 2]) for bf16 on AMX. Keys
// outside [lowest_key, seq_len) are zeros (never read: a freed or unwritten slot may hold NaN).
template <typename T, typename C>
void pack_block(const C* cache, const int64_t* table, const Geometry& g, int64_t h, int64_t b, bool vnni,
                T* k_out, T* v_out) {
  const int64_t D = g.dim, KB = g.key_block;
  std::vector<float> kr(D), vr(D);
  std::vector<T> kt(D), vt(D);
  for (int64_t j = 0; j < KB; ++j) {
    const int64_t pos = (g.first_key_block + b) * KB + j;
    if (pos < g.lowest_key || pos >= g.seq_len) {
      std::fill(kr.begin(), kr.end(), 0.f);
      std::fill(vr.begin(), vr.end(), 0.f);
    } else {
      const int64_t slot = table[pos / g.block_size] * g.block_size + pos % g.block_size;
      const C* src = cache + (slot * g.kv_heads + h) * D;
      widen(src, kr.data(), D);
      widen(src + g.cache_plane, vr.data(), D);
    }
    narrow_row(kr.data(), kt.data(), D);
    narrow_row(vr.data(), vt.data(), D);
    if (vnni) {  // B[k][n] at ((k / 2) * N + n) * 2 + k % 2
      static_assert(sizeof(uint32_t) == 2 * sizeof(bf16));
      const uint32_t* pairs = reinterpret_cast<const uint32_t*>(kt.data());  // K: k = d, n = j
      uint32_t* kd = reinterpret_cast<uint32_t*>(k_out);
      for (int64_t p = 0; p < D / 2; ++p) kd[p * KB + j] = pairs[p];
      T* vd = v_out + (j / 2) * D * 2 + j % 2;  // V: k = j, n = d
      for (int64_t d = 0; d < D; ++d) vd[d * 2] = vt[d];
    } else {
      for (int64_t d = 0; d < D; ++d) k_out[d * KB + j] = kt[d];
      std::copy(vt.begin(), vt.end(), v_out + j * D);
    }
  }
}

struct RowMask {
  int64_t lo, hi;  // keys [lo, hi) of the block are visible to the row
};
inline RowMask row_mask(int64_t qpos, int64_t key0, int64_t KB, int64_t window) {
  const int64_t hi = std::clamp<int64_t>(qpos - key0 + 1, 0, KB);
  const int64_t lo = window > 0 ? std::clamp<int64_t>(qpos - window + 1 - key0, 0, hi) : 0;
  return {lo, hi};
}

// A row's running softmax state.
struct RowState {
  float m, l;  // maximum of the scaled scores so far; sum of their exponentials (relative to m)
};

// One row of the online softmax: s holds KB raw dot products (masked ones set to -inf by the
// caller); writes p = exp(scale * s - m_new) in the GEMM's operand type (masked keys exactly 0),
// updates the state and returns alpha = exp(m_old - m_new), the factor for the row's output so far.
// Two passes: the maximum over the raw scores (scale > 0, so scale * max(s) is max(scale * s)
// exactly), then exp, sum and the narrowing in one.
template <bool MASKED, typename T>
inline float softmax_row_avx2(const float* s, T* p, int64_t KB, float scale, RowState& st) {
  const __m256 neg_inf = _mm256_set1_ps(NEG_INF);
  __m256 mx8 = neg_inf;
  for (int64_t j = 0; j < KB; j += 8) mx8 = _mm256_max_ps(mx8, _mm256_loadu_ps(s + j));
  const float m_new = std::max(st.m, hmax(mx8) * scale);
  if (m_new == NEG_INF) {  // nothing visible yet: adds nothing, rescales nothing
    std::fill(p, p + KB, T(0.f));
    return 1.f;
  }
  const float alpha = st.m == NEG_INF ? 0.f : exp_neg(st.m - m_new);
  const __m256 sc = _mm256_set1_ps(scale), neg_m = _mm256_set1_ps(-m_new);
  __m256 sum8 = _mm256_setzero_ps();
  for (int64_t j = 0; j < KB; j += 8) {
    const __m256 x = _mm256_loadu_ps(s + j);
    __m256 e = exp_neg(_mm256_fmadd_ps(x, sc, neg_m));
    if (MASKED) e = _mm256_andnot_ps(_mm256_cmp_ps(x, neg_inf, _CMP_EQ_OQ), e);
    sum8 = _mm256_add_ps(sum8, e);
    if constexpr (std::is_same_v<T, float>)
      _mm256_storeu_ps(p + j, e);
    else
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p + j), bf16x8(e));
  }
  st.l = st.l * alpha + hsum(sum8);
  st.m = m_new;
  return alpha;
}

#define KVSERVE_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

// exp_neg of vec_exp.h on 16 lanes: the same operations (but 2^n by VSCALEFPS), the same bits per element.
KVSERVE_AVX512 inline __m512 exp_neg16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 e = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  // e * 2^n in one VSCALEFPS instead of building 2^n's exponent bits and multiplying (4 operations):
  // both are exact while the result is a normal float, which the clamp at -87 keeps it.
  return _mm512_scalef_ps(e, n);
}

KVSERVE_AVX512 inline __m256i bf16x16(__m512 v) {  // bf16x8's rounding on 16 lanes
  const __m512i x = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  return _mm512_cvtepi32_epi16(
      _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16));
}

// The same rounding in one instruction on CPUs with AVX512-BF16 (AMX CPUs have it): VCVTNEPS2BF16
// rounds to nearest even as bf16x16 does, and differs only for denormal inputs (it reads them as 0),
// which exp_neg16 never returns (it stays >= exp(-87) ~ 1.6e-38, a normal float), and NaN, which no
// probability is. Inline assembly, not the intrinsic: the intrinsic needs the avx512bf16 target on
// the whole function, which would let the compiler use the extension in the copy that runs on
// AVX-512 CPUs without it.
KVSERVE_AVX512 inline __m256i bf16x16_ne(__m512 v) {
  __m256i r;
  asm("vcvtneps2bf16 %1, %0" : "=v"(r) : "v"(v));
  return r;
}

// softmax_row_avx2 on 16 lanes (its sum adds 16 partial sums, not 8: other bits in the last place
// than on an AVX2 machine, the same on every run of one machine). NE: bf16 by VCVTNEPS2BF16 (the
// same bits).
template <bool MASKED, bool NE, typename T>
KVSERVE_AVX512 float softmax_row_avx512(const float* s, T* p, int64_t KB, float scale, RowState& st) {
  const __m512 neg_inf = _mm512_set1_ps(NEG_INF);
  __m512 mx16 = neg_inf;
  for (int64_t j = 0; j < KB; j += 16) mx16 = _mm512_max_ps(mx16, _mm512_loadu_ps(s + j));
  const float m_new = std::max(st.m, _mm512_reduce_max_ps(mx16) * scale);
  if (m_new == NEG_INF) {
    std::fill(p, p + KB, T(0.f));
    return 1.f;
  }
  const float alpha = st.m == NEG_INF ? 0.f : _mm512_cvtss_f32(exp_neg16(_mm512_set1_ps(st.m - m_new)));
  const __m512 sc = _mm512_set1_ps(scale), neg_m = _mm512_set1_ps(-m_new);
  __m512 sum16 = _mm512_setzero_ps();
  for (int64_t j = 0; j < KB; j += 16) {
    const __m512 x = _mm512_loadu_ps(s + j);
    __m512 e = exp_neg16(_mm512_fmadd_ps(x, sc, neg_m));
    if (MASKED) e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, neg_inf, _CMP_NEQ_OQ), e);
    sum16 = _mm512_add_ps(sum16, e);
    if constexpr (std::is_same_v<T, float>)
      _mm512_storeu_ps(p + j, e);
    else
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + j), NE ? bf16x16_ne(e) : bf16x16(e));
  }
  st.l = st.l * alpha + _mm512_reduce_add_ps(sum16);
  st.m = m_new;
  return alpha;
}

// The softmax loops this CPU runs (picked once per call).
enum class SoftmaxIsa { avx2, avx512, avx512_bf16 };

inline SoftmaxIsa softmax_isa() {
  if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")))
    return SoftmaxIsa::avx2;
  return __builtin_cpu_supports("avx512bf16") ? SoftmaxIsa::avx512_bf16 : SoftmaxIsa::avx512;
}

template <bool MASKED, typename T>
inline float softmax_row(SoftmaxIsa isa, const float* s, T* p, int64_t KB, float scale, RowState& st) {
  switch (isa) {
    case SoftmaxIsa::avx512_bf16: return softmax_row_avx512<MASKED, true>(s, p, KB, scale, st);
    case SoftmaxIsa::avx512: return softmax_row_avx512<MASKED, false>(s, p, KB, scale, st);
    default: return softmax_row_avx2<MASKED>(s, p, KB, scale, st);
  }
}

// One tile's online softmax over one key block: S holds the tile's raw dot products with the
// block's keys; on return P holds the probabilities and each row's state and output acc are
// updated (acc rescaled; P V is added by the caller). Only blocks on a row's diagonal or window
// edge (`needs_mask`) pay for the mask.
template <typename T>
void softmax_block(float* S, T* P, RowState* st, float* acc, const Geometry& g, int64_t n, float scale,
                   const int64_t* qpos, int64_t key0, bool needs_mask, SoftmaxIsa isa) {
  const int64_t KB = g.key_block, D = g.dim;
  for (int64_t i = 0; i < n; ++i) {
    float* s = S + i * KB;
    T* p = P + i * KB;
    float alpha;
    if (needs_mask) {
      const RowMask mask = row_mask(qpos[i], key0, KB, g.window);
      std::fill(s, s + mask.lo, NEG_INF);
      std::fill(s + mask.hi, s + KB, NEG_INF);
      alpha = softmax_row<true>(isa, s, p, KB, scale, st[i]);
    } else {
      alpha = softmax_row<false>(isa, s, p, KB, scale, st[i]);
    }
    if (alpha != 1.f) {
      float* a = acc + i * D;
      for (int64_t d = 0; d < D; ++d) a[d] *= alpha;
    }
  }
}

template <typename T, typename C>
void run(const T* q, const C* cache, const int64_t* table, const Geometry& g, float scale, bool vnni, float* out) {
  const int64_t D = g.dim, KB = g.key_block, QT = g.query_tile, nkb = g.num_key_blocks, block_elems = KB * D;
  const SoftmaxIsa isa = softmax_isa();
  std::vector<T> keys(g.kv_heads * nkb * block_elems), values(keys.size());
  at::parallel_for(0, g.kv_heads * nkb, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t h = t / nkb, b = t % nkb;
      pack_block(cache, table, g, h, b, vnni, keys.data() + t * block_elems, values.data() + t * block_elems);
    }
  });
  const int64_t tiles = (g.rows + QT - 1) / QT;
  at::parallel_for(0, g.kv_heads * g.group * tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> P(QT * KB);
    std::vector<float> S(QT * KB), acc(QT * D);
    std::vector<RowState> st(QT);
    std::vector<int64_t> qpos(QT);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t hg = t / tiles, tile = t % tiles, h = hg / g.group;
      const int64_t i0 = tile * QT, n = std::min(QT, g.rows - i0);
      const T* A = q + (hg * g.rows + i0) * D;
      for (int64_t i = 0; i < n; ++i) qpos[i] = g.context_len + i0 + i;
      const int64_t qmin = qpos[0], qmax = qpos[n - 1];
      int64_t kb_lo = g.first_key_block;
      if (g.window > 0) kb_lo = std::max(kb_lo, std::max<int64_t>(0, qmin - g.window + 1) / KB);
      const int64_t kb_hi = qmax / KB;
      std::fill(st.begin(), st.end(), RowState{NEG_INF, 0.f});
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t kb = kb_lo; kb <= kb_hi; ++kb) {
        const int64_t key0 = kb * KB, offset = (h * nkb + kb - g.first_key_block) * block_elems;
        at::native::cpublas::brgemm(n, KB, D, D, KB, KB, false, A, keys.data() + offset, S.data(), vnni);
        const bool needs_mask = key0 + KB - 1 > qmin || (g.window > 0 && key0 < qmax - g.window + 1);
        softmax_block(S.data(), P.data(), st.data(), acc.data(), g, n, scale, qpos.data(), key0, needs_mask, isa);
        at::native::cpublas::brgemm(n, D, KB, KB, D, D, true, P.data(), values.data() + offset, acc.data(), vnni);
      }
      float* o = out + (hg * g.rows + i0) * D;
      for (int64_t i = 0; i < n; ++i) {
        const float inv = 1.f / st[i].l;
        for (int64_t d = 0; d < D; ++d) o[i * D + d] = acc[i * D + d] * inv;
      }
    }
    if (vnni) at::native::cpublas::brgemm_release(vnni);
  });
}

}  // namespace

torch::Tensor prefill_attention(const torch::Tensor& q, const torch::Tensor& cache, const torch::Tensor& block_table,
                                int64_t context_len, double scale, int64_t window, bool vnni, int64_t query_tile,
                                int64_t key_block) {
  TORCH_CHECK(q.dim() == 4 && q.is_contiguous(), "q: contiguous [kv_heads, group, rows, dim]");
  TORCH_CHECK(cache.dim() == 5 && cache.size(0) == 2 && cache.is_contiguous(), "cache: [2, blocks, block_size, kvh, d]");
  TORCH_CHECK(cache.size(3) == q.size(0) && cache.size(4) == q.size(3), "cache and q disagree on heads or dim");
  TORCH_CHECK(q.size(3) % 8 == 0, "head dim must be a multiple of 8");
  TORCH_CHECK(key_block > 0 && key_block % 32 == 0 && query_tile > 0, "key_block: a multiple of 32");
  TORCH_CHECK(block_table.dtype() == torch::kInt64 && block_table.is_contiguous(), "block_table: int64");
  TORCH_CHECK(q.scalar_type() == torch::kBFloat16 || !vnni, "the VNNI layout is for bf16");
  Geometry g{};
  g.kv_heads = q.size(0), g.group = q.size(1), g.rows = q.size(2), g.dim = q.size(3);
  g.block_size = cache.size(2), g.context_len = context_len, g.seq_len = context_len + g.rows;
  g.window = window > 0 ? window : 0;
  g.cache_plane = cache.numel() / 2;
  g.query_tile = query_tile, g.key_block = key_block;
  TORCH_CHECK(block_table.numel() * g.block_size >= g.seq_len, "block_table does not cover the sequence");
  g.lowest_key = g.window > 0 ? std::max<int64_t>(0, context_len - g.window + 1) : 0;
  g.first_key_block = g.lowest_key / key_block;
  g.num_key_blocks = (g.seq_len - 1) / key_block - g.first_key_block + 1;
  auto out = torch::empty(q.sizes(), q.options().dtype(torch::kFloat32));
  if (g.rows == 0) return out;
  const float sc = static_cast<float>(scale);
  const int64_t* table = block_table.data_ptr<int64_t>();
  auto with_q = [&](auto* cache_ptr) {
    if (q.scalar_type() == torch::kFloat32)
      run(q.data_ptr<float>(), cache_ptr, table, g, sc, false, out.data_ptr<float>());
    else if (q.scalar_type() == torch::kBFloat16)
      run(reinterpret_cast<const bf16*>(q.data_ptr()), cache_ptr, table, g, sc, vnni, out.data_ptr<float>());
    else
      TORCH_CHECK(false, "q must be float32 or bfloat16");
  };
  switch (cache.scalar_type()) {
    case torch::kFloat16: with_q(reinterpret_cast<const half_bits*>(cache.data_ptr())); break;
    case torch::kFloat32: with_q(cache.data_ptr<float>()); break;
    case torch::kBFloat16: with_q(reinterpret_cast<const bf16*>(cache.data_ptr())); break;
    default: TORCH_CHECK(false, "cache must be float16, bfloat16 or float32");
  }
  return out;
}
