// The kernel-family registry (family.h): the sm80 and sm90 families from their tile tables
// (kernels/sm80/tile_sm80.h, kernels/sm90/tile_sm90.h).
#include "dispatch/family.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/validation.h"
#include "kernels/sm90/tile_sm90.h"
#ifdef FLASHSPAN_WITH_CUDA
#include "kernels/common/launch_bwd_common.h"  // bwd_preprocess_paired
#include "kernels/sm90/launch_sm90.h"  // sm90::bwd_wide64_enabled
#endif

namespace flashspan {

namespace {

// The consumer of family `arch` with the tiles of its tile table (TileSm80 or TileSm90: fwd_bq,
// fwd_bk, bwd_bq, bwd_bk). Both families read the kM16N64Frag payload.
template <class Tile>
Consumer consumer_of_tile(int arch, const Tile& t) {
  Consumer c;
  c.arch = arch;
  c.layout = PayloadLayout::kM16N64Frag;
  c.fwd_block_q = t.fwd_bq;
  c.fwd_block_k = t.fwd_bk;
  c.bwd_block_q = t.bwd_bq;
  c.bwd_block_k = t.bwd_bk;
  return c;
}

// sm80: the tiles of kernels/sm80/tile_sm80.h. Why these tiles: 128x64 keeps the Q tile plus
// two K/V stages inside sm80 shared memory up to D = 192; (256, 256) needs the smaller 64-row
// Q tile. Backward: 64 query rows x 128 keys up to D = 128; for (192, 128) and (256, 256) the
// dK/dV kernel keeps both accumulators of its keys in registers, which only fits with 64 keys
// per block. Larger dims than the kernels run (CPU plans only) take the smallest tile.
Consumer consumer_sm80(int head_dim_qk, int head_dim_v) {
  return consumer_of_tile(80, sm80::tile_sm80(head_dim_qk, head_dim_v));
}

Consumer consumer_for_plan_sm80(const FlexGeometry& g, bool pack_gqa) {
  Consumer c = consumer_sm80(g.head_dim_qk, g.head_dim_v);
  if (pack_gqa && is_decode_shape(g) && g.head_dim_qk <= 128 && g.head_dim_v <= 128) {
    c.fwd_block_q = kDecodeBlockQ;
    c.fwd_block_k = 64;
  }
  return c;
}

void check_head_dims_sm80(int dqk, int dv) {
  check_head_dims_reference(dqk, dv);
  FS_CHECK_SUPPORTED(sm80::runs_head_dims_sm80(dqk, dv), "(head_dim_qk, head_dim_v) = (", dqk, ", ", dv,
                     ") is not supported on the GPU: each in {8, 16, ..., 128}, or (192, 128), or (256, 256)");
}

// sm90: the tiles of kernels/sm90/tile_sm90.h (forward: two consumer warpgroups of 64 rows
// each, 128 keys, 64 for (256, 256); backward: 64 x 128 up to D = 128 and 64 x 64 for (192, 128)
// and (256, 256), the tiles of both backward families).
// For (192, 128) and (256, 256) the forward runs 128 x 128 / 128 x 64 tiles of its own. Any
// sm90 plan's backward can run on the sm80 kernels (FLASHSPAN_SM90_BWD=0, or a configuration
// the sm90 backward does not take), so the backward part of the two tables must agree; except
// the wide backward tiles (tile_sm90.h: 128 x 128 of (64, 64), 64 x 96 of (192, 128)), which only
// the sm90 backward runs: (64, 64) plans get theirs when sm90::bwd_wide64_enabled() (by default),
// (192, 128) plans when sm90::bwd_wide192_enabled() (by default); the sm90 backward then takes
// every backward call of the plan, and dispatch refuses one it would not.
bool bwd_wide(int head_dim_qk, int head_dim_v) {
#ifdef FLASHSPAN_WITH_CUDA
  if (head_dim_qk == 64 && head_dim_v == 64) return sm90::bwd_wide64_enabled();
  if (head_dim_qk == 192 && head_dim_v == 128) return sm90::bwd_wide192_enabled();
#else
  (void)head_dim_qk;
  (void)head_dim_v;
#endif
  return false;
}

Consumer consumer_sm90(int head_dim_qk, int head_dim_v) {
  const sm90::TileSm90 t = sm90::tile_sm90(head_dim_qk, head_dim_v, bwd_wide(head_dim_qk, head_dim_v));
  const bool sm90_only = sm90::bwd_wide_tile_sm90(head_dim_qk, head_dim_v, t.bwd_bq, t.bwd_bk);
  if (!sm90_only && sm80::runs_head_dims_sm80(head_dim_qk, head_dim_v)) {  // the sm80 backward may run it (sm90 backward off)
    const sm80::TileSm80 b = sm80::tile_sm80(head_dim_qk, head_dim_v);
    FS_CHECK(t.bwd_bq == b.bwd_bq && t.bwd_bk == b.bwd_bk, Status::kInternal, "tile_sm90: backward tile ", t.bwd_bq,
             "x", t.bwd_bk, " of head dims (", head_dim_qk, ", ", head_dim_v, ") is not the sm80 backward's ",
             b.bwd_bq, "x", b.bwd_bk);
  }
  return consumer_of_tile(90, t);
}

Consumer consumer_for_plan_sm90(const FlexGeometry& g, bool) { return consumer_sm90(g.head_dim_qk, g.head_dim_v); }

const KernelFamily kFamilies[] = {
    {80, "sm80 (mma.sync)", true, consumer_sm80, consumer_for_plan_sm80, check_head_dims_sm80},
    {90, "sm90 (TMA + wgmma)", true, consumer_sm90, consumer_for_plan_sm90, check_head_dims_sm80},
};

}  // namespace

const KernelFamily& kernel_family(int arch) {
  for (const KernelFamily& f : kFamilies) {
    if (f.arch == arch) return f;
  }
  FS_CHECK_SUPPORTED(false, "arch: no kernel family for architecture ", arch, " (80 or 90 expected)");
  return kFamilies[0];  // not reached
}

Consumer consumer_for(int arch, int head_dim_qk, int head_dim_v) {
  return kernel_family(arch).consumer(head_dim_qk, head_dim_v);
}

Consumer consumer_for_plan(int arch, const FlexGeometry& g, bool pack_gqa) {
  return kernel_family(arch).consumer_for_plan(g, pack_gqa);
}

bool is_decode_shape(const FlexGeometry& g) {
  const int G = g.num_heads_kv > 0 ? g.group_size() : 1;
  return G > 1 && g.max_seqlen_q <= kDecodeBlockQ / G;  // max_seqlen_q * G <= kDecodeBlockQ, without overflow
}

bool choose_pack_gqa(const FlexGeometry& g, const Consumer& c) {
  return g.num_heads_kv > 0 && g.group_size() > 1 && g.max_seqlen_q < c.fwd_block_q;
}

void check_head_dims_gpu(int dqk, int dv) { kernel_family(80).check_head_dims(dqk, dv); }

}  // namespace flashspan

#ifdef FLASHSPAN_WITH_CUDA
// The sm90 backward's switches (declared in kernels/sm90/launch_sm90.h): which backward runs an
// sm90 plan (launch_flex_bwd), whether (64, 64) plans get the wide tile (consumer_sm90 above) and
// whether the deterministic backward cuts long walks (launch_bwd_sm90.cu).
// Plain host code, so that every unit linking the registry (tests/emu too) has them.
namespace flashspan::sm90 {

namespace {
std::atomic<int> g_bwd_override{-1};
std::atomic<int> g_wide64_override{-1};
std::atomic<int> g_wide192_override{-1};
std::atomic<int> g_det_split_override{-1};
std::atomic<int> g_det_split_above_override{-1};
std::atomic<int> g_cell_order_override{-1};
std::atomic<int> g_split_first_override{-1};
std::atomic<int> g_det_band_override{-1};

// The in-process overrides of the switches below: set_*(1) on, (0) off, (-1) back to the
// environment's answer.
void store_override(std::atomic<int>& o, int on) { o.store(on < 0 ? -1 : (on ? 1 : 0), std::memory_order_relaxed); }
// An experimental switch: its override when set, else FLASHSPAN_EXPERIMENTAL=1 (read per call).
bool experimental_switch(const std::atomic<int>& o) {
  const int v = o.load(std::memory_order_relaxed);
  return v >= 0 ? v == 1 : experimental_from_env();
}
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
  static const int env = [] {
    const char* e = std::getenv("FLASHSPAN_SM90_BWD_CELLS");
    if (e == nullptr) return -1;
    return std::strcmp(e, "1") == 0 ? 1 : std::strcmp(e, "0") == 0 ? 0 : -1;
  }();
  return env;
}

void set_bwd_split_first(int on) { store_override(g_split_first_override, on); }

// The cell order's split-first item list: experimental (PERF_LOG v2.10: longformer +15 %, tree_bfs -7 %
// at S=131072 D=128).
bool bwd_split_first_enabled() { return experimental_switch(g_split_first_override); }

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

}  // namespace flashspan::sm90

// The backward preprocess's paired form (declared in kernels/common/launch_bwd_common.h): experimental.
namespace flashspan {
namespace {
std::atomic<int> g_pre_paired_override{-1};
}  // namespace
void set_bwd_preprocess_paired(int on) {
  g_pre_paired_override.store(on < 0 ? -1 : (on ? 1 : 0), std::memory_order_relaxed);
}
bool bwd_preprocess_paired() {
  const int v = g_pre_paired_override.load(std::memory_order_relaxed);
  return v >= 0 ? v == 1 : experimental_from_env();
}
}  // namespace flashspan
#endif  // FLASHSPAN_WITH_CUDA
