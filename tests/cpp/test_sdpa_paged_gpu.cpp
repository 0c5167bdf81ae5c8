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
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "core/sdpa_band.h"
#include "dispatch/sdpa_launch.h"
#include "error_criteria.h"
#include "flashspan/flashspan.hpp"
#include "gpu_harness.h"
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
  return t == DType::kFloat32 ? api::kFloat32 : t == DType::kBFloat16 ? api::kBFloat16 : api::kFloat16;
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
    if (!device) return;
    q.up(d.q.host.data(), d.q.host.size());
    k.up(d.k.data.host.data(), d.k.data.host.size());
    v.up(d.v.data.host.data(), d.v.data.host.size());
    o.up(d.o.host.data(), d.o.host.size());
    stats.up(d.stats.host.data(), d.stats.host.size());
    ml.up(ml_host.data(), ml_host.size() * 4);
    if (d.k.paged()) table_k.up(d.k.table.entries.data(), d.k.table.entries.size() * 4);
    if (d.v.paged()) table_v.up(d.v.table.entries.data(), d.v.table.entries.size() * 4);
  }

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
    if (c.thd_q) {
      for (fs_sdpa_slot_t s : {FS_SDPA_Q, FS_SDPA_O, FS_SDPA_STATS}) {
        const sdpa_case::Storage& t = s == FS_SDPA_Q ? d.q : s == FS_SDPA_O ? d.o : d.stats;
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
    if (c.thd_q) {
      for (fs_sdpa_slot_t s : {FS_SDPA_RAGGED_OFFSET_Q, FS_SDPA_RAGGED_OFFSET_O, FS_SDPA_RAGGED_OFFSET_STATS})
        pack.set(s, rag_q.ptr(cuda));
    }
    if (d.k.paged()) pack.set(FS_SDPA_PAGE_TABLE_K, P(table_k, d.k.table.entries.data()));
    if (d.v.paged()) pack.set(FS_SDPA_PAGE_TABLE_V, P(table_v, d.v.table.entries.data()));
    if (d.k.table.packed) pack.set(FS_SDPA_RAGGED_OFFSET_PAGE_TABLE_K, off_k.ptr(cuda));
    if (d.v.table.packed) pack.set(FS_SDPA_RAGGED_OFFSET_PAGE_TABLE_V, off_v.ptr(cuda));
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

// Reference on the host, then the GPU on poisoned outputs; compare O, stats, max_logit.
void run_case(const PagedCase& c) {
  SCOPED_TRACE(c.str());
  PagedRun r(c);
  r.forward(/*cuda=*/false);
  r.o.poison();
  r.stats.poison();
  r.ml.poison();
  r.forward(/*cuda=*/true);
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

// O of the dense computation of a case (double; dense K / V of sdpa_paged_case.h, the band of
// core/sdpa_band.h, softcap): [b][h][i][d] for i < len_q[b] (rows that see nothing: 0).
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
          x.push_back(xj);
          m = std::max(m, xj);
        }
        double l = 0;
        for (double xj : x) l += std::exp(xj - m);
        for (int64_t e = 0; e < c.Dv && hi > lo; ++e) {
          double o = 0;
          for (int64_t j = lo; j < hi; ++j)
            o += std::exp(x[size_t(j - lo)] - m) / l * d.dense_v[size_t(((b * c.Hv + hv) * c.Skv + j) * c.Dv + e)];
          out[size_t(((b * c.Hq + h) * c.Sq + i) * c.Dv + e)] = o;
        }
      }
    }
  return out;
}

// The CPU reference (the GPU tests' oracle) on cases of the GPU tests against dense_o: checks
// the cases and the API plumbing of these tests without a GPU (runs in CI).
TEST(SdpaPaged, GpuTestCasesOnTheCpuReference) {
  std::vector<PagedCase> cases;
  for (uint64_t seed = 1; seed <= 12; ++seed) cases.push_back(random_paged_case(seed, false));
  for (uint64_t seed = 101; seed <= 112; ++seed) cases.push_back(random_paged_case(seed, true));
  for (const PagedCase& c : cases) {
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
  }
}

struct PagedOn {
  PagedOn() { set_sdpa_paged_enabled(1); }
  ~PagedOn() { set_sdpa_paged_enabled(-1); }
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

TEST(SdpaPagedGpu, EveryPageSizeAndTile) {
  // Every page size (1 .. 256, both sides, different K and V sizes) on every head-dim tile, both
  // dtypes, GQA, bottom-right causal, ragged lengths over several key blocks.
  REQUIRE_GPU();
  PagedOn on;
  static const std::pair<int64_t, int64_t> dims[] = {{64, 64}, {128, 128}, {40, 72}, {192, 128}, {256, 256}};
  uint64_t seed = 1000;
  for (const auto& [dqk, dv] : dims)
    for (size_t i = 0; i < 9; ++i) {
      PagedCase c;
      c.seed = ++seed;
      c.dtype = seed % 2 ? DType::kBFloat16 : DType::kFloat16;
      c.B = 3;
      c.Hq = 4;
      c.Hk = c.Hv = 2;
      c.Sq = 1 + int64_t(seed % 3) * 40;
      c.Skv = 300;
      c.Dqk = dqk;
      c.Dv = dv;
      c.page_k = kPageSizes[i];
      c.page_v = kPageSizes[8 - i];
      c.packed_k = i % 2;
      c.token_major_v = i % 3 == 0;
      c.has_right = true;
      c.bottom_right = true;
      c.scale = 1.0f / std::sqrt(float(dqk));
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
  for (int i = 0; i < 4; ++i) {
    PagedCase c;
    c.seed = 3000 + uint64_t(i);
    c.B = 3;
    c.Hq = 4;
    c.Hk = 2;
    c.Hv = i == 2 ? 1 : 2;
    c.Sq = i % 2 ? 1 : 33;
    c.Skv = 150;
    c.Dqk = c.Dv = 32;
    c.page_k = pages[i][0];
    c.page_v = pages[i][1];
    c.packed_k = c.page_k > 0 && i % 2 == 0;
    c.packed_v = c.page_v > 0 && i % 2 == 1;
    c.zero_kv_sample = true;
    c.has_right = true;
    c.bottom_right = true;
    run_case(c);
  }
}

#endif

}  // namespace
}  // namespace flashspan::test
