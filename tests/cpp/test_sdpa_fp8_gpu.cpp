// GPU tests of the sm90 FP8 SDPA forward at the launcher level (kernels/sm90/launch_sm90.h
// launch_sdpa_fp8_fwd_sm90: the V^T pre-pass, then kernel_fwd_sm90.cuh sdpa_fp8_fwd_kernel_sm90),
// with SdpaFp8FwdParams built by hand as dispatch will fill them, against a float64 loop of the
// definitions (params.h SdpaFp8Params; cuDNN / Transformer Engine conventions):
//   S = descale_q descale_k attn_scale Q K^T (masked), P = softmax(S), amax_s = max |P|,
//   P_q = fp8(P scale_s), O = (P_q V) descale_s descale_v, amax_o = max |O|, O stored as
//   fp8_satfinite(O scale_o), LSE (natural log).
//   SdpaFp8Gpu.Sm90ForwardRandom         E4M3 / E5M2, kernel head dims 64 and 128 (and smaller
//                                        multiples of 16 on them), no mask / causal top-left /
//                                        bottom-right / a sliding window, padding lengths (with an
//                                        empty sample), GQA / MQA, BHSD and BSHD strides, S not a
//                                        multiple of the 128 x 128 tile, max_logit.
//   SdpaFp8Gpu.Sm90ForwardSanitizerSmall small cases for compute-sanitizer (memcheck, racecheck,
//                                        synccheck: scripts/gpu_check.sh).
// Outputs, the V^T workspace and the amaxes are 0xFF-poisoned (NaN in FP8 and fp32) before the
// launch: an element the kernels never wrote stays NaN and fails.
// Error criteria (the kernel quantizes P the flash way: fp8(exp(s - m_block) scale_s) with the
// running max of its key block, 1 / sum folded in at the end; the reference quantizes the
// normalised P): with u the format's unit roundoff (E4M3 2^-4, E5M2 2^-3) and h half its
// smallest subnormal step (2^-10, 2^-17), each P_q term of either side lies within max(u x, h)
// of x = P scale_s, so elementwise
//   |O_gpu - O_ref| <= (descale_s descale_v sum_j 2 max(u x_j, h) |V_j|) (1 + u) + u |O_ref|
//                      + h / scale_o   (the output's own rounding), times 1.01, + 1e-5 max|O_ref|;
// relative L2 ||O_gpu - O_ref|| <= 2u ||O_ref|| (independent roundings give ~0.8u; a misplaced
// key or column gives ~1); LSE and max_logit within error_criteria.h kStatAtol (-inf exactly on
// rows without a key); amax_s within 1e-4 relative; amax_o within the largest elementwise bound.
// Skips when no CUDA device is visible, the build has no CUDA, or the device is not an sm_90
// with this build's sm_90a code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "error_criteria.h"
#include "gpu_harness.h"
#ifdef FLASHSPAN_WITH_CUDA
#include "kernels/params.h"
#include "kernels/sm90/launch_sm90.h"
#include "kernels/sm90/tile_sm90.h"
#endif

namespace flashspan::test {
namespace {

#ifndef FLASHSPAN_WITH_CUDA

TEST(SdpaFp8Gpu, Skipped) { GTEST_SKIP() << "flashspan was built without CUDA"; }

#else

// ---------------------------------------------------------------------------
// FP8 on the host: decode, and encode with round-to-nearest-even and saturation (satfinite)
// ---------------------------------------------------------------------------

struct Fp8Format {
  int code;       // 1 E4M3, 2 E5M2 (SdpaFp8Params::format)
  int mbits, bias;
  double max;     // largest finite
  double u;       // unit roundoff 2^-(mbits + 1)
  double h;       // half the subnormal step
};
Fp8Format fp8_format(int code) {
  return code == 2 ? Fp8Format{2, 2, 15, 57344.0, 0.125, std::ldexp(1.0, -17)}
                   : Fp8Format{1, 3, 7, 448.0, 0.0625, std::ldexp(1.0, -10)};
}

double fp8_decode(uint8_t b, const Fp8Format& f) {
  const int ebits = 7 - f.mbits;
  const int e = (b >> f.mbits) & ((1 << ebits) - 1), m = b & ((1 << f.mbits) - 1);
  const bool neg = (b & 0x80) != 0;
  if (f.code == 1 && e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  if (f.code == 2 && e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : (neg ? -INFINITY : INFINITY);
  const double v = e == 0 ? std::ldexp(double(m), 1 - f.bias - f.mbits)
                          : std::ldexp(double((1 << f.mbits) + m), e - f.bias - f.mbits);
  return neg ? -v : v;
}

// The positive finite codes in ascending order of value (the encoding is monotone in the code).
struct Fp8Codec {
  Fp8Format f;
  std::vector<double> pos;  // value of code c, c = 0 .. largest finite
  explicit Fp8Codec(int code) : f(fp8_format(code)) {
    for (int c = 0; c < 128; ++c) {
      const double v = fp8_decode(uint8_t(c), f);
      if (!std::isfinite(v)) break;
      pos.push_back(v);
    }
  }
  double decode(uint8_t b) const { return fp8_decode(b, f); }
  uint8_t encode(double x) const {
    if (std::isnan(x)) return 0x7f;
    const uint8_t sign = x < 0 ? 0x80 : 0;
    const double a = std::fabs(x);
    int c;
    if (a >= pos.back()) {
      c = int(pos.size()) - 1;  // satfinite
    } else {
      c = int(std::upper_bound(pos.begin(), pos.end(), a) - pos.begin()) - 1;  // pos[c] <= a < pos[c + 1]
      const double lo = a - pos[c], hi = pos[c + 1] - a;
      if (hi < lo || (hi == lo && (c & 1))) ++c;  // nearest, ties to the even code
    }
    return uint8_t(c) | sign;
  }
  double round(double x) const { return decode(encode(x)); }
};

// ---------------------------------------------------------------------------
// One case
// ---------------------------------------------------------------------------

enum MaskKind { kNoMask, kCausalTopLeft, kCausalBottomRight, kWindow };

struct Fp8Case {
  int format = 1;
  int B = 1, Hq = 1, Hk = 1, Sq = 1, Skv = 1, Dqk = 64, Dv = 64;
  MaskKind mask = kNoMask;
  bool padding = false;  // seq_len_q / seq_len_kv (sample 0 full, sample 1 shorter, sample 2 empty)
  bool bshd = false;     // memory [B, S, H, D] behind the [B, H, S, D] descriptors
  bool max_logit = false;
  uint64_t seed = 1;
  std::string name() const {
    std::ostringstream os;
    os << (format == 2 ? "e5m2" : "e4m3") << " B" << B << " Hq" << Hq << " Hk" << Hk << " Sq" << Sq << " Skv" << Skv
       << " D" << Dqk << "/" << Dv << " mask" << int(mask) << (padding ? " pad" : "") << (bshd ? " bshd" : " bhsd")
       << (max_logit ? " max_logit" : "") << " seed" << seed;
    return os.str();
  }
};

// A [B, H, S, D] tensor's strides: BHSD or, with bshd, BSHD memory.
struct Strides4 {
  int64_t s[4];
};
Strides4 strides_of(int B, int H, int S, int D, bool bshd) {
  (void)B;
  return bshd ? Strides4{{int64_t(S) * H * D, D, int64_t(H) * D, 1}} : Strides4{{int64_t(H) * S * D, int64_t(S) * D, D, 1}};
}

TensorView view_of(void* data, int B, int H, int S, int D, const Strides4& st) {
  TensorView v;
  v.data = data;
  v.dtype = DType::kUInt8;  // one byte an element; the FP8 format travels in SdpaFp8Params
  v.device = DeviceType::kCUDA;
  v.device_id = 0;
  v.ndim = 4;
  v.shape = {int64_t(B), int64_t(H), int64_t(S), int64_t(D)};
  v.strides = {st.s[0], st.s[1], st.s[2], st.s[3]};
  return v;
}

template <class T>
void upload(DevBuf& d, const std::vector<T>& h) {
  cuda_ok(cudaMemcpy(d.p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
}
template <class T>
std::vector<T> download(const DevBuf& d, size_t n) {
  std::vector<T> h(n);
  cuda_ok(cudaMemcpy(h.data(), d.p, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
  return h;
}

sdpa::Band band_of(MaskKind m) {
  sdpa::Band b;
  if (m == kCausalTopLeft || m == kCausalBottomRight || m == kWindow) {
    b.has_right = 1;
    b.right = 0;
  }
  b.bottom_right = m == kCausalBottomRight ? 1 : 0;
  if (m == kWindow) {
    b.has_left = 1;
    b.left = 37;
    b.bottom_right = 1;
  }
  return b;
}

// Runs one case on the GPU and checks it against the float64 loop. Returns "" or the failures.
std::string run_case(const Fp8Case& c) {
  const Fp8Codec codec(c.format);
  const Fp8Format& f = codec.f;
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<double> uni(-1.0, 1.0);
  const Strides4 sq = strides_of(c.B, c.Hq, c.Sq, c.Dqk, c.bshd), sk = strides_of(c.B, c.Hk, c.Skv, c.Dqk, c.bshd);
  const Strides4 sv = strides_of(c.B, c.Hk, c.Skv, c.Dv, c.bshd), so = strides_of(c.B, c.Hq, c.Sq, c.Dv, c.bshd);
  const size_t nq = size_t(c.B) * c.Hq * c.Sq * c.Dqk, nk = size_t(c.B) * c.Hk * c.Skv * c.Dqk;
  const size_t nv = size_t(c.B) * c.Hk * c.Skv * c.Dv, no = size_t(c.B) * c.Hq * c.Sq * c.Dv;
  // Raw FP8 inputs spread over the format's range (so that the descales matter), outliers included.
  auto fill = [&](std::vector<uint8_t>& t, size_t n, double amp) {
    t.resize(n);
    for (auto& x : t) x = codec.encode(amp * uni(rng) * (uni(rng) > 0.98 ? 4.0 : 1.0));
  };
  std::vector<uint8_t> q8, k8, v8;
  fill(q8, nq, 0.25 * f.max);
  fill(k8, nk, 0.25 * f.max);
  fill(v8, nv, 0.25 * f.max);
  // Factors: descales of inputs of amplitude ~1 after dequantization; non-powers of two too.
  const float dq = float(4.0 / f.max * 1.1), dk = float(4.0 / f.max * 0.9), dvs = float(4.0 / f.max);
  const float scale_s = float(c.seed % 3 == 0 ? f.max : c.seed % 3 == 1 ? 0.75 * f.max : 0.5 * f.max);
  const float descale_s = 1.0f / scale_s;
  const float scale_o = float(f.max / 8.0);  // |O| <= max |V| ~ 4 after dequantization: no saturation
  const float attn_scale = float(2.5 / std::sqrt(double(c.Dqk)));
  // Lengths: sample 0 full, 1 shorter, 2 empty (padding only).
  std::vector<int32_t> len_q(c.B, c.Sq), len_kv(c.B, c.Skv);
  if (c.padding) {
    for (int b = 0; b < c.B; ++b) {
      if (b % 3 == 1) {
        len_q[b] = std::max(1, c.Sq * 2 / 3);
        len_kv[b] = std::max(1, c.Skv / 2 + 3);
      } else if (b % 3 == 2) {
        len_q[b] = 0;
        len_kv[b] = 0;
      }
    }
  }
  const sdpa::Band band = band_of(c.mask);

  // Device tensors, poisoned outputs.
  DevBuf dq_buf(nq), dk_buf(nk), dv_buf(nv), do_buf(no), dstats(sizeof(float) * c.B * c.Hq * c.Sq);
  DevBuf dfac(sizeof(float) * 8), dml(sizeof(float) * c.Hq), dlq(sizeof(int32_t) * c.B), dlk(sizeof(int32_t) * c.B);
  const int64_t vt_bytes = sm90::fp8_vt_bytes_sm90(c.B, c.Hk, c.Dv, c.Skv);
  DevBuf dvt(size_t(std::max<int64_t>(vt_bytes, 16)));
  upload(dq_buf, q8);
  upload(dk_buf, k8);
  upload(dv_buf, v8);
  upload(dlq, len_q);
  upload(dlk, len_kv);
  // factors: descale_q, descale_k, descale_v, descale_s, scale_s, scale_o, amax_s, amax_o
  const std::vector<float> fac = {dq, dk, dvs, descale_s, scale_s, scale_o, 0.0f, 0.0f};
  upload(dfac, fac);
  float* fp = static_cast<float*>(dfac.p);
  cuda_ok(cudaMemset(fp + 6, 0xff, 2 * sizeof(float)), "poison amax");
  cuda_ok(cudaMemset(do_buf.p, 0xff, no), "poison o");
  cuda_ok(cudaMemset(dstats.p, 0xff, dstats.bytes), "poison stats");
  cuda_ok(cudaMemset(dvt.p, 0xff, dvt.bytes), "poison v_t");
  cuda_ok(cudaMemset(dml.p, 0xff, dml.bytes), "poison max_logit");

  // Parameters, as dispatch/sdpa_params.cpp fills an SDPA forward's (padded tensors).
  SdpaFp8FwdParams p;
  p.q = dq_buf.p;
  p.k = dk_buf.p;
  p.v = dv_buf.p;
  p.qa = TensorAddr{0, sq.s[2], sq.s[1]};
  p.ka = TensorAddr{0, sk.s[2], sk.s[1]};
  p.va = TensorAddr{0, sv.s[2], sv.s[1]};
  p.varlen = 0;
  p.batch = c.B;
  p.num_heads_q = c.Hq;
  p.group_size = c.Hq / c.Hk;
  p.mask_per_head = 1;
  p.head_dqk = c.Dqk;
  p.head_dv = c.Dv;
  p.scale = attn_scale;
  p.scale_log2 = attn_scale * 1.4426950408889634f;
  p.grid_mode = 1;
  p.o = do_buf.p;
  p.oa = TensorAddr{0, so.s[2], so.s[1]};
  p.lse = static_cast<float*>(dstats.p);
  p.lsea = TensorAddr{0, 1, c.Sq};
  p.max_logit = c.max_logit ? static_cast<float*>(dml.p) : nullptr;
  p.pack = 1;
  p.split_schedule = 0;
  AnalyticMaskParams& a = p.analytic;
  a.score.group_v = c.Hq / c.Hk;
  a.band = band;
  if (c.padding) {
    a.seq_len_q.ptr = dlq.p;
    a.seq_len_kv.ptr = dlk.p;
  }
  a.max_q = c.Sq;
  a.max_kv = c.Skv;
  a.start[kSdpaQ].batch_stride = sq.s[0];
  a.start[kSdpaK].batch_stride = sk.s[0];
  a.start[kSdpaV].batch_stride = sv.s[0];
  a.start[kSdpaO].batch_stride = so.s[0];
  a.start[kSdpaStats].batch_stride = int64_t(c.Hq) * c.Sq;
  a.lse_unit = 0.6931471805599453f;
  SdpaFp8Params& f8 = p.fp8;
  f8.format = c.format;
  f8.descale_q = fp + 0;
  f8.descale_k = fp + 1;
  f8.descale_v = fp + 2;
  f8.descale_s = fp + 3;
  f8.scale_s = fp + 4;
  f8.scale_o = fp + 5;
  f8.amax_s = fp + 6;
  f8.amax_o = fp + 7;
  f8.v_t = dvt.p;

  sm90::launch_sdpa_fp8_fwd_sm90(p, view_of(dq_buf.p, c.B, c.Hq, c.Sq, c.Dqk, sq), view_of(dk_buf.p, c.B, c.Hk, c.Skv, c.Dqk, sk),
                                 view_of(dv_buf.p, c.B, c.Hk, c.Skv, c.Dv, sv), nullptr);
  cuda_ok(cudaDeviceSynchronize(), "sdpa fp8 forward");
  const auto go = download<uint8_t>(do_buf, no);
  const auto gstats = download<float>(dstats, size_t(c.B) * c.Hq * c.Sq);
  const auto gfac = download<float>(dfac, 8);
  const auto gml = download<float>(dml, size_t(c.Hq));

  // The float64 loop (on the decoded inputs).
  auto decoded = [&](const std::vector<uint8_t>& t) {
    std::vector<double> d(t.size());
    for (size_t x = 0; x < t.size(); ++x) d[x] = codec.decode(t[x]);
    return d;
  };
  const std::vector<double> qd = decoded(q8), kd = decoded(k8), vd = decoded(v8);
  std::vector<double> oref(no, 0.0), obound(no, 0.0), lse_ref(size_t(c.B) * c.Hq * c.Sq, -INFINITY);
  std::vector<double> ml_ref(c.Hq, -INFINITY);
  double amax_s = 0.0, amax_o = 0.0, max_bound = 0.0;
  const int G = c.Hq / c.Hk;
  std::vector<double> s(c.Skv), pq(c.Skv), err(c.Skv);
  for (int b = 0; b < c.B; ++b) {
    for (int h = 0; h < c.Hq; ++h) {
      const int hk = h / G;
      for (int i = 0; i < len_q[b]; ++i) {
        int64_t lo = 0, hi = 0;
        band.columns(i, len_q[b], len_kv[b], &lo, &hi);
        if (lo >= hi) continue;
        const double* qr = qd.data() + b * sq.s[0] + h * sq.s[1] + i * sq.s[2];
        double m = -INFINITY;
        for (int64_t j = lo; j < hi; ++j) {
          const double* kr = kd.data() + b * sk.s[0] + hk * sk.s[1] + j * sk.s[2];
          double acc = 0.0;
          for (int d = 0; d < c.Dqk; ++d) acc += qr[d] * kr[d];
          s[j] = double(attn_scale) * dq * dk * acc;
          m = std::max(m, s[j]);
        }
        double l = 0.0;
        for (int64_t j = lo; j < hi; ++j) l += std::exp(s[j] - m);
        amax_s = std::max(amax_s, 1.0 / l);
        ml_ref[h] = std::max(ml_ref[h], m);
        lse_ref[(size_t(b) * c.Hq + h) * c.Sq + i] = m + std::log(l);
        for (int64_t j = lo; j < hi; ++j) {
          const double x = std::exp(s[j] - m) / l * scale_s;
          pq[j] = codec.round(x);
          err[j] = 2.0 * std::max(f.u * x, f.h);
        }
        for (int d = 0; d < c.Dv; ++d) {
          double acc = 0.0, bnd = 0.0;
          for (int64_t j = lo; j < hi; ++j) {
            const double vj = vd[b * sv.s[0] + hk * sv.s[1] + j * sv.s[2] + d];
            acc += pq[j] * vj;
            bnd += err[j] * std::fabs(vj);
          }
          const size_t oi = size_t(b * so.s[0] + h * so.s[1] + i * so.s[2] + d);
          oref[oi] = acc * double(descale_s) * dvs;
          obound[oi] = bnd * double(descale_s) * dvs;
          amax_o = std::max(amax_o, std::fabs(oref[oi]));
          max_bound = std::max(max_bound, obound[oi]);
        }
      }
    }
  }

  std::ostringstream fails;
  // O: every element of the padded output (rows past a sample hold exact zeros).
  double max_ref = 0.0;
  for (double x : oref) max_ref = std::max(max_ref, std::fabs(x));
  double se = 0.0, sr = 0.0;
  int bad = 0;
  for (int b = 0; b < c.B; ++b) {
    for (int h = 0; h < c.Hq; ++h) {
      for (int i = 0; i < c.Sq; ++i) {
        for (int d = 0; d < c.Dv; ++d) {
          const size_t oi = size_t(b * so.s[0] + h * so.s[1] + i * so.s[2] + d);
          const double got = codec.decode(go[oi]) / double(scale_o), ref = oref[oi];
          const double tol =
              1.01 * (obound[oi] * (1.0 + f.u) + f.u * std::fabs(ref) + f.h / double(scale_o)) + 1e-5 * max_ref;
          se += (got - ref) * (got - ref);
          sr += ref * ref;
          if (!(std::fabs(got - ref) <= tol) && bad++ < 5) {
            fails << "  O[b" << b << " h" << h << " i" << i << " d" << d << "] = " << got << ", reference " << ref
                  << " (bound " << tol << ")\n";
          }
        }
      }
    }
  }
  if (bad) fails << "  " << bad << " elements of O out of bounds\n";
  if (!(std::sqrt(se) <= 2.0 * f.u * std::sqrt(sr) + 1e-6)) {
    fails << "  O relative L2 error " << std::sqrt(se / std::max(sr, 1e-300)) << " > " << 2.0 * f.u << "\n";
  }
  // LSE: -inf exactly where no key is seen.
  int bad_lse = 0;
  for (size_t x = 0; x < lse_ref.size(); ++x) {
    const double got = gstats[x], ref = lse_ref[x];
    const bool ok = std::isinf(ref) ? (std::isinf(got) && got < 0) : std::fabs(got - ref) <= fs_test::kStatAtol;
    if (!ok && bad_lse++ < 5) fails << "  LSE[" << x << "] = " << got << ", reference " << ref << "\n";
  }
  if (c.max_logit) {
    for (int h = 0; h < c.Hq; ++h) {
      const double got = gml[h], ref = ml_ref[h];
      const bool ok = std::isinf(ref) ? (std::isinf(got) && got < 0) : std::fabs(got - ref) <= fs_test::kStatAtol;
      if (!ok) fails << "  max_logit[" << h << "] = " << got << ", reference " << ref << "\n";
    }
  }
  if (!(std::fabs(gfac[6] - amax_s) <= 1e-4 * amax_s + 1e-12)) {
    fails << "  amax_s = " << gfac[6] << ", reference " << amax_s << "\n";
  }
  if (!(std::fabs(gfac[7] - amax_o) <= 1.01 * max_bound + 1e-5 * amax_o + 1e-12)) {
    fails << "  amax_o = " << gfac[7] << ", reference " << amax_o << " (bound " << max_bound << ")\n";
  }
  // The factors themselves are inputs: untouched.
  for (int x = 0; x < 6; ++x) {
    if (gfac[x] != fac[x]) fails << "  factor " << x << " changed\n";
  }
  const std::string out = fails.str();
  return out.empty() ? out : c.name() + ":\n" + out;
}

bool fp8_device() {
  if (!gpu_available()) return false;
  return sm90::device_supported(0);
}

#define REQUIRE_SM90()                                                                          \
  do {                                                                                          \
    REQUIRE_GPU();                                                                              \
    if (!fp8_device()) GTEST_SKIP() << "not an sm_90 device with this build's sm_90a code";     \
  } while (0)

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
      c.seed = 1000 + uint64_t(n);
      const auto& d = dims[(n + format) % 7];
      c.Dqk = d[0];
      c.Dv = d[1];
      c.B = 1 + int(rng() % 3);
      c.Hk = 1 + int(rng() % 2);
      c.Hq = c.Hk * (1 + int(rng() % 3));
      c.Sq = 1 + int(rng() % 300);
      c.Skv = 1 + int(rng() % 400);
      c.mask = masks[i % 4];
      c.padding = (i / 4) % 2 == 1;
      c.bshd = (n % 3) == 1;
      c.max_logit = (n % 2) == 0;
      const std::string e = run_case(c);
      EXPECT_TRUE(e.empty()) << e;
    }
  }
  // Whole tiles, GQA 4 and one long sample: several key blocks per item and the running max moving.
  for (int format = 1; format <= 2; ++format) {
    Fp8Case c;
    c.format = format;
    c.B = 1;
    c.Hq = 4;
    c.Hk = 1;
    c.Sq = 256;
    c.Skv = 768;
    c.Dqk = c.Dv = format == 1 ? 128 : 64;
    c.mask = kCausalBottomRight;
    c.seed = 77 + uint64_t(format);
    const std::string e = run_case(c);
    EXPECT_TRUE(e.empty()) << e;
  }
}

// Small cases for compute-sanitizer (memcheck / racecheck / synccheck): both kernel head dims, both
// formats, padding with an empty sample, causal, GQA.
TEST(SdpaFp8Gpu, Sm90ForwardSanitizerSmall) {
  REQUIRE_SM90();
  Fp8Case c;
  c.B = 3;
  c.Hq = 2;
  c.Hk = 1;
  c.Sq = 70;
  c.Skv = 150;
  c.mask = kCausalBottomRight;
  c.padding = true;
  for (int format = 1; format <= 2; ++format) {
    for (int d : {64, 128}) {
      c.format = format;
      c.Dqk = c.Dv = d;
      c.seed = uint64_t(10 * format + d);
      const std::string e = run_case(c);
      EXPECT_TRUE(e.empty()) << e;
    }
  }
}

#endif  // FLASHSPAN_WITH_CUDA

}  // namespace
}  // namespace flashspan::test
