// Launch of the FP8 forward's V^T pre-pass (fp8_vt_sm90.cuh): one CTA per 64 keys x 64 columns of
// every (sample, V head: H_v = H_q / group_v, H_k's or its own), over the keys padded to whole 128-key blocks (tile_sm90.h
// fp8_vt_keys_sm90); its packed-V form for a ragged V. Plain CUDA (no wgmma or TMA): built for every target like the
// other units.
#include "core/error.h"
#include "kernels/common/grid.h"
#include "kernels/common/launch_util.h"
#include "kernels/sm90/fp8_vt_sm90.cuh"
#include "kernels/sm90/fwd_sm90_run.h"

namespace flashspan::sm90 {

void launch_sdpa_fp8_vt_sm90(const SdpaFp8FwdParams& p, cudaStream_t s) {
  const int heads_v = p.num_heads_q / p.analytic.score.group_v;
  const int64_t keys = fp8_vt_keys_sm90(p.analytic.max_kv);
  const int key_tiles = int(keys / kern90::kVtKeys);
  const int col_tiles = (p.head_dv + kern90::kVtCols - 1) / kern90::kVtCols;
  const int64_t ctas = int64_t(p.batch) * heads_v * col_tiles * key_tiles;
  if (ctas == 0) return;
  const unsigned grid = grid_1d(ctas, "sdpa fp8 forward: V^T pre-pass");
  if (p.analytic.start[kSdpaV].ragged.ptr != nullptr) {  // a packed V (experimental): any sample start
    kern90::sdpa_fp8_vt_kernel_sm90<true><<<grid, kern90::kVtThreads, 0, s>>>(p, key_tiles, col_tiles, heads_v);
  } else {
    kern90::sdpa_fp8_vt_kernel_sm90<false><<<grid, kern90::kVtThreads, 0, s>>>(p, key_tiles, col_tiles, heads_v);
  }
  check_launch("sdpa fp8 forward: V^T pre-pass (sm90)");
}

}  // namespace flashspan::sm90
