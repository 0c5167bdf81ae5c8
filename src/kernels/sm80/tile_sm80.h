// The tile table of the sm80 (mma.sync) kernel family: which tile runs which head dims, the
// decode tile, and the shared memory each kernel needs. Plain C++ (no CUDA): the kernel-family
// registry (src/dispatch/family.cpp), the workspace layouts and the launchers all read it,
// so planner, dispatch and kernels cannot disagree on a tile.
#pragma once

namespace flashspan {

// Rows of the sm80 decode forward tile (kDecodeBlockQ x 64, one warp; consumer_for_plan).
inline constexpr int kDecodeBlockQ = 16;

// The SDPA decode forward's split of the key walk (params.h SdpaDecodeGrid; kernel_decode_sm80.cuh):
// `tasks` (packed block, kv head, sample) walks of up to `key_blocks` blocks of 64 keys cut into
// items so that about `ctas` CTAs are busy: splits = ctas / tasks (floor: one wave at most), at
// least kDecodeMinChunk blocks an item, no empty item past the walk. Monotone in ctas, so the
// workspace sized with kDecodeMaxCtas covers every launch (a device's resident CTAs, capped there).
inline constexpr int kDecodeMinChunk = 4;
inline constexpr int kDecodeMaxCtas = 1024;
struct DecodeSplit {
  int splits, chunk;
};
constexpr DecodeSplit decode_split(long long tasks, long long key_blocks, long long ctas) {
  if (tasks <= 0 || key_blocks <= 0) return {1, 1};
  long long splits = ctas / tasks;
  const long long most = key_blocks / kDecodeMinChunk;
  if (splits > most) splits = most;
  if (splits < 1) splits = 1;
  const long long chunk = (key_blocks + splits - 1) / splits;
  return {int((key_blocks + chunk - 1) / chunk), int(chunk)};
}

// The tasks of a decode call: B H_k kv heads' blocks of ceil(S_q G / kDecodeBlockQ) packed rows,
// walks of ceil(S_kv / 64) key blocks at most.
struct DecodeShape {
  int num_q_blocks;
  long long tasks, key_blocks;
};
constexpr DecodeShape decode_shape(long long batch, long long heads_kv, long long max_q, long long group,
                                   long long max_kv) {
  const long long nqb = (max_q * group + kDecodeBlockQ - 1) / kDecodeBlockQ;
  return {int(nqb), batch * heads_kv * nqb, (max_kv + 63) / 64};
}
// Workspace slots of a call (its items with kDecodeMaxCtas, the most a launch runs) and the fp32
// floats of one slot: kDecodeBlockQ rows of D_v accumulator columns (FwdSplit::o_accum) and their m
// and l (FwdSplit::ml, after every slot's accumulator).
constexpr long long decode_slot_capacity(const DecodeShape& s) {
  return s.tasks * decode_split(s.tasks, s.key_blocks, kDecodeMaxCtas).splits;
}
constexpr long long decode_slot_floats(long long dv) { return kDecodeBlockQ * (dv + 2); }

}  // namespace flashspan

namespace flashspan::sm80 {

// Tiles of the sm80 kernels, by head dims (the head-dim tile is the next of 64, 128,
// (192, 128), 256 that covers both dims).
struct TileSm80 {
  int dqk_tile, dv_tile;
  int fwd_bq, fwd_bk;
  int bwd_bq, bwd_bk;
};

// Head dims the sm80 kernels run: each dim a multiple of 8 up to 128 on the 64/128 tiles
// (smaller dims than the tile's run predicated), or exactly (192, 128) or (256, 256).
constexpr bool runs_head_dims_sm80(int dqk, int dv) {
  return (dqk <= 128 && dv <= 128) || (dqk == 192 && dv == 128) || (dqk == 256 && dv == 256);
}

inline TileSm80 tile_sm80(int dqk, int dv) {
  if (dqk <= 64 && dv <= 64) return {64, 64, 128, 64, 64, 128};
  if (dqk <= 128 && dv <= 128) return {128, 128, 128, 64, 64, 128};
  if (dqk == 192 && dv == 128) return {192, 128, 128, 64, 64, 64};
  return {256, 256, 64, 64, 64, 64};
}

// The tile the sm80 kernels run for a plan's consumer: tile_sm80(dqk, dv), whose forward
// tile is the default one, or, when the plan's forward tile is the decode tile
// (kDecodeBlockQ x 64, consumer_for_plan) and both head dims are <= 128, the same tile with
// the forward part replaced by the decode kernel's (always on the 128 head-dim tile; smaller
// dims run predicated). Returns false (and leaves *out alone) when no sm80 forward kernel
// has the plan's forward tile. The backward part is always tile_sm80's.
inline bool fwd_tile_for_plan_sm80(int dqk, int dv, int plan_bq, int plan_bk, TileSm80* out) {
  TileSm80 t = tile_sm80(dqk, dv);
  if (plan_bq == t.fwd_bq && plan_bk == t.fwd_bk) {
    *out = t;
    return true;
  }
  if (plan_bq == kDecodeBlockQ && plan_bk == 64 && dqk <= 128 && dv <= 128) {
    t.dqk_tile = 128;
    t.dv_tile = 128;
    t.fwd_bq = kDecodeBlockQ;
    t.fwd_bk = 64;
    *out = t;
    return true;
  }
  return false;
}

// Dynamic shared memory of the kernels for a tile (bytes; 16-bit elements). The launchers
// static_assert that these match the kernels' own layouts.
constexpr int fwd_smem_bytes(int bq, int bk, int dqk, int dv) { return (bq * dqk + bk * dqk + bk * dv) * 2; }
// dK/dV kernel: K, V, double-buffered Q and dO, P and dS, then the 16-byte work item slot.
constexpr int bwd_dkdv_smem_bytes(int bq, int bk, int dqk, int dv) {
  return (bk * dqk + bk * dv + 2 * (bq * dqk + bq * dv) + 2 * bq * bk) * 2 + 16;
}
// Deterministic dQ kernel: Q, dO, double-buffered K and V.
constexpr int bwd_dq_smem_bytes(int bq, int bk, int dqk, int dv) {
  return (bq * dqk + bq * dv + 2 * (bk * dqk + bk * dv)) * 2;
}
inline int fwd_smem_bytes(const TileSm80& t) { return fwd_smem_bytes(t.fwd_bq, t.fwd_bk, t.dqk_tile, t.dv_tile); }
inline int bwd_smem_bytes(const TileSm80& t, bool deterministic) {
  const int dkdv = bwd_dkdv_smem_bytes(t.bwd_bq, t.bwd_bk, t.dqk_tile, t.dv_tile);
  const int dq = bwd_dq_smem_bytes(t.bwd_bq, t.bwd_bk, t.dqk_tile, t.dv_tile);
  return deterministic && dq > dkdv ? dq : dkdv;
}

}  // namespace flashspan::sm80
