// SDPA test cases of the GPU tests (test_sdpa_gpu.cpp) and of the kernel-model test of the
// SDPA dispatch (test_sdpa_params.cpp), host side: per-side layouts of [B, H, S, D] tensors
// (BHSD, BSHD, padded strides, packed THD with gaps), host storages that start NaN, random
// cases (shapes, head dims, GQA, masks in both alignments, lengths as seq_len or cu_seq_len,
// int32 or int64, zero-length samples) and the samples' lengths of a case.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "error_criteria.h"
#include "test_util.h"

namespace flashspan::test::sdpa_case {

// ---------------------------------------------------------------------------
// Layouts: how one side's [B, H, S, D] tensors lie in memory
// ---------------------------------------------------------------------------

enum class Kind { kBhsd, kBshd, kStrided, kThd };
inline constexpr Kind kAllKinds[] = {Kind::kBhsd, Kind::kBshd, Kind::kStrided, Kind::kThd};

inline const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kBhsd: return "BHSD";
    case Kind::kBshd: return "BSHD";
    case Kind::kStrided: return "BHSD padded strides";
    default: return "THD";
  }
}

struct Layout {
  Kind kind = Kind::kBhsd;
  int64_t B = 0, H = 0, S = 0, D = 0;
  std::vector<int64_t> tok;  // THD: token offset of each sample, [B + 1]
  std::vector<int64_t> strides;
  int64_t storage = 0;  // elements

  int64_t start(int64_t b) const { return kind == Kind::kThd ? tok[size_t(b)] * strides[2] : b * strides[0]; }
  int64_t at(int64_t b, int64_t h, int64_t i, int64_t d) const {
    return start(b) + h * strides[1] + i * strides[2] + d;
  }
  bool ragged() const { return kind == Kind::kThd; }
};

// A side's layout for tensors of head dim D; `tok` (THD) is shared by the side's tensors.
inline Layout make_layout(Kind kind, int64_t B, int64_t H, int64_t S, int64_t D, const std::vector<int64_t>& tok) {
  Layout l;
  l.kind = kind;
  l.B = B;
  l.H = H;
  l.S = S;
  l.D = D;
  switch (kind) {
    case Kind::kBhsd: l.strides = {H * S * D, S * D, D, 1}; l.storage = B * H * S * D; break;
    case Kind::kBshd: l.strides = {S * H * D, D, H * D, 1}; l.storage = B * S * H * D; break;
    case Kind::kStrided: {  // rows of D + 8 (or + 1 for the stats) and 16 spare elements per head
      const int64_t row = D == 1 ? 1 : D + 8, head = S * row + 16;
      l.strides = {H * head + 32, head, row, 1};
      l.storage = B * l.strides[0];
      break;
    }
    case Kind::kThd:
      l.tok = tok;
      l.strides = {0, D, H * D, 1};
      l.storage = (tok.back() + 2) * H * D;  // 2 trailing tokens past the last sample
      break;
  }
  return l;
}

// ---------------------------------------------------------------------------
// Host storage of one tensor in its layout (NaN everywhere until written)
// ---------------------------------------------------------------------------

struct Storage {
  Layout lay;
  DType dtype = DType::kFloat16;
  std::vector<uint8_t> host;

  size_t esize() const { return size_t(dtype_size(dtype)); }
  void alloc_host(const Layout& l, DType t) {
    lay = l;
    dtype = t;
    host.assign(size_t(std::max<int64_t>(l.storage, 1)) * esize(), 0xff);  // NaN in fp16 / bf16 / fp32
  }
  TensorView view() const {
    TensorView v;
    v.data = const_cast<uint8_t*>(host.data());
    v.dtype = dtype;
    v.ndim = 4;
    return v;
  }
  double get(int64_t off) const { return read_elem(view(), off); }
  void set(int64_t off, double x) { write_elem(view(), off, x); }
  // Every storage element of `bytes` (a storage of dtype t) as double (NaN stays NaN).
  static std::vector<double> values(const std::vector<uint8_t>& bytes, DType t) {
    TensorView v;
    v.data = const_cast<uint8_t*>(bytes.data());
    v.dtype = t;
    std::vector<double> out(bytes.size() / size_t(dtype_size(t)));
    for (size_t i = 0; i < out.size(); ++i) out[i] = read_elem(v, int64_t(i));
    return out;
  }
};

// ---------------------------------------------------------------------------
// A case
// ---------------------------------------------------------------------------

struct Case {
  uint64_t seed = 0;
  DType dtype = DType::kBFloat16;
  int64_t B = 1, Hq = 1, Hk = 1, Sq = 1, Skv = 1, Dqk = 64, Dv = 64;
  bool has_left = false, has_right = false, bottom_right = false;
  int64_t left = 0, right = 0;
  Kind kind_q = Kind::kBhsd, kind_kv = Kind::kBhsd;
  int lengths = 0;  // 0: none (full samples), 1: seq_len, 2: cu_seq_len
  bool lengths64 = false;
  bool zero_kv_sample = false;  // one sample with len_kv = 0 (and len_q > 0)
  bool log2_stats = false, max_logit = false, deterministic = false;
  float scale = 0.125f;
  // Score modifiers and the rest of issue 24's second part (test_sdpa_gpu.cpp): softcap (0:
  // none), ALiBi (needs causal), per-head sinks (with dSink in the backward), attn_scale as a
  // host (1, 1, 1, 1) tensor, H_v (0: H_k).
  float softcap = 0.0f;
  bool alibi = false, sinks = false, scale_tensor = false;
  bool sinks_neg_inf = false;  // sinks: the even heads' sink is -inf (it adds nothing: exp(-inf) = 0)
  int64_t Hv = 0;
  // The epilogue options (test_sdpa_gpu.cpp): the output gate O * sigmoid(G) (G in O's layout,
  // dgate in the backward), the score_max / score_sum_exp outputs (padded [B, H_q, S_q, 1]).
  bool gate = false, score_stats = false;
  // block_mask (uint8 bits per 128 x 128 block): 0 none, 1 [B, H_q, ...], 2 broadcast [1, H_q,
  // ...], 3 broadcast [B, 1, ...], 4 [1, 1, ...]; bits random (about 2 in 3 set).
  int block_mask = 0;
  // Additive bias (test_sdpa_gpu.cpp, test_sdpa_params.cpp): 0 none, else 1 + a 4-bit set of the
  // dimensions broadcast (size 1): bit 0 B, bit 1 H_q, bit 2 S_q, bit 3 S_kv (1: [B, H_q, S_q, S_kv],
  // 16: [1, 1, 1, 1]); bias_f32: float32 (else q's dtype); bias_strided: padded row / head strides;
  // dbias: the backward writes dBias (bias's dtype and layout).
  int bias = 0;
  bool bias_f32 = false, bias_strided = false, dbias = false;
  // Philox dropout (test_sdpa_gpu.cpp): probability (0: none, unless dropout_p_zero: Philox with
  // probability 0), seed / offset (int64 tensors when dropout_i64, else int32), rng_dump (float32
  // [B, H_q, S_q, S_kv], forward).
  float dropout_p = 0.0f;
  int64_t dropout_seed = 0, dropout_offset = 0;
  bool dropout_i64 = false, rng_dump = false, dropout_p_zero = false;
  // The caller's dropout mask (test_sdpa_gpu.cpp): 0 none, else 1 + a 4-bit set of the dimensions
  // broadcast (as bias); its dtype (uint8, float16, bfloat16, float32) and padded strides; values 0 / 1
  // (uint8: also 2 on some elements), {0, 0.5, 1, 1.5} (float); dropout_scale: the scale tensor's value
  // (scale_inv = 1 / it in the backward).
  int dropout_mask = 0;
  DType dropout_mask_dtype = DType::kUInt8;
  bool dropout_mask_strided = false;
  float dropout_scale = 1.0f;

  int64_t heads_v() const { return Hv > 0 ? Hv : Hk; }
  bool philox() const { return dropout_p > 0 || dropout_p_zero; }
  // The shape of a tensor broadcast over the dimensions of `form` (Case::bias, Case::dropout_mask).
  std::vector<int64_t> broadcast_shape(int form) const {
    const int bc = form - 1;
    return {bc & 1 ? 1 : B, bc & 2 ? 1 : Hq, bc & 4 ? 1 : Sq, bc & 8 ? 1 : Skv};
  }
  // The bias's shape (Case::bias).
  std::vector<int64_t> bias_shape() const { return broadcast_shape(bias); }

  std::string str() const {
    std::ostringstream os;
    os << "seed " << seed << " " << dtype_name(dtype) << " B" << B << " Hq" << Hq << " Hk" << Hk << " Sq" << Sq
       << " Skv" << Skv << " D(" << Dqk << "," << Dv << ") q " << kind_name(kind_q) << " kv " << kind_name(kind_kv)
       << " lengths " << lengths << (lengths64 ? " int64" : " int32") << " left "
       << (has_left ? std::to_string(left) : "-") << " right " << (has_right ? std::to_string(right) : "-")
       << (bottom_right ? " BOTTOM_RIGHT" : " TOP_LEFT") << (zero_kv_sample ? " zero-kv-sample" : "")
       << (log2_stats ? " log2" : "") << (max_logit ? " max_logit" : "") << (deterministic ? " deterministic" : "")
       << " scale " << scale;
    if (softcap > 0) os << " softcap " << softcap;
    if (alibi) os << " alibi";
    if (sinks) os << (sinks_neg_inf ? " sinks(-inf on even heads)" : " sinks");
    if (scale_tensor) os << " scale-tensor";
    if (Hv > 0) os << " Hv" << Hv;
    if (gate) os << " gate";
    if (score_stats) os << " score-stats";
    if (block_mask) os << " block-mask " << block_mask;
    if (philox()) {
      os << " dropout " << dropout_p << " seed " << dropout_seed << " offset " << dropout_offset
         << (dropout_i64 ? " int64" : " int32") << (rng_dump ? " rng_dump" : "");
    }
    if (dropout_mask) {
      const std::vector<int64_t> ms = broadcast_shape(dropout_mask);
      os << " dropout-mask [" << ms[0] << "," << ms[1] << "," << ms[2] << "," << ms[3] << "] "
         << dtype_name(dropout_mask_dtype) << (dropout_mask_strided ? " strided" : "") << " scale " << dropout_scale;
    }
    if (bias) {
      const std::vector<int64_t> bs = bias_shape();
      os << " bias [" << bs[0] << "," << bs[1] << "," << bs[2] << "," << bs[3] << "]" << (bias_f32 ? " f32" : "")
         << (bias_strided ? " strided" : "") << (dbias ? " dBias" : "");
    }
    return os.str();
  }
};

// The block_mask of a case (Case::block_mask): its shape [1|B, 1|H_q, ceil(S_q / 128),
// ceil(ceil(S_kv / 128) / 8)] (contiguous) and random bytes.
struct BlockMaskBits {
  int64_t shape[4] = {0, 0, 0, 0};
  std::vector<uint8_t> bytes;

  void make(const Case& c, std::mt19937_64& rng) {
    shape[0] = (c.block_mask == 2 || c.block_mask == 4) ? 1 : c.B;
    shape[1] = (c.block_mask == 3 || c.block_mask == 4) ? 1 : c.Hq;
    shape[2] = (c.Sq + 127) / 128;
    shape[3] = ((c.Skv + 127) / 128 + 7) / 8;
    bytes.resize(size_t(std::max<int64_t>(shape[0] * shape[1] * shape[2] * shape[3], 1)));
    for (auto& x : bytes) x = uint8_t((rng() | rng()) & 0xff);
  }
  std::vector<int64_t> strides() const { return {shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1}; }
};

// The layout of a case's bias and dBias (Case::bias): [nb, nh, ni, nj] as a Layout's [B, H, S, D],
// contiguous or with padded row / head strides (last dim contiguous).
inline Layout bias_layout(const Case& c) {
  const std::vector<int64_t> s = c.bias_shape();
  return make_layout(c.bias_strided ? Kind::kStrided : Kind::kBhsd, s[0], s[1], s[2], s[3], {});
}

// The layout of a case's dropout mask (Case::dropout_mask), as bias_layout.
inline Layout dropout_mask_layout(const Case& c) {
  const std::vector<int64_t> s = c.broadcast_shape(c.dropout_mask);
  return make_layout(c.dropout_mask_strided ? Kind::kStrided : Kind::kBhsd, s[0], s[1], s[2], s[3], {});
}

// Values gen() at every element of a [1|B, 1|H_q, 1|S_q, 1|S_kv] tensor t a sample can see (in
// storage order); `unread` where no sample reads it (rows past len_q / keys past len_kv of a sample,
// when those dimensions are not broadcast), so a read there shows.
template <class Gen>
inline void fill_sample_elems(Storage& t, const Case& c, const std::vector<int64_t>& len_q,
                              const std::vector<int64_t>& len_kv, double unread, Gen&& gen) {
  const Layout& l = t.lay;
  for (int64_t b = 0; b < l.B; ++b)
    for (int64_t h = 0; h < l.H; ++h)
      for (int64_t i = 0; i < l.S; ++i)
        for (int64_t j = 0; j < l.D; ++j) {
          // With B broadcast, a row / key is read when some sample has it.
          int64_t lq = 0, lk = 0;
          for (int64_t s = 0; s < c.B; ++s) {
            if (l.B != 1 || c.B == 1 ? s == b : true) {
              lq = std::max(lq, len_q[size_t(s)]);
              lk = std::max(lk, len_kv[size_t(s)]);
            }
          }
          const bool read = (l.S == 1 || i < lq) && (l.D == 1 || j < lk);
          t.set(l.at(b, h, i, j), read ? gen() : unread);
        }
}

// Random bias values (sigma 1.5) at every element a sample can see; NaN where no sample reads it.
inline void fill_bias(Storage& t, const Case& c, const std::vector<int64_t>& len_q, const std::vector<int64_t>& len_kv,
                      std::mt19937_64& rng) {
  std::normal_distribution<double> n(0.0, 1.5);
  fill_sample_elems(t, c, len_q, len_kv, NAN, [&] { return n(rng); });
}

// Random dropout-mask values (Case::dropout_mask): uint8 0 / 1 (2 on about 1 in 16: the kernels
// multiply by the value, not test it), float {0, 0.5, 1, 1.5}, about 1 in 3 zero; where no sample
// reads it NaN (float) or 255 (uint8), so a read there shows.
inline void fill_dropout_mask(Storage& t, const Case& c, const std::vector<int64_t>& len_q,
                              const std::vector<int64_t>& len_kv, std::mt19937_64& rng) {
  const bool u8 = t.dtype == DType::kUInt8;
  fill_sample_elems(t, c, len_q, len_kv, u8 ? 255.0 : NAN, [&] {
    const uint64_t r = rng();
    if (r % 3 == 0) return 0.0;
    if (u8) return (r >> 8) % 16 == 0 ? 2.0 : 1.0;
    return 0.5 * double(1 + (r >> 8) % 3);
  });
}

inline std::vector<int64_t> token_offsets(const std::vector<int64_t>& len, bool gaps, std::mt19937_64& rng) {
  std::vector<int64_t> tok(len.size() + 1, 0);
  for (size_t b = 0; b < len.size(); ++b) tok[b + 1] = tok[b] + len[b] + (gaps ? int64_t(rng() % 4) : 0);
  return tok;
}

// Fills rows i < len[b] of every head of t with random values (rounded to the dtype); the rest
// keeps its NaN.
inline void fill_valid(Storage& t, const std::vector<int64_t>& len, std::mt19937_64& rng, double sigma = 1.0) {
  std::normal_distribution<double> n(0.0, sigma);
  for (int64_t b = 0; b < t.lay.B; ++b)
    for (int64_t h = 0; h < t.lay.H; ++h)
      for (int64_t i = 0; i < len[size_t(b)]; ++i)
        for (int64_t d = 0; d < t.lay.D; ++d) t.set(t.lay.at(b, h, i, d), n(rng));
}

// NaN in every row past the samples' lengths (the rest kept): padded inputs must never be read.
inline void poison_padding(Storage& t, const std::vector<int64_t>& len) {
  for (int64_t b = 0; b < t.lay.B; ++b)
    for (int64_t h = 0; h < t.lay.H; ++h)
      for (int64_t i = len[size_t(b)]; i < (t.lay.ragged() ? len[size_t(b)] : t.lay.S); ++i)
        for (int64_t d = 0; d < t.lay.D; ++d) t.set(t.lay.at(b, h, i, d), NAN);
}

// Prefix sums with a leading 0 (cu_seq_len) of per-sample lengths.
inline std::vector<int64_t> prefix_sums(const std::vector<int64_t>& len) {
  std::vector<int64_t> cu(len.size() + 1, 0);
  for (size_t b = 0; b < len.size(); ++b) cu[b + 1] = cu[b] + len[b];
  return cu;
}

// The samples' lengths of a case: full without padding; else random (one full sample per side,
// sample 1 without keys when zero_kv_sample).
inline void sample_lengths(const Case& c, std::mt19937_64& rng, std::vector<int64_t>& len_q,
                           std::vector<int64_t>& len_kv) {
  const bool pad = c.lengths != 0 || c.kind_q == Kind::kThd || c.kind_kv == Kind::kThd;
  len_q.assign(size_t(c.B), c.Sq);
  len_kv.assign(size_t(c.B), c.Skv);
  if (!pad) return;
  for (int64_t b = 0; b < c.B; ++b) {
    len_q[size_t(b)] = int64_t(rng() % uint64_t(c.Sq + 1));
    len_kv[size_t(b)] = int64_t(rng() % uint64_t(c.Skv + 1));
  }
  len_q[0] = c.Sq;
  len_kv[size_t(c.B - 1)] = c.Skv;
  if (c.zero_kv_sample && c.B > 1) {
    len_kv[1] = 0;
    len_q[1] = std::max<int64_t>(len_q[1], 1);
  }
}

// Head dims the kernels run (tile_sm80.h), weighted towards the common ones.
inline std::pair<int64_t, int64_t> random_dims(std::mt19937_64& rng) {
  static const std::pair<int64_t, int64_t> dims[] = {{64, 64},  {128, 128}, {128, 128}, {64, 64},  {32, 32},
                                                     {96, 96},  {8, 16},    {128, 64},  {40, 120}, {192, 128},
                                                     {256, 256}};
  return dims[rng() % (sizeof(dims) / sizeof(dims[0]))];
}

inline Case random_case(uint64_t seed) {
  std::mt19937_64 rng(seed);
  Case c;
  c.seed = seed;
  c.dtype = rng() % 2 ? DType::kBFloat16 : DType::kFloat16;
  c.B = 1 + int64_t(rng() % 3);
  static const int64_t groups[][2] = {{1, 1}, {2, 2}, {4, 1}, {4, 2}, {6, 3}, {3, 1}};
  const auto* g = groups[rng() % 6];
  c.Hq = g[0];
  c.Hk = g[1];
  c.Sq = 1 + int64_t(rng() % 300);
  c.Skv = 1 + int64_t(rng() % 300);
  std::tie(c.Dqk, c.Dv) = random_dims(rng);
  switch (rng() % 7) {
    case 0: break;                                                    // no mask
    case 1: c.has_right = true; break;                                // causal
    case 2: c.has_right = true; c.bottom_right = true; break;         // causal, bottom-right
    case 3: c.has_left = true; c.left = 1 + int64_t(rng() % 90); c.has_right = true; break;  // causal window
    case 4: c.has_left = true; c.left = 1 + int64_t(rng() % 90); c.has_right = true; c.right = int64_t(rng() % 40);
            c.bottom_right = rng() % 2; break;                        // band
    case 5: c.has_left = true; c.left = 1 + int64_t(rng() % 200); c.bottom_right = rng() % 2; break;  // left only
    default: c.has_right = true; c.right = int64_t(rng() % 70); c.bottom_right = rng() % 2; break;   // right only
  }
  c.kind_q = kAllKinds[rng() % 4];
  c.kind_kv = kAllKinds[rng() % 4];
  c.lengths = int(rng() % 3);
  c.lengths64 = rng() % 2;
  c.zero_kv_sample = rng() % 3 == 0;
  c.log2_stats = rng() % 4 == 0;
  c.max_logit = rng() % 3 == 0;
  c.deterministic = rng() % 2;
  c.scale = fs_test::random_softmax_scale(seed, int(c.Dqk), !c.max_logit);
  return c;
}

// Bottom-right causal (a window of 20 on odd seeds) on the Q side's layout kq and the KV
// side's kkv, padded or packed samples with one of them without keys, GQA 4:2.
inline Case layout_case(uint64_t seed, Kind kq, Kind kkv) {
  Case c;
  c.seed = seed;
  c.B = 3;
  c.Hq = 4;
  c.Hk = 2;
  c.Sq = 70;
  c.Skv = 90;
  c.Dqk = c.Dv = 32;
  c.has_right = true;
  c.has_left = seed % 2;
  c.left = 20;
  c.bottom_right = true;
  c.kind_q = kq;
  c.kind_kv = kkv;
  c.lengths = 1 + int(seed % 2);
  c.lengths64 = seed % 3 == 0;
  c.zero_kv_sample = true;
  c.deterministic = seed % 2;
  return c;
}

}  // namespace flashspan::test::sdpa_case
