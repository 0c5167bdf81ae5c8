// CPU checks of the sm90 FP8 forward's layout rules (kernels/sm90/tile_sm90.h), no GPU:
//   SdpaFp8Layout.VtKeyMatchesPackedFragment  V^T's key permutation (fp8_vt_key) against a model
//       of the register layouts: the fp32 accumulator of wgmma m64nN (thread (g, q) holds columns
//       8j + 2q, 8j + 2q + 1 of n8 block j, rows g and g + 8), the order softmax.cuh pack_p packs a
//       thread's own values into the 8-bit A registers (register 2h + r of k-step kk, byte i: block
//       4 kk + 2h + i / 2, accumulator register 2r + i % 2), and the k32 A fragment of the PTX ISA
//       (register 2h + r: row g + 8r, k = 16h + 4q + i for byte i). A's column k of the 32 must be
//       P's column fp8_vt_key(k), for every lane, on the same row.
//   SdpaFp8Layout.WorkspaceAndHeadDims        fp8_vt_keys_sm90 / fp8_vt_bytes_sm90 and the head-dim
//       rule (multiples of 16 up to 128; the kernel dims 64 / 128).
#include <gtest/gtest.h>

#include <set>

#include "kernels/sm90/tile_sm90.h"

namespace flashspan::test {
namespace {

using sm90::fp8_vt_key;

TEST(SdpaFp8Layout, VtKeyMatchesPackedFragment) {
  std::set<int> image;
  for (int k = 0; k < 32; ++k) image.insert(fp8_vt_key(k));
  EXPECT_EQ(image.size(), 32u);  // a permutation of one 32-key group
  EXPECT_EQ(*image.rbegin(), 31);
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, q = lane % 4;
    for (int kk = 0; kk < 4; ++kk) {      // k32 steps of a 128-key block
      for (int h = 0; h < 2; ++h) {       // A registers 2h + r
        for (int r = 0; r < 2; ++r) {
          for (int i = 0; i < 4; ++i) {   // byte i
            // What pack_p puts there: accumulator block 4 kk + 2h + i / 2, register 2r + i % 2.
            const int j = 4 * kk + 2 * h + i / 2, reg = 2 * r + i % 2;
            const int acc_row = g + 8 * (reg / 2), acc_col = 8 * j + 2 * q + reg % 2;
            // Where the PTX ISA's k32 A fragment puts that byte.
            const int a_row = g + 8 * r, a_k = 32 * kk + 16 * h + 4 * q + i;
            ASSERT_EQ(acc_row, a_row) << "lane " << lane;
            ASSERT_EQ(acc_col, 32 * kk + fp8_vt_key(a_k % 32))
                << "lane " << lane << " kk " << kk << " register " << 2 * h + r << " byte " << i;
          }
        }
      }
    }
  }
}

TEST(SdpaFp8Layout, WorkspaceAndHeadDims) {
  EXPECT_EQ(sm90::fp8_vt_keys_sm90(0), 0);
  EXPECT_EQ(sm90::fp8_vt_keys_sm90(1), 128);
  EXPECT_EQ(sm90::fp8_vt_keys_sm90(128), 128);
  EXPECT_EQ(sm90::fp8_vt_keys_sm90(129), 256);
  EXPECT_EQ(sm90::fp8_vt_bytes_sm90(2, 3, 80, 300), 2 * 3 * 80 * 384);
  for (int d = 0; d <= 160; d += 8) {
    const bool ok = d >= 16 && d <= 128 && d % 16 == 0;
    EXPECT_EQ(sm90::sdpa_fp8_fwd_runs_head_dims_sm90(d, d), ok) << d;
    EXPECT_EQ(sm90::sdpa_fp8_fwd_runs_head_dims_sm90(d, 64), ok) << d;
  }
  EXPECT_EQ(sm90::sdpa_fp8_fwd_kernel_dim_sm90(64, 64), 64);
  EXPECT_EQ(sm90::sdpa_fp8_fwd_kernel_dim_sm90(16, 48), 64);
  EXPECT_EQ(sm90::sdpa_fp8_fwd_kernel_dim_sm90(64, 80), 128);
  EXPECT_EQ(sm90::sdpa_fp8_fwd_kernel_dim_sm90(128, 128), 128);
}

}  // namespace
}  // namespace flashspan::test
