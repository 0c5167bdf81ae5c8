// The tile table of the sm90 (Hopper: TMA + wgmma) kernel family: the tiles a plan of this
// family is laid out for and the head dims each sm90 kernel runs. Plain C++ (no CUDA): the
// kernel-family registry (src/dispatch/family.cpp), dispatch, the workspace layouts, the
// launchers and the kernels all read it, so planner, dispatch and kernels cannot disagree.
#pragma once

namespace flashspan::sm90 {

// Forward: 128 query rows (two consumer warpgroups of 64 rows) x 128 keys. Backward: 64 query
// rows x 128 keys (two consumer warpgroups of 64 keys each, dK/dV of a key block in registers);
// the seed system's sm90 backward uses the same 64 x 128 tile for head dims <= 128.
struct TileSm90 {
  int fwd_bq, fwd_bk;
  int bwd_bq, bwd_bk;
};
inline constexpr TileSm90 kTileSm90{128, 128, 64, 128};

constexpr TileSm90 tile_sm90(int /*dqk*/, int /*dv*/) { return kTileSm90; }

// Head dims the sm90 forward runs (Dqk = Dv in {64, 128}); other dims of an sm90 plan are
// refused (the plan choice gives them the sm80 family).
constexpr bool fwd_runs_head_dims_sm90(int dqk, int dv) { return dqk == dv && (dqk == 64 || dqk == 128); }
// Head dims the sm90 backward runs (Dqk = Dv in {64, 128}); an sm90 plan's backward for other
// dims runs on the sm80 kernels, whose backward tile (64 x 128 up to D = 128) it shares.
constexpr bool bwd_runs_head_dims_sm90(int dqk, int dv) { return dqk == dv && (dqk == 64 || dqk == 128); }

}  // namespace flashspan::sm90
