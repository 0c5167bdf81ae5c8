// The tile table of the sm90 (Hopper: TMA + wgmma) kernel family: the tiles a plan of this
// family is laid out for and the head dims each sm90 kernel runs. Plain C++ (no CUDA): the
// kernel-family registry (src/dispatch/family.cpp), dispatch, the workspace layouts, the
// launchers and the kernels all read it, so planner, dispatch and kernels cannot disagree.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashspan::sm90 {

// dqk_tile x dv_tile: the head dims of the forward kernel that runs (>= the call's; smaller
// dims run on the next larger kernel with the tensor maps' zero fill past the true dims).
// Forward: 128 query rows (two consumer warpgroups of 64 rows) x fwd_bk keys. Backward:
// 64 query rows x bwd_bk keys.
struct TileSm90 {
  int dqk_tile, dv_tile;
  int fwd_bq, fwd_bk;
  int bwd_bq, bwd_bk;
};

// The tile of the 64 / 128 head dims, the ones the sm90 backward runs (kernel_bwd_sm90.cuh):
// forward 128 x 128; backward 64 x 128 (two consumer warpgroups of 64 keys each, dK/dV of a
// key block in registers), the seed system's sm90 backward tile for head dims <= 128 and the
// sm80 kernels' backward tile there (tile_sm80.h).
inline constexpr TileSm90 kTileSm90{128, 128, 128, 128, 64, 128};

// Head dims the sm90 forward runs: each dim a multiple of 8 up to 128 (on the 64 or 128
// kernel: the next one covering both dims), or exactly (192, 128) or (256, 256). Plans of
// other dims take the sm80 family (plan_choice.cpp).
constexpr bool fwd_runs_head_dims_sm90(int dqk, int dv) {
  return (dqk >= 8 && dv >= 8 && dqk <= 128 && dv <= 128 && dqk % 8 == 0 && dv % 8 == 0) ||
         (dqk == 192 && dv == 128) || (dqk == 256 && dv == 256);
}

// Why these tiles (227 KB of shared memory a block; Q, then 2 K stages and 2 V stages):
//   dims <= 64:  (64, 64) kernel, 128 x 128: 16 + 2 x 16 + 2 x 16 = 80 KB.
//   dims <= 128: (128, 128) kernel, 128 x 128: 32 + 2 x 32 + 2 x 32 = 160 KB.
//   (192, 128):  128 x 128: 48 + 2 x 48 + 2 x 32 = 208 KB.
//   (256, 256):  128 x 64 (128 keys would need 320 KB): 64 + 2 x 32 + 2 x 32 = 192 KB; the
//                seed system uses 128 x 64 for D = 256 too.
// The backward part is the tile the backward of such a plan runs on: the sm90 backward and the
// sm80 backward share 64 x 128 up to D = 128 and 64 x 64 for (192, 128) and (256, 256)
// (tile_sm80.h; family.cpp checks that the two tables agree). Other dims (CPU plans only) take
// kTileSm90. bwd_wide: the wide backward tiles, which only the sm90 backward runs (the plan's
// consumer has them when family.cpp's bwd_wide(dqk, dv) says so, and only while the sm90 backward
// takes every backward call of the plan):
//   (64, 64):   128 x 128 (kTileSm90Wide64; bwd_wide64_enabled: by default, unless
//               FLASHSPAN_SM90_BWD_WIDE64=0);
//   (192, 128): 64 x 96 (kTileSm90Wide192; bwd_wide192_enabled: by default, unless
//               FLASHSPAN_SM90_BWD_WIDE192=0): three consumer warpgroups with dK / dV transposed (below).
inline constexpr TileSm90 kTileSm90Wide64{64, 64, 128, 128, 128, 128};
inline constexpr TileSm90 kTileSm90Wide192{192, 128, 128, 128, 64, 96};

constexpr TileSm90 tile_sm90(int dqk, int dv, bool bwd_wide = false) {
  if (bwd_wide && dqk == 64 && dv == 64) return kTileSm90Wide64;
  if (bwd_wide && dqk == 192 && dv == 128) return kTileSm90Wide192;
  if (dqk <= 64 && dv <= 64) return TileSm90{64, 64, 128, 128, 64, 128};
  if (dqk <= 128 && dv <= 128) return kTileSm90;
  if (dqk == 192 && dv == 128) return TileSm90{192, 128, 128, 128, 64, 64};
  if (dqk == 256 && dv == 256) return TileSm90{256, 256, 128, 64, 64, 64};
  return kTileSm90;
}

// Head dims the sm90 SDPA forward (the analytic-mask instantiations of the forward kernel:
// sdpa_fwd_sm90_d{64,128,192,256}.cu) runs: those of the flex sm90 forward (each dim a multiple of
// 8 up to 128 on the (64, 64) or (128, 128) kernel, or exactly (192, 128) or (256, 256)), on the
// same tiles (tile_sm90).
constexpr bool sdpa_fwd_runs_head_dims_sm90(int dqk, int dv) { return fwd_runs_head_dims_sm90(dqk, dv); }

// The FP8 SDPA forward (kernel_fwd_sm90.cuh sdpa_fp8_fwd_kernel_sm90, units
// sdpa_fp8_fwd_sm90_d{64,128}.cu): each head dim a multiple of 16 (cuDNN's FP8 rule) up to 128,
// on the (64, 64) kernel when both are <= 64, else on the (128, 128) one (the tensor maps' zero
// fill past the call's dims, as the 16-bit kernels); the 16-bit tiles of those dims (128 x 128).
// (192, 128) and (256, 256) are not written yet.
constexpr bool sdpa_fp8_fwd_runs_head_dims_sm90(int dqk, int dv) {
  return dqk >= 16 && dv >= 16 && dqk <= 128 && dv <= 128 && dqk % 16 == 0 && dv % 16 == 0;
}
constexpr int sdpa_fp8_fwd_kernel_dim_sm90(int dqk, int dv) { return dqk <= 64 && dv <= 64 ? 64 : 128; }

// The FP8 forward's V^T workspace (params.h SdpaFp8Params::v_t): per (sample, V head) a
// [D_v, keys] byte matrix whose rows hold the sample's keys padded to whole key blocks of the
// forward tile (128: TMA boxes of 128 keys, zeros past the sample's length), keys permuted inside
// each 32-key group (fp8_vt_sm90.cuh). Pure functions of the sizes: the workspace rule of
// dispatch (sdpa_fwd_workspace_size) and the launcher agree through them.
constexpr int64_t fp8_vt_keys_sm90(int64_t s_kv) {
  return (s_kv + kTileSm90.fwd_bk - 1) / kTileSm90.fwd_bk * kTileSm90.fwd_bk;
}
constexpr int64_t fp8_vt_bytes_sm90(int64_t batch, int64_t heads_v, int64_t dv, int64_t s_kv) {
  return batch * heads_v * dv * fp8_vt_keys_sm90(s_kv);
}
// The per-sample tensor maps of packed (THD) SDPA tensors (sample_maps_sm90.h; experimental): the forward's
// maps of q, k, v (index = params.h kSdpaQ / kSdpaK / kSdpaV), 128 bytes each (a CUtensorMap), per sample, then
// one int32 flag per sample (a start not 16-byte aligned), rounded up to 128 bytes. Workspace bytes of
// `tensors` maps for `batch` samples: dispatch (sdpa_fwd_workspace_size) and the launcher agree through it.
inline constexpr int kSampleMapsFwd = 3;
// The backward's: q, k, v (as the forward's), then the main loop's dO (the caller's, or the gated dO * sigmoid(G)
// of the workspace).
inline constexpr int kSampleMapsBwd = 4, kSampleMapDO = 3;
inline constexpr size_t kTensorMapBytes = 128;
constexpr size_t sample_maps_bytes(int64_t batch, int tensors) {
  const size_t maps = size_t(batch) * size_t(tensors) * kTensorMapBytes;
  const size_t flags = (size_t(batch) * sizeof(int32_t) + kTensorMapBytes - 1) / kTensorMapBytes * kTensorMapBytes;
  return maps + flags;
}

// The key of V that V^T's column k holds inside its 32-key group (k in 0..31): the FP8 P V
// GEMM's A fragment holds each thread's own P values in register order (softmax.cuh pack_p, which
// derives it): A's column k = 16h + 4q + i is P's column 16h + 8 (i / 2) + 2q + i % 2, so the
// B operand's column k must be that key. In bits: k = [h q1 q0 a b] -> [h a q1 q0 b].
constexpr int fp8_vt_key(int k) { return (k & 16) | ((k & 2) << 2) | ((k >> 1) & 6) | (k & 1); }

// Head dims of the calls the sm90 backward (SDPA and flex) runs: the forward's -- each dim a multiple of
// 8 up to 128 (key-split consumers, 64 x 128 tile; on the (64, 64) kernel when both are <= 64, else on
// the (128, 128) one: bwd_kernel_dims_sm90 below; TMA fills the columns past the call's dims with
// zeros, the dK / dV stores and the dQ convert write only the call's columns), and exactly (192, 128)
// or (256, 256) (column-split consumers, 64 x 64). An sm90 plan's backward for other dims (CPU plans
// only) runs on the sm80 kernels, whose backward tile it has (kTileSm90 above).
constexpr bool bwd_runs_head_dims_sm90(int dqk, int dv) { return fwd_runs_head_dims_sm90(dqk, dv); }

// The kernel head dim Dqk the sm90 backward (SDPA and flex) runs a call's (dqk, dv) of
// bwd_runs_head_dims_sm90 on: 64 when both are <= 64, 128 when both are <= 128 (the dK / dV
// stores and the dQ convert write only the call's columns; TMA fills the others with zeros), else
// the call's own 192 / 256. Also the width of its dq_accum tiles (sdpa_params.cpp, workspace.h).
constexpr int bwd_kernel_dim_sm90(int dqk, int dv) {
  return dqk <= 64 && dv <= 64 ? 64 : dqk <= 128 && dv <= 128 ? 128 : dqk;
}

// Both kernel head dims (Dqk, Dv) of that kernel: (kD, kD) up to 128 (kD = bwd_kernel_dim_sm90),
// else the call's own (192, 128) / (256, 256): the instantiation (sdpa_bwd_sm90_d{64,128,192,256}.cu)
// that runs the call, whose layout the workspace of its dq_accum tiles follows (sdpa_params.cpp).
struct BwdDimsSm90 {
  int dqk, dv;
  friend constexpr bool operator==(const BwdDimsSm90&, const BwdDimsSm90&) = default;
};
constexpr BwdDimsSm90 bwd_kernel_dims_sm90(int dqk, int dv) {
  const int kd = bwd_kernel_dim_sm90(dqk, dv);
  return BwdDimsSm90{kd, kd <= 128 ? kd : dv};
}

// H_k != H_v on the sm90 SDPA backward (kernel_bwd_sm90.cuh AnalyticSourceBwdSm90): a work item's
// query heads are the group_item = min(group_k, group_v) consecutive heads that share one K head and
// one V head (group_k = H_q / H_k, group_v = H_q / H_v; H_k = H_v: the kv group), so the grid has
// H_q / group_item = max(H_k, H_v) item heads. That needs the larger group a multiple of the smaller
// (sdpa_bwd_heads_run_sm90; else the sm80 backward's two dK/dV passes run the call).
constexpr int sdpa_bwd_item_group_sm90(int group_k, int group_v) { return group_k < group_v ? group_k : group_v; }
// The grid's item heads, H_q / sdpa_bwd_item_group_sm90 (= max(H_k, H_v)): launcher, kernel and workspace.
constexpr int sdpa_bwd_item_heads_sm90(int num_heads_q, int group_k, int group_v) {
  return num_heads_q / sdpa_bwd_item_group_sm90(group_k, group_v);
}
constexpr bool sdpa_bwd_heads_run_sm90(int group_k, int group_v) {
  return group_k > 0 && group_v > 0 && (group_k % group_v == 0 || group_v % group_k == 0);
}
// Floats of the dK (kd columns) or dV (kdv) slots of H_k != H_v: one [bwd_bk, kd] slot per work
// item, B * ceil(S_kv / bwd_bk) * max(H_k, H_v) items, for the larger of the key blocks the kernel of
// head dims (dqk, dv) may run ((192, 128): 64 or the wide 96, launch_bwd_sm90.cu reading its switch
// per call), so that the workspace (sdpa_params.cpp) fits either.
constexpr int64_t sdpa_bwd_slot_floats_sm90(int64_t batch, int64_t s_kv, int64_t item_heads, int dqk, int dv,
                                            int cols) {
  int64_t rows = 0;
  for (int wide = 0; wide < 2; ++wide) {
    const int bk = tile_sm90(dqk, dv, wide == 1).bwd_bk;
    const int64_t r = (s_kv + bk - 1) / bk * bk;
    rows = r > rows ? r : rows;
  }
  return batch * item_heads * rows * cols;
}

// Packed GQA (FwdParams::pack = G, query heads per kv head) on the sm90 forward: G a power of
// two dividing the 128 query rows of the forward tile, so that a block's 128 packed rows are
// 128 / G whole query positions x G heads, one TMA box {64 columns, G heads, 128 / G positions}
// of Q's tensor map over (D, H, S[, B]) (tma_sm90.h): in BSHD / THD memory the G query heads
// of a position are adjacent, and the box lands in shared memory in packed-row order (128-byte
// rows, the unpacked tile's swizzle and wgmma descriptors). Other G keep the sm80 family.
// Whether a packed plan takes this family at all is plan_choice.cpp's rule (resolve_arch).
constexpr bool fwd_runs_pack_sm90(int group) {
  return group >= 1 && group <= kTileSm90.fwd_bq && (group & (group - 1)) == 0 && kTileSm90.fwd_bq % group == 0;
}

// The wide backward tiles, which only the sm90 backward runs (the sm80 backward's traits assume 64
// query rows and key blocks of 64 or 128), so a plan with one must run the sm90 backward: the
// consumer gets it only when that backward will take every call of the plan.
// kTileSm90Wide64, (64, 64): 128 query rows x 128 keys, as the seed system's and FlashAttention-3's
// sm90 backward for D <= 64. Why: on the 64 x 128 tile the per-step GEMMs of D = 64 are small (S^T,
// dP^T m64n64k64 per consumer warpgroup), so a step's fixed costs (barriers, the payload tests, the
// statistics loads, the dQ hand-off to the writer) weigh twice as much per FLOP as at D = 128; 128
// query rows halve the steps of a walk for the same GEMM work.
// kTileSm90Wide192, (192, 128): 64 query rows x 96 keys, FlashAttention-3's hdim-192 backward tile
// (three MMA warpgroups, dK / dV transposed). Why: on the 64 x 64 tile a step moves 40 KB of Q / dO
// out of L2 and 48 KB of fp32 dQ into it for 64 keys, and the kernel is L2-bound (ncu: 89 % L2
// throughput at 377 TFLOP/s, PERF_LOG v2.11); those bytes are per query block, so 96 keys a step
// cut the bytes per FLOP by a third.
constexpr bool bwd_wide_tile_sm90(int dqk, int dv, int bwd_bq, int bwd_bk) {
  return (dqk == 64 && dv == 64 && bwd_bq == kTileSm90Wide64.bwd_bq && bwd_bk == kTileSm90Wide64.bwd_bk) ||
         (dqk == 192 && dv == 128 && bwd_bq == kTileSm90Wide192.bwd_bq && bwd_bk == kTileSm90Wide192.bwd_bk);
}

// Head dims of the sm90 backward kernels (their instantiations, BwdSm90Layout): Dqk = Dv in {64, 128}
// on the 64 x 128 tile (and (64, 64) on the wide 128 x 128 tile), and (192, 128), (256, 256) on the
// 64 x 64 tile (the sm80 backward's there too, so either family's backward runs on such a plan;
// launch_sm90.h's bwd_config_supported decides per call).
constexpr bool bwd_kernel_head_dims_sm90(int dqk, int dv) {
  return (dqk == dv && (dqk == 64 || dqk == 128)) || (dqk == 192 && dv == 128) || (dqk == 256 && dv == 256);
}

// Whether the non-deterministic sm90 backward runs its work in cell order (every key block of
// every kv head, heads slowest, key blocks ascending, long walks split: kGridCellsAscending of
// params.h) instead of the plan's task list (longest first): when the query side of one head --
// Q and dO (elem_bytes each), the fp32 dq_accum tiles -- takes more than 3/5 of the L2 cache the
// device reports (H200: 60 MiB, so more than 36 MiB: (192, 128) or (256, 256) from S = 32768 on,
// D = 128 above S = 36864).
// Why: the CTAs running at once then walk neighbouring key blocks of one head, so the query
// blocks they visit (Q, dO, the dQ reduce-add) are shared in L2; the longest-first list mixes
// heads and documents, and once a head's query side outgrows L2 most of those tiles come from
// DRAM. Measured on the H200 (PERF_LOG v2.8, backward TFLOP/s, list -> cells): S=32768 H=16
// (192, 128) document_causal 177-179 -> 352-354 (ncu: DRAM 66 % busy, L2 hit rate 41 % before),
// causal 348-351 -> 383-385; (256, 256) document_causal 206-208 -> 285-286, causal 274-278 ->
// 293-297, tree_bfs 150 -> 178, hstu 226 -> 284; D=128 S=131072 H=4 document_causal 488-501 ->
// 507-511, tree_bfs 415 -> 447-474, tree_dfs 449-458 -> 480-483. It loses where walks are cut
// (sink columns, global tokens: longformer D=128 S=131072 101-113 -> 96-97, (256, 256) 87 -> 75,
// sink_local (256, 256) 177 -> 162), and below the bound (D=128 S=32768 H=4, a head's query side
// 32 MiB: document_causal 505 (list) vs 463 (cells)), where the list's longest-first order wins.
constexpr bool bwd_cell_order_sm90(int64_t total_q, int dqk, int dv, int elem_bytes, int64_t l2_bytes) {
  const int64_t query_side = total_q * (int64_t(dqk + dv) * elem_bytes + int64_t(dqk) * 4);
  return l2_bytes > 0 && 5 * query_side > 3 * l2_bytes;
}

}  // namespace flashspan::sm90
