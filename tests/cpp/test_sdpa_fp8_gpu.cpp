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
//   SdpaFp8Gpu.ApiForwardRandom          through the C++ API on CUDA tensors (FLASHSPAN_EXPERIMENTAL's
//                                        switch forced on: check_support, workspace_size, execute), the
//                                        FP8 API's options (causal, padding, GQA, layouts, formats, host
//                                        scale factors, stats in base 2, score_max / score_sum_exp); the
//                                        same calls on host copies (the CPU reference) checked against
//                                        the loop too, so the GPU result is tied to the reference.
//   SdpaFp8Gpu.Sm90ForwardSanitizerSmall small cases of both paths for compute-sanitizer (memcheck,
//                                        racecheck, synccheck: scripts/gpu_check.sh).
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
#include <vector>

#include "core/fp8_conv.h"
#include "error_criteria.h"
#include "flashspan/flashspan.hpp"
#include "gpu_harness.h"
#ifdef FLASHSPAN_WITH_CUDA
#include "dispatch/sdpa_launch.h"  // set_sdpa_fp8_sm90_enabled
#include "kernels/params.h"
#include "kernels/sm90/launch_sm90.h"
#include "kernels/sm90/tile_sm90.h"
#endif

namespace flashspan::test {
namespace {

#ifndef FLASHSPAN_WITH_CUDA

TEST(SdpaFp8Gpu, Skipped) { GTEST_SKIP() << "flashspan was built without CUDA"; }

#else

namespace api = flashspan::api;

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
  MaskKind mask = kNoMask;
  bool padding = false;       // seq_len_q / seq_len_kv: sample 0 full, 1 shorter, 2 empty, ...
  bool bshd = false;          // memory [B, S, H, D] behind the [B, H, S, D] descriptors
  bool host_factors = false;  // the scale factors in host memory (by value)
  bool max_logit = false;     // launcher only (the FP8 API refuses it)
  bool stats_log2 = false;    // API only
  bool score_stats = false;   // score_max / score_sum_exp
  uint64_t seed = 1;
  std::string name() const {
    std::ostringstream os;
    os << (format == 2 ? "e5m2" : "e4m3") << "->" << (o_format == 2 ? "e5m2" : "e4m3") << " B" << B << " Hq" << Hq
       << " Hk" << Hk << " Sq" << Sq << " Skv" << Skv << " D" << Dqk << "/" << Dv << " mask" << int(mask)
       << (padding ? " pad" : "") << (bshd ? " bshd" : " bhsd") << (host_factors ? " host-factors" : "")
       << (max_logit ? " max_logit" : "") << (stats_log2 ? " log2" : "") << (score_stats ? " score-stats" : "")
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
  std::array<int64_t, 4> sq, sk, sv, so;  // strides of q, k, v, o
  std::vector<uint8_t> q, k, v;
  std::array<float, 6> factor;  // descale_q, descale_k, descale_v, descale_s, scale_s, scale_o
  float attn_scale;
  std::vector<int32_t> len_q, len_kv;
  sdpa::Band band;
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
  in.sv = strides_of(c.Hk, c.Skv, c.Dv, c.bshd);
  in.so = strides_of(c.Hq, c.Sq, c.Dv, c.bshd);
  // Raw FP8 inputs over a quarter of the format's range (so that the descales matter), a few outliers.
  auto fill = [&](std::vector<uint8_t>& t, size_t n) {
    t.resize(n);
    for (auto& x : t) x = f.encode(0.25 * f.max * uni(rng) * (uni(rng) > 0.98 ? 4.0 : 1.0));
  };
  fill(in.q, size_t(c.B) * c.Hq * c.Sq * c.Dqk);
  fill(in.k, size_t(c.B) * c.Hk * c.Skv * c.Dqk);
  fill(in.v, size_t(c.B) * c.Hk * c.Skv * c.Dv);
  // Dequantized inputs of amplitude ~1 (non-powers of two too); scale_s the format's largest value or
  // less; scale_o so that |O| <= max |V| ~ 4 does not saturate.
  const float scale_s = float(c.seed % 3 == 0 ? f.max : c.seed % 3 == 1 ? 0.75 * f.max : 0.5 * f.max);
  in.factor = {float(4.0 / f.max * 1.1), float(4.0 / f.max * 0.9), float(4.0 / f.max), 1.0f / scale_s, scale_s,
               float(fo.max / 8.0)};
  in.attn_scale = float(2.5 / std::sqrt(double(c.Dqk)));
  in.len_q.assign(c.B, c.Sq);
  in.len_kv.assign(c.B, c.Skv);
  if (c.padding) {
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
  in.band = band_of(c.mask);
  return in;
}

// What a run gives back (o's bytes in the o strides; the [B, H_q, S_q] statistics).
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
  r.o.assign(size_t(c.B) * c.Hq * c.Sq * c.Dv, 0.0);
  r.bound.assign(r.o.size(), 0.0);
  r.lse.assign(nrow, -INFINITY);
  r.score_max.assign(nrow, -INFINITY);
  r.score_sum_exp.assign(nrow, 0.0);
  r.max_logit.assign(c.Hq, -INFINITY);
  const int G = c.Hq / c.Hk;
  std::vector<double> s(c.Skv), pq(c.Skv), err(c.Skv);
  for (int b = 0; b < c.B; ++b) {
    for (int h = 0; h < c.Hq; ++h) {
      const int hk = h / G;
      for (int i = 0; i < in.len_q[b]; ++i) {
        int64_t lo = 0, hi = 0;
        in.band.columns(i, in.len_q[b], in.len_kv[b], &lo, &hi);
        if (lo >= hi) continue;
        const double* qr = qd.data() + b * in.sq[0] + h * in.sq[1] + i * in.sq[2];
        double m = -INFINITY;
        for (int64_t j = lo; j < hi; ++j) {
          const double* kr = kd.data() + b * in.sk[0] + hk * in.sk[1] + j * in.sk[2];
          double acc = 0.0;
          for (int d = 0; d < c.Dqk; ++d) acc += qr[d] * kr[d];
          s[j] = double(in.attn_scale) * dq * dk * acc;
          m = std::max(m, s[j]);
        }
        double l = 0.0;
        for (int64_t j = lo; j < hi; ++j) l += std::exp(s[j] - m);
        const size_t row = (size_t(b) * c.Hq + h) * c.Sq + i;
        r.amax_s = std::max(r.amax_s, 1.0 / l);
        r.max_logit[h] = std::max(r.max_logit[h], m);
        r.lse[row] = m + std::log(l);
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
            const double vj = vd[b * in.sv[0] + hk * in.sv[1] + j * in.sv[2] + d];
            acc += pq[j] * vj;
            bnd += err[j] * std::fabs(vj);
          }
          const size_t oi = size_t(b * in.so[0] + h * in.so[1] + i * in.so[2] + d);
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
// reference's (one step of o's format, the statistics to 1e-5).
std::string check(const Fp8Case& c, const Inputs& in, const Reference& r, const Outputs& out, bool gpu) {
  const Fp8Fmt fo = fmt_of(c.o_format), f = fmt_of(c.format);
  const double scale_o = in.factor[5];
  std::ostringstream fails;
  double max_ref = 0.0;
  for (double x : r.o) max_ref = std::max(max_ref, std::fabs(x));
  double se = 0.0, sr = 0.0;
  int bad = 0;
  for (int b = 0; b < c.B; ++b) {
    for (int h = 0; h < c.Hq; ++h) {
      for (int i = 0; i < c.Sq; ++i) {
        for (int d = 0; d < c.Dv; ++d) {
          const size_t oi = size_t(b * in.so[0] + h * in.so[1] + i * in.so[2] + d);
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
  const double rel = gpu ? 2.0 * std::max(f.u, fo.u) : 2.0 * fo.u;
  if (!(std::sqrt(se) <= rel * std::sqrt(sr) + 1e-6)) {
    fails << "  O relative L2 error " << std::sqrt(se / std::max(sr, 1e-300)) << " > " << rel << "\n";
  }
  const double stat_atol = gpu ? fs_test::kStatAtol : 1e-5;
  const double unit = c.stats_log2 ? 1.4426950408889634 : 1.0;
  int bad_stats = 0;
  for (size_t x = 0; x < r.lse.size(); ++x) {
    if (!stat_ok(out.stats[x], r.lse[x] * unit, stat_atol * std::max(1.0, std::fabs(r.lse[x]))) && bad_stats++ < 5) {
      fails << "  LSE[" << x << "] = " << out.stats[x] << ", loop " << r.lse[x] * unit << "\n";
    }
    if (c.score_stats) {
      if (!stat_ok(out.score_max[x], r.score_max[x], stat_atol * std::max(1.0, std::fabs(r.score_max[x]))) &&
          bad_stats++ < 5) {
        fails << "  score_max[" << x << "] = " << out.score_max[x] << ", loop " << r.score_max[x] << "\n";
      }
      // sum_exp = exp(LSE - score_max): relative error the LSE's absolute one (as amax_s below).
      const double rel_se = gpu && std::isfinite(r.lse[x]) ? stat_atol * std::max(1.0, std::fabs(r.lse[x])) : 1e-4;
      if (!(std::fabs(out.score_sum_exp[x] - r.score_sum_exp[x]) <= rel_se * r.score_sum_exp[x] + 1e-12) &&
          bad_stats++ < 5) {
        fails << "  score_sum_exp[" << x << "] = " << out.score_sum_exp[x] << ", loop " << r.score_sum_exp[x] << "\n";
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

// The launcher with SdpaFp8FwdParams as dispatch/sdpa_params.cpp fills them (padded tensors).
Outputs run_launcher(const Fp8Case& c, const Inputs& in) {
  const size_t no = size_t(c.B) * c.Hq * c.Sq * c.Dv, nrow = size_t(c.B) * c.Hq * c.Sq;
  DevBuf dq(in.q.size()), dk(in.k.size()), dv(in.v.size()), dlq(sizeof(int32_t) * c.B), dlk(sizeof(int32_t) * c.B);
  DevBuf dfac(sizeof(float) * 6);
  Poisoned dout(no), dstats(sizeof(float) * nrow), damax(2 * sizeof(float)), dml(sizeof(float) * c.Hq);
  Poisoned dsm(sizeof(float) * nrow), dss(sizeof(float) * nrow);
  Poisoned dvt(size_t(sm90::fp8_vt_bytes_sm90(c.B, c.Hk, c.Dv, c.Skv)));
  upload(dq, in.q);
  upload(dk, in.k);
  upload(dv, in.v);
  upload(dlq, in.len_q);
  upload(dlk, in.len_kv);
  upload(dfac, std::vector<float>(in.factor.begin(), in.factor.end()));

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
  p.scale = in.attn_scale;
  p.scale_log2 = in.attn_scale * 1.4426950408889634f;
  p.grid_mode = 1;
  p.o = dout.p;
  p.oa = TensorAddr{0, in.so[2], in.so[1]};
  p.lse = static_cast<float*>(dstats.p);
  p.lsea = TensorAddr{0, 1, c.Sq};
  p.max_logit = c.max_logit ? static_cast<float*>(dml.p) : nullptr;
  AnalyticMaskParams& a = p.analytic;
  a.score.group_v = c.Hq / c.Hk;
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
    f8.host_factor[i] = c.host_factors ? in.factor[i] : 0.0f;  // 0: never read when a pointer is set
  }
  f8.amax_s = static_cast<float*>(damax.p);
  f8.amax_o = static_cast<float*>(damax.p) + 1;
  f8.v_t = dvt.p;

  sm90::launch_sdpa_fp8_fwd_sm90(p, view_of(dq.p, c.B, c.Hq, c.Sq, c.Dqk, in.sq),
                                 view_of(dk.p, c.B, c.Hk, c.Skv, c.Dqk, in.sk),
                                 view_of(dv.p, c.B, c.Hk, c.Skv, c.Dv, in.sv), nullptr);
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
  const size_t no = size_t(c.B) * c.Hq * c.Sq * c.Dv, nrow = size_t(c.B) * c.Hq * c.Sq;
  const fs_device_t dev = cuda ? api::Device::cuda(0) : api::Device::cpu();
  const fs_device_t fac_dev = cuda && !c.host_factors ? api::Device::cuda(0) : api::Device::cpu();
  // Host storage; on CUDA its device twins.
  std::vector<uint8_t> q = in.q, k = in.k, v = in.v, o(no, 0xff);
  std::vector<float> stats(nrow, NAN), smax(nrow, NAN), ssum(nrow, NAN), amax{NAN, NAN};
  std::vector<float> fac(in.factor.begin(), in.factor.end());
  std::vector<int32_t> lq = in.len_q, lk = in.len_kv;
  std::vector<std::unique_ptr<DevBuf>> bufs;
  auto place = [&](auto& h) -> void* {
    using T = typename std::decay_t<decltype(h)>::value_type;
    if (!cuda) return h.data();
    bufs.push_back(std::make_unique<DevBuf>(std::max<size_t>(h.size() * sizeof(T), 16)));
    cuda_ok(cudaMemcpy(bufs.back()->p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
    return bufs.back()->p;
  };
  void *pq = place(q), *pk = place(k), *pv = place(v), *po = place(o), *pst = place(stats), *psm = place(smax);
  void *pss = place(ssum), *pam = place(amax), *plq = place(lq), *plk = place(lk);
  void* pfac = c.host_factors ? fac.data() : place(fac);
  auto desc = [&](void* d, fs_dtype_t t, int H, int S, int D, const std::array<int64_t, 4>& st) {
    return api::TensorDesc(d, t, dev, {c.B, H, S, D}, {st[0], st[1], st[2], st[3]});
  };
  const api::TensorDesc qd = desc(nullptr, api_dtype(c.format), c.Hq, c.Sq, c.Dqk, in.sq);
  const api::TensorDesc kd = desc(nullptr, api_dtype(c.format), c.Hk, c.Skv, c.Dqk, in.sk);
  const api::TensorDesc vd = desc(nullptr, api_dtype(c.format), c.Hk, c.Skv, c.Dv, in.sv);
  const api::TensorDesc od = desc(nullptr, api_dtype(c.o_format), c.Hq, c.Sq, c.Dv, in.so);
  const api::TensorDesc sd(nullptr, api::kFloat32, dev, {c.B, c.Hq, c.Sq, 1});
  const api::TensorDesc one(nullptr, api::kFloat32, fac_dev, {1, 1, 1, 1});
  const api::TensorDesc amax_d(nullptr, api::kFloat32, dev, {1, 1, 1, 1});
  const api::TensorDesc lens(nullptr, api::kInt32, dev, {c.B, 1, 1, 1});
  api::SdpaAttributes a;
  a.set_attn_scale(in.attn_scale).set_generate_stats(true).set_causal_mask(c.mask == kCausalTopLeft);
  a.set_stats_use_log2(c.stats_log2);
  a.set_descale_q(one).set_descale_k(one).set_descale_v(one).set_descale_s(one).set_scale_s(one).set_scale_o(one);
  a.set_amax_s(amax_d).set_amax_o(amax_d);
  if (c.padding) a.set_padding_mask(true).set_seq_len_q(lens).set_seq_len_kv(lens);
  if (c.score_stats) a.set_logit_max(sd).set_score_sum_exp(sd);
  api::SdpaFwd op(qd, kd, vd, od, &sd, a);
  op.check_support();
  op.compile();
  api::SdpaVariantPack pack;
  pack.set(FS_SDPA_Q, pq).set(FS_SDPA_K, pk).set(FS_SDPA_V, pv).set(FS_SDPA_O, po).set(FS_SDPA_STATS, pst);
  const fs_sdpa_slot_t slots[] = {FS_SDPA_DESCALE_Q, FS_SDPA_DESCALE_K, FS_SDPA_DESCALE_V,
                                  FS_SDPA_DESCALE_S, FS_SDPA_SCALE_S,   FS_SDPA_SCALE_O};
  for (int i = 0; i < 6; ++i) pack.set(slots[i], static_cast<float*>(pfac) + i);
  pack.set(FS_SDPA_AMAX_S, pam).set(FS_SDPA_AMAX_O, static_cast<float*>(pam) + 1);
  if (c.padding) pack.set(FS_SDPA_SEQ_LEN_Q, plq).set(FS_SDPA_SEQ_LEN_KV, plk);
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
}

#endif  // FLASHSPAN_WITH_CUDA

}  // namespace
}  // namespace flashspan::test
