// The sm90 backward's switches (declared in kernels/sm90/launch_sm90.h), one home: which backward runs an sm90
// plan (launch_flex_bwd), whether (64, 64) / (192, 128) plans get the wide tiles (dispatch/family.cpp's
// consumer_sm90), the cell orders (flex_dispatch.cu) and the deterministic schedule's cut, band, item order, dQ
// hand-off and split slots (launch_bwd_sm90.cu). Each reads the environment by core/env_switch.h's rules; the
// set_* overrides are for tests and benchmarks. Plain host code (no CUDA unit), so that every build linking the
// family registry has them, tests/emu's too.
#ifdef FLASHSPAN_WITH_CUDA
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/env_switch.h"
#include "kernels/common/experimental_switch.h"
#include "kernels/params.h"  // kDetBandAll
#include "kernels/sm90/launch_sm90.h"

namespace flashspan::sm90 {

namespace {
std::atomic<int> g_bwd_override{-1};
std::atomic<int> g_wide64_override{-1};
std::atomic<int> g_wide192_override{-1};
std::atomic<int> g_det_split_override{-1};
std::atomic<int> g_det_split_above_override{-1};
std::atomic<int> g_cell_order_override{-1};
kern::ExperimentalSwitch g_split_first;
std::atomic<int> g_det_band_override{-1};
std::atomic<int> g_gemm_order_override{-1};
kern::OffSwitch g_dropout_philox{"FLASHSPAN_SM90_BWD_DROPOUT_PHILOX"};

// The in-process overrides of the switches below: set_*(1) on, (0) off, (-1) back to the
// environment's answer.
void store_override(std::atomic<int>& o, int on) { o.store(on < 0 ? -1 : (on ? 1 : 0), std::memory_order_relaxed); }
}  // namespace

void set_bwd_enabled(int on) { store_override(g_bwd_override, on); }

bool bwd_enabled() {
  const int o = g_bwd_override.load(std::memory_order_relaxed);
  if (o >= 0) return o == 1;
  // On by default (checked on an H200: the GPU suite, compute-sanitizer, PERF_LOG v1.4);
  // FLASHSPAN_SM90_BWD=0 keeps the portable sm80 backward for comparison.
  static const bool on = !env_flag_off("FLASHSPAN_SM90_BWD");
  return on;
}

// FLASHSPAN_SM90_BWD_DETERMINISTIC=0 gives deterministic calls the sm80 backward (its separate
// dQ kernel): the ordered dQ tiles are slower than it where every key block adds one tile at the
// same walk position (longformer's global query rows, PERF_LOG v1.6).
bool bwd_deterministic_enabled() {
  static const bool on = !env_flag_off("FLASHSPAN_SM90_BWD_DETERMINISTIC");
  return on;
}

void set_bwd_det_split(int on) { store_override(g_det_split_override, on); }

// The deterministic backward's cut of long walks: on by default since PERF_LOG v2.32, at m = 4 since v2.50
// (16 before: longformer's global key blocks and tree_bfs's root spans, ~15x the mean, ran whole; on an H100,
// S = 32768, longformer 17.6 -> 62.8 TFLOP/s, tree_bfs 136 -> 161, the masks not cut unchanged;
// FLASHSPAN_SM90_BWD_DET_SPLIT=0 turns it off, read once); with FLASHSPAN_EXPERIMENTAL=1 (read per call) at
// m = 2, which also cuts document_causal's and hstu's longer walks (faster on some, slower on others: PERF_LOG
// v2.13, v2.32).
bool bwd_det_split_enabled() {
  const int o = g_det_split_override.load(std::memory_order_relaxed);
  if (o >= 0) return o == 1;
  static const bool on = !env_flag_off("FLASHSPAN_SM90_BWD_DET_SPLIT");
  return on;
}

void set_bwd_det_split_above_mean(int m) { g_det_split_above_override.store(m >= 2 && m <= 4096 ? m : -1); }

int bwd_det_split_above_mean() {
  const int o = g_det_split_above_override.load(std::memory_order_relaxed);
  if (o >= 2) return o;
  static const int env = [] {
    const char* e = std::getenv("FLASHSPAN_SM90_BWD_DET_SPLIT_ABOVE");
    const int v = e != nullptr ? std::atoi(e) : 0;
    return v >= 2 && v <= 4096 ? v : 0;
  }();
  if (env >= 2) return env;
  return experimental_from_env() ? 2 : 4;
}

void set_bwd_cell_order(int on) { store_override(g_cell_order_override, on); }

int bwd_cell_order_forced() {
  const int o = g_cell_order_override.load(std::memory_order_relaxed);
  if (o >= 0) return o;
  static const int env = env_flag_forced("FLASHSPAN_SM90_BWD_CELLS");
  return env;
}

void set_bwd_split_first(int on) { g_split_first.set(on); }

// The cell order's split-first item list: experimental (PERF_LOG v2.10: longformer +15 %, tree_bfs -7 %
// at S=131072 D=128).
bool bwd_split_first_enabled() { return g_split_first.on(); }

void set_bwd_det_band(int band) { g_det_band_override.store(band >= 0 ? band : -1, std::memory_order_relaxed); }

// The deterministic backward's cell list in bands of key blocks, heads slowest within a band (BwdParams::det_band):
// experimental, not yet run on a GPU. Model (benchmarks/det_schedule_model.py, PERF_LOG v2.51): at S = 32768 H = 4
// the heads-fastest list's CTAs walk all four heads' query blocks at once, 5-9x the non-deterministic list's
// modelled L2 misses on the trees, longformer and hstu (whose det / non-det are the lowest measured), heads slowest
// the non-deterministic one's; but one head's dQ tiles then take more waits. Read per call.
int bwd_det_band_forced() {
  const int o = g_det_band_override.load(std::memory_order_relaxed);
  if (o >= 0) return o;
  const char* e = std::getenv("FLASHSPAN_SM90_BWD_DET_BAND");
  if (e == nullptr) return experimental_from_env() ? 0 : 1;
  if (std::strcmp(e, "all") == 0) return kDetBandAll;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);
  return end != e && *end == '\0' && v >= 1 && v <= kDetBandAll ? int(v) : 1;
}

void set_bwd_wide64_enabled(int on) { store_override(g_wide64_override, on); }

bool bwd_wide64_enabled() {
  const int o = g_wide64_override.load(std::memory_order_relaxed);
  if (o >= 0) return o == 1;
  // On by default (H200: the BwdWide* tests and memcheck, +27-40 % over the 64 x 128 tile, PERF_LOG
  // v2.2); FLASHSPAN_SM90_BWD_WIDE64=0 keeps the 64 x 128 tile (read once). The sm80 backward cannot
  // run the wide tile, so it is only chosen when the sm90 backward takes every backward call of the
  // plan (both its switches on).
  static const bool env = !env_flag_off("FLASHSPAN_SM90_BWD_WIDE64");
  return env && bwd_enabled() && bwd_deterministic_enabled();
}

void set_bwd_wide192_enabled(int on) { store_override(g_wide192_override, on); }

// The 64 x 96 backward tile of (192, 128) (three consumer warpgroups, kernel_bwd_sm90.cuh): on by
// default (H200: its GPU tests, memcheck, racecheck and synccheck passed; S=32768 H=16 causal
// 385 -> 416, document_causal 356 -> 383 TFLOP/s, SDPA 3-14 % faster: PERF_LOG v2.14);
// FLASHSPAN_SM90_BWD_WIDE192=0 (read once) keeps the 64 x 64 tile. Like the wide tile of (64, 64)
// only while the sm90 backward takes every backward call of the plan (the SDPA backward, which has no
// plan, asks per call).
bool bwd_wide192_enabled() {
  const int o = g_wide192_override.load(std::memory_order_relaxed);
  if (o >= 0) return o == 1 && bwd_enabled() && bwd_deterministic_enabled();
  static const bool env = !env_flag_off("FLASHSPAN_SM90_BWD_WIDE192");
  return env && bwd_enabled() && bwd_deterministic_enabled();
}

void set_bwd_dropout_philox_enabled(int on) { g_dropout_philox.set(on); }

// The Philox-only dropout backward kernel (launch_sm90.h): on unless FLASHSPAN_SM90_BWD_DROPOUT_PHILOX=0 (read per
// call). Its GPU tests passed on an H100 (PERF_LOG v2.72: SdpaGpu.Sm90DropoutBackwardKernelForms against the CPU
// reference, the dropout suite on it, memcheck of Sm90DropoutSanitizerSmall).
bool bwd_dropout_philox_enabled() { return g_dropout_philox.on(); }

// Philox with no other feature of the scores -> P step: params.h sdpa_score_step_features of the call without its
// dropout (the one list of those features, so that one added there is never run by this kernel, which ignores it).
bool sdpa_bwd_dropout_philox_kernel(const AnalyticMaskParams& a) {
  if (a.dropout.mode != 1) return false;
  AnalyticMaskParams rest = a;
  rest.dropout.mode = 0;
  return !sdpa_score_step_features(rest) && bwd_dropout_philox_enabled();
}

// FLASHSPAN_SM90_BWD_DET_UNORDERED=1 (measurement only, results not reproducible): deterministic
// calls run the deterministic schedule without the dQ tiles' counter waits, which splits the
// cost of the ordering from that of the schedule (PERF_LOG v2.2).
bool bwd_det_unordered() {
  static const bool on = env_flag_on("FLASHSPAN_SM90_BWD_DET_UNORDERED");
  return on;
}
// FLASHSPAN_SM90_BWD_DET_RELAXED=1 (read per call; measurement only, NOT bitwise reproducible): the dQ tile's turn
// handed on by a relaxed increment after the tile's additions have completed (BwdParams::det_relaxed) instead of the
// release increment. It was the default from PERF_LOG v2.50 to v2.63, until 1-3 runs in 16 of the flex trees / hstu
// on an H100 (v2.64) gave a dQ bitwise different from the others: the completion of a bulk reduce-add makes its writes
// visible to the writer's thread only, and without the release the next key block's addition can overtake it.
bool bwd_det_relaxed() { return env_flag_on("FLASHSPAN_SM90_BWD_DET_RELAXED"); }

// The key-split backward kernels' register split and GEMM order (PERF_LOG v2.79, v2.80; the rule in launch_sm90.h): 0
// or 4 (kernel_bwd_sm90.cuh kBwdOrder240), 4 by default; the experimental 12, 16, 20, 28, 32, 36, 44 with
// FLASHSPAN_EXPERIMENTAL=1.
// The valid values are the orders with a kernel (launch_sm90.h kBwdGemmOrders): 0, 4 and the experimental ones.
namespace {
int valid_gemm_order(int order) { return bwd_gemm_order_has_kernel(order) ? order : 4; }
}  // namespace

void set_bwd_gemm_order(int order) {
  g_gemm_order_override.store(order < 0 ? -1 : valid_gemm_order(order), std::memory_order_relaxed);
}

int bwd_gemm_order() {
  const int o = g_gemm_order_override.load(std::memory_order_relaxed);
  if (o >= 0) return o;
  const char* e = std::getenv("FLASHSPAN_SM90_BWD_ORDER");
  if (e == nullptr) return 4;
  if (std::strcmp(e, "0") == 0) return 0;
  for (int x : kBwdGemmOrders) {
    if (x != 4 && std::strcmp(e, std::to_string(x).c_str()) == 0) return experimental_from_env() ? x : 4;
  }
  return 4;
}

// FLASHSPAN_SM90_BWD_DET_DQ_CHUNKS (read per call): "1" adds each deterministic dQ tile whole; anything else (the
// default since PERF_LOG v2.64) in two halves, each by a writer warp of its own in its own chain of turns
// (BwdParams::dq_chunks), so that one half's release overlaps the other's (the release hand-off's cost, -3 .. -11 %
// with whole tiles, mostly recovered: H100, v2.64).
int bwd_det_dq_chunks() { return env_flag_on("FLASHSPAN_SM90_BWD_DET_DQ_CHUNKS") ? 1 : 2; }
// FLASHSPAN_SM90_BWD_DET_OWN_SLOTS=0 (read per call; on by default since PERF_LOG v2.55): each deterministic split
// item stores its own dK / dV slot, which the items kernel then does not zero (BwdParams::det_own_slots; the
// zeroing and the convert took ~50 us each of a 1.1 ms tree_bfs backward at S = 32768 on the H200, v2.50). "0"
// keeps the zeroed slots added into with fp32 atomics: own slots measured +5-13 % on the cut masks (sink_local,
// the trees, longformer) and the others unchanged on an H100 (v2.55).
bool bwd_det_own_slots() { return !env_flag_off("FLASHSPAN_SM90_BWD_DET_OWN_SLOTS"); }

// FLASHSPAN_SM90_BWD_DET_CLAIM=0 / 1 (read per call; unset: the plan decides, BwdParams::det_claim): the
// deterministic schedule's items in snake waves (0) or claimed in list order (1). The trace of PERF_LOG v2.48
// showed document_causal's dQ chains blocked for ~0.4 ms behind the first item of a chain, which the snake had
// placed late on a CTA whose earlier items were long; claimed in order, no item starts after a later one. Still
// deadlock-free: an item waits only on earlier items, each of which is running or done when it is claimed.
int bwd_det_claim() { return env_flag_forced("FLASHSPAN_SM90_BWD_DET_CLAIM"); }

// FLASHSPAN_SM90_FWD_L2_GROUP (read per call): the SDPA forward's items in groups of (sample, head) pairs
// (AnalyticMaskParams::l2_group). A positive integer: that many pairs a group; any other value ("0", a negative
// number, not a number): one group (the ungrouped order); unset or empty: for calls `grouped` by default (no left
// bound, no block mask) the pairs whose K and V fit 16 MiB (at least 1), else one group. Measured on an H100
// (PERF_LOG v2.60; B = 1 .. 16, S = 2048 .. 32768, D = 64 / 128): the best groups held 4 .. 16 MB of K / V, not L2's
// 50 MB (its two halves each keep their own copy of what their SMs read), no mask +6 .. +60 %, causal +2 .. +50 %;
// a causal window of 4096 at S = 32768 ran 5 .. 10 % slower in every group size, so windows stay ungrouped.
namespace {
int l2_group_of(const char* name, int64_t bytes_per_pair, bool grouped) {
  const char* e = std::getenv(name);
  if (e != nullptr && *e != '\0') {
    const long g = std::strtol(e, nullptr, 10);
    return g > 0 && g < (1L << 30) ? int(g) : 0;
  }
  if (!grouped) return 0;
  constexpr int64_t kBudget = int64_t(16) << 20;
  return bytes_per_pair <= 0 ? 0 : int(std::max<int64_t>(1, kBudget / bytes_per_pair));  // (<= 16 Mi)
}
}  // namespace

int fwd_l2_group(int64_t kv_bytes_per_pair, bool grouped) {
  return l2_group_of("FLASHSPAN_SM90_FWD_L2_GROUP", kv_bytes_per_pair, grouped);
}

// FLASHSPAN_SM90_BWD_L2_GROUP (read per call): the non-deterministic SDPA backward's heads-fastest cells (a band) in
// groups of (sample, item head) pairs, claimed (AnalyticBwdGrid::group / counter), as fwd_l2_group's variable; unset:
// for calls `grouped` by default (no left bound) the pairs whose Q, dO and dQ tiles (bytes_per_pair) fit 16 MiB, else
// one group. Measured on an H100 (PERF_LOG v2.61): ncu,
// B=4 H=16 S=8192 D=128 causal, DRAM reads 13.6 -> 0.81 GB, L2 hit rate 43 -> 95 %, 8.5 -> 5.6 ms; causal +65 % (B=4
// S=8192), +78 % (B=16 S=2048), +38 % (D=64 B=8 S=4096), within 1 % at B=1 (S=8192, 32768).
int bwd_l2_group(int64_t bytes_per_pair, bool grouped) {
  return l2_group_of("FLASHSPAN_SM90_BWD_L2_GROUP", bytes_per_pair, grouped);
}

// FLASHSPAN_SM90_BWD_DET_L2_GROUP (read per call): the deterministic SDPA backward's cells (key blocks descending,
// heads fastest, with or without a band) in claimed groups of (sample, item head) pairs, as bwd_l2_group's variable
// and rule (AnalyticBwdGrid::cell_descending), for lists of at least kDetGroupMinWaves waves of the grid (`cells`
// cells, `ctas` CTAs). Its gradients are bitwise those of the ungrouped order (each dQ tile's additions keep their
// order; SdpaGpu.Sm90BackwardDeterministicIsBitwiseReproducible runs both). Measured on an H100 (PERF_LOG v2.63,
// D = 128 unless said, claimed): lists of 31 waves (4096 cells: B=4 S=8192, B=16 S=2048, B=1 S=32768, D=64 B=8
// S=4096) +4 .. +30 %, of 23 waves (B=3 S=8192) +5 .. +9 %, of 15.5 waves (2048 cells: B=2 S=8192, B=1 S=16384, B=1
// H=32 S=8192) causal +2 .. +4 %, no mask within the spread; B=1 S=8192 (1024 cells, 7.8 waves) causal -3 .. -8 %: each
// group's key blocks descend to its longest cells, a sawtooth whose last tooth a short list does not hide (the
// threshold lies between 7.8 and 15.5).
int bwd_det_l2_group(int64_t bytes_per_pair, bool grouped, int64_t cells, int ctas) {
  constexpr int64_t kDetGroupMinWaves = 12;
  const bool long_list = cells >= kDetGroupMinWaves * std::max(1, ctas);
  return l2_group_of("FLASHSPAN_SM90_BWD_DET_L2_GROUP", bytes_per_pair, grouped && long_list);
}

// FLASHSPAN_SM90_FWD_CLAIM=0 / 1 (read per call; unset: the rule): grouped cells claimed in list order through the
// counter (1) or in static snake waves (0); claims need the counter, which the workspace holds only for calls whose
// cells' costs differ (a band, a block mask: dispatch sdpa_fwd_sm90_counter_bytes, kern::sdpa_fwd_cells_unequal), so
// "1" claims only there. The rule: claimed wherever the counter is (`counter`): the snake waves balance a list whose
// cost falls slowly, not the groups' sawtooth (PERF_LOG v2.60: causal S = 8192 in static groups of 4 ran at 0.7x the
// ungrouped order, claimed at 1.0-1.05x).
bool fwd_claim(bool counter) {
  const int forced = env_flag_forced("FLASHSPAN_SM90_FWD_CLAIM");
  return forced >= 0 ? forced == 1 : counter;
}

}  // namespace flashspan::sm90
#endif  // FLASHSPAN_WITH_CUDA
