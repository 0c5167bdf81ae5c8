// GPU tests of SDPA's forward over paged K/V caches (kv_addr.cuh PagedKv, kernel_fwd_sm80.cuh
// sdpa_fwd_paged_kernel_sm80) through the C++ API on CUDA tensors, against the SDPA CPU reference
// run through the same API on host copies of the same inputs (the reference gathers through the
// page tables too; test_sdpa_cpu_features.py checks it against a dense float64 oracle).
//
// Cases (sdpa_paged_case.h): prefill and decode, page sizes 1 .. 256 per side (a 64-key block
// spans up to 64 pages, or a page holds several blocks), shuffled pages, ragged lengths with a
// sample without keys, unused pages and rows past a sample NaN, table entries past a sample's
// pages garbage, contiguous or packed tables, page-major or token-major containers, K or V alone
// paged, GQA and H_k != H_v, both dtypes, every head-dim tile, masks in both alignments, softcap.
// Outputs are NaN-poisoned before the GPU run; a bad table entry must give NaN, not a read out of
// bounds (PagedBadEntryIsNaN). The tests switch paged K/V on in-process (set_sdpa_paged_enabled),
// whatever FLASHSPAN_SDPA_PAGED says. Skips when no CUDA device is visible (or the build has no CUDA).
//
// Score features with paged K/V (feature pairs, on by default since these tests passed on an H200,
// FLASHSPAN_SDPA_FEATURE_PAIRS=0 off; the tests switch sdpa_feature_pairs_enabled on in-process,
// whatever that variable says): BiasRandom, 40 random cases (prefill and
// decode shapes, every page size, GQA, both dtypes) each with an additive bias in one of the 16
// broadcast forms (every form drawn), q's dtype or float32, padded strides on some; DropoutRandom,
// 40 random cases with Philox dropout (probabilities 0 .. 0.9, int32 / int64 seed and offset,
// rng_dump none, float32 or uint8, compared bitwise against the reference's dump) or the caller's
// mask (every broadcast form, uint8 / float16 / bfloat16 / float32, padded strides on some), a bias
// besides on some; FeaturePairsSanitizerSmall, 3 small cases with bias, Philox and rng_dump
// together for compute-sanitizer memcheck (gpu_check.sh). Bias and mask are NaN (uint8 mask: 255)
// where no sample reads them; O, LSE and rng_dump are NaN / 0xff-poisoned before the GPU run.
// SdpaPaged.FeaturePairCasesOnTheCpuReference (no GPU) checks that the generators of these tests
// draw every form and that the CPU reference takes the cases and agrees with a dense oracle.
//
// The sm90 paged forward (Sm90Paged*: each call must run on it, sm90::sdpa_fwd_paged_launches); with packed (THD) q,
// o and the stats (Sm90PagedThd*; on by default since they passed on an H100, 2026-12-06, PERF_LOG v2.55:
// sdpa_sm90_paged_thd_enabled, forced on in-process; FLASHSPAN_SM90_SDPA_PAGED_THD=0 off) random packed prefill cases
// with a sample without queries and one without keys, a packed output gate on half, the bad-entry NaN fill through the
// sample maps' flags, a small set for memcheck / synccheck, and the switch off keeping the sm80 paged kernel; with an
// additive bias (Sm90PagedBias*; on by default since they passed on an H100, 2026-12-06: sdpa_sm90_paged_bias_enabled,
// forced on in-process; FLASHSPAN_SM90_SDPA_PAGED_BIAS=0 off) random prefill cases in every broadcast form, a small
// set for memcheck / synccheck, and the switch off keeping the sm80 paged kernel.
// SdpaPaged.Sm90ThdGpuCasesOnTheCpuReference and Sm90BiasGpuCasesOnTheCpuReference (no GPU) check their cases on the
// CPU reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/philox.h"  // dropout_keep, dropout_threshold (the dense oracle's Philox)
#include "core/sdpa_band.h"
#include "dispatch/sdpa_launch.h"
#include "error_criteria.h"
#include "flashspan/flashspan.hpp"
#include "gpu_harness.h"
#include "kernels/sm90/launch_sm90.h"  // sm90::sdpa_fwd_paged_launches
#include "scoped_env.h"
#include "sdpa_paged_case.h"

namespace flashspan::test {
namespace {

#ifndef FLASHSPAN_WITH_CUDA

TEST(SdpaPagedGpu, Skipped) { GTEST_SKIP() << "flashspan was built without CUDA"; }

#else

namespace api = flashspan::api;
using namespace sdpa_paged;

// Device twin of a byte buffer.
struct Twin {
  std::unique_ptr<DevBuf> dev;
  void up(const void* host, size_t bytes) {
    dev = std::make_unique<DevBuf>(bytes ? bytes : 16);
    if (bytes) cuda_ok(cudaMemcpy(dev->p, host, bytes, cudaMemcpyHostToDevice), "upload");
  }
  void poison() { cuda_ok(cudaMemset(dev->p, 0xff, dev->bytes), "poison"); }
  std::vector<uint8_t> down(size_t bytes) const {
    std::vector<uint8_t> out(bytes);
    cuda_ok(cudaMemcpy(out.data(), dev->p, bytes, cudaMemcpyDeviceToHost), "download");
    return out;
  }
};

// An int32 / int64 index array on host and device.
struct IndexBuf {
  std::vector<uint8_t> host;
  int64_t n = 0;
  bool is64 = false;
  Twin dev;
  void make(const std::vector<int64_t>& v, bool i64, bool device) {
    n = int64_t(v.size());
    is64 = i64;
    host.assign(std::max<size_t>(v.size(), 1) * (i64 ? 8 : 4), 0);
    for (size_t i = 0; i < v.size(); ++i) {
      if (i64) {
        std::memcpy(host.data() + 8 * i, &v[i], 8);
      } else {
        const int32_t x = int32_t(v[i]);
        std::memcpy(host.data() + 4 * i, &x, 4);
      }
    }
    if (device) dev.up(host.data(), host.size());
  }
  void* ptr(bool cuda) { return cuda ? dev.dev->p : host.data(); }
  api::TensorDesc desc(bool cuda) const {
    return api::TensorDesc(nullptr, is64 ? api::kInt64 : api::kInt32, fs_device_t{cuda ? FS_DEVICE_CUDA : FS_DEVICE_CPU, 0},
                           {n});
  }
};

fs_dtype_t api_dtype(DType t) {
  return t == DType::kFloat32    ? api::kFloat32
         : t == DType::kBFloat16 ? api::kBFloat16
         : t == DType::kUInt8    ? api::kUInt8
                                 : api::kFloat16;
}

api::TensorDesc desc_of(const sdpa_case::Storage& s, bool cuda) {
  return api::TensorDesc(nullptr, api_dtype(s.dtype), fs_device_t{cuda ? FS_DEVICE_CUDA : FS_DEVICE_CPU, 0},
                         {s.lay.B, s.lay.H, s.lay.S, s.lay.D}, s.lay.strides);
}

// A case's host data and the device twins of every buffer.
struct PagedRun {
  PagedData d;
  Twin q, k, v, o, stats, ml, table_k, table_v;
  IndexBuf len_q, len_kv, rag_q, off_k, off_v;
  std::vector<float> ml_host;
  // Score features (PagedCase::bias, philox(), dropout_mask, rng_dump): their device twins, the
  // Philox seed / offset ({1}, int32 / int64) and the mask's scale ({1} float32).
  Twin bias, drop_mask, drop_scale, dump, gate;
  IndexBuf drop_seed, drop_offset;
  float drop_scale_host[1] = {1.0f};

  // device: make the device twins too (false: the CPU reference only, no GPU needed).
  explicit PagedRun(const PagedCase& c, bool device = true) : d(make_paged_data(c)) {
    const bool i64 = c.lengths64;
    if (c.cu_lengths) {
      len_q.make(sdpa_case::prefix_sums(d.len_q), i64, device);
      len_kv.make(sdpa_case::prefix_sums(d.len_kv), i64, device);
    } else {
      len_q.make(d.len_q, i64, device);
      len_kv.make(d.len_kv, i64, device);
    }
    if (c.thd_q) rag_q.make(d.tok_q, !i64, device);
    ml_host.assign(size_t(c.Hq), NAN);
    if (d.k.table.packed) off_k.make(d.k.table.offsets, i64, device);
    if (d.v.table.packed) off_v.make(d.v.table.offsets, !i64, device);
    if (c.philox()) {
      drop_seed.make({c.dropout_seed}, c.dropout_i64, device);
      drop_offset.make({c.dropout_offset}, c.dropout_i64, device);
    }
    drop_scale_host[0] = c.dropout_scale;
    if (!device) return;
    q.up(d.q.host.data(), d.q.host.size());
    k.up(d.k.data.host.data(), d.k.data.host.size());
    v.up(d.v.data.host.data(), d.v.data.host.size());
    o.up(d.o.host.data(), d.o.host.size());
    stats.up(d.stats.host.data(), d.stats.host.size());
    ml.up(ml_host.data(), ml_host.size() * 4);
    if (d.k.paged()) table_k.up(d.k.table.entries.data(), d.k.table.entries.size() * 4);
    if (d.v.paged()) table_v.up(d.v.table.entries.data(), d.v.table.entries.size() * 4);
    if (c.bias) bias.up(d.bias.host.data(), d.bias.host.size());
    if (c.dropout_mask) {
      drop_mask.up(d.drop_mask.host.data(), d.drop_mask.host.size());
      drop_scale.up(drop_scale_host, sizeof(drop_scale_host));
    }
    if (has_dump()) dump.up(d.dump.host.data(), d.dump.host.size());
    if (c.gate) gate.up(d.gate.host.data(), d.gate.host.size());
  }

  bool has_dump() const { return d.c.philox() && d.c.rng_dump; }

  // The forward on the CPU reference (host buffers: d.o, d.stats, ml_host) or the GPU.
  void forward(bool cuda) {
    const PagedCase& c = d.c;
    const fs_device_t dev{cuda ? FS_DEVICE_CUDA : FS_DEVICE_CPU, 0};
    api::SdpaAttributes a;
    a.set_attn_scale(c.scale).set_generate_stats(true);
    if (c.softcap > 0) a.set_softcap(c.softcap);
    if (c.bottom_right) a.set_diagonal_alignment(api::DiagonalAlignment::kBottomRight);
    if (c.has_left) a.set_diagonal_band_left_bound(c.left);
    if (c.has_right) a.set_diagonal_band_right_bound(c.right);
    a.set_padding_mask(true);
    if (c.cu_lengths) {
      a.set_cu_seq_len_q(len_q.desc(cuda)).set_cu_seq_len_kv(len_kv.desc(cuda));
    } else {
      a.set_seq_len_q(len_q.desc(cuda)).set_seq_len_kv(len_kv.desc(cuda));
    }
    if (c.gate) a.set_gate(desc_of(d.gate, cuda));
    if (c.thd_q) {
      for (fs_sdpa_slot_t s : {FS_SDPA_Q, FS_SDPA_O, FS_SDPA_STATS, FS_SDPA_GATE}) {
        if (s == FS_SDPA_GATE && !c.gate) continue;
        const sdpa_case::Storage& t = s == FS_SDPA_Q ? d.q
                                      : s == FS_SDPA_O ? d.o
                                      : s == FS_SDPA_STATS ? d.stats
                                                         : d.gate;
        a.set_ragged_offset(s, rag_q.desc(cuda), t.lay.strides[2]);
      }
    }
    for (int side = 0; side < 2; ++side) {
      const PagedSide& ps = side == 0 ? d.k : d.v;
      if (!ps.paged()) continue;
      const PageTable& t = ps.table;
      const api::TensorDesc td(nullptr, api::kInt32, dev, {c.B, 1, t.max_pages, 1}, {t.max_pages, t.max_pages, 1, 1});
      if (side == 0) {
        a.set_paged_attention_k_table(td);
      } else {
        a.set_paged_attention_v_table(td);
      }
      if (t.packed) {
        a.set_ragged_offset(side == 0 ? FS_SDPA_PAGE_TABLE_K : FS_SDPA_PAGE_TABLE_V,
                            (side == 0 ? off_k : off_v).desc(cuda), 1);
      }
    }
    if (c.set_max_seq) a.set_paged_attention_max_seq_len_kv(c.Skv);
    if (c.max_logit) a.set_max_logit(api::TensorDesc(nullptr, api::kFloat32, dev, {c.Hq}));
    if (c.bias) a.set_bias(desc_of(d.bias, cuda));
    if (c.philox()) a.set_dropout(c.dropout_p, drop_seed.desc(cuda), drop_offset.desc(cuda));
    if (c.dropout_mask) {
      a.set_dropout_mask(desc_of(d.drop_mask, cuda), api::TensorDesc(nullptr, api::kFloat32, dev, {1}));
    }
    if (has_dump()) a.set_rng_dump(desc_of(d.dump, cuda));
    const api::TensorDesc st = desc_of(d.stats, cuda);
    api::SdpaFwd fwd(desc_of(d.q, cuda), desc_of(d.k.data, cuda), desc_of(d.v.data, cuda), desc_of(d.o, cuda), &st, a);
    fwd.check_support();
    fwd.compile();
    api::SdpaVariantPack pack;
    auto P = [&](Twin& t, void* host) { return cuda ? t.dev->p : host; };  // (no device twin read when !cuda)
    pack.set(FS_SDPA_Q, P(q, d.q.host.data())).set(FS_SDPA_K, P(k, d.k.data.host.data()));
    pack.set(FS_SDPA_V, P(v, d.v.data.host.data())).set(FS_SDPA_O, P(o, d.o.host.data()));
    pack.set(FS_SDPA_STATS, P(stats, d.stats.host.data()));
    if (c.max_logit) pack.set(FS_SDPA_MAX_LOGIT, P(ml, ml_host.data()));
    pack.set(c.cu_lengths ? FS_SDPA_CU_SEQ_LEN_Q : FS_SDPA_SEQ_LEN_Q, len_q.ptr(cuda));
    pack.set(c.cu_lengths ? FS_SDPA_CU_SEQ_LEN_KV : FS_SDPA_SEQ_LEN_KV, len_kv.ptr(cuda));
    if (c.gate) pack.set(FS_SDPA_GATE, P(gate, d.gate.host.data()));
    if (c.thd_q) {
      for (fs_sdpa_slot_t s : {FS_SDPA_RAGGED_OFFSET_Q, FS_SDPA_RAGGED_OFFSET_O, FS_SDPA_RAGGED_OFFSET_STATS})
        pack.set(s, rag_q.ptr(cuda));
      if (c.gate) pack.set(FS_SDPA_RAGGED_OFFSET_GATE, rag_q.ptr(cuda));
    }
    if (d.k.paged()) pack.set(FS_SDPA_PAGE_TABLE_K, P(table_k, d.k.table.entries.data()));
    if (d.v.paged()) pack.set(FS_SDPA_PAGE_TABLE_V, P(table_v, d.v.table.entries.data()));
    if (d.k.table.packed) pack.set(FS_SDPA_RAGGED_OFFSET_PAGE_TABLE_K, off_k.ptr(cuda));
    if (d.v.table.packed) pack.set(FS_SDPA_RAGGED_OFFSET_PAGE_TABLE_V, off_v.ptr(cuda));
    if (c.bias) pack.set(FS_SDPA_BIAS, P(bias, d.bias.host.data()));
    if (c.philox()) {
      pack.set(FS_SDPA_DROPOUT_SEED, drop_seed.ptr(cuda)).set(FS_SDPA_DROPOUT_OFFSET, drop_offset.ptr(cuda));
    }
    if (c.dropout_mask) {
      pack.set(FS_SDPA_DROPOUT_MASK, P(drop_mask, d.drop_mask.host.data()));
      pack.set(FS_SDPA_DROPOUT_SCALE, P(drop_scale, drop_scale_host));
    }
    if (has_dump()) pack.set(FS_SDPA_RNG_DUMP, P(dump, d.dump.host.data()));
    const size_t ws = fwd.workspace_size();
    DevBuf w(cuda ? ws : 0);
    fwd.execute(pack, w.p, ws, nullptr);
    if (cuda) cuda_ok(cudaDeviceSynchronize(), "sdpa paged forward");
  }
};

// got (device bytes) against the reference storage: the criteria on written elements, and
// elements the reference left NaN (gaps of a packed O) still NaN.
::testing::AssertionResult same(const sdpa_case::Storage& ref, const std::vector<uint8_t>& got, bool stat) {
  const std::vector<double> r = sdpa_case::Storage::values(ref.host, ref.dtype),
                            g = sdpa_case::Storage::values(got, ref.dtype);
  for (size_t i = 0; i < r.size(); ++i)
    if (std::isnan(r[i]) && !std::isnan(g[i]))
      return ::testing::AssertionFailure() << "element " << i << " outside the samples was written: " << g[i];
  return stat ? fs_test::stat_close(g, r) : fs_test::tensor_close(g, r, ref.dtype);
}

// Elements of the rng_dump whose bytes differ between the reference's dump and got (bitwise).
int64_t dump_mismatches(const sdpa_case::Storage& ref, const std::vector<uint8_t>& got) {
  const size_t es = ref.esize();
  int64_t diff = 0;
  for (size_t i = 0; i + es <= ref.host.size(); i += es) {
    diff += std::memcmp(ref.host.data() + i, got.data() + i, es) != 0;
  }
  return diff;
}

// Reference on the host, then the GPU on poisoned outputs; compare O, stats, max_logit.
void run_case(const PagedCase& c) {
  SCOPED_TRACE(c.str());
  PagedRun r(c);
  r.forward(/*cuda=*/false);
  r.o.poison();
  r.stats.poison();
  r.ml.poison();
  if (r.has_dump()) r.dump.poison();
  r.forward(/*cuda=*/true);
  if (r.has_dump()) {
    // The keep mask: bitwise the reference's (core/philox.h on both sides), 0 outside the samples.
    EXPECT_EQ(dump_mismatches(r.d.dump, r.dump.down(r.d.dump.host.size())), 0) << "rng_dump elements differ";
  }
  EXPECT_TRUE(same(r.d.o, r.o.down(r.d.o.host.size()), false)) << "O";
  EXPECT_TRUE(same(r.d.stats, r.stats.down(r.d.stats.host.size()), true)) << "stats";
  if (c.max_logit) {
    std::vector<double> g(size_t(c.Hq)), ref(size_t(c.Hq));
    const std::vector<uint8_t> bytes = r.ml.down(size_t(c.Hq) * 4);
    for (int64_t h = 0; h < c.Hq; ++h) {
      float x;
      std::memcpy(&x, bytes.data() + 4 * h, 4);
      g[size_t(h)] = x;
      ref[size_t(h)] = r.ml_host[size_t(h)];
    }
    EXPECT_TRUE(fs_test::stat_close(g, ref)) << "max_logit";
  }
}

// Element (b, h, i, j) of a [1|B, 1|H_q, 1|S_q, 1|S_kv] storage (the bias, the dropout mask).
double broadcast_at(const sdpa_case::Storage& t, int64_t b, int64_t h, int64_t i, int64_t j) {
  const sdpa_case::Layout& l = t.lay;
  return t.get(l.at(l.B == 1 ? 0 : b, l.H == 1 ? 0 : h, l.S == 1 ? 0 : i, l.D == 1 ? 0 : j));
}

// Whether Philox keeps element (b, h, i, j) of a case (core/philox.h, the rule of the reference and
// the kernels).
bool philox_keep(const PagedCase& c, int64_t b, int64_t h, int64_t i, int64_t j) {
  return dropout_keep(uint64_t(c.dropout_seed), uint64_t(c.dropout_offset), uint32_t(b * c.Hq + h), uint32_t(i),
                      uint32_t(j), dropout_threshold(double(c.dropout_p)));
}

// The dropout multiplier of element (b, h, i, j): keep / (1 - p) (Philox), mask * scale, or 1.
double dropout_mult(const PagedData& d, int64_t b, int64_t h, int64_t i, int64_t j) {
  const PagedCase& c = d.c;
  if (c.philox()) return philox_keep(c, b, h, i, j) ? double(1.0f / (1.0f - c.dropout_p)) : 0.0;
  if (c.dropout_mask) return broadcast_at(d.drop_mask, b, h, i, j) * double(c.dropout_scale);
  return 1.0;
}

// O of the dense computation of a case (double; dense K / V of sdpa_paged_case.h, the band of
// core/sdpa_band.h, softcap, the additive bias, dropout after the softmax, the output gate's sigmoid):
// [b][h][i][d] for i < len_q[b] (rows that see nothing: 0).
std::vector<double> dense_o(const PagedData& d) {
  const PagedCase& c = d.c;
  const sdpa::Band band{c.has_left ? 1 : 0, c.has_right ? 1 : 0, c.bottom_right ? 1 : 0, c.left, c.right};
  std::vector<double> out(size_t(c.B * c.Hq * c.Sq * c.Dv), 0.0);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h) {
      const int64_t hk = h / (c.Hq / c.Hk), hv = h / (c.Hq / c.Hv);
      for (int64_t i = 0; i < d.len_q[size_t(b)]; ++i) {
        int64_t lo = 0, hi = 0;
        band.columns(i, d.len_q[size_t(b)], d.len_kv[size_t(b)], &lo, &hi);
        std::vector<double> x;
        double m = -INFINITY;
        for (int64_t j = lo; j < hi; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < c.Dqk; ++e)
            dot += d.q.get(d.q.lay.at(b, h, i, e)) * d.dense_k[size_t(((b * c.Hk + hk) * c.Skv + j) * c.Dqk + e)];
          double xj = double(c.scale) * dot;
          if (c.softcap > 0) xj = double(c.softcap) * std::tanh(xj / double(c.softcap));
          if (c.bias) xj += broadcast_at(d.bias, b, h, i, j);
          x.push_back(xj);
          m = std::max(m, xj);
        }
        double l = 0;
        for (double xj : x) l += std::exp(xj - m);
        for (int64_t e = 0; e < c.Dv && hi > lo; ++e) {
          double o = 0;
          for (int64_t j = lo; j < hi; ++j)
            o += std::exp(x[size_t(j - lo)] - m) / l * dropout_mult(d, b, h, i, j) *
                 d.dense_v[size_t(((b * c.Hv + hv) * c.Skv + j) * c.Dv + e)];
          if (c.gate) o /= 1.0 + std::exp(-d.gate.get(d.gate.lay.at(b, h, i, e)));
          out[size_t(((b * c.Hq + h) * c.Sq + i) * c.Dv + e)] = o;
        }
      }
    }
  return out;
}

// The CPU reference (the GPU tests' oracle) on a case of the GPU tests against dense_o, and its
// rng_dump against core/philox.h (keep: 1 inside the samples, 0 elsewhere, every element written).
void check_on_the_cpu_reference(const PagedCase& c) {
  SCOPED_TRACE(c.str());
  PagedRun r(c, /*device=*/false);
  r.forward(/*cuda=*/false);
  const std::vector<double> want = dense_o(r.d);
  std::vector<double> got(want.size(), 0.0);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < r.d.len_q[size_t(b)]; ++i)
        for (int64_t e = 0; e < c.Dv; ++e)
          got[size_t(((b * c.Hq + h) * c.Sq + i) * c.Dv + e)] = r.d.o.get(r.d.o.lay.at(b, h, i, e));
  ASSERT_TRUE(fs_test::tensor_close(got, want, c.dtype)) << "O";
  if (r.has_dump()) {
    const sdpa_case::Storage& dump = r.d.dump;
    int64_t bad = 0;
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.Hq; ++h)
        for (int64_t i = 0; i < c.Sq; ++i)
          for (int64_t j = 0; j < dump.lay.D; ++j) {
            const bool inside = i < r.d.len_q[size_t(b)] && j < r.d.len_kv[size_t(b)];
            const double want_keep = inside && philox_keep(c, b, h, i, j) ? 1.0 : 0.0;
            bad += dump.get(dump.lay.at(b, h, i, j)) != want_keep;
          }
    EXPECT_EQ(bad, 0) << "rng_dump elements differ from core/philox.h";
  }
}

// The CPU reference (the GPU tests' oracle) on cases of the GPU tests against dense_o: checks
// the cases and the API plumbing of these tests without a GPU (runs in CI).
TEST(SdpaPaged, GpuTestCasesOnTheCpuReference) {
  std::vector<PagedCase> cases;
  for (uint64_t seed = 1; seed <= 12; ++seed) cases.push_back(random_paged_case(seed, false));
  for (uint64_t seed = 101; seed <= 112; ++seed) cases.push_back(random_paged_case(seed, true));
  for (const PagedCase& c : cases) {
    check_on_the_cpu_reference(c);
    if (::testing::Test::HasFailure()) return;
  }
}

// The cases of the packed (THD) sm90 paged GPU tests (Sm90PagedThdRandom's first 12, the bad-entry cases with q
// packed) on the CPU reference against dense_o: the packed samples' rows (one sample without queries, one without
// keys) are where the oracle has them. No GPU.
TEST(SdpaPaged, Sm90ThdGpuCasesOnTheCpuReference) {
  std::vector<PagedCase> cases;
  for (uint64_t seed = 601; seed <= 612; ++seed) cases.push_back(random_sm90_paged_thd_case(seed));
  for (BadEntryCase b : sm90_bad_entry_cases()) {
    b.c.thd_q = true;
    cases.push_back(b.c);
  }
  for (const PagedCase& c : cases) {
    check_on_the_cpu_reference(c);
    if (::testing::Test::HasFailure()) return;
  }
}

// The cases of the sm90 paged GPU tests with a bias (Sm90PagedBiasRandom's first 16: every broadcast form; the
// sanitizer set's) on the CPU reference against dense_o. No GPU.
TEST(SdpaPaged, Sm90BiasGpuCasesOnTheCpuReference) {
  std::vector<PagedCase> cases;
  for (uint64_t seed = 701; seed <= 716; ++seed) cases.push_back(random_sm90_paged_bias_case(seed));
  for (const PagedCase& c : cases) {
    check_on_the_cpu_reference(c);
    if (::testing::Test::HasFailure()) return;
  }
}

// The cases of BiasRandom and DropoutRandom (decode shapes on every third seed).
std::vector<PagedCase> bias_cases() {
  std::vector<PagedCase> cases;
  for (uint64_t seed = 201; seed <= 240; ++seed) cases.push_back(random_bias_case(seed, /*decode=*/seed % 3 == 0));
  return cases;
}
std::vector<PagedCase> dropout_cases() {
  std::vector<PagedCase> cases;
  for (uint64_t seed = 401; seed <= 440; ++seed) cases.push_back(random_dropout_case(seed, /*decode=*/seed % 3 == 0));
  return cases;
}

// The shape of the sanitizer sets' small cases (SanitizerSmall, FeaturePairsSanitizerSmall, Sm90PagedSanitizerSmall):
// case i of seed `seed`, B = 3, H_q = 4, H_k = 2, H_v = hv, S_q = sq, S_kv = 150, head dims d, page sizes `pages`
// (0: that side contiguous), a paged K's table packed on even i, a paged V's on odd i, a sample without keys,
// bottom-right causal.
PagedCase small_case(uint64_t seed, int i, const int64_t (&pages)[2], int64_t hv, int64_t sq, int64_t d) {
  PagedCase c;
  c.seed = seed;
  c.B = 3;
  c.Hq = 4;
  c.Hk = 2;
  c.Hv = hv;
  c.Sq = sq;
  c.Skv = 150;
  c.Dqk = c.Dv = d;
  c.page_k = pages[0];
  c.page_v = pages[1];
  c.packed_k = c.page_k > 0 && i % 2 == 0;
  c.packed_v = c.page_v > 0 && i % 2 == 1;
  c.zero_kv_sample = true;
  c.has_right = true;
  c.bottom_right = true;
  return c;
}

// The cases of FeaturePairsSanitizerSmall: an additive bias, Philox dropout and its rng_dump together
// on SanitizerSmall's shapes (a sample without keys, GQA, bottom-right causal, page sizes 1 / 16 / 128
// with packed tables, K alone paged; prefill and decode); the bias full, broadcast over B and H_q in
// float32, or over S_q with padded strides; the dump float32 or uint8; int32 or int64 seed and
// offset; the call's S_kv the tables' capacity on the last (bias and dump wider than the keys).
std::vector<PagedCase> feature_pairs_small_cases() {
  std::vector<PagedCase> cases;
  const int64_t pages[][2] = {{1, 16}, {16, 0}, {128, 4}};
  for (int i = 0; i < 3; ++i) {
    PagedCase c = small_case(3100 + uint64_t(i), i, pages[i], 2, i == 1 ? 1 : 33, 32);
    c.set_max_seq = i != 2;
    c.bias = i == 0 ? 1 : i == 1 ? 1 + 1 + 2 : 1 + 4;
    c.bias_f32 = i == 1;
    c.bias_strided = i == 2;
    c.dropout_p = i == 1 ? 0.5f : 0.3f;
    c.dropout_seed = 42 + i;
    c.dropout_offset = 5;
    c.dropout_i64 = i == 2;
    c.rng_dump = true;
    c.rng_dump_dtype = i == 1 ? DType::kUInt8 : DType::kFloat32;
    cases.push_back(c);
  }
  return cases;
}

// The generators of BiasRandom and DropoutRandom draw every form (bias: the 16 broadcast forms, both
// dtypes, padded strides or not; Philox: probability 0 and above, int32 / int64, rng_dump none /
// float32 / uint8; mask: the 16 broadcast forms, the four dtypes, padded strides or not; prefill and
// decode shapes, both q dtypes, both sides paged and one alone), and the CPU reference takes their
// cases (and FeaturePairsSanitizerSmall's) and agrees with dense_o (bias and dropout included) and
// core/philox.h (rng_dump). No GPU.
TEST(SdpaPaged, FeaturePairCasesOnTheCpuReference) {
  const std::vector<PagedCase> bc = bias_cases(), dc = dropout_cases(), sc = feature_pairs_small_cases();
  std::set<int> bias_forms, mask_forms;
  std::set<std::string> seen;
  auto note = [&](const PagedCase& c, const std::string& test) {
    seen.insert(test + (c.Sq == 1 ? " decode" : " prefill"));
    seen.insert(test + " q " + dtype_name(c.dtype));
    seen.insert(test + (c.page_k > 0 && c.page_v > 0 ? " both paged" : " one side paged"));
    if (!c.set_max_seq) seen.insert(test + " capacity S_kv");
  };
  for (const PagedCase& c : bc) {
    note(c, "bias");
    ASSERT_TRUE(c.bias >= 1 && c.bias <= 16 && !c.philox() && !c.dropout_mask) << c.str();
    bias_forms.insert(c.bias);
    seen.insert(std::string("bias ") + (c.bias_f32 ? "f32" : "q dtype"));
    seen.insert(std::string("bias ") + (c.bias_strided ? "strided" : "contiguous"));
  }
  for (const PagedCase& c : dc) {
    note(c, "dropout");
    ASSERT_TRUE(c.philox() != (c.dropout_mask != 0)) << c.str();
    if (c.philox()) {
      seen.insert(std::string("philox ") + (c.dropout_p_zero ? "p = 0" : "p > 0"));
      seen.insert(std::string("philox ") + (c.dropout_i64 ? "int64" : "int32"));
      seen.insert(std::string("philox rng_dump ") + (c.rng_dump ? dtype_name(c.rng_dump_dtype) : "none"));
      if (c.dropout_seed < 0) seen.insert("philox negative seed");
    } else {
      mask_forms.insert(c.dropout_mask);
      seen.insert(std::string("mask ") + dtype_name(c.dropout_mask_dtype));
      seen.insert(std::string("mask ") + (c.dropout_mask_strided ? "strided" : "contiguous"));
    }
    if (c.bias) seen.insert("dropout with bias");
  }
  EXPECT_EQ(bias_forms.size(), 16u);
  EXPECT_EQ(mask_forms.size(), 16u);
  for (const std::string test : {"bias", "dropout"}) {
    for (const char* what : {" decode", " prefill", " q bfloat16", " q float16", " both paged", " one side paged",
                             " capacity S_kv"}) {
      EXPECT_TRUE(seen.count(test + what)) << test + what << " not drawn";
    }
  }
  const std::string f32 = dtype_name(DType::kFloat32), u8 = dtype_name(DType::kUInt8);
  const std::string f16 = dtype_name(DType::kFloat16), bf16 = dtype_name(DType::kBFloat16);
  const std::string forms[] = {"bias f32", "bias q dtype", "bias strided", "bias contiguous", "philox p = 0",
                               "philox p > 0", "philox int64", "philox int32", "philox rng_dump " + f32,
                               "philox rng_dump " + u8, "philox rng_dump none", "philox negative seed", "mask " + u8,
                               "mask " + f16, "mask " + bf16, "mask " + f32, "mask strided", "mask contiguous",
                               "dropout with bias"};
  for (const std::string& what : forms) EXPECT_TRUE(seen.count(what)) << what << " not drawn";
  for (const std::vector<PagedCase>* cases : {&sc, &bc, &dc}) {
    for (const PagedCase& c : *cases) {
      check_on_the_cpu_reference(c);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

struct PagedOn {
  PagedOn() { set_sdpa_paged_enabled(1); }
  ~PagedOn() { set_sdpa_paged_enabled(-1); }
};

// The feature pairs (sdpa_feature_pairs_enabled: the bias and dropout with paged K/V) forced on for a
// test, the environment's answer (on unless FLASHSPAN_SDPA_FEATURE_PAIRS=0) after it; paged K/V too.
struct FeaturePairsOn {
  PagedOn paged;
  FeaturePairsOn() { set_sdpa_feature_pairs_enabled(1); }
  ~FeaturePairsOn() { set_sdpa_feature_pairs_enabled(-1); }
  FeaturePairsOn(const FeaturePairsOn&) = delete;
  FeaturePairsOn& operator=(const FeaturePairsOn&) = delete;
};

TEST(SdpaPagedGpu, PrefillRandom) {
  REQUIRE_GPU();
  PagedOn on;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    run_case(random_paged_case(seed, /*decode=*/false));
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaPagedGpu, DecodeRandom) {
  REQUIRE_GPU();
  PagedOn on;
  for (uint64_t seed = 101; seed <= 160; ++seed) {
    run_case(random_paged_case(seed, /*decode=*/true));
    if (::testing::Test::HasFailure()) return;
  }
}

// The shape of the every-page-size tests' cases (EveryPageSizeAndTile, Sm90PagedEveryPageSize): the seed's dtype
// (bf16 odd, fp16 even), B = 3, H_q = 4, H_k = H_v = 2, S_q = sq, S_kv = skv, head dims (dqk, dv), page sizes
// (page_k, page_v), bottom-right causal, scale 1 / sqrt(dqk).
PagedCase page_size_case(uint64_t seed, int64_t sq, int64_t skv, int64_t dqk, int64_t dv, int64_t page_k,
                         int64_t page_v) {
  PagedCase c;
  c.seed = seed;
  c.dtype = seed % 2 ? DType::kBFloat16 : DType::kFloat16;
  c.B = 3;
  c.Hq = 4;
  c.Hk = c.Hv = 2;
  c.Sq = sq;
  c.Skv = skv;
  c.Dqk = dqk;
  c.Dv = dv;
  c.page_k = page_k;
  c.page_v = page_v;
  c.has_right = true;
  c.bottom_right = true;
  c.scale = 1.0f / std::sqrt(float(dqk));
  return c;
}

TEST(SdpaPagedGpu, EveryPageSizeAndTile) {
  // Every page size (1 .. 256, both sides, different K and V sizes) on every head-dim tile, both
  // dtypes, GQA, bottom-right causal, ragged lengths over several key blocks.
  REQUIRE_GPU();
  PagedOn on;
  static const std::pair<int64_t, int64_t> dims[] = {{64, 64}, {128, 128}, {40, 72}, {192, 128}, {256, 256}};
  uint64_t seed = 1000;
  for (const auto& [dqk, dv] : dims)
    for (size_t i = 0; i < 9; ++i) {
      ++seed;
      PagedCase c = page_size_case(seed, 1 + int64_t(seed % 3) * 40, 300, dqk, dv, kPageSizes[i], kPageSizes[8 - i]);
      c.packed_k = i % 2;
      c.token_major_v = i % 3 == 0;
      run_case(c);
      if (::testing::Test::HasFailure()) return;
    }
}

TEST(SdpaPagedGpu, PagedBadEntryIsNaN) {
  // A page-table entry outside the container: the loader reads nothing there and fills the row
  // with NaN, so the rows that see the key are NaN (run under memcheck by gpu_check.sh). Pages of
  // 8 keys (a block gathered row by row), 64 and 128 (a block inside one page: one lookup, then the
  // contiguous copy, which must fall back to the gather for a refused entry).
  REQUIRE_GPU();
  PagedOn on;
  static const int64_t pages[][2] = {{8, 2}, {64, 1}, {128, 0}};  // page size, the refused entry
  for (const auto& [page, bad] : pages) {
    PagedCase c;
    c.seed = 2001;
    c.B = 1;  // len_q = 1, len_kv = S_kv = 100
    c.Hq = c.Hk = c.Hv = 2;
    c.Sq = 1;
    c.Skv = 100;
    c.page_k = page;
    c.page_v = page;
    PagedRun r(c);
    ASSERT_EQ(r.d.len_q[0], 1);
    ASSERT_EQ(r.d.len_kv[0], 100);
    r.d.k.table.entries[size_t(r.d.k.table.offsets[0] + bad)] = int32_t(r.d.k.table.num_pages + 5);
    r.table_k.up(r.d.k.table.entries.data(), r.d.k.table.entries.size() * 4);
    r.o.poison();
    r.forward(/*cuda=*/true);
    const std::vector<double> o = sdpa_case::Storage::values(r.o.down(r.d.o.host.size()), r.d.o.dtype);
    for (int64_t h = 0; h < c.Hq; ++h) {
      EXPECT_TRUE(std::isnan(o[size_t(r.d.o.lay.at(0, h, 0, 0))])) << "page " << page << ", head " << h;
    }
  }
}

TEST(SdpaPagedGpu, SanitizerSmall) {
  // Small cases for compute-sanitizer memcheck: page sizes 1, 16 and 128 (below, within and above
  // the 64-key block), packed and contiguous tables, K alone paged, decode and prefill.
  REQUIRE_GPU();
  PagedOn on;
  const int64_t pages[][2] = {{1, 16}, {16, 0}, {128, 4}, {0, 2}};
  for (int i = 0; i < 4; ++i) run_case(small_case(3000 + uint64_t(i), i, pages[i], i == 2 ? 1 : 2, i % 2 ? 1 : 33, 32));
}

TEST(SdpaPagedGpu, BiasRandom) {
  // O, the LSE and max_logit against the reference with an additive bias in each broadcast form.
  REQUIRE_GPU();
  FeaturePairsOn on;
  for (const PagedCase& c : bias_cases()) {
    run_case(c);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaPagedGpu, DropoutRandom) {
  // O, the LSE, max_logit and rng_dump (bitwise) against the reference with Philox dropout or the
  // caller's mask (a bias besides on some).
  REQUIRE_GPU();
  FeaturePairsOn on;
  for (const PagedCase& c : dropout_cases()) {
    run_case(c);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaPagedGpu, FeaturePairsSanitizerSmall) {
  // Small cases for compute-sanitizer memcheck (scripts/gpu_check.sh): feature_pairs_small_cases.
  REQUIRE_GPU();
  FeaturePairsOn on;
  for (const PagedCase& c : feature_pairs_small_cases()) run_case(c);
}

// The sm90 forward over paged K/V (on by default: sdpa_sm90_paged_enabled, forced on here with the sm90 forward's
// switch; kernel_fwd_sm90.cuh sdpa_fwd_paged_kernel_sm90): each call must run on it
// (sm90::sdpa_fwd_paged_launches), against the CPU reference with the outputs NaN-poisoned first.
struct Sm90PagedOn {
  PagedOn paged;
  ScopedSwitch fwd{set_sdpa_fwd_sm90_enabled, 1};
  ScopedSwitch on{set_sdpa_sm90_paged_enabled, 1};
};

void run_sm90_case(const PagedCase& c) {
  const int64_t n0 = sm90::sdpa_fwd_paged_launches();
  run_case(c);
  EXPECT_EQ(sm90::sdpa_fwd_paged_launches(), n0 + 1) << "not run by the sm90 paged forward: " << c.str();
}

TEST(SdpaPagedGpu, Sm90PagedRandom) {
  // 80 random prefill cases (random_sm90_paged_case): pages 8 .. 256 per side (a key block over several pages, in
  // one, or a page of several blocks), shuffled pages, unused pages and rows past the samples NaN, garbage entries
  // past the samples' pages, packed tables, token-major containers, K or V alone paged, separate K and V tables,
  // ragged lengths with a sample without keys, GQA and H_k != H_v, both dtypes, head dims up to 128, masks in both
  // alignments, softcap, max_logit.
  REQUIRE_SM90();
  Sm90PagedOn on;
  for (uint64_t seed = 501; seed <= 580; ++seed) {
    run_sm90_case(random_sm90_paged_case(seed));
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaPagedGpu, Sm90PagedEveryPageSize) {
  // Every page size the kernel takes (8 .. 512), K and V of different sizes, on both kernels' dims, both dtypes,
  // bottom-right causal, lengths over several key blocks; the last with V contiguous.
  REQUIRE_SM90();
  Sm90PagedOn on;
  static const int64_t pages[] = {8, 16, 32, 64, 128, 256, 512};
  uint64_t seed = 5000;
  for (const auto& [dqk, dv] : {std::pair<int64_t, int64_t>{64, 64}, {128, 128}, {72, 40}})
    for (size_t i = 0; i < 7; ++i) {
      ++seed;
      PagedCase c = page_size_case(seed, 100 + int64_t(seed % 3) * 70, 700, dqk, dv, pages[i], i == 6 ? 0 : pages[6 - i]);
      c.packed_v = i % 2;
      c.token_major_k = i % 3 == 0;
      run_sm90_case(c);
      if (::testing::Test::HasFailure()) return;
    }
}

// A page-table entry of sample 1 outside the container (-1, num_pages, 2^31 - 1) in each of sm90_bad_entry_cases (q, o
// and the stats packed THD when thd_q): each call runs on the sm90 paged forward (the caller's switches), nothing is
// read there (run under memcheck by gpu_check.sh) and every O and stats row of sample 1 is NaN (the launcher's flag
// and fill, a superset of the sm80 kernel's rows that see the key, PagedBadEntryIsNaN); sample 0 as the reference.
void check_sm90_bad_entries(bool thd_q) {
  int n = 0;
  for (BadEntryCase bc : sm90_bad_entry_cases()) {
    bc.c.thd_q = thd_q;
    const PagedCase& c = bc.c;
    SCOPED_TRACE(c.str());
    PagedRun r(c);
    ASSERT_GT(r.d.len_kv[1], bc.bad_page * c.page_k);
    r.forward(/*cuda=*/false);  // the reference with the intact table
    const int32_t bad = n % 3 == 0 ? -1 : n % 3 == 1 ? int32_t(r.d.k.table.num_pages) : 0x7fffffff;
    ++n;
    std::vector<int32_t> entries = r.d.k.table.entries;
    entries[size_t(r.d.k.table.offsets[1] + bc.bad_page)] = bad;
    r.table_k.up(entries.data(), entries.size() * 4);
    r.o.poison();
    r.stats.poison();
    const int64_t n0 = sm90::sdpa_fwd_paged_launches();
    r.forward(/*cuda=*/true);
    EXPECT_EQ(sm90::sdpa_fwd_paged_launches(), n0 + 1);
    const std::vector<double> o = sdpa_case::Storage::values(r.o.down(r.d.o.host.size()), r.d.o.dtype);
    const std::vector<double> st = sdpa_case::Storage::values(r.stats.down(r.d.stats.host.size()), DType::kFloat32);
    const std::vector<double> want = sdpa_case::Storage::values(r.d.o.host, r.d.o.dtype);
    std::vector<double> got0, want0;
    for (int64_t h = 0; h < c.Hq; ++h) {
      for (int64_t i = 0; i < r.d.len_q[1]; ++i) {
        ASSERT_TRUE(std::isnan(o[size_t(r.d.o.lay.at(1, h, i, 0))])) << "O row " << i << " of head " << h;
        ASSERT_TRUE(std::isnan(st[size_t(r.d.stats.lay.at(1, h, i, 0))])) << "stats row " << i << " of head " << h;
      }
      for (int64_t i = 0; i < r.d.len_q[0]; ++i)
        for (int64_t e = 0; e < c.Dv; ++e) {
          got0.push_back(o[size_t(r.d.o.lay.at(0, h, i, e))]);
          want0.push_back(want[size_t(r.d.o.lay.at(0, h, i, e))]);
        }
    }
    EXPECT_TRUE(fs_test::tensor_close(got0, want0, c.dtype)) << "sample 0";
  }
}

TEST(SdpaPagedGpu, Sm90PagedBadEntryIsNaN) {
  REQUIRE_SM90();
  Sm90PagedOn on;
  check_sm90_bad_entries(/*thd_q=*/false);
}

// Case i < 4 of the sm90 paged forward's sanitizer sets (Sm90PagedSanitizerSmall, Sm90PagedThdSanitizerSmall), seed
// `seed`: small_case with pages of 8 (a key block over sixteen), 16 and 128 keys, packed and contiguous tables, K or
// V alone paged, a sample without keys, H_k != H_v, max_logit and softcap on the last; both kernels' dims.
PagedCase sm90_small_case(uint64_t seed, int i) {
  static const int64_t pages[][2] = {{8, 16}, {16, 0}, {128, 8}, {0, 64}};
  PagedCase c = small_case(seed, i, pages[i], i == 2 ? 1 : 2, 40, i < 2 ? 32 : 96);
  c.max_logit = i == 3;
  c.softcap = i == 3 ? 15.0f : 0.0f;
  return c;
}

TEST(SdpaPagedGpu, Sm90PagedSanitizerSmall) {
  // Small cases for compute-sanitizer memcheck and synccheck (scripts/gpu_check.sh): sm90_small_case's.
  REQUIRE_SM90();
  Sm90PagedOn on;
  for (int i = 0; i < 4; ++i) run_sm90_case(sm90_small_case(3200 + uint64_t(i), i));
}

// Packed (THD) q / o / stats / gate on the sm90 paged forward (on by default since 2026-12-06:
// sdpa_sm90_paged_thd_enabled, forced on here with the THD switch, sdpa_sm90_thd_enabled; q through its per-sample
// maps, o, the stats and the gate at the samples' starts, K / V through the page tables).
struct Sm90PagedThdOn {
  Sm90PagedOn paged;
  ScopedSwitch thd{set_sdpa_sm90_thd_enabled, 1};
  ScopedSwitch on{set_sdpa_sm90_paged_thd_enabled, 1};
};

TEST(SdpaPagedGpu, Sm90PagedThdRandom) {
  // 60 random packed-q prefill cases (random_sm90_paged_thd_case): random_sm90_paged_case's pages (8 .. 256 per side
  // or one side contiguous, shuffled, unused pages and rows NaN, garbage entries past the samples, packed tables,
  // token-major containers), GQA and H_k != H_v, both dtypes, head dims up to 128, masks in both alignments, softcap,
  // max_logit; q, o and the stats packed THD with gaps (seq_len) or without (cu_seq_len), a packed output gate on
  // half, a sample without queries, one without keys on most; outputs NaN-poisoned (the gaps must stay NaN); each
  // call on the sm90 paged forward.
  REQUIRE_SM90();
  Sm90PagedThdOn on;
  for (uint64_t seed = 601; seed <= 660; ++seed) {
    run_sm90_case(random_sm90_paged_thd_case(seed));
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaPagedGpu, Sm90PagedThdBadEntryIsNaN) {
  // Sm90PagedBadEntryIsNaN with q, o and the stats packed: the flags the sample maps' pre-pass writes are the
  // kernel's bad-entry flags too (launch_sdpa_fwd_paged_sm90), so sample 1's rows must still be NaN.
  REQUIRE_SM90();
  Sm90PagedThdOn on;
  check_sm90_bad_entries(/*thd_q=*/true);
}

TEST(SdpaPagedGpu, Sm90PagedThdSanitizerSmall) {
  // Small packed-q cases for compute-sanitizer memcheck and synccheck (scripts/gpu_check.sh): sm90_small_case's
  // shapes with q, o and the stats packed, the first sample without keys, the last without queries, a packed gate on
  // one.
  REQUIRE_SM90();
  Sm90PagedThdOn on;
  for (int i = 0; i < 4; ++i) {
    PagedCase c = sm90_small_case(3300 + uint64_t(i), i);
    c.thd_q = true;
    c.zero_q_sample = true;
    c.cu_lengths = i % 2 == 1;  // gaps between the samples on even i (seq_len)
    c.gate = i == 1;
    run_sm90_case(c);
  }
}

TEST(SdpaPagedGpu, Sm90PagedThdOffRunsSm80) {
  // The switch off (FLASHSPAN_SM90_SDPA_PAGED_THD=0): the packed calls keep the sm80 paged kernel, right.
  REQUIRE_GPU();
  PagedOn paged;
  ScopedSwitch off{set_sdpa_sm90_paged_thd_enabled, 0};
  for (uint64_t seed = 601; seed <= 606; ++seed) {
    const int64_t n0 = sm90::sdpa_fwd_paged_launches();
    run_case(random_sm90_paged_thd_case(seed));
    EXPECT_EQ(sm90::sdpa_fwd_paged_launches(), n0);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaPagedGpu, Sm90PagedOffRunsSm80) {
  // The switch off (FLASHSPAN_SM90_SDPA_PAGED=0): the same calls keep the sm80 paged kernel.
  REQUIRE_GPU();
  PagedOn paged;
  ScopedSwitch off{set_sdpa_sm90_paged_enabled, 0};
  for (uint64_t seed = 501; seed <= 510; ++seed) {
    const int64_t n0 = sm90::sdpa_fwd_paged_launches();
    run_case(random_sm90_paged_case(seed));
    EXPECT_EQ(sm90::sdpa_fwd_paged_launches(), n0);
    if (::testing::Test::HasFailure()) return;
  }
}

// The additive bias on the sm90 paged forward (on by default since 2026-12-06: sdpa_sm90_paged_bias_enabled,
// forced on here, with the feature pairs' switch that lets a bias meet paged K/V at all and the THD switches for the
// packed cases; kernel_fwd_sm90.cuh sdpa_fwd_paged_bias_kernel_sm90, the (128, 128) kernel for every head dim).
struct Sm90PagedBiasOn {
  FeaturePairsOn pairs;
  Sm90PagedOn paged;
  ScopedSwitch mods{set_sdpa_fwd_sm90_mods_enabled, 1};
  ScopedSwitch thd{set_sdpa_sm90_thd_enabled, 1};
  ScopedSwitch paged_thd{set_sdpa_sm90_paged_thd_enabled, 1};
  ScopedSwitch on{set_sdpa_sm90_paged_bias_enabled, 1};
};

TEST(SdpaPagedGpu, Sm90PagedBiasRandom) {
  // 48 random prefill cases with a bias (random_sm90_paged_bias_case): every broadcast form (three times), float32
  // (element-wise reads) and q's dtype (staged by TMA where its rows are whole and aligned, else element-wise), padded
  // strides on a third; random_sm90_paged_case's pages (8 .. 256 per side or one side contiguous, shuffled, unused
  // pages and rows NaN, garbage entries past the samples, packed tables, token-major containers), GQA and H_k != H_v,
  // both dtypes, head dims up to 128, masks, softcap, max_logit; a third with q / o / stats packed THD (a sample
  // without queries, most one without keys, a packed gate on half); outputs NaN-poisoned; each call on the sm90 paged
  // forward (the launch counter).
  REQUIRE_SM90();
  Sm90PagedBiasOn on;
  for (uint64_t seed = 701; seed <= 748; ++seed) {
    run_sm90_case(random_sm90_paged_bias_case(seed));
    if (::testing::Test::HasFailure()) return;
  }
}

// Case i < 4 of Sm90PagedBiasSanitizerSmall: sm90_small_case's shapes with a bias: full in q's dtype with S_kv = 152
// (staged by TMA), float32 broadcast over S_q, broadcast over B and H_q with q packed (staged), broadcast over every
// dim (one value) in q's dtype.
PagedCase sm90_bias_small_case(int i) {
  PagedCase c = sm90_small_case(3400 + uint64_t(i), i);
  static const int kForms[] = {1, 1 + 4, 1 + 3, 16};
  c.bias = kForms[i];
  c.bias_f32 = i == 1;
  if (i % 2 == 0) c.Skv = 152;
  if (i == 2) {
    c.thd_q = true;
    c.zero_q_sample = true;
  }
  return c;
}

TEST(SdpaPagedGpu, Sm90PagedBiasSanitizerSmall) {
  // Small cases with a bias for compute-sanitizer memcheck and synccheck (scripts/gpu_check.sh):
  // sm90_bias_small_case's.
  REQUIRE_SM90();
  Sm90PagedBiasOn on;
  for (int i = 0; i < 4; ++i) run_sm90_case(sm90_bias_small_case(i));
}

TEST(SdpaPagedGpu, Sm90PagedBiasOffRunsSm80) {
  // The switch off (FLASHSPAN_SM90_SDPA_PAGED_BIAS=0): the calls with a bias keep the sm80 paged kernel, right.
  REQUIRE_GPU();
  FeaturePairsOn pairs;
  ScopedSwitch thd{set_sdpa_sm90_paged_thd_enabled, 1};
  ScopedSwitch off{set_sdpa_sm90_paged_bias_enabled, 0};
  for (uint64_t seed = 701; seed <= 706; ++seed) {
    const int64_t n0 = sm90::sdpa_fwd_paged_launches();
    run_case(random_sm90_paged_bias_case(seed));
    EXPECT_EQ(sm90::sdpa_fwd_paged_launches(), n0);
    if (::testing::Test::HasFailure()) return;
  }
}

#endif

}  // namespace
}  // namespace flashspan::test
