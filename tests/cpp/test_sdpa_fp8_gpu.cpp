// GPU tests of the sm90 FP8 SDPA forward (kernels/sm90/launch_sm90.h launch_sdpa_fp8_fwd_sm90: the V^T
// pre-pass, then kernel_fwd_sm90.cuh sdpa_fp8_fwd_kernel_sm90), against a float64 loop of the
// definitions (params.h SdpaFp8Params; docs/SDPA.md "FP8 SDPA"):
//   S = descale_q descale_k attn_scale Q K^T (masked), P = softmax(S), amax_s = max |P|,
//   P_q = fp8_q(P scale_s), O = (P_q V) descale_s descale_v, amax_o = max |O|, O stored as
//   fp8_o(O scale_o), LSE (natural or base 2), score_max / score_sum_exp.
//   SdpaFp8Gpu.Sm90ForwardRandom         at the launcher level, SdpaFp8FwdParams built by hand: both
//                                        formats (o's its own), kernel head dims 64 and 128 (and
//                                        smaller multiples of 16 on them), no mask / causal top-left /
//                                        bottom-right / a sliding window (more than the FP8 API takes),
//                                        padding lengths with an empty sample, GQA / MQA, BHSD and BSHD
//                                        strides, S not a multiple of the 128 x 128 tile, host and device
//                                        factors, max_logit.
//   SdpaFp8Gpu.ApiForwardRandom          through the C++ API on CUDA tensors (the sm90 FP8 forward's
//                                        switch forced on: check_support, workspace_size, execute), the
//                                        FP8 API's options (causal, padding, GQA, layouts, formats, host
//                                        scale factors, stats in base 2, score_max / score_sum_exp); the
//                                        same calls on host copies (the CPU reference) checked against
//                                        the loop too, so the GPU result is tied to the reference.
//   SdpaFp8Gpu.Sm90ForwardSanitizerSmall small cases of both paths for compute-sanitizer (memcheck,
//                                        racecheck, synccheck: scripts/gpu_check.sh).
//   SdpaFp8Gpu.Sm90ForwardThdExperimental packed (THD) q, k, v, o, stats through the API with their switch forced on
//                                        (sdpa_fp8_sm90_thd_enabled, experimental; not yet run on a GPU): samples at
//                                        token offsets with gaps, one without keys and one without rows, GQA / MQA,
//                                        causal or none, both formats, kernel head dims 64 and 128; the CPU reference
//                                        on the same calls; the launch counter says the sm90 FP8 forward ran; O and
//                                        the stats outside the samples must stay poisoned.
//   SdpaFp8Gpu.Sm90ForwardThdSanitizerSmall two small packed calls for memcheck / synccheck.
// Outputs, the V^T workspace and the amaxes are 0xFF-poisoned (NaN in FP8 and fp32) before each run:
// an element the kernels never wrote stays NaN and fails.
// Error criteria. The kernel quantizes P the flash way, fp8(exp(s - m_block) scale_s) with its key
// block's running max and 1 / sum folded in at the end, while the definition quantizes the
// normalised P: each P_q term of either lies within max(u x, h) of x = P scale_s (u the format's unit
// roundoff, E4M3 2^-4, E5M2 2^-3; h half its smallest subnormal step, 2^-10, 2^-17), so elementwise
//   |O_gpu - O_ref| <= (descale_s descale_v sum_j 2 max(u x_j, h) |V_j|) (1 + u_o) + u_o |O_ref| + h_o / scale_o
// (the last two: O's own rounding in o's format), times 1.01, + 1e-5 max |O_ref|; and the relative L2
// error <= 2 max(u, u_o) (independent roundings give ~0.8u; a misplaced key or column gives ~1). LSE,
// max_logit, score_max within error_criteria.h kStatAtol (-inf exactly where no key is seen);
// score_sum_exp and amax_s within the LSE's bound, relative (1e-4 for the CPU reference); amax_o within the largest elementwise bound. The CPU
// reference against the loop (same definitions, double vs float roundings): O within one step of o's
// format, the statistics within 1e-5 relative.
// Skips when no CUDA device is visible, the build has no CUDA, or the device is not an sm_90 with this
// build's sm_90a code.
//
// The FP8 backward (kernels/sm80/launch_sm80.h launch_sdpa_fp8_bwd_sm80: the 16-bit sm80 backward on bf16
// copies of the codes with the FP8 graph's roundings; every GPU from sm_80; on by default since these tests
// passed on an H200 (FLASHSPAN_SDPA_FP8_BWD=0 turns it off), its switch set_sdpa_fp8_bwd_enabled forced on
// here), through the C++ API (check_support, workspace_size, execute) on CUDA
// tensors and on host copies (the CPU reference), both against a float64 loop of docs/SDPA.md's backward:
//   D = descale_dO descale_o dO.o, S = exp(x - stats), S8 = fp8_q(S scale_s), dS = descale_dO descale_v dO.v,
//   dP = attn_scale S (dS - D), amax_dP = max |dP|, dP8 = fp8_dO(dP scale_dP), dQ = (dP8 k) descale_dP descale_k,
//   dK = (sum over the group dP8^T q) descale_dP descale_q, dV = (sum over the group S8^T dO) descale_s descale_dO,
//   amax_dX = max |dX|, stored fp8_grad(dX scale_dX);
// o and stats come from the loop's forward of the same definitions, scale_dP and scale_dQ / dK / dV from its
// amaxes (Transformer Engine's power-of-two recipe, 0.7 fmax / amax, or over-scaled so that the largest
// saturate).
//   SdpaFp8Gpu.Fp8BackwardRandom         B 1-2, H_q in {1, 2, 4, 8} with H_k = H_v dividing it, S_q, S_kv in
//                                        1..300, head dims (16, 16) .. (128, 128) equal and unequal, causal
//                                        and no mask, E4M3 inputs (E5M2 too) with E4M3 / E5M2 dO and
//                                        gradients, o either format, factors powers of two and not, in host
//                                        or device memory, attn_scale a float or a host tensor, BHSD, BSHD,
//                                        padded rows (whose padding must stay unwritten) and odd row strides
//                                        from one byte into the allocation (rows at unaligned addresses: no
//                                        alignment rule for the FP8 backward); deterministic every third case
//                                        (use_deterministic_algorithm: the ordered dQ kernel with the FP8 steps),
//                                        run twice: bitwise the same dQ, dK, dV codes and amaxes.
//   SdpaFp8Gpu.Fp8BackwardEdges          one key (dP from the cancellation dS - D), one query, keys no causal
//                                        row sees (zero dK / dV rows), S_q > S_kv causal, MQA, whole tiles;
//                                        every other one deterministic (run twice, bitwise the same).
//   SdpaFp8Gpu.Fp8BackwardSanitizerSmall small cases for compute-sanitizer (memcheck, racecheck), one of them
//                                        deterministic with odd row strides.
//   SdpaFp8Loop.BackwardMatchesTheCpuReference, BackwardCriterionRejectsWrongResults (no GPU): the loop and
//                                        the criterion against the CPU reference, and the criterion failing
//                                        on wrong results (a factor 2x or 1.1x, a zeroed or unwritten row, an
//                                        amax of the quantized dP8, a poisoned or doubled amax).
// dQ, dK, dV are poisoned with NaN codes (0x7F) before each run (padding too: it must stay so), the amaxes
// with 0x7F bytes (3.4e38: an atomic max that never zeroes them keeps it) or 0xFF (NaN), the workspace 0xFF.
// Criterion. The kernel computes S, P, dS, D, dP in fp32, the loop in float64, so an S8 or dP8 term whose
// value lies near a rounding boundary of its format may round to the neighbouring code, and each stored
// gradient may round differently. The loop bounds the kernel's fp32 error of each term (an error model, each
// bound times kModelSafety = 2): products of FP8 values are exact (bf16 mma.sync); an fp32 sum of n terms, in
// any order, within gamma(n) = (n + 16) 2^-22 times the sum of their magnitudes (twice the worst-case n 2^-24,
// for truncating tensor-core adds and the factor products); P = exp2(...) within dx = e_x + (|x| + |stats|)
// 2^-21 + 2^-20 relative (the scores' sum, the exponent's roundings, exp2's approximation); D, dS within
// gamma(D_v) sum |terms| + 2^-22 |value|; dP within attn_scale (P dx |dS - D| + P (e_dS + e_D)) + 2^-22 |dP|;
// x scale within 2^-21 relative more. A term's span is the distance between the codes fp8(v - e) and
// fp8(v + e) (0 unless v lies within its bound e of a boundary); each gradient element's bound before its
// own rounding is a = unit (sum over its terms of span |operand| + gamma(n) sum |terms|), n = S_kv for dQ,
// (H_q / H_k) S_q for dK, dV, and in stored units a_y = a scale_dX + 2^-22 |y|, y = dX scale_dX. Then
//   every element: |stored - clamp(y)| <= 1.01 (a_y + one step of the gradient format at |clamp(y)| + a_y)
//   (the kernel's value lies within a_y of y, its rounding within half a step of that);
//   all but 1 % (+ 2) of the codes lie in [fp8(y - a_y), fp8(y + a_y)] (the model's own prediction; an
//   unmodelled last-bit difference may move a few);
//   amax_dQ / dK / dV within [max(|dX| - a), max(|dX| + a)], amax_dP within [max(|dP| - e), max(|dP| + e)]
//   (times 1 -+ 2^-20): both are of the fp32 values before any scale or rounding.
// Where no term of an element is near a boundary (most: the model's bounds are 1e-4 - 1e-3 of a value, a
// step 6 - 25 %), a is far below one step, so the bound is one step of the gradient's format: a factor off by
// 2x fails every element, one off by 1.1x moves most codes off the reference's rounding (the 1 % count),
// an amax taken after the FP8 rounding lies outside its interval (SdpaFp8Loop.BackwardCriterionRejectsWrongResults
// checks each on the CPU reference). The CPU reference is held to the same criterion.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/fp8_conv.h"
#include "error_criteria.h"
#include "flashspan/flashspan.hpp"
#include "gpu_harness.h"
#include "scoped_env.h"
#include "sdpa_case.h"
#ifdef FLASHSPAN_WITH_CUDA
#include "dispatch/sdpa_launch.h"  // set_sdpa_fp8_sm90_enabled, set_sdpa_fp8_bwd_enabled
#include "kernels/params.h"
#include "kernels/common/fp8_prepass.h"
#include "kernels/sm90/launch_sm90.h"
#include "kernels/sm90/sdpa_fp8_bwd_sm90.h"
#include "kernels/sm90/tile_sm90.h"
#endif

namespace flashspan::test {
namespace {

#ifndef FLASHSPAN_WITH_CUDA

TEST(SdpaFp8Gpu, Skipped) { GTEST_SKIP() << "flashspan was built without CUDA"; }

#else

namespace api = flashspan::api;
using flashspan::test::ScopedSwitch;

// ---------------------------------------------------------------------------
// FP8 values (core/fp8_conv.h) and the error terms of a format
// ---------------------------------------------------------------------------

struct Fp8Fmt {
  DType dtype;
  double max;  // largest finite
  double u;    // unit roundoff 2^-(M + 1)
  double h;    // half the smallest subnormal step
  double decode(uint8_t b) const { return fp8_bits_to_float(b, fp8_format(dtype)); }
  uint8_t encode(double x) const { return float_to_fp8_bits(float(x), fp8_format(dtype)); }
  double round(double x) const { return decode(encode(x)); }
};
Fp8Fmt fmt_of(int code) {
  return code == 2 ? Fp8Fmt{DType::kFloat8E5M2, 57344.0, 0.125, std::ldexp(1.0, -17)}
                   : Fp8Fmt{DType::kFloat8E4M3, 448.0, 0.0625, std::ldexp(1.0, -10)};
}
fs_dtype_t api_dtype(int code) { return code == 2 ? api::kFloat8E5M2 : api::kFloat8E4M3; }

// ---------------------------------------------------------------------------
// One case: its inputs, a run's outputs, the float64 loop
// ---------------------------------------------------------------------------

enum MaskKind { kNoMask, kCausalTopLeft, kCausalBottomRight, kWindow };

struct Fp8Case {
  int format = 1, o_format = 1;  // q / k / v (and P), o: 1 E4M3, 2 E5M2
  int B = 1, Hq = 1, Hk = 1, Sq = 1, Skv = 1, Dqk = 64, Dv = 64;
  int Hv = 0;  // V's heads (0: H_k's; else dividing H_q: H_k != H_v)
  MaskKind mask = kNoMask;
  bool padding = false;       // seq_len_q / seq_len_kv: sample 0 full, 1 shorter, 2 empty, ...
  bool bshd = false;          // memory [B, S, H, D] behind the [B, H, S, D] descriptors
  bool host_factors = false;  // the scale factors in host memory (by value)
  bool max_logit = false;     // launcher only (the FP8 API refuses it)
  bool stats_log2 = false;    // API only
  bool score_stats = false;   // score_max / score_sum_exp
  int attn_form = 0;          // API only: attn_scale 0 a float, 1 a host tensor, 2 a tensor in q's memory
  // API only: packed (THD) q, k, v, o, stats: [T, H, D] storage (sdpa_case.h's THD layout: the samples at token
  // offsets with gaps between them, 2 spare tokens at the end; ragged offsets with the row stride as multiplier),
  // lengths by seq_len (sdpa_case.h sample_lengths: sample 0 full, sample 1 without keys, the last all keys; sample
  // 2 without rows); the gaps hold NaN codes, and O / stats must stay unwritten there (no score_max / score_sum_exp
  // beside a packed o: refused).
  bool thd = false;
  uint64_t seed = 1;
  int heads_v() const { return Hv > 0 ? Hv : Hk; }
  std::string name() const {
    std::ostringstream os;
    os << (format == 2 ? "e5m2" : "e4m3") << "->" << (o_format == 2 ? "e5m2" : "e4m3") << " B" << B << " Hq" << Hq
       << " Hk" << Hk << " Hv" << heads_v() << " Sq" << Sq << " Skv" << Skv << " D" << Dqk << "/" << Dv << " mask" << int(mask)
       << (padding ? " pad" : "") << (bshd ? " bshd" : " bhsd") << (host_factors ? " host-factors" : "")
       << (max_logit ? " max_logit" : "") << (stats_log2 ? " log2" : "") << (score_stats ? " score-stats" : "")
       << (attn_form == 1 ? " attn-host-tensor" : attn_form == 2 ? " attn-tensor" : "") << (thd ? " thd" : "")
       << " seed" << seed;
    return os.str();
  }
};

// Element strides of a [B, H, S, D] tensor: BHSD or, with bshd, BSHD memory.
std::array<int64_t, 4> strides_of(int H, int S, int D, bool bshd) {
  return bshd ? std::array<int64_t, 4>{int64_t(S) * H * D, D, int64_t(H) * D, 1}
              : std::array<int64_t, 4>{int64_t(H) * S * D, int64_t(S) * D, D, 1};
}

struct Inputs {
  std::array<int64_t, 4> sq, sk, sv, so, sst;  // strides of q, k, v, o and the stats ([B, H_q, S_q, 1])
  std::vector<uint8_t> q, k, v;
  size_t no = 0, nst = 0;  // elements of o's and the stats' storage
  std::array<float, 6> factor;  // descale_q, descale_k, descale_v, descale_s, scale_s, scale_o
  float attn_scale;
  std::vector<int32_t> len_q, len_kv;
  std::vector<int64_t> tok_q, tok_kv;  // Fp8Case::thd: each side's token offsets ([B + 1]); empty: padded
  sdpa::Band band;

  // Element offset of row i of head h of sample b of a tensor with strides st on the query side (q, o, stats)
  // or the key side (k, v): b st[0] padded, its first token's row when packed.
  int64_t row_at(const std::array<int64_t, 4>& st, bool q_side, int b, int64_t h, int64_t i) const {
    const std::vector<int64_t>& tok = q_side ? tok_q : tok_kv;
    return (tok.empty() ? b * st[0] : tok[size_t(b)] * st[2]) + h * st[1] + i * st[2];
  }
  // Rows of sample b an output holds: S_q padded, the sample's packed.
  int out_rows(const Fp8Case& c, int b) const { return tok_q.empty() ? c.Sq : len_q[size_t(b)]; }
};

sdpa::Band band_of(MaskKind m) {
  sdpa::Band b;
  if (m != kNoMask) {
    b.has_right = 1;
    b.right = 0;
  }
  b.bottom_right = m == kCausalBottomRight || m == kWindow ? 1 : 0;
  if (m == kWindow) {
    b.has_left = 1;
    b.left = 37;
  }
  return b;
}

Inputs make_inputs(const Fp8Case& c) {
  const Fp8Fmt f = fmt_of(c.format), fo = fmt_of(c.o_format);
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<double> uni(-1.0, 1.0);
  Inputs in;
  in.sq = strides_of(c.Hq, c.Sq, c.Dqk, c.bshd);
  in.sk = strides_of(c.Hk, c.Skv, c.Dqk, c.bshd);
  in.sv = strides_of(c.heads_v(), c.Skv, c.Dv, c.bshd);
  in.so = strides_of(c.Hq, c.Sq, c.Dv, c.bshd);
  in.sst = {int64_t(c.Hq) * c.Sq, c.Sq, 1, 1};
  size_t nq = size_t(c.B) * c.Hq * c.Sq * c.Dqk, nk = size_t(c.B) * c.Hk * c.Skv * c.Dqk;
  size_t nv = size_t(c.B) * c.heads_v() * c.Skv * c.Dv;
  in.no = size_t(c.B) * c.Hq * c.Sq * c.Dv;
  in.nst = size_t(c.B) * c.Hq * c.Sq;
  in.len_q.assign(c.B, c.Sq);
  in.len_kv.assign(c.B, c.Skv);
  if (c.padding && !c.thd) {
    for (int b = 0; b < c.B; ++b) {
      if (b % 3 == 1) {
        in.len_q[b] = std::max(1, c.Sq * 2 / 3);
        in.len_kv[b] = std::max(1, c.Skv / 2 + 3);
      } else if (b % 3 == 2) {
        in.len_q[b] = 0;
        in.len_kv[b] = 0;
      }
    }
  }
  if (c.thd) {
    // sdpa_case.h's lengths and packed layouts (a stream of their own: the padded cases' values stay as they were).
    std::mt19937_64 shape_rng(c.seed * 7919 + 17);
    sdpa_case::Case sc;
    sc.B = c.B;
    sc.Sq = c.Sq;
    sc.Skv = c.Skv;
    sc.kind_q = sc.kind_kv = sdpa_case::Kind::kThd;
    sc.zero_kv_sample = true;
    std::vector<int64_t> lq, lk;
    sdpa_case::sample_lengths(sc, shape_rng, lq, lk);
    if (c.B > 2) lq[2] = 0;  // a sample without rows
    in.len_q.assign(lq.begin(), lq.end());
    in.len_kv.assign(lk.begin(), lk.end());
    in.tok_q = sdpa_case::token_offsets(lq, /*gaps=*/true, shape_rng);
    in.tok_kv = sdpa_case::token_offsets(lk, /*gaps=*/true, shape_rng);
    auto packed = [&](std::array<int64_t, 4>& st, size_t& n, bool q_side, int H, int D) {
      const sdpa_case::Layout l = sdpa_case::make_layout(sdpa_case::Kind::kThd, c.B, H, q_side ? c.Sq : c.Skv, D,
                                                         q_side ? in.tok_q : in.tok_kv);
      st = {l.strides[0], l.strides[1], l.strides[2], l.strides[3]};
      n = size_t(l.storage);
    };
    packed(in.sq, nq, true, c.Hq, c.Dqk);
    packed(in.sk, nk, false, c.Hk, c.Dqk);
    packed(in.sv, nv, false, c.heads_v(), c.Dv);
    packed(in.so, in.no, true, c.Hq, c.Dv);
    packed(in.sst, in.nst, true, c.Hq, 1);
  }
  // Raw FP8 inputs over a quarter of the format's range (so that the descales matter), a few outliers; packed, the
  // samples' rows (the gaps between them NaN codes: 0x7F in both formats, never read).
  auto value = [&] { return f.encode(0.25 * f.max * uni(rng) * (uni(rng) > 0.98 ? 4.0 : 1.0)); };
  auto fill = [&](std::vector<uint8_t>& t, size_t n, const std::array<int64_t, 4>& st, bool q_side, int H, int D) {
    if (!c.thd) {
      t.resize(n);
      for (auto& x : t) x = value();
      return;
    }
    t.assign(n, 0x7f);
    for (int b = 0; b < c.B; ++b) {
      const int len = (q_side ? in.len_q : in.len_kv)[size_t(b)];
      for (int h = 0; h < H; ++h) {
        for (int i = 0; i < len; ++i) {
          for (int d = 0; d < D; ++d) t[size_t(in.row_at(st, q_side, b, h, i) + d)] = value();
        }
      }
    }
  };
  fill(in.q, nq, in.sq, true, c.Hq, c.Dqk);
  fill(in.k, nk, in.sk, false, c.Hk, c.Dqk);
  fill(in.v, nv, in.sv, false, c.heads_v(), c.Dv);
  // Dequantized inputs of amplitude ~1 (non-powers of two too); scale_s the format's largest value or
  // less; scale_o so that |O| <= max |V| ~ 4 does not saturate.
  const float scale_s = float(c.seed % 3 == 0 ? f.max : c.seed % 3 == 1 ? 0.75 * f.max : 0.5 * f.max);
  in.factor = {float(4.0 / f.max * 1.1), float(4.0 / f.max * 0.9), float(4.0 / f.max), 1.0f / scale_s, scale_s,
               float(fo.max / 8.0)};
  in.attn_scale = float(2.5 / std::sqrt(double(c.Dqk)));
  in.band = band_of(c.mask);
  return in;
}

// What a run gives back (o's bytes and the stats in their storage, Inputs::so / sst: padded [B, H_q, S_q] stats or
// packed [T, H_q]; score_max / score_sum_exp [B, H_q, S_q]).
struct Outputs {
  std::vector<uint8_t> o;
  std::vector<float> stats, max_logit, score_max, score_sum_exp;
  float amax_s = NAN, amax_o = NAN;
};

struct Reference {
  std::vector<double> o, bound, lse, score_max, score_sum_exp, max_logit;
  double amax_s = 0.0, amax_o = 0.0, max_bound = 0.0;
};

// The float64 loop of the definitions on the decoded inputs.
Reference reference_loop(const Fp8Case& c, const Inputs& in) {
  const Fp8Fmt f = fmt_of(c.format);
  auto decoded = [&](const std::vector<uint8_t>& t) {
    std::vector<double> d(t.size());
    for (size_t x = 0; x < t.size(); ++x) d[x] = f.decode(t[x]);
    return d;
  };
  const std::vector<double> qd = decoded(in.q), kd = decoded(in.k), vd = decoded(in.v);
  const double dq = in.factor[0], dk = in.factor[1], dv = in.factor[2], ds = in.factor[3], ss = in.factor[4];
  const size_t nrow = size_t(c.B) * c.Hq * c.Sq;
  Reference r;
  // O and the stats in their storage: every row 0 / -inf until computed (rows without a visible key keep them);
  // packed, NaN (unwritten) but for the samples' rows.
  r.o.assign(in.no, c.thd ? NAN : 0.0);
  r.bound.assign(r.o.size(), 0.0);
  r.lse.assign(in.nst, c.thd ? NAN : -INFINITY);
  for (int b = 0; b < c.B && c.thd; ++b) {
    for (int h = 0; h < c.Hq; ++h) {
      for (int i = 0; i < in.len_q[b]; ++i) {
        for (int d = 0; d < c.Dv; ++d) r.o[size_t(in.row_at(in.so, true, b, h, i) + d)] = 0.0;
        r.lse[size_t(in.row_at(in.sst, true, b, h, i))] = -INFINITY;
      }
    }
  }
  r.score_max.assign(nrow, -INFINITY);
  r.score_sum_exp.assign(nrow, 0.0);
  r.max_logit.assign(c.Hq, -INFINITY);
  const int G = c.Hq / c.Hk, Gv = c.Hq / c.heads_v();
  std::vector<double> s(c.Skv), pq(c.Skv), err(c.Skv);
  for (int b = 0; b < c.B; ++b) {
    for (int h = 0; h < c.Hq; ++h) {
      const int hk = h / G, hv = h / Gv;
      for (int i = 0; i < in.len_q[b]; ++i) {
        int64_t lo = 0, hi = 0;
        in.band.columns(i, in.len_q[b], in.len_kv[b], &lo, &hi);
        if (lo >= hi) continue;
        const double* qr = qd.data() + in.row_at(in.sq, true, b, h, i);
        double m = -INFINITY;
        for (int64_t j = lo; j < hi; ++j) {
          const double* kr = kd.data() + in.row_at(in.sk, false, b, hk, j);
          double acc = 0.0;
          for (int d = 0; d < c.Dqk; ++d) acc += qr[d] * kr[d];
          s[j] = double(in.attn_scale) * dq * dk * acc;
          m = std::max(m, s[j]);
        }
        double l = 0.0;
        for (int64_t j = lo; j < hi; ++j) l += std::exp(s[j] - m);
        const size_t row = (size_t(b) * c.Hq + h) * c.Sq + i;  // (score_max / score_sum_exp: padded)
        r.amax_s = std::max(r.amax_s, 1.0 / l);
        r.max_logit[h] = std::max(r.max_logit[h], m);
        r.lse[size_t(in.row_at(in.sst, true, b, h, i))] = m + std::log(l);
        r.score_max[row] = m;
        r.score_sum_exp[row] = l;
        for (int64_t j = lo; j < hi; ++j) {
          const double x = std::exp(s[j] - m) / l * ss;
          pq[j] = f.round(x);
          err[j] = 2.0 * std::max(f.u * x, f.h);
        }
        for (int d = 0; d < c.Dv; ++d) {
          double acc = 0.0, bnd = 0.0;
          for (int64_t j = lo; j < hi; ++j) {
            const double vj = vd[size_t(in.row_at(in.sv, false, b, hv, j) + d)];
            acc += pq[j] * vj;
            bnd += err[j] * std::fabs(vj);
          }
          const size_t oi = size_t(in.row_at(in.so, true, b, h, i) + d);
          r.o[oi] = acc * ds * dv;
          r.bound[oi] = bnd * ds * dv;
          r.amax_o = std::max(r.amax_o, std::fabs(r.o[oi]));
          r.max_bound = std::max(r.max_bound, r.bound[oi]);
        }
      }
    }
  }
  return r;
}

bool stat_ok(double got, double ref, double atol) {
  return std::isinf(ref) ? (std::isinf(got) && (got < 0) == (ref < 0)) : std::fabs(got - ref) <= atol;
}

// out against the loop. gpu: the kernel's criteria (the flash quantization's bound), else the CPU
// reference's (one step of o's format, the statistics to 1e-5). Packed (Fp8Case::thd): the samples' rows, and every
// element of O and the stats outside them still the poison (0xFF codes, NaN).
std::string check(const Fp8Case& c, const Inputs& in, const Reference& r, const Outputs& out, bool gpu) {
  const Fp8Fmt fo = fmt_of(c.o_format), f = fmt_of(c.format);
  const double scale_o = in.factor[5];
  std::ostringstream fails;
  double max_ref = 0.0;
  for (double x : r.o) {
    if (std::isfinite(x)) max_ref = std::max(max_ref, std::fabs(x));
  }
  double se = 0.0, sr = 0.0;
  int bad = 0;
  for (int b = 0; b < c.B; ++b) {
    for (int h = 0; h < c.Hq; ++h) {
      for (int i = 0; i < in.out_rows(c, b); ++i) {
        for (int d = 0; d < c.Dv; ++d) {
          const size_t oi = size_t(in.row_at(in.so, true, b, h, i) + d);
          const double got = fo.decode(out.o[oi]) / scale_o, ref = r.o[oi];
          const double step = 2.0 * fo.u * std::fabs(ref) + 2.0 * fo.h / scale_o;  // one step of o's format
          const double tol = gpu ? 1.01 * (r.bound[oi] * (1.0 + fo.u) + fo.u * std::fabs(ref) + fo.h / scale_o) +
                                       1e-5 * max_ref
                                 : 1.01 * step + 1e-6 * max_ref;
          se += (got - ref) * (got - ref);
          sr += ref * ref;
          if (!(std::fabs(got - ref) <= tol) && bad++ < 5) {
            fails << "  O[b" << b << " h" << h << " i" << i << " d" << d << "] = " << got << ", loop " << ref
                  << " (bound " << tol << ")\n";
          }
        }
      }
    }
  }
  if (bad) fails << "  " << bad << " elements of O out of bounds\n";
  int written = 0;
  for (size_t x = 0; x < r.o.size(); ++x) {
    if (std::isnan(r.o[x]) && out.o[x] != 0xff && written++ < 5) {
      fails << "  O storage element " << x << " outside every sample written: code " << int(out.o[x]) << "\n";
    }
  }
  for (size_t x = 0; x < r.lse.size(); ++x) {
    if (std::isnan(r.lse[x]) && !std::isnan(out.stats[x]) && written++ < 5) {
      fails << "  stats storage element " << x << " outside every sample written: " << out.stats[x] << "\n";
    }
  }
  const double rel = gpu ? 2.0 * std::max(f.u, fo.u) : 2.0 * fo.u;
  if (!(std::sqrt(se) <= rel * std::sqrt(sr) + 1e-6)) {
    fails << "  O relative L2 error " << std::sqrt(se / std::max(sr, 1e-300)) << " > " << rel << "\n";
  }
  const double stat_atol = gpu ? fs_test::kStatAtol : 1e-5;
  const double unit = c.stats_log2 ? 1.4426950408889634 : 1.0;
  int bad_stats = 0;
  for (int b = 0; b < c.B; ++b) {
    for (int h = 0; h < c.Hq; ++h) {
      for (int i = 0; i < in.out_rows(c, b); ++i) {
        // x: the stats' storage element; y: the row of the padded score_max / score_sum_exp ([B, H_q, S_q, 1]).
        const size_t x = size_t(in.row_at(in.sst, true, b, h, i)), y = (size_t(b) * c.Hq + h) * c.Sq + i;
        const double lse = r.lse[x];
        if (!stat_ok(out.stats[x], lse * unit, stat_atol * std::max(1.0, std::fabs(lse))) && bad_stats++ < 5) {
          fails << "  LSE[b" << b << " h" << h << " i" << i << "] = " << out.stats[x] << ", loop " << lse * unit << "\n";
        }
        if (!c.score_stats) continue;
        if (!stat_ok(out.score_max[y], r.score_max[y], stat_atol * std::max(1.0, std::fabs(r.score_max[y]))) &&
            bad_stats++ < 5) {
          fails << "  score_max[" << y << "] = " << out.score_max[y] << ", loop " << r.score_max[y] << "\n";
        }
        // sum_exp = exp(LSE - score_max): relative error the LSE's absolute one (as amax_s below).
        const double rel_se = gpu && std::isfinite(lse) ? stat_atol * std::max(1.0, std::fabs(lse)) : 1e-4;
        if (!(std::fabs(out.score_sum_exp[y] - r.score_sum_exp[y]) <= rel_se * r.score_sum_exp[y] + 1e-12) &&
            bad_stats++ < 5) {
          fails << "  score_sum_exp[" << y << "] = " << out.score_sum_exp[y] << ", loop " << r.score_sum_exp[y]
                << "\n";
        }
      }
    }
  }
  if (c.max_logit) {
    for (int h = 0; h < c.Hq; ++h) {
      if (!stat_ok(out.max_logit[h], r.max_logit[h], stat_atol)) {
        fails << "  max_logit[" << h << "] = " << out.max_logit[h] << ", loop " << r.max_logit[h] << "\n";
      }
    }
  }
  // amax_s = max over rows of 1 / l = exp(m - LSE): its relative error is the LSE's absolute one. The GPU's LSE
  // carries the scores' error of FP8 wgmma, whose accumulation keeps fewer bits than fp32 (DeepSeek-V3, arXiv
  // 2412.19437 s. 3.3.2: about 14): 1.7e-4 - 4.4e-4 relative measured on an H200 against the loop's 1e-4 bound.
  double lse_max = 1.0;
  for (double x : r.lse) {
    if (std::isfinite(x)) lse_max = std::max(lse_max, std::fabs(x));
  }
  const double rel_s = gpu ? stat_atol * lse_max : 1e-4;
  if (!(std::fabs(out.amax_s - r.amax_s) <= rel_s * r.amax_s + 1e-12)) {
    fails << "  amax_s = " << out.amax_s << ", loop " << r.amax_s << "\n";
  }
  const double amax_tol = gpu ? 1.01 * r.max_bound + 1e-5 * r.amax_o : 1e-5 * r.amax_o + 1e-12;
  if (!(std::fabs(out.amax_o - r.amax_o) <= amax_tol)) {
    fails << "  amax_o = " << out.amax_o << ", loop " << r.amax_o << " (tolerance " << amax_tol << ")\n";
  }
  const std::string s = fails.str();
  return s.empty() ? s : std::string(gpu ? "GPU " : "CPU reference ") + c.name() + ":\n" + s;
}

// ---------------------------------------------------------------------------
// Runs
// ---------------------------------------------------------------------------

template <class T>
void upload(DevBuf& d, const std::vector<T>& h) {
  if (!h.empty()) cuda_ok(cudaMemcpy(d.p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
}
template <class T>
std::vector<T> download(const DevBuf& d, size_t n) {
  std::vector<T> h(n);
  if (n) cuda_ok(cudaMemcpy(h.data(), d.p, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
  return h;
}
// A device buffer of at least `bytes`, 0xFF-poisoned (NaN in FP8 and fp32).
struct Poisoned : DevBuf {
  explicit Poisoned(size_t bytes) : DevBuf(std::max<size_t>(bytes, 16)) {
    cuda_ok(cudaMemset(p, 0xff, this->bytes), "poison");
  }
};

TensorView view_of(void* data, int B, int H, int S, int D, const std::array<int64_t, 4>& st) {
  TensorView v;
  v.data = data;
  v.dtype = DType::kUInt8;  // one byte an element; the FP8 formats travel in SdpaFp8Params
  v.device = DeviceType::kCUDA;
  v.ndim = 4;
  v.shape = {int64_t(B), int64_t(H), int64_t(S), int64_t(D)};
  v.strides = {st[0], st[1], st[2], st[3]};
  return v;
}

// The launcher with SdpaFp8FwdParams as dispatch/sdpa_params.cpp fills them (padded tensors: packed ones run
// through the API, run_api).
Outputs run_launcher(const Fp8Case& c, const Inputs& in) {
  EXPECT_FALSE(c.thd) << "run_launcher takes padded tensors";
  const size_t no = size_t(c.B) * c.Hq * c.Sq * c.Dv, nrow = size_t(c.B) * c.Hq * c.Sq;
  DevBuf dq(in.q.size()), dk(in.k.size()), dv(in.v.size()), dlq(sizeof(int32_t) * c.B), dlk(sizeof(int32_t) * c.B);
  DevBuf dfac(sizeof(float) * kFp8NumFactors);
  Poisoned dout(no), dstats(sizeof(float) * nrow), damax(2 * sizeof(float)), dml(sizeof(float) * c.Hq);
  Poisoned dsm(sizeof(float) * nrow), dss(sizeof(float) * nrow);
  Poisoned dvt(size_t(sm90::fp8_vt_bytes_sm90(c.B, c.heads_v(), c.Dv, c.Skv)));
  upload(dq, in.q);
  upload(dk, in.k);
  upload(dv, in.v);
  upload(dlq, in.len_q);
  upload(dlk, in.len_kv);
  // The factors in SdpaFp8Factor order: the six, then attn_scale (kFp8AttnScale).
  std::vector<float> factors(in.factor.begin(), in.factor.end());
  factors.push_back(in.attn_scale);
  upload(dfac, factors);

  SdpaFp8FwdParams p;
  p.q = dq.p;
  p.k = dk.p;
  p.v = dv.p;
  p.qa = TensorAddr{0, in.sq[2], in.sq[1]};
  p.ka = TensorAddr{0, in.sk[2], in.sk[1]};
  p.va = TensorAddr{0, in.sv[2], in.sv[1]};
  p.batch = c.B;
  p.num_heads_q = c.Hq;
  p.group_size = c.Hq / c.Hk;
  p.mask_per_head = 1;
  p.head_dqk = c.Dqk;
  p.head_dv = c.Dv;
  // The FP8 kernels take attn_scale from the factors (kFp8AttnScale): the float scale is NaN here, as dispatch
  // makes it for a device attn_scale, so that a kernel reading it shows it.
  p.scale = p.scale_log2 = NAN;
  p.grid_mode = 1;
  p.o = dout.p;
  p.oa = TensorAddr{0, in.so[2], in.so[1]};
  p.lse = static_cast<float*>(dstats.p);
  p.lsea = TensorAddr{0, 1, c.Sq};
  p.max_logit = c.max_logit ? static_cast<float*>(dml.p) : nullptr;
  AnalyticMaskParams& a = p.analytic;
  a.score.group_v = c.Hq / c.heads_v();
  a.band = in.band;
  if (c.padding) {
    a.seq_len_q.ptr = dlq.p;
    a.seq_len_kv.ptr = dlk.p;
  }
  a.max_q = c.Sq;
  a.max_kv = c.Skv;
  a.start[kSdpaQ].batch_stride = in.sq[0];
  a.start[kSdpaK].batch_stride = in.sk[0];
  a.start[kSdpaV].batch_stride = in.sv[0];
  a.start[kSdpaO].batch_stride = in.so[0];
  a.start[kSdpaStats].batch_stride = int64_t(c.Hq) * c.Sq;
  a.lse_unit = c.stats_log2 ? 1.0f : 0.6931471805599453f;
  if (c.score_stats) {
    a.epi.score_max = static_cast<float*>(dsm.p);
    a.epi.score_sum_exp = static_cast<float*>(dss.p);
    a.epi.sma = a.epi.ssa = TensorAddr{0, 1, c.Sq};
    a.start[kSdpaScoreMax].batch_stride = a.start[kSdpaScoreSumExp].batch_stride = int64_t(c.Hq) * c.Sq;
  }
  SdpaFp8Params& f8 = p.fp8;
  f8.format = c.format;
  f8.o_format = c.o_format;
  for (int i = 0; i < kFp8NumFactors; ++i) {
    f8.factor[i] = c.host_factors ? nullptr : static_cast<const float*>(dfac.p) + i;
    f8.host_factor[i] = c.host_factors ? factors[size_t(i)] : 0.0f;  // 0: never read when a pointer is set
  }
  f8.amax_s = static_cast<float*>(damax.p);
  f8.amax_o = static_cast<float*>(damax.p) + 1;
  f8.v_t = dvt.p;

  sm90::launch_sdpa_fp8_fwd_sm90(p, view_of(dq.p, c.B, c.Hq, c.Sq, c.Dqk, in.sq),
                                 view_of(dk.p, c.B, c.Hk, c.Skv, c.Dqk, in.sk),
                                 view_of(dv.p, c.B, c.heads_v(), c.Skv, c.Dv, in.sv), nullptr, 0, nullptr);
  cuda_ok(cudaDeviceSynchronize(), "sdpa fp8 forward");
  Outputs out;
  out.o = download<uint8_t>(dout, no);
  out.stats = download<float>(dstats, nrow);
  out.max_logit = download<float>(dml, size_t(c.Hq));
  out.score_max = download<float>(dsm, nrow);
  out.score_sum_exp = download<float>(dss, nrow);
  const auto am = download<float>(damax, 2);
  out.amax_s = am[0];
  out.amax_o = am[1];
  return out;
}

// The same call through the C++ API: on CUDA tensors (the sm90 FP8 forward) or, cuda = false, on host
// tensors (the CPU reference).
Outputs run_api(const Fp8Case& c, const Inputs& in, bool cuda) {
  const size_t no = in.no, nrow = size_t(c.B) * c.Hq * c.Sq;
  const fs_device_t dev = cuda ? api::Device::cuda(0) : api::Device::cpu();
  const fs_device_t fac_dev = cuda && !c.host_factors ? api::Device::cuda(0) : api::Device::cpu();
  // Host storage; on CUDA its device twins.
  std::vector<uint8_t> q = in.q, k = in.k, v = in.v, o(no, 0xff);
  std::vector<float> stats(in.nst, NAN), smax(nrow, NAN), ssum(nrow, NAN), amax{NAN, NAN};
  std::vector<float> fac(in.factor.begin(), in.factor.end());
  std::vector<int32_t> lq = in.len_q, lk = in.len_kv;
  std::vector<int32_t> tq(in.tok_q.begin(), in.tok_q.end()), tk(in.tok_kv.begin(), in.tok_kv.end());
  tq.resize(std::max<size_t>(tq.size(), 1));  // (padded: unused)
  tk.resize(std::max<size_t>(tk.size(), 1));
  std::vector<std::unique_ptr<DevBuf>> bufs;
  auto place = [&](auto& h) -> void* {
    using T = typename std::decay_t<decltype(h)>::value_type;
    if (!cuda) return h.data();
    bufs.push_back(std::make_unique<DevBuf>(std::max<size_t>(h.size() * sizeof(T), 16)));
    cuda_ok(cudaMemcpy(bufs.back()->p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
    return bufs.back()->p;
  };
  void *pq = place(q), *pk = place(k), *pv = place(v), *po = place(o), *pst = place(stats), *psm = place(smax);
  void *pss = place(ssum), *pam = place(amax), *plq = place(lq), *plk = place(lk), *ptq = place(tq), *ptk = place(tk);
  void* pfac = c.host_factors ? fac.data() : place(fac);
  std::vector<float> attn{in.attn_scale};
  void* pattn = c.attn_form == 2 ? place(attn) : attn.data();
  auto desc = [&](void* d, fs_dtype_t t, int H, int S, int D, const std::array<int64_t, 4>& st) {
    return api::TensorDesc(d, t, dev, {c.B, H, S, D}, {st[0], st[1], st[2], st[3]});
  };
  const api::TensorDesc qd = desc(nullptr, api_dtype(c.format), c.Hq, c.Sq, c.Dqk, in.sq);
  const api::TensorDesc kd = desc(nullptr, api_dtype(c.format), c.Hk, c.Skv, c.Dqk, in.sk);
  const api::TensorDesc vd = desc(nullptr, api_dtype(c.format), c.heads_v(), c.Skv, c.Dv, in.sv);
  const api::TensorDesc od = desc(nullptr, api_dtype(c.o_format), c.Hq, c.Sq, c.Dv, in.so);
  const api::TensorDesc sd(nullptr, api::kFloat32, dev, {c.B, c.Hq, c.Sq, 1}, {in.sst[0], in.sst[1], in.sst[2], 1});
  const api::TensorDesc ssd(nullptr, api::kFloat32, dev, {c.B, c.Hq, c.Sq, 1});  // score_max / score_sum_exp
  const api::TensorDesc one(nullptr, api::kFloat32, fac_dev, {1, 1, 1, 1});
  const api::TensorDesc amax_d(nullptr, api::kFloat32, dev, {1, 1, 1, 1});
  const api::TensorDesc lens(nullptr, api::kInt32, dev, {c.B, 1, 1, 1});
  api::SdpaAttributes a;
  if (c.attn_form == 0) {
    a.set_attn_scale(in.attn_scale);
  } else {
    a.set_attn_scale(api::TensorDesc(nullptr, api::kFloat32, c.attn_form == 2 ? dev : api::Device::cpu(), {1, 1, 1, 1}));
  }
  a.set_generate_stats(true).set_causal_mask(c.mask == kCausalTopLeft);
  a.set_stats_use_log2(c.stats_log2);
  a.set_descale_q(one).set_descale_k(one).set_descale_v(one).set_descale_s(one).set_scale_s(one).set_scale_o(one);
  a.set_amax_s(amax_d).set_amax_o(amax_d);
  if (c.padding || c.thd) a.set_padding_mask(true).set_seq_len_q(lens).set_seq_len_kv(lens);
  if (c.score_stats) a.set_logit_max(ssd).set_score_sum_exp(ssd);
  // Packed: token offsets, the multiplier each tensor's row stride.
  const api::TensorDesc offsets(nullptr, api::kInt32, dev, {c.B + 1});
  const std::pair<fs_sdpa_slot_t, int64_t> packed[] = {{FS_SDPA_Q, in.sq[2]}, {FS_SDPA_K, in.sk[2]},
                                                       {FS_SDPA_V, in.sv[2]}, {FS_SDPA_O, in.so[2]},
                                                       {FS_SDPA_STATS, in.sst[2]}};
  if (c.thd) {
    for (const auto& [slot, mult] : packed) a.set_ragged_offset(slot, offsets, mult);
  }
  api::SdpaFwd op(qd, kd, vd, od, &sd, a);
  op.check_support();
  op.compile();
  api::SdpaVariantPack pack;
  pack.set(FS_SDPA_Q, pq).set(FS_SDPA_K, pk).set(FS_SDPA_V, pv).set(FS_SDPA_O, po).set(FS_SDPA_STATS, pst);
  const fs_sdpa_slot_t slots[] = {FS_SDPA_DESCALE_Q, FS_SDPA_DESCALE_K, FS_SDPA_DESCALE_V,
                                  FS_SDPA_DESCALE_S, FS_SDPA_SCALE_S,   FS_SDPA_SCALE_O};
  for (int i = 0; i < 6; ++i) pack.set(slots[i], static_cast<float*>(pfac) + i);
  pack.set(FS_SDPA_AMAX_S, pam).set(FS_SDPA_AMAX_O, static_cast<float*>(pam) + 1);
  if (c.attn_form != 0) pack.set(FS_SDPA_ATTN_SCALE, pattn);
  if (c.padding || c.thd) pack.set(FS_SDPA_SEQ_LEN_Q, plq).set(FS_SDPA_SEQ_LEN_KV, plk);
  if (c.thd) {
    pack.set(FS_SDPA_RAGGED_OFFSET_Q, ptq).set(FS_SDPA_RAGGED_OFFSET_O, ptq).set(FS_SDPA_RAGGED_OFFSET_STATS, ptq);
    pack.set(FS_SDPA_RAGGED_OFFSET_K, ptk).set(FS_SDPA_RAGGED_OFFSET_V, ptk);
  }
  if (c.score_stats) pack.set(FS_SDPA_SCORE_MAX, psm).set(FS_SDPA_SCORE_SUM_EXP, pss);
  const size_t ws_bytes = op.workspace_size();
  std::unique_ptr<DevBuf> ws;
  if (ws_bytes) {
    ws = std::make_unique<DevBuf>(ws_bytes);
    cuda_ok(cudaMemset(ws->p, 0xff, ws_bytes), "poison workspace");
  }
  op.execute(pack, ws ? ws->p : nullptr, ws_bytes, nullptr);
  Outputs out;
  if (cuda) {
    cuda_ok(cudaDeviceSynchronize(), "sdpa fp8 forward (API)");
    auto get = [&](auto& h, void* d) {
      using T = typename std::decay_t<decltype(h)>::value_type;
      cuda_ok(cudaMemcpy(h.data(), d, h.size() * sizeof(T), cudaMemcpyDeviceToHost), "download");
    };
    get(o, po);
    get(stats, pst);
    get(smax, psm);
    get(ssum, pss);
    get(amax, pam);
  }
  out.o = o;
  out.stats = stats;
  out.score_max = smax;
  out.score_sum_exp = ssum;
  out.amax_s = amax[0];
  out.amax_o = amax[1];
  return out;
}

// The FP8 switch forced on for a test (the environment's answer back after it).
struct Fp8SwitchOn {
  Fp8SwitchOn() { set_sdpa_fp8_sm90_enabled(1); }
  ~Fp8SwitchOn() { set_sdpa_fp8_sm90_enabled(-1); }
};

// Random batch, heads (GQA / MQA) and lengths up to max_sq / max_skv.
void random_shape(Fp8Case& c, std::mt19937_64& rng, int max_sq, int max_skv) {
  c.B = 1 + int(rng() % 3);
  c.Hk = 1 + int(rng() % 2);
  c.Hq = c.Hk * (1 + int(rng() % 3));
  c.Sq = 1 + int(rng() % max_sq);
  c.Skv = 1 + int(rng() % max_skv);
}

// Random case n with the FP8 API's options (causal top-left, padding, layouts, o's own format, host
// factors, base-2 stats, score_max / score_sum_exp), head dims (dqk, dv).
Fp8Case api_random_case(int n, std::mt19937_64& rng, int dqk, int dv, int max_sq, int max_skv, uint64_t seed) {
  Fp8Case c;
  c.format = 1 + n % 2;
  c.o_format = n % 3 == 0 ? 3 - c.format : c.format;
  c.seed = seed;
  c.Dqk = dqk;
  c.Dv = dv;
  random_shape(c, rng, max_sq, max_skv);
  c.mask = n % 2 ? kCausalTopLeft : kNoMask;
  c.padding = n % 4 >= 2;
  c.bshd = n % 3 == 1;
  c.host_factors = n % 4 == 1;
  c.stats_log2 = n % 5 == 3;
  c.score_stats = n % 3 == 2;
  return c;
}

std::string launcher_case(const Fp8Case& c) {
  const Inputs in = make_inputs(c);
  return check(c, in, reference_loop(c, in), run_launcher(c, in), true);
}

std::string api_case(const Fp8Case& c) {
  const Inputs in = make_inputs(c);
  const Reference r = reference_loop(c, in);
  return check(c, in, r, run_api(c, in, true), true) + check(c, in, r, run_api(c, in, false), false);
}

TEST(SdpaFp8Gpu, Sm90ForwardRandom) {
  REQUIRE_SM90();
  std::mt19937_64 rng(20261207);
  const int dims[][2] = {{64, 64}, {128, 128}, {32, 32}, {96, 96}, {16, 48}, {128, 64}, {80, 112}};
  const MaskKind masks[] = {kNoMask, kCausalTopLeft, kCausalBottomRight, kWindow};
  int n = 0;
  for (int format = 1; format <= 2; ++format) {
    for (int i = 0; i < 8; ++i, ++n) {
      Fp8Case c;
      c.format = format;
      c.o_format = n % 4 == 3 ? 3 - format : format;
      c.seed = 1000 + uint64_t(n);
      const auto& d = dims[(n + format) % 7];
      c.Dqk = d[0];
      c.Dv = d[1];
      random_shape(c, rng, 300, 400);
      c.mask = masks[i % 4];
      c.padding = (i / 4) % 2 == 1;
      c.bshd = n % 3 == 1;
      c.host_factors = n % 5 == 2;
      c.max_logit = n % 2 == 0;
      c.score_stats = n % 3 == 2;
      const std::string e = launcher_case(c);
      EXPECT_TRUE(e.empty()) << e;
    }
  }
  // Whole tiles, GQA 4, one long sample: several key blocks an item, the running max moving.
  for (int format = 1; format <= 2; ++format) {
    Fp8Case c;
    c.format = c.o_format = format;
    c.Hq = 4;
    c.Sq = 256;
    c.Skv = 768;
    c.Dqk = c.Dv = format == 1 ? 128 : 64;
    c.mask = kCausalBottomRight;
    c.seed = 77 + uint64_t(format);
    const std::string e = launcher_case(c);
    EXPECT_TRUE(e.empty()) << e;
  }
}

TEST(SdpaFp8Gpu, ApiForwardRandom) {
  REQUIRE_SM90();
  const Fp8SwitchOn on;
  std::mt19937_64 rng(7);
  const int dims[][2] = {{128, 128}, {64, 64}, {48, 48}, {112, 112}, {128, 64}};
  for (int n = 0; n < 10; ++n) {
    const Fp8Case c = api_random_case(n, rng, dims[n % 5][0], dims[n % 5][1], 260, 330, 500 + uint64_t(n));
    const std::string e = api_case(c);
    EXPECT_TRUE(e.empty()) << e;
  }
}

// The (H_q, H_k, H_v) of the H_k != H_v tests (forward and backward): H_v a multiple of H_k and the other way
// round, MQA on either side.
constexpr int kHkNeHvHeads[6][3] = {{4, 2, 4}, {4, 4, 2}, {8, 1, 4}, {6, 3, 1}, {8, 2, 8}, {4, 1, 2}};

// H_k != H_v on the FP8 forwards (V addressed by h / group_v: the sm90 one's V^T workspace and the sm80 one's
// bf16 copy of V have H_v heads; passed on an H100 on 2026-12-05): case n takes kHkNeHvHeads[n % 6], on api_random_case's
// options.
Fp8Case hk_ne_hv_case(int n, std::mt19937_64& rng, int dqk, int dv, uint64_t seed) {
  Fp8Case c = api_random_case(n, rng, dqk, dv, 260, 330, seed);
  const int* h = kHkNeHvHeads[n % 6];
  c.Hq = h[0];
  c.Hk = h[1];
  c.Hv = h[2];
  return c;
}

// Packed (THD) q, k, v, o, stats (Fp8Case::thd; the sm90 FP8 forward's experimental form): case n on api_random_case's
// options (o's own format, host or device factors, base-2 stats, attn_scale's forms), B 3 or 4 (sample 1 without keys,
// sample 2 without rows, gaps between the samples), GQA / MQA, both formats with causal and without a mask in turn
// (n % 4), no score_max / score_sum_exp (refused beside a packed o).
Fp8Case thd_case(int n, std::mt19937_64& rng, int dqk, int dv, int max_sq, int max_skv, uint64_t seed) {
  Fp8Case c = api_random_case(n, rng, dqk, dv, max_sq, max_skv, seed);
  c.thd = true;
  c.B = 3 + n % 2;
  c.mask = n % 4 < 2 ? kCausalTopLeft : kNoMask;
  c.padding = c.bshd = c.score_stats = false;
  return c;
}

// The GPU tests' oracle, checked without a GPU: the float64 loop against the CPU reference (the FP8 API on
// host tensors) on the API cases' options.
TEST(SdpaFp8Loop, MatchesTheCpuReference) {
  std::mt19937_64 rng(11);
  for (int n = 0; n < 6; ++n) {
    const Fp8Case c = api_random_case(n, rng, n % 2 ? 64 : 32, n % 3 ? 48 : 32, 90, 140, 900 + uint64_t(n));
    const Inputs in = make_inputs(c);
    const std::string e = check(c, in, reference_loop(c, in), run_api(c, in, false), false);
    EXPECT_TRUE(e.empty()) << e;
  }
  // H_k != H_v (the loop's V head h / (H_q / H_v)), as the HkNeHv GPU tests draw them.
  for (int n = 0; n < 6; ++n) {
    const Fp8Case c = hk_ne_hv_case(n, rng, 32, 48, 950 + uint64_t(n));
    const Inputs in = make_inputs(c);
    const std::string e = check(c, in, reference_loop(c, in), run_api(c, in, false), false);
    EXPECT_TRUE(e.empty()) << e;
  }
  // Packed (THD) tensors, as the THD GPU tests draw them (the loop's packed rows, the reference's packed O and stats
  // at the samples' starts, the gaps left unwritten).
  for (int n = 0; n < 4; ++n) {
    const Fp8Case c = thd_case(n, rng, 32, 48, 90, 140, 970 + uint64_t(n));
    const Inputs in = make_inputs(c);
    const std::string e = check(c, in, reference_loop(c, in), run_api(c, in, false), false);
    EXPECT_TRUE(e.empty()) << e;
  }
}

// Small cases for compute-sanitizer (memcheck / racecheck / synccheck): both kernel head dims and
// formats at the launcher, padding with an empty sample, causal, GQA; one call through the API.
TEST(SdpaFp8Gpu, Sm90ForwardSanitizerSmall) {
  REQUIRE_SM90();
  Fp8Case c;
  c.B = 3;
  c.Hq = 2;
  c.Sq = 70;
  c.Skv = 150;
  c.mask = kCausalBottomRight;
  c.padding = true;
  for (int format = 1; format <= 2; ++format) {
    for (int d : {64, 128}) {
      c.format = c.o_format = format;
      c.Dqk = c.Dv = d;
      c.seed = uint64_t(10 * format + d);
      const std::string e = launcher_case(c);
      EXPECT_TRUE(e.empty()) << e;
    }
  }
  const Fp8SwitchOn on;
  c.mask = kCausalTopLeft;
  c.format = 1;
  c.o_format = 2;
  c.Dqk = c.Dv = 64;
  c.score_stats = true;
  const Inputs in = make_inputs(c);
  const std::string e = check(c, in, reference_loop(c, in), run_api(c, in, true), true);
  EXPECT_TRUE(e.empty()) << e;
  // H_k != H_v (H_q 4, H_k 1, H_v 2: the V^T pre-pass and the producer over V's own heads; not yet run on a GPU).
  Fp8Case h = c;
  h.Hq = 4;
  h.Hk = 1;
  h.Hv = 2;
  h.Dqk = h.Dv = 128;
  h.seed = 4242;
  const std::string eh = launcher_case(h);
  EXPECT_TRUE(eh.empty()) << eh;
}

// H_k != H_v on the FP8 forwards forced on (on by default; FLASHSPAN_SDPA_FP8_HK_NE_HV=0 turns it off).
struct Fp8HkNeHvOn {
  Fp8HkNeHvOn() { set_sdpa_fp8_hk_ne_hv_enabled(1); }
  ~Fp8HkNeHvOn() { set_sdpa_fp8_hk_ne_hv_enabled(-1); }
};

TEST(SdpaFp8Gpu, Sm90ForwardHkNeHv) {
  // At the launcher (half) and through the API (half: the launch counter says the sm90 kernel ran).
  REQUIRE_SM90();
  const Fp8SwitchOn on;
  const Fp8HkNeHvOn hk_ne_hv;
  std::mt19937_64 rng(91);
  const int dims[][2] = {{128, 128}, {64, 64}, {48, 80}, {128, 64}};
  for (int n = 0; n < 12; ++n) {
    const Fp8Case c = hk_ne_hv_case(n, rng, dims[n % 4][0], dims[n % 4][1], 1800 + uint64_t(n));
    const int64_t l0 = sm90::sdpa_fp8_fwd_launches();
    const std::string e = n < 6 ? launcher_case(c) : api_case(c);
    EXPECT_TRUE(e.empty()) << e;
    EXPECT_EQ(sm90::sdpa_fp8_fwd_launches(), l0 + 1) << c.name();
  }
}

// ---------------------------------------------------------------------------
// Packed (THD) q, k, v, o, stats on the sm90 FP8 forward (experimental: sdpa_fp8_sm90_thd_enabled, its own switch,
// FLASHSPAN_EXPERIMENTAL=1; q and k through per-sample tensor maps, v through the V^T pre-pass, o and the stats at the
// samples' starts; written without a GPU, not yet run on one), through the C++ API (thd_case)
// ---------------------------------------------------------------------------

// The sm90 FP8 forward and its packed tensors forced on for a scope (the sm80 FP8 forward left as it is: the launch
// counter says which ran).
struct Fp8Sm90ThdOn {
  Fp8SwitchOn fp8;
  ScopedSwitch thd{set_sdpa_fp8_sm90_thd_enabled, 1};
};

// c through the API on CUDA tensors against the loop (and, cpu_too, the same call on the CPU reference: api_case);
// the sm90 FP8 forward must have run the CUDA call, once.
std::string sm90_api_case(const Fp8Case& c, bool cpu_too) {
  const int64_t l0 = sm90::sdpa_fp8_fwd_launches();
  std::string e;
  if (cpu_too) {
    e = api_case(c);
  } else {
    const Inputs in = make_inputs(c);
    e = check(c, in, reference_loop(c, in), run_api(c, in, true), true);
  }
  if (sm90::sdpa_fp8_fwd_launches() != l0 + 1) e += "  the sm90 FP8 forward did not run " + c.name() + "\n";
  return e;
}

TEST(SdpaFp8Gpu, Sm90ForwardThdExperimental) {
  // 16 packed calls (thd_case: each head-dim pair with both formats, causal and without a mask; o in its own format
  // on some; S up to 300 / 400: several query and key blocks a sample, not multiples of 128) and two long ones
  // (GQA 4 and MQA: walks of up to 8 key blocks, the running max moving), each also on the CPU reference; the
  // gaps between packed samples and past the last one must stay unwritten (check).
  REQUIRE_SM90();
  const Fp8Sm90ThdOn on;
  std::mt19937_64 rng(2027);
  const int dims[][2] = {{64, 64}, {128, 128}, {48, 112}, {128, 64}};
  for (int n = 0; n < 16; ++n) {
    const auto& d = dims[(n / 4) % 4];
    const Fp8Case c = thd_case(n, rng, d[0], d[1], 300, 400, 2100 + uint64_t(n));
    const std::string e = sm90_api_case(c, /*cpu_too=*/true);
    EXPECT_TRUE(e.empty()) << e;
  }
  for (int format = 1; format <= 2; ++format) {
    Fp8Case c;
    c.thd = true;
    c.format = c.o_format = format;
    c.B = 3;
    c.Hq = 4;
    c.Hk = format == 1 ? 1 : 4;
    c.Sq = 600;
    c.Skv = 1000;
    c.Dqk = c.Dv = format == 1 ? 128 : 64;
    c.mask = format == 1 ? kCausalTopLeft : kNoMask;
    c.seed = 2200 + uint64_t(format);
    const std::string e = sm90_api_case(c, /*cpu_too=*/true);
    EXPECT_TRUE(e.empty()) << e;
  }
}

TEST(SdpaFp8Gpu, Sm90ForwardThdSanitizerSmall) {
  // Small packed calls for compute-sanitizer (memcheck, synccheck: scripts/gpu_check.sh): B = 3 with gaps (sample 1
  // without keys, sample 2 without rows), GQA 4:2, (64, 64) E4M3 causal and (128, 128) E5M2 without a mask, o in the
  // other format; the CUDA calls only (the sanitizer's time).
  REQUIRE_SM90();
  const Fp8Sm90ThdOn on;
  Fp8Case c{.B = 3, .Hq = 4, .Hk = 2, .Sq = 70, .Skv = 150, .thd = true};
  for (int format = 1; format <= 2; ++format) {
    c.format = format;
    c.o_format = 3 - format;
    c.Dqk = c.Dv = format == 1 ? 64 : 128;
    c.mask = format == 1 ? kCausalTopLeft : kNoMask;
    c.seed = 2300 + uint64_t(format);
    const std::string e = sm90_api_case(c, /*cpu_too=*/false);
    EXPECT_TRUE(e.empty()) << e;
  }
}

// ---------------------------------------------------------------------------
// The FP8 forward on the sm80 kernels (kernels/sm80/launch_sm80.h launch_sdpa_fp8_fwd_sm80: the sm80 forward's
// loop on bf16 copies of the codes with P's FP8 rounding and O's FP8 store, every GPU from sm_80;
// on by default since these tests passed on an H200, FLASHSPAN_SDPA_FP8_SM80=0 off, dispatch/sdpa_launch.h
// sdpa_fp8_fwd_sm80_enabled, forced on here), through the C++ API against the loop with
// the sm90 kernel's criteria (the same flash quantization of P)
// ---------------------------------------------------------------------------

// The sm80 FP8 forward forced on and, with sm90_off, the sm90 one off (the environment's answers back after).
struct Fp8FwdSm80On {
  explicit Fp8FwdSm80On(bool sm90_off) {
    set_sdpa_fp8_fwd_sm80_enabled(1);
    if (sm90_off) set_sdpa_fp8_sm90_enabled(0);
  }
  ~Fp8FwdSm80On() {
    set_sdpa_fp8_fwd_sm80_enabled(-1);
    set_sdpa_fp8_sm90_enabled(-1);
  }
};

bool sm80_device() {
  int dev = 0, major = 0;
  return cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 8;
}

#define REQUIRE_SM80()                                                                          \
  do {                                                                                          \
    REQUIRE_GPU();                                                                              \
    if (!sm80_device()) GTEST_SKIP() << "not a CUDA device of compute capability 8.0 or newer"; \
  } while (0)

TEST(SdpaFp8Gpu, Sm80ForwardRandom) {
  // The API's options (causal top-left or none, padding with an empty sample, BHSD / BSHD, o's own format,
  // host or device factors, base-2 stats, score_max / score_sum_exp), GQA / MQA, both formats, the sm80
  // forward's head dims (the FP8 API's multiples of 16: up to 128, (192, 128), (256, 256)), the sm90 FP8 forward off.
  REQUIRE_SM80();
  const Fp8FwdSm80On on(/*sm90_off=*/true);
  std::mt19937_64 rng(81);
  const int dims[][2] = {{128, 128}, {64, 64}, {48, 48}, {16, 32}, {96, 128}, {192, 128}, {256, 256}, {128, 64}};
  for (int n = 0; n < 24; ++n) {
    const Fp8Case c = api_random_case(n, rng, dims[n % 8][0], dims[n % 8][1], 260, 330, 1500 + uint64_t(n));
    const Inputs in = make_inputs(c);
    const std::string e = check(c, in, reference_loop(c, in), run_api(c, in, true), true);
    EXPECT_TRUE(e.empty()) << e;
  }
  // Whole tiles, GQA 4, one long sample: several key blocks a cell, the running max moving.
  for (int format = 1; format <= 2; ++format) {
    Fp8Case c;
    c.format = c.o_format = format;
    c.Hq = 4;
    c.Sq = 256;
    c.Skv = 768;
    c.Dqk = c.Dv = format == 1 ? 128 : 64;
    c.mask = kCausalTopLeft;
    c.seed = 1600 + uint64_t(format);
    const Inputs in = make_inputs(c);
    const std::string e = check(c, in, reference_loop(c, in), run_api(c, in, true), true);
    EXPECT_TRUE(e.empty()) << e;
  }
}

TEST(SdpaFp8Gpu, Sm80ForwardTakesWhatSm90Refuses) {
  // On an H100 / H200 with both on: head dims the sm90 FP8 forward does not run go to the sm80 one.
  REQUIRE_SM90();
  const Fp8FwdSm80On on(/*sm90_off=*/false);
  std::mt19937_64 rng(82);
  const int dims[][2] = {{192, 128}, {256, 256}};
  for (int n = 0; n < 6; ++n) {
    const Fp8Case c = api_random_case(n, rng, dims[n % 2][0], dims[n % 2][1], 200, 240, 1700 + uint64_t(n));
    const Inputs in = make_inputs(c);
    const std::string e = check(c, in, reference_loop(c, in), run_api(c, in, true), true);
    EXPECT_TRUE(e.empty()) << e;
  }
}

TEST(SdpaFp8Gpu, Sm80ForwardHkNeHv) {
  // The sm90 FP8 forward off; (192, 128) and (256, 256) among the dims.
  REQUIRE_SM80();
  const Fp8FwdSm80On on(/*sm90_off=*/true);
  const Fp8HkNeHvOn hk_ne_hv;
  std::mt19937_64 rng(92);
  const int dims[][2] = {{128, 128}, {64, 64}, {192, 128}, {256, 256}, {32, 96}, {128, 64}};
  for (int n = 0; n < 12; ++n) {
    const Fp8Case c = hk_ne_hv_case(n, rng, dims[n % 6][0], dims[n % 6][1], 1900 + uint64_t(n));
    const Inputs in = make_inputs(c);
    const std::string e = check(c, in, reference_loop(c, in), run_api(c, in, true), true);
    EXPECT_TRUE(e.empty()) << e;
  }
}

TEST(SdpaFp8Gpu, Sm80ForwardSanitizerSmall) {
  // Small cases for compute-sanitizer (scripts/gpu_check.sh memcheck): padding with an empty sample,
  // causal, GQA, both formats, a (64, 64) and a (192, 128) call, o in the other format.
  REQUIRE_SM80();
  const Fp8FwdSm80On on(/*sm90_off=*/true);
  Fp8Case c;
  c.B = 3;
  c.Hq = 4;
  c.Hk = 2;
  c.Sq = 70;
  c.Skv = 150;
  c.mask = kCausalTopLeft;
  c.padding = true;
  c.score_stats = true;
  for (int format = 1; format <= 2; ++format) {
    c.format = format;
    c.o_format = 3 - format;
    c.Dqk = format == 1 ? 64 : 192;
    c.Dv = format == 1 ? 64 : 128;
    c.seed = 1800 + uint64_t(format);
    const Inputs in = make_inputs(c);
    const std::string e = check(c, in, reference_loop(c, in), run_api(c, in, true), true);
    EXPECT_TRUE(e.empty()) << e;
  }
}

// ---------------------------------------------------------------------------
// The FP8 backward (kernels/sm80/launch_sm80.h launch_sdpa_fp8_bwd_sm80: the sm80 backward on bf16 copies of
// the codes, every GPU from sm_80; on by default, FLASHSPAN_SDPA_FP8_BWD=0 off, dispatch/sdpa_launch.h
// sdpa_fp8_bwd_enabled)
// ---------------------------------------------------------------------------

// The backward's 12 scale factors, in the variant pack's slots' order below.
enum BwdFactor {
  kBDescaleQ, kBDescaleK, kBDescaleV, kBDescaleO, kBDescaleDO, kBDescaleS, kBDescaleDP,
  kBScaleS, kBScaleDQ, kBScaleDK, kBScaleDV, kBScaleDP, kNumBwdFactors
};
constexpr fs_sdpa_slot_t kBwdFactorSlots[kNumBwdFactors] = {
    FS_SDPA_DESCALE_Q, FS_SDPA_DESCALE_K, FS_SDPA_DESCALE_V, FS_SDPA_DESCALE_O, FS_SDPA_DESCALE_DO, FS_SDPA_DESCALE_S,
    FS_SDPA_DESCALE_DP, FS_SDPA_SCALE_S, FS_SDPA_SCALE_DQ, FS_SDPA_SCALE_DK, FS_SDPA_SCALE_DV, FS_SDPA_SCALE_DP};
constexpr fs_sdpa_slot_t kBwdAmaxSlots[4] = {FS_SDPA_AMAX_DQ, FS_SDPA_AMAX_DK, FS_SDPA_AMAX_DV, FS_SDPA_AMAX_DP};
const char* const kGradName[3] = {"dQ", "dK", "dV"};
const char* const kAmaxName[4] = {"amax_dQ", "amax_dK", "amax_dV", "amax_dP"};

// Memory behind the [B, H, S, D] descriptors: BHSD, BSHD, BHSD with 8 elements of padding after each row
// (strides the sm90 FP8 forward refuses; the backward's pre-pass and stores take them), or BHSD with one
// element after each row (row stride D + 1, odd) starting one byte past the allocation: every row of q, k, v,
// o, dO, dQ, dK, dV but none of the first ones at an address the 16-bit kernels' vector accesses would refuse
// (the FP8 backward has no alignment rule: it reads and writes its FP8 tensors a byte at a time).
enum BwdLayout { kBwdBhsd, kBwdBshd, kBwdPaddedRows, kBwdOddRows };

std::array<int64_t, 4> bwd_strides(int H, int S, int D, BwdLayout l) {
  if (l == kBwdBshd) return strides_of(H, S, D, true);
  const int64_t row = D + (l == kBwdPaddedRows ? 8 : l == kBwdOddRows ? 1 : 0);
  return {int64_t(H) * S * row, int64_t(S) * row, row, 1};
}

struct BwdCase {
  int format = 1, o_format = 1, do_format = 1, grad_format = 1;  // q / k / v (and S8), o, dO (and dP8), dQ / dK / dV
  int B = 1, Hq = 1, Hk = 1, Sq = 1, Skv = 1, Dqk = 64, Dv = 64;
  int Hv = 0;  // V's heads (0: H_k's; else dividing H_q: H_k != H_v)
  bool causal = false;
  BwdLayout layout = kBwdBhsd;
  bool host_factors = false;  // the 12 factors in host memory (else device memory)
  int attn_tensor = 0;        // attn_scale 0 a float, 1 a host tensor, 2 a tensor in q's memory
  bool deterministic = false; // use_deterministic_algorithm (the ordered dQ kernel with the FP8 steps)
  // scale_dP and scale_dQ / dK / dV from the reference's amaxes: 0 Transformer Engine's recipe (fmax / amax
  // rounded down to a power of two), 1 0.7 fmax / amax (not a power of two), 2 over-scaled (1.5x for dP,
  // 2x for the gradients: the largest values saturate).
  int recipe = 0;
  uint64_t seed = 1;
  int heads_v() const { return Hv > 0 ? Hv : Hk; }
  std::string name() const {
    auto fmt = [](int f) { return f == 2 ? "e5m2" : "e4m3"; };
    std::ostringstream os;
    os << "bwd " << fmt(format) << " o " << fmt(o_format) << " dO " << fmt(do_format) << " grad " << fmt(grad_format)
       << " B" << B << " Hq" << Hq << " Hk" << Hk << " Hv" << heads_v() << " Sq" << Sq << " Skv" << Skv << " D" << Dqk
       << "/" << Dv
       << (causal ? " causal" : " no-mask")
       << (layout == kBwdBshd         ? " bshd"
           : layout == kBwdPaddedRows ? " padded"
           : layout == kBwdOddRows    ? " odd-rows"
                                      : " bhsd")
       << (host_factors ? " host-factors" : "") << (attn_tensor == 1 ? " attn-host-tensor" : attn_tensor == 2 ? " attn-tensor" : "")
       << (deterministic ? " deterministic" : "") << " recipe" << recipe
       << " seed" << seed;
    return os.str();
  }
};

// One backward call's inputs: FP8 codes in their strided buffers (padding NaN codes, 0x7F: read, they would
// poison the results), the forward's stats, the factors.
struct BwdInputs {
  std::array<int64_t, 4> sq, sk, sv, so;  // strides of q and dQ, k and dK, v and dV, o and dO
  size_t nq = 0, nk = 0, nv = 0, no = 0;  // buffer elements
  std::vector<uint8_t> q, k, v, o, dO;
  std::vector<float> stats;  // [B, H_q, S_q] natural-log LSE, contiguous
  float attn_scale = 1.0f;
  std::array<float, kNumBwdFactors> factor{};
};

// The float64 loop's results. y: dX scale_dX before the FP8 rounding (stored units) at each element's
// offset in its buffer (NaN in the padding); a: the bound on the kernel's distance from y before the
// rounding (below); amax and [amax_lo, amax_hi] the interval the kernel's fp32 amax may take (real units).
struct BwdReference {
  std::array<std::vector<double>, 3> y, a;  // dQ, dK, dV
  std::array<double, 4> amax{}, amax_lo{}, amax_hi{};  // dQ, dK, dV, dP
};

struct BwdProblem {
  BwdInputs in;
  BwdReference ref;
};

// The spacing of a format's values at |x| (its subnormal step below the smallest normal, its top binade's
// spacing from the largest value up).
double fp8_step(const Fp8Fmt& f, double ax) {
  if (!(ax > 0)) return 2.0 * f.h;
  int e = 0;
  std::frexp(std::min(ax, f.max), &e);  // 2^(e - 1) <= ax < 2^e
  return std::max(2.0 * f.h, 2.0 * f.u * std::ldexp(1.0, e - 1));
}

// The error model of the kernel's fp32 arithmetic (the bound of the criterion; file comment):
constexpr double kModelSafety = 2.0;  // K: every bound below times 2
double fp32_sum_bound(int64_t terms) { return double(terms + 16) * std::ldexp(1.0, -22); }  // gamma(n)

// Inputs, forward (o and stats from the float64 forward of the same definitions), scales and the reference.
BwdProblem make_bwd(const BwdCase& c) {
  const Fp8Fmt f = fmt_of(c.format), fo = fmt_of(c.o_format), fd = fmt_of(c.do_format), fg = fmt_of(c.grad_format);
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<double> uni(-1.0, 1.0);
  BwdProblem pr;
  BwdInputs& in = pr.in;
  BwdReference& r = pr.ref;
  const int B = c.B, Hq = c.Hq, Hk = c.Hk, Hv = c.heads_v(), Sq = c.Sq, Skv = c.Skv, Dqk = c.Dqk, Dv = c.Dv;
  const int G = c.Hq / c.Hk, Gv = c.Hq / Hv;  // query heads of a K head, of a V head
  in.sq = bwd_strides(Hq, Sq, Dqk, c.layout);
  in.sk = bwd_strides(Hk, Skv, Dqk, c.layout);
  in.sv = bwd_strides(Hv, Skv, Dv, c.layout);
  in.so = bwd_strides(Hq, Sq, Dv, c.layout);
  in.nq = size_t(B) * in.sq[0];
  in.nk = size_t(B) * in.sk[0];
  in.nv = size_t(B) * in.sv[0];
  in.no = size_t(B) * in.so[0];
  auto at = [](const std::array<int64_t, 4>& st, int b, int h, int s, int d) {
    return size_t(b * st[0] + h * st[1] + s * st[2] + d);
  };
  // Raw codes over a quarter of the format's range, a few outliers 4x (as the forward's make_inputs).
  auto fill = [&](std::vector<uint8_t>& t, size_t n, const std::array<int64_t, 4>& st, int H, int S, int D,
                  const Fp8Fmt& ff) {
    t.assign(n, 0x7f);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int s = 0; s < S; ++s)
          for (int d = 0; d < D; ++d) {
            t[at(st, b, h, s, d)] = ff.encode(0.25 * ff.max * uni(rng) * (uni(rng) > 0.98 ? 4.0 : 1.0));
          }
  };
  fill(in.q, in.nq, in.sq, Hq, Sq, Dqk, f);
  fill(in.k, in.nk, in.sk, Hk, Skv, Dqk, f);
  fill(in.v, in.nv, in.sv, Hv, Skv, Dv, f);
  fill(in.dO, in.no, in.so, Hq, Sq, Dv, fd);
  // Descales bringing the raw values to amplitude ~1: powers of two (even seeds) or not.
  const bool pow2 = c.seed % 2 == 0;
  auto descale_for = [&](const Fp8Fmt& ff, double m) {
    const double d = 4.0 / ff.max * m;
    return float(pow2 ? std::exp2(std::round(std::log2(d))) : d);
  };
  std::array<float, kNumBwdFactors>& fac = in.factor;
  fac[kBDescaleQ] = descale_for(f, 1.1);
  fac[kBDescaleK] = descale_for(f, 0.9);
  fac[kBDescaleV] = descale_for(f, 1.0);
  fac[kBDescaleDO] = descale_for(fd, 1.3);
  fac[kBScaleS] = float(c.seed % 3 == 0 ? f.max : c.seed % 3 == 1 ? 0.75 * f.max : 0.5 * f.max);
  fac[kBDescaleS] = 1.0f / fac[kBScaleS];
  const float scale_o = float(fo.max / 8.0 * (pow2 ? 1.0 : 0.9));
  fac[kBDescaleO] = 1.0f / scale_o;
  in.attn_scale = float(2.5 / std::sqrt(double(Dqk)));
  auto decoded = [](const std::vector<uint8_t>& t, const Fp8Fmt& ff) {
    std::vector<double> x(t.size());
    for (size_t i = 0; i < t.size(); ++i) x[i] = ff.decode(t[i]);
    return x;
  };
  const std::vector<double> qd = decoded(in.q, f), kd = decoded(in.k, f), vd = decoded(in.v, f),
                            dod = decoded(in.dO, fd);
  const double attn = in.attn_scale, scale_s = fac[kBScaleS], descale_s = fac[kBDescaleS];
  const double c_s = attn * double(fac[kBDescaleQ]) * double(fac[kBDescaleK]);
  auto visible = [&](int i) { return c.causal ? std::min(i + 1, Skv) : Skv; };  // keys [0, visible(i))
  const size_t nrow = size_t(B) * Hq * Sq;
  auto cell = [&](int b, int h, int i) { return ((size_t(b) * Hq + h) * Sq + i) * Skv; };
  // The scores x (and es, the bound of their fp32 error: gamma(D) times the sum of |terms|) for both passes.
  std::vector<double> x(nrow * Skv, 0.0), es(nrow * Skv, 0.0);
  // Forward: stats (fp32 LSE) and o = fp8_o(O scale_o), O = (S8 v) descale_s descale_v.
  in.stats.assign(nrow, NAN);
  in.o.assign(in.no, 0x7f);
  std::vector<double> s8f(Skv);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < Hq; ++h) {
      const int hk = h / G, hv = h / Gv;
      for (int i = 0; i < Sq; ++i) {
        const size_t base = cell(b, h, i);
        double m = -INFINITY;
        for (int j = 0; j < visible(i); ++j) {
          double acc = 0.0, mag = 0.0;
          for (int d = 0; d < Dqk; ++d) {
            const double t = qd[at(in.sq, b, h, i, d)] * kd[at(in.sk, b, hk, j, d)];
            acc += t;
            mag += std::fabs(t);
          }
          x[base + j] = c_s * acc;
          es[base + j] = std::fabs(c_s) * fp32_sum_bound(Dqk) * mag;
          m = std::max(m, x[base + j]);
        }
        double l = 0.0;
        for (int j = 0; j < visible(i); ++j) l += std::exp(x[base + j] - m);
        const double lse = m + std::log(l);
        in.stats[(size_t(b) * Hq + h) * Sq + i] = float(lse);
        for (int j = 0; j < visible(i); ++j) s8f[j] = f.round(std::exp(x[base + j] - lse) * scale_s);
        for (int e = 0; e < Dv; ++e) {
          double acc = 0.0;
          for (int j = 0; j < visible(i); ++j) acc += s8f[j] * vd[at(in.sv, b, hv, j, e)];
          in.o[at(in.so, b, h, i, e)] = fo.encode(acc * descale_s * fac[kBDescaleV] * scale_o);
        }
      }
    }
  }
  const std::vector<double> od = decoded(in.o, fo);
  // Backward, pass 1: P, dP and the bounds eP, edP of the kernel's fp32 values of them.
  //   P = exp(x - stats): |dP/P| <= dx = es + (|x| + |stats|) 2^-21 (the exp2 argument's roundings) + 2^-20
  //   (exp2's approximation); D = descale_dO descale_o dO.o and dS = descale_dO descale_v dO.v within gamma(D_v)
  //   sum |terms| + 2^-22 |value|; dP = attn_scale P (dS - D) within attn_scale (P dx |dS - D| + P (e_dS + e_D))
  //   + 2^-22 |dP|; each times kModelSafety.
  const double c_ds = double(fac[kBDescaleDO]) * double(fac[kBDescaleV]);
  const double c_d = double(fac[kBDescaleDO]) * double(fac[kBDescaleO]);
  std::vector<double> P(nrow * Skv, 0.0), eP(nrow * Skv, 0.0), dP(nrow * Skv, 0.0), edP(nrow * Skv, 0.0);
  double amax_dp = 0.0, amax_dp_lo = 0.0, amax_dp_hi = 0.0;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < Hq; ++h) {
      const int hv = h / Gv;
      for (int i = 0; i < Sq; ++i) {
        const size_t base = cell(b, h, i);
        const double lse = in.stats[(size_t(b) * Hq + h) * Sq + i];
        double dsum = 0.0, dmag = 0.0;
        for (int e = 0; e < Dv; ++e) {
          const double t = dod[at(in.so, b, h, i, e)] * od[at(in.so, b, h, i, e)];
          dsum += t;
          dmag += std::fabs(t);
        }
        const double D = c_d * dsum;
        const double eD = std::fabs(c_d) * fp32_sum_bound(Dv) * dmag + std::fabs(D) * std::ldexp(1.0, -22);
        for (int j = 0; j < visible(i); ++j) {
          double acc = 0.0, mag = 0.0;
          for (int e = 0; e < Dv; ++e) {
            const double t = dod[at(in.so, b, h, i, e)] * vd[at(in.sv, b, hv, j, e)];
            acc += t;
            mag += std::fabs(t);
          }
          const double dS = c_ds * acc;
          const double edS = std::fabs(c_ds) * fp32_sum_bound(Dv) * mag + std::fabs(dS) * std::ldexp(1.0, -22);
          const double p = std::exp(x[base + j] - lse);
          const double dx = es[base + j] + (std::fabs(x[base + j]) + std::fabs(lse)) * std::ldexp(1.0, -21) +
                            std::ldexp(1.0, -20);
          const double g = attn * p * (dS - D);
          P[base + j] = p;
          eP[base + j] = kModelSafety * p * dx;
          dP[base + j] = g;
          edP[base + j] = kModelSafety * (std::fabs(attn) * (p * dx * std::fabs(dS - D) + p * (edS + eD)) +
                                          std::fabs(g) * std::ldexp(1.0, -22));
          amax_dp = std::max(amax_dp, std::fabs(g));
          amax_dp_lo = std::max(amax_dp_lo, std::fabs(g) - edP[base + j]);
          amax_dp_hi = std::max(amax_dp_hi, std::fabs(g) + edP[base + j]);
        }
      }
    }
  }
  auto scale_for = [&](double fmax, double amax, double over) {
    if (!(amax > 0)) return 1.0f;
    const double s = fmax / amax;
    return float(c.recipe == 0 ? std::exp2(std::floor(std::log2(s))) : c.recipe == 1 ? 0.7 * s : over * s);
  };
  fac[kBScaleDP] = scale_for(fd.max, amax_dp, 1.5);
  fac[kBDescaleDP] = 1.0f / fac[kBScaleDP];
  r.amax[3] = amax_dp;
  r.amax_lo[3] = amax_dp_lo;
  r.amax_hi[3] = amax_dp_hi;
  // Pass 2: the quantized operands S8 = fp8_q(P scale_s) and dP8 = fp8_dO(dP scale_dP) (stored units), in
  // place of P and dP, and in place of eP, edP the spans of the codes the kernel's value may round to
  // (0 unless the value lies within its bound of a rounding boundary of the format).
  const double scale_dp = fac[kBScaleDP];
  for (size_t t = 0; t < P.size(); ++t) {
    const double sv = P[t] * scale_s, esv = eP[t] * scale_s + sv * std::ldexp(1.0, -21);
    P[t] = f.round(sv);
    eP[t] = f.round(sv + esv) - f.round(sv - esv);
    const double pv = dP[t] * scale_dp, epv = edP[t] * std::fabs(scale_dp) + std::fabs(pv) * std::ldexp(1.0, -21);
    dP[t] = fd.round(pv);
    edP[t] = fd.round(pv + epv) - fd.round(pv - epv);
  }
  // The gradients (real units) and their bounds: a = unit (sum of span |operand| + gamma(n) sum |terms|).
  const double u_dq = double(fac[kBDescaleDP]) * double(fac[kBDescaleK]);
  const double u_dk = double(fac[kBDescaleDP]) * double(fac[kBDescaleQ]);
  const double u_dv = double(fac[kBDescaleS]) * double(fac[kBDescaleDO]);
  std::array<std::vector<double>, 3> val, bnd;
  val[0].assign(in.nq, NAN);
  val[1].assign(in.nk, NAN);
  val[2].assign(in.nv, NAN);
  for (int t = 0; t < 3; ++t) bnd[t].assign(val[t].size(), NAN);
  std::vector<double> acc, spn, mag;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < Hq; ++h) {
      const int hk = h / G;
      for (int i = 0; i < Sq; ++i) {
        const size_t base = cell(b, h, i);
        acc.assign(Dqk, 0.0);
        spn.assign(Dqk, 0.0);
        mag.assign(Dqk, 0.0);
        for (int j = 0; j < visible(i); ++j) {
          for (int d = 0; d < Dqk; ++d) {
            const double kv = kd[at(in.sk, b, hk, j, d)];
            acc[d] += dP[base + j] * kv;
            spn[d] += edP[base + j] * std::fabs(kv);
            mag[d] += std::fabs(dP[base + j] * kv);
          }
        }
        for (int d = 0; d < Dqk; ++d) {
          val[0][at(in.sq, b, h, i, d)] = u_dq * acc[d];
          bnd[0][at(in.sq, b, h, i, d)] = std::fabs(u_dq) * (spn[d] + fp32_sum_bound(Skv) * mag[d]);
        }
      }
    }
    // dK of each K head (its G query heads), dV of each V head (its Gv query heads).
    for (int t = 1; t < 3; ++t) {
      const int heads = t == 1 ? Hk : Hv, group = t == 1 ? G : Gv;
      for (int hk = 0; hk < heads; ++hk) {
        for (int j = 0; j < Skv; ++j) {
          const int D = t == 1 ? Dqk : Dv;
          acc.assign(D, 0.0);
          spn.assign(D, 0.0);
          mag.assign(D, 0.0);
          for (int h = hk * group; h < (hk + 1) * group; ++h) {
            for (int i = 0; i < Sq; ++i) {
              if (j >= visible(i)) continue;
              const size_t cij = cell(b, h, i) + j;
              const double w = t == 1 ? dP[cij] : P[cij], sw = t == 1 ? edP[cij] : eP[cij];
              for (int d = 0; d < D; ++d) {
                const double xv = t == 1 ? qd[at(in.sq, b, h, i, d)] : dod[at(in.so, b, h, i, d)];
                acc[d] += w * xv;
                spn[d] += sw * std::fabs(xv);
                mag[d] += std::fabs(w * xv);
              }
            }
          }
          const double u = t == 1 ? u_dk : u_dv;
          const std::array<int64_t, 4>& st = t == 1 ? in.sk : in.sv;
          for (int d = 0; d < D; ++d) {
            val[t][at(st, b, hk, j, d)] = u * acc[d];
            bnd[t][at(st, b, hk, j, d)] = std::fabs(u) * (spn[d] + fp32_sum_bound(int64_t(group) * Sq) * mag[d]);
          }
        }
      }
    }
  }
  // amax of each gradient (real units), its scale by the recipe, y = dX scale_dX and a (stored units).
  const BwdFactor scale_slot[3] = {kBScaleDQ, kBScaleDK, kBScaleDV};
  for (int t = 0; t < 3; ++t) {
    double am = 0.0, lo = 0.0, hi = 0.0;
    for (size_t e = 0; e < val[t].size(); ++e) {
      if (std::isnan(val[t][e])) continue;
      am = std::max(am, std::fabs(val[t][e]));
      lo = std::max(lo, std::fabs(val[t][e]) - bnd[t][e]);
      hi = std::max(hi, std::fabs(val[t][e]) + bnd[t][e]);
    }
    r.amax[t] = am;
    r.amax_lo[t] = lo;
    r.amax_hi[t] = hi;
    fac[scale_slot[t]] = scale_for(fg.max, am, 2.0);
    const double sc = fac[scale_slot[t]];
    r.y[t].assign(val[t].size(), NAN);
    r.a[t].assign(val[t].size(), NAN);
    for (size_t e = 0; e < val[t].size(); ++e) {
      if (std::isnan(val[t][e])) continue;
      r.y[t][e] = val[t][e] * sc;
      r.a[t][e] = bnd[t][e] * std::fabs(sc) + std::fabs(r.y[t][e]) * std::ldexp(1.0, -22);
    }
  }
  return pr;
}

// What a backward gives back: the dQ, dK, dV buffers (padding included) and the four amaxes; with the odd-rows
// layout (its tensors start one byte into their allocations) whether the byte before each gradient was written.
struct BwdOutputs {
  std::array<std::vector<uint8_t>, 3> g;
  std::array<float, 4> amax{};
  std::array<bool, 3> before_written{};
};

// The criterion (file comment) of a run against the reference.
std::string check_bwd(const BwdCase& c, const BwdProblem& pr, const BwdOutputs& out, const std::string& who) {
  const Fp8Fmt fg = fmt_of(c.grad_format);
  const BwdReference& r = pr.ref;
  std::ostringstream fails;
  for (int t = 0; t < 3; ++t) {
    int64_t n = 0, bad = 0, outside = 0, pad_written = 0;
    for (size_t e = 0; e < r.y[t].size(); ++e) {
      const uint8_t code = out.g[t][e];
      if (std::isnan(r.y[t][e])) {  // padding: never written
        if (code != 0x7f) ++pad_written;
        continue;
      }
      ++n;
      const double got = fg.decode(code), y = r.y[t][e], a = r.a[t][e];
      const double yc = std::clamp(y, -fg.max, fg.max);
      const double tol = 1.01 * (a + fp8_step(fg, std::fabs(yc) + a));
      if (!(std::fabs(got - yc) <= tol) && bad++ < 5) {
        fails << "  " << kGradName[t] << "[" << e << "] = " << got << " (code 0x" << std::hex << int(code) << std::dec
              << "), reference " << y << " (bound " << tol << ")\n";
      }
      if (!(got >= fg.round(y - a) && got <= fg.round(y + a))) ++outside;
    }
    if (bad) fails << "  " << bad << " of " << n << " elements of " << kGradName[t] << " out of bounds\n";
    if (outside > n / 100 + 2) {
      fails << "  " << kGradName[t] << ": " << outside << " of " << n
            << " codes are not the rounding of the reference within the model (at most 1 % + 2)\n";
    }
    if (pad_written) fails << "  " << kGradName[t] << ": " << pad_written << " padding bytes written\n";
    if (out.before_written[t]) fails << "  " << kGradName[t] << ": the byte before its first element written\n";
  }
  for (int t = 0; t < 4; ++t) {
    const double lo = r.amax_lo[t] * (1.0 - std::ldexp(1.0, -20)), hi = r.amax_hi[t] * (1.0 + std::ldexp(1.0, -20));
    if (!(out.amax[t] >= lo && out.amax[t] <= hi)) {
      fails << "  " << kAmaxName[t] << " = " << out.amax[t] << ", reference " << r.amax[t] << " (interval [" << lo
            << ", " << hi << "])\n";
    }
  }
  const std::string s = fails.str();
  return s.empty() ? s : who + " " + c.name() + ":\n" + s;
}

// The call through the C++ API: on CUDA tensors (the FP8 backward on the sm80 kernels) or, cuda = false, on host
// tensors (the CPU reference). Outputs poisoned with NaN codes (0x7F), the amaxes with amax_poison bytes
// (0x7F: 3.4e38, a maximum that never zeroes stays; 0xFF: NaN), the workspace with 0xFF. The odd-rows layout's
// FP8 tensors start one byte into their allocations (the byte before them 0x7F, checked unwritten).
BwdOutputs run_bwd_api(const BwdCase& c, const BwdInputs& in, bool cuda, uint8_t amax_poison = 0x7f) {
  const fs_device_t dev = cuda ? api::Device::cuda(0) : api::Device::cpu();
  const fs_device_t fac_dev = cuda && !c.host_factors ? api::Device::cuda(0) : api::Device::cpu();
  const size_t lead = c.layout == kBwdOddRows ? 1 : 0;  // bytes before each FP8 tensor's first element
  // The FP8 buffers with `lead` bytes of 0x7F before them (their pointers are data() + lead).
  auto shifted = [&](const std::vector<uint8_t>& t) {
    std::vector<uint8_t> b(lead + t.size(), 0x7f);
    std::copy(t.begin(), t.end(), b.begin() + ptrdiff_t(lead));
    return b;
  };
  std::vector<uint8_t> q = shifted(in.q), k = shifted(in.k), v = shifted(in.v), o = shifted(in.o), dO = shifted(in.dO);
  std::vector<uint8_t> dq(lead + in.nq, 0x7f), dk(lead + in.nk, 0x7f), dv(lead + in.nv, 0x7f);
  std::vector<float> stats = in.stats, amax(4);
  std::memset(amax.data(), amax_poison, amax.size() * sizeof(float));
  std::vector<float> fac(in.factor.begin(), in.factor.end());
  std::vector<float> attn{in.attn_scale};
  std::vector<std::unique_ptr<DevBuf>> bufs;
  auto place = [&](auto& h) -> void* {
    using T = typename std::decay_t<decltype(h)>::value_type;
    if (!cuda) return h.data();
    bufs.push_back(std::make_unique<DevBuf>(std::max<size_t>(h.size() * sizeof(T), 16)));
    cuda_ok(cudaMemcpy(bufs.back()->p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
    return bufs.back()->p;
  };
  auto place8 = [&](std::vector<uint8_t>& h) -> void* { return static_cast<uint8_t*>(place(h)) + lead; };
  void *pq = place8(q), *pk = place8(k), *pv = place8(v), *po = place8(o), *pdo = place8(dO), *pst = place(stats);
  void *pdq = place8(dq), *pdk = place8(dk), *pdv = place8(dv), *pam = place(amax);
  void* pfac = c.host_factors ? fac.data() : place(fac);
  void* pattn = c.attn_tensor == 2 ? place(attn) : attn.data();
  auto desc = [&](int code, int H, int S, int D, const std::array<int64_t, 4>& st) {
    return api::TensorDesc(nullptr, api_dtype(code), dev, {c.B, H, S, D}, {st[0], st[1], st[2], st[3]});
  };
  const api::TensorDesc qd = desc(c.format, c.Hq, c.Sq, c.Dqk, in.sq), kd = desc(c.format, c.Hk, c.Skv, c.Dqk, in.sk);
  const api::TensorDesc vd = desc(c.format, c.heads_v(), c.Skv, c.Dv, in.sv), od = desc(c.o_format, c.Hq, c.Sq, c.Dv, in.so);
  const api::TensorDesc dod = desc(c.do_format, c.Hq, c.Sq, c.Dv, in.so);
  const api::TensorDesc dqd = desc(c.grad_format, c.Hq, c.Sq, c.Dqk, in.sq);
  const api::TensorDesc dkd = desc(c.grad_format, c.Hk, c.Skv, c.Dqk, in.sk);
  const api::TensorDesc dvd = desc(c.grad_format, c.heads_v(), c.Skv, c.Dv, in.sv);
  const api::TensorDesc sd(nullptr, api::kFloat32, dev, {c.B, c.Hq, c.Sq, 1});
  const api::TensorDesc one(nullptr, api::kFloat32, fac_dev, {1, 1, 1, 1});
  const api::TensorDesc amax_d(nullptr, api::kFloat32, dev, {1, 1, 1, 1});
  api::SdpaBackwardAttributes a;
  a.set_causal_mask(c.causal).set_deterministic_algorithm(c.deterministic);
  if (c.attn_tensor != 0) {
    a.set_attn_scale(api::TensorDesc(nullptr, api::kFloat32, c.attn_tensor == 2 ? dev : api::Device::cpu(), {1}));
  } else {
    a.set_attn_scale(in.attn_scale);
  }
  a.set_descale_q(one).set_descale_k(one).set_descale_v(one).set_descale_o(one).set_descale_dO(one);
  a.set_descale_s(one).set_descale_dP(one).set_scale_s(one).set_scale_dQ(one).set_scale_dK(one);
  a.set_scale_dV(one).set_scale_dP(one);
  a.set_amax_dQ(amax_d).set_amax_dK(amax_d).set_amax_dV(amax_d).set_amax_dP(amax_d);
  api::SdpaBwd op(qd, kd, vd, od, dod, sd, dqd, dkd, dvd, a);
  op.check_support();
  op.compile();
  api::SdpaVariantPack pack;
  pack.set(FS_SDPA_Q, pq).set(FS_SDPA_K, pk).set(FS_SDPA_V, pv).set(FS_SDPA_O, po).set(FS_SDPA_DO, pdo);
  pack.set(FS_SDPA_STATS, pst).set(FS_SDPA_DQ, pdq).set(FS_SDPA_DK, pdk).set(FS_SDPA_DV, pdv);
  for (int i = 0; i < kNumBwdFactors; ++i) pack.set(kBwdFactorSlots[i], static_cast<float*>(pfac) + i);
  for (int i = 0; i < 4; ++i) pack.set(kBwdAmaxSlots[i], static_cast<float*>(pam) + i);
  if (c.attn_tensor != 0) pack.set(FS_SDPA_ATTN_SCALE, pattn);
  const size_t ws_bytes = op.workspace_size();
  std::unique_ptr<DevBuf> ws;
  if (ws_bytes) {
    ws = std::make_unique<DevBuf>(ws_bytes);
    cuda_ok(cudaMemset(ws->p, 0xff, ws_bytes), "poison workspace");
  }
  op.execute(pack, ws ? ws->p : nullptr, ws_bytes, nullptr);
  if (cuda) {
    cuda_ok(cudaDeviceSynchronize(), "sdpa fp8 backward (API)");
    auto get = [&](auto& h, void* d) {
      using T = typename std::decay_t<decltype(h)>::value_type;
      cuda_ok(cudaMemcpy(h.data(), d, h.size() * sizeof(T), cudaMemcpyDeviceToHost), "download");
    };
    get(dq, static_cast<uint8_t*>(pdq) - lead);
    get(dk, static_cast<uint8_t*>(pdk) - lead);
    get(dv, static_cast<uint8_t*>(pdv) - lead);
    get(amax, pam);
  }
  BwdOutputs out;
  int t = 0;
  for (const std::vector<uint8_t>* g : {&dq, &dk, &dv}) {
    out.g[size_t(t)].assign(g->begin() + ptrdiff_t(lead), g->end());
    out.before_written[size_t(t)] = lead && (*g)[0] != 0x7f;
    ++t;
  }
  for (int i = 0; i < 4; ++i) out.amax[i] = amax[i];
  return out;
}

// A deterministic backward's promise: two runs of the same call give bitwise the same dQ, dK, dV codes (padding
// included) and amaxes.
std::string check_same_bits(const BwdCase& c, const BwdOutputs& x, const BwdOutputs& y) {
  std::ostringstream fails;
  for (int t = 0; t < 3; ++t) {
    size_t differ = 0, first = 0;
    for (size_t e = 0; e < x.g[t].size(); ++e) {
      if (x.g[t][e] != y.g[t][e] && differ++ == 0) first = e;
    }
    if (differ) {
      fails << "  " << kGradName[t] << ": " << differ << " of " << x.g[t].size()
            << " codes differ between two runs (first at " << first << ": 0x" << std::hex << int(x.g[t][first])
            << " and 0x" << int(y.g[t][first]) << std::dec << ")\n";
    }
  }
  for (int t = 0; t < 4; ++t) {
    if (std::memcmp(&x.amax[t], &y.amax[t], sizeof(float)) != 0) {
      fails << "  " << kAmaxName[t] << ": " << x.amax[t] << " and " << y.amax[t] << " in two runs\n";
    }
  }
  const std::string s = fails.str();
  return s.empty() ? s : "GPU (deterministic, run twice) " + c.name() + ":\n" + s;
}

// The FP8 backward's switch forced on for a test, its kernel family chosen (sm90: 1 the sm90 backward kernel
// where it runs, 0 the sm80 kernels; sdpa_launch.h sdpa_fp8_bwd_runs_sm90); the environment's answers back after it.
struct Fp8BwdSwitchOn {
  explicit Fp8BwdSwitchOn(int sm90 = 0) {
    set_sdpa_fp8_bwd_enabled(1);
    set_sdpa_fp8_bwd_sm90_enabled(sm90);
  }
  ~Fp8BwdSwitchOn() {
    set_sdpa_fp8_bwd_enabled(-1);
    set_sdpa_fp8_bwd_sm90_enabled(-1);
  }
  Fp8BwdSwitchOn(const Fp8BwdSwitchOn&) = delete;
  Fp8BwdSwitchOn& operator=(const Fp8BwdSwitchOn&) = delete;
};

// The FP8 backward runs on every GPU from sm_80.

// Random case n: head dims from a list (equal and unequal, 16 to 128), B 1-2, H_q in {1, 2, 4, 8} with
// H_k = H_v a divisor, S_q and S_kv in 1..max_s, E4M3 inputs (E5M2 every sixth), every dO / gradient format
// pair, causal and no mask, the four layouts (odd row strides every fourth), host and device factors,
// attn_scale a float or a host tensor, the three scale recipes, deterministic every third (n % 3 == 2).
BwdCase bwd_random_case(int n, std::mt19937_64& rng, int max_s, uint64_t seed) {
  static const int dims[][2] = {{64, 64}, {128, 128}, {32, 64}, {128, 64}, {16, 16}, {64, 128}, {48, 112}, {96, 32}};
  BwdCase c;
  c.seed = seed;
  c.Dqk = dims[n % 8][0];
  c.Dv = dims[n % 8][1];
  c.B = 1 + int(rng() % 2);
  c.Hq = 1 << int(rng() % 4);
  c.Hk = c.Hq >> int(rng() % 4);
  c.Hk = std::max(c.Hk, 1);
  c.Sq = 1 + int(rng() % uint64_t(max_s));
  c.Skv = 1 + int(rng() % uint64_t(max_s));
  c.format = n % 6 == 5 ? 2 : 1;
  c.o_format = 1 + int(rng() % 2);
  c.do_format = 1 + n % 2;
  c.grad_format = n % 3 == 0 ? 3 - c.do_format : c.do_format;
  c.causal = (n / 2) % 2 == 1;
  c.layout = BwdLayout(n % 4);
  c.host_factors = n % 4 == 1;
  c.attn_tensor = n % 4 >= 2 ? 1 : 0;
  c.recipe = (n / 3) % 3;
  c.deterministic = n % 3 == 2;
  return c;
}

// The case on the GPU (gpu) and on the CPU reference, each against the loop; a deterministic case runs on the
// GPU twice (the amaxes poisoned differently) and must give bitwise the same results.
std::string bwd_case(const BwdCase& c, bool gpu) {
  const BwdProblem pr = make_bwd(c);
  std::string e = check_bwd(c, pr, run_bwd_api(c, pr.in, false), "CPU reference");
  if (gpu) {
    const BwdOutputs first = run_bwd_api(c, pr.in, true, c.seed % 2 ? 0xff : 0x7f);
    e += check_bwd(c, pr, first, "GPU");
    if (c.deterministic) e += check_same_bits(c, first, run_bwd_api(c, pr.in, true, c.seed % 2 ? 0x7f : 0xff));
  }
  return e;
}

// The launches of the sm90 FP8 backward a test body made: all of its GPU runs (sm90) or none.
template <class Fn>
void expect_fp8_bwd_family(bool sm90, Fn&& body) {
  const int64_t before = sm90::sdpa_fp8_bwd_sm90_launches();
  body();
  const int64_t ran = sm90::sdpa_fp8_bwd_sm90_launches() - before;
  if (sm90) {
    EXPECT_GT(ran, 0) << "the sm90 FP8 backward did not run";
  } else {
    EXPECT_EQ(ran, 0) << "the sm90 FP8 backward ran where the sm80 one was asked for";
  }
}

void fp8_backward_random(int sm90) {
  const Fp8BwdSwitchOn on(sm90);
  expect_fp8_bwd_family(sm90 != 0, [&] {
    std::mt19937_64 rng(20261204);
    for (int n = 0; n < 16; ++n) {
      const BwdCase c = bwd_random_case(n, rng, 300, 3000 + uint64_t(n));
      const std::string e = bwd_case(c, true);
      EXPECT_TRUE(e.empty()) << e;
    }
  });
}

TEST(SdpaFp8Gpu, Fp8BackwardRandom) {
  REQUIRE_SM80();
  fp8_backward_random(0);
}

TEST(SdpaFp8Gpu, Fp8BackwardHkNeHv) {
  // H_k != H_v on the FP8 backward (on by default, forced on here; passed on an H100), deterministic or not: the
  // sm80 kernels' two dK / dV passes (a dK pass over the K heads, a dV pass over the V heads; dQ added in the
  // first), then on an H100 / H200 the sm90 kernel's items (the query heads sharing one K and one V head) with the
  // store pass summing each head's slots (its launch counter says which ran).
  REQUIRE_SM80();
  set_sdpa_fp8_hk_ne_hv_enabled(1);
  struct Restore {
    ~Restore() { set_sdpa_fp8_hk_ne_hv_enabled(-1); }
  } restore;
  for (int sm90 : {0, 1}) {
    if (sm90 == 1 && !sm90_device()) continue;
    const Fp8BwdSwitchOn on(sm90);
    expect_fp8_bwd_family(sm90 != 0, [&] {
      std::mt19937_64 rng(94);
      for (int n = 0; n < 12; ++n) {
        BwdCase c = bwd_random_case(n, rng, 200, 2200 + uint64_t(n));
        c.Hq = kHkNeHvHeads[n % 6][0];
        c.Hk = kHkNeHvHeads[n % 6][1];
        c.Hv = kHkNeHvHeads[n % 6][2];
        const std::string e = bwd_case(c, true);
        EXPECT_TRUE(e.empty()) << e;
      }
    });
  }
}

TEST(SdpaFp8Gpu, DeviceAttnScale) {
  // attn_scale as a tensor in device memory (on by default, forced on here): the FP8 kernels read it as one of their factors
  // (SdpaFp8Factor kFp8AttnScale, SdpaFp8BwdFactor kFp8BwdAttnScale), no host read; dispatch makes the float scale
  // NaN then, so that a kernel reading it shows it. The sm90 FP8 forward (on an H100 / H200), the sm80 one, the FP8
  // backward on the sm80 kernels and on the sm90 kernel (H100 / H200); each against the loop and the CPU
  // reference (which reads the host copy of the same value).
  REQUIRE_SM80();
  set_sdpa_fp8_device_attn_scale_enabled(1);  // (on unless FLASHSPAN_SDPA_FP8_DEVICE_ATTN_SCALE=0)
  struct Restore {
    ~Restore() { set_sdpa_fp8_device_attn_scale_enabled(-1); }
  } restore;
  std::mt19937_64 rng(93);
  const int dims[][2] = {{128, 128}, {64, 64}, {48, 80}};
  for (int n = 0; n < 6; ++n) {
    Fp8Case c = api_random_case(n, rng, dims[n % 3][0], dims[n % 3][1], 200, 260, 2000 + uint64_t(n));
    c.attn_form = 2;
    if (sm90_device()) {
      const Fp8SwitchOn on;
      const int64_t l0 = sm90::sdpa_fp8_fwd_launches();
      const std::string e = api_case(c);
      EXPECT_TRUE(e.empty()) << e;
      EXPECT_EQ(sm90::sdpa_fp8_fwd_launches(), l0 + 1) << c.name();
    }
    const Fp8FwdSm80On sm80(/*sm90_off=*/true);
    const Inputs in = make_inputs(c);
    const std::string e = check(c, in, reference_loop(c, in), run_api(c, in, true), true);
    EXPECT_TRUE(e.empty()) << e;
  }
  for (int sm90 : {0, 1}) {
    if (sm90 == 1 && !sm90_device()) continue;
    const Fp8BwdSwitchOn on(sm90);
    expect_fp8_bwd_family(sm90 != 0, [&] {
      for (int n = 0; n < 6; ++n) {
        BwdCase c = bwd_random_case(n, rng, 200, 2100 + uint64_t(n));
        c.attn_tensor = 2;
        const std::string e = bwd_case(c, true);
        EXPECT_TRUE(e.empty()) << e;
      }
    });
  }
}

// The same cases on the sm90 backward kernel (sdpa_fp8_bwd_sm90.cu).
TEST(SdpaFp8Gpu, Fp8BackwardSm90Random) {
  REQUIRE_SM90();
  fp8_backward_random(1);
}

// The widening pre-pass with two codes a thread only (kernels/common/fp8_prepass.h fp8_widen_vec_enabled, on by
// default, forced off here: FLASHSPAN_FP8_WIDEN_VEC=0's path; with it on, the other FP8 tests run the eight-code
// kernel where the sources are 8-byte aligned and the two-code one elsewhere), under both backwards and the sm80 FP8
// forward's head dims.
TEST(SdpaFp8Gpu, WidenTwoCodes) {
  REQUIRE_SM80();
  struct Off {
    Off() { set_fp8_widen_vec_enabled(0); }
    ~Off() { set_fp8_widen_vec_enabled(-1); }
  } off;
  fp8_backward_random(0);
  if (sm90_device()) fp8_backward_random(1);
  const Fp8FwdSm80On fwd(/*sm90_off=*/true);
  std::mt19937_64 rng(83);
  const int dims[][2] = {{128, 128}, {64, 64}, {192, 128}, {256, 256}};
  for (int n = 0; n < 8; ++n) {
    const Fp8Case c = api_random_case(n, rng, dims[n % 4][0], dims[n % 4][1], 260, 330, 1700 + uint64_t(n));
    const Inputs in = make_inputs(c);
    const std::string e = check(c, in, reference_loop(c, in), run_api(c, in, true), true);
    EXPECT_TRUE(e.empty()) << e;
  }
}

// Edges: one key (dP = attn_scale (dS - D) with D ~ dS: the cancellation), one query, keys no causal row sees
// (S_kv > S_q: zero dK / dV rows, which must be written), S_q > S_kv causal, MQA with 8 query heads a key
// head; whole tiles (S = 256, several key blocks an item, GQA 4) in both dO formats. Every other shape
// deterministic (run twice: bitwise the same), the four layouts in turn.
void fp8_backward_edges(int sm90) {
  const Fp8BwdSwitchOn on(sm90);
  struct Shape {
    int B, Hq, Hk, Sq, Skv, Dqk, Dv;
    bool causal;
  };
  const Shape shapes[] = {{2, 4, 2, 77, 1, 64, 64, true},     {1, 2, 1, 1, 257, 128, 64, false},
                          {2, 4, 4, 40, 300, 32, 32, true},   {1, 8, 1, 300, 130, 64, 128, true},
                          {2, 8, 2, 256, 256, 128, 128, true}, {1, 4, 1, 256, 256, 64, 64, false}};
  int n = 0;
  for (const Shape& s : shapes) {
    BwdCase c;
    c.B = s.B;
    c.Hq = s.Hq;
    c.Hk = s.Hk;
    c.Sq = s.Sq;
    c.Skv = s.Skv;
    c.Dqk = s.Dqk;
    c.Dv = s.Dv;
    c.causal = s.causal;
    c.do_format = 1 + n % 2;
    c.grad_format = 2 - n % 2;
    c.o_format = 1 + (n / 2) % 2;
    c.layout = BwdLayout(n % 4);
    c.recipe = n % 3;
    c.deterministic = n % 2 == 1;
    c.seed = 4000 + uint64_t(n);
    ++n;
    expect_fp8_bwd_family(sm90 != 0, [&] {
      const std::string e = bwd_case(c, true);
      EXPECT_TRUE(e.empty()) << e;
    });
  }
}

TEST(SdpaFp8Gpu, Fp8BackwardEdges) {
  REQUIRE_SM80();
  fp8_backward_edges(0);
}

TEST(SdpaFp8Gpu, Fp8BackwardSm90Edges) {
  REQUIRE_SM90();
  fp8_backward_edges(1);
}

// The GPU tests' oracle and criterion, checked without a GPU: the float64 loop against the CPU reference (the
// FP8 API on host tensors) on the random cases' options, within the same bounds.
TEST(SdpaFp8Loop, BackwardMatchesTheCpuReference) {
  std::mt19937_64 rng(17);
  for (int n = 0; n < 8; ++n) {
    const BwdCase c = bwd_random_case(n, rng, 70, 700 + uint64_t(n));
    const std::string e = bwd_case(c, false);
    EXPECT_TRUE(e.empty()) << e;
  }
  // H_k != H_v (the loop's V head h / (H_q / H_v), dV over each V head's query heads; Fp8BackwardHkNeHv's shapes).
  for (int n = 0; n < 4; ++n) {
    BwdCase c = bwd_random_case(n, rng, 50, 760 + uint64_t(n));
    c.Hq = kHkNeHvHeads[n][0];
    c.Hk = kHkNeHvHeads[n][1];
    c.Hv = kHkNeHvHeads[n][2];
    const std::string e = bwd_case(c, false);
    EXPECT_TRUE(e.empty()) << e;
  }
}

// The criterion can fail: results of a wrong implementation, made from the CPU reference's, are rejected.
TEST(SdpaFp8Loop, BackwardCriterionRejectsWrongResults) {
  BwdCase c;
  c.B = 2;
  c.Hq = 4;
  c.Hk = 2;
  c.Sq = 45;
  c.Skv = 60;
  c.Dqk = 32;
  c.Dv = 64;
  c.causal = true;
  c.do_format = 1;
  c.grad_format = 2;  // E5M2 gradients: the coarser step (25 % at its widest)
  c.recipe = 1;
  c.seed = 91;
  const BwdProblem pr = make_bwd(c);
  const BwdOutputs good = run_bwd_api(c, pr.in, false);
  ASSERT_EQ(check_bwd(c, pr, good, "CPU reference"), "");
  auto fails_on = [&](const BwdOutputs& out, const std::string& what) {
    const std::string e = check_bwd(c, pr, out, "mutant");
    EXPECT_NE(e.find(what), std::string::npos) << "not rejected (" << what << "):\n" << e;
  };
  // A scale factor 2x (scale_dQ), and one 1.1x (scale_dV: within one E5M2 step of most elements, so only the
  // count of codes off the reference's rounding sees it).
  for (const auto& [slot, factor, what] : {std::tuple<int, float, const char*>{kBScaleDQ, 2.0f, "elements of dQ"},
                                           {kBScaleDV, 1.1f, "dV: "}}) {
    BwdInputs in = pr.in;
    in.factor[slot] *= factor;
    fails_on(run_bwd_api(c, in, false), what);
  }
  // descale_dP 2x: dQ and dK twice as large, their amaxes too.
  {
    BwdInputs in = pr.in;
    in.factor[kBDescaleDP] *= 2.0f;
    const BwdOutputs out = run_bwd_api(c, in, false);
    fails_on(out, "elements of dQ");
    fails_on(out, "elements of dK");
    fails_on(out, "amax_dK");
  }
  // One key row of dK zeroed; a row never written (NaN codes).
  {
    BwdOutputs out = good;
    for (int d = 0; d < c.Dqk; ++d) out.g[1][size_t(d)] = 0;
    fails_on(out, "elements of dK");
    out = good;
    for (int d = 0; d < c.Dv; ++d) out.g[2][size_t(pr.in.sv[2] * 7 + d)] = 0x7f;
    fails_on(out, "elements of dV");
  }
  // amax_dP of the quantized dP8 (max |dP8| descale_dP: 0.7 fmax rounds to another code) instead of dP's; an
  // amax left at its poison, or doubled.
  {
    const Fp8Fmt fd = fmt_of(c.do_format);
    BwdOutputs out = good;
    out.amax[3] = float(fd.round(pr.ref.amax[3] * pr.in.factor[kBScaleDP]) / pr.in.factor[kBScaleDP]);
    fails_on(out, "amax_dP");
    out = good;
    std::memset(&out.amax[0], 0x7f, sizeof(float));
    fails_on(out, "amax_dQ");
    out = good;
    out.amax[2] *= 2.0f;
    fails_on(out, "amax_dV");
  }
}

// Small cases for compute-sanitizer (memcheck, racecheck: scripts/gpu_check.sh): both kernel tiles ((64, 64)
// and (128, 128)-class), unequal head dims, GQA, causal and no mask, S not a multiple of the tiles, padded rows,
// BSHD and odd row strides (unaligned rows), both dO formats, the deterministic dQ kernel (the fourth case).
void fp8_backward_sanitizer_small(int sm90) {
  const Fp8BwdSwitchOn on(sm90);
  BwdCase c;
  c.B = 2;
  c.Hq = 4;
  c.Hk = 2;
  c.Sq = 70;
  c.Skv = 150;
  // The fourth: deterministic (the ordered dQ kernel with the FP8 steps; run twice, bitwise the same), odd row
  // strides from one byte past the allocation, the (128, 128)-class tile with unequal head dims.
  const int dims[][2] = {{64, 64}, {128, 128}, {32, 64}, {128, 64}};
  for (int n = 0; n < 4; ++n) {
    c.Dqk = dims[n][0];
    c.Dv = dims[n][1];
    c.causal = n != 1;
    c.layout = BwdLayout(n);
    c.do_format = 1 + n % 2;
    c.grad_format = 2 - n % 2;
    c.attn_tensor = n == 2 ? 1 : 0;
    c.host_factors = n == 1;
    c.deterministic = n == 3;
    c.seed = 60 + uint64_t(n);
    expect_fp8_bwd_family(sm90 != 0, [&] {
      const std::string e = bwd_case(c, true);
      EXPECT_TRUE(e.empty()) << e;
    });
  }
}

TEST(SdpaFp8Gpu, Fp8BackwardSanitizerSmall) {
  REQUIRE_SM80();
  fp8_backward_sanitizer_small(0);
}

TEST(SdpaFp8Gpu, Fp8BackwardSm90SanitizerSmall) {
  REQUIRE_SM90();
  fp8_backward_sanitizer_small(1);
}

// dK / dV through the fp32 slots and the store pass (sdpa_fp8_bwd_sm90.h sdpa_fp8_bwd_sm90_store_enabled, on by
// default, forced off here: FLASHSPAN_SM90_SDPA_FP8_BWD_STORE=0's path; the other sm90 FP8 backward tests run the
// kernel's own stores): the random, edge and sanitizer cases of the sm90 FP8 backward.
TEST(SdpaFp8Gpu, Fp8BackwardSm90StorePass) {
  REQUIRE_SM90();
  struct Off {
    Off() { sm90::set_sdpa_fp8_bwd_sm90_store_enabled(0); }
    ~Off() { sm90::set_sdpa_fp8_bwd_sm90_store_enabled(-1); }
  } off;
  fp8_backward_random(1);
  fp8_backward_edges(1);
  fp8_backward_sanitizer_small(1);
}

// The sanitizer cases alone through the slots and the store pass (gpu_check's memcheck set).
TEST(SdpaFp8Gpu, Fp8BackwardSm90StorePassSanitizerSmall) {
  REQUIRE_SM90();
  struct Off {
    Off() { sm90::set_sdpa_fp8_bwd_sm90_store_enabled(0); }
    ~Off() { sm90::set_sdpa_fp8_bwd_sm90_store_enabled(-1); }
  } off;
  fp8_backward_sanitizer_small(1);
}

#endif  // FLASHSPAN_WITH_CUDA

}  // namespace
}  // namespace flashspan::test
