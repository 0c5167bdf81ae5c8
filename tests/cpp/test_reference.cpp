// Tests of the CPU reference backend (src/reference) and of the fp16/bf16 conversions
// (src/core/half_conv.h).
//
// The reference is compared against a naive dense-mask attention written here
// independently: double precision, a dense boolean mask from endpoint parity
// (DenseMask), every key scored, softmax by definition, backward by the chain rule
// over the dense P matrix. Outputs are poisoned with NaN before every call, so an
// unwritten element fails, and padding of strided outputs must stay NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "reference/reference.h"
#include "test_util.h"

namespace flashspan::test {
namespace {

using reference::FlexBackwardArgs;
using reference::FlexForwardArgs;

constexpr double kInf = std::numeric_limits<double>::infinity();

// ===========================================================================
// fp16 / bf16 conversions
// ===========================================================================

// All finite values of a 16-bit format in increasing order, with their bits.
struct SortedFormat {
  std::vector<std::pair<double, uint16_t>> values;
  double max_finite = 0, half_ulp_at_max = 0;
};

SortedFormat sorted_format(bool bf16) {
  SortedFormat s;
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float f = bf16 ? bf16_bits_to_float(bits) : half_bits_to_float(bits);
    if (!std::isfinite(f) || (f == 0 && (bits & 0x8000))) continue;  // keep +0 only
    s.values.push_back({f, bits});
  }
  std::sort(s.values.begin(), s.values.end());
  s.max_finite = s.values.back().first;
  s.half_ulp_at_max = (s.values.back().first - s.values[s.values.size() - 2].first) / 2;
  return s;
}

// Round-to-nearest-even by search over every representable value (slow, obviously right).
uint16_t slow_round(const SortedFormat& fmt, float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  const uint16_t inf_bits = fmt.max_finite > 1e5 ? 0x7f80 : 0x7c00;
  if (a >= fmt.max_finite + fmt.half_ulp_at_max) {
    // Exactly at the midpoint the max finite value has an odd mantissa in both formats.
    return sign | inf_bits;
  }
  auto it = std::lower_bound(fmt.values.begin(), fmt.values.end(), std::make_pair(a, uint16_t(0)));
  if (it == fmt.values.end()) return sign | fmt.values.back().second;
  if (it->first == a || it == fmt.values.begin()) return sign | it->second;
  auto lo = it - 1;
  const double dlo = a - lo->first, dhi = it->first - a;
  if (dlo < dhi) return sign | lo->second;
  if (dhi < dlo) return sign | it->second;
  return sign | ((lo->second & 1) == 0 ? lo->second : it->second);
}

TEST(HalfConv, Float16RoundTripIsExactForEveryValue) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float f = half_bits_to_float(bits);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(half_bits_to_float(float_to_half_bits(f)))) << std::hex << b;
      continue;
    }
    ASSERT_EQ(float_to_half_bits(f), bits) << "bits 0x" << std::hex << b;
  }
  EXPECT_EQ(half_bits_to_float(0x3c00), 1.0f);
  EXPECT_EQ(half_bits_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(half_bits_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(half_bits_to_float(0xfc00), -std::numeric_limits<float>::infinity());
}

TEST(HalfConv, BFloat16RoundTripIsExactForEveryValue) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float f = bf16_bits_to_float(bits);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(f)))) << std::hex << b;
      continue;
    }
    ASSERT_EQ(float_to_bf16_bits(f), bits) << "bits 0x" << std::hex << b;
  }
}

void check_rounding(bool bf16) {
  const SortedFormat fmt = sorted_format(bf16);
  auto conv = [&](float x) { return bf16 ? float_to_bf16_bits(x) : float_to_half_bits(x); };
  Rng rng(bf16 ? 11 : 7);
  // Every midpoint between neighbours (ties) and its float neighbours, both signs.
  for (size_t i = 0; i + 1 < fmt.values.size(); i += (bf16 ? 7 : 1)) {
    const float mid = static_cast<float>((fmt.values[i].first + fmt.values[i + 1].first) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f), -mid}) {
      ASSERT_EQ(conv(x), slow_round(fmt, x)) << (bf16 ? "bf16 " : "fp16 ") << x;
    }
  }
  // Random floats over the whole exponent range of the format and beyond.
  std::uniform_real_distribution<double> mant(1.0, 2.0);
  std::uniform_int_distribution<int> ex(bf16 ? -140 : -30, bf16 ? 128 : 17);
  for (int i = 0; i < 200000; ++i) {
    const float x = static_cast<float>(std::ldexp(mant(rng), ex(rng)) * (i % 2 ? -1 : 1));
    ASSERT_EQ(conv(x), slow_round(fmt, x)) << (bf16 ? "bf16 " : "fp16 ") << x;
  }
  // Overflow, infinities and NaN.
  const float inf = std::numeric_limits<float>::infinity();
  const uint16_t inf_bits = bf16 ? 0x7f80 : 0x7c00;
  EXPECT_EQ(conv(inf), inf_bits);
  EXPECT_EQ(conv(-inf), inf_bits | 0x8000);
  EXPECT_EQ(conv(std::numeric_limits<float>::max()), inf_bits);
  const float back = bf16 ? bf16_bits_to_float(conv(std::nanf(""))) : half_bits_to_float(conv(std::nanf("")));
  EXPECT_TRUE(std::isnan(back));
}

TEST(HalfConv, Float16RoundsToNearestEven) {
  check_rounding(false);
  EXPECT_EQ(float_to_half_bits(65519.0f), 0x7bff);  // below the midpoint to inf
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7c00);  // the midpoint: ties to even = inf
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -25)), 0x0000);  // half the smallest subnormal: to even 0
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.5f, -24)), 0x0002);  // 1.5 units: to even 2
  EXPECT_EQ(float_to_half_bits(-0.0f), 0x8000);
}

TEST(HalfConv, BFloat16RoundsToNearestEven) {
  check_rounding(true);
  EXPECT_EQ(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // tie, to even
  EXPECT_EQ(float_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie, to even (up)
}

// ===========================================================================
// Naive dense attention (double)
// ===========================================================================

struct NaiveForward {
  std::vector<double> out;        // logical order of out
  std::vector<double> lse;        // logical order of lse
  std::vector<double> max_logit;  // [Hq]
};

struct NaiveBackward {
  std::vector<double> dq, dk, dv;  // logical orders of q, k, v
};

// Flat logical index of the lse element (head, row).
int64_t lse_flat(const FlexGeometry& g, int h, int64_t row) {
  if (g.varlen) return h * g.total_q + row;
  const int64_t b = row / g.max_seqlen_q, s = row % g.max_seqlen_q;
  return (b * g.num_heads_q + h) * g.max_seqlen_q + s;
}

// Scaled scores and softmax probabilities of one (head, row) over its sample's keys;
// returns false when the row sees nothing.
bool naive_row(const FlexGeometry& g, const DenseMask& dm, const std::vector<double>& q, const std::vector<double>& k,
               double scale, int h, int64_t row, std::vector<double>& s, std::vector<double>& p, double& lse) {
  const int b = sample_of_row(g, row), hk = h / g.group_size(), dqk = g.head_dim_qk;
  const int64_t lk = g.seqlen_k(b), k0 = g.cu_seqlens_k[b];
  s.assign(lk, -kInf);
  p.assign(lk, 0.0);
  double m = -kInf;
  for (int64_t j = 0; j < lk; ++j) {
    if (!dm.visible(g.mask_head(h), row, j)) continue;
    double acc = 0;
    for (int d = 0; d < dqk; ++d) acc += q[(row * g.num_heads_q + h) * dqk + d] * k[((k0 + j) * g.num_heads_kv + hk) * dqk + d];
    s[j] = scale * acc;
    m = std::max(m, s[j]);
  }
  if (m == -kInf) return false;
  double sum = 0;
  for (int64_t j = 0; j < lk; ++j) sum += std::exp(s[j] - m);  // exp(-inf) = 0 for hidden keys
  for (int64_t j = 0; j < lk; ++j) p[j] = std::exp(s[j] - m) / sum;
  lse = m + std::log(sum);
  return true;
}

NaiveForward naive_forward(const FlexGeometry& g, const DenseMask& dm, const std::vector<double>& q,
                           const std::vector<double>& k, const std::vector<double>& v, double scale) {
  const int hq = g.num_heads_q, dv = g.head_dim_v;
  NaiveForward r;
  r.out.assign(g.total_q * hq * dv, 0.0);
  r.lse.assign(g.total_q * hq, -kInf);
  r.max_logit.assign(hq, -kInf);
  std::vector<double> s, p;
  for (int h = 0; h < hq; ++h) {
    for (int64_t row = 0; row < g.total_q; ++row) {
      double lse = 0;
      if (!naive_row(g, dm, q, k, scale, h, row, s, p, lse)) continue;
      const int b = sample_of_row(g, row), hk = h / g.group_size();
      const int64_t k0 = g.cu_seqlens_k[b];
      for (size_t j = 0; j < s.size(); ++j) {
        r.max_logit[h] = std::max(r.max_logit[h], s[j]);
        for (int d = 0; d < dv; ++d) r.out[(row * hq + h) * dv + d] += p[j] * v[((k0 + j) * g.num_heads_kv + hk) * dv + d];
      }
      r.lse[lse_flat(g, h, row)] = lse;
    }
  }
  return r;
}

// D_i uses the given `out` (as the reference contract says); P is recomputed exactly.
NaiveBackward naive_backward(const FlexGeometry& g, const DenseMask& dm, const std::vector<double>& q,
                             const std::vector<double>& k, const std::vector<double>& v,
                             const std::vector<double>& out, const std::vector<double>& dout, double scale) {
  const int hq = g.num_heads_q, hkv = g.num_heads_kv, dqk = g.head_dim_qk, dv = g.head_dim_v;
  NaiveBackward r;
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  std::vector<double> s, p;
  for (int h = 0; h < hq; ++h) {
    const int hk = h / g.group_size();
    for (int64_t row = 0; row < g.total_q; ++row) {
      double lse = 0;
      if (!naive_row(g, dm, q, k, scale, h, row, s, p, lse)) continue;
      const int64_t k0 = g.cu_seqlens_k[sample_of_row(g, row)];
      const double* dO = &dout[(row * hq + h) * dv];
      double di = 0;
      for (int d = 0; d < dv; ++d) di += dO[d] * out[(row * hq + h) * dv + d];
      for (size_t j = 0; j < s.size(); ++j) {
        if (p[j] == 0 && s[j] == -kInf) continue;
        const int64_t krow = k0 + j;
        double dp = 0;
        for (int d = 0; d < dv; ++d) dp += dO[d] * v[(krow * hkv + hk) * dv + d];
        const double ds = p[j] * (dp - di);
        for (int d = 0; d < dqk; ++d) {
          r.dq[(row * hq + h) * dqk + d] += scale * ds * k[(krow * hkv + hk) * dqk + d];
          r.dk[(krow * hkv + hk) * dqk + d] += scale * ds * q[(row * hq + h) * dqk + d];
        }
        for (int d = 0; d < dv; ++d) r.dv[(krow * hkv + hk) * dv + d] += p[j] * dO[d];
      }
    }
  }
  return r;
}

// ===========================================================================
// One checked case: forward and backward against the naive model
// ===========================================================================

struct CaseOptions {
  bool accumulate_double = false;
  float scale = 0.0f;            // 0 = default_softmax_scale
  bool use_default_scale = true;
  bool want_max_logit = true;
  bool forward_without_lse = false;  // also run once with lse and max_logit omitted
  DimOrder order;                    // memory order of q/k/v/out/dout/dq/dk/dv
  int64_t pad = 0;
  double q_range = 1.5;
};

// Tolerance on values rounded to the dtype: covers the half-ulp final rounding plus
// float accumulation.
double dtype_tol(DType t) {
  switch (t) {
    case DType::kFloat16: return 1.2e-3;
    case DType::kBFloat16: return 8e-3;
    default: return 2e-5;
  }
}

struct CaseResult {
  std::vector<double> out, lse, max_logit, dq, dk, dv;
};

CaseResult check_case(const FlexGeometry& g, const std::vector<int32_t>& mask, const CaseOptions& opt, Rng& rng,
                      const std::string& label) {
  SCOPED_TRACE(label);
  CaseResult res;
  const float scale = opt.use_default_scale ? default_softmax_scale(g.head_dim_qk) : opt.scale;
  HostTensor q = make_q(g, opt.order, opt.pad), k = make_k(g, opt.order, opt.pad), v = make_v(g, opt.order, opt.pad);
  q.fill_uniform(rng, -opt.q_range, opt.q_range);
  k.fill_uniform(rng, -1, 1);
  v.fill_uniform(rng, -1, 1);
  HostTensor out = make_out(g, opt.order, opt.pad), lse = make_lse(g, opt.pad);
  HostTensor max_logit(DType::kFloat32, {g.num_heads_q});

  const DenseMask dm(mask.data(), g);
  for (int hm = 0; hm < g.num_heads_mask; ++hm) {
    EXPECT_EQ(reference::count_visible_pairs(g, mask.data(), hm), dm.count(hm)) << "mask head " << hm;
  }
  const std::vector<double> qd = q.to_vector(), kd = k.to_vector(), vd = v.to_vector();
  const NaiveForward nf = naive_forward(g, dm, qd, kd, vd, scale);
  const double tol = dtype_tol(g.dtype);

  FlexForwardArgs fa;
  fa.geometry = &g;
  fa.mask = mask.data();
  fa.q = q.view();
  fa.k = k.view();
  fa.v = v.view();
  fa.out = out.view();
  fa.softmax_scale = scale;
  fa.accumulate_double = opt.accumulate_double;
  if (opt.forward_without_lse) {
    out.poison();
    reference::flex_forward(fa);
    EXPECT_TRUE(all_close(out.to_vector(), nf.out, tol, tol)) << "out (no lse)";
  }
  out.poison();
  lse.poison();
  max_logit.poison();
  fa.lse = lse.view();
  if (opt.want_max_logit) fa.max_logit = max_logit.view();
  reference::flex_forward(fa);

  res.out = out.to_vector();
  res.lse = lse.to_vector();
  EXPECT_TRUE(all_close(res.out, nf.out, tol, tol)) << "out";
  EXPECT_TRUE(all_close(res.lse, nf.lse, 1e-5, 1e-4)) << "lse";
  if (opt.want_max_logit) {
    res.max_logit = max_logit.to_vector();
    EXPECT_TRUE(all_close(res.max_logit, nf.max_logit, 1e-5, 1e-5)) << "max_logit";
  } else {
    EXPECT_TRUE(std::isnan(max_logit.flat(0))) << "max_logit written although not requested";
  }
  EXPECT_EQ(out.padding_changed(), 0) << "out: writes outside the view";
  EXPECT_EQ(lse.padding_changed(), 0) << "lse: writes outside the view";

  // Backward with the forward's own out and lse.
  HostTensor dout = make_out(g, opt.order, opt.pad);
  dout.fill_uniform(rng, -1, 1);
  HostTensor dq = make_q(g, opt.order, opt.pad), dk = make_k(g, opt.order, opt.pad), dv = make_v(g, opt.order, opt.pad);
  dq.poison();
  dk.poison();
  dv.poison();
  FlexBackwardArgs ba;
  ba.geometry = &g;
  ba.mask = mask.data();
  ba.q = q.view();
  ba.k = k.view();
  ba.v = v.view();
  ba.out = out.view();
  ba.dout = dout.view();
  ba.lse = lse.view();
  ba.dq = dq.view();
  ba.dk = dk.view();
  ba.dv = dv.view();
  ba.softmax_scale = scale;
  ba.accumulate_double = opt.accumulate_double;
  reference::flex_backward(ba);

  const NaiveBackward nb = naive_backward(g, dm, qd, kd, vd, res.out, dout.to_vector(), scale);
  res.dq = dq.to_vector();
  res.dk = dk.to_vector();
  res.dv = dv.to_vector();
  // Gradients: relative to each element and to the tensor's scale (sums of terms of
  // both signs lose relative precision in float).
  const double gtol = g.dtype == DType::kFloat32 ? 1e-4 : tol;
  EXPECT_TRUE(all_close(res.dq, nb.dq, gtol, gtol * std::max(1e-3, max_abs(nb.dq)))) << "dq";
  EXPECT_TRUE(all_close(res.dk, nb.dk, gtol, gtol * std::max(1e-3, max_abs(nb.dk)))) << "dk";
  EXPECT_TRUE(all_close(res.dv, nb.dv, gtol, gtol * std::max(1e-3, max_abs(nb.dv)))) << "dv";
  EXPECT_EQ(dq.padding_changed(), 0) << "dq: writes outside the view";
  EXPECT_EQ(dk.padding_changed(), 0) << "dk: writes outside the view";
  EXPECT_EQ(dv.padding_changed(), 0) << "dv: writes outside the view";
  return res;
}

std::string describe(const FlexGeometry& g, const CaseOptions& o) {
  std::ostringstream os;
  os << (g.varlen ? "THD" : "BSHD") << " B=" << g.batch << " cu_q=[";
  for (auto x : g.cu_seqlens_q) os << x << " ";
  os << "] cu_k=[";
  for (auto x : g.cu_seqlens_k) os << x << " ";
  os << "] Hq=" << g.num_heads_q << " Hkv=" << g.num_heads_kv << " Hmask=" << g.num_heads_mask
     << " nfunc=" << g.nfunc << " D=(" << g.head_dim_qk << "," << g.head_dim_v << ") " << dtype_name(g.dtype)
     << (o.accumulate_double ? " double-acc" : "") << " order=" << (o.order.empty() ? "rowmajor" : "heads-outer")
     << " pad=" << o.pad << " scale=" << (o.use_default_scale ? -1.0f : o.scale);
  return os.str();
}

// ===========================================================================
// Random cases
// ===========================================================================

TEST(Reference, RandomCasesMatchNaiveDenseAttention) {
  constexpr int kCases = 240;
  const int dims[] = {8, 16, 24, 32, 40, 64};
  const DType dtypes[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32};
  const int nfuncs[] = {1, 3, 5, 7};
  int n_thd = 0, n_gqa = 0, n_mqa = 0, n_per_head_mask = 0, n_zero_len = 0;
  for (int c = 0; c < kCases; ++c) {
    Rng rng(1000 + c);
    auto pick = [&](int n) { return static_cast<int>(std::uniform_int_distribution<int>(0, n - 1)(rng)); };
    HeadConfig h;
    h.dtype = dtypes[pick(3)];
    h.hkv = 1 + pick(2);
    h.hq = h.hkv * (1 + pick(3));
    if (pick(6) == 0) h.hkv = 1, h.hq = 1 + pick(4);  // MQA
    h.hmask = pick(2) ? 1 : h.hq;
    h.nfunc = nfuncs[pick(4)];
    h.dqk = dims[pick(6)];
    h.dv = pick(3) ? h.dqk : dims[pick(6)];
    const bool varlen = pick(2) == 1;
    // Mostly short sequences; one case in eight crosses the reference's row and key
    // blocks (32 and 64).
    const int max_len = pick(8) == 0 ? 100 : 24;
    FlexGeometry g;
    if (varlen) {
      const int batch = 1 + pick(4);
      std::vector<int64_t> lq(batch), lk(batch);
      for (int b = 0; b < batch; ++b) {
        lq[b] = pick(5) == 0 ? 0 : 1 + pick(max_len);
        lk[b] = pick(6) == 0 ? 0 : 1 + pick(max_len);
      }
      int64_t mq = *std::max_element(lq.begin(), lq.end()) + pick(3);
      int64_t mk = *std::max_element(lk.begin(), lk.end()) + pick(3);
      g = make_thd_geometry(lq, lk, h, std::max<int64_t>(mq, 1), std::max<int64_t>(mk, 1));
      ++n_thd;
      for (int b = 0; b < batch; ++b) n_zero_len += (lq[b] == 0 || lk[b] == 0);
    } else {
      g = make_bshd_geometry(1 + pick(3), 1 + pick(max_len), pick(12) == 0 ? 0 : 1 + pick(max_len), h);
    }
    n_gqa += h.hq > h.hkv && h.hkv > 1;
    n_mqa += h.hkv == 1 && h.hq > 1;
    n_per_head_mask += h.hmask > 1;

    CaseOptions opt;
    opt.accumulate_double = pick(4) == 0;
    const int layout = pick(3);
    if (layout == 1) opt.order = heads_outer_order(varlen ? 3 : 4);
    if (layout == 2) opt.pad = 1 + pick(5);
    const int sc = pick(6);
    if (sc == 0) opt.use_default_scale = false, opt.scale = 0.0f;
    if (sc == 1) opt.use_default_scale = false, opt.scale = 0.8f;
    if (sc == 2) opt.use_default_scale = false, opt.scale = -0.5f, opt.want_max_logit = false;
    opt.forward_without_lse = pick(8) == 0;
    MaskOptions mo;
    if (pick(4) == 0) mo.granularity = 4;
    const std::vector<int32_t> mask = random_interval_mask(rng, g, mo);
    check_case(g, mask, opt, rng, "case " + std::to_string(c) + ": " + describe(g, opt));
    if (HasFailure()) break;  // one failing case explains itself; don't flood the log
  }
  // The generator must actually cover the configurations this test claims.
  EXPECT_GT(n_thd, kCases / 4);
  EXPECT_GT(n_gqa, 10);
  EXPECT_GT(n_mqa, 10);
  EXPECT_GT(n_per_head_mask, kCases / 4);
  EXPECT_GT(n_zero_len, 10);
}

// ===========================================================================
// Edge cases
// ===========================================================================

// Endpoint vector [Hmask=1, nfunc, rows] from per-row endpoint lists.
std::vector<int32_t> mask_from_rows(const std::vector<std::vector<int32_t>>& rows) {
  const size_t nf = rows.empty() ? 1 : rows[0].size(), t = rows.size();
  std::vector<int32_t> m(nf * t);
  for (size_t r = 0; r < t; ++r) {
    for (size_t f = 0; f < nf; ++f) m[f * t + r] = rows[r][f];
  }
  return m;
}

TEST(Reference, EmptyRowsGiveZeroOutputNegInfLseAndZeroGradients) {
  HeadConfig h;
  h.hq = 2;
  h.hkv = 1;
  h.nfunc = 3;
  h.dtype = DType::kBFloat16;
  const FlexGeometry g = make_bshd_geometry(1, 6, 7, h);
  // Rows 0, 2 and 5 see nothing (F0 = 0 and [F1, F2) empty); key 6 is never visible.
  const std::vector<int32_t> mask =
      mask_from_rows({{0, 3, 3}, {2, 4, 6}, {0, 0, 0}, {6, 6, 6}, {1, 2, 5}, {0, 6, 6}});
  Rng rng(5);
  const CaseResult r = check_case(g, mask, CaseOptions{}, rng, "empty rows");
  for (int64_t row : {0, 2, 5}) {
    for (int hh = 0; hh < 2; ++hh) {
      EXPECT_EQ(r.lse[hh * 6 + row], -kInf) << "row " << row;
      for (int d = 0; d < h.dv; ++d) {
        EXPECT_EQ(r.out[(row * 2 + hh) * h.dv + d], 0.0) << "row " << row;
        EXPECT_EQ(r.dq[(row * 2 + hh) * h.dqk + d], 0.0) << "row " << row;
      }
    }
  }
  for (int d = 0; d < h.dqk; ++d) {
    EXPECT_EQ(r.dk[6 * h.dqk + d], 0.0);
    EXPECT_EQ(r.dv[6 * h.dv + d], 0.0);
  }
}

TEST(Reference, HeadWithoutVisiblePairsHasMaxLogitNegInf) {
  HeadConfig h;
  h.hq = 2;
  h.hkv = 2;
  h.hmask = 2;
  h.dtype = DType::kFloat32;
  const FlexGeometry g = make_thd_geometry({3, 2}, {4, 0}, h);
  // Head 0 sees key 0 of sample 0 in its first row; head 1 sees nothing.
  std::vector<int32_t> mask = {1, 0, 0, 0, 0, /* head 1 */ 0, 0, 0, 0, 0};
  Rng rng(6);
  const CaseResult r = check_case(g, mask, CaseOptions{}, rng, "head without pairs");
  EXPECT_TRUE(std::isfinite(r.max_logit[0]));
  EXPECT_EQ(r.max_logit[1], -kInf);
}

TEST(Reference, ZeroScaleGivesZeroMaxLogitAndUniformAttention) {
  HeadConfig h;
  h.dtype = DType::kFloat32;
  const FlexGeometry g = make_bshd_geometry(1, 3, 5, h);
  Rng rng(7);
  CaseOptions opt;
  opt.use_default_scale = false;
  opt.scale = 0.0f;
  const CaseResult r = check_case(g, mask_from_rows({{5}, {2}, {0}}), opt, rng, "zero scale");
  EXPECT_EQ(r.max_logit[0], 0.0);
  EXPECT_NEAR(r.lse[1], std::log(2.0), 1e-6);
}

TEST(Reference, QueryAndKeyLengthsDiffer) {
  Rng rng(8);
  for (auto [sq, sk] : {std::pair<int64_t, int64_t>{5, 37}, {37, 5}, {1, 64}, {64, 1}}) {
    HeadConfig h;
    h.hq = 4;
    h.hkv = 2;
    h.hmask = 4;
    h.nfunc = 3;
    h.dtype = DType::kFloat16;
    const FlexGeometry g = make_bshd_geometry(2, sq, sk, h);
    check_case(g, random_interval_mask(rng, g), CaseOptions{}, rng, "Sq=" + std::to_string(sq) + " Sk=" + std::to_string(sk));
  }
}

// The reference walks keys in blocks of 64 and rows in blocks of 32: lengths that end in a
// partial block (65, 130, 191 keys; 33, 97 rows), with every key visible and with only the
// last keys visible, so a dropped or truncated tail block changes every row.
TEST(Reference, PartialTailBlocksOfKeysAndRows) {
  Rng rng(12);
  for (auto [sq, sk] : {std::pair<int64_t, int64_t>{33, 65}, {97, 130}, {70, 191}}) {
    for (int kind = 0; kind < 3; ++kind) {
      HeadConfig h;
      h.hq = 2;
      h.hkv = 1;
      h.nfunc = 3;
      h.dtype = kind == 2 ? DType::kBFloat16 : DType::kFloat32;
      const FlexGeometry g = kind == 1 ? make_thd_geometry({sq, 5}, {sk, sk - 64}, h) : make_bshd_geometry(2, sq, sk, h);
      std::vector<int32_t> mask(size_t(3) * g.total_q);
      for (int64_t row = 0; row < g.total_q; ++row) {
        const int64_t lk = g.seqlen_k(sample_of_row(g, row));
        // kind 0: all keys; kind 1: only the last 3 keys; kind 2: key 0 plus the last 2 keys.
        const int32_t e[3][3] = {{int32_t(lk), int32_t(lk), int32_t(lk)},
                                 {0, int32_t(std::max<int64_t>(0, lk - 3)), int32_t(lk)},
                                 {int32_t(std::min<int64_t>(1, lk)), int32_t(std::max<int64_t>(1, lk - 2)), int32_t(lk)}};
        for (int f = 0; f < 3; ++f) mask[size_t(f) * g.total_q + row] = e[kind][f];
      }
      CaseOptions opt;
      opt.use_default_scale = false;
      opt.scale = 0.7f;
      check_case(g, mask, opt, rng, "Sq=" + std::to_string(sq) + " Sk=" + std::to_string(sk) + " kind " +
                                        std::to_string(kind));
    }
  }
}

TEST(Reference, NfuncOneThreeNineteen) {
  Rng rng(9);
  for (int nf : {1, 3, 19}) {
    HeadConfig h;
    h.hq = 2;
    h.hkv = 1;
    h.nfunc = nf;
    h.dtype = DType::kFloat32;
    const FlexGeometry g = make_thd_geometry({9, 17}, {30, 12}, h);
    MaskOptions mo;
    mo.p_empty_row = mo.p_full_row = mo.p_causal_row = 0.05;
    check_case(g, random_interval_mask(rng, g, mo), CaseOptions{}, rng, "nfunc=" + std::to_string(nf));
  }
}

TEST(Reference, ThdWithZeroLengthSamples) {
  Rng rng(10);
  HeadConfig h;
  h.hq = 3;
  h.hkv = 1;
  h.hmask = 3;
  h.nfunc = 3;
  h.dtype = DType::kBFloat16;
  // Empty q sample, empty k sample (all its rows empty), both empty, and normal ones.
  const FlexGeometry g = make_thd_geometry({4, 0, 6, 0, 5}, {0, 7, 9, 0, 3}, h);
  const CaseResult r = check_case(g, random_interval_mask(rng, g), CaseOptions{}, rng, "zero-length samples");
  for (int hh = 0; hh < 3; ++hh) {
    for (int64_t row = 0; row < 4; ++row) EXPECT_EQ(r.lse[hh * g.total_q + row], -kInf);  // sample 0 has no keys
  }
}

TEST(Reference, HeadDims8And256And192x128) {
  Rng rng(11);
  for (auto [dqk, dv] : {std::pair<int, int>{8, 8}, {256, 256}, {192, 128}, {8, 256}}) {
    HeadConfig h;
    h.hq = 2;
    h.hkv = 1;
    h.nfunc = 3;
    h.dqk = dqk;
    h.dv = dv;
    h.dtype = DType::kFloat16;
    const FlexGeometry g = make_bshd_geometry(1, 11, 13, h);
    CaseOptions opt;
    opt.pad = 3;
    check_case(g, random_interval_mask(rng, g), opt, rng, "D=" + std::to_string(dqk) + "x" + std::to_string(dv));
  }
}

TEST(Reference, ManyTasksAcrossThreadsMatchNaive) {
  // More rows and keys than one task block in every direction, GQA, per-head masks.
  Rng rng(12);
  HeadConfig h;
  h.hq = 4;
  h.hkv = 2;
  h.hmask = 4;
  h.nfunc = 5;
  h.dqk = 32;
  h.dv = 32;
  h.dtype = DType::kBFloat16;
  const FlexGeometry g = make_thd_geometry({100, 70}, {150, 90}, h);
  CaseOptions opt;
  opt.order = heads_outer_order(3);
  check_case(g, random_interval_mask(rng, g), opt, rng, "many tasks");
}

TEST(Reference, ResultsAreBitwiseReproducible) {
  HeadConfig h;
  h.hq = 4;
  h.hkv = 1;
  h.nfunc = 3;
  h.dqk = h.dv = 32;
  h.dtype = DType::kFloat16;
  const FlexGeometry g = make_bshd_geometry(2, 70, 90, h);
  Rng mrng(13);
  const std::vector<int32_t> mask = random_interval_mask(mrng, g);
  Rng r1(14), r2(14);
  const CaseResult a = check_case(g, mask, CaseOptions{}, r1, "run 1");
  const CaseResult b = check_case(g, mask, CaseOptions{}, r2, "run 2");
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.dq, b.dq);
  EXPECT_EQ(a.dk, b.dk);
  EXPECT_EQ(a.dv, b.dv);
}

// ===========================================================================
// Backward against central finite differences (double accumulation, fp32 inputs)
// ===========================================================================

// with_lse_grad: the loss also has sum(lse * u) over the finite LSE entries, and the
// backward gets dlse = u (the LSE gradient input).
void finite_difference_check(const FlexGeometry& g, uint64_t seed, bool with_lse_grad = false) {
  Rng rng(seed);
  const std::vector<int32_t> mask = random_interval_mask(rng, g);
  const float scale = default_softmax_scale(g.head_dim_qk);
  HostTensor q = make_q(g), k = make_k(g), v = make_v(g), out = make_out(g), lse = make_lse(g);
  q.fill_uniform(rng, -1.5, 1.5);
  k.fill_uniform(rng, -1, 1);
  v.fill_uniform(rng, -1, 1);
  HostTensor w = make_out(g);  // loss = sum(out * w)  =>  dL/dout = w
  w.fill_uniform(rng, -1, 1);
  const std::vector<double> wd = w.to_vector();
  HostTensor u = make_lse(g);  // loss += sum(lse * u)  =>  dL/dlse = u
  u.fill_uniform(rng, -1, 1);
  const std::vector<double> ud = u.to_vector();

  FlexForwardArgs fa;
  fa.geometry = &g;
  fa.mask = mask.data();
  fa.q = q.view();
  fa.k = k.view();
  fa.v = v.view();
  fa.out = out.view();
  fa.lse = lse.view();
  fa.softmax_scale = scale;
  fa.accumulate_double = true;
  auto loss = [&]() {
    reference::flex_forward(fa);
    double l = 0;
    for (int64_t i = 0; i < out.numel(); ++i) l += out.flat(i) * wd[i];
    if (with_lse_grad) {
      for (int64_t i = 0; i < lse.numel(); ++i) {
        if (std::isfinite(lse.flat(i))) l += lse.flat(i) * ud[i];
      }
    }
    return l;
  };
  loss();
  HostTensor dq = make_q(g), dk = make_k(g), dv = make_v(g);
  dq.poison();
  dk.poison();
  dv.poison();
  FlexBackwardArgs ba;
  ba.geometry = &g;
  ba.mask = mask.data();
  ba.q = q.view();
  ba.k = k.view();
  ba.v = v.view();
  ba.out = out.view();
  ba.dout = w.view();
  ba.lse = lse.view();
  if (with_lse_grad) ba.dlse = u.view();
  ba.dq = dq.view();
  ba.dk = dk.view();
  ba.dv = dv.view();
  ba.softmax_scale = scale;
  ba.accumulate_double = true;
  reference::flex_backward(ba);

  for (auto [x, grad, name] : {std::tuple<HostTensor*, HostTensor*, const char*>{&q, &dq, "dq"}, {&k, &dk, "dk"},
                               {&v, &dv, "dv"}}) {
    std::vector<double> numeric(x->numel());
    for (int64_t i = 0; i < x->numel(); ++i) {
      const double x0 = x->flat(i), eps = 1e-2;
      x->set_flat(i, x0 + eps);
      const double hi = x->flat(i), lp = loss();
      x->set_flat(i, x0 - eps);
      const double lo = x->flat(i), lm = loss();
      x->set_flat(i, x0);
      numeric[i] = (lp - lm) / (hi - lo);
    }
    EXPECT_TRUE(all_close(grad->to_vector(), numeric, 2e-3, 2e-4)) << name << " vs finite differences";
  }
}

TEST(Reference, BackwardMatchesFiniteDifferencesBshd) {
  HeadConfig h;
  h.hq = 2;
  h.hkv = 1;
  h.hmask = 2;
  h.nfunc = 3;
  h.dqk = 8;
  h.dv = 16;
  h.dtype = DType::kFloat32;
  finite_difference_check(make_bshd_geometry(2, 3, 4, h), 21);
}

TEST(Reference, BackwardMatchesFiniteDifferencesThd) {
  HeadConfig h;
  h.hq = 3;
  h.hkv = 3;
  h.nfunc = 1;
  h.dqk = 16;
  h.dv = 8;
  h.dtype = DType::kFloat32;
  finite_difference_check(make_thd_geometry({2, 0, 3}, {3, 2, 5}, h), 22);
}

TEST(Reference, LseGradientMatchesFiniteDifferences) {
  HeadConfig h;
  h.hq = 4;
  h.hkv = 2;
  h.hmask = 4;
  h.nfunc = 3;
  h.dqk = 8;
  h.dv = 8;
  h.dtype = DType::kFloat32;
  finite_difference_check(make_bshd_geometry(2, 5, 4, h), 23, /*with_lse_grad=*/true);
  h.hmask = 1;
  finite_difference_check(make_thd_geometry({3, 0, 4}, {2, 3, 5}, h), 24, /*with_lse_grad=*/true);
}

// ===========================================================================
// Argument errors of the reference entry points
// ===========================================================================

TEST(Reference, RejectsBadArguments) {
  HeadConfig h;
  h.hq = 2;
  h.hkv = 1;
  h.dtype = DType::kFloat16;
  const FlexGeometry g = make_bshd_geometry(1, 4, 4, h);
  FlexGeometry gcuda = g;
  gcuda.device = DeviceType::kCUDA;
  HostTensor q = make_q(g), k = make_k(g), v = make_v(g), out = make_out(g), lse = make_lse(g);
  HostTensor max_logit(DType::kFloat32, {2}), ml_bad(DType::kFloat32, {3}), lse_bad(DType::kFloat32, {1, 2, 5});
  HostTensor out32(DType::kFloat32, out.shape());
  std::vector<int32_t> mask = {1, 2, 3, 4};
  // Runs the forward with one modification of a valid argument set.
  auto fwd = [&](auto&& modify) {
    return [&, modify]() {
      FlexForwardArgs a;
      a.geometry = &g;
      a.mask = mask.data();
      a.q = q.view();
      a.k = k.view();
      a.v = v.view();
      a.out = out.view();
      a.lse = lse.view();
      a.softmax_scale = 0.5f;
      modify(a);
      reference::flex_forward(a);
    };
  };
  EXPECT_NO_THROW(fwd([](FlexForwardArgs&) {})());
  const Status kArg = Status::kInvalidArgument, kType = Status::kTypeError;
  EXPECT_TRUE(throws_error(fwd([](FlexForwardArgs& a) { a.geometry = nullptr; }), kArg, "geometry"));
  EXPECT_TRUE(throws_error(fwd([](FlexForwardArgs& a) { a.mask = nullptr; }), kArg, "mask_func"));
  EXPECT_TRUE(throws_error(fwd([](FlexForwardArgs& a) { a.out = TensorView(); }), kArg, "out: is required"));
  EXPECT_TRUE(throws_error(fwd([&](FlexForwardArgs& a) { a.out = out32.view(); }), kType, "out: dtype"));
  EXPECT_TRUE(throws_error(fwd([&](FlexForwardArgs& a) { a.q = k.view(); }), kArg, "q: shape"));
  EXPECT_TRUE(throws_error(fwd([&](FlexForwardArgs& a) { a.lse = lse_bad.view(); }), kArg, "lse: shape"));
  EXPECT_TRUE(throws_error(fwd([&](FlexForwardArgs& a) { a.max_logit = ml_bad.view(); }), kArg, "max_logit: shape"));
  EXPECT_TRUE(throws_error(fwd([&](FlexForwardArgs& a) { a.max_logit = max_logit.view(); a.softmax_scale = -1.0f; }),
                           kArg, "softmax_scale"));
  EXPECT_TRUE(throws_error(fwd([](FlexForwardArgs& a) { a.softmax_scale = std::nanf(""); }), kArg, "softmax_scale"));
  EXPECT_TRUE(throws_error(fwd([&](FlexForwardArgs& a) { a.geometry = &gcuda; }), kType, "CPU"));
  mask[2] = 5;  // past Sk = 4
  EXPECT_TRUE(throws_error(fwd([](FlexForwardArgs&) {}), kArg, "mask_func"));
  mask[2] = 3;

  // Backward needs lse and every gradient, of the right shapes.
  auto bwd = [&](auto&& modify) {
    return [&, modify]() {
      FlexBackwardArgs b;
      b.geometry = &g;
      b.mask = mask.data();
      b.q = q.view();
      b.k = k.view();
      b.v = v.view();
      b.out = out.view();
      b.dout = out.view();
      b.lse = lse.view();
      b.dq = q.view();
      b.dk = k.view();
      b.dv = v.view();
      b.softmax_scale = 0.5f;
      modify(b);
      reference::flex_backward(b);
    };
  };
  EXPECT_NO_THROW(bwd([](FlexBackwardArgs&) {})());
  EXPECT_TRUE(throws_error(bwd([](FlexBackwardArgs& b) { b.lse = TensorView(); }), kArg, "lse: is required"));
  EXPECT_TRUE(throws_error(bwd([&](FlexBackwardArgs& b) { b.dk = q.view(); }), kArg, "dk: shape"));
  EXPECT_TRUE(throws_error(bwd([&](FlexBackwardArgs& b) { b.dout = out32.view(); }), kType, "dout: dtype"));
  EXPECT_TRUE(throws_error([&] { reference::count_visible_pairs(g, mask.data(), 1); }, kArg, "mask_head"));
}

}  // namespace
}  // namespace flashspan::test
