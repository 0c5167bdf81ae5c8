// The kernel-family registry (family.h): the sm80 and sm90 families from their tile tables
// (kernels/sm80/tile_sm80.h, kernels/sm90/tile_sm90.h).
#include "dispatch/family.h"

#include "core/error.h"
#include "core/validation.h"
#include "kernels/sm90/tile_sm90.h"
#ifdef FLASHSPAN_WITH_CUDA
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
