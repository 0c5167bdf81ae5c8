// choose_plan (family.h): which kernel family, pack_gqa and consumer a plan request gets. Apart
// from family.cpp because it asks the sm90 launcher whether the device and the call suit it.
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "dispatch/family.h"
#ifdef FLASHSPAN_WITH_CUDA
#include "kernels/sm90/launch_sm90.h"  // sm90::device_supported, fwd_config_supported
#endif

namespace flashspan {

// Kernel family asked for by the environment: FLASHSPAN_KERNEL_FAMILY = "sm80" (the portable
// mma.sync kernels), "sm90" or "auto" (the Hopper forward where it runs), unset = the default
// below. Any other value is an error naming the variable.
// Default: "auto" (the whole GPU suite, C++ and Python, passed with it on an H200; the portable
// family stays one variable away: FLASHSPAN_KERNEL_FAMILY=sm80).
constexpr int kDefaultFamily = 90;

int kernel_family_from_env() {
  const char* v = std::getenv("FLASHSPAN_KERNEL_FAMILY");
  if (v == nullptr || *v == '\0') return kDefaultFamily;
  const std::string s(v);
  if (s == "sm80") return 80;
  if (s == "sm90" || s == "auto") return 90;
  FS_CHECK_ARG(false, "FLASHSPAN_KERNEL_FAMILY: must be sm80, sm90 or auto, got '", s, "'");
  return 80;
}

namespace {

// Whether a plan request's forward rows are packed when the family is chosen automatically:
// pack_gqa = 1, or -1 (choose) where choose_pack_gqa packs on the sm80 consumer's tile (the
// same answer for every family choice, so that the choice below cannot flip it).
bool packed_request(const FlexGeometry& g, int32_t pack_gqa) {
  return pack_gqa == 1 || (pack_gqa == -1 && choose_pack_gqa(g, consumer_for(80, g.head_dim_qk, g.head_dim_v)));
}

// The kernel family (consumer arch) of a plan built with arch = 0 ("choose"). CPU plans, and
// CUDA plans on devices or configurations the sm90 forward does not cover, take the portable
// sm80 family (so CPU and CUDA plans of such calls compare bitwise); a CUDA plan on an sm_90
// device with the sm90 code built takes the sm90 family when the environment allows it
// (family_from_env) and the sm90 forward covers the call (fwd_config_supported: fp16/bf16,
// head dims of fwd_runs_head_dims_sm90 in tile_sm90.h; packed rows only with
// G of fwd_runs_pack_sm90, unless FLASHSPAN_SM90_PACK_GQA=0).
// The packed-GQA rule (the one place it lives): a packed plan takes the sm90 forward unless the
// call is a decode shape (is_decode_shape: max_seqlen_q * G <= kDecodeBlockQ = 16). Why: the
// sm90 tile is 128 packed rows, so with <= 16 valid rows 7/8 or more of its S and P V GEMMs are
// padding, where the sm80 16-row decode tile computes about what it needs and is bound by the
// K/V reads (family.h, consumer_for_plan). Above 16 rows the sm80 family runs its 128-row tile
// too (the decode tile would read K/V again per 16 rows), with the same padding as the sm90
// tile, so the faster tile engine wins there. (Reasoned, not measured: PERF_LOG.)
int resolve_arch(int requested, const FlexGeometry& g, int32_t pack_gqa) {
  FS_CHECK_ARG(requested == 0 || requested == 80 || requested == 90, "arch: must be 0 (choose), 80 or 90, got ",
               requested);
  if (requested != 0) return requested;
  if (kernel_family_from_env() != 90 || g.device != DeviceType::kCUDA) return 80;
  const bool packed = packed_request(g, pack_gqa) && g.num_heads_kv > 0 && g.group_size() > 1;
  if (packed && is_decode_shape(g)) return 80;
#ifdef FLASHSPAN_WITH_CUDA
  if (sm90::device_supported(g.device_id) && sm90::fwd_config_supported(g, packed)) return 90;
#endif
  return 80;
}

}  // namespace

PlanChoice choose_plan(int requested_arch, int requested_pack_gqa, const FlexGeometry& g) {
  PlanChoice c;
  c.arch = resolve_arch(requested_arch, g, requested_pack_gqa);
  const Consumer base = consumer_for(c.arch, g.head_dim_qk, g.head_dim_v);
  // An automatically chosen family keeps the packing resolve_arch chose it for (decided on the
  // sm80 consumer's tile); a requested family packs by its own tile.
  c.pack_gqa = requested_arch == 0 ? packed_request(g, requested_pack_gqa)
               : requested_pack_gqa == -1 ? choose_pack_gqa(g, base)
                                          : requested_pack_gqa == 1;
  // Packed decode plans take the small forward tile (consumer_for_plan).
  c.consumer = consumer_for_plan(c.arch, g, c.pack_gqa);
  return c;
}

}  // namespace flashspan
