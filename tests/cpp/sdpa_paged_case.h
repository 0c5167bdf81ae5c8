// Paged K/V cases of SDPA (host side), shared by the GPU tests (test_sdpa_paged_gpu.cpp) and the
// CPU test of the paged address role (test_sdpa_paged.cpp): a random call (prefill or decode,
// GQA / H_k != H_v, both dtypes, masks in both alignments, padding with seq_len or cu_seq_len)
// whose K and V are paged caches with their own page sizes (1 .. 256, below, at and above the
// kernels' 64-key block) and page tables: pages shuffled over the container, unused pages and
// the rows of a sample's last page past its length NaN, table entries past a sample's pages
// garbage (-1, 2^31 - 1 or a random page: never to be read), tables contiguous or packed
// through ragged offsets, containers page-major [pages, H, page, D] or [pages, page, H, D]; or
// one side contiguous (the seed lets K or V alone be paged). The dense K / V of every sample
// are kept to check addresses against. Score features with paged K/V (feature pairs on CUDA
// tensors: sdpa_launch.h sdpa_feature_pairs_enabled): an additive bias in any broadcast form,
// Philox dropout (with rng_dump, float32 or uint8) or the caller's dropout mask in any
// broadcast form and dtype (random_bias_case, random_dropout_case); their values finite on the
// elements inside the samples, NaN (uint8 mask: 255) outside them where broadcast allows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "sdpa_case.h"

namespace flashspan::test::sdpa_paged {

using sdpa_case::Kind;
using sdpa_case::Layout;
using sdpa_case::Storage;

struct PagedCase {
  uint64_t seed = 0;
  DType dtype = DType::kBFloat16;
  int64_t B = 1, Hq = 1, Hk = 1, Hv = 1, Sq = 1, Skv = 1, Dqk = 64, Dv = 64;
  int64_t page_k = 16, page_v = 16;   // page sizes (powers of two); 0: that side is contiguous
  bool packed_k = false, packed_v = false;  // page tables packed through ragged offsets
  bool token_major_k = false, token_major_v = false;  // containers [pages, page, H, D]
  bool set_max_seq = true;            // paged_attention_max_seq_len_kv = Skv (else the tables' capacity)
  bool thd_q = false;                 // Q / O / stats packed THD (with gaps)
  bool gate = false;                  // an output gate of O's layout (packed with Q when thd_q), q's dtype
  bool cu_lengths = false, lengths64 = false;
  bool zero_kv_sample = false;
  bool zero_q_sample = false;  // the last sample without query rows (B > 1; its keys are all S_kv)
  bool has_left = false, has_right = false, bottom_right = false;
  int64_t left = 0, right = 0;
  float scale = 0.125f, softcap = 0.0f;
  bool max_logit = false;
  // Additive bias (as sdpa_case::Case::bias): 0 none, else 1 + a 4-bit set of the dimensions
  // broadcast (size 1): bit 0 B, bit 1 H_q, bit 2 S_q, bit 3 S_kv of [B, H_q, S_q, S_kv], S_kv being
  // the call's (skv()); bias_f32: float32 (else q's dtype); bias_strided: padded row / head strides.
  int bias = 0;
  bool bias_f32 = false, bias_strided = false;
  // Philox dropout: probability (0: none, unless dropout_p_zero: Philox with probability 0), seed /
  // offset ({1} tensors on the call's device, int64 when dropout_i64, else int32); rng_dump: the keep
  // mask [B, H_q, S_q, S_kv] in rng_dump_dtype (float32 or uint8).
  float dropout_p = 0.0f;
  bool dropout_p_zero = false, dropout_i64 = false;
  int64_t dropout_seed = 0, dropout_offset = 0;
  bool rng_dump = false;
  DType rng_dump_dtype = DType::kFloat32;
  // The caller's dropout mask (as sdpa_case::Case::dropout_mask): 0 none, else 1 + a 4-bit set of the
  // dimensions broadcast (as bias); its dtype (uint8, float16, bfloat16, float32) and padded strides;
  // dropout_scale: the value of its scale tensor ({1} float32).
  int dropout_mask = 0;
  DType dropout_mask_dtype = DType::kUInt8;
  bool dropout_mask_strided = false;
  float dropout_scale = 1.0f;

  bool philox() const { return dropout_p > 0 || dropout_p_zero; }
  // S_kv of the call (core/sdpa_problem.cpp): paged_attention_max_seq_len_kv when set, else the
  // dense side's S_kv, else the tables' capacity (the least over both sides of max_pages * page).
  int64_t skv() const {
    if (set_max_seq || page_k == 0 || page_v == 0) return Skv;
    auto cap = [&](int64_t page) { return (Skv + page - 1) / page * page; };
    return std::min(cap(page_k), cap(page_v));
  }
  // sdpa_case's view of the case (B, H_q, S_q, the call's S_kv, the bias and mask forms), for its
  // helpers (bias_layout, dropout_mask_layout, fill_bias, fill_dropout_mask, broadcast_shape).
  sdpa_case::Case as_case() const {
    sdpa_case::Case c;
    c.seed = seed;
    c.dtype = dtype;
    c.B = B;
    c.Hq = Hq;
    c.Hk = Hk;
    c.Hv = Hv;
    c.Sq = Sq;
    c.Skv = skv();
    c.Dqk = Dqk;
    c.Dv = Dv;
    c.bias = bias;
    c.bias_f32 = bias_f32;
    c.bias_strided = bias_strided;
    c.dropout_mask = dropout_mask;
    c.dropout_mask_dtype = dropout_mask_dtype;
    c.dropout_mask_strided = dropout_mask_strided;
    c.dropout_scale = dropout_scale;
    return c;
  }

  std::string str() const {
    std::ostringstream os;
    os << "seed " << seed << " " << dtype_name(dtype) << " B" << B << " Hq" << Hq << " Hk" << Hk << " Hv" << Hv
       << " Sq" << Sq << " Skv" << Skv << " D(" << Dqk << "," << Dv << ") page_k " << page_k << (packed_k ? " packed" : "")
       << (token_major_k ? " token-major" : "") << " page_v " << page_v << (packed_v ? " packed" : "")
       << (token_major_v ? " token-major" : "") << (set_max_seq ? "" : " capacity-S_kv") << (thd_q ? " q THD" : "")
       << (cu_lengths ? " cu_seq_len" : " seq_len") << (lengths64 ? " int64" : " int32")
       << (zero_kv_sample ? " zero-kv-sample" : "") << (zero_q_sample ? " zero-q-sample" : "")
       << " left " << (has_left ? std::to_string(left) : "-") << " right "
       << (has_right ? std::to_string(right) : "-") << (bottom_right ? " BOTTOM_RIGHT" : " TOP_LEFT") << " scale "
       << scale;
    if (softcap > 0) os << " softcap " << softcap;
    if (max_logit) os << " max_logit";
    if (gate) os << " gate";
    if (bias) {
      const std::vector<int64_t> bs = as_case().broadcast_shape(bias);
      os << " bias [" << bs[0] << "," << bs[1] << "," << bs[2] << "," << bs[3] << "]" << (bias_f32 ? " f32" : "")
         << (bias_strided ? " strided" : "");
    }
    if (philox()) {
      os << " dropout " << dropout_p << " seed " << dropout_seed << " offset " << dropout_offset
         << (dropout_i64 ? " int64" : " int32");
      if (rng_dump) os << " rng_dump " << dtype_name(rng_dump_dtype);
    }
    if (dropout_mask) {
      const std::vector<int64_t> ms = as_case().broadcast_shape(dropout_mask);
      os << " dropout-mask [" << ms[0] << "," << ms[1] << "," << ms[2] << "," << ms[3] << "] "
         << dtype_name(dropout_mask_dtype) << (dropout_mask_strided ? " strided" : "") << " scale " << dropout_scale;
    }
    if (!set_max_seq && (bias || dropout_mask || rng_dump)) os << " (S_kv " << skv() << ")";
    return os.str();
  }
};

inline constexpr int64_t kPageSizes[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};

// A random case; decode: S_q = 1 (every sample one query row, or none).
inline PagedCase random_paged_case(uint64_t seed, bool decode) {
  std::mt19937_64 rng(seed);
  PagedCase c;
  c.seed = seed;
  c.dtype = rng() % 2 ? DType::kBFloat16 : DType::kFloat16;
  c.B = 1 + int64_t(rng() % 4);
  static const int64_t heads[][3] = {{1, 1, 1}, {2, 2, 2}, {4, 1, 1}, {8, 2, 2}, {6, 3, 3}, {4, 2, 1}, {8, 4, 8}};
  const auto* h = heads[rng() % 7];
  c.Hq = h[0];
  c.Hk = h[1];
  c.Hv = h[2];
  c.Sq = decode ? 1 : 1 + int64_t(rng() % 200);
  c.Skv = 1 + int64_t(rng() % (decode ? 700 : 400));
  std::tie(c.Dqk, c.Dv) = sdpa_case::random_dims(rng);
  const int which = int(rng() % 8);  // 0: K alone paged, 1: V alone, else both
  c.page_k = which == 1 ? 0 : kPageSizes[rng() % 9];
  c.page_v = which == 0 ? 0 : (rng() % 3 == 0 ? c.page_k : kPageSizes[rng() % 9]);
  if (c.page_v == 0 && which != 0) c.page_v = 16;
  c.packed_k = c.page_k > 0 && rng() % 3 == 0;
  c.packed_v = c.page_v > 0 && rng() % 3 == 0;
  c.token_major_k = rng() % 3 == 0;
  c.token_major_v = rng() % 3 == 0;
  c.set_max_seq = rng() % 4 != 0;
  c.thd_q = !decode && rng() % 4 == 0;
  c.cu_lengths = rng() % 3 == 0;
  c.lengths64 = rng() % 2;
  c.zero_kv_sample = rng() % 3 == 0;
  switch (rng() % 5) {
    case 0: break;                                                        // none
    case 1: c.has_right = true; c.bottom_right = true; break;             // causal, bottom-right (decode's usual)
    case 2: c.has_right = true; break;                                    // causal, top-left
    case 3: c.has_left = true; c.left = 1 + int64_t(rng() % 150); c.has_right = true; c.bottom_right = true; break;
    default: c.has_left = true; c.left = 1 + int64_t(rng() % 150); c.bottom_right = rng() % 2; break;
  }
  if (rng() % 4 == 0) c.softcap = float(5 + rng() % 30);
  c.max_logit = rng() % 4 == 0;
  c.scale = fs_test::random_softmax_scale(seed, int(c.Dqk), !c.max_logit);
  return c;
}

// random_paged_case with an additive bias: form 1 + seed % 16 (every broadcast form over 16
// consecutive seeds), float32 or q's dtype, padded strides on a third.
inline PagedCase random_bias_case(uint64_t seed, bool decode) {
  PagedCase c = random_paged_case(seed, decode);
  std::mt19937_64 rng(seed * 7877 + 11);  // a stream of its own: the rest of the case is random_paged_case's
  c.bias = 1 + int(seed % 16);
  c.bias_f32 = rng() % 2;
  c.bias_strided = rng() % 3 == 0;
  return c;
}

// random_paged_case with dropout: Philox on even seeds (probability 0, 0.1, 0.25, 0.5 or 0.9; seeds of
// both signs, int32 / int64 seed and offset; rng_dump none, float32 or uint8 by (seed / 2) % 3), the
// caller's mask on odd ones (form 1 + (seed / 2) % 16: every broadcast form over 32 consecutive
// seeds; uint8, float16, bfloat16 or float32; padded strides on a third; scale 1 / (1 - p)); an
// additive bias besides on a quarter.
inline PagedCase random_dropout_case(uint64_t seed, bool decode) {
  PagedCase c = random_paged_case(seed, decode);
  std::mt19937_64 rng(seed * 977 + 3);
  static const float kProbs[] = {0.0f, 0.1f, 0.25f, 0.5f, 0.9f};
  const float prob = kProbs[rng() % 5];
  if (seed % 2 == 0) {
    c.dropout_p = prob;
    c.dropout_p_zero = prob == 0.0f;
    c.dropout_seed = int64_t(rng() % 100000) - (rng() % 3 == 0 ? 50000 : 0);
    c.dropout_offset = int64_t(rng() % 1000);
    c.dropout_i64 = rng() % 2;
    const int dump = int((seed / 2) % 3);
    c.rng_dump = dump != 0;
    c.rng_dump_dtype = dump == 2 ? DType::kUInt8 : DType::kFloat32;
  } else {
    static const DType kMaskTypes[] = {DType::kUInt8, DType::kFloat16, DType::kBFloat16, DType::kFloat32};
    c.dropout_mask = 1 + int((seed / 2) % 16);
    c.dropout_mask_dtype = kMaskTypes[rng() % 4];
    c.dropout_mask_strided = rng() % 3 == 0;
    c.dropout_scale = 1.0f / (1.0f - prob);
  }
  if (rng() % 4 == 0) {
    c.bias = 1 + int(rng() % 16);
    c.bias_f32 = rng() % 2;
  }
  return c;
}

// The cases of the sm90 paged forward's GPU tests (on by default: sdpa_sm90_paged_enabled; test_sdpa_paged_gpu.cpp
// Sm90Paged*), which its rule (sdpa_fwd_sm90_paged_refusal) takes and the decode forward does not: random_paged_case
// with pages of 8 keys or more (1 .. 4 become 8 .. 256, kept per side: K and V tables of their own sizes, one side
// contiguous on a quarter), Q / O / stats padded, head dims up to 128, S_q H_q / H_k above 16 (a prefill).
// SdpaPaged.Sm90GpuCasesAreTakenByTheRule (test_sdpa_paged.cpp, no GPU) checks that.
inline PagedCase random_sm90_paged_case(uint64_t seed) {
  PagedCase c = random_paged_case(seed, /*decode=*/false);
  std::mt19937_64 rng(seed * 131 + 7);  // a stream of its own
  for (int64_t* page : {&c.page_k, &c.page_v}) {
    if (*page > 0 && *page < 8) *page = kPageSizes[3 + rng() % 6];
  }
  c.thd_q = false;
  if (c.Dqk > 128 || c.Dv > 128) {
    static const int64_t dims[][2] = {{64, 64}, {128, 128}, {40, 72}, {128, 64}, {8, 128}};
    const auto* d = dims[rng() % 5];
    c.Dqk = d[0];
    c.Dv = d[1];
  }
  if (c.Sq * (c.Hq / c.Hk) <= 16) c.Sq = 17 + int64_t(rng() % 300);
  c.scale = fs_test::random_softmax_scale(seed, int(c.Dqk), !c.max_logit);
  return c;
}

// The cases of the sm90 paged forward's GPU tests of packed (THD) q / o / stats (on by default:
// sdpa_sm90_paged_thd_enabled; test_sdpa_paged_gpu.cpp Sm90PagedThd*): random_sm90_paged_case with q, o and the stats
// packed THD (gaps between samples where the lengths are seq_len), B >= 3 with the last sample without query rows
// and, on two thirds, the first without keys; a packed output gate on half. SdpaPaged.Sm90ThdGpuCasesAreTakenByTheRule
// checks that the rule takes them.
inline PagedCase random_sm90_paged_thd_case(uint64_t seed) {
  PagedCase c = random_sm90_paged_case(seed);
  std::mt19937_64 rng(seed * 337 + 5);  // a stream of its own
  c.thd_q = true;
  if (c.B < 3) c.B = 3 + int64_t(rng() % 2);
  c.zero_q_sample = true;
  c.zero_kv_sample = rng() % 3 != 0;
  c.gate = rng() % 2;
  return c;
}

// The cases of the sm90 paged forward's GPU tests with an additive bias (on by default: sdpa_sm90_paged_bias_enabled;
// test_sdpa_paged_gpu.cpp Sm90PagedBias*; the bias kernel, (128, 128), runs every head dim up to 128):
// random_sm90_paged_case with the bias in form 1 + seed % 16 (every broadcast form over 16 consecutive seeds), float32
// on odd seeds (read element by element), else q's dtype with S_kv a multiple of 8 on two thirds (whole aligned rows:
// staged by TMA, SdpaBiasParams::chunks; padded row / head strides on some), a third of them with q / o / stats
// packed THD (random_sm90_paged_thd_case's samples: one without queries, most one without keys, a gate on half).
// SdpaPaged.Sm90BiasGpuCasesAreTakenByTheRule checks that the rule takes them and that both bias paths are drawn.
inline PagedCase random_sm90_paged_bias_case(uint64_t seed) {
  std::mt19937_64 rng(seed * 4241 + 17);  // a stream of its own
  PagedCase c = rng() % 3 == 0 ? random_sm90_paged_thd_case(seed) : random_sm90_paged_case(seed);
  c.bias = 1 + int(seed % 16);
  c.bias_f32 = seed % 2 == 1;
  if (!c.bias_f32 && rng() % 3 != 0) {
    c.Skv = (c.Skv + 7) / 8 * 8;
    c.set_max_seq = true;  // the call's S_kv (the bias's last dim) is Skv
  }
  c.bias_strided = rng() % 3 == 0;
  return c;
}

// The cases of the sm90 paged forward's bad-entry test (Sm90PagedBadEntryIsNaN): pages of 8, 16, 64, 128 and 256
// keys (several boxes a key block, one, a page of two blocks), K's table entry `bad_page` of sample 1 (the last: its
// keys are all S_kv, make_paged_data) refused, sample 0 intact (its rows are all S_q); B = 2, no mask, so every key
// block of sample 1 is read by its rows (SdpaPaged.Sm90GpuCasesAreTakenByTheRule: it has some).
struct BadEntryCase {
  PagedCase c;
  int64_t bad_page = 0;  // sample 1's page index whose entry is replaced
};
inline std::vector<BadEntryCase> sm90_bad_entry_cases() {
  std::vector<BadEntryCase> out;
  const int64_t pages[] = {8, 16, 64, 128, 256};
  for (int i = 0; i < 5; ++i) {
    BadEntryCase b;
    b.c.seed = 2101 + uint64_t(i);
    b.c.dtype = i % 2 ? DType::kFloat16 : DType::kBFloat16;
    b.c.B = 2;
    b.c.Hq = 4;
    b.c.Hk = b.c.Hv = 2;
    b.c.Sq = 150;
    b.c.Skv = 500;
    b.c.Dqk = b.c.Dv = i % 2 ? 128 : 64;
    b.c.page_k = pages[i];
    b.c.page_v = pages[4 - i];
    b.c.packed_k = i % 2 == 1;
    b.bad_page = std::min<int64_t>(i, (b.c.Skv - 1) / pages[i]);  // a page of sample 1's keys
    out.push_back(b);
  }
  return out;
}

// One side's page table (int32): `entries` as stored; sample b's page g at
// entries[offset[b] + g * stride] (offset[b] = b * max_pages unless packed).
struct PageTable {
  int64_t page_size = 0, max_pages = 0, num_pages = 0;
  bool packed = false;
  std::vector<int32_t> entries;
  std::vector<int64_t> offsets;  // [B + 1] entry offsets (packed), else [B] b * max_pages
  std::vector<std::vector<int64_t>> pages;  // pages[b][g]: the container page of sample b's page g
};

// A paged side: container storage and its table (page_size 0: a dense [B, H, S, D] storage).
struct PagedSide {
  Storage data;
  PageTable table;
  bool paged() const { return table.page_size > 0; }
};

struct PagedData {
  PagedCase c;
  std::vector<int64_t> len_q, len_kv, tok_q;
  Storage q, o, stats;
  PagedSide k, v;
  // The score features (PagedCase::bias, dropout_mask, rng_dump; allocated only when the case has
  // them): bias and mask broadcast over [B, H_q, S_q, S_kv] (sdpa_case::bias_layout /
  // dropout_mask_layout on as_case()), the dump [B, H_q, S_q, S_kv] contiguous, all NaN / 0xff first.
  Storage bias, drop_mask, dump;
  // The output gate (PagedCase::gate): O's layout, values in the samples' rows (NaN elsewhere).
  Storage gate;
  // Dense values of every sample's keys / values: dense_k[((b * H_k + h) * S_kv + s) * D_qk + d].
  std::vector<double> dense_k, dense_v;
};

// The page tables and container of one side, for keys with values dense (B x H x Skv x D).
inline void make_side(PagedSide& side, const PagedCase& c, int64_t page, bool packed, bool token_major, int64_t H,
                      int64_t D, const std::vector<int64_t>& len_kv, const std::vector<double>& dense,
                      std::mt19937_64& rng) {
  if (page == 0) {
    side.data.alloc_host(sdpa_case::make_layout(Kind::kBhsd, c.B, H, c.Skv, D, {}), c.dtype);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t s = 0; s < len_kv[size_t(b)]; ++s)
          for (int64_t d = 0; d < D; ++d) side.data.set(side.data.lay.at(b, h, s, d), dense[size_t(((b * H + h) * c.Skv + s) * D + d)]);
    return;
  }
  PageTable& t = side.table;
  t.page_size = page;
  t.packed = packed;
  t.max_pages = (c.Skv + page - 1) / page;
  int64_t used = 0;
  std::vector<int64_t> need(size_t(c.B));
  for (int64_t b = 0; b < c.B; ++b) used += need[size_t(b)] = (len_kv[size_t(b)] + page - 1) / page;
  t.num_pages = used + int64_t(rng() % 4);  // unused pages stay NaN
  if (t.num_pages == 0) t.num_pages = 1;
  std::vector<int64_t> perm(size_t(t.num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  t.pages.assign(size_t(c.B), {});
  size_t next = 0;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t g = 0; g < need[size_t(b)]; ++g) t.pages[size_t(b)].push_back(perm[next++]);
  // Entries: used ones, then garbage up to max_pages (never read).
  auto garbage = [&]() -> int32_t {
    switch (rng() % 3) {
      case 0: return -1;
      case 1: return 0x7fffffff;
      default: return int32_t(rng() % uint64_t(t.num_pages));
    }
  };
  if (!packed) {
    t.entries.assign(size_t(c.B * t.max_pages), 0);
    for (int64_t b = 0; b < c.B; ++b) {
      t.offsets.push_back(b * t.max_pages);
      for (int64_t g = 0; g < t.max_pages; ++g)
        t.entries[size_t(b * t.max_pages + g)] =
            g < need[size_t(b)] ? int32_t(t.pages[size_t(b)][size_t(g)]) : garbage();
    }
  } else {
    // Packed: each sample's entries after the previous sample's, with 0-2 garbage entries between.
    t.offsets.push_back(0);
    for (int64_t b = 0; b < c.B; ++b) {
      for (int64_t g = 0; g < need[size_t(b)]; ++g) t.entries.push_back(int32_t(t.pages[size_t(b)][size_t(g)]));
      for (int64_t x = int64_t(rng() % 3); x > 0; --x) t.entries.push_back(garbage());
      t.offsets.push_back(int64_t(t.entries.size()));
    }
    // The [B, 1, max_pages, 1] descriptor's extent past the last offset (the C layer sees only it).
    while (int64_t(t.entries.size()) < t.offsets[size_t(c.B - 1)] + t.max_pages) t.entries.push_back(garbage());
  }
  // Container [pages, H, page, D] (page-major) or [pages, page, H, D] (token-major), NaN first.
  side.data.alloc_host(sdpa_case::make_layout(token_major ? Kind::kBshd : Kind::kBhsd, t.num_pages, H, page, D, {}),
                       c.dtype);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t s = 0; s < len_kv[size_t(b)]; ++s) {
      const int64_t pg = t.pages[size_t(b)][size_t(s / page)];
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d)
          side.data.set(side.data.lay.at(pg, h, s % page, d), dense[size_t(((b * H + h) * c.Skv + s) * D + d)]);
    }
}

inline PagedData make_paged_data(const PagedCase& c) {
  PagedData p;
  p.c = c;
  std::mt19937_64 rng(c.seed * 6151 + 3);
  p.len_q.assign(size_t(c.B), c.Sq);
  p.len_kv.assign(size_t(c.B), c.Skv);
  for (int64_t b = 0; b < c.B; ++b) {
    p.len_q[size_t(b)] = c.Sq == 1 ? int64_t(rng() % 8 != 0) : int64_t(rng() % uint64_t(c.Sq + 1));
    p.len_kv[size_t(b)] = int64_t(rng() % uint64_t(c.Skv + 1));
  }
  p.len_q[0] = c.Sq;
  p.len_kv[size_t(c.B - 1)] = c.Skv;
  if (c.zero_kv_sample && c.B > 1) {
    p.len_kv[0] = 0;
    p.len_q[0] = std::max<int64_t>(p.len_q[0], 1);
    p.len_kv[size_t(c.B - 1)] = c.Skv;
  }
  if (c.zero_q_sample && c.B > 1) p.len_q[size_t(c.B - 1)] = 0;
  p.tok_q = sdpa_case::token_offsets(p.len_q, /*gaps=*/!c.cu_lengths, rng);
  const Kind kq = c.thd_q ? Kind::kThd : Kind::kBhsd;
  p.q.alloc_host(sdpa_case::make_layout(kq, c.B, c.Hq, c.Sq, c.Dqk, p.tok_q), c.dtype);
  p.o.alloc_host(sdpa_case::make_layout(kq, c.B, c.Hq, c.Sq, c.Dv, p.tok_q), c.dtype);
  p.stats.alloc_host(sdpa_case::make_layout(kq, c.B, c.Hq, c.Sq, 1, p.tok_q), DType::kFloat32);
  sdpa_case::fill_valid(p.q, p.len_q, rng);
  std::normal_distribution<double> n(0.0, 1.0);
  auto dense = [&](int64_t H, int64_t D, DType t) {
    std::vector<double> x(size_t(c.B * H * c.Skv * D), NAN);
    Storage one;  // rounds to the dtype
    one.alloc_host(sdpa_case::make_layout(Kind::kBhsd, 1, 1, 1, 1, {}), t);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t s = 0; s < p.len_kv[size_t(b)]; ++s)
          for (int64_t d = 0; d < D; ++d) {
            one.set(0, n(rng));
            x[size_t(((b * H + h) * c.Skv + s) * D + d)] = one.get(0);
          }
    return x;
  };
  p.dense_k = dense(c.Hk, c.Dqk, c.dtype);
  p.dense_v = dense(c.Hv, c.Dv, c.dtype);
  make_side(p.k, c, c.page_k, c.packed_k, c.token_major_k, c.Hk, c.Dqk, p.len_kv, p.dense_k, rng);
  make_side(p.v, c, c.page_v, c.packed_v, c.token_major_v, c.Hv, c.Dv, p.len_kv, p.dense_v, rng);
  // The features from a stream of their own (the data of a case without them is unchanged): values
  // where a sample reads them, NaN (uint8 mask: 255) where none does (sdpa_case::fill_sample_elems).
  std::mt19937_64 frng(c.seed * 7411 + 29);
  const sdpa_case::Case fc = c.as_case();
  if (c.bias) {
    p.bias.alloc_host(sdpa_case::bias_layout(fc), c.bias_f32 ? DType::kFloat32 : c.dtype);
    sdpa_case::fill_bias(p.bias, fc, p.len_q, p.len_kv, frng);
  }
  if (c.dropout_mask) {
    p.drop_mask.alloc_host(sdpa_case::dropout_mask_layout(fc), c.dropout_mask_dtype);
    sdpa_case::fill_dropout_mask(p.drop_mask, fc, p.len_q, p.len_kv, frng);
  }
  if (c.philox() && c.rng_dump) {
    p.dump.alloc_host(sdpa_case::make_layout(Kind::kBhsd, c.B, c.Hq, c.Sq, fc.Skv, {}), c.rng_dump_dtype);
  }
  if (c.gate) {
    p.gate.alloc_host(sdpa_case::make_layout(kq, c.B, c.Hq, c.Sq, c.Dv, p.tok_q), c.dtype);
    sdpa_case::fill_valid(p.gate, p.len_q, frng);
  }
  return p;
}

}  // namespace flashspan::test::sdpa_paged
