// Problem geometry of one flex-attention call, shared by validation, planner,
// reference and kernels. Sequence positions are sample-local; `q_start/k_start`
// give each sample's first row in the flattened (THD) or batch-major (BSHD) order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor_view.h"

namespace flashspan {

struct FlexGeometry {
  bool varlen = false;      // THD when true
  int batch = 0;            // B
  int64_t max_seqlen_q = 0; // Sq for BSHD
  int64_t max_seqlen_k = 0; // Sk for BSHD
  int64_t total_q = 0;      // B*Sq or Tq
  int64_t total_k = 0;      // B*Sk or Tk
  int num_heads_q = 0;      // Hq
  int num_heads_kv = 0;     // Hkv
  int num_heads_mask = 0;   // Hmask (1 or Hq)
  int nfunc = 0;            // endpoints per row (odd)
  int head_dim_qk = 0;      // Dqk
  int head_dim_v = 0;       // Dv
  DType dtype = DType::kUnknown;
  DeviceType device = DeviceType::kCPU;
  int device_id = 0;

  // Host copies of the cumulative lengths, [B+1]; for BSHD b*Sq and b*Sk.
  std::vector<int32_t> cu_seqlens_q;
  std::vector<int32_t> cu_seqlens_k;

  int group_size() const { return num_heads_q / num_heads_kv; }
  int64_t seqlen_q(int b) const { return cu_seqlens_q[b + 1] - cu_seqlens_q[b]; }
  int64_t seqlen_k(int b) const { return cu_seqlens_k[b + 1] - cu_seqlens_k[b]; }
  // Index of the mask head used by query head h.
  int mask_head(int h) const { return num_heads_mask == 1 ? 0 : h; }

  // Same call shape (everything but the cumulative-length values, which a plan owns).
  bool same_shape(const FlexGeometry& o) const { return first_difference(o).empty(); }
  // "" when the shapes agree, else the first field that differs, e.g. "max_seqlen_q 128 vs 256".
  std::string first_difference(const FlexGeometry& o) const;
};

// Default softmax scale 1/sqrt(Dqk).
float default_softmax_scale(int head_dim_qk);

}  // namespace flashspan
