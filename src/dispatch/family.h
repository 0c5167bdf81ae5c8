// Kernel-family registry, keyed by architecture: which tile (Consumer) a family plans for,
// which head dims it runs, and the launch heuristics that pick between its tiles. Planner
// requests (src/api), dispatch (flex_dispatch.cu) and tests all ask here, and the families
// answer from their own tile tables (kernels/sm80/tile_sm80.h, kernels/sm90/tile_sm90.h), so
// the plan a caller builds and the kernel that runs it agree by construction.
//
// Families: 80 = portable mma.sync kernels (sm_80 and newer, forward and backward), 90 = Hopper
// TMA + wgmma (src/kernels/sm90: the forward; its plans' backward runs on the sm80 kernels).
// Plain C++, no CUDA: CPU builds plan for any family.
#pragma once

#include "core/env_switch.h"  // experimental_from_env, env_flag_off
#include "core/geometry.h"
#include "kernels/sm80/tile_sm80.h"  // kDecodeBlockQ
#include "plan/mask_plan.h"

namespace flashspan {

struct KernelFamily {
  int arch = 0;              // 80, 90
  const char* name = "";     // for messages: "sm80 (mma.sync)"
  bool has_kernels = false;  // whether this build can launch the family's kernels
  // The default consumer (tiles, payload layout) for these head dims.
  Consumer (*consumer)(int head_dim_qk, int head_dim_v) = nullptr;
  // The consumer of a plan: consumer(dims), refined by the geometry (e.g. the decode tile).
  Consumer (*consumer_for_plan)(const FlexGeometry& g, bool pack_gqa) = nullptr;
  // Throws Error(kNotSupported) naming the dims when the family's kernels do not run them.
  void (*check_head_dims)(int head_dim_qk, int head_dim_v) = nullptr;
};

// The family registered for `arch`; throws Error(kNotSupported, "arch: ...") for another arch.
const KernelFamily& kernel_family(int arch);

// The consumer a kernel family uses for these head dims (kernel_family(arch).consumer).
Consumer consumer_for(int arch, int head_dim_qk, int head_dim_v);

// The consumer of a plan: consumer_for(arch, dims), except that an arch-80 packed-GQA plan
// (pack_gqa and G = Hq / Hkv > 1) whose packed rows per sample fit one decode tile
// (max_seqlen_q * G <= kDecodeBlockQ) with head dims <= 128 gets the decode forward tile
// kDecodeBlockQ x 64 (backward tile unchanged). Why: a decode block fills only G * Sq of the
// default tile's 128 rows, so the mma work of the 128-row tile is mostly padding (about 0.2
// ms of an H200 for B=4, Sk=32K, 32 kv heads, Sq=1, G=4, against 0.11 ms to read K/V); the
// 16-row tile cuts it 8x and leaves the kernel bound by the K/V reads. Above 16 rows the
// 16-row tile would need two blocks per kv head, each reading K/V again, so the default tile
// is kept there. Throws as consumer_for does for an unknown arch.
Consumer consumer_for_plan(int arch, const FlexGeometry& g, bool pack_gqa);

// The decode shapes of packed GQA: G = Hq / Hkv > 1 and every sample's packed rows fit one
// decode tile (max_seqlen_q * G <= kDecodeBlockQ). consumer_for_plan gives such arch-80 packed
// plans the decode tile; choose_plan keeps them on the sm80 family (plan_choice.cpp).
bool is_decode_shape(const FlexGeometry& g);

// The default for pack_gqa = -1 ("choose"): true iff G = Hq / Hkv > 1 and
// max_seqlen_q < c.fwd_block_q. Why: an unpacked forward query block holds one query head's
// rows, so when every sample is shorter than the tile (decode, short prefill chunks) most of
// the Bq rows are padding and each of the G query heads re-reads the same K/V tiles. Packing
// the G heads' rows into one tile fills it up to G times better and reads K/V once per kv
// head. For longer queries the unpacked tiles are already full (the group's K/V re-reads
// mostly hit L2) and, with Hmask = Hq, packing mixes different mask heads' rows in one tile
// (fewer full blocks), so it is not chosen; callers can still force it (pack_gqa = 1).
bool choose_pack_gqa(const FlexGeometry& g, const Consumer& c);

// What a plan request gets (the C ABI's fs_create_mask_plan asks here): the kernel family
// (requested_arch 0 = choose, else 80 or 90: resolve_arch in family.cpp says how), pack_gqa
// (requested -1 = choose_pack_gqa on the sm80 consumer's tile for an automatically chosen
// family, else on the plan's family's; else 0/1) and the consumer (consumer_for_plan). Throws
// Error(kInvalidArgument) naming `arch` or FLASHSPAN_KERNEL_FAMILY for a value outside their
// rules.
struct PlanChoice {
  int arch = 80;
  Consumer consumer;
  bool pack_gqa = false;
};
PlanChoice choose_plan(int requested_arch, int requested_pack_gqa, const FlexGeometry& g);

// The kernel family the environment asks for: FLASHSPAN_KERNEL_FAMILY = "sm80" -> 80, "sm90" or
// "auto" -> 90, unset -> the default (90: the Hopper kernels where they run); read per call.
// Throws Error(kInvalidArgument) naming the variable for another value (plan_choice.cpp).
int kernel_family_from_env();

// experimental_from_env (FLASHSPAN_EXPERIMENTAL exactly "1") and env_flag_off (a variable exactly "0"), read per
// call: core/env_switch.h, the one home of the rules that kernels/ shares.

// Head dims the GPU kernels (the sm80 family) run: {8, 16, ..., 128}^2, (192, 128),
// (256, 256). Throws Error(kNotSupported) naming the dims otherwise.
void check_head_dims_gpu(int dqk, int dv);

}  // namespace flashspan
