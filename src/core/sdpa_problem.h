// SDPA call description: the options an attribute object collects (Attributes), the
// validation of every rule of docs/SDPA.md, and the validated, resolved Problem that the
// CPU reference (and later the GPU dispatch) consume.
//
// Validation happens in two steps:
//  * validate_forward / validate_backward read descriptors only (shapes, strides, dtypes,
//    devices, options): safe for CUDA tensors, run once when an operation is created;
//  * read_runtime_host reads the small integer tensors (sequence lengths, ragged offsets,
//    page tables, dropout seed/offset, scale tensors) from host memory and checks their
//    values: the CPU reference's first step.
// Every error names the argument (the seed's Python names: q, bias, seq_len_q,
// diagonal_band_left_bound, ...) and the rule it breaks.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/sdpa_band.h"
#include "core/tensor_view.h"
#include "flashspan/flashspan.h"

namespace flashspan::sdpa {

constexpr int kNumSlots = FS_SDPA_NUM_SLOTS;

enum class Alignment : int { kTopLeft = FS_SDPA_TOP_LEFT, kBottomRight = FS_SDPA_BOTTOM_RIGHT };

// Name of a slot in messages ("q", "bias", "seq_len_q", "ragged offset of q", "descale_dO", ...).
const char* slot_name(int slot);
// FP8 slots: [kFirstFp8Slot, kNumSlots) holds the scale factors (inputs) and the amax outputs.
constexpr int kFirstFp8Slot = FS_SDPA_DESCALE_Q;
bool is_fp8_amax_slot(int slot);  // AMAX_S, AMAX_O, AMAX_DQ, AMAX_DK, AMAX_DV, AMAX_DP
// The ragged-offset slot of a sequence tensor slot, -1 when the slot cannot be ragged.
int ragged_slot_of(int slot);

// What an attribute object holds. Optional fields are unset until a setter runs.
struct Attributes {
  bool backward = false;
  std::array<TensorView, kNumSlots> tensors{};         // descriptors (data pointers unused)
  std::array<int64_t, kNumSlots> ragged_multiplier{};  // per ragged-offset slot (0 = unset -> 1)
  std::array<uint64_t, kNumSlots> byte_offset{};       // of each descriptor, added to its variant-pack pointer

  std::optional<bool> generate_stats;
  bool stats_use_log2 = false;
  std::optional<float> attn_scale_value;
  bool alibi = false;
  bool padding_mask = false;
  std::optional<int64_t> max_total_seq_len_q, max_total_seq_len_kv;
  int alignment = FS_SDPA_TOP_LEFT;
  std::optional<int64_t> left_bound, right_bound;
  std::optional<float> softcap;
  std::optional<float> dropout_probability;  // set by set_dropout (Philox form)
  bool dropout_mask_form = false;            // set by set_dropout_mask
  std::optional<int64_t> paged_max_seq_len_kv;
  bool deterministic = false;

  const TensorView& t(int slot) const { return tensors[slot]; }
  bool has(int slot) const { return tensors[slot].defined(); }
};

// A validated call: sizes, resolved options and the bound tensors (descriptors; the
// caller binds data pointers with bind() before running).
struct Problem {
  Attributes a;
  int64_t B = 0, Hq = 0, Hk = 0, Hv = 0;
  int64_t Sq = 0, Skv = 0;  // logical maxima (S of the descriptors; paged: the KV maximum)
  int64_t Dqk = 0, Dv = 0;
  DType dtype = DType::kUnknown;  // of q, k and v
  DeviceType device = DeviceType::kCPU;
  int device_id = 0;

  bool paged = false;  // K/V are containers addressed through page tables
  int64_t page_size_k = 0, page_size_v = 0;
  Alignment alignment = Alignment::kTopLeft;
  bool has_left = false, has_right = false;
  int64_t left = 0, right = 0;
  // FP8 call (docs/SDPA.md "FP8 SDPA"): q, k, v share `dtype` (kFloat8E4M3 or kFloat8E5M2), the format the
  // softmax probabilities S are quantized to; o, dO and dQ / dK / dV have their own FP8 formats
  // (t(FS_SDPA_O).dtype, t(FS_SDPA_DO).dtype: dP's format, t(FS_SDPA_DQ).dtype = dK's = dV's). Every scale
  // factor of the direction is bound (fp32, 1 element, on q's device or the host) and every amax output (fp32,
  // 1 element, on q's device); the options are the seed's subset (validate_*).
  bool fp8 = false;
  // The kernel family of a CUDA FP8 forward, fixed by the operation's check_support (90: the sm90 FP8 forward,
  // 80: the one on the sm80 kernels; dispatch/sdpa_launch.h's rule), so that workspace_size and execute follow
  // the choice check_support made whatever the switches say later; 0: not chosen yet (the rule's live answer).
  int fp8_fwd_family = 0;
  // The same for a CUDA FP8 backward (90: the sm90 backward kernel, 80: the sm80 one; sdpa_fp8_bwd_runs_sm90).
  int fp8_bwd_family = 0;
  // dBias's form on the sm90 backward (kernels/params.h SdpaDbiasDsForm), fixed by the operation's check_support for
  // a backward with dBias (dispatch/sdpa_launch.h sdpa_dbias_ds_form), so that workspace_size and execute follow it
  // whatever FLASHSPAN_SDPA_DBIAS_ACC / _DIRECT say later; -1: not chosen yet (the rule's live answer).
  int dbias_ds_form = -1;
  bool dropout = false;        // Philox dropout
  uint32_t dropout_threshold = 0;
  float dropout_scale = 1.0f;  // 1 / (1 - p)

  const TensorView& t(int slot) const { return a.tensors[slot]; }
  bool has(int slot) const { return a.tensors[slot].defined(); }
  bool ragged(int slot) const;
  int64_t ragged_multiplier(int slot) const;  // of the sequence tensor slot
  int group_k() const { return static_cast<int>(Hq / Hk); }
  // The resolved diagonal band (core/sdpa_band.h: what the reference and the kernels test).
  Band band() const { return Band{has_left ? 1 : 0, has_right ? 1 : 0, alignment == Alignment::kBottomRight ? 1 : 0, left, right}; }
  int group_v() const { return static_cast<int>(Hq / Hv); }
  // An empty batch (B = 0; packed THD: zero samples, B + 1 = 1 offsets): a valid call with nothing to compute. Every
  // output with a batch dimension is empty; the outputs reduced over the batch get the identity of their reduction
  // (empty_batch_fills below). Neither the CPU reference nor the GPU dispatch runs anything else for it.
  bool empty_batch() const { return B == 0; }

  // Points every bound slot at variant_pack[slot] + the descriptor's byte_offset; an unbound
  // slot must get NULL, a bound one a non-NULL pointer (unless the tensor is empty) aligned to
  // its element size.
  void bind(void* const* variant_pack, int32_t num_slots);
};

// The rule of an empty batch (Problem::empty_batch; docs/SDPA.md "An empty batch"), the one place that says what
// such a call writes: each bound output reduced over the batch dimension, set to the identity of its reduction, as a
// call whose samples see no key would leave it:
//   max_logit[H_q]       -inf  (the max over no visible logit: the value of a head that sees no key)
//   dSink_token[H_q]     0     (a sum over no row)
//   dBias                0     (a sum over no sample: a bias broadcast over the batch, dim 0 of size 1; a dBias whose
//                               dim 0 is B is itself empty and not listed)
//   FP8 amax_s, amax_o, amax_dQ, amax_dK, amax_dV, amax_dP   0   (a max of absolute values over no element)
// Outputs with a batch dimension (o, stats, score_max, score_sum_exp, rng_dump, dQ, dK, dV, dgate) are empty and not
// listed; empty outputs are never listed. The CPU reference (reference/sdpa_reference.cpp) stores these values on the
// host, the GPU dispatch (dispatch/sdpa_dispatch.cu) on the stream, before (instead of) any kernel.
struct EmptyBatchFill {
  int slot;
  float value;
};
std::vector<EmptyBatchFill> empty_batch_fills(const Problem& p);

// Descriptor-level validation. Tensors q, k, v, o (forward: + stats) / q, k, v, o, dO,
// stats, dQ, dK, dV (backward) must already be in a.tensors.
Problem validate_forward(const Attributes& a);
Problem validate_backward(const Attributes& a);

// Values of the small integer/scalar tensors, read from host memory and checked.
struct Runtime {
  std::vector<int64_t> len_q, len_kv;  // per sample
  std::array<std::vector<int64_t>, kNumSlots> row_start{};  // element offset of (b, 0, 0, 0) per sequence slot
  float attn_scale = 1.0f;
  uint64_t dropout_seed = 0, dropout_offset = 0;
  float dropout_mask_scale = 1.0f;
  std::vector<double> sinks;  // H_q values (empty without sinks); float32 or float64 tensors
  std::array<double, kNumSlots> factor{};  // FP8: the value of each bound scale factor, 1 for the other slots
};

// Reads and checks the runtime values of a problem whose tensors are bound to host memory.
Runtime read_runtime_host(const Problem& p);

// The attention scale of a problem whose attn_scale is a float or a host tensor (read here,
// checked finite); 1 when neither is given.
float host_attn_scale(const Problem& p);

// The value of a bound float32 scalar tensor in host memory (a host attn_scale or FP8 scale factor; a GPU
// launcher reads host scale factors with it), checked finite.
float host_scalar(const Problem& p, int slot);

// ALiBi slope of query head h out of H heads (ALiBi paper, Press et al. 2022, and the
// cuDNN frontend's get_alibi_slope): with n = 2^floor(log2 H), heads h < n get
// 2^(-8 (h + 1) / n) and the remaining heads 2^(-4 (2 (h - n) + 1) / n).
float alibi_slope(int64_t h, int64_t num_heads);

}  // namespace flashspan::sdpa
