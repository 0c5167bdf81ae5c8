// The kernels' parameters of an SDPA call (sdpa_launch.h: sdpa_fwd_params, sdpa_bwd_params,
// the workspace size): host code only, so CPU tests can check what the kernels will be given.
//
// Addressing. A [B, H, S, D] descriptor (any strides, last dim contiguous) gives the
// TensorAddr row and head strides; where sample b starts is the kernels' business
// (SampleStart: ragged offsets times the multiplier, or b * stride(0)), so TensorAddr's batch
// stride is 0 and `varlen` unused. The stats [B, H_q, S_q, 1] likewise.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/element_type.h"
#include "core/error.h"
#include "dispatch/family.h"
#include "dispatch/sdpa_launch.h"
#include "dispatch/workspace.h"
#include "kernels/common/analytic_mask.h"
#include "kernels/sm80/tile_sm80.h"
#include "kernels/sm90/tile_sm90.h"

namespace flashspan {

namespace {

using sdpa::Problem;

IndexArray index_array(const Problem& p, int slot) {
  IndexArray a;
  if (p.has(slot)) {
    a.ptr = p.t(slot).data;
    a.is64 = p.t(slot).dtype == DType::kInt64 ? 1 : 0;
  }
  return a;
}

// Row and head strides of a [B, H, S, D] (or [B, H_q, S_q, 1] stats) descriptor.
TensorAddr addr_of(const Problem& p, int slot) {
  TensorAddr a;
  if (!p.has(slot)) return a;
  a.batch_stride = 0;
  a.head_stride = p.t(slot).stride(1);
  a.row_stride = p.t(slot).stride(2);
  return a;
}

// A tensor's data pointer and strides into its params fields.
template <class Ptr>
void bind_tensor(const Problem& p, int slot, Ptr& data, TensorAddr& addr) {
  data = static_cast<Ptr>(p.t(slot).data);
  addr = addr_of(p, slot);
}

// SdpaBiasDType of a bias / dBias descriptor (float32, float16 or bfloat16: the C layer's rules).
int32_t bias_dtype(DType t) {
  return t == DType::kFloat32 ? kSdpaBiasF32 : t == DType::kBFloat16 ? kSdpaBiasBF16 : kSdpaBiasF16;
}

// SdpaDropoutMaskDType of a dropout mask / rng_dump descriptor (uint8, float16, bfloat16, float32:
// sdpa_support.cpp refuses float64 on CUDA tensors).
int32_t mask_dtype(DType t) {
  if (t == DType::kUInt8) return kSdpaMaskU8;
  return t == DType::kFloat16 ? kSdpaMaskF16 : t == DType::kBFloat16 ? kSdpaMaskBF16 : kSdpaMaskF32;
}

SampleStart start_of(const Problem& p, int slot) {
  SampleStart s;
  if (!p.has(slot)) return s;
  if (p.ragged(slot)) {
    s.ragged = index_array(p, sdpa::ragged_slot_of(slot));
    s.mult = p.ragged_multiplier(slot);
  } else {
    s.batch_stride = p.t(slot).stride(0);
  }
  return s;
}

// What forward and backward share: inputs, head geometry, scale, the analytic mask.
void fill_common(const Problem& p, QkvParams& q, AnalyticMaskParams& a) {
  bind_tensor(p, FS_SDPA_Q, q.q, q.qa);
  bind_tensor(p, FS_SDPA_K, q.k, q.ka);
  bind_tensor(p, FS_SDPA_V, q.v, q.va);
  q.varlen = 0;
  q.batch = static_cast<int>(p.B);
  q.num_heads_q = static_cast<int>(p.Hq);
  q.group_size = static_cast<int>(p.Hq / p.Hk);
  q.mask_per_head = 1;  // the kernels' mask head is the query head (the block_mask's head)
  q.head_dqk = static_cast<int>(p.Dqk);
  q.head_dv = static_cast<int>(p.Dv);
  // attn_scale as a float or a host tensor read here; default 1. A device tensor (FP8 calls only: refused
  // otherwise by sdpa_check_features_gpu) is read by the FP8 kernels from their factors (bind_attn_scale), and
  // the scale here is NaN, so that a kernel reading it by mistake shows it.
  if (p.has(FS_SDPA_ATTN_SCALE) && p.t(FS_SDPA_ATTN_SCALE).device != DeviceType::kCPU) {
    FS_CHECK(p.fp8, Status::kInternal, "sdpa: attn_scale in device memory reached a 16-bit call's parameters");
    q.scale = q.scale_log2 = std::numeric_limits<float>::quiet_NaN();
  } else {
    q.scale = sdpa::host_attn_scale(p);
    q.scale_log2 = q.scale * 1.4426950408889634f;
  }
  // Score modifiers and sinks (SdpaScoreParams).
  SdpaScoreParams& sc = a.score;
  // softcap * log2(e) past 2^100 (or overflowing): softcap tanh(x / softcap) is x to float precision for every
  // score |x| < 2^88 (tanh y = y (1 - y^2 / 3 + ...), y < 2^-12), and the kernels' 1 / c2 (rcp.approx.ftz) would
  // flush to 0 past 2^126: run as no softcap.
  const float softcap2 = p.a.softcap ? *p.a.softcap * 1.4426950408889634f : 0.0f;
  sc.softcap2 = softcap2 <= 0x1p100f ? softcap2 : 0.0f;
  sc.fused_softcap = sc.softcap2 != 0.0f && sdpa_sm90_fused_softcap_enabled() ? 1 : 0;
  sc.alibi_n = 0;
  if (p.a.alibi) {
    int64_t n = 1;
    while (n * 2 <= p.Hq) n *= 2;
    sc.alibi_n = static_cast<int32_t>(n);
  }
  sc.sink = p.has(FS_SDPA_SINK_TOKEN) ? p.t(FS_SDPA_SINK_TOKEN).ptr<float>() : nullptr;
  sc.dsink = nullptr;
  sc.group_v = static_cast<int32_t>(p.Hq / p.Hv);
  q.grid_mode = 1;
  a.band = p.band();
  a.seq_len_q = index_array(p, FS_SDPA_SEQ_LEN_Q);
  a.seq_len_kv = index_array(p, FS_SDPA_SEQ_LEN_KV);
  a.cu_seq_len_q = index_array(p, FS_SDPA_CU_SEQ_LEN_Q);
  a.cu_seq_len_kv = index_array(p, FS_SDPA_CU_SEQ_LEN_KV);
  a.max_q = static_cast<int32_t>(p.Sq);
  a.max_kv = static_cast<int32_t>(p.Skv);
  const struct {
    int tensor, slot;
  } map[] = {{kSdpaQ, FS_SDPA_Q},         {kSdpaK, FS_SDPA_K},   {kSdpaV, FS_SDPA_V},
             {kSdpaO, FS_SDPA_O},         {kSdpaStats, FS_SDPA_STATS}, {kSdpaDO, FS_SDPA_DO},
             {kSdpaDQ, FS_SDPA_DQ},       {kSdpaDK, FS_SDPA_DK}, {kSdpaDV, FS_SDPA_DV},
             {kSdpaGate, FS_SDPA_GATE},   {kSdpaDGate, FS_SDPA_DGATE},
             {kSdpaScoreMax, FS_SDPA_SCORE_MAX}, {kSdpaScoreSumExp, FS_SDPA_SCORE_SUM_EXP}};
  for (const auto& m : map) a.start[m.tensor] = start_of(p, m.slot);
  // The output gate (forward epilogue, backward preprocess).
  if (p.has(FS_SDPA_GATE)) bind_tensor(p, FS_SDPA_GATE, a.epi.gate, a.epi.ga);
  // Dropout: Philox (seed / offset read by the kernels) or the caller's mask (strides 0 along
  // broadcast dimensions), rng_dump (forward).
  SdpaDropoutParams& dr = a.dropout;
  if (p.dropout) {
    dr.mode = 1;
    dr.seed = index_array(p, FS_SDPA_DROPOUT_SEED);
    dr.offset = index_array(p, FS_SDPA_DROPOUT_OFFSET);
    dr.threshold = p.dropout_threshold;
    dr.scale = p.dropout_scale;
    dr.o_scaled = sdpa_dropout_o_scaled_enabled() ? 1 : 0;
  } else if (p.a.dropout_mask_form) {
    const TensorView& m = p.t(FS_SDPA_DROPOUT_MASK);
    dr.mode = 2;
    dr.mask = m.data;
    dr.mask_dtype = mask_dtype(m.dtype);
    for (int d = 0; d < 4; ++d) dr.mask_stride[d] = m.size(d) == 1 ? 0 : m.stride(d);
    dr.mask_scale = p.t(FS_SDPA_DROPOUT_SCALE).ptr<float>();
  }
  if (p.has(FS_SDPA_RNG_DUMP)) {
    const TensorView& d = p.t(FS_SDPA_RNG_DUMP);
    dr.rng_dump = d.data;
    dr.dump_dtype = mask_dtype(d.dtype);
    for (int k = 0; k < 4; ++k) dr.dump_stride[k] = d.stride(k);
  }
  // The additive bias: element strides, 0 along broadcast dimensions.
  if (p.has(FS_SDPA_BIAS)) {
    const TensorView& t = p.t(FS_SDPA_BIAS);
    a.bias.bias = t.data;
    a.bias.dtype = bias_dtype(t.dtype);
    a.bias.batch_stride = t.size(0) == 1 ? 0 : t.stride(0);
    a.bias.head_stride = t.size(1) == 1 ? 0 : t.stride(1);
    a.bias.row_stride = t.size(2) == 1 ? 0 : t.stride(2);
    a.bias.col_stride = t.size(3) == 1 ? 0 : t.stride(3);
    // 16-bit, rows of whole aligned 16-byte chunks: the sm90 forward and backward stage it (params.h).
    a.bias.chunks = a.bias.dtype != kSdpaBiasF32 && a.bias.col_stride == 1 && t.size(3) % 8 == 0 &&
                            a.bias.batch_stride % 8 == 0 && a.bias.head_stride % 8 == 0 &&
                            a.bias.row_stride % 8 == 0 && reinterpret_cast<uintptr_t>(t.data) % 16 == 0
                        ? 1
                        : 0;
  }
  // The block_mask: byte strides, 0 along broadcast dimensions.
  if (p.has(FS_SDPA_BLOCK_MASK)) {
    const TensorView& m = p.t(FS_SDPA_BLOCK_MASK);
    a.block_mask.bits = static_cast<const uint8_t*>(m.data);
    a.block_mask.batch_stride = m.size(0) == 1 ? 0 : m.stride(0);
    a.block_mask.head_stride = m.size(1) == 1 ? 0 : m.stride(1);
    a.block_mask.row_stride = m.stride(2);
  }
}

// Bytes of dO * sigmoid(G) in the backward workspace ([H_q, B * S_q, D_v], input dtype).
size_t gated_do_bytes(const Problem& p) {
  return p.has(FS_SDPA_GATE) ? ws_align(size_t(2) * size_t(p.Hq) * size_t(p.B * p.Sq) * size_t(p.Dv)) : 0;
}

// Row stride (floats) of dBias's dS workspace: S_kv rounded up to even (the dK/dV kernel stores
// float2 pairs at even columns).
int64_t dbias_ds_ld(const Problem& p) { return (p.Skv + 1) / 2 * 2; }

// Bytes of dBias's dS workspace ([B, H_q, S_q, dbias_ds_ld] fp32), or of its accumulator form (fp32 of dBias's
// shape), by sdpa_dbias_ds_form; 0 in the direct form and without dBias.
size_t dbias_ds_bytes(const Problem& p) {
  if (!p.has(FS_SDPA_DBIAS)) return 0;
  const int32_t form = sdpa_dbias_ds_form(p);
  if (form == kDbiasDsDirect) return 0;
  if (form == kDbiasDsAccumulate) {
    const TensorView& d = p.t(FS_SDPA_DBIAS);
    return ws_align(sizeof(float) * size_t(d.size(0)) * size_t(d.size(1)) * size_t(d.size(2)) * size_t(d.size(3)));
  }
  return ws_align(sizeof(float) * size_t(p.B) * size_t(p.Hq) * size_t(p.Sq) * size_t(dbias_ds_ld(p)));
}

// Bytes of the sm90 backward's dK / dV slots of an H_k != H_v call (0 otherwise): the dK slots
// (kernel head dim kd columns), then the dV slots (kdv), one [key block, columns] fp32 slot per
// work item each (tile_sm90.h sdpa_bwd_slot_floats_sm90; launch_bwd_sm90.cu zeroes the ones it uses).
struct Sm90SlotBytes {
  size_t dk = 0, dv = 0;
};
// The FP8 backward on the sm90 kernel (sdpa_fp8_bwd_runs_sm90) has them whatever the heads: every work
// item adds its dK / dV there (kernel_bwd_fp8_sm90.cuh).
Sm90SlotBytes sm90_slot_bytes(const Problem& p) {
  if (p.Hk == p.Hv && !p.fp8) return {};
  const sm90::BwdDimsSm90 kdims = sm90::bwd_kernel_dims_sm90(static_cast<int>(p.Dqk), static_cast<int>(p.Dv));
  const int64_t item_heads = sm90::sdpa_bwd_item_heads_sm90(static_cast<int>(p.Hq), static_cast<int>(p.Hq / p.Hk),
                                                            static_cast<int>(p.Hq / p.Hv));
  auto bytes = [&](int cols) {
    return ws_align(sizeof(float) * size_t(sm90::sdpa_bwd_slot_floats_sm90(p.B, p.Skv, item_heads,
                                                                           static_cast<int>(p.Dqk),
                                                                           static_cast<int>(p.Dv), cols)));
  };
  return {bytes(kdims.dqk), bytes(kdims.dv)};
}

// An FP8 scale factor of a slot: its pointer in device memory, or, for a host tensor (the seed's pass-by-value
// form), null and its value (kern::fp8_factor reads either).
void bind_fp8_factor(const Problem& p, int slot, const float*& ptr, float& host) {
  const TensorView& t = p.t(slot);
  if (t.device == DeviceType::kCPU) {
    ptr = nullptr;
    host = sdpa::host_scalar(p, slot);
  } else {
    ptr = t.ptr<const float>();
  }
}

// attn_scale as an FP8 factor (SdpaFp8Factor kFp8AttnScale, SdpaFp8BwdFactor kFp8BwdAttnScale): a tensor's
// (device pointer, or a host tensor's value), else the float (default 1).
void bind_attn_scale(const Problem& p, const float*& ptr, float& host) {
  if (p.has(FS_SDPA_ATTN_SCALE)) {
    bind_fp8_factor(p, FS_SDPA_ATTN_SCALE, ptr, host);
  } else {
    ptr = nullptr;
    host = p.a.attn_scale_value.value_or(1.0f);
  }
}

// One FP8 tensor [B, H, S, D] as the FP8 pre-passes and epilogues address it (element = byte strides).
SdpaFp8Tensor fp8_tensor(const Problem& p, int slot) {
  const TensorView& t = p.t(slot);
  SdpaFp8Tensor x;
  x.data = t.data;
  x.batch_stride = t.stride(0);
  x.head_stride = t.stride(1);
  x.row_stride = t.stride(2);
  return x;
}

// A bf16 copy [B, heads, rows, cols] contiguous at ws (the FP8 launchers' widened inputs) bound as a 16-bit
// tensor: data, its head and row strides, its samples' starts (b * heads rows cols); returns ws past it.
char* bf16_copy(char* ws, size_t bytes, const void*& data, TensorAddr& a, SampleStart& start, int64_t heads,
                int64_t rows, int64_t cols) {
  data = ws;
  a.batch_stride = 0;
  a.head_stride = rows * cols;
  a.row_stride = cols;
  start = SampleStart{};
  start.batch_stride = heads * rows * cols;
  return ws + bytes;
}

// The FP8 backward's part of its workspace (after the 16-bit backward's delta, lse2 and dQ accumulator):
// the derived factors (params.h Fp8BwdDerived), then bf16 copies of q, k, v, dO ([B, H, S, D] contiguous).
struct Fp8BwdBytes {
  size_t derived = 0, q = 0, k = 0, v = 0, dout = 0, total = 0;
};
// Bytes of one bf16 copy [B, heads, rows, cols] (the FP8 launchers' widened inputs), aligned.
size_t bf16_copy_bytes(int64_t batch, int64_t heads, int64_t rows, int64_t cols) {
  return ws_align(size_t(2) * size_t(batch) * size_t(heads) * size_t(rows) * size_t(cols));
}

Fp8BwdBytes fp8_bwd_bytes(const Problem& p) {
  Fp8BwdBytes b;
  b.derived = ws_align(sizeof(float) * kFp8BwdNumDerived);
  b.q = bf16_copy_bytes(p.B, p.Hq, p.Sq, p.Dqk);
  b.k = bf16_copy_bytes(p.B, p.Hk, p.Skv, p.Dqk);
  b.v = bf16_copy_bytes(p.B, p.Hv, p.Skv, p.Dv);
  b.dout = bf16_copy_bytes(p.B, p.Hq, p.Sq, p.Dv);
  b.total = b.derived + b.q + b.k + b.v + b.dout;
  return b;
}

// The FP8 forward on the sm80 kernels' workspace: the bf16 copies of q, k, v.
struct Fp8FwdSm80Bytes {
  size_t q = 0, k = 0, v = 0, total = 0;
};
Fp8FwdSm80Bytes fp8_fwd_sm80_bytes(const Problem& p) {
  Fp8FwdSm80Bytes b;
  b.q = bf16_copy_bytes(p.B, p.Hq, p.Sq, p.Dqk);
  b.k = bf16_copy_bytes(p.B, p.Hk, p.Skv, p.Dqk);
  b.v = bf16_copy_bytes(p.B, p.Hv, p.Skv, p.Dv);
  b.total = b.q + b.k + b.v;
  return b;
}

// delta and lse2 [H_q, B * S_q] fp32 (+ the dQ accumulator [H_q, B * S_q, D_qk] unless
// deterministic): the first part of the flex backward layout (workspace.h) for B * S_q rows,
// without the split schedule (the SDPA kernels run a grid).
BwdWorkspaceLayout sdpa_bwd_layout(const Problem& p) {
  FlexGeometry g;
  g.batch = static_cast<int>(p.B);
  g.num_heads_q = static_cast<int>(p.Hq);
  g.num_heads_kv = static_cast<int>(p.Hk);
  g.head_dim_qk = static_cast<int>(p.Dqk);
  g.head_dim_v = static_cast<int>(p.Dv);
  g.total_q = p.B * p.Sq;
  g.max_seqlen_q = p.Sq;
  g.total_k = p.B * p.Skv;
  g.max_seqlen_k = p.Skv;
  // The sm80 kernels' backward tile for these head dims (the family's tile table).
  PlanSignature sig;
  sig.consumer = consumer_for(80, g.head_dim_qk, g.head_dim_v);
  if (p.device == DeviceType::kCUDA && (p.fp8 ? sdpa_fp8_bwd_runs_sm90(p) : sdpa_bwd_sm90_layout_refusal(p) == nullptr)) {
    // The sm90 backward's tiles (64 x kD, kD the kernel head dim Dqk) in the same place, and its
    // counters when deterministic: the sm90 layout of the kernel head dims (kD, kDv).
    const sm90::BwdDimsSm90 kdims = sm90::bwd_kernel_dims_sm90(g.head_dim_qk, g.head_dim_v);
    const int kd = kdims.dqk, kdv = kdims.dv;
    FlexGeometry g90 = g;
    g90.head_dim_qk = kd;
    g90.head_dim_v = kdv;
    PlanSignature sig90;
    sig90.consumer = consumer_for(90, kd, kdv);
    // The SDPA kernel runs the 64-row tile (BwdSm90Layout<kd, kdv>), not the wide 128 x 128 one
    // that (64, 64) plans may get.
    const sm90::TileSm90 t90 = sm90::tile_sm90(kd, kdv, /*bwd_wide64=*/false);
    sig90.consumer.bwd_block_q = t90.bwd_bq;
    sig90.consumer.bwd_block_k = t90.bwd_bk;
    BwdWorkspaceLayout w = bwd_workspace_layout(g90, sig90, p.a.deterministic);
    if (!p.a.deterministic) {
      // max(the sm80 accumulator [H_q, B S_q, D_qk], the tiles); the split schedule after it is not used.
      const size_t tiles = sizeof(float) * size_t(p.Hq) * size_t(p.B) * size_t((p.Sq + 63) / 64) * 64 * size_t(kd);
      w.total = w.dq_accum + ws_align(std::max(w.lse2 * size_t(p.Dqk), tiles));
    } else {
      w.total = w.split_at;  // the tiles and their counters; the flex split schedule after them is not used
    }
    // The cells' item counter (AnalyticMaskParams::item_counter: their L2 groups claimed in list order,
    // launch_bwd_sm90.cu set_sdpa_bwd_l2_group), in a 256-byte line of its own, for the orders that group: the
    // heads-fastest cells of a band, and the deterministic order (descending key blocks, heads fastest) of every
    // call; not the FP8 backward's.
    if ((p.a.deterministic || !kern::sdpa_bwd_grid_heads_slowest(p.has_left, p.has_right)) && !p.fp8) {
      w.item_counter = w.total;
      w.total += ws_align(sizeof(int32_t));
    }
    // H_k != H_v: the dK / dV slots (sm90_slot_bytes), then as below: dBias's dS workspace, then the
    // gated dO (calls with them: sdpa_bwd_sm90_mods_enabled).
    const Sm90SlotBytes slots = sm90_slot_bytes(p);
    w.total += slots.dk + slots.dv;
    w.total += sdpa_bwd_sm90_maps_bytes(p);  // packed tensors' per-sample maps (sdpa_bwd_sm90_maps)
    w.total += dbias_ds_bytes(p);
    w.total += gated_do_bytes(p);
    // The FP8 backward (sm90 kernel): its derived factors and bf16 copies last (fp8_bwd_bytes).
    if (p.fp8) w.total += fp8_bwd_bytes(p).total;
    return w;
  }
  if (p.fp8) {
    // The FP8 backward (sm80 kernels): delta, lse2, the dQ accumulator [H_q, B S_q, D_qk] fp32 (used by the
    // atomic path only; kept for both), then its derived factors and the bf16 copies of q, k, v, dO
    // (fp8_bwd_bytes).
    BwdWorkspaceLayout w;
    const size_t per = ws_align(sizeof(float) * size_t(p.Hq) * size_t(p.B * p.Sq));
    w.delta = 0;
    w.lse2 = per;
    w.dq_accum = 2 * per;
    w.total = 2 * per + ws_align(per * size_t(p.Dqk)) + fp8_bwd_bytes(p).total;
    return w;
  }
  BwdWorkspaceLayout w = bwd_workspace_layout(g, sig, p.a.deterministic);
  // The layout's dQ accumulator ends ws_align(per * D_qk) after its start (per = the aligned
  // bytes of delta, at offset lse2); the split schedule after it is not used.
  if (!p.a.deterministic) w.total = w.dq_accum + ws_align(w.lse2 * size_t(p.Dqk));
  // dBias's dS workspace after it, then dO * sigmoid(G) of a gated call (at w.total - gated_do_bytes).
  w.total += dbias_ds_bytes(p);
  w.total += gated_do_bytes(p);
  return w;
}

// The decode forward's slots (tile_sm80.h decode_slot_capacity) and the bytes of its two arrays:
// o_accum [slots, kDecodeBlockQ, D_v], then ml [slots, 2, kDecodeBlockQ], fp32.
struct DecodeWorkspace {
  int64_t slots = 0;
  size_t o_accum = 0, ml = 0;
};
DecodeWorkspace decode_workspace(const Problem& p) {
  DecodeWorkspace w;
  w.slots = decode_slot_capacity(decode_shape(p.B, p.Hk, p.Sq, p.Hq / p.Hk, p.Skv));
  w.o_accum = ws_align(sizeof(float) * size_t(w.slots) * kDecodeBlockQ * size_t(p.Dv));
  w.ml = ws_align(sizeof(float) * size_t(w.slots) * 2 * kDecodeBlockQ);
  return w;
}

}  // namespace

namespace {
// The sm90 FP8 forward's V^T workspace (its start), before the per-sample maps of packed q / k.
size_t fp8_vt_ws_bytes(const Problem& p) { return ws_align(size_t(sm90::fp8_vt_bytes_sm90(p.B, p.Hv, p.Dv, p.Skv))); }
}  // namespace

size_t sdpa_fwd_workspace_size(const Problem& p) {
  if (p.device != DeviceType::kCUDA) return 0;
  if (p.empty_batch()) return 0;  // nothing runs (launch_sdpa_fwd returns before any kernel)
  if (p.fp8 && sdpa_fp8_fwd_runs_sm80(p)) return fp8_fwd_sm80_bytes(p).total;
  if (p.fp8) return fp8_vt_ws_bytes(p) + sdpa_fwd_sm90_maps_bytes(p);
  // Packed q / k / v's per-sample maps, then a paged forward's flags (a paged call with packed q has both:
  // sdpa_paged_fwd_params_sm90 binds the flags after the maps), then the item counter (sdpa_fwd_sm90_counter).
  const size_t sm90_bytes =
      sdpa_fwd_sm90_maps_bytes(p) + sdpa_fwd_sm90_paged_flags_bytes(p) + sdpa_fwd_sm90_counter_bytes(p);
  if (sdpa_fwd_runs_decode(p)) {
    // (at least the sm90 forward's: a call sized on the decode forward still runs with it off)
    const DecodeWorkspace w = decode_workspace(p);
    return std::max(w.o_accum + w.ml, sm90_bytes);
  }
  return sm90_bytes;
}

size_t sdpa_fwd_sm90_paged_flags_bytes(const Problem& p) {
  return sdpa_fwd_sm90_may_take_paged(p) ? ws_align(size_t(p.B) * sizeof(int32_t)) + 16 : 0;
}

SdpaPagedFwdSm90Params sdpa_paged_fwd_params_sm90(const Problem& p, void* workspace, size_t workspace_bytes) {
  const size_t flags = sdpa_fwd_sm90_paged_flags_bytes(p), maps = sdpa_fwd_sm90_maps_bytes(p);
  FS_CHECK(flags > 0, Status::kInternal, "sdpa paged forward (sm90): parameters asked for a call it does not take");
  FS_CHECK_ARG(workspace != nullptr && workspace_bytes >= maps + flags, "workspace: needs ", maps + flags,
               " bytes, got ", workspace_bytes);
  SdpaPagedFwdSm90Params f;
  static_cast<SdpaPagedFwdParams&>(f) = sdpa_paged_fwd_params(p);
  // The flags, 16-byte aligned, after packed q's maps (sdpa_fwd_sm90_maps: at the workspace's start).
  const uintptr_t a = (reinterpret_cast<uintptr_t>(workspace) + maps + 15) / 16 * 16;
  f.bad_samples = reinterpret_cast<int32_t*>(a);
  return f;
}

size_t sdpa_fwd_sm90_counter_bytes(const Problem& p) {
  const bool unequal = kern::sdpa_fwd_cells_unequal(p.has_left, p.has_right, p.has(FS_SDPA_BLOCK_MASK));
  return unequal && sdpa_fwd_sm90_may_take(p) ? 32 : 0;
}

int32_t* sdpa_fwd_sm90_counter(const Problem& p, void* workspace, size_t workspace_bytes) {
  const size_t bytes = sdpa_fwd_sm90_counter_bytes(p);
  const size_t at = sdpa_fwd_sm90_maps_bytes(p) + sdpa_fwd_sm90_paged_flags_bytes(p);
  if (bytes == 0 || workspace == nullptr || workspace_bytes < at + bytes) return nullptr;
  return reinterpret_cast<int32_t*>((reinterpret_cast<uintptr_t>(workspace) + at + 15) / 16 * 16);
}

namespace {
// The per-sample maps' part of a workspace: `bytes` reserved at `at` (tensors maps a sample and 128 bytes to
// align), its 128-byte aligned start and what is left of it from there.
size_t sm90_maps_bytes(const Problem& p, int tensors) {
  return sm90::sample_maps_bytes(p.B, tensors) + sm90::kTensorMapBytes;
}
WorkspaceSlice sm90_maps_slice(char* at, size_t bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(at);
  const uintptr_t aligned = (a + sm90::kTensorMapBytes - 1) / sm90::kTensorMapBytes * sm90::kTensorMapBytes;
  return {reinterpret_cast<void*>(aligned), bytes - size_t(aligned - a)};
}
}  // namespace

size_t sdpa_fwd_sm90_maps_bytes(const Problem& p) {
  return sdpa_fwd_sm90_may_take_packed(p) ? sm90_maps_bytes(p, sm90::kSampleMapsFwd) : 0;
}

WorkspaceSlice sdpa_fwd_sm90_maps(const Problem& p, void* workspace, size_t workspace_bytes) {
  const size_t need = sdpa_fwd_sm90_maps_bytes(p);
  if (need == 0) return {};
  const size_t at = p.fp8 ? fp8_vt_ws_bytes(p) : 0;  // (FP8: after the V^T workspace)
  FS_CHECK_ARG(workspace != nullptr && workspace_bytes >= at + need, "workspace: needs ", at + need, " bytes, got ",
               workspace_bytes);
  return sm90_maps_slice(static_cast<char*>(workspace) + at, need);
}

SdpaPagedFwdParams sdpa_decode_fwd_params(const Problem& p, void* workspace, size_t workspace_bytes,
                                          int64_t* slot_capacity) {
  FS_CHECK(sdpa_fwd_runs_decode(p), Status::kInternal, "sdpa decode forward: parameters asked for a call it does not take");
  const DecodeWorkspace w = decode_workspace(p);
  FS_CHECK_ARG(workspace_bytes >= w.o_accum + w.ml && (w.slots == 0 || workspace != nullptr), "workspace: needs ",
               w.o_accum + w.ml, " bytes, got ", workspace_bytes);
  FS_CHECK_ARG(reinterpret_cast<uintptr_t>(workspace) % 16 == 0, "workspace: must be 16-byte aligned");
  SdpaPagedFwdParams f;
  if (p.paged) {
    f = sdpa_paged_fwd_params(p);
  } else {
    static_cast<SdpaFwdParams&>(f) = sdpa_fwd_params(p);
  }
  f.pack = static_cast<int>(p.Hq / p.Hk);
  char* ws = static_cast<char*>(workspace);
  f.split.o_accum = reinterpret_cast<float*>(ws);
  f.split.ml = reinterpret_cast<float*>(ws + w.o_accum);
  *slot_capacity = w.slots;
  return f;
}


size_t sdpa_bwd_workspace_size(const Problem& p) {
  if (p.empty_batch()) return 0;  // nothing runs (launch_sdpa_bwd returns before any kernel)
  return sdpa_bwd_layout(p).total;
}

size_t sdpa_bwd_sm90_maps_bytes(const Problem& p) {
  return sdpa_bwd_sm90_may_take_packed(p) ? sm90_maps_bytes(p, sm90::kSampleMapsBwd) : 0;
}

WorkspaceSlice sdpa_bwd_sm90_maps(const Problem& p, void* workspace, size_t workspace_bytes) {
  const size_t need = sdpa_bwd_sm90_maps_bytes(p);
  if (need == 0) return {};
  const size_t total = sdpa_bwd_layout(p).total;  // (the 16-bit layout: no FP8 part)
  FS_CHECK_ARG(workspace != nullptr && workspace_bytes >= total, "workspace: needs ", total, " bytes, got ",
               workspace_bytes);
  return sm90_maps_slice(static_cast<char*>(workspace) + (total - gated_do_bytes(p) - dbias_ds_bytes(p) - need), need);
}

SdpaFwdParams sdpa_fwd_params(const Problem& p) {
  SdpaFwdParams f;
  fill_common(p, f, f.analytic);
  bind_tensor(p, FS_SDPA_O, f.o, f.oa);
  if (p.has(FS_SDPA_STATS)) bind_tensor(p, FS_SDPA_STATS, f.lse, f.lsea);
  if (p.has(FS_SDPA_MAX_LOGIT)) f.max_logit = p.t(FS_SDPA_MAX_LOGIT).ptr<float>();
  SdpaEpilogueParams& ep = f.analytic.epi;
  if (p.has(FS_SDPA_SCORE_MAX)) bind_tensor(p, FS_SDPA_SCORE_MAX, ep.score_max, ep.sma);
  if (p.has(FS_SDPA_SCORE_SUM_EXP)) bind_tensor(p, FS_SDPA_SCORE_SUM_EXP, ep.score_sum_exp, ep.ssa);
  f.analytic.lse_unit = p.a.stats_use_log2 ? 1.0f : 0.6931471805599453f;
  f.pack = 1;
  f.split_schedule = 0;
  return f;
}

SdpaFp8FwdParams sdpa_fp8_fwd_params(const Problem& p, void* workspace, size_t workspace_bytes) {
  SdpaFp8FwdParams f;
  static_cast<SdpaFwdParams&>(f) = sdpa_fwd_params(p);
  SdpaFp8Params& e = f.fp8;
  e.format = fp8_format_code(p.dtype);
  e.o_format = fp8_format_code(p.t(FS_SDPA_O).dtype);
  // SdpaFp8Factor order. A host scale factor (the seed's pass-by-value form) travels by value.
  const int slots[kFp8AttnScale] = {FS_SDPA_DESCALE_Q, FS_SDPA_DESCALE_K, FS_SDPA_DESCALE_V,
                                    FS_SDPA_DESCALE_S, FS_SDPA_SCALE_S,   FS_SDPA_SCALE_O};
  for (int i = 0; i < kFp8AttnScale; ++i) bind_fp8_factor(p, slots[i], e.factor[i], e.host_factor[i]);
  bind_attn_scale(p, e.factor[kFp8AttnScale], e.host_factor[kFp8AttnScale]);
  e.amax_s = p.t(FS_SDPA_AMAX_S).ptr<float>();
  e.amax_o = p.t(FS_SDPA_AMAX_O).ptr<float>();
  const size_t need = sdpa_fwd_workspace_size(p);
  FS_CHECK(workspace_bytes >= need && reinterpret_cast<uintptr_t>(workspace) % 16 == 0 &&
               (need == 0 || workspace != nullptr),
           Status::kInternal, "sdpa fp8 forward: workspace of ", workspace_bytes, " bytes (", need, " needed, 16-byte aligned)");
  e.v_t = workspace;
  return f;
}

SdpaFp8FwdSm80Params sdpa_fp8_fwd_sm80_params(const Problem& p, void* workspace, size_t workspace_bytes) {
  FS_CHECK(sdpa_fp8_fwd_runs_sm80(p), Status::kInternal,
           "sdpa fp8 forward (sm80): parameters asked for a call it does not take");
  SdpaFp8FwdSm80Params f;
  // The FP8 forward's parameters (the workspace checked against sdpa_fwd_workspace_size: this one's bytes),
  // then its q, k, v replaced by the bf16 copies.
  static_cast<SdpaFp8FwdParams&>(f) = sdpa_fp8_fwd_params(p, workspace, workspace_bytes);
  f.fp8.v_t = nullptr;
  f.q8 = fp8_tensor(p, FS_SDPA_Q);
  f.k8 = fp8_tensor(p, FS_SDPA_K);
  f.v8 = fp8_tensor(p, FS_SDPA_V);
  // The inputs' sample starts before the copies replace them (ragged: the packed THD form, experimental).
  f.start8[0] = f.analytic.start[kSdpaQ];
  f.start8[1] = f.analytic.start[kSdpaK];
  f.start8[2] = f.analytic.start[kSdpaV];
  const Fp8FwdSm80Bytes fb = fp8_fwd_sm80_bytes(p);
  char* ws = static_cast<char*>(workspace);
  // The copies, [B, H, S, D] contiguous: sample b at b * H S D (AnalyticMaskParams::start), head and row strides.
  auto copy = [&](const void*& data, TensorAddr& a, int tensor, int64_t heads, int64_t rows, int64_t cols,
                  size_t bytes) { ws = bf16_copy(ws, bytes, data, a, f.analytic.start[tensor], heads, rows, cols); };
  copy(f.q, f.qa, kSdpaQ, p.Hq, p.Sq, p.Dqk, fb.q);
  copy(f.k, f.ka, kSdpaK, p.Hk, p.Skv, p.Dqk, fb.k);
  copy(f.v, f.va, kSdpaV, p.Hv, p.Skv, p.Dv, fb.v);
  return f;
}

SdpaPagedFwdParams sdpa_paged_fwd_params(const Problem& p) {
  SdpaPagedFwdParams f;
  static_cast<SdpaFwdParams&>(f) = sdpa_fwd_params(p);
  const struct {
    int slot, table, tensor;
    SdpaPagedSide& side;
  } sides[] = {{FS_SDPA_K, FS_SDPA_PAGE_TABLE_K, kSdpaK, f.paged_k}, {FS_SDPA_V, FS_SDPA_PAGE_TABLE_V, kSdpaV, f.paged_v}};
  for (const auto& s : sides) {
    if (!p.has(s.table)) continue;  // a contiguous side: table null, its sample starts as without paging
    const TensorView& c = p.t(s.slot);  // the container [num_pages, H, page_size, D]
    const TensorView& t = p.t(s.table);
    s.side.table = static_cast<const int32_t*>(t.data);
    s.side.table_start = start_of(p, s.table);
    s.side.entry_stride = t.stride(2);
    s.side.page_stride = c.stride(0);
    int log2 = 0;
    while ((int64_t(1) << log2) < c.size(2)) ++log2;
    s.side.log2_page = log2;
    s.side.num_pages = static_cast<int32_t>(c.size(0));
    f.analytic.start[s.tensor] = SampleStart{};  // the head base is the container's
  }
  return f;
}

SdpaBwdParams sdpa_bwd_params(const Problem& p, void* workspace, size_t workspace_bytes) {
  const BwdWorkspaceLayout wl = sdpa_bwd_layout(p);
  FS_CHECK_ARG(workspace_bytes >= wl.total && (wl.total == 0 || workspace != nullptr), "workspace: needs ", wl.total,
               " bytes, got ", workspace_bytes);
  FS_CHECK_ARG(reinterpret_cast<uintptr_t>(workspace) % 16 == 0, "workspace: must be 16-byte aligned");
  SdpaBwdParams b;
  fill_common(p, b, b.analytic);
  bind_tensor(p, FS_SDPA_O, b.o, b.oa);
  bind_tensor(p, FS_SDPA_DO, b.dout, b.doa);
  bind_tensor(p, FS_SDPA_DQ, b.dq, b.dqa);
  bind_tensor(p, FS_SDPA_DK, b.dk, b.dka);
  bind_tensor(p, FS_SDPA_DV, b.dv, b.dva);
  bind_tensor(p, FS_SDPA_STATS, b.lse, b.lsea);
  char* ws = static_cast<char*>(workspace);
  b.delta = reinterpret_cast<float*>(ws + wl.delta);
  b.lse2 = reinterpret_cast<float*>(ws + wl.lse2);
  b.deterministic = p.a.deterministic ? 1 : 0;
  if (p.has(FS_SDPA_DSINK_TOKEN)) b.analytic.score.dsink = p.t(FS_SDPA_DSINK_TOKEN).ptr<float>();
  b.dq_accum = p.a.deterministic ? nullptr : reinterpret_cast<float*>(ws + wl.dq_accum);
  if (p.has(FS_SDPA_DGATE)) bind_tensor(p, FS_SDPA_DGATE, b.analytic.epi.dgate, b.analytic.epi.dga);
  if (p.has(FS_SDPA_GATE)) b.analytic.epi.do_gated = ws + (wl.total - gated_do_bytes(p));
  if (p.has(FS_SDPA_DBIAS)) {
    SdpaBiasParams& bp = b.analytic.bias;
    const TensorView& d = p.t(FS_SDPA_DBIAS);
    bp.ds_form = sdpa_dbias_ds_form(p);
    bp.ds = bp.ds_form == kDbiasDsDirect ? nullptr
                                         : reinterpret_cast<float*>(ws + (wl.total - gated_do_bytes(p) - dbias_ds_bytes(p)));
    bp.ds_ld = dbias_ds_ld(p);
    bp.dbias = d.data;
    bp.dbias_dtype = bias_dtype(d.dtype);
    for (int i = 0; i < 4; ++i) {
      bp.dbias_size[i] = d.size(i);
      bp.dbias_stride[i] = d.size(i) == 1 ? 0 : d.stride(i);
    }
  }
  // Workspace rows: sample b's row i is b * S_q + i (bwd_prepost.cuh: query_row with seqlen_q).
  b.total_q = p.B * p.Sq;
  b.seqlen_q = p.Sq;
  b.split_schedule = 0;
  return b;
}

SdpaFp8BwdParams sdpa_fp8_bwd_params(const Problem& p, void* workspace, size_t workspace_bytes) {
  FS_CHECK(p.fp8 && p.a.backward, Status::kInternal,
           "sdpa fp8 backward: parameters asked for a call it does not take");
  SdpaFp8BwdParams f;
  // The 16-bit backward's parameters (the FP8 tensors' strides in bytes = elements, checked on their data below),
  // then its q, k, v, dO replaced by the bf16 copies.
  // On the sm90 kernel (sdpa_fp8_bwd_runs_sm90): its dQ tiles, counters and dK / dV slots.
  static_cast<SdpaBwdParams&>(f) = sdpa_fp8_bwd_runs_sm90(p) ? sdpa_bwd_params_sm90(p, workspace, workspace_bytes)
                                                             : sdpa_bwd_params(p, workspace, workspace_bytes);
  f.format = fp8_format_code(p.dtype);
  f.o_format = fp8_format_code(p.t(FS_SDPA_O).dtype);
  f.do_format = fp8_format_code(p.t(FS_SDPA_DO).dtype);
  f.grad_format = fp8_format_code(p.t(FS_SDPA_DQ).dtype);
  const int slots[kFp8BwdAttnScale] = {FS_SDPA_DESCALE_Q,  FS_SDPA_DESCALE_K, FS_SDPA_DESCALE_V, FS_SDPA_DESCALE_O,
                                       FS_SDPA_DESCALE_DO, FS_SDPA_DESCALE_S, FS_SDPA_DESCALE_DP, FS_SDPA_SCALE_S,
                                       FS_SDPA_SCALE_DQ,   FS_SDPA_SCALE_DK,  FS_SDPA_SCALE_DV,  FS_SDPA_SCALE_DP};
  for (int i = 0; i < kFp8BwdAttnScale; ++i) bind_fp8_factor(p, slots[i], f.factor[i], f.host_factor[i]);
  bind_attn_scale(p, f.factor[kFp8BwdAttnScale], f.host_factor[kFp8BwdAttnScale]);
  const int amax[kFp8BwdNumAmax] = {FS_SDPA_AMAX_DQ, FS_SDPA_AMAX_DK, FS_SDPA_AMAX_DV, FS_SDPA_AMAX_DP};
  for (int i = 0; i < kFp8BwdNumAmax; ++i) f.amax[i] = p.t(amax[i]).ptr<float>();
  f.q8 = fp8_tensor(p, FS_SDPA_Q);
  f.k8 = fp8_tensor(p, FS_SDPA_K);
  f.v8 = fp8_tensor(p, FS_SDPA_V);
  f.o8 = fp8_tensor(p, FS_SDPA_O);
  f.do8 = fp8_tensor(p, FS_SDPA_DO);
  f.dq8 = fp8_tensor(p, FS_SDPA_DQ);
  f.dk8 = fp8_tensor(p, FS_SDPA_DK);
  f.dv8 = fp8_tensor(p, FS_SDPA_DV);
  // The FP8 part of the workspace (fp8_bwd_bytes) after the 16-bit backward's.
  const Fp8BwdBytes fb = fp8_bwd_bytes(p);
  char* ws = static_cast<char*>(workspace) + (sdpa_bwd_layout(p).total - fb.total);
  f.derived = reinterpret_cast<float*>(ws);
  ws += fb.derived;
  // The copies, [B, H, S, D] contiguous: sample b at b * H S D (AnalyticMaskParams::start), head and row strides.
  auto copy = [&](const void*& data, TensorAddr& a, int tensor, int64_t heads, int64_t rows, int64_t cols,
                  size_t bytes) { ws = bf16_copy(ws, bytes, data, a, f.analytic.start[tensor], heads, rows, cols); };
  copy(f.q, f.qa, kSdpaQ, p.Hq, p.Sq, p.Dqk, fb.q);
  copy(f.k, f.ka, kSdpaK, p.Hk, p.Skv, p.Dqk, fb.k);
  copy(f.v, f.va, kSdpaV, p.Hv, p.Skv, p.Dv, fb.v);
  const void* dout = nullptr;
  copy(dout, f.doa, kSdpaDO, p.Hq, p.Sq, p.Dv, fb.dout);
  f.dout = dout;
  // The 16-bit tensors' other pointers (o, dq, dk, dv) are the FP8 ones, which no 16-bit code reads.
  return f;
}

SdpaBwdParams sdpa_bwd_params_sm90(const Problem& p, void* workspace, size_t workspace_bytes) {
  SdpaBwdParams b = sdpa_bwd_params(p, workspace, workspace_bytes);
  const BwdWorkspaceLayout wl = sdpa_bwd_layout(p);
  FS_CHECK((p.fp8 ? sdpa_fp8_bwd_runs_sm90(p) : sdpa_bwd_sm90_refusal(p) == nullptr) && p.device == DeviceType::kCUDA,
           Status::kInternal,
           "sdpa backward (sm90): parameters asked for a call it does not cover");
  char* ws = static_cast<char*>(workspace);
  b.dq_accum = reinterpret_cast<float*>(ws + wl.dq_accum);
  b.dq_sem = p.a.deterministic ? reinterpret_cast<int32_t*>(ws + wl.dq_sem) : nullptr;
  b.analytic.item_counter = wl.item_counter > 0 ? reinterpret_cast<int32_t*>(ws + wl.item_counter) : nullptr;
  b.dq_blocked = 1;
  // H_k != H_v: the dK / dV slots before dBias's dS and the gated dO (sdpa_bwd_layout).
  const Sm90SlotBytes slots = sm90_slot_bytes(p);
  if (slots.dk > 0) {
    const size_t fp8 = p.fp8 ? fp8_bwd_bytes(p).total : 0;  // (the FP8 part last)
    char* at = ws + (wl.total - fp8 - gated_do_bytes(p) - dbias_ds_bytes(p) - sdpa_bwd_sm90_maps_bytes(p) - slots.dv -
                     slots.dk);
    b.split.dk_accum = reinterpret_cast<float*>(at);
    b.split.dv_accum = reinterpret_cast<float*>(at + slots.dk);
  }
  return b;
}

}  // namespace flashspan
