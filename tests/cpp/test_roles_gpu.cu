// GPU unit tests of the shared kernel roles (src/kernels/common/): each test launches a tiny
// kernel that runs one role on known inputs and compares what it wrote with a host computation.
//   RolesGpu.OnlineSoftmax*   kern::OnlineSoftmax / online_softmax_step / LazyOnlineSoftmax /
//                             lse_from_stats over several key blocks: rows with no visible key,
//                             -inf masking, the scale folded into the exponent.
//   RolesGpu.PlanPayloadMask  kern::PlanPayloadMask + AccFragment (and Variant::logits, both scale forms) against
//                             the host payload layout (payload_layout.h).
//   RolesGpu.TileScheduler*   task / grid-cell / descending-cell orders, next(), split-item
//                             claims (claim), snake waves over a split list of descending cells
//                             (next_cell_item, the deterministic sm90 backward).
//   RolesGpu.AnalyticGridOrders  the SDPA grids (AnalyticGrid, AnalyticBwdGrid's two orders and its
//                             deterministic one): snake waves, every cell once.
//   RolesGpu.K2QWalk*         K2QWalk and K2QWalkAscending: the same pairs, the latter ascending
//                             per head; seek(begin) + count slices.
//   RolesGpu.SampleMapsLoadTheSamplesRows  the per-sample tensor maps of packed tensors (sm90): TMA boxes
//                             through them give each sample's rows, zeros past its length.
//   RolesGpu.DropoutFragments SDPA's dropout multipliers (sdpa_score_mod.cuh) of the forward's
//                             fragment (sdpa_dropout_apply) and of the sm90 backward's transposed one
//                             (sdpa_dropout_keep_bits_transposed, sdpa_dropout_mask_apply), Philox
//                             against core/philox.h and the caller's mask, element by element.
// They skip (GTEST_SKIP) when no GPU is visible, like every GPU test.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <type_traits>
#include <vector>

#include "gpu_harness.h"
#include "kernels/common/block_range.cuh"
#include "kernels/common/k2q_walk.cuh"
#include "core/philox.h"
#include "kernels/common/payload_layout.h"
#include "kernels/common/sdpa_score_mod.cuh"
#include "kernels/common/softmax.cuh"
#include "kernels/common/split_schedule.cuh"
#include "kernels/common/tile_scheduler.cuh"
#include "kernels/common/variant.cuh"
#include "kernels/params.h"
#include "kernels/sm90/ptx_sm90.cuh"
#include "kernels/sm90/sample_maps_sm90.h"
#include "kernels/sm90/tma_sm90.h"

namespace flashspan::test {
namespace {

// A device copy of a host vector, freed with the object.
template <class T>
struct DevVec {
  DevBuf buf;
  size_t n;
  explicit DevVec(const std::vector<T>& h) : buf(std::max<size_t>(h.size(), 1) * sizeof(T)), n(h.size()) {
    if (!h.empty()) cuda_ok(cudaMemcpy(buf.p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  explicit DevVec(size_t count, T fill) : DevVec(std::vector<T>(count, fill)) {}
  T* ptr() const { return static_cast<T*>(buf.p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    if (n) cuda_ok(cudaMemcpy(h.data(), buf.p, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return h;
  }
};

void sync_ok(const char* what) {
  cuda_ok(cudaGetLastError(), what);
  cuda_ok(cudaDeviceSynchronize(), what);
}

constexpr float kInf = std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------
// OnlineSoftmax: one warp, a 16-row tile, kBlocks key blocks of kN n8 blocks (logits in log2
// units, -inf = masked). x[col] weights each column: the thread accumulates o = sum p x over
// its columns (register 2 hi + e of its one n8 "output block"), rescaled by the update's
// factors, so that quad_sum(o) / row_sum is the row's softmax-weighted mean of x. scale: the
// factor the update applies inside its exponent (1: the input is in log2 units; else raw scores
// whose logits are scale s, the sm90 forward's folded scale, Variant::logits).

constexpr int kSmN = 8;        // n8 blocks per key block (64 columns)
constexpr int kSmBlocks = 5;   // key blocks
constexpr int kSmCols = 8 * kSmN * kSmBlocks;

// The forms of the update (kMode): the eager update and rescale, the one-pass step, the lazy update (the sm90
// forward's: a row's base moves only past its threshold, the rescale of O skipped when no row's did, settled at
// the end).
enum SmMode { kSmEager, kSmOnePass, kSmLazy };

template <int kMode>
__global__ void online_softmax_kernel(const float* logits, const float* x, float scale, float* out) {
  const int lane = threadIdx.x;
  const kern::AccFragment f(lane);
  std::conditional_t<kMode >= kSmLazy, kern::LazyOnlineSoftmax, kern::OnlineSoftmax> sm;
  sm.init();
  float o[1][4] = {{0.f, 0.f, 0.f, 0.f}};
  for (int kb = 0; kb < kSmBlocks; ++kb) {
    float s[kSmN][4];
    float xs[kSmN][4];
#pragma unroll
    for (int j = 0; j < kSmN; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int col = kb * 8 * kSmN + f.col(j, r);
        s[j][r] = logits[f.row(r) * kSmCols + col];
        xs[j][r] = x[col];
      }
    }
    if constexpr (kMode == kSmOnePass) {
      kern::online_softmax_step<kSmN, 1>(s, sm.m, sm.l, o, scale);
    } else {
      float corr[2];
      if constexpr (kMode == kSmLazy) {
        if (sm.update(s, corr, scale)) kern::OnlineSoftmax::rescale(o, corr);
      } else {
        sm.update(s, corr, scale);
        kern::OnlineSoftmax::rescale(o, corr);
      }
    }
    // o (register 2 hi + e) += p x over the thread's columns of the block.
#pragma unroll
    for (int j = 0; j < kSmN; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) o[0][r] += s[j][r] * xs[j][r];
    }
  }
  if constexpr (kMode >= kSmLazy) sm.settle(o);
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const float num = kern::quad_sum(o[0][2 * hi] + o[0][2 * hi + 1]);
    const float l = sm.row_sum(hi);
    if (f.q == 0) {
      const int row = f.row_of_half(hi);
      out[4 * row + 0] = sm.m[hi];
      out[4 * row + 1] = l;
      out[4 * row + 2] = kern::lse_from_stats(sm.m[hi], l);
      out[4 * row + 3] = l > 0.f ? num / l : 0.f;
    }
  }
}

template <int kMode>
void check_online_softmax(uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-6.f, 6.f);
  std::vector<float> logits(16 * kSmCols), x(kSmCols);
  for (float& v : x) v = u(rng);
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < kSmCols; ++c) {
      float v = u(rng);
      const int kb = c / (8 * kSmN);
      if (r == 3 || r == 12) v = -kInf;                     // no visible key at all
      if (r == 5 && kb < 3) v = -kInf;                      // first keys only in block 3
      if (r == 7 && kb != 0) v = -kInf;                     // only block 0 (later blocks all masked)
      if (r == 9 && (c % 3 == 0)) v = -kInf;                // scattered masking
      if (r == 10 && kb == 2) v += 40.f;                    // the max jumps in a middle block
      if (r == 14 && c == kSmCols - 1) v = 30.f;            // the max in the last column
      logits[r * kSmCols + c] = v;
    }
  }
  DevVec<float> d_logits(logits), d_x(x), d_out(16 * 4, std::nanf(""));
  online_softmax_kernel<kMode><<<1, 32>>>(d_logits.ptr(), d_x.ptr(), scale, d_out.ptr());
  sync_ok("online_softmax_kernel");
  const std::vector<float> out = d_out.get();
  for (int r = 0; r < 16; ++r) {
    float m_raw = -kInf;
    for (int c = 0; c < kSmCols; ++c) m_raw = std::max(m_raw, logits[r * kSmCols + c]);
    const double m = double(m_raw * scale);  // the kernel's running max: max of the raw scores, scaled
    double l = 0, num = 0;
    if (m != -kInf) {
      for (int c = 0; c < kSmCols; ++c) {
        const double p = std::exp2(double(logits[r * kSmCols + c]) * scale - m);
        l += p;
        num += p * x[c];
      }
    }
    const float* o = &out[4 * r];
    SCOPED_TRACE(testing::Message() << "row " << r);
    for (int k = 0; k < 4; ++k) EXPECT_FALSE(std::isnan(o[k])) << "stat " << k;
    if (m == -kInf) {
      EXPECT_EQ(o[0], -kInf);
      EXPECT_EQ(o[1], 0.f);
      EXPECT_EQ(o[2], -kInf);
      EXPECT_EQ(o[3], 0.f);
      continue;
    }
    EXPECT_EQ(o[0], float(m));
    EXPECT_NEAR(o[1], l, 1e-4 * l);
    const double lse = (m + std::log2(l)) * std::log(2.0);
    EXPECT_NEAR(o[2], lse, 1e-4 * std::max(1.0, std::fabs(lse)));
    EXPECT_NEAR(o[3], num / l, 1e-4 * std::max(1.0, std::fabs(num / l)));
  }
}

TEST(RolesGpu, OnlineSoftmaxUpdateRescale) {
  REQUIRE_GPU();
  for (uint64_t seed : {1, 2, 3}) check_online_softmax<kSmEager>(seed);
}

TEST(RolesGpu, OnlineSoftmaxOnePassStep) {
  REQUIRE_GPU();
  for (uint64_t seed : {4, 5, 6}) check_online_softmax<kSmOnePass>(seed);
}

// The lazy update (the sm90 forward's), with the scores in log2 units and with the scale folded in.
TEST(RolesGpu, OnlineSoftmaxLazy) {
  REQUIRE_GPU();
  for (uint64_t seed : {9, 10, 11}) {
    check_online_softmax<kSmLazy>(seed);
    check_online_softmax<kSmLazy>(seed, 0.37f);
  }
}

// The scale folded into the exponent (raw scores, logits = scale s): both forms.
TEST(RolesGpu, OnlineSoftmaxFoldedScale) {
  REQUIRE_GPU();
  for (uint64_t seed : {7, 8}) {
    check_online_softmax<kSmEager>(seed, 0.37f);
    check_online_softmax<kSmOnePass>(seed, 0.37f);
  }
}

// ---------------------------------------------------------------------------------------
// PlanPayloadMask + AccFragment: a 64 x 128 block (4 warps of 16 rows, 16 n8 blocks = two
// 64-column words a lane), payload entries encoded on the host with payload_position(); each
// warp loads its words of entry `entry` and writes where its registers land, through
// Variant<PlanPayloadMask>::logits (scale, then the mask) of raw scores s = 1 + row + col / 1000:
// each register times the factor logits() returns (the scale it leaves to the softmax's
// exponent when it is positive, else 1), the logit the softmax sees.

constexpr int kPmRows = 64, kPmCols = 128, kPmN = kPmCols / 8;

__device__ __host__ inline float pm_score(int r, int c) { return 1.0f + float(r) + float(c) / 1000.0f; }

__global__ void payload_mask_kernel(const uint32_t* bits, int entry, int partial, float scale, float* out,
                                    float* exp_scale) {
  const int lane = threadIdx.x & 31, mt = threadIdx.x >> 5;
  const kern::AccFragment f(lane);
  kern::PlanPayloadMask<kPmN> mask;
  mask.load(bits, partial != 0, entry, kPmRows, mt, lane);
  float s[kPmN][4];
#pragma unroll
  for (int j = 0; j < kPmN; ++j) {
#pragma unroll
    for (int r = 0; r < 4; ++r) s[j][r] = pm_score(16 * mt + f.row(r), f.col(j, r));
  }
  const kern::Variant<kern::PlanPayloadMask<kPmN>> variant{scale, {}};
  const float x = variant.logits(s, mask, partial != 0);
  if (threadIdx.x == 0) *exp_scale = x;
#pragma unroll
  for (int j = 0; j < kPmN; ++j) {
#pragma unroll
    for (int r = 0; r < 4; ++r) out[(16 * mt + f.row(r)) * kPmCols + f.col(j, r)] = s[j][r] * x;
  }
}

TEST(RolesGpu, PlanPayloadMask) {
  REQUIRE_GPU();
  std::mt19937_64 rng(7);
  const int kEntries = 3, words = payload_words(kPmRows, kPmCols);
  std::vector<std::vector<uint8_t>> vis(kEntries, std::vector<uint8_t>(kPmRows * kPmCols));
  std::vector<uint32_t> bits(size_t(kEntries) * words, 0u);
  for (int e = 0; e < kEntries; ++e) {
    for (int r = 0; r < kPmRows; ++r) {
      for (int c = 0; c < kPmCols; ++c) {
        // entry 0: causal-like; 1: random; 2: one visible column per row
        const bool v = e == 0 ? c <= 2 * r : e == 1 ? (rng() & 1) != 0 : c == (7 * r) % kPmCols;
        vis[e][r * kPmCols + c] = v;
        if (v) {
          const PayloadPos pp = payload_position(r, c, kPmCols);
          bits[size_t(e) * words + pp.word] |= 1u << pp.bit;
        }
      }
    }
  }
  DevVec<uint32_t> d_bits(bits);
  DevVec<float> d_out(kPmRows * kPmCols, std::nanf(""));
  DevVec<float> d_x(1, std::nanf(""));
  for (const float scale : {0.5f, -0.5f}) {  // folded into the exponent; applied by logits()
  for (int e = 0; e < kEntries; ++e) {
    for (int partial : {1, 0}) {
      payload_mask_kernel<<<1, 32 * (kPmRows / 16)>>>(d_bits.ptr(), e, partial, scale, d_out.ptr(), d_x.ptr());
      sync_ok("payload_mask_kernel");
      const std::vector<float> out = d_out.get();
      EXPECT_EQ(d_x.get()[0], scale > 0.0f ? scale : 1.0f) << "the factor logits() leaves to the softmax";
      int bad = 0;
      for (int r = 0; r < kPmRows; ++r) {
        for (int c = 0; c < kPmCols; ++c) {
          const float want = (!partial || vis[e][r * kPmCols + c]) ? pm_score(r, c) * scale : -kInf;
          if (out[r * kPmCols + c] != want && bad++ < 8) {
            ADD_FAILURE() << "entry " << e << " partial " << partial << " (" << r << ", " << c << "): got "
                          << out[r * kPmCols + c] << ", want " << want;
          }
        }
      }
      EXPECT_EQ(bad, 0) << "entry " << e << " partial " << partial << " scale " << scale;
    }
  }
  }
}

// ---------------------------------------------------------------------------------------
// TileScheduler: a view of 4 samples (block starts with an empty sample), 3 heads, a task list
// in some cost order and a split item list; host copies of each order.

struct SchedCase {
  std::vector<int32_t> block_start{0, 3, 3, 8, 10};  // 4 samples, sample 1 empty
  int batch = 4, heads = 3;
  int64_t num_blocks = 10;
  std::vector<int32_t> tasks;  // {block, head, batch, cost}
  std::vector<int32_t> items;  // {task, begin, end, slot}
  SchedCase() {
    std::mt19937_64 rng(11);
    for (int h = 0; h < heads; ++h) {
      for (int b = 0; b < batch; ++b) {
        for (int blk = 0; blk < block_start[b + 1] - block_start[b]; ++blk) {
          tasks.insert(tasks.end(), {blk, h, b, int32_t(rng() % 100)});
        }
      }
    }
    // Longest first, as the planner orders them.
    std::vector<std::array<int32_t, 4>> t4;
    for (size_t i = 0; i < tasks.size(); i += 4) t4.push_back({tasks[i], tasks[i + 1], tasks[i + 2], tasks[i + 3]});
    std::stable_sort(t4.begin(), t4.end(), [](const auto& a, const auto& b) { return a[3] > b[3]; });
    tasks.clear();
    for (const auto& t : t4) tasks.insert(tasks.end(), t.begin(), t.end());
    // Items: task 0 split in three pieces (slots 0..2), task 1 in two (3, 4), the rest whole.
    int slot = 0;
    for (int t = 0; t < num_tasks(); ++t) {
      const int pieces = t == 0 ? 3 : t == 1 ? 2 : 1;
      for (int k = 0; k < pieces; ++k) items.insert(items.end(), {t, 10 * k, 10 * (k + 1), pieces > 1 ? slot++ : -1});
    }
  }
  int num_tasks() const { return int(tasks.size() / 4); }
  int num_items() const { return int(items.size() / 4); }
  int owner(int gb) const {
    int b = 0;
    for (int i = 0; i < batch; ++i) {
      if (block_start[i] <= gb) b = i;
    }
    return b;
  }
  // Host twins of TileScheduler's item sources: {block, head, batch, begin, count, slot}.
  using Item = std::array<int, 6>;
  static Item none() { return {-1, 0, 0, 0, 0, -1}; }
  Item task(int64_t t) const {
    if (t >= num_tasks()) return none();
    return {tasks[4 * t], tasks[4 * t + 1], tasks[4 * t + 2], 0, kern::WorkItem::kWholeWalk, -1};
  }
  Item cell(int64_t i) const {
    if (i >= num_blocks * heads) return none();
    const int gb = int(i % num_blocks), b = owner(gb);
    return {gb - block_start[b], int(i / num_blocks), b, 0, kern::WorkItem::kWholeWalk, -1};
  }
  // band: BwdParams::det_band (bands of `band` blocks from the top, each band's cells head by head),
  // listed here band by band.
  Item cell_descending(int64_t i, int band = 1) const {
    if (i >= num_blocks * heads) return none();
    int64_t n = 0;
    for (int64_t top = num_blocks - 1; top >= 0; top -= band) {
      const int64_t w = std::min<int64_t>(band, top + 1);
      for (int h = 0; h < heads; ++h) {
        for (int64_t k = 0; k < w; ++k, ++n) {
          if (n == i) {
            const int gb = int(top - k), b = owner(gb);
            return {gb - block_start[b], h, b, 0, kern::WorkItem::kWholeWalk, -1};
          }
        }
      }
    }
    return none();
  }
  Item split_item(int i) const {
    const int t = items[4 * i];
    return {tasks[4 * t], tasks[4 * t + 1], tasks[4 * t + 2], items[4 * i + 1], items[4 * i + 2] - items[4 * i + 1],
            items[4 * i + 3]};
  }
  // The same items read as a list over cells: descending (grid mode 1, the deterministic
  // backward's, in bands of `band` blocks) or ascending with heads slowest (kGridCellsAscending).
  Item split_cell_item(int i, bool ascending = false, int band = 1) const {
    Item w = ascending ? cell(items[4 * i]) : cell_descending(items[4 * i], band);
    w[3] = items[4 * i + 1];
    w[4] = items[4 * i + 2] - items[4 * i + 1];
    w[5] = items[4 * i + 3];
    return w;
  }
};

// mode 0: task(i), 1: cell(i), 2: cell_descending(i), 3..5: split_item(i) (of a scheduler in
// grid mode 0, 1 or kGridCellsAscending), 6 / 7: cell_descending(i) / split_item(i) of one in grid
// mode 1 with a band of blocks (BwdParams::det_band); one thread per index.
__global__ void sched_direct_kernel(kern::TileScheduler ts, int mode, int n, int* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const kern::WorkItem w = mode == 0   ? ts.task(i)
                           : mode == 1 ? ts.cell(i)
                           : mode == 2 || mode == 6 ? ts.cell_descending(i)
                                                    : ts.split_item(i);
  int* o = out + 6 * i;
  o[0] = w.block, o[1] = w.head, o[2] = w.batch, o[3] = w.begin, o[4] = w.count, o[5] = w.slot;
}

// Persistent order: CTA blockIdx.x asks next(n) (cells: next_cell_item(n)) for n = 0, 1, ... until
// none; writes {n, item} rows at out[(blockIdx.x * max_n + n) * 7].
__global__ void sched_next_kernel(kern::TileScheduler ts, int cells, int max_n, int* out) {
  if (threadIdx.x != 0) return;
  for (int n = 0; n < max_n; ++n) {
    const kern::WorkItem w = cells ? ts.next_cell_item(uint32_t(n)) : ts.next(uint32_t(n));
    int* o = out + (int64_t(blockIdx.x) * max_n + n) * 7;
    o[0] = n, o[1] = w.block, o[2] = w.head, o[3] = w.batch, o[4] = w.begin, o[5] = w.count, o[6] = w.slot;
    if (w.block < 0) break;
  }
}

kern::TileScheduler make_sched(const SchedCase& c, const DevVec<int32_t>& tasks, const DevVec<int32_t>& starts,
                               DevVec<int32_t>* hdr, const DevVec<int32_t>& items, int split, int grid, int band = 1) {
  return kern::TileScheduler{tasks.ptr(), c.num_tasks(), starts.ptr(), c.num_blocks, c.heads, c.batch,
                             hdr ? hdr->ptr() : nullptr, items.ptr(), split, grid, band};
}

TEST(RolesGpu, TileSchedulerSources) {
  REQUIRE_GPU();
  const SchedCase c;
  DevVec<int32_t> tasks(c.tasks), starts(c.block_start), items(c.items);
  const kern::TileScheduler ts = make_sched(c, tasks, starts, nullptr, items, 0, 0);
  const int n_cells = int(c.num_blocks * c.heads);
  const kern::TileScheduler ts_cells = make_sched(c, tasks, starts, nullptr, items, 0, 1);
  const kern::TileScheduler ts_asc = make_sched(c, tasks, starts, nullptr, items, 0, kGridCellsAscending);
  // Modes 6 / 7 in bands of 3 blocks (a short last band of 1), every block one band (heads slowest), and past it.
  for (const int band : {3, int(c.num_blocks), kDetBandAll}) {
    const kern::TileScheduler ts_band = make_sched(c, tasks, starts, nullptr, items, 0, 1, band);
    for (int mode = band == 3 ? 0 : 6; mode < 8; ++mode) {
      // Two past the end (none) for the bounded sources; exactly the items for split_item.
      const int n = mode == 0 ? c.num_tasks() + 2 : (mode >= 3 && mode != 6) ? c.num_items() : n_cells + 2;
      DevVec<int> out(size_t(6) * n, -7);
      const kern::TileScheduler& src = mode == 4 ? ts_cells : mode == 5 ? ts_asc : mode >= 6 ? ts_band : ts;
      sched_direct_kernel<<<(n + 63) / 64, 64>>>(src, mode, n, out.ptr());
      sync_ok("sched_direct_kernel");
      const std::vector<int> h = out.get();
      const int host_band = std::min<int64_t>(band, c.num_blocks);
      for (int i = 0; i < n; ++i) {
        const SchedCase::Item want = mode == 0   ? c.task(i)
                                     : mode == 1 ? c.cell(i)
                                     : mode == 2 ? c.cell_descending(i)
                                     : mode == 6 ? c.cell_descending(i, host_band)
                                     : mode == 3 ? c.split_item(i)
                                                 : c.split_cell_item(i, mode == 5, mode == 7 ? host_band : 1);
        for (int k = 0; k < 6; ++k) {
          EXPECT_EQ(h[6 * i + k], want[k]) << "band " << band << " mode " << mode << " index " << i << " field " << k;
        }
      }
      if (mode == 2 || mode == 6) {
        // The deterministic lists (any band): every cell once, and before each cell every cell of its head with a
        // larger global block (whose dQ additions it waits for: the kernel's deadlock argument).
        std::set<std::pair<int, int>> before;  // (head, global block) of the cells so far
        for (int i = 0; i < n_cells; ++i) {
          const int gb = c.block_start[h[6 * i + 2]] + h[6 * i], head = h[6 * i + 1];
          EXPECT_TRUE(before.insert({head, gb}).second) << "band " << band << " mode " << mode << ": cell " << i
                                                         << " repeated";
          for (int g = gb + 1; g < c.num_blocks; ++g) {
            EXPECT_TRUE(before.count({head, g}))
                << "band " << band << " mode " << mode << ": cell " << i << " before (" << head << ", " << g << ")";
          }
        }
      }
    }
  }
}

TEST(RolesGpu, TileSchedulerNextOrders) {
  REQUIRE_GPU();
  const SchedCase c;
  DevVec<int32_t> tasks(c.tasks), starts(c.block_start), items(c.items);
  const int n_cells = int(c.num_blocks * c.heads);
  for (int grid : {1, 4, 7, 64}) {
    // 0: next over tasks, 1: next over cells, 2: next_cell_item over a split list of descending
    // cells (snake waves)
    for (int kind = 0; kind < 3; ++kind) {
      std::vector<int32_t> hdr0(SplitSchedule::kHdrInts, 0);
      hdr0[SplitSchedule::kTotal] = c.num_items();
      DevVec<int32_t> hdr(hdr0);
      const kern::TileScheduler ts = make_sched(c, tasks, starts, &hdr, items, kind == 2, kind >= 1);
      const int max_n = std::max({c.num_tasks(), n_cells, c.num_items()}) / grid + 2;
      DevVec<int> out(size_t(7) * grid * max_n, -7);
      sched_next_kernel<<<grid, 32>>>(ts, kind == 2, max_n, out.ptr());
      sync_ok("sched_next_kernel");
      const std::vector<int> h = out.get();
      std::multiset<int64_t> seen;  // source index of every item handed out
      for (int cta = 0; cta < grid; ++cta) {
        int64_t prev = -1;
        for (int n = 0; n < max_n; ++n) {
          const int* o = &h[(size_t(cta) * max_n + n) * 7];
          // The host index of item n of this CTA.
          int64_t idx = int64_t(cta) + int64_t(n) * grid;
          if (kind == 2) idx = int64_t(n) * grid + ((n & 1) ? grid - 1 - cta : cta);  // snake waves
          const SchedCase::Item want = kind == 0   ? c.task(idx)
                                       : kind == 1 ? c.cell(idx)
                                       : idx < c.num_items() ? c.split_cell_item(int(idx))
                                                             : SchedCase::none();
          SCOPED_TRACE(testing::Message() << "grid " << grid << " kind " << kind << " cta " << cta << " n " << n);
          ASSERT_EQ(o[0], n);
          for (int k = 0; k < 6; ++k) EXPECT_EQ(o[1 + k], want[k]) << "field " << k;
          if (want[0] < 0) break;
          EXPECT_GT(idx, prev);  // a CTA's items rise in index
          prev = idx;
          seen.insert(idx);
        }
      }
      // Every task / cell handed out exactly once.
      const int total = kind == 0 ? c.num_tasks() : kind == 1 ? n_cells : c.num_items();
      ASSERT_EQ(int(seen.size()), total) << "grid " << grid << " kind " << kind;
      for (int i = 0; i < total; ++i) EXPECT_EQ(seen.count(i), 1u) << "grid " << grid << " kind " << kind << " " << i;
    }
  }
}

// The analytic (SDPA) grids: CTA blockIdx.x asks next(n) for n = 0, 1, ... until none. kind 0:
// AnalyticGrid::next, 1: AnalyticBwdGrid::next, 2: AnalyticBwdGrid::next_descending; writes
// {block, head, batch} at out[(blockIdx.x * max_n + n) * 3].
__global__ void analytic_next_kernel(int kind, int blocks, int heads, int batch, bool heads_slowest, int max_n,
                                     int* out) {
  if (threadIdx.x != 0) return;
  const kern::AnalyticGrid fwd{blocks, heads, batch};
  const kern::AnalyticBwdGrid bwd{blocks, heads, batch, heads_slowest};
  for (int n = 0; n < max_n; ++n) {
    const kern::WorkItem w = kind == 0 ? fwd.next(uint32_t(n)) : kind == 1 ? bwd.next(uint32_t(n))
                                                                           : bwd.next_descending(uint32_t(n));
    int* o = out + (int64_t(blockIdx.x) * max_n + n) * 3;
    o[0] = w.block, o[1] = w.head, o[2] = w.batch;
    if (w.block < 0) break;
  }
}

// The grids' orders (tile_scheduler.cuh) against a host model: snake waves; the forward's last query
// block first, heads fastest; the backward's heads_slowest (no band) every block of head 0
// (sample-major), then head 1, ..., else its first key block first, heads fastest; the
// deterministic backward's global key blocks descending, heads fastest. Every cell exactly once.
TEST(RolesGpu, AnalyticGridOrders) {
  REQUIRE_GPU();
  const int blocks = 5, heads = 3, batch = 2, total = blocks * heads * batch;
  for (int grid : {1, 4, 7, 64}) {
    for (int kind = 0; kind < 3; ++kind) {
      for (bool slowest : {false, true}) {
        if (kind != 1 && slowest) continue;  // AnalyticGrid::next and next_descending have one order
        const int max_n = total / grid + 2;
        DevVec<int> out(size_t(3) * grid * max_n, -7);
        analytic_next_kernel<<<grid, 32>>>(kind, blocks, heads, batch, slowest, max_n, out.ptr());
        sync_ok("analytic_next_kernel");
        const std::vector<int> h = out.get();
        std::set<std::tuple<int, int, int>> seen;
        for (int cta = 0; cta < grid; ++cta) {
          for (int n = 0; n < max_n; ++n) {
            SCOPED_TRACE(testing::Message() << "grid " << grid << " kind " << kind << " heads_slowest " << slowest
                                            << " cta " << cta << " n " << n);
            const int* o = &h[(size_t(cta) * max_n + n) * 3];
            const int i = n * grid + ((n & 1) ? grid - 1 - cta : cta);  // snake waves
            std::array<int, 3> want{-1, 0, 0};
            const int per_block = heads * batch, gblocks = blocks * batch;
            if (i < total) {
              if (kind == 2) {
                const int gb = gblocks - 1 - i / heads;
                want = {gb % blocks, i % heads, gb / blocks};
              } else if (slowest) {
                const int gb = i % gblocks;
                want = {gb % blocks, i / gblocks, gb / blocks};
              } else {
                const int r = i % per_block;
                want = {kind == 0 ? blocks - 1 - i / per_block : i / per_block, r % heads, r / heads};
              }
            }
            ASSERT_EQ(o[0], want[0]);
            if (want[0] < 0) break;
            EXPECT_EQ(o[1], want[1]);
            EXPECT_EQ(o[2], want[2]);
            EXPECT_TRUE(seen.insert({o[0], o[1], o[2]}).second) << "cell handed out twice";
          }
        }
        EXPECT_EQ(int(seen.size()), total) << "grid " << grid << " kind " << kind << " heads_slowest " << slowest;
      }
    }
  }
}

// The grouped orders (AnalyticGrid / AnalyticBwdGrid `group`; the sm90 SDPA forward and non-deterministic backward,
// PERF_LOG v2.60-v2.62), in snake waves (counter null) or claimed through `counter` (zeroed before the launch): kind 0
// AnalyticGrid::next (one thread), 1 AnalyticBwdGrid::next_warp with heads fastest, 2 AnalyticBwdGrid::
// next_descending_warp (the deterministic order; kinds 1-2: the whole warp asks, lane 0 claims and writes).
// {block, head, batch} at out[(blockIdx.x * max_n + n) * 3].
__global__ void analytic_group_kernel(int kind, int blocks, int heads, int batch, int group, int* counter, int max_n,
                                      int* out) {
  const int lane = threadIdx.x & 31;
  if (threadIdx.x >= 32 || (kind == 0 && lane != 0)) return;
  const kern::AnalyticGrid fwd{blocks, heads, batch, group, counter};
  const kern::AnalyticBwdGrid bwd{blocks, heads, batch, false, group, counter};
  for (int n = 0; n < max_n; ++n) {
    const kern::WorkItem w = kind == 0   ? fwd.next(uint32_t(n))
                             : kind == 1 ? bwd.next_warp(uint32_t(n), lane)
                                         : bwd.next_descending_warp(uint32_t(n), lane);
    if (lane == 0) {
      int* o = out + (int64_t(blockIdx.x) * max_n + n) * 3;
      o[0] = w.block, o[1] = w.head, o[2] = w.batch;
    }
    if (w.block < 0) break;
  }
}

// The grouped orders against a host model of the list: groups of `group` consecutive (sample, head) pairs r = b
// heads + h (the partial group, pairs % group pairs, first), one after the other; inside a group the forward's and
// the deterministic backward's last block first, the non-deterministic backward's first key block first, pairs
// fastest; a group of every pair (or none) the ungrouped order (the deterministic one: a group of every pair is one
// group, key blocks descending, pairs fastest). Snake waves hand cell n * grid + lane to a CTA as the ungrouped grids do; claimed, one
// CTA takes the list in order and several take every cell exactly once. (The deterministic kind and the partial
// group first: first run on an H100, 2026-12-06, PERF_LOG v2.63: passed.)
TEST(RolesGpu, AnalyticGridGroupOrders) {
  REQUIRE_GPU();
  const int blocks = 5, heads = 3, batch = 2, pairs = heads * batch, total = blocks * pairs;
  auto model = [&](int kind, int group, int i) {
    int first = 0, size = pairs;
    if (group > 0 && group < pairs) {
      // Written as the list of groups: the partial one (if any) first, then whole ones.
      std::vector<int> sizes;
      if (pairs % group != 0) sizes.push_back(pairs % group);
      for (int k = 0; k < pairs / group; ++k) sizes.push_back(group);
      for (int g : sizes) {
        if (i < (first + g) * blocks) {
          size = g;
          break;
        }
        first += g;
      }
    }
    const int j = i - first * blocks, r = first + j % size;
    return std::array<int, 3>{kind != 1 ? blocks - 1 - j / size : j / size, r % heads, r / heads};
  };
  DevVec<int> counter(1, 0);
  for (int kind : {0, 1, 2}) {
    for (int group : {1, 4, pairs - 1, pairs}) {
      for (bool claimed : {false, true}) {
        for (int grid : {1, 4, 7, 64}) {
          const int max_n = claimed ? total + 2 : total / grid + 2;
          DevVec<int> out(size_t(3) * grid * max_n, -7);
          cuda_ok(cudaMemset(counter.ptr(), 0, sizeof(int)), "counter reset");
          analytic_group_kernel<<<grid, 32>>>(kind, blocks, heads, batch, group, claimed ? counter.ptr() : nullptr,
                                              max_n, out.ptr());
          sync_ok("analytic_group_kernel");
          const std::vector<int> h = out.get();
          std::set<std::tuple<int, int, int>> seen;
          for (int cta = 0; cta < grid; ++cta) {
            for (int n = 0; n < max_n; ++n) {
              SCOPED_TRACE(testing::Message() << "kind " << kind << " group " << group << " claimed " << claimed
                                              << " grid " << grid << " cta " << cta << " n " << n);
              const int* o = &h[(size_t(cta) * max_n + n) * 3];
              if (o[0] < 0) {
                EXPECT_EQ(o[0], -1);  // written, not the poison
                break;
              }
              EXPECT_TRUE(seen.insert({o[0], o[1], o[2]}).second) << "cell handed out twice";
              // Snake waves: the model's cell of the CTA's index; claimed by one CTA: the list in order.
              const int i = claimed ? (grid == 1 ? n : -1) : n * grid + ((n & 1) ? grid - 1 - cta : cta);
              if (i >= 0) {
                ASSERT_LT(i, total);
                const std::array<int, 3> want = model(kind, group, i);
                EXPECT_EQ(o[0], want[0]);
                EXPECT_EQ(o[1], want[1]);
                EXPECT_EQ(o[2], want[2]);
              }
            }
          }
          EXPECT_EQ(int(seen.size()), total) << "kind " << kind << " group " << group << " claimed " << claimed
                                             << " grid " << grid;
        }
      }
    }
  }
}

// The split schedule's lists (split_schedule.cuh): task order (the default) and split-first
// (kSplitFirst, the sm90 backward in cell order): every task's steps covered exactly once by its
// items in step order, slots one per split task, and in the split-first list every split task's
// items ahead of every unsplit task's, each group in task order.
__global__ void split_items_kernel(SplitSchedule sp, bool split_first) {
  kern::write_split_items<false>(sp, blockIdx.x, split_first);
}

TEST(RolesGpu, SplitScheduleLists) {
  REQUIRE_GPU();
  std::mt19937_64 rng(5);
  for (int n : {1, 7, 300, 5000}) {
    for (bool first : {false, true}) {
      std::vector<int32_t> iters(n);
      for (auto& x : iters) x = rng() % 4 == 0 ? int32_t(rng() % 2000) : int32_t(rng() % 40);
      DevVec<int32_t> hdr(std::vector<int32_t>(SplitSchedule::kHdrInts, -1)), d_iters(iters),
          start(std::vector<int32_t>(n + 1, -1)), slot(std::vector<int32_t>(n, -9)),
          items(std::vector<int32_t>(4 * (n + 4 * 1024), -1));
      SplitSchedule sp;
      sp.hdr = hdr.ptr();
      sp.task_iters = d_iters.ptr();
      sp.item_start = start.ptr();
      sp.task_slot = slot.ptr();
      sp.items = items.ptr();
      sp.num_tasks = n;
      sp.num_ctas = 132;
      if (first) {
        kern::split_scan_kernel<false, kern::kSplitPerGrid, true><<<1, kern::kSplitScanThreads>>>(sp);
      } else {
        kern::split_scan_kernel<false><<<1, kern::kSplitScanThreads>>>(sp);
      }
      split_items_kernel<<<n, 256>>>(sp, first);
      sync_ok("split schedule");
      const std::vector<int32_t> h = hdr.get(), it = items.get(), sl = slot.get();
      const int total = h[SplitSchedule::kTotal], chunk = h[SplitSchedule::kChunk];
      SCOPED_TRACE(testing::Message() << "n " << n << " split_first " << first << " chunk " << chunk);
      ASSERT_GT(total, 0);
      ASSERT_EQ(h[SplitSchedule::kCounter], 0);
      std::vector<int> next_step(n, 0), last_task_of_group(2, -1);
      bool unsplit_seen = false;
      int split_tasks = 0;
      for (int t = 0; t < n; ++t) split_tasks += iters[t] > chunk;
      ASSERT_EQ(h[SplitSchedule::kNumSplit], split_tasks);
      for (int i = 0; i < total; ++i) {
        const int t = it[4 * i], b = it[4 * i + 1], e = it[4 * i + 2], s = it[4 * i + 3];
        ASSERT_TRUE(t >= 0 && t < n) << "item " << i;
        const bool split = iters[t] > chunk;
        EXPECT_EQ(b, next_step[t]) << "item " << i;  // a task's items in step order, no gap
        next_step[t] = e;
        EXPECT_EQ(s, split ? sl[t] : -1) << "item " << i;
        EXPECT_GE(t, last_task_of_group[split]) << "item " << i;  // task order within a group
        last_task_of_group[split] = t;
        if (first) {
          if (!split) unsplit_seen = true;
          EXPECT_FALSE(split && unsplit_seen) << "item " << i << ": a split task's item after an unsplit one";
        }
      }
      for (int t = 0; t < n; ++t) EXPECT_EQ(next_step[t], iters[t]) << "task " << t;
    }
  }
}

TEST(RolesGpu, TileSchedulerSplitClaims) {
  REQUIRE_GPU();
  const SchedCase c;
  DevVec<int32_t> tasks(c.tasks), starts(c.block_start), items(c.items);
  for (int grid : {1, 3, 16}) {
    std::vector<int32_t> hdr0(SplitSchedule::kHdrInts, 0);
    hdr0[SplitSchedule::kTotal] = c.num_items();
    hdr0[SplitSchedule::kCounter] = 0;
    DevVec<int32_t> hdr(hdr0);
    const kern::TileScheduler ts = make_sched(c, tasks, starts, &hdr, items, 1, 0);
    const int max_n = c.num_items() + 2;
    DevVec<int> out(size_t(7) * grid * max_n, -7);
    sched_next_kernel<<<grid, 32>>>(ts, 0, max_n, out.ptr());
    sync_ok("sched_next_kernel (split)");
    const std::vector<int> h = out.get();
    // Every item claimed exactly once, each CTA's claims in list order, each one split_item(i).
    std::map<std::array<int, 6>, int> want;
    for (int i = 0; i < c.num_items(); ++i) ++want[c.split_item(i)];
    std::map<std::array<int, 6>, int> got;
    int claimed = 0;
    for (int cta = 0; cta < grid; ++cta) {
      for (int n = 0; n < max_n; ++n) {
        const int* o = &h[(size_t(cta) * max_n + n) * 7];
        if (o[1] < 0) break;
        ++got[{o[1], o[2], o[3], o[4], o[5], o[6]}];
        ++claimed;
      }
    }
    EXPECT_EQ(claimed, c.num_items()) << "grid " << grid;
    EXPECT_EQ(got, want) << "grid " << grid;
    // The counter: every CTA's last claim ran past the list once.
    EXPECT_EQ(hdr.get()[SplitSchedule::kCounter], c.num_items() + grid) << "grid " << grid;
  }
}

// ---------------------------------------------------------------------------------------
// K2QWalk vs K2QWalkAscending on a synthetic backward view: Hmask = Hq = 4 heads (kv groups of
// 2), 2 samples of 3 and 2 key blocks, 12 query blocks; every K2Q row has partial entries
// (ascending, random payload indices) and full runs (ascending, disjoint from them).

struct WalkCase {
  int hq = 4, group = 2, batch = 2, nqb = 12;
  std::vector<int32_t> k_block_start{0, 3, 5};
  int64_t num_k_blocks = 5;
  std::vector<int32_t> partial_ptr{0}, partial_qb, partial_idx, full_ptr{0}, full_runs;
  // Per row: (qb, payload) in K2QWalk order and in ascending order.
  std::vector<std::vector<std::array<int, 2>>> cursor_order, ascending;
  WalkCase() {
    std::mt19937_64 rng(23);
    for (int r = 0; r < hq * num_k_blocks; ++r) {
      std::vector<int> kind(nqb);  // 0 empty, 1 partial, 2 full
      for (int& k : kind) k = int(rng() % 3);
      if (r % 7 == 3) std::fill(kind.begin(), kind.end(), 0);  // some rows empty
      std::vector<std::array<int, 2>> cur, asc;
      for (int q = 0; q < nqb; ++q) {
        if (kind[q] == 1) {
          partial_qb.push_back(q);
          partial_idx.push_back(int32_t(rng() % 1000));
          cur.push_back({q, partial_idx.back()});
        }
      }
      for (int q = 0; q < nqb;) {
        if (kind[q] != 2) {
          ++q;
          continue;
        }
        int e = q;
        while (e < nqb && kind[e] == 2 && e - q < 3) ++e;  // runs of at most 3: adjacent runs too
        full_runs.insert(full_runs.end(), {q, e});
        for (int j = q; j < e; ++j) cur.push_back({j, -1});
        q = e;
      }
      asc = cur;
      std::sort(asc.begin(), asc.end(), [](const auto& a, const auto& b) { return a[0] < b[0]; });
      partial_ptr.push_back(int32_t(partial_qb.size()));
      full_ptr.push_back(int32_t(full_runs.size() / 2));
      cursor_order.push_back(cur);
      ascending.push_back(asc);
    }
  }
  // The pairs {head, qb, payload} of key block kb of sample b, kv head hkv, as the walk visits them.
  std::vector<std::array<int, 3>> pairs(int hkv, int b, int kb, bool asc) const {
    std::vector<std::array<int, 3>> v;
    for (int h = hkv * group; h < (hkv + 1) * group; ++h) {
      const int r = h * int(num_k_blocks) + k_block_start[b] + kb;
      for (const auto& e : (asc ? ascending : cursor_order)[r]) v.push_back({h, e[0], e[1]});
    }
    return v;
  }
};

// One thread per (kv head, sample, key block) item; walks [begin, begin + count) and writes up
// to max_pairs {head, qb, payload} rows, then the number of pairs.
template <class Walk>
__global__ void k2q_walk_kernel(BwdParams p, const int4* work, int n_work, int max_pairs, int* out, int* count_out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n_work) return;
  const int4 w = work[i];  // {hkv, b, kb, begin}; count from count_out[i] on entry
  const int count = count_out[i];
  Walk walk{&p, w.x * p.group_size, (w.x + 1) * p.group_size, w.y, w.z, count, {}};
  walk.seek(w.w);
  int n = 0, h = 0, qb = 0, payload = 0;
  while (n < max_pairs && walk.next(h, qb, payload)) {
    int* o = out + (int64_t(i) * max_pairs + n) * 3;
    o[0] = h, o[1] = qb, o[2] = payload;
    ++n;
  }
  count_out[i] = n;
}

template <class Walk>
void check_k2q_walk(bool asc) {
  const WalkCase c;
  DevVec<int32_t> kbs(c.k_block_start), pptr(c.partial_ptr), pqb(c.partial_qb), pidx(c.partial_idx),
      fptr(c.full_ptr), fruns(c.full_runs);
  BwdParams p{};
  p.group_size = c.group;
  p.num_heads_q = c.hq;
  p.batch = c.batch;
  p.mask_per_head = 1;
  p.view.num_k_blocks = c.num_k_blocks;
  p.view.k_block_start = kbs.ptr();
  p.view.k2q_partial_ptr = pptr.ptr();
  p.view.k2q_partial_qb = pqb.ptr();
  p.view.k2q_partial_idx = pidx.ptr();
  p.view.k2q_full_ptr = fptr.ptr();
  p.view.k2q_full_runs = fruns.ptr();
  // Items: every (hkv, b, kb) whole, then slices [begin, begin + count) of each.
  std::vector<int4> work;
  std::vector<int> counts;
  std::vector<std::vector<std::array<int, 3>>> want;
  std::mt19937_64 rng(29);
  for (int hkv = 0; hkv < c.hq / c.group; ++hkv) {
    for (int b = 0; b < c.batch; ++b) {
      for (int kb = 0; kb < c.k_block_start[b + 1] - c.k_block_start[b]; ++kb) {
        const auto all = c.pairs(hkv, b, kb, asc);
        work.push_back({hkv, b, kb, 0});
        counts.push_back(kern::WorkItem::kWholeWalk);
        want.push_back(all);
        for (int rep = 0; rep < 3 && !all.empty(); ++rep) {
          const int begin = int(rng() % all.size()), count = 1 + int(rng() % all.size());
          work.push_back({hkv, b, kb, begin});
          counts.push_back(count);
          want.emplace_back(all.begin() + begin, all.begin() + std::min<size_t>(all.size(), size_t(begin) + count));
        }
      }
    }
  }
  const int max_pairs = 2 * c.group * c.nqb;
  DevVec<int4> d_work(work);
  DevVec<int> d_counts(counts), d_out(size_t(work.size()) * max_pairs * 3, -7);
  k2q_walk_kernel<Walk><<<(int(work.size()) + 31) / 32, 32>>>(p, d_work.ptr(), int(work.size()), max_pairs,
                                                              d_out.ptr(), d_counts.ptr());
  sync_ok("k2q_walk_kernel");
  const std::vector<int> out = d_out.get(), got_n = d_counts.get();
  for (size_t i = 0; i < work.size(); ++i) {
    SCOPED_TRACE(testing::Message() << (asc ? "ascending" : "cursor order") << " hkv " << work[i].x << " b "
                                    << work[i].y << " kb " << work[i].z << " begin " << work[i].w << " count "
                                    << counts[i]);
    ASSERT_EQ(got_n[i], int(want[i].size()));
    for (size_t n = 0; n < want[i].size(); ++n) {
      const int* o = &out[(i * max_pairs + n) * 3];
      EXPECT_EQ(o[0], want[i][n][0]) << "pair " << n << " head";
      EXPECT_EQ(o[1], want[i][n][1]) << "pair " << n << " qb";
      EXPECT_EQ(o[2], want[i][n][2]) << "pair " << n << " payload";
    }
  }
}

TEST(RolesGpu, K2QWalkCursorOrder) {
  REQUIRE_GPU();
  check_k2q_walk<kern::K2QWalk>(false);
}

TEST(RolesGpu, K2QWalkAscending) {
  REQUIRE_GPU();
  check_k2q_walk<kern::K2QWalkAscending>(true);
}

// The two walks visit the same pairs (as multisets per item), whatever their order.
TEST(RolesGpu, K2QWalksSamePairs) {
  REQUIRE_GPU();
  const WalkCase c;
  for (int hkv = 0; hkv < c.hq / c.group; ++hkv) {
    for (int b = 0; b < c.batch; ++b) {
      for (int kb = 0; kb < c.k_block_start[b + 1] - c.k_block_start[b]; ++kb) {
        auto a = c.pairs(hkv, b, kb, false), d = c.pairs(hkv, b, kb, true);
        std::sort(a.begin(), a.end());
        std::sort(d.begin(), d.end());
        EXPECT_EQ(a, d);
      }
    }
  }
  // (The device side of each order is checked against these host orders by the two tests above.)
}

// ---------------------------------------------------------------------------------------
// SDPA's dropout multipliers on a warp's fragments: a 64-query x 128-key tile from query q0 and key
// k0 of sample b, head h. Forward (rows = queries, AccFragment): four m16 tiles of 16 n8 key blocks,
// sdpa_dropout_apply. Transposed (the sm90 backward's S^T, rows = keys): eight m16 key tiles of 8 n8
// query blocks, sdpa_dropout_keep_bits_transposed + sdpa_dropout_keep_apply (Philox) or
// sdpa_dropout_mask_apply<8, true> (mask), as kernel_bwd_mods_sm90.cuh calls them. Each writes the
// multiplier of every element at (query, key) of its own [64][128] output.

constexpr int kDrQ = 64, kDrK = 128;

__global__ void dropout_fragments_kernel(const SdpaDropoutParams dp, int b, int h, int heads, int q0, int k0,
                                         int len_q, int len_k, float* fwd, float* bwd) {
  const int lane = threadIdx.x, g = lane >> 2, qd = lane & 3;
  for (int mt = 0; mt < kDrQ / 16; ++mt) {
    kern::sdpa_dropout_apply<kDrK / 8>(dp, b, h, heads, q0 + 16 * mt + g, k0 + 2 * qd, len_q, len_k,
                                       [&](int n, int r, float m) {
                                         fwd[(16 * mt + g + 8 * (r >> 1)) * kDrK + 8 * n + 2 * qd + (r & 1)] = m;
                                       });
  }
  for (int kt = 0; kt < kDrK / 16; ++kt) {
    const int64_t i = q0 + 2 * qd, k = k0 + 16 * kt + g;
    auto out = [&](int n, int r, float m) { bwd[(8 * n + 2 * qd + (r & 1)) * kDrK + 16 * kt + g + 8 * (r >> 1)] = m; };
    if (dp.mode == 1) {
      kern::sdpa_dropout_keep_apply<kDrQ / 8>(kern::sdpa_dropout_keep_bits_transposed<kDrQ / 8>(dp, b, h, heads, i, k),
                                              dp.scale, out);
    } else {
      kern::sdpa_dropout_mask_apply<kDrQ / 8, true>(dp, b, h, i, k, len_q, len_k, out);
    }
  }
}

TEST(RolesGpu, DropoutFragments) {
  REQUIRE_GPU();
  const int b = 1, h = 2, heads = 3, q0 = 192, k0 = 256, len_q = q0 + 50, len_k = k0 + 100;
  for (int form = 0; form < 4; ++form) {
    SCOPED_TRACE(form);
    SdpaDropoutParams dp;
    const int64_t seed = form == 1 ? -123456789012LL : 77, offset = form == 1 ? (1LL << 33) - 3 : 5;
    const float prob = form == 0 ? 0.3f : form == 1 ? 0.9f : 0.0f;
    DevVec<int64_t> seed_d(std::vector<int64_t>{seed}), offset_d(std::vector<int64_t>{offset});
    // The mask form: [2, 3, len_q, len_k] float32 (form 2) or [1, 3, 1, len_k] uint8 broadcast over B and
    // the rows (form 3), values 0 .. 3.
    const bool bcast = form == 3;
    const int64_t mb = bcast ? 1 : 2, mi = bcast ? 1 : len_q;
    std::mt19937_64 rng(form);
    std::vector<float> mask_f(size_t(mb * heads * mi * len_k));
    for (float& v : mask_f) v = float(rng() % 4);
    std::vector<uint8_t> mask_u(mask_f.begin(), mask_f.end());
    DevVec<float> mask_fd(mask_f), scale_d(std::vector<float>{1.75f});
    DevVec<uint8_t> mask_ud(mask_u);
    if (form < 2) {
      dp.mode = 1;
      dp.seed = IndexArray{seed_d.ptr(), 1};
      dp.offset = IndexArray{offset_d.ptr(), 1};
      dp.threshold = dropout_threshold(prob);
      dp.scale = 1.0f / (1.0f - prob);
    } else {
      dp.mode = 2;
      dp.mask = bcast ? static_cast<const void*>(mask_ud.ptr()) : mask_fd.ptr();
      dp.mask_dtype = bcast ? kSdpaMaskU8 : kSdpaMaskF32;
      const int64_t st[4] = {heads * mi * len_k, mi * len_k, len_k, 1};
      for (int d = 0; d < 4; ++d) dp.mask_stride[d] = (bcast && (d == 0 || d == 2)) ? 0 : st[d];
      dp.mask_scale = scale_d.ptr();
    }
    DevVec<float> fwd(size_t(kDrQ * kDrK), -1.0f), bwd(size_t(kDrQ * kDrK), -1.0f);
    dropout_fragments_kernel<<<1, 32>>>(dp, b, h, heads, q0, k0, len_q, len_k, fwd.ptr(), bwd.ptr());
    sync_ok("dropout_fragments_kernel");
    const std::vector<float> f = fwd.get(), t = bwd.get();
    int64_t bad_f = 0, bad_t = 0;
    for (int qi = 0; qi < kDrQ; ++qi) {
      for (int kj = 0; kj < kDrK; ++kj) {
        const int i = q0 + qi, j = k0 + kj;
        float want;
        if (form < 2) {
          want = dropout_keep(uint64_t(seed), uint64_t(offset), uint32_t(b * heads + h), uint32_t(i), uint32_t(j),
                              dp.threshold)
                     ? dp.scale
                     : 0.0f;
        } else {
          want = 0.0f;
          if (i < len_q && j < len_k) {
            const int64_t e = bcast ? int64_t(h) * len_k + j : ((int64_t(b) * heads + h) * len_q + i) * len_k + j;
            want = mask_f[size_t(e)] * 1.75f;
          }
        }
        bad_f += f[size_t(qi * kDrK + kj)] != want;
        bad_t += t[size_t(qi * kDrK + kj)] != want;
      }
    }
    EXPECT_EQ(bad_f, 0) << "forward fragment";
    EXPECT_EQ(bad_t, 0) << "transposed fragment";
  }
}

// ---------------------------------------------------------------------------------------
// The per-sample tensor maps of packed tensors (kernels/sm90/sample_maps_sm90.{h,cu,cuh}; experimental, not yet
// run on a GPU): the pre-pass's map of sample b, loaded through by TMA as the sm90 producers do (acquire, a
// 128-row x 64-column box at head 0, batch coordinate 0, from row row0), must give the sample's own rows below its
// length and zeros from there (128B swizzle undone when copying out: 16-byte chunk c of row r lies at c ^ (r % 8)).

__global__ void sample_map_box_kernel(const CUtensorMap* maps, int tensors, int b, int row0, uint16_t* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ alignas(1024) uint16_t tile[128 * 64];
  __shared__ alignas(8) uint64_t bar;
  const uint32_t t = kern::smem_u32(tile), br = kern::smem_u32(&bar);
  const CUtensorMap* m = maps + tensors * b;
  if (threadIdx.x == 0) {
    kern90::mbar_init(br, 1);
    kern90::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    kern90::tensormap_acquire(m);
    kern90::mbar_arrive_expect_tx(br, 128 * 64 * 2);
    kern90::tma_load_4d(t, m, 0, row0, 0, 0, br);
  }
  kern90::mbar_wait(br, 0);
  for (int i = int(threadIdx.x); i < 128 * 64; i += int(blockDim.x)) {
    const int r = i / 64, c = i % 64;
    out[i] = tile[r * 64 + (((c / 8) ^ (r % 8)) * 8) + c % 8];
  }
#else
  (void)maps, (void)tensors, (void)b, (void)row0, (void)out;
#endif
}

TEST(RolesGpu, SampleMapsLoadTheSamplesRows) {
  REQUIRE_SM90();
  // A packed bf16 tensor [T, H = 2, D = 64] (THD, gaps between samples) of four samples, one empty; its values
  // raw 16-bit codes, all non-zero (a zero in the box is TMA's fill). Its template: one sample of 200 rows.
  constexpr int H = 2, D = 64, S = 200;
  const std::vector<int> len = {5, 0, 140, 37};
  const std::vector<int64_t> tok = {0, 7, 7, 150};  // token offsets (gaps: 2 after sample 0, 3 after sample 2)
  const int B = int(len.size());
  const int64_t tokens = tok.back() + len.back() + 1;
  std::vector<uint16_t> host(size_t(tokens * H * D));
  for (size_t i = 0; i < host.size(); ++i) host[i] = uint16_t(1 + i % 30000);
  DevVec<uint16_t> data(host);
  std::vector<int64_t> starts(size_t(B) + 1), lens64(len.begin(), len.end());
  for (int b = 0; b < B; ++b) starts[size_t(b)] = tok[size_t(b)] * H * D;
  starts[size_t(B)] = tokens * H * D;
  DevVec<int64_t> d_starts(starts), d_len(lens64);

  TensorView v;
  v.data = data.ptr();
  v.dtype = DType::kBFloat16;
  v.device = DeviceType::kCUDA;
  v.ndim = 4;
  v.shape = {1, S, H, D};
  v.strides = {0, H * D, D, 1};
  sm90::SampleMapsJob job;
  SampleStart st;
  st.ragged = IndexArray{d_starts.ptr(), 1};
  job.add(sm90::make_tensor_map_sm90(v, false, DType::kBFloat16, 128, "q"), data.ptr(), st, /*query_side=*/1);
  job.seq_len[0] = IndexArray{d_len.ptr(), 1};
  job.max_len[0] = S;
  DevVec<uint8_t> ws(sm90::sample_maps_bytes(B, 1) + sm90::kTensorMapBytes, 0);
  void* base = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws.ptr()) + 127) / 128 * 128);
  const int32_t* flags = sm90::launch_sample_maps_sm90(job, B, base, nullptr);
  sync_ok("sample maps");
  std::vector<int32_t> f(static_cast<size_t>(B), -1);
  cuda_ok(cudaMemcpy(f.data(), flags, f.size() * 4, cudaMemcpyDeviceToHost), "flags");
  EXPECT_EQ(f, std::vector<int32_t>(size_t(B), 0));
  DevVec<uint16_t> out(size_t(128 * 64), uint16_t(0xffff));
  for (int b = 0; b < B; ++b) {
    for (int row0 : {0, 1, 128}) {
      if (len[size_t(b)] == 0 && row0 == 0) continue;  // (the producers load an empty sample's box at row 1)
      sample_map_box_kernel<<<1, 128>>>(static_cast<const CUtensorMap*>(base), 1, b, row0, out.ptr());
      sync_ok("sample_map_box_kernel");
      const std::vector<uint16_t> got = out.get();
      int64_t bad = 0;
      for (int r = 0; r < 128; ++r) {
        for (int c = 0; c < 64; ++c) {
          const int row = row0 + r;
          const uint16_t want =
              row < len[size_t(b)] ? host[size_t((tok[size_t(b)] + row) * H * D + c)] : uint16_t(0);
          bad += got[size_t(r * 64 + c)] != want;
        }
      }
      EXPECT_EQ(bad, 0) << "sample " << b << " (length " << len[size_t(b)] << "), box from row " << row0;
    }
  }
}

}  // namespace
}  // namespace flashspan::test
