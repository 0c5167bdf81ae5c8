// Paged K/V caches of the SDPA forward on the host (no GPU): the parameters dispatch gives the
// paged kernels (dispatch/sdpa_params.cpp sdpa_paged_fwd_params) and the kernels' own K/V
// address role (kv_addr.cuh PagedKv, compiled for the host) find every key and value of every
// sample of random paged cases (sdpa_paged_case.h: page sizes 1 .. 256, shuffled pages, ragged
// lengths, packed tables, token-major containers, K or V alone paged, GQA, H_k != H_v) where
// the dense K / V of the case hold them; the rows the kernels' gather never asks about (keys
// past a sample) are left out, as the loader leaves them. Also the native path's rules for
// paged calls on CUDA descriptors (the FLASHSPAN_SDPA_PAGED switch, page sizes; the bias and
// dropout with paged K/V behind the feature pairs' switch, sdpa_feature_pairs_enabled: on unless
// FLASHSPAN_SDPA_FEATURE_PAIRS=0).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/sdpa_problem.h"
#include "dispatch/sdpa_launch.h"
#include "flashspan/flashspan.hpp"
#include "scoped_env.h"
#include "sdpa_paged_case.h"

// The kernels' K/V address role, compiled for the host (plain integer code and loads).
#define __device__
#define __forceinline__ inline
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
#include "kernels/common/kv_addr.cuh"
#undef __device__
#undef __forceinline__

namespace flashspan::test {
namespace {

using namespace sdpa_paged;

// sdpa_fwd_sm90_paged_refusal's answer to packed (THD) q / o / stats / gate with its switch off
// (sdpa_sm90_paged_thd_enabled: on by default, FLASHSPAN_SM90_SDPA_PAGED_THD=0 off).
const std::string kPagedThdOff =
    "ragged (packed) q, o, stats or gate (with paged K/V: the sm80 paged kernel, FLASHSPAN_SM90_SDPA_PAGED_THD=0)";

TensorView view_of(const sdpa_case::Storage& s, DeviceType dev = DeviceType::kCPU) {
  TensorView t;
  t.dtype = s.dtype;
  t.ndim = 4;
  t.device = dev;
  const int64_t shape[4] = {s.lay.B, s.lay.H, s.lay.S, s.lay.D};
  for (int d = 0; d < 4; ++d) {
    t.shape[d] = shape[d];
    t.strides[d] = s.lay.strides[size_t(d)];
  }
  return t;
}

TensorView index_view(int64_t n, bool i64, DeviceType dev = DeviceType::kCPU) {
  TensorView t;
  t.dtype = i64 ? DType::kInt64 : DType::kInt32;
  t.ndim = 1;
  t.shape[0] = n;
  t.strides[0] = 1;
  t.device = dev;
  return t;
}

// Host bytes of an int32 / int64 array.
std::vector<uint8_t> index_bytes(const std::vector<int64_t>& v, bool i64) {
  std::vector<uint8_t> b(std::max<size_t>(v.size(), 1) * (i64 ? 8 : 4));
  for (size_t i = 0; i < v.size(); ++i) {
    if (i64) {
      std::memcpy(b.data() + 8 * i, &v[i], 8);
    } else {
      const int32_t x = int32_t(v[i]);
      std::memcpy(b.data() + 4 * i, &x, 4);
    }
  }
  return b;
}

// The validated forward problem of a case, bound to its host buffers.
struct HostCall {
  PagedData d;
  std::vector<uint8_t> lq, lk, rq, ok, ov;
  sdpa::Problem p;

  explicit HostCall(const PagedCase& c, DeviceType dev = DeviceType::kCPU) : d(make_paged_data(c)) {
    sdpa::Attributes a;
    void* pack[sdpa::kNumSlots] = {};
    auto put = [&](int slot, const sdpa_case::Storage& s) {
      a.tensors[size_t(slot)] = view_of(s, dev);
      pack[slot] = const_cast<uint8_t*>(s.host.data());
    };
    put(FS_SDPA_Q, d.q);
    put(FS_SDPA_K, d.k.data);
    put(FS_SDPA_V, d.v.data);
    put(FS_SDPA_O, d.o);
    put(FS_SDPA_STATS, d.stats);
    if (c.gate) put(FS_SDPA_GATE, d.gate);
    if (c.bias) put(FS_SDPA_BIAS, d.bias);  // (dropout is not bound here: the rule's tests set the problem's flags)
    a.generate_stats = true;
    a.attn_scale_value = c.scale;
    a.padding_mask = true;
    lq = index_bytes(c.cu_lengths ? sdpa_case::prefix_sums(d.len_q) : d.len_q, c.lengths64);
    lk = index_bytes(c.cu_lengths ? sdpa_case::prefix_sums(d.len_kv) : d.len_kv, c.lengths64);
    const int sq = c.cu_lengths ? FS_SDPA_CU_SEQ_LEN_Q : FS_SDPA_SEQ_LEN_Q;
    const int sk = c.cu_lengths ? FS_SDPA_CU_SEQ_LEN_KV : FS_SDPA_SEQ_LEN_KV;
    a.tensors[size_t(sq)] = index_view(c.B + (c.cu_lengths ? 1 : 0), c.lengths64, dev);
    a.tensors[size_t(sk)] = index_view(c.B + (c.cu_lengths ? 1 : 0), c.lengths64, dev);
    pack[sq] = lq.data();
    pack[sk] = lk.data();
    if (c.thd_q) {
      rq = index_bytes(d.tok_q, false);
      for (int s : {FS_SDPA_Q, FS_SDPA_O, FS_SDPA_STATS, FS_SDPA_GATE}) {
        if (s == FS_SDPA_GATE && !c.gate) continue;
        const int r = sdpa::ragged_slot_of(s);
        a.tensors[size_t(r)] = index_view(c.B + 1, false, dev);
        a.ragged_multiplier[size_t(r)] = a.tensors[size_t(s)].strides[2];
        pack[r] = rq.data();
      }
    }
    for (int side = 0; side < 2; ++side) {
      const PagedSide& ps = side == 0 ? d.k : d.v;
      if (!ps.paged()) continue;
      const PageTable& t = ps.table;
      const int slot = side == 0 ? FS_SDPA_PAGE_TABLE_K : FS_SDPA_PAGE_TABLE_V;
      TensorView tv;
      tv.dtype = DType::kInt32;
      tv.ndim = 4;
      tv.device = dev;
      const int64_t shape[4] = {c.B, 1, t.max_pages, 1}, str[4] = {t.max_pages, t.max_pages, 1, 1};
      for (int k = 0; k < 4; ++k) {
        tv.shape[k] = shape[k];
        tv.strides[k] = str[k];
      }
      a.tensors[size_t(slot)] = tv;
      pack[slot] = const_cast<int32_t*>(t.entries.data());
      if (t.packed) {
        std::vector<uint8_t>& b = side == 0 ? ok : ov;
        b = index_bytes(t.offsets, false);
        const int r = sdpa::ragged_slot_of(slot);
        a.tensors[size_t(r)] = index_view(c.B + 1, false, dev);
        a.ragged_multiplier[size_t(r)] = 1;
        pack[r] = b.data();
      }
    }
    if (c.set_max_seq) a.paged_max_seq_len_kv = c.Skv;
    if (c.softcap > 0) a.softcap = c.softcap;
    a.alignment = c.bottom_right ? FS_SDPA_BOTTOM_RIGHT : FS_SDPA_TOP_LEFT;
    if (c.has_left) a.left_bound = c.left;
    if (c.has_right) a.right_bound = c.right;
    p = sdpa::validate_forward(a);
    p.bind(pack, sdpa::kNumSlots);
  }
};

double elem(DType t, const void* base, int64_t off) {
  TensorView v;
  v.data = const_cast<void*>(base);
  v.dtype = t;
  return read_elem(v, off);
}

// Every key s < len_kv[b] of every head, through the kernels' parameters and PagedKv, holds the
// case's dense value; a contiguous side through its sample start.
void check_addresses(const PagedCase& c) {
  SCOPED_TRACE(c.str());
  HostCall call(c);
  // The CPU reference reads the same tables: it must accept the case.
  const sdpa::Runtime rt = sdpa::read_runtime_host(call.p);
  ASSERT_EQ(int64_t(rt.len_kv.size()), c.B);
  const SdpaPagedFwdParams f = sdpa_paged_fwd_params(call.p);
  EXPECT_EQ(f.analytic.max_kv, c.set_max_seq ? c.Skv : call.p.Skv);
  for (int side = 0; side < 2; ++side) {
    const SdpaPagedSide& ps = side == 0 ? f.paged_k : f.paged_v;
    const TensorAddr& ad = side == 0 ? f.ka : f.va;
    const void* base = side == 0 ? f.k : f.v;
    const std::vector<double>& dense = side == 0 ? call.d.dense_k : call.d.dense_v;
    const int64_t H = side == 0 ? c.Hk : c.Hv, D = side == 0 ? c.Dqk : c.Dv;
    const bool paged = (side == 0 ? c.page_k : c.page_v) > 0;
    EXPECT_EQ(ps.table != nullptr, paged);
    const SampleStart& st = f.analytic.start[side == 0 ? kSdpaK : kSdpaV];
    if (paged) {
      EXPECT_TRUE(st.ragged.ptr == nullptr && st.batch_stride == 0) << "a paged side's head base has a sample term";
      EXPECT_EQ(int64_t(1) << ps.log2_page, side == 0 ? c.page_k : c.page_v);
    }
    for (int b = 0; b < int(c.B); ++b) {
      const kern::PagedKv kv = kern::PagedKv::item(ps, b);
      const int64_t start = kern::sample_start(st, b);
      for (int64_t h = 0; h < H; ++h)
        for (int s = 0; s < int(call.d.len_kv[size_t(b)]); ++s) {
          int64_t off = -1;
          ASSERT_TRUE(kv.row_offset(ps, s, ad.row_stride, off)) << "side " << side << " sample " << b << " key " << s;
          for (int64_t d = 0; d < D; ++d) {
            const double got = elem(c.dtype, base, start + h * ad.head_stride + off + d);
            const double want = dense[size_t(((b * H + h) * c.Skv + s) * D + d)];
            ASSERT_EQ(got, want) << "side " << side << " sample " << b << " head " << h << " key " << s << " col " << d;
          }
        }
    }
  }
}

TEST(SdpaPaged, AddressRoleFindsEveryKey) {
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    check_addresses(random_paged_case(seed, /*decode=*/false));
    check_addresses(random_paged_case(seed + 100, /*decode=*/true));
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaPaged, AddressRoleRefusesEntriesOutsideTheContainer) {
  PagedCase c;
  c.seed = 7;
  c.B = 1;
  c.Sq = 1;
  c.Skv = 40;
  c.page_k = c.page_v = 4;
  HostCall call(c);
  SdpaPagedFwdParams f = sdpa_paged_fwd_params(call.p);
  std::vector<int32_t> entries = call.d.k.table.entries;
  f.paged_k.table = entries.data();
  int64_t off = 0;
  for (int32_t bad : {-1, int32_t(call.d.k.table.num_pages), 0x7fffffff}) {
    entries[1] = bad;
    const kern::PagedKv kv = kern::PagedKv::item(f.paged_k, 0);
    EXPECT_TRUE(kv.row_offset(f.paged_k, 3, f.ka.row_stride, off));   // page 0
    EXPECT_FALSE(kv.row_offset(f.paged_k, 4, f.ka.row_stride, off)) << bad;  // page 1
  }
}

// The TMA form of the address role (kv_addr.cuh PagedKv::tma_log2_box / tma_box: the sm90 paged forward's producer,
// kernel_fwd_sm90.cuh load_paged_block) on the kernel's 128-key blocks: every box of every key block that holds keys
// of a sample lies inside one page (or is the contiguous side's block) and, read at the coordinates (column, row,
// head, page) of the container's map (launch_fwd_sm90.cu: the container's [pages, page, H, D] view; a contiguous side
// its [B, S, H, D] view, batch b), holds the case's dense keys / values; a box from the sample's length on reads no
// entry and lies past the map (page coordinate num_pages). Pages of 8 keys or more (the rule's: smaller pages keep the
// sm80 kernel).
void check_tma_form(PagedCase c) {
  constexpr int kBlockK = 128;
  for (int64_t* page : {&c.page_k, &c.page_v}) {
    if (*page > 0 && *page < 8) *page = 8;
  }
  SCOPED_TRACE(c.str());
  HostCall call(c);
  const SdpaPagedFwdParams f = sdpa_paged_fwd_params(call.p);
  for (int side = 0; side < 2; ++side) {
    const SdpaPagedSide& ps = side == 0 ? f.paged_k : f.paged_v;
    const PagedSide& data = side == 0 ? call.d.k : call.d.v;
    const std::vector<double>& dense = side == 0 ? call.d.dense_k : call.d.dense_v;
    const int64_t H = side == 0 ? c.Hk : c.Hv, D = side == 0 ? c.Dqk : c.Dv;
    const int64_t page_size = side == 0 ? c.page_k : c.page_v;
    const int lb = kern::PagedKv::tma_log2_box<kBlockK>(ps);
    const int box = 1 << lb;
    ASSERT_EQ(box, page_size > 0 ? std::min<int64_t>(page_size, kBlockK) : kBlockK) << "side " << side;
    for (int b = 0; b < int(c.B); ++b) {
      const int len = int(call.d.len_kv[size_t(b)]);
      const kern::PagedKv kv = kern::PagedKv::item(ps, b);
      for (int kb = 0; kb * kBlockK < len; ++kb)
        for (int j = 0; j < (kBlockK >> lb); ++j) {
          const int key0 = kb * kBlockK + (j << lb);
          int row = -1, page = -1;
          ASSERT_TRUE(kv.tma_box(ps, b, key0, len, row, page)) << "side " << side << " sample " << b << " key " << key0;
          if (page_size == 0) {
            ASSERT_EQ(page, b);
            ASSERT_EQ(row, key0);
          } else if (key0 >= len) {
            ASSERT_EQ(page, ps.num_pages) << "a box past the sample's keys must lie past the map";
            continue;
          } else {
            ASSERT_TRUE(page >= 0 && page < ps.num_pages);
            ASSERT_TRUE(row % box == 0 && row + box <= page_size) << "a box across pages";
          }
          for (int r = 0; r < box && key0 + r < len; ++r)
            for (int64_t h = 0; h < H; ++h)
              for (int64_t d = 0; d < D; ++d) {
                const double got = data.data.get(data.data.lay.at(page, h, row + r, d));
                const double want = dense[size_t(((b * H + h) * c.Skv + key0 + r) * D + d)];
                ASSERT_EQ(got, want) << "side " << side << " sample " << b << " head " << h << " key " << key0 + r;
              }
        }
    }
  }
}

TEST(SdpaPaged, TmaFormFindsEveryKeyBlock) {
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    check_tma_form(random_paged_case(seed, /*decode=*/false));
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaPaged, TmaFormRefusesEntriesOutsideTheContainer) {
  // An entry outside [0, num_pages) is not a coordinate: tma_box answers false with the page coordinate
  // num_pages (a box wholly past the map, zero filled), for pages holding whole blocks and for smaller ones.
  for (int64_t page_size : {8, 32, 128, 256}) {
    PagedCase c;
    c.seed = 9;
    c.B = 1;
    c.Sq = 1;
    c.Skv = 600;
    c.page_k = c.page_v = page_size;
    HostCall call(c);
    SdpaPagedFwdParams f = sdpa_paged_fwd_params(call.p);
    std::vector<int32_t> entries = call.d.k.table.entries;
    f.paged_k.table = entries.data();
    const int len = int(call.d.len_kv[0]);
    ASSERT_EQ(len, 600);
    const int bad_key = 300 / int(page_size) * int(page_size);  // the first key of the page holding key 300
    for (int32_t bad : {-1, int32_t(call.d.k.table.num_pages), 0x7fffffff, int32_t(0x80000000)}) {
      entries[size_t(bad_key / page_size)] = bad;
      const kern::PagedKv kv = kern::PagedKv::item(f.paged_k, 0);
      int row = -1, page = -1;
      EXPECT_TRUE(kv.tma_box(f.paged_k, 0, 0, len, row, page));
      EXPECT_FALSE(kv.tma_box(f.paged_k, 0, bad_key, len, row, page)) << page_size << " " << bad;
      EXPECT_EQ(page, f.paged_k.num_pages) << page_size << " " << bad;
    }
  }
}

// The sm90 paged forward's rule (sdpa_fwd_sm90_paged_refusal) on CUDA twins of cases: "" when the kernel takes the
// call, else the refusal.
std::string sm90_paged_refusal(const PagedCase& c) {
  HostCall call(c, DeviceType::kCUDA);
  const char* r = sdpa_fwd_sm90_paged_refusal(call.p);
  return r == nullptr ? "" : r;
}

// A case of the GPU tests of a path with a switch of its own on the sm90 paged forward (packed q, the bias): taken by
// the rule with the path's switch on (`set`: 1), refused with `off_refusal` (naming the switch) with it off, and not a
// decode call (the decode forward would take it first). Returns false (after reporting) otherwise.
bool taken_only_with_switch(const PagedCase& c, void (*set)(int), const std::string& off_refusal) {
  HostCall call(c, DeviceType::kCUDA);
  std::string on_answer, off_answer;
  {
    const ScopedSwitch on(set, 1);
    on_answer = sm90_paged_refusal(c);
  }
  {
    const ScopedSwitch off(set, 0);
    off_answer = sm90_paged_refusal(c);
  }
  EXPECT_EQ(on_answer, "") << c.str();
  EXPECT_EQ(off_answer, off_refusal) << c.str();
  EXPECT_NE(sdpa_decode_refusal(call.p), nullptr) << c.str();
  return on_answer.empty() && off_answer == off_refusal && sdpa_decode_refusal(call.p) != nullptr;
}

// The base case of the sm90 paged rule's tests (Sm90PagedRule, Sm90PagedThdRule): B samples, GQA with H_k != H_v,
// K pages of 16 keys in a packed table, V pages of 256, bottom-right causal.
PagedCase sm90_rule_case(uint64_t seed, int64_t B) {
  PagedCase c;
  c.seed = seed;
  c.B = B;
  c.Hq = 8;
  c.Hk = 2;
  c.Hv = 4;
  c.Sq = 200;
  c.Skv = 300;
  c.page_k = 16;
  c.page_v = 256;
  c.packed_k = true;
  c.has_right = true;
  c.bottom_right = true;
  return c;
}

TEST(SdpaPaged, Sm90PagedRule) {
  // Taken: pages of 8 keys or more on either side or one side contiguous, packed tables, token-major containers,
  // GQA / H_k != H_v, both dtypes, head dims up to 128, masks, softcap (the modifiers' switch on); refused (the sm80
  // paged kernel runs them): smaller pages, head dims above 128, packed q / o / stats, softcap with the modifiers'
  // switch off.
  const ScopedSwitch mods(set_sdpa_fwd_sm90_mods_enabled, 1);
  PagedCase c = sm90_rule_case(21, 2);
  c.token_major_v = true;
  EXPECT_EQ(sm90_paged_refusal(c), "");
  for (int64_t page : {8, 32, 64, 128, 1024}) {
    PagedCase x = c;
    x.page_k = page;
    x.page_v = page == 1024 ? 0 : page;  // V contiguous on the last
    x.dtype = DType::kFloat16;
    EXPECT_EQ(sm90_paged_refusal(x), "") << x.str();
  }
  {
    PagedCase x = c;
    x.Dqk = 40;
    x.Dv = 128;
    x.softcap = 20.0f;
    x.max_logit = true;
    EXPECT_EQ(sm90_paged_refusal(x), "") << x.str();
    const ScopedSwitch mods_off(set_sdpa_fwd_sm90_mods_enabled, 0);
    EXPECT_NE(sm90_paged_refusal(x), "") << "softcap with the modifiers' switch off";
  }
  for (int64_t page : {1, 2, 4}) {
    PagedCase x = c;
    x.page_v = page;
    EXPECT_EQ(sm90_paged_refusal(x), "a page of fewer than 8 keys") << x.str();
  }
  {
    PagedCase x = c;
    x.Dqk = 192;
    x.Dv = 128;
    EXPECT_EQ(sm90_paged_refusal(x), "head dims above 128");
  }
  {
    PagedCase x = c;
    x.thd_q = true;
    const ScopedSwitch thd_off(set_sdpa_sm90_paged_thd_enabled, 0);
    EXPECT_EQ(sm90_paged_refusal(x), kPagedThdOff);
  }
}

TEST(SdpaPaged, Sm90PagedThdRule) {
  // With its switch on (sdpa_sm90_paged_thd_enabled, the default) the rule takes packed (THD) q / o / stats and a
  // packed gate (the modifiers' switch on), on both kernels' dims and every page size it takes, one side contiguous
  // and padded too, with masks, GQA and H_k != H_v; it refuses, naming them: ragged offsets of k or v (a contiguous
  // side packed; a paged side has no ragged offsets to honour), packed tensors with the THD switch off
  // (FLASHSPAN_SM90_SDPA_THD=0), a packed gate with the modifiers' switch off; and what it refuses of padded calls.
  // Off, every packed call is refused with kPagedThdOff and its padded twin still taken.
  const ScopedSwitch mods(set_sdpa_fwd_sm90_mods_enabled, 1);
  const ScopedSwitch thd(set_sdpa_sm90_thd_enabled, 1);
  PagedCase c = sm90_rule_case(23, 3);
  c.thd_q = true;
  c.zero_q_sample = true;
  c.zero_kv_sample = true;
  PagedCase gated = c;
  gated.gate = true;
  {
    const ScopedSwitch on(set_sdpa_sm90_paged_thd_enabled, 1);
    EXPECT_EQ(sm90_paged_refusal(c), "");
    EXPECT_EQ(sm90_paged_refusal(gated), "");
    for (int64_t page : {8, 64, 128, 1024}) {
      PagedCase x = c;
      x.page_k = page == 1024 ? 0 : page;  // K contiguous (padded) on the last
      x.page_v = page;
      x.Dqk = x.Dv = page == 64 ? 128 : 64;
      x.dtype = DType::kFloat16;
      EXPECT_EQ(sm90_paged_refusal(x), "") << x.str();
    }
    {
      // Ragged offsets of k (a contiguous side packed through them).
      PagedCase x = c;
      x.page_k = 0;
      HostCall call(x, DeviceType::kCUDA);
      const TensorView& kv = call.p.t(FS_SDPA_K);
      sdpa::Attributes a = call.p.a;
      a.tensors[size_t(FS_SDPA_RAGGED_OFFSET_K)] = call.p.t(FS_SDPA_RAGGED_OFFSET_Q);
      a.ragged_multiplier[size_t(FS_SDPA_RAGGED_OFFSET_K)] = kv.strides[2];
      const sdpa::Problem p = sdpa::validate_forward(a);
      const char* r = sdpa_fwd_sm90_paged_refusal(p);
      EXPECT_STREQ(r, "ragged (packed) k or v (with paged K/V: the sm80 paged kernel)");
    }
    {
      const ScopedSwitch thd_off(set_sdpa_sm90_thd_enabled, 0);
      EXPECT_EQ(sm90_paged_refusal(c), "ragged (packed) q, k, v, o, stats or gradients (FLASHSPAN_SM90_SDPA_THD=0)");
    }
    {
      const ScopedSwitch mods_off(set_sdpa_fwd_sm90_mods_enabled, 0);
      EXPECT_EQ(sm90_paged_refusal(c), "");
      EXPECT_EQ(sm90_paged_refusal(gated), "gate") << "a gate with the modifiers' switch off";
    }
    PagedCase x = c;
    x.page_v = 4;
    EXPECT_EQ(sm90_paged_refusal(x), "a page of fewer than 8 keys");
    x = c;
    x.Dqk = 192;
    x.Dv = 128;
    EXPECT_EQ(sm90_paged_refusal(x), "head dims above 128");
  }
  const ScopedSwitch off(set_sdpa_sm90_paged_thd_enabled, 0);
  EXPECT_EQ(sm90_paged_refusal(c), kPagedThdOff);
  EXPECT_EQ(sm90_paged_refusal(gated), kPagedThdOff);
  PagedCase padded = c;
  padded.thd_q = false;
  EXPECT_EQ(sm90_paged_refusal(padded), "");
}

TEST(SdpaPaged, Sm90PagedThdSwitchReadsTheEnvironment) {
  // sdpa_sm90_paged_thd_enabled (on by default since 2026-12-06): on unless FLASHSPAN_SM90_SDPA_PAGED_THD is exactly
  // "0" (read per call), FLASHSPAN_EXPERIMENTAL (its switch before) changing nothing; the override wins both ways, -1
  // gives the environment's answer back (expect_off_switch). Seen through a packed paged call: taken by the rule when
  // on, refused naming the switch when off.
  PagedCase c;
  c.seed = 24;
  c.B = 3;
  c.Sq = 150;
  c.Skv = 300;
  c.page_k = c.page_v = 64;
  c.thd_q = true;
  HostCall call(c, DeviceType::kCUDA);
  const ScopedSwitch thd(set_sdpa_sm90_thd_enabled, 1);
  // The switches above this one on (on a GPU machine gpu_check.sh runs SdpaPaged.* with FLASHSPAN_SM90_SDPA_PAGED=0).
  const ScopedSwitch fwd90(set_sdpa_fwd_sm90_enabled, 1);
  const ScopedSwitch paged90(set_sdpa_sm90_paged_enabled, 1);
  expect_off_switch("FLASHSPAN_SM90_SDPA_PAGED_THD", set_sdpa_sm90_paged_thd_enabled, sdpa_sm90_paged_thd_enabled,
                    [&](bool on, const std::string& where) {
                      const char* r = sdpa_fwd_sm90_paged_refusal(call.p);
                      EXPECT_EQ(r == nullptr ? "" : std::string(r), on ? "" : kPagedThdOff) << where;
                      EXPECT_EQ(sdpa_fwd_runs_sm90_paged(call.p), on && sdpa_fwd_sm90_may_take_paged(call.p)) << where;
                    });
  // The workspace: packed q's maps (kSampleMapsFwd slots a sample) and the flags after them, for every such call that
  // may take the kernel (an sm_90 device with the sm_90a code), whatever the switches say; none elsewhere (this CPU
  // test: no such device) and never on CPU tensors.
  const size_t maps = sdpa_fwd_sm90_maps_bytes(call.p), flags = sdpa_fwd_sm90_paged_flags_bytes(call.p);
  EXPECT_EQ(sdpa_fwd_sm90_may_take_packed(call.p), sdpa_fwd_sm90_may_take_paged(call.p));
  if (sdpa_fwd_sm90_may_take_paged(call.p)) {
    EXPECT_GE(maps, size_t(3 * 128 * c.B));
    EXPECT_GE(sdpa_fwd_workspace_size(call.p), maps + flags);
  } else {
    EXPECT_EQ(maps, 0u);
    EXPECT_EQ(flags, 0u);
  }
  HostCall padded([&] {
    PagedCase x = c;
    x.thd_q = false;
    return x;
  }(), DeviceType::kCUDA);
  EXPECT_FALSE(sdpa_fwd_sm90_may_take_packed(padded.p)) << "padded q: no maps";
  HostCall cpu(c);
  EXPECT_FALSE(sdpa_fwd_sm90_may_take_packed(cpu.p));
  EXPECT_EQ(sdpa_fwd_sm90_maps_bytes(cpu.p), 0u);
}

TEST(SdpaPaged, Sm90GpuCasesAreTakenByTheRule) {
  // The cases of the sm90 paged forward's GPU tests (sdpa_paged_case.h random_sm90_paged_case, sm90_bad_entry_cases;
  // test_sdpa_paged_gpu.cpp Sm90Paged*) are calls its rule takes and the decode forward does not, so that on an H100
  // / H200 each runs on the kernel; they draw what they say (page sizes per side below / at / above the 128-key
  // block, one side contiguous, packed tables, H_k != H_v, softcap, a sample without keys); and the bad entry of
  // each bad-entry case is one the kernel reads (sample 1 has rows, and keys on that page).
  const ScopedSwitch mods(set_sdpa_fwd_sm90_mods_enabled, 1);
  const ScopedSwitch decode(set_sdpa_decode_enabled, 1);
  std::set<std::string> seen;
  for (uint64_t seed = 501; seed <= 580; ++seed) {
    const PagedCase c = random_sm90_paged_case(seed);
    HostCall call(c, DeviceType::kCUDA);
    ASSERT_EQ(sm90_paged_refusal(c), "") << c.str();
    ASSERT_NE(sdpa_decode_refusal(call.p), nullptr) << c.str();
    for (int64_t page : {c.page_k, c.page_v}) {
      seen.insert(page == 0 ? "contiguous" : page < 128 ? "page < block" : page == 128 ? "page = block" : "page > block");
    }
    if (c.page_k > 0 && c.page_v > 0 && c.page_k != c.page_v) seen.insert("K and V pages differ");
    if (c.packed_k || c.packed_v) seen.insert("packed table");
    if (c.Hk != c.Hv) seen.insert("H_k != H_v");
    if (c.softcap > 0) seen.insert("softcap");
    if (c.max_logit) seen.insert("max_logit");
    if (c.zero_kv_sample) seen.insert("sample without keys");
    seen.insert(dtype_name(c.dtype));
  }
  for (const std::string what : {"contiguous", "page < block", "page = block", "page > block", "K and V pages differ",
                                 "packed table", "H_k != H_v", "softcap", "max_logit", "sample without keys",
                                 dtype_name(DType::kFloat16), dtype_name(DType::kBFloat16)}) {
    EXPECT_TRUE(seen.count(what)) << what << " not drawn";
  }
  for (const BadEntryCase& b : sm90_bad_entry_cases()) {
    HostCall call(b.c, DeviceType::kCUDA);
    EXPECT_EQ(sm90_paged_refusal(b.c), "") << b.c.str();
    EXPECT_NE(sdpa_decode_refusal(call.p), nullptr) << b.c.str();
    EXPECT_GT(call.d.len_q[1], 0) << b.c.str();
    EXPECT_GT(call.d.len_kv[1], b.bad_page * b.c.page_k) << b.c.str();
    EXPECT_GT(call.d.len_q[0], 0) << b.c.str();
  }
}

TEST(SdpaPaged, Sm90ThdGpuCasesAreTakenByTheRule) {
  // The cases of the packed (THD) sm90 paged GPU tests (random_sm90_paged_thd_case; test_sdpa_paged_gpu.cpp
  // Sm90PagedThd*) are calls its rule takes with the switch on and the decode forward does not, refused with it off;
  // they draw what they say (packed q / o / stats, a packed gate, a sample without queries, one without keys, pages
  // below / at / above the key block and a side contiguous, GQA, both dtypes, both kernels' dims, masks).
  const ScopedSwitch mods(set_sdpa_fwd_sm90_mods_enabled, 1);
  const ScopedSwitch decode(set_sdpa_decode_enabled, 1);
  const ScopedSwitch thd(set_sdpa_sm90_thd_enabled, 1);
  std::set<std::string> seen;
  for (uint64_t seed = 601; seed <= 660; ++seed) {
    const PagedCase c = random_sm90_paged_thd_case(seed);
    HostCall call(c, DeviceType::kCUDA);
    ASSERT_TRUE(taken_only_with_switch(c, set_sdpa_sm90_paged_thd_enabled, kPagedThdOff));
    ASSERT_TRUE(c.thd_q) << c.str();
    if (call.d.len_q[size_t(c.B - 1)] == 0) seen.insert("sample without queries");
    if (call.d.len_kv[0] == 0) seen.insert("sample without keys");
    for (int64_t page : {c.page_k, c.page_v}) {
      seen.insert(page == 0     ? "contiguous"
                  : page < 128  ? "page < block"
                  : page == 128 ? "page = block"
                                : "page > block");
    }
    if (c.Hq != c.Hk) seen.insert("GQA");
    if (c.Hk != c.Hv) seen.insert("H_k != H_v");
    seen.insert(c.Dqk <= 64 && c.Dv <= 64 ? "(64, 64)" : "(128, 128)");
    if (c.has_left || c.has_right) seen.insert("mask");
    if (c.gate) seen.insert("gate");
    seen.insert(dtype_name(c.dtype));
  }
  for (const std::string what : {"sample without queries", "sample without keys", "contiguous", "page < block",
                                 "page = block", "page > block", "GQA", "H_k != H_v", "(64, 64)", "(128, 128)", "mask",
                                 "gate", dtype_name(DType::kFloat16), dtype_name(DType::kBFloat16)}) {
    EXPECT_TRUE(seen.count(what)) << what << " not drawn";
  }
  // Sm90PagedThdBadEntryIsNaN's cases: the bad-entry cases with q packed.
  const ScopedSwitch on(set_sdpa_sm90_paged_thd_enabled, 1);
  for (BadEntryCase b : sm90_bad_entry_cases()) {
    b.c.thd_q = true;
    HostCall call(b.c, DeviceType::kCUDA);
    EXPECT_EQ(sm90_paged_refusal(b.c), "") << b.c.str();
    EXPECT_NE(sdpa_decode_refusal(call.p), nullptr) << b.c.str();
    EXPECT_GT(call.d.len_q[1], 0) << b.c.str();
  }
}

// The refusal of a paged call with a bias while sdpa_sm90_paged_bias_enabled is off (on by default,
// FLASHSPAN_SM90_SDPA_PAGED_BIAS=0 off; it names the switch).
const std::string kPagedBiasOff = "bias (with paged K/V: the sm80 paged kernel, FLASHSPAN_SM90_SDPA_PAGED_BIAS=0)";

TEST(SdpaPaged, Sm90PagedBiasRule) {
  // With its switch on (sdpa_sm90_paged_bias_enabled, the default) the rule takes an additive bias in every
  // broadcast form, float32 or q's dtype, padded strides or not, on both dtypes and head dims up to 128 (the bias
  // kernel is the (128, 128) one's: it runs them all), every page size it takes and one side contiguous, with packed
  // q (its own switch on) and masks, GQA and H_k != H_v; it still refuses dropout (Philox or the caller's mask, with
  // or without the bias), the bias with the modifiers' switch off (sm90_refusal's rule), head dims above 128. Off,
  // every call with a bias is refused with kPagedBiasOff and its twin without one still taken.
  const ScopedSwitch mods(set_sdpa_fwd_sm90_mods_enabled, 1);
  const ScopedSwitch thd(set_sdpa_sm90_thd_enabled, 1);
  PagedCase c = sm90_rule_case(25, 3);
  c.bias = 1;
  PagedCase plain = c;
  plain.bias = 0;
  {
    const ScopedSwitch on(set_sdpa_sm90_paged_bias_enabled, 1);
    EXPECT_EQ(sm90_paged_refusal(c), "");
    for (int form = 1; form <= 16; ++form) {
      for (bool f32 : {false, true}) {
        PagedCase x = c;
        x.bias = form;
        x.bias_f32 = f32;
        x.bias_strided = form % 3 == 0;
        x.dtype = form % 2 ? DType::kFloat16 : DType::kBFloat16;
        x.Dqk = x.Dv = form % 4 == 0 ? 64 : form % 4 == 1 ? 128 : 40;
        x.page_k = form % 5 == 0 ? 0 : int64_t(8) << (form % 6);  // 8 .. 256, K contiguous on some
        EXPECT_EQ(sm90_paged_refusal(x), "") << x.str();
      }
    }
    {
      PagedCase x = c;
      x.thd_q = true;
      x.zero_q_sample = true;
      x.gate = true;
      const ScopedSwitch thd_on(set_sdpa_sm90_paged_thd_enabled, 1);
      EXPECT_EQ(sm90_paged_refusal(x), "") << x.str();
      const ScopedSwitch thd_off(set_sdpa_sm90_paged_thd_enabled, 0);
      EXPECT_EQ(sm90_paged_refusal(x), kPagedThdOff) << x.str();
    }
    for (int drop = 0; drop < 2; ++drop) {
      for (int with_bias = 0; with_bias < 2; ++with_bias) {
        // Dropout as the problem says it (Philox, or the caller's mask): HostCall binds no dropout tensors.
        HostCall call(with_bias ? c : plain, DeviceType::kCUDA);
        (drop == 0 ? call.p.dropout : call.p.a.dropout_mask_form) = true;
        const char* r = sdpa_fwd_sm90_paged_refusal(call.p);
        EXPECT_STREQ(r, "dropout (with paged K/V: the sm80 paged kernel)") << drop << " " << with_bias;
      }
    }
    {
      const ScopedSwitch mods_off(set_sdpa_fwd_sm90_mods_enabled, 0);
      const std::string r = sm90_paged_refusal(c);
      EXPECT_NE(r, "") << "a bias with the modifiers' switch off";
      EXPECT_NE(r, kPagedBiasOff);
      EXPECT_EQ(sm90_paged_refusal(plain), "");
    }
    PagedCase x = c;
    x.Dqk = 192;
    x.Dv = 128;
    EXPECT_EQ(sm90_paged_refusal(x), "head dims above 128");
    x = c;
    x.page_v = 4;
    EXPECT_EQ(sm90_paged_refusal(x), "a page of fewer than 8 keys");
  }
  const ScopedSwitch off(set_sdpa_sm90_paged_bias_enabled, 0);
  EXPECT_EQ(sm90_paged_refusal(c), kPagedBiasOff);
  PagedCase f32 = c;
  f32.bias = 16;
  f32.bias_f32 = true;
  EXPECT_EQ(sm90_paged_refusal(f32), kPagedBiasOff);
  EXPECT_EQ(sm90_paged_refusal(plain), "");
  HostCall drop(c, DeviceType::kCUDA);
  drop.p.dropout = true;
  const char* r = sdpa_fwd_sm90_paged_refusal(drop.p);
  EXPECT_EQ(r == nullptr ? "" : std::string(r), kPagedBiasOff) << "the bias named first";
}

TEST(SdpaPaged, Sm90PagedBiasSwitchReadsTheEnvironment) {
  // sdpa_sm90_paged_bias_enabled (on by default since 2026-12-06): on unless FLASHSPAN_SM90_SDPA_PAGED_BIAS is exactly
  // "0" (read per call), FLASHSPAN_EXPERIMENTAL (its switch before) changing nothing; the override wins both ways, -1
  // gives the environment's answer back (expect_off_switch). Seen through a paged call with a bias: taken by the rule
  // when on, refused naming the switch when off; its twin without a bias taken either way.
  const ScopedSwitch mods(set_sdpa_fwd_sm90_mods_enabled, 1);
  // The switches above this one on (on a GPU machine gpu_check.sh runs SdpaPaged.* with FLASHSPAN_SM90_SDPA_PAGED=0).
  const ScopedSwitch fwd90(set_sdpa_fwd_sm90_enabled, 1);
  const ScopedSwitch paged90(set_sdpa_sm90_paged_enabled, 1);
  PagedCase c = sm90_rule_case(26, 2);
  c.bias = 5;
  HostCall call(c, DeviceType::kCUDA);
  PagedCase plain = c;
  plain.bias = 0;
  expect_off_switch("FLASHSPAN_SM90_SDPA_PAGED_BIAS", set_sdpa_sm90_paged_bias_enabled, sdpa_sm90_paged_bias_enabled,
                    [&](bool on, const std::string& where) {
                      const char* r = sdpa_fwd_sm90_paged_refusal(call.p);
                      EXPECT_EQ(r == nullptr ? "" : std::string(r), on ? "" : kPagedBiasOff) << where;
                      EXPECT_EQ(sdpa_fwd_runs_sm90_paged(call.p), on && sdpa_fwd_sm90_may_take_paged(call.p)) << where;
                      EXPECT_EQ(sm90_paged_refusal(plain), "") << where;
                    });
}

TEST(SdpaPaged, Sm90BiasGpuCasesAreTakenByTheRule) {
  // The cases of the sm90 paged GPU tests with a bias (random_sm90_paged_bias_case; test_sdpa_paged_gpu.cpp
  // Sm90PagedBias*) are calls its rule takes with the switch on (and the paged THD switch, for the packed ones) and
  // the decode forward does not, refused naming the switch with it off; they draw what they say: every broadcast
  // form, a float32 bias and a 16-bit one, both staged by TMA (SdpaBiasParams::chunks) and read element by element,
  // padded strides, packed q, head dims of both kernels (all on the bias kernel), pages below / at / above the key
  // block and a side contiguous, GQA, masks, both dtypes.
  const ScopedSwitch mods(set_sdpa_fwd_sm90_mods_enabled, 1);
  const ScopedSwitch decode(set_sdpa_decode_enabled, 1);
  const ScopedSwitch thd(set_sdpa_sm90_thd_enabled, 1);
  const ScopedSwitch thd_on(set_sdpa_sm90_paged_thd_enabled, 1);
  std::set<std::string> seen;
  for (uint64_t seed = 701; seed <= 748; ++seed) {
    const PagedCase c = random_sm90_paged_bias_case(seed);
    HostCall call(c, DeviceType::kCUDA);
    ASSERT_TRUE(taken_only_with_switch(c, set_sdpa_sm90_paged_bias_enabled, kPagedBiasOff));
    ASSERT_GT(c.bias, 0) << c.str();
    seen.insert("form " + std::to_string(c.bias));
    const SdpaBiasParams bp = sdpa_paged_fwd_params(call.p).analytic.bias;
    seen.insert(c.bias_f32 ? "float32" : bp.chunks != 0 ? "16-bit staged" : "16-bit element-wise");
    if (c.bias_strided) seen.insert("strided");
    if (c.thd_q) seen.insert("THD");
    for (int64_t page : {c.page_k, c.page_v}) {
      seen.insert(page == 0     ? "contiguous"
                  : page < 128  ? "page < block"
                  : page == 128 ? "page = block"
                                : "page > block");
    }
    if (c.Hq != c.Hk) seen.insert("GQA");
    seen.insert(c.Dqk <= 64 && c.Dv <= 64 ? "(64, 64)" : "(128, 128)");
    if (c.has_left || c.has_right) seen.insert("mask");
    seen.insert(dtype_name(c.dtype));
  }
  std::vector<std::string> want = {"float32", "16-bit staged", "16-bit element-wise", "strided", "THD", "contiguous",
                                   "page < block", "page = block", "page > block", "GQA", "(64, 64)", "(128, 128)",
                                   "mask", dtype_name(DType::kFloat16), dtype_name(DType::kBFloat16)};
  for (int form = 1; form <= 16; ++form) want.push_back("form " + std::to_string(form));
  for (const std::string& what : want) EXPECT_TRUE(seen.count(what)) << what << " not drawn";
}

TEST(SdpaPaged, Sm90PagedSwitchIsOnByDefault) {
  // sdpa_sm90_paged_enabled: on unless FLASHSPAN_SM90_SDPA_PAGED is exactly "0" (read per call), FLASHSPAN_EXPERIMENTAL
  // changing nothing, the override wins both ways, -1 gives the environment's answer back (expect_off_switch). Off, no
  // call runs on the kernel; on, exactly those its rule takes on an sm_90 device. Without an sm_90 device (this CPU
  // test) no call runs on it and none gets its workspace, whatever the switch says.
  PagedCase c;
  c.seed = 22;
  c.B = 2;
  c.Sq = 150;
  c.Skv = 300;
  c.page_k = c.page_v = 64;
  HostCall call(c, DeviceType::kCUDA);
  EXPECT_EQ(sdpa_fwd_sm90_paged_refusal(call.p), nullptr);
  flashspan::test::expect_off_switch("FLASHSPAN_SM90_SDPA_PAGED", set_sdpa_sm90_paged_enabled, sdpa_sm90_paged_enabled,
                                     [&](bool on, const std::string& where) {
                                       EXPECT_EQ(sdpa_fwd_runs_sm90_paged(call.p),
                                                 on && sdpa_fwd_sm90_may_take_paged(call.p))
                                           << where;
                                     });
  // The flags' workspace: every 16-bit paged forward that may take the kernel (an sm_90 device with the sm_90a
  // code), whatever the switch says; none elsewhere (and never on CPU tensors).
  const size_t flags = sdpa_fwd_sm90_paged_flags_bytes(call.p);
  if (sdpa_fwd_sm90_may_take_paged(call.p)) {
    EXPECT_GE(flags, size_t(c.B) * 4);
    EXPECT_GE(sdpa_fwd_workspace_size(call.p), flags);
  } else {
    EXPECT_EQ(flags, 0u);
  }
  HostCall cpu(c);
  EXPECT_FALSE(sdpa_fwd_sm90_may_take_paged(cpu.p));
  EXPECT_EQ(sdpa_fwd_sm90_paged_flags_bytes(cpu.p), 0u);
}

// sdpa_check_features_gpu's verdict on the CUDA twin of a case ("" when accepted).
std::string cuda_refusal(const PagedCase& c) {
  HostCall call(c, DeviceType::kCUDA);
  try {
    sdpa_check_features_gpu(call.p);
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kNotSupported);
    return e.what();
  }
  return "";
}

TEST(SdpaPaged, CudaRules) {
  PagedCase c;
  c.seed = 11;
  c.B = 2;
  c.Sq = 5;
  c.Skv = 70;
  c.page_k = 16;
  c.page_v = 1;
  set_sdpa_paged_enabled(0);
  const std::string off = cuda_refusal(c);
  EXPECT_EQ(off.rfind("paged_attention_k_table, paged_attention_v_table: paged K/V caches on CUDA tensors are "
                      "turned off by FLASHSPAN_SDPA_PAGED=0", 0), 0u) << off;
  set_sdpa_paged_enabled(1);
  EXPECT_EQ(cuda_refusal(c), "");
  c.page_v = 0;  // K alone paged
  EXPECT_EQ(cuda_refusal(c), "");
  set_sdpa_paged_enabled(-1);
  // The environment: on by default, off with FLASHSPAN_SDPA_PAGED=0 (read at each check).
  const char* had = std::getenv("FLASHSPAN_SDPA_PAGED");
  const std::string old = had != nullptr ? had : "";
  unsetenv("FLASHSPAN_SDPA_PAGED");
  EXPECT_EQ(cuda_refusal(c), "");
  setenv("FLASHSPAN_SDPA_PAGED", "0", 1);
  EXPECT_EQ(cuda_refusal(c).rfind("paged_attention_k_table, paged_attention_v_table: paged K/V caches on CUDA "
                                  "tensors are turned off by FLASHSPAN_SDPA_PAGED=0", 0), 0u);
  if (had != nullptr) {
    setenv("FLASHSPAN_SDPA_PAGED", old.c_str(), 1);
  } else {
    unsetenv("FLASHSPAN_SDPA_PAGED");
  }
}

// check_support() of a paged forward on CUDA descriptors (data nullptr; bf16 q / o [2, 2, 5, 64], K and
// V containers [12, 2, 16, 64] through one table [2, 1, 5, 1], seq_len, paged_attention_max_seq_len_kv
// 70) with setup(attributes) applied: the message of a NOT_SUPPORTED refusal, "status N: message" for
// another error (no device on a GPU-less machine, a build without CUDA), "" when accepted.
template <class Setup>
std::string paged_cuda_check_support(Setup setup) {
  namespace api = flashspan::api;
  const fs_device_t cuda{FS_DEVICE_CUDA, 0};
  const api::TensorDesc q(nullptr, api::kBFloat16, cuda, {2, 2, 5, 64});
  const api::TensorDesc o(nullptr, api::kBFloat16, cuda, {2, 2, 5, 64});
  const api::TensorDesc k(nullptr, api::kBFloat16, cuda, {12, 2, 16, 64});  // containers [pages, H, page, D]
  const api::TensorDesc v(nullptr, api::kBFloat16, cuda, {12, 2, 16, 64});
  const api::TensorDesc table(nullptr, api::kInt32, cuda, {2, 1, 5, 1}), len(nullptr, api::kInt32, cuda, {2});
  api::SdpaAttributes a;
  a.set_attn_scale(0.125f).set_padding_mask(true).set_seq_len_q(len).set_seq_len_kv(len);
  a.set_paged_attention_k_table(table).set_paged_attention_v_table(table).set_paged_attention_max_seq_len_kv(70);
  setup(a);
  try {
    api::SdpaFwd fwd(q, k, v, o, nullptr, a);
    fwd.check_support();
  } catch (const api::Exception& e) {
    if (e.status() == FS_STATUS_NOT_SUPPORTED) return e.what();
    return "status " + std::to_string(int(e.status())) + ": " + e.what();
  }
  return "";
}

// The switches of paged K/V and of the feature pairs for a scope (`pairs`: 1 on, 0 off, -1 the environment's
// answer), the environment's answers after it.
struct PairsSwitch {
  explicit PairsSwitch(int pairs) {
    set_sdpa_paged_enabled(1);
    set_sdpa_feature_pairs_enabled(pairs);
  }
  ~PairsSwitch() {
    set_sdpa_feature_pairs_enabled(-1);
    set_sdpa_paged_enabled(-1);
  }
  PairsSwitch(const PairsSwitch&) = delete;
  PairsSwitch& operator=(const PairsSwitch&) = delete;
};

TEST(SdpaPaged, CudaRulesBiasDropout) {
  // The additive bias (q's dtype, or float32 broadcast) and dropout (Philox, with rng_dump, or the
  // caller's mask) with paged K/V on CUDA tensors: refused by check_support with the feature pairs'
  // switch off (set_sdpa_feature_pairs_enabled(0)), naming the pair and FLASHSPAN_SDPA_FEATURE_PAIRS=0;
  // with it on, and by default (no override, the variable unset), no longer refused for the pair
  // (check_support may then fail later: at the device check of a GPU-less machine, or in a build
  // without CUDA).
  namespace api = flashspan::api;
  using Setup = std::function<void(api::SdpaAttributes&)>;
  const fs_device_t cuda{FS_DEVICE_CUDA, 0};
  const api::TensorDesc bias(nullptr, api::kBFloat16, cuda, {2, 2, 5, 70});
  const api::TensorDesc bias_b(nullptr, api::kFloat32, cuda, {1, 2, 1, 70});
  const api::TensorDesc seed(nullptr, api::kInt64, cuda, {1}), offset(nullptr, api::kInt64, cuda, {1});
  const api::TensorDesc dump(nullptr, api::kUInt8, cuda, {2, 2, 5, 70});
  const api::TensorDesc mask(nullptr, api::kUInt8, cuda, {2, 1, 5, 70}), scale(nullptr, api::kFloat32, cuda, {1});
  const std::string off_tail = ": turned off on CUDA tensors by FLASHSPAN_SDPA_FEATURE_PAIRS=0; CPU tensors run it "
                               "on the CPU reference";
  const std::string bias_pair = "bias together with paged K/V caches" + off_tail;
  const std::string dropout_pair = "dropout together with paged K/V caches" + off_tail;
  const struct {
    const char* name;
    Setup setup;
    const std::string& refusal;  // the message with the switch off
  } calls[] = {
      {"bias", [&](api::SdpaAttributes& a) { a.set_bias(bias); }, bias_pair},
      {"float32 bias [1, H_q, 1, S_kv]", [&](api::SdpaAttributes& a) { a.set_bias(bias_b); }, bias_pair},
      {"Philox", [&](api::SdpaAttributes& a) { a.set_dropout(0.1f, seed, offset); }, dropout_pair},
      {"Philox with rng_dump", [&](api::SdpaAttributes& a) { a.set_dropout(0.25f, seed, offset).set_rng_dump(dump); },
       dropout_pair},
      {"dropout mask", [&](api::SdpaAttributes& a) { a.set_dropout_mask(mask, scale); }, dropout_pair},
      {"bias and Philox (the bias named first)",
       [&](api::SdpaAttributes& a) { a.set_bias(bias).set_dropout(0.1f, seed, offset); }, bias_pair},
  };
  auto starts = [](const std::string& msg, const std::string& prefix) { return msg.rfind(prefix, 0) == 0; };
  {
    const PairsSwitch off(0);
    // Without them the paged call is not refused for a pair.
    const std::string plain = paged_cuda_check_support([](api::SdpaAttributes&) {});
    EXPECT_EQ(plain.find("together with paged K/V caches"), std::string::npos) << plain;
    for (const auto& call : calls) {
      EXPECT_EQ(paged_cuda_check_support(call.setup), call.refusal) << call.name;
    }
  }
  const ScopedEnv pairs_env("FLASHSPAN_SDPA_FEATURE_PAIRS", nullptr);
  for (int sw : {1, -1}) {  // forced on, and the default
    const PairsSwitch on(sw);
    for (const auto& call : calls) {
      const std::string m = paged_cuda_check_support(call.setup);
      EXPECT_FALSE(starts(m, bias_pair) || starts(m, dropout_pair)) << call.name << " (" << sw << "): " << m;
      EXPECT_EQ(m.find("together with paged K/V caches"), std::string::npos) << call.name << " (" << sw << "): " << m;
    }
  }
}

TEST(SdpaPaged, FeaturePairsSwitchReadsTheEnvironment) {
  // The feature pairs' switch (sdpa_launch.h sdpa_feature_pairs_enabled): on by default (since their GPU tests
  // passed on an H200), off when FLASHSPAN_SDPA_FEATURE_PAIRS is exactly "0" (core/env_switch.h env_flag_off; unset,
  // empty or any other value: on), read per check_support; FLASHSPAN_EXPERIMENTAL (their switch before) no
  // longer changes it; set_sdpa_feature_pairs_enabled(1 / 0) wins over the environment both ways, -1 gives it
  // back. Seen through a paged call with a bias: accepted for the pair when on, refused naming it when off.
  namespace api = flashspan::api;
  const fs_device_t cuda{FS_DEVICE_CUDA, 0};
  const api::TensorDesc bias(nullptr, api::kBFloat16, cuda, {2, 2, 5, 70});
  auto with_bias = [&](api::SdpaAttributes& a) { a.set_bias(bias); };
  const std::string off = "bias together with paged K/V caches: turned off on CUDA tensors by "
                          "FLASHSPAN_SDPA_FEATURE_PAIRS=0; CPU tensors run it on the CPU reference";
  auto accepted = [&] {
    const std::string m = paged_cuda_check_support(with_bias);
    return m.find("together with paged K/V caches") == std::string::npos;
  };
  const PairsSwitch env_answer(-1);  // paged K/V forced on, the pairs the environment's answer
  ScopedEnv var("FLASHSPAN_SDPA_FEATURE_PAIRS", nullptr);
  ScopedEnv experimental("FLASHSPAN_EXPERIMENTAL", nullptr);
  EXPECT_TRUE(sdpa_feature_pairs_enabled());
  EXPECT_TRUE(accepted());
  experimental.set("0");
  EXPECT_TRUE(sdpa_feature_pairs_enabled());
  EXPECT_TRUE(accepted());
  var.set("0");
  EXPECT_FALSE(sdpa_feature_pairs_enabled());
  EXPECT_EQ(paged_cuda_check_support(with_bias), off);
  experimental.set("1");
  EXPECT_FALSE(sdpa_feature_pairs_enabled());
  EXPECT_EQ(paged_cuda_check_support(with_bias), off);
  for (const char* other : {"1", "", "00", " 0", "off", "false"}) {  // anything but "0" leaves them on
    var.set(other);
    EXPECT_TRUE(sdpa_feature_pairs_enabled()) << '"' << other << '"';
    EXPECT_TRUE(accepted()) << '"' << other << '"';
  }
  var.set("0");
  set_sdpa_feature_pairs_enabled(1);
  EXPECT_TRUE(sdpa_feature_pairs_enabled());
  EXPECT_TRUE(accepted());
  var.set(nullptr);
  experimental.set(nullptr);
  set_sdpa_feature_pairs_enabled(0);
  EXPECT_FALSE(sdpa_feature_pairs_enabled());
  EXPECT_EQ(paged_cuda_check_support(with_bias), off);
  set_sdpa_feature_pairs_enabled(-1);
  EXPECT_TRUE(sdpa_feature_pairs_enabled());
  var.set("0");
  EXPECT_FALSE(sdpa_feature_pairs_enabled());
}

}  // namespace
}  // namespace flashspan::test
