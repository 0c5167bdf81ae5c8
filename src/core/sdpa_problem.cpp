// Validation of SDPA calls (see sdpa_problem.h and docs/SDPA.md for the rules).
#include "core/sdpa_problem.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <span>

#include "core/error.h"
#include "core/half_conv.h"
#include "core/philox.h"
#include "core/validation.h"

namespace flashspan::sdpa {
namespace {

constexpr int64_t kBlockMaskTile = 128;

const char* device_str(DeviceType d) { return d == DeviceType::kCUDA ? "cuda" : "cpu"; }

bool is_io_float(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }
bool is_float(DType t) {
  return t == DType::kFloat16 || t == DType::kBFloat16 || t == DType::kFloat32 || t == DType::kFloat64;
}
bool is_index(DType t) { return t == DType::kInt32 || t == DType::kInt64; }

std::string shape_of(std::initializer_list<int64_t> dims) {
  std::string s = "[";
  bool first = true;
  for (int64_t d : dims) {
    s += (first ? "" : ", ") + std::to_string(d);
    first = false;
  }
  return s + "]";
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Shared context of one validation: the reference tensor (q) for device checks.
struct Checker {
  const Attributes& a;
  const TensorView& q;

  void same_device(int slot) const {
    const TensorView& t = a.t(slot);
    FS_CHECK_TYPE(t.device == q.device && t.device_id == q.device_id, slot_name(slot), ": must be on the device of q (",
                  device_str(q.device), ":", q.device_id, "), got ", device_str(t.device), ":", t.device_id);
  }
  void last_dim_contiguous(int slot) const {
    const TensorView& t = a.t(slot);
    FS_CHECK_ARG(t.ndim > 0 && (t.size(-1) <= 1 || t.stride(-1) == 1), slot_name(slot),
                 ": last dimension must be contiguous (stride 1), got stride ", t.ndim > 0 ? t.stride(-1) : 0);
  }
  void rank4(int slot, const char* dims) const {
    const TensorView& t = a.t(slot);
    FS_CHECK_ARG(t.ndim == 4, slot_name(slot), ": must be a 4-D tensor ", dims, ", got rank ", t.ndim, " ",
                 t.shape_str());
  }
  // Exact 4-D shape, dtype and device; last dim contiguous.
  void exact(int slot, std::initializer_list<int64_t> dims, DType dtype, const char* what) const {
    const TensorView& t = a.t(slot);
    FS_CHECK_TYPE(t.dtype == dtype, slot_name(slot), ": dtype must be ", dtype_name(dtype), " (", what, "), got ",
                  dtype_name(t.dtype));
    same_device(slot);
    bool ok = t.ndim == static_cast<int>(dims.size());
    int i = 0;
    for (int64_t d : dims) ok = ok && t.shape[i++] == d;
    FS_CHECK_ARG(ok, slot_name(slot), ": shape must be ", shape_of(dims), " (", what, "), got ", t.shape_str());
    last_dim_contiguous(slot);
  }
  // A small tensor of `count` elements, compact, of one of the given dtypes.
  // allow_f64: float64 is accepted too (sinks of a float64 CPU call: finite differences need them exact).
  void small(int slot, int64_t count, bool index_dtype, const char* what, bool allow_f64 = false) const {
    const TensorView& t = a.t(slot);
    if (index_dtype) {
      FS_CHECK_TYPE(is_index(t.dtype), slot_name(slot), ": dtype must be int32 or int64 (", what, "), got ",
                    dtype_name(t.dtype));
    } else {
      FS_CHECK_TYPE(t.dtype == DType::kFloat32 || (allow_f64 && t.dtype == DType::kFloat64), slot_name(slot),
                    ": dtype must be float32", allow_f64 ? " or float64 (q is float64)" : "", " (", what, "), got ",
                    dtype_name(t.dtype));
    }
    same_device(slot);
    FS_CHECK_ARG(t.numel() == count, slot_name(slot), ": must have ", count, " element(s) (", what, "), got shape ",
                 t.shape_str());
    FS_CHECK_ARG(t.is_contiguous(), slot_name(slot), ": must be contiguous");
  }
  // A float32 scalar input (attn_scale as a tensor, the FP8 scale factors): on q's device, or a host
  // scalar with device tensors (the seed's pass-by-value scale, read on the host).
  void scalar_input(int slot, const char* what) const {
    const TensorView& t = a.t(slot);
    if (t.device == DeviceType::kCPU && q.device != DeviceType::kCPU) {
      FS_CHECK_TYPE(t.dtype == DType::kFloat32, slot_name(slot), ": dtype must be float32 (", what, "), got ",
                    dtype_name(t.dtype));
      FS_CHECK_ARG(t.numel() == 1, slot_name(slot), ": must have 1 element(s) (", what, "), got shape ", t.shape_str());
    } else {
      small(slot, 1, false, what);
    }
  }
  // A 4-D tensor broadcastable to [B, H, S_q, S_kv]: each dim full or 1.
  void broadcastable(int slot, int64_t B, int64_t H, int64_t Sq, int64_t Skv, const char* kv_name) const {
    const TensorView& t = a.t(slot);
    rank4(slot, "[1|B, 1|H_q, 1|S_q, 1|S_kv]");
    const int64_t full[4] = {B, H, Sq, Skv};
    const char* names[4] = {"B", "H_q", "S_q", kv_name};
    for (int d = 0; d < 4; ++d) {
      FS_CHECK_ARG(t.shape[d] == 1 || t.shape[d] == full[d], slot_name(slot), ": is not broadcastable to ",
                   shape_of({B, H, Sq, Skv}), ": dimension ", d, " (", names[d], ") is ", t.shape[d], ", must be 1 or ",
                   full[d]);
    }
    same_device(slot);
    if (t.size(-1) > 1 && t.stride(-1) == 0) {
      // An expanded view (x.expand(...)) of a size-1 last dimension: the size-1 shape itself is what the rule wants
      // (size-1 dims broadcast without a copy).
      FS_CHECK_ARG(false, slot_name(slot), ": last dimension must be contiguous (stride 1), got stride 0: an expanded "
                   "(broadcast) view; pass the size-1 shape ",
                   shape_of({t.stride(0) == 0 ? 1 : t.shape[0], t.stride(1) == 0 ? 1 : t.shape[1],
                             t.stride(2) == 0 ? 1 : t.shape[2], 1}),
                   " instead (dims of size 1 broadcast to ", shape_of({B, H, Sq, Skv}), " without a copy)");
    }
    last_dim_contiguous(slot);
  }
};

bool power_of_two(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

// Q-side and KV-side sequence slots (for ragged / max_total rules).
constexpr int kQSide[] = {FS_SDPA_Q, FS_SDPA_O, FS_SDPA_STATS, FS_SDPA_DO, FS_SDPA_DQ, FS_SDPA_GATE, FS_SDPA_DGATE};
constexpr int kKvSide[] = {FS_SDPA_K, FS_SDPA_V, FS_SDPA_DK, FS_SDPA_DV};

// The scale factors each FP8 direction takes (all required, as in the seed's sdpa_fp8 / sdpa_fp8_backward).
constexpr int kFp8FwdScales[] = {FS_SDPA_DESCALE_Q, FS_SDPA_DESCALE_K, FS_SDPA_DESCALE_V,
                                 FS_SDPA_DESCALE_S, FS_SDPA_SCALE_S,   FS_SDPA_SCALE_O};
constexpr int kFp8BwdScales[] = {FS_SDPA_DESCALE_Q, FS_SDPA_DESCALE_K,  FS_SDPA_DESCALE_V, FS_SDPA_DESCALE_O,
                                 FS_SDPA_DESCALE_DO, FS_SDPA_DESCALE_S, FS_SDPA_DESCALE_DP, FS_SDPA_SCALE_S,
                                 FS_SDPA_SCALE_DQ,  FS_SDPA_SCALE_DK,   FS_SDPA_SCALE_DV,  FS_SDPA_SCALE_DP};
constexpr int kFp8FwdAmax[] = {FS_SDPA_AMAX_S, FS_SDPA_AMAX_O};
constexpr int kFp8BwdAmax[] = {FS_SDPA_AMAX_DQ, FS_SDPA_AMAX_DK, FS_SDPA_AMAX_DV, FS_SDPA_AMAX_DP};

// t when it is an FP8 format, else `fallback` (so that an `exact` check on a non-FP8 tensor names an FP8 dtype).
DType fp8_or(DType t, DType fallback) { return is_fp8(t) ? t : fallback; }

// The options of an FP8 call (docs/SDPA.md "FP8 SDPA"): the seed's subset (sdpa_fp8: causal and padding masks;
// sdpa_fp8_backward: a causal mask), every scale factor and amax output. Checked before the options' own rules,
// so an option FP8 does not take is named as such.
void check_fp8_options(const Problem& p, const Checker& c) {
  const Attributes& a = p.a;
  const char* subset = a.backward ? "the seed's sdpa_fp8_backward takes a causal mask only"
                                  : "the seed's sdpa_fp8 takes causal and padding masks only";
  auto reject = [&](bool set, const char* option, const char* why) {
    FS_CHECK_ARG(!set, option, ": not supported with FP8 inputs (", why, ")");
  };
  reject(a.has(FS_SDPA_BIAS), "bias", subset);
  reject(a.alibi, "use_alibi_mask", subset);
  reject(a.softcap.has_value(), "softcap", subset);
  reject(a.has(FS_SDPA_SINK_TOKEN), "sink_token", subset);
  reject(a.has(FS_SDPA_BLOCK_MASK), "block_mask", subset);
  reject(a.has(FS_SDPA_GATE), "gate", subset);
  reject(a.has(FS_SDPA_MAX_LOGIT), "max_logit", subset);
  reject(a.has(FS_SDPA_PAGE_TABLE_K) || a.has(FS_SDPA_PAGE_TABLE_V),
         "paged_attention_k_table, paged_attention_v_table", subset);
  // The seed's FP8 backward has no dropout, so a forward with dropout could not be trained through.
  reject(a.dropout_probability.has_value() || a.dropout_mask_form || a.has(FS_SDPA_DROPOUT_SEED) ||
             a.has(FS_SDPA_DROPOUT_MASK),
         "dropout", "the seed's FP8 backward has no dropout, and the forward takes none either");
  reject(a.has(FS_SDPA_RNG_DUMP), "rng_dump", "FP8 calls take no dropout");
  reject(a.left_bound.has_value(), "diagonal_band_left_bound", "the FP8 masks are causal ones, no sliding windows");
  reject(a.right_bound.has_value() && *a.right_bound != 0, "diagonal_band_right_bound",
         "the FP8 masks are causal ones: only 0 (set_causal_mask)");
  reject(a.alignment == FS_SDPA_BOTTOM_RIGHT, "diagonal_alignment",
         "the seed's FP8 causal mask is TOP_LEFT (set_causal_mask), BOTTOM_RIGHT is not");
  if (a.backward) {
    for (int s : {FS_SDPA_SEQ_LEN_Q, FS_SDPA_SEQ_LEN_KV, FS_SDPA_CU_SEQ_LEN_Q, FS_SDPA_CU_SEQ_LEN_KV})
      reject(a.has(s), slot_name(s), subset);
    reject(a.padding_mask, "use_padding_mask", subset);
  }
  FS_CHECK_ARG(p.Dqk % 16 == 0, "q: head dim D_qk = ", p.Dqk, " must be a multiple of 16 with FP8 inputs");
  FS_CHECK_ARG(p.Dv % 16 == 0, "v: head dim D_v = ", p.Dv, " must be a multiple of 16 with FP8 inputs");
  const char* op = a.backward ? "sdpa_fp8_backward" : "sdpa_fp8";
  for (int s : a.backward ? std::span<const int>(kFp8BwdScales) : std::span<const int>(kFp8FwdScales)) {
    FS_CHECK_ARG(a.has(s), slot_name(s), ": is required with FP8 inputs (the seed's ", op,
                 " takes every scale factor; 1 for none)");
    c.scalar_input(s, "one scale factor, shape (1, 1, 1, 1)");
  }
  for (int s : a.backward ? std::span<const int>(kFp8BwdAmax) : std::span<const int>(kFp8FwdAmax)) {
    FS_CHECK_ARG(a.has(s), slot_name(s), ": is required with FP8 inputs (the seed's ", op, " outputs it)");
    c.small(s, 1, false, "one float32 output, shape (1, 1, 1, 1)");
  }
}

// Paged K/V (docs/SDPA.md "Paged K/V caches"): a side with a page table is a container [num_blocks, H, block_size, D]
// read through its table [B, 1, max_pages, 1]; a side without one is a dense [B, H, S_kv, D] tensor.
int table_of(int kv_slot) { return kv_slot == FS_SDPA_K ? FS_SDPA_PAGE_TABLE_K : FS_SDPA_PAGE_TABLE_V; }

// The dims a K or V descriptor must have, in the layout its page table (or its absence) gives it.
const char* kv_dims(const Attributes& a, int kv_slot) {
  if (a.has(table_of(kv_slot))) {
    return kv_slot == FS_SDPA_K ? "[num_blocks, H_k, block_size, D_qk] (a paged container: paged_attention_k_table is given)"
                                : "[num_blocks, H_v, block_size, D_v] (a paged container: paged_attention_v_table is given)";
  }
  return kv_slot == FS_SDPA_K ? "[B, H_k, S_kv, D_qk]" : "[B, H_v, S_kv, D_v]";
}

// With one side paged and the other not, the dense side's shape errors say so: a paged container given without its
// table is read as a dense tensor (its num_blocks as the batch, its block_size as S_kv). Empty with both or neither.
std::string one_table_hint(const Attributes& a, int dense_slot) {
  const int other = dense_slot == FS_SDPA_K ? FS_SDPA_V : FS_SDPA_K;
  if (!a.has(table_of(other)) || a.has(table_of(dense_slot))) return "";
  const std::string name = slot_name(dense_slot), missing = slot_name(table_of(dense_slot));
  const bool k = dense_slot == FS_SDPA_K;
  return " (" + std::string(slot_name(table_of(other))) + " is given but " + missing + " is not, so " + name +
         " is read as a dense " + (k ? "[B, H_k, S_kv, D_qk]" : "[B, H_v, S_kv, D_v]") + " tensor; a paged " + name +
         " container " + (k ? "[num_blocks, H_k, block_size, D_qk]" : "[num_blocks, H_v, block_size, D_v]") +
         " needs " + missing + ": pass both paged_attention_k_table and paged_attention_v_table, the same table when "
         "K and V share their pages)";
}

// q, k, v given in BSHD order [B, S, H, D] where SDPA reads [B, H, S, D] (dims, whatever the strides): nothing tells
// the two apart in general (a BSHD call whose S and H pass the BHSD rules runs on the wrong layout), so no call is
// refused for it; but when a rule on H or S fails, and q, k, v read with dims 1 and 2 swapped would pass the rules on
// the heads (H_k, H_v divide H_q; K and V one S_kv), the message says so (bshd_hint). Dense 4-D q, k, v only (not
// paged, not packed through ragged offsets).
bool fits_bshd(const Attributes& a) {
  const TensorView &q = a.t(FS_SDPA_Q), &k = a.t(FS_SDPA_K), &v = a.t(FS_SDPA_V);
  if (q.ndim != 4 || k.ndim != 4 || v.ndim != 4 || a.has(FS_SDPA_PAGE_TABLE_K) || a.has(FS_SDPA_PAGE_TABLE_V)) return false;
  for (int s : {FS_SDPA_Q, FS_SDPA_K, FS_SDPA_V}) {
    if (a.has(ragged_slot_of(s))) return false;
  }
  const int64_t hq = q.size(2), hk = k.size(2), hv = v.size(2);
  return hq > 0 && hk > 0 && hv > 0 && hq % hk == 0 && hq % hv == 0 && k.size(1) == v.size(1) &&
         k.size(0) == q.size(0) && v.size(0) == q.size(0) && k.size(3) == q.size(3);
}

// Appended to a broken rule on H or S when fits_bshd and the rule itself (`fits_too`) would hold read as BSHD.
std::string bshd_hint(const Attributes& a, bool fits_too = true) {
  if (!fits_too || !fits_bshd(a)) return "";
  const TensorView& q = a.t(FS_SDPA_Q);
  return " (q, k, v are read as [B, H, S, D]; read as [B, S, H, D] they would pass this rule, with H_q = " +
         std::to_string(q.size(2)) + " and S_q = " + std::to_string(q.size(1)) +
         ": if they are BSHD, pass q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), views without a copy)";
}

// Runs `check` (a rule on H or S of another argument); a broken rule is rethrown with bshd_hint(a, fits_too).
template <class F>
void with_bshd_hint(const Attributes& a, bool fits_too, F&& check) {
  try {
    check();
  } catch (const Error& e) {
    const std::string hint = bshd_hint(a, fits_too);
    if (hint.empty()) throw;
    throw Error(e.status(), e.what() + hint);
  }
}

// The keys the page tables can address per sample: the least, over the paged sides, of max_pages * block_size
// (tables and containers already checked), with the rule and its numbers for messages.
struct PagedCapacity {
  int64_t keys = std::numeric_limits<int64_t>::max();
  int kv_slot = -1;  // the side that bounds it
  int64_t pages = 0, block = 0;

  std::string rule() const {
    const int table = table_of(kv_slot);
    return std::string("max_pages * block_size = ") + std::to_string(pages) + " * " + std::to_string(block) + " = " +
           std::to_string(keys) + " (max_pages of " + slot_name(table) + " [B, 1, max_pages, 1], block_size of " +
           slot_name(kv_slot) + " [num_blocks, H, block_size, D])";
  }
};

PagedCapacity paged_capacity(const Attributes& a) {
  PagedCapacity cap;
  for (int kv : {FS_SDPA_K, FS_SDPA_V}) {
    if (!a.has(table_of(kv))) continue;
    const int64_t pages = a.t(table_of(kv)).size(2), block = a.t(kv).size(2);
    int64_t keys = 0;
    if (__builtin_mul_overflow(pages, block, &keys)) keys = std::numeric_limits<int64_t>::max();
    if (cap.kv_slot < 0 || keys < cap.keys) cap = PagedCapacity{keys, kv, pages, block};
  }
  return cap;
}

void check_common(Problem& p, const Checker& c) {
  const Attributes& a = p.a;
  const TensorView &q = a.t(FS_SDPA_Q), &k = a.t(FS_SDPA_K), &v = a.t(FS_SDPA_V);

  // --- tensors of the core problem -------------------------------------------------------
  for (int s : {FS_SDPA_Q, FS_SDPA_K, FS_SDPA_V, FS_SDPA_O}) FS_CHECK_ARG(a.has(s), slot_name(s), ": is required");
  c.rank4(FS_SDPA_Q, "[B, H_q, S_q, D_qk]");
  const bool cpu = q.device == DeviceType::kCPU;
  p.fp8 = is_fp8(q.dtype);  // FP8 passes on either device here: check_support says where it runs
  if (!p.fp8 && cpu) {
    FS_CHECK_TYPE(is_float(q.dtype), "q: dtype must be float16 or bfloat16 (the CPU reference also takes float32 and "
                  "float64), or an FP8 format (float8_e4m3fn, float8_e5m2), got ", dtype_name(q.dtype));
  } else if (!p.fp8) {
    FS_CHECK_TYPE(is_io_float(q.dtype), "q: dtype must be float16 or bfloat16, or an FP8 format (float8_e4m3fn, "
                  "float8_e5m2), got ", dtype_name(q.dtype));
  }
  p.dtype = q.dtype;
  p.device = q.device;
  p.device_id = q.device_id;
  p.B = q.size(0);
  p.Hq = q.size(1);
  p.Sq = q.size(2);
  p.Dqk = q.size(3);
  c.last_dim_contiguous(FS_SDPA_Q);
  for (int s : {FS_SDPA_K, FS_SDPA_V}) {
    c.rank4(s, kv_dims(a, s));
    FS_CHECK_TYPE(a.t(s).dtype == q.dtype, slot_name(s), ": dtype ", dtype_name(a.t(s).dtype),
                  " differs from q's ", dtype_name(q.dtype),
                  p.fp8 ? " (q, k and v share one FP8 format)" : " (one io dtype per call: no mixed dtypes)");
    c.same_device(s);
    c.last_dim_contiguous(s);
  }
  p.Hk = k.size(1);
  p.Hv = v.size(1);
  p.Dv = v.size(3);
  // B = 0 is a valid call (an empty batch, Problem::empty_batch): every output with a batch dimension is empty and
  // nothing runs but the identity fills of empty_batch_fills (docs/SDPA.md "An empty batch").
  FS_CHECK_ARG(p.B >= 0, "q: batch size must be non-negative, got ", p.B);
  FS_CHECK_ARG(p.Hq > 0 && p.Hk > 0 && p.Hv > 0, "q, k, v: head counts must be positive, got H_q = ", p.Hq,
               ", H_k = ", p.Hk, ", H_v = ", p.Hv);
  FS_CHECK_ARG(k.size(3) == p.Dqk, "k: head dim ", k.size(3), " differs from q's D_qk = ", p.Dqk);
  FS_CHECK_ARG(p.Dqk % 8 == 0 && p.Dqk > 0, "q: head dim D_qk = ", p.Dqk, " must be a positive multiple of 8");
  FS_CHECK_ARG(p.Dv % 8 == 0 && p.Dv > 0, "v: head dim D_v = ", p.Dv, " must be a positive multiple of 8");
  // A broken rule (INVALID_ARGUMENT -> ValueError), as flex's head-dim rule at plan creation: one class per kind
  // of rule across the front ends (docs/ERRORS.md).
  FS_CHECK_ARG(p.Dqk <= 256 && p.Dv <= 256, "q, v: head dims (D_qk, D_v) = (", p.Dqk, ", ", p.Dv,
               ") are not supported: each must be at most 256");
  FS_CHECK_ARG(p.Hq % p.Hk == 0 && p.Hq % p.Hv == 0,
               "k, v: for MHA / GQA / MQA the K and V head counts must divide H_q = ", p.Hq, ", got H_k = ", p.Hk,
               ", H_v = ", p.Hv, bshd_hint(a));
  if (p.fp8) {
    check_fp8_options(p, c);
  } else {
    for (int s = kFirstFp8Slot; s < kNumSlots; ++s) {
      FS_CHECK_ARG(!a.has(s), slot_name(s), ": FP8 scale factors and amax outputs apply to FP8 inputs only (q is ",
                   dtype_name(q.dtype), ")");
    }
  }

  // --- paged K/V -------------------------------------------------------------------------
  const bool paged_k = a.has(FS_SDPA_PAGE_TABLE_K), paged_v = a.has(FS_SDPA_PAGE_TABLE_V);
  p.paged = paged_k || paged_v;
  if (p.paged) {
    FS_CHECK_SUPPORTED(!a.backward,
                       "paged_attention_k_table, paged_attention_v_table: the backward pass does not support paged "
                       "K/V caches (as in the seed): pass contiguous K and V");
  }
  FS_CHECK_ARG(p.paged || !a.paged_max_seq_len_kv.has_value(),
               "paged_attention_max_seq_len_kv: is only meaningful with paged K/V caches (set "
               "paged_attention_k_table / paged_attention_v_table) ");
  if (a.paged_max_seq_len_kv) {
    FS_CHECK_ARG(*a.paged_max_seq_len_kv > 0, "paged_attention_max_seq_len_kv: must be positive, got ",
                 *a.paged_max_seq_len_kv);
  }
  int64_t dense_skv = -1;
  int dense_slot = -1;
  for (int side = 0; side < 2; ++side) {
    const int slot = side == 0 ? FS_SDPA_K : FS_SDPA_V;
    const int table = side == 0 ? FS_SDPA_PAGE_TABLE_K : FS_SDPA_PAGE_TABLE_V;
    const TensorView& t = a.t(slot);
    if (a.has(table)) {
      const TensorView& pt = a.t(table);
      const int64_t bs = t.size(2);
      FS_CHECK_ARG(power_of_two(bs), slot_name(slot), ": the block size (dim 2) of a paged container ",
                   slot == FS_SDPA_K ? "[num_blocks, H_k, block_size, D_qk]" : "[num_blocks, H_v, block_size, D_v]",
                   " must be a power of two, got ", bs);
      FS_CHECK_TYPE(pt.dtype == DType::kInt32, slot_name(table), ": dtype must be int32, got ", dtype_name(pt.dtype));
      c.same_device(table);
      FS_CHECK_ARG(pt.ndim == 4 && pt.size(0) == p.B && pt.size(1) == 1 && pt.size(3) == 1 && pt.size(2) > 0,
                   slot_name(table), ": page table shape must be [B, 1, max_pages, 1] = [", p.B,
                   ", 1, max_pages, 1], got ", pt.shape_str());
      (side == 0 ? p.page_size_k : p.page_size_v) = bs;
    } else {
      FS_CHECK_ARG(t.size(0) == p.B, slot_name(slot), ": batch ", t.size(0), " differs from q's B = ", p.B,
                   one_table_hint(a, slot));
      FS_CHECK_ARG(dense_skv < 0 || t.size(2) == dense_skv, "k, v: sequence lengths differ (S_kv ", dense_skv, " vs ",
                   t.size(2), ")", bshd_hint(a));
      dense_skv = t.size(2);
      dense_slot = slot;
    }
  }
  if (!p.paged) {
    p.Skv = dense_skv;
  } else {
    const PagedCapacity cap = paged_capacity(a);
    if (a.paged_max_seq_len_kv) {
      p.Skv = *a.paged_max_seq_len_kv;
      FS_CHECK_ARG(p.Skv <= cap.keys, "paged_attention_max_seq_len_kv: ", p.Skv, " exceeds the capacity of the page "
                   "tables: it must be <= ", cap.rule());
      FS_CHECK_ARG(dense_skv < 0 || dense_skv == p.Skv, slot_name(dense_slot), ": sequence length ", dense_skv,
                   " differs from the paged S_kv = paged_attention_max_seq_len_kv = ", p.Skv,
                   one_table_hint(a, dense_slot));
    } else if (dense_skv >= 0) {
      p.Skv = dense_skv;  // the dense side's S_kv, which the paged side must be able to address
      FS_CHECK_ARG(p.Skv <= cap.keys, slot_name(dense_slot), ": sequence length S_kv = ", p.Skv,
                   " exceeds the capacity of the page tables of the paged side: it must be <= ", cap.rule(),
                   one_table_hint(a, dense_slot));
    } else {
      p.Skv = cap.keys;  // the tables' capacity
    }
  }
  FS_CHECK_ARG(p.Sq >= 0 && p.Skv >= 0, "q, k: sequence lengths must be non-negative");

  // --- outputs / other sequence tensors ---------------------------------------------------
  if (p.fp8) {
    c.exact(FS_SDPA_O, {p.B, p.Hq, p.Sq, p.Dv}, fp8_or(a.t(FS_SDPA_O).dtype, q.dtype),
            "[B, H_q, S_q, D_v], an FP8 format");
  } else {
    c.exact(FS_SDPA_O, {p.B, p.Hq, p.Sq, p.Dv}, q.dtype, "[B, H_q, S_q, D_v], dtype of q");
  }

  // --- padding / sequence lengths ------------------------------------------------------------
  const bool seq_q = a.has(FS_SDPA_SEQ_LEN_Q), cu_q = a.has(FS_SDPA_CU_SEQ_LEN_Q);
  const bool seq_kv = a.has(FS_SDPA_SEQ_LEN_KV), cu_kv = a.has(FS_SDPA_CU_SEQ_LEN_KV);
  FS_CHECK_ARG(!(seq_q && cu_q), "seq_len_q, cu_seq_len_q: cannot both be set (one length form per side)");
  FS_CHECK_ARG(!(seq_kv && cu_kv), "seq_len_kv, cu_seq_len_kv: cannot both be set (one length form per side)");
  const bool any_q = seq_q || cu_q, any_kv = seq_kv || cu_kv;
  if (a.padding_mask) {
    FS_CHECK_ARG(any_q && any_kv, "use_padding_mask: requires a Q-side length tensor (seq_len_q or cu_seq_len_q) and "
                 "a KV-side one (seq_len_kv or cu_seq_len_kv), provided together; missing: ",
                 any_q ? "the KV side" : (any_kv ? "the Q side" : "both sides"));
  } else {
    FS_CHECK_ARG(!any_q && !any_kv, any_q ? (seq_q ? "seq_len_q" : "cu_seq_len_q")
                                          : (seq_kv ? "seq_len_kv" : "cu_seq_len_kv"),
                 ": sequence lengths are only used with the padding mask (set use_padding_mask)");
  }
  if (seq_q) c.small(FS_SDPA_SEQ_LEN_Q, p.B, true, "one length per sample, shape (B, 1, 1, 1) or (B,)");
  if (seq_kv) c.small(FS_SDPA_SEQ_LEN_KV, p.B, true, "one length per sample, shape (B, 1, 1, 1) or (B,)");
  if (cu_q) c.small(FS_SDPA_CU_SEQ_LEN_Q, p.B + 1, true, "prefix sums with a leading 0, shape (B+1, 1, 1, 1) or (B+1,)");
  if (cu_kv) c.small(FS_SDPA_CU_SEQ_LEN_KV, p.B + 1, true, "prefix sums with a leading 0, shape (B+1, 1, 1, 1) or (B+1,)");
  if (p.paged) {
    FS_CHECK_ARG(a.padding_mask, "paged_attention_k_table, paged_attention_v_table: paged K/V caches need the padding "
                 "mask with Q-side and KV-side sequence lengths (use_padding_mask, seq_len_q / cu_seq_len_q, seq_len_kv "
                 "/ cu_seq_len_kv)");
  }

  // --- ragged offsets ----------------------------------------------------------------------
  bool ragged_q_side = false, ragged_kv_side = false;
  for (int s = 0; s < kNumSlots; ++s) {
    const int r = ragged_slot_of(s);
    if (r < 0 || !a.has(r)) continue;
    FS_CHECK_ARG(a.has(s), slot_name(r), ": is set but ", slot_name(s), " is not part of this operation");
    c.small(r, p.B + 1, true, "B+1 element offsets");
    FS_CHECK_ARG(a.padding_mask, slot_name(r), ": ragged (packed THD) layouts need the padding mask "
                 "(use_padding_mask with sequence lengths)");
    for (int qs : kQSide) ragged_q_side |= qs == s;
    for (int ks : kKvSide) ragged_kv_side |= ks == s;
  }
  if (a.max_total_seq_len_q) {
    FS_CHECK_ARG(ragged_q_side, "max_total_seq_len_q: is only supported with a packed (ragged) Q-side layout");
    FS_CHECK_ARG(*a.max_total_seq_len_q > 0, "max_total_seq_len_q: must be positive, got ", *a.max_total_seq_len_q);
  }
  if (a.max_total_seq_len_kv) {
    FS_CHECK_ARG(ragged_kv_side, "max_total_seq_len_kv: is only supported with a packed (ragged) KV-side layout");
    FS_CHECK_ARG(*a.max_total_seq_len_kv > 0, "max_total_seq_len_kv: must be positive, got ", *a.max_total_seq_len_kv);
  }

  // --- scale --------------------------------------------------------------------------------
  if (a.has(FS_SDPA_ATTN_SCALE)) {
    FS_CHECK_ARG(!a.attn_scale_value, "attn_scale: set both as a float and as a tensor; use one");
    c.scalar_input(FS_SDPA_ATTN_SCALE, "one scale factor");
  } else if (a.attn_scale_value) {
    FS_CHECK_ARG(std::isfinite(*a.attn_scale_value), "attn_scale: must be finite, got ", *a.attn_scale_value);
  }

  // --- diagonal band -----------------------------------------------------------------------
  FS_CHECK_ARG(a.alignment == FS_SDPA_TOP_LEFT || a.alignment == FS_SDPA_BOTTOM_RIGHT,
               "diagonal_alignment: must be TOP_LEFT (0) or BOTTOM_RIGHT (1), got ", a.alignment);
  p.alignment = static_cast<Alignment>(a.alignment);
  p.has_left = a.left_bound.has_value();
  p.has_right = a.right_bound.has_value();
  p.left = a.left_bound.value_or(0);
  p.right = a.right_bound.value_or(0);
  FS_CHECK_ARG(!p.has_right || p.right >= 0, "diagonal_band_right_bound: must be >= 0 (0 = causal), got ", p.right);
  FS_CHECK_ARG(!p.has_left || p.left >= 1, "diagonal_band_left_bound: must be >= 1 when set (it masks columns at or "
               "before row - left_bound, so it counts the visible tokens including the diagonal), got ", p.left);
  FS_CHECK_ARG(p.alignment != Alignment::kBottomRight || p.has_left || p.has_right,
               "diagonal_alignment: BOTTOM_RIGHT only re-anchors a diagonal band; set diagonal_band_right_bound (0 = "
               "causal) and/or diagonal_band_left_bound, or use TOP_LEFT");
  // A bound past S_q + S_kv masks nothing more; clamping keeps row + bound from overflowing.
  int64_t reach = 0;
  if (__builtin_add_overflow(p.Sq, p.Skv, &reach)) reach = std::numeric_limits<int64_t>::max();
  p.left = std::min(p.left, reach);
  p.right = std::min(p.right, reach);

  // --- score modifiers ------------------------------------------------------------------------
  if (a.alibi) {
    FS_CHECK_ARG(p.has_right && p.right == 0, "use_alibi_mask: ALiBi requires causal masking "
                 "(diagonal_band_right_bound = 0; with S_q < S_kv, decode or a KV cache, the bottom-right alignment "
                 "too: diagonal_alignment = BOTTOM_RIGHT), got ",
                 p.has_right ? "diagonal_band_right_bound = " + std::to_string(p.right) : std::string("no right bound"));
  }
  if (a.softcap) {
    FS_CHECK_ARG(std::isfinite(*a.softcap) && *a.softcap > 0.0f, "softcap: must be a finite positive value, got ",
                 *a.softcap);
  }
  if (a.has(FS_SDPA_BIAS)) {
    {
      // A bias of [B, H, S_q, S_kv] with q, k, v in BSHD order: H and S_q of q swapped, S_kv = k's dim 1.
      const TensorView& b = a.t(FS_SDPA_BIAS);
      const bool fits = b.ndim == 4 && fits_bshd(a) && (b.size(1) == 1 || b.size(1) == q.size(2)) &&
                        (b.size(2) == 1 || b.size(2) == q.size(1)) && (b.size(3) == 1 || b.size(3) == k.size(1));
      with_bshd_hint(a, fits, [&] {
        c.broadcastable(FS_SDPA_BIAS, p.B, p.Hq, p.Sq, p.Skv, p.paged ? "paged_attention_max_seq_len_kv" : "S_kv");
      });
    }
    const DType bt = a.t(FS_SDPA_BIAS).dtype;
    FS_CHECK_TYPE(bt == q.dtype || bt == DType::kFloat32, "bias: dtype must be q's (", dtype_name(q.dtype),
                  ") or float32, got ", dtype_name(bt));
  }
  if (a.has(FS_SDPA_BLOCK_MASK)) {
    const TensorView& m = a.t(FS_SDPA_BLOCK_MASK);
    FS_CHECK_TYPE(m.dtype == DType::kUInt8, "block_mask: dtype must be uint8 (one bit per 128x128 tile), got ",
                  dtype_name(m.dtype));
    c.rank4(FS_SDPA_BLOCK_MASK, "[1|B, 1|H_q, ceil(S_q/128), ceil(ceil(S_kv/128)/8)]");
    const int64_t nq = ceil_div(p.Sq, kBlockMaskTile), nk = ceil_div(ceil_div(p.Skv, kBlockMaskTile), 8);
    FS_CHECK_ARG((m.size(0) == 1 || m.size(0) == p.B) && (m.size(1) == 1 || m.size(1) == p.Hq) && m.size(2) == nq &&
                     m.size(3) == nk,
                 "block_mask: shape must be [1|B, 1|H_q, ceil(S_q/128), ceil(ceil(S_kv/128)/8)] = [1|", p.B, ", 1|",
                 p.Hq, ", ", nq, ", ", nk, "], got ", m.shape_str());
    c.same_device(FS_SDPA_BLOCK_MASK);
    c.last_dim_contiguous(FS_SDPA_BLOCK_MASK);
  }
  if (a.has(FS_SDPA_SINK_TOKEN)) {
    with_bshd_hint(a, a.t(FS_SDPA_SINK_TOKEN).numel() == q.size(2), [&] {
      c.small(FS_SDPA_SINK_TOKEN, p.Hq, false, "one logit per query head, shape (H_q,) or (1, H_q, 1, 1)",
              q.dtype == DType::kFloat64);
    });
  }

  // --- dropout -----------------------------------------------------------------------------
  FS_CHECK_ARG(!(a.dropout_probability && a.dropout_mask_form),
               "dropout: both a probability (Philox) and a dropout mask were given; use one");
  if (a.dropout_probability) {
    const float prob = *a.dropout_probability;
    FS_CHECK_ARG(std::isfinite(prob) && prob >= 0.0f && prob < 1.0f,
                 "dropout: probability must be in [0, 1) (1 would make the scale 1/(1-p) infinite), got ", prob);
    FS_CHECK_ARG(a.has(FS_SDPA_DROPOUT_SEED) && a.has(FS_SDPA_DROPOUT_OFFSET),
                 "dropout: the Philox form needs a seed and an offset tensor");
    c.small(FS_SDPA_DROPOUT_SEED, 1, true, "one int32/int64 seed");
    c.small(FS_SDPA_DROPOUT_OFFSET, 1, true, "one int32/int64 offset");
    p.dropout = true;
    p.dropout_threshold = dropout_threshold(prob);
    p.dropout_scale = 1.0f / (1.0f - prob);
  } else {
    FS_CHECK_ARG(!a.has(FS_SDPA_DROPOUT_SEED) && !a.has(FS_SDPA_DROPOUT_OFFSET),
                 "dropout: seed/offset given without a probability");
  }
  if (a.dropout_mask_form) {
    FS_CHECK_ARG(a.has(FS_SDPA_DROPOUT_MASK) && a.has(FS_SDPA_DROPOUT_SCALE),
                 "dropout: the mask form needs a mask and a scale tensor");
    c.broadcastable(FS_SDPA_DROPOUT_MASK, p.B, p.Hq, p.Sq, p.Skv, "S_kv");
    const DType mt = a.t(FS_SDPA_DROPOUT_MASK).dtype;
    FS_CHECK_TYPE(mt == DType::kUInt8 || is_float(mt), "dropout mask: dtype must be uint8 or a float type, got ",
                  dtype_name(mt));
    c.small(FS_SDPA_DROPOUT_SCALE, 1, false, "one scale, typically 1 / (1 - p)");
    if (a.has(FS_SDPA_DROPOUT_SCALE_INV)) {
      FS_CHECK_ARG(a.backward, "dropout scale_inv: only the backward takes it");
      c.small(FS_SDPA_DROPOUT_SCALE_INV, 1, false, "one value, 1 / scale");
    }
  } else {
    FS_CHECK_ARG(!a.has(FS_SDPA_DROPOUT_MASK) && !a.has(FS_SDPA_DROPOUT_SCALE) && !a.has(FS_SDPA_DROPOUT_SCALE_INV),
                 "dropout: mask/scale tensors given without the mask form");
  }
  if (a.has(FS_SDPA_RNG_DUMP)) {
    FS_CHECK_ARG(p.dropout, "rng_dump: needs Philox dropout (dropout = (probability, seed, offset))");
    const TensorView& d = a.t(FS_SDPA_RNG_DUMP);
    FS_CHECK_TYPE(d.dtype == DType::kUInt8 || is_float(d.dtype), "rng_dump: dtype must be uint8 or a float type, got ",
                  dtype_name(d.dtype));
    FS_CHECK_ARG(d.ndim == 4 && d.size(0) == p.B && d.size(1) == p.Hq && d.size(2) == p.Sq && d.size(3) == p.Skv,
                 "rng_dump: shape must be [B, H_q, S_q, ", p.paged ? "paged_attention_max_seq_len_kv" : "S_kv", "] = ",
                 shape_of({p.B, p.Hq, p.Sq, p.Skv}), ", got ", d.shape_str());
    c.same_device(FS_SDPA_RNG_DUMP);
    c.last_dim_contiguous(FS_SDPA_RNG_DUMP);
  }

  if (a.has(FS_SDPA_GATE)) c.exact(FS_SDPA_GATE, {p.B, p.Hq, p.Sq, p.Dv}, q.dtype, "shape of O, dtype of q");
}

}  // namespace

const char* slot_name(int slot) {
  switch (slot) {
    case FS_SDPA_Q: return "q";
    case FS_SDPA_K: return "k";
    case FS_SDPA_V: return "v";
    case FS_SDPA_O: return "o";
    case FS_SDPA_STATS: return "stats";
    case FS_SDPA_DO: return "dO";
    case FS_SDPA_DQ: return "dQ";
    case FS_SDPA_DK: return "dK";
    case FS_SDPA_DV: return "dV";
    case FS_SDPA_SCORE_MAX: return "score_max";
    case FS_SDPA_SCORE_SUM_EXP: return "score_sum_exp";
    case FS_SDPA_MAX_LOGIT: return "max_logit";
    case FS_SDPA_ATTN_SCALE: return "attn_scale";
    case FS_SDPA_BIAS: return "bias";
    case FS_SDPA_DBIAS: return "dBias";
    case FS_SDPA_BLOCK_MASK: return "block_mask";
    case FS_SDPA_SEQ_LEN_Q: return "seq_len_q";
    case FS_SDPA_SEQ_LEN_KV: return "seq_len_kv";
    case FS_SDPA_CU_SEQ_LEN_Q: return "cu_seq_len_q";
    case FS_SDPA_CU_SEQ_LEN_KV: return "cu_seq_len_kv";
    case FS_SDPA_PAGE_TABLE_K: return "paged_attention_k_table";
    case FS_SDPA_PAGE_TABLE_V: return "paged_attention_v_table";
    case FS_SDPA_SINK_TOKEN: return "sink_token";
    case FS_SDPA_DSINK_TOKEN: return "dSink_token";
    case FS_SDPA_DROPOUT_SEED: return "dropout seed";
    case FS_SDPA_DROPOUT_OFFSET: return "dropout offset";
    case FS_SDPA_DROPOUT_MASK: return "dropout mask";
    case FS_SDPA_DROPOUT_SCALE: return "dropout scale";
    case FS_SDPA_DROPOUT_SCALE_INV: return "dropout scale_inv";
    case FS_SDPA_RNG_DUMP: return "rng_dump";
    case FS_SDPA_GATE: return "gate";
    case FS_SDPA_DGATE: return "dgate";
    case FS_SDPA_RAGGED_OFFSET_Q: return "ragged offset of q";
    case FS_SDPA_RAGGED_OFFSET_K: return "ragged offset of k";
    case FS_SDPA_RAGGED_OFFSET_V: return "ragged offset of v";
    case FS_SDPA_RAGGED_OFFSET_O: return "ragged offset of o";
    case FS_SDPA_RAGGED_OFFSET_STATS: return "ragged offset of stats";
    case FS_SDPA_RAGGED_OFFSET_DO: return "ragged offset of dO";
    case FS_SDPA_RAGGED_OFFSET_DQ: return "ragged offset of dQ";
    case FS_SDPA_RAGGED_OFFSET_DK: return "ragged offset of dK";
    case FS_SDPA_RAGGED_OFFSET_DV: return "ragged offset of dV";
    case FS_SDPA_RAGGED_OFFSET_PAGE_TABLE_K: return "ragged offset of paged_attention_k_table";
    case FS_SDPA_RAGGED_OFFSET_PAGE_TABLE_V: return "ragged offset of paged_attention_v_table";
    case FS_SDPA_RAGGED_OFFSET_GATE: return "ragged offset of gate";
    case FS_SDPA_RAGGED_OFFSET_DGATE: return "ragged offset of dgate";
    case FS_SDPA_DESCALE_Q: return "descale_q";
    case FS_SDPA_DESCALE_K: return "descale_k";
    case FS_SDPA_DESCALE_V: return "descale_v";
    case FS_SDPA_DESCALE_S: return "descale_s";
    case FS_SDPA_SCALE_S: return "scale_s";
    case FS_SDPA_SCALE_O: return "scale_o";
    case FS_SDPA_AMAX_S: return "amax_s";
    case FS_SDPA_AMAX_O: return "amax_o";
    case FS_SDPA_DESCALE_O: return "descale_o";
    case FS_SDPA_DESCALE_DO: return "descale_dO";
    case FS_SDPA_DESCALE_DP: return "descale_dP";
    case FS_SDPA_SCALE_DQ: return "scale_dQ";
    case FS_SDPA_SCALE_DK: return "scale_dK";
    case FS_SDPA_SCALE_DV: return "scale_dV";
    case FS_SDPA_SCALE_DP: return "scale_dP";
    case FS_SDPA_AMAX_DQ: return "amax_dQ";
    case FS_SDPA_AMAX_DK: return "amax_dK";
    case FS_SDPA_AMAX_DV: return "amax_dV";
    case FS_SDPA_AMAX_DP: return "amax_dP";
    default: return "(unknown slot)";
  }
}

bool is_fp8_amax_slot(int slot) {
  return slot == FS_SDPA_AMAX_S || slot == FS_SDPA_AMAX_O || (slot >= FS_SDPA_AMAX_DQ && slot <= FS_SDPA_AMAX_DP);
}

int ragged_slot_of(int slot) {
  switch (slot) {
    case FS_SDPA_Q: return FS_SDPA_RAGGED_OFFSET_Q;
    case FS_SDPA_K: return FS_SDPA_RAGGED_OFFSET_K;
    case FS_SDPA_V: return FS_SDPA_RAGGED_OFFSET_V;
    case FS_SDPA_O: return FS_SDPA_RAGGED_OFFSET_O;
    case FS_SDPA_STATS: return FS_SDPA_RAGGED_OFFSET_STATS;
    case FS_SDPA_DO: return FS_SDPA_RAGGED_OFFSET_DO;
    case FS_SDPA_DQ: return FS_SDPA_RAGGED_OFFSET_DQ;
    case FS_SDPA_DK: return FS_SDPA_RAGGED_OFFSET_DK;
    case FS_SDPA_DV: return FS_SDPA_RAGGED_OFFSET_DV;
    case FS_SDPA_PAGE_TABLE_K: return FS_SDPA_RAGGED_OFFSET_PAGE_TABLE_K;
    case FS_SDPA_PAGE_TABLE_V: return FS_SDPA_RAGGED_OFFSET_PAGE_TABLE_V;
    case FS_SDPA_GATE: return FS_SDPA_RAGGED_OFFSET_GATE;
    case FS_SDPA_DGATE: return FS_SDPA_RAGGED_OFFSET_DGATE;
    default: return -1;
  }
}

bool Problem::ragged(int slot) const {
  const int r = ragged_slot_of(slot);
  return r >= 0 && has(r);
}

int64_t Problem::ragged_multiplier(int slot) const {
  const int r = ragged_slot_of(slot);
  return r >= 0 && a.ragged_multiplier[r] > 0 ? a.ragged_multiplier[r] : 1;
}

void Problem::bind(void* const* pack, int32_t num_slots) {
  FS_CHECK_ARG(pack != nullptr, "variant_pack: is NULL");
  FS_CHECK_ARG(num_slots == kNumSlots, "variant_pack: has ", num_slots, " slots, FS_SDPA_NUM_SLOTS is ", kNumSlots,
               " (the caller was built against another header version)");
  for (int s = 0; s < kNumSlots; ++s) {
    TensorView& t = a.tensors[s];
    if (!t.defined()) {
      FS_CHECK_ARG(pack[s] == nullptr, slot_name(s), ": a data pointer was given but the tensor was not part of the "
                   "operation's attributes");
      continue;
    }
    // An empty tensor may come without memory; so may a packed (ragged) one whose samples are all
    // empty (read_runtime_host checks that).
    FS_CHECK_ARG(pack[s] != nullptr || t.numel() == 0 || ragged(s), slot_name(s), ": data pointer is NULL");
    t.data = pack[s] == nullptr ? nullptr : static_cast<char*>(pack[s]) + a.byte_offset[s];
    // The reference and the kernels access elements as their type: a misaligned start is
    // undefined behaviour on the CPU and a fault on the GPU.
    const int item = dtype_size(t.dtype);
    FS_CHECK_ARG(t.data == nullptr || reinterpret_cast<uintptr_t>(t.data) % item == 0, slot_name(s),
                 ": data pointer (variant_pack pointer + byte_offset) must be aligned to the element size (", item,
                 " bytes for ", dtype_name(t.dtype), ")");
  }
  // dBias is written (on the GPU, cleared and stored into by the main kernel in the sm90 backward's direct form) while
  // the backward's inputs are still read: its memory must not meet theirs (packed THD tensors, whose samples the
  // offsets place, are not compared).
  if (a.backward && a.tensors[FS_SDPA_DBIAS].defined()) {
    for (int s : {FS_SDPA_BIAS, FS_SDPA_Q, FS_SDPA_K, FS_SDPA_V, FS_SDPA_O, FS_SDPA_DO, FS_SDPA_STATS, FS_SDPA_GATE,
                  FS_SDPA_SINK_TOKEN}) {
      if (a.tensors[s].defined() && !ragged(s)) {
        check_no_overlap(a.tensors[FS_SDPA_DBIAS], slot_name(FS_SDPA_DBIAS), a.tensors[s], slot_name(s),
                         "the backward writes dBias while it still reads its inputs");
      }
    }
  }
}

namespace {

// Every element of an output is its own memory: a zero or interleaving stride would make several
// results land in one element (all but one lost). Packed (ragged) outputs skip the batch
// dimension, which their offsets address.
void check_outputs_disjoint(const Problem& p, std::initializer_list<int> slots) {
  for (int s : slots) {
    if (p.has(s)) check_no_self_overlap(p.t(s), slot_name(s), p.ragged(s) ? 1 : 0);
  }
}

}  // namespace

Problem validate_forward(const Attributes& attrs) {
  FS_CHECK_ARG(!attrs.backward, "attributes: were created for the backward pass, the forward needs forward attributes");
  Problem p;
  p.a = attrs;
  const Attributes& a = p.a;
  FS_CHECK_ARG(a.has(FS_SDPA_Q), "q: is required");
  const Checker c{a, a.t(FS_SDPA_Q)};
  for (int s : {FS_SDPA_DO, FS_SDPA_DQ, FS_SDPA_DK, FS_SDPA_DV, FS_SDPA_DBIAS, FS_SDPA_DSINK_TOKEN, FS_SDPA_DGATE})
    FS_CHECK_ARG(!a.has(s), slot_name(s), ": is a backward tensor");
  check_common(p, c);

  const bool stats = a.has(FS_SDPA_STATS);
  if (a.generate_stats.has_value()) {
    FS_CHECK_ARG(*a.generate_stats == stats, "stats: generate_stats is ", *a.generate_stats ? "set" : "false",
                 " but a stats tensor was ", stats ? "given" : "not given");
  }
  if (stats) c.exact(FS_SDPA_STATS, {p.B, p.Hq, p.Sq, 1}, DType::kFloat32, "softmax stats [B, H_q, S_q, 1], float32");
  for (int s : {FS_SDPA_SCORE_MAX, FS_SDPA_SCORE_SUM_EXP}) {
    if (a.has(s)) c.exact(s, {p.B, p.Hq, p.Sq, 1}, DType::kFloat32, "[B, H_q, S_q, 1], float32");
  }
  if (a.has(FS_SDPA_MAX_LOGIT)) {
    with_bshd_hint(a, a.t(FS_SDPA_MAX_LOGIT).numel() == a.t(FS_SDPA_Q).size(2),
                   [&] { c.small(FS_SDPA_MAX_LOGIT, p.Hq, false, "one value per query head"); });
  }
  check_outputs_disjoint(p, {FS_SDPA_O, FS_SDPA_STATS, FS_SDPA_SCORE_MAX, FS_SDPA_SCORE_SUM_EXP, FS_SDPA_RNG_DUMP});
  return p;
}

Problem validate_backward(const Attributes& attrs) {
  FS_CHECK_ARG(attrs.backward, "attributes: were created for the forward pass, the backward needs backward attributes");
  Problem p;
  p.a = attrs;
  const Attributes& a = p.a;
  FS_CHECK_ARG(a.has(FS_SDPA_Q), "q: is required");
  const Checker c{a, a.t(FS_SDPA_Q)};
  for (int s : {FS_SDPA_SCORE_MAX, FS_SDPA_SCORE_SUM_EXP, FS_SDPA_MAX_LOGIT})
    FS_CHECK_ARG(!a.has(s), slot_name(s), ": is a forward output");
  check_common(p, c);
  const DType io = p.dtype;
  for (int s : {FS_SDPA_DO, FS_SDPA_STATS, FS_SDPA_DQ, FS_SDPA_DK, FS_SDPA_DV})
    FS_CHECK_ARG(a.has(s), slot_name(s), ": is required for the backward pass");
  if (p.fp8) {
    // dO and the gradients have FP8 formats of their own (dQ, dK, dV one; e.g. E5M2 gradients of E4M3 inputs).
    const DType grad = fp8_or(a.t(FS_SDPA_DQ).dtype, io);
    c.exact(FS_SDPA_DO, {p.B, p.Hq, p.Sq, p.Dv}, fp8_or(a.t(FS_SDPA_DO).dtype, io), "[B, H_q, S_q, D_v], an FP8 format");
    c.exact(FS_SDPA_DQ, {p.B, p.Hq, p.Sq, p.Dqk}, grad, "shape of q, an FP8 format");
    c.exact(FS_SDPA_DK, {p.B, p.Hk, p.Skv, p.Dqk}, grad, "shape of k, dQ's FP8 format");
    c.exact(FS_SDPA_DV, {p.B, p.Hv, p.Skv, p.Dv}, grad, "shape of v, dQ's FP8 format");
  } else {
    c.exact(FS_SDPA_DO, {p.B, p.Hq, p.Sq, p.Dv}, io, "[B, H_q, S_q, D_v], dtype of q");
    c.exact(FS_SDPA_DQ, {p.B, p.Hq, p.Sq, p.Dqk}, io, "shape of q");
    c.exact(FS_SDPA_DK, {p.B, p.Hk, p.Skv, p.Dqk}, io, "shape of k");
    c.exact(FS_SDPA_DV, {p.B, p.Hv, p.Skv, p.Dv}, io, "shape of v");
  }
  c.exact(FS_SDPA_STATS, {p.B, p.Hq, p.Sq, 1}, DType::kFloat32, "the forward's natural-log stats [B, H_q, S_q, 1]");
  if (a.has(FS_SDPA_DBIAS)) {
    FS_CHECK_ARG(a.has(FS_SDPA_BIAS), "dBias: needs the bias of the forward (set bias)");
    const TensorView& b = a.t(FS_SDPA_BIAS);
    const TensorView& d = a.t(FS_SDPA_DBIAS);
    FS_CHECK_TYPE(is_float(d.dtype) && (d.dtype != DType::kFloat64 || io == DType::kFloat64),
                  "dBias: dtype must be float16, bfloat16 or float32, got ", dtype_name(d.dtype));
    c.same_device(FS_SDPA_DBIAS);
    FS_CHECK_ARG(d.ndim == 4 && d.size(0) == b.size(0) && d.size(1) == b.size(1) && d.size(2) == b.size(2) &&
                     d.size(3) == b.size(3),
                 "dBias: shape must equal bias's ", b.shape_str(), " (it is reduced over bias's broadcast dims), got ",
                 d.shape_str());
    c.last_dim_contiguous(FS_SDPA_DBIAS);
  }
  if (a.has(FS_SDPA_DSINK_TOKEN)) {
    FS_CHECK_ARG(a.has(FS_SDPA_SINK_TOKEN), "dSink_token: requires sink_token to be provided");
    c.small(FS_SDPA_DSINK_TOKEN, p.Hq, false, "one gradient per query head", p.dtype == DType::kFloat64);
  }
  if (a.has(FS_SDPA_DGATE)) {
    FS_CHECK_ARG(a.has(FS_SDPA_GATE), "dgate: requires the gate of the forward (set gate)");
    c.exact(FS_SDPA_DGATE, {p.B, p.Hq, p.Sq, p.Dv}, io, "shape of gate, dtype of q");
  }
  check_outputs_disjoint(p, {FS_SDPA_DQ, FS_SDPA_DK, FS_SDPA_DV, FS_SDPA_DBIAS, FS_SDPA_DGATE});
  return p;
}

// ---------------------------------------------------------------------------
// Runtime values (host)
// ---------------------------------------------------------------------------

namespace {

int64_t read_index(const TensorView& t, int64_t i) {
  return t.dtype == DType::kInt32 ? static_cast<int64_t>(t.ptr<const int32_t>()[i]) : t.ptr<const int64_t>()[i];
}

float read_float(const TensorView& t) {
  switch (t.dtype) {
    case DType::kFloat32: return *t.ptr<const float>();
    case DType::kFloat64: return static_cast<float>(*t.ptr<const double>());
    case DType::kFloat16: return half_bits_to_float(*t.ptr<const uint16_t>());
    case DType::kBFloat16: return bf16_bits_to_float(*t.ptr<const uint16_t>());
    default: throw Error(Status::kInternal, "sdpa: unexpected dtype of a scalar tensor");
  }
}

// A scalar float tensor's value (host memory), checked finite.
float finite_float(const Problem& p, int slot) {
  const float s = read_float(p.t(slot));
  FS_CHECK_ARG(std::isfinite(s), slot_name(slot), ": must be finite, got ", s);
  return s;
}

// max_name: what bounds the lengths ("S_q"); why: appended to the message (the paged capacity's rule), or "".
std::vector<int64_t> read_lengths(const Problem& p, int seq_slot, int cu_slot, int64_t max_len, const char* max_name,
                                  const std::string& why = "") {
  std::vector<int64_t> len(p.B, max_len);
  if (p.has(seq_slot)) {
    const TensorView& t = p.t(seq_slot);
    for (int64_t b = 0; b < p.B; ++b) {
      len[b] = read_index(t, b);
      if (len[b] >= 0 && len[b] <= max_len) continue;
      // With q, k, v in BSHD order, S is dim 1 (q's for the Q side, k's for the KV side).
      const int64_t bshd_s = p.t(seq_slot == FS_SDPA_SEQ_LEN_Q ? FS_SDPA_Q : FS_SDPA_K).size(1);
      FS_CHECK_ARG(false, slot_name(seq_slot), ": sample ", b, " has length ", len[b], ", outside [0, ", max_name, " = ",
                   max_len, "]", len[b] >= 0 ? why : std::string(), bshd_hint(p.a, len[b] >= 0 && len[b] <= bshd_s));
    }
  } else if (p.has(cu_slot)) {
    const TensorView& t = p.t(cu_slot);
    FS_CHECK_ARG(read_index(t, 0) == 0, slot_name(cu_slot), ": must start at 0 (prefix sums), got ", read_index(t, 0));
    for (int64_t b = 0; b < p.B; ++b) {
      FS_CHECK_ARG(!__builtin_sub_overflow(read_index(t, b + 1), read_index(t, b), &len[b]) && len[b] >= 0,
                   slot_name(cu_slot), ": must be nondecreasing, but [", b + 1, "] = ",
                   read_index(t, b + 1), " < [", b, "] = ", read_index(t, b));
      FS_CHECK_ARG(len[b] <= max_len, slot_name(cu_slot), ": sample ", b, " has length ", len[b], ", longer than ",
                   max_name, " = ", max_len, why);
    }
  }
  return len;
}

}  // namespace

Runtime read_runtime_host(const Problem& p) {
  Runtime rt;
  rt.len_q = read_lengths(p, FS_SDPA_SEQ_LEN_Q, FS_SDPA_CU_SEQ_LEN_Q, p.Sq, "S_q");
  if (p.paged && !p.a.paged_max_seq_len_kv && p.has(table_of(FS_SDPA_K)) && p.has(table_of(FS_SDPA_V))) {
    // S_kv is the page tables' capacity: name its rule.
    rt.len_kv = read_lengths(p, FS_SDPA_SEQ_LEN_KV, FS_SDPA_CU_SEQ_LEN_KV, p.Skv, "S_kv",
                             ": with paged K/V a sample's length must be <= the page tables' capacity, " +
                                 paged_capacity(p.a).rule());
  } else {
    rt.len_kv = read_lengths(p, FS_SDPA_SEQ_LEN_KV, FS_SDPA_CU_SEQ_LEN_KV, p.Skv,
                             p.paged && p.a.paged_max_seq_len_kv ? "paged_attention_max_seq_len_kv" : "S_kv");
  }
  auto check_total = [](const std::vector<int64_t>& len, const std::optional<int64_t>& bound, const char* name) {
    if (!bound) return;
    int64_t total = 0;
    for (int64_t l : len) total += l;
    FS_CHECK_ARG(total <= *bound, name, ": the samples hold ", total, " tokens, more than the declared ", *bound);
  };
  check_total(rt.len_q, p.a.max_total_seq_len_q, "max_total_seq_len_q");
  check_total(rt.len_kv, p.a.max_total_seq_len_kv, "max_total_seq_len_kv");
  for (int s = 0; s < kNumSlots; ++s) {
    if (!p.has(s) || ragged_slot_of(s) < 0) continue;
    std::vector<int64_t>& start = rt.row_start[s];
    start.resize(p.B);
    if (p.ragged(s)) {
      const int r = ragged_slot_of(s);
      const int64_t mult = p.ragged_multiplier(s);
      for (int64_t b = 0; b < p.B; ++b) {
        const int64_t o = read_index(p.t(r), b);
        FS_CHECK_ARG(o >= 0, slot_name(r), ": entry ", b, " = ", o, " is negative");
        FS_CHECK_ARG(!__builtin_mul_overflow(o, mult, &start[b]), slot_name(r), ": entry ", b, " = ", o, " times the multiplier ",
                     mult, " overflows int64");
      }
    } else {
      for (int64_t b = 0; b < p.B; ++b) start[b] = b * p.t(s).stride(0);
    }
  }
  for (int s = 0; s < kNumSlots; ++s) {
    if (!p.has(s) || !p.ragged(s) || p.t(s).data != nullptr || s == FS_SDPA_PAGE_TABLE_K || s == FS_SDPA_PAGE_TABLE_V)
      continue;
    bool q_side = false;
    for (int qs : kQSide) q_side |= qs == s;
    for (int64_t l : q_side ? rt.len_q : rt.len_kv)
      FS_CHECK_ARG(l == 0, slot_name(s), ": data pointer is NULL but its samples are not all empty");
  }
  // Page tables: every page a sample uses must exist in its container.
  for (int side = 0; side < 2; ++side) {
    const int table = side == 0 ? FS_SDPA_PAGE_TABLE_K : FS_SDPA_PAGE_TABLE_V;
    if (!p.has(table)) continue;
    const TensorView& pt = p.t(table);
    const int64_t bs = side == 0 ? p.page_size_k : p.page_size_v;
    const int64_t blocks = p.t(side == 0 ? FS_SDPA_K : FS_SDPA_V).size(0);
    for (int64_t b = 0; b < p.B; ++b) {
      const int64_t pages = (rt.len_kv[b] + bs - 1) / bs;
      for (int64_t pg = 0; pg < pages; ++pg) {
        const int64_t e = pt.ptr<const int32_t>()[rt.row_start[table][b] + pg * pt.stride(2)];
        FS_CHECK_ARG(e >= 0 && e < blocks, slot_name(table), ": entry (batch ", b, ", page ", pg, ") = ", e,
                     " is outside the container's [0, ", blocks, ") blocks");
      }
    }
  }
  rt.attn_scale = p.has(FS_SDPA_ATTN_SCALE) ? finite_float(p, FS_SDPA_ATTN_SCALE) : p.a.attn_scale_value.value_or(1.0f);
  rt.factor.fill(1.0);
  for (int s = kFirstFp8Slot; s < kNumSlots; ++s) {
    if (p.has(s) && !is_fp8_amax_slot(s)) rt.factor[s] = finite_float(p, s);
  }
  if (p.dropout) {
    rt.dropout_seed = static_cast<uint64_t>(read_index(p.t(FS_SDPA_DROPOUT_SEED), 0));
    rt.dropout_offset = static_cast<uint64_t>(read_index(p.t(FS_SDPA_DROPOUT_OFFSET), 0));
  }
  if (p.has(FS_SDPA_DROPOUT_SCALE)) rt.dropout_mask_scale = read_float(p.t(FS_SDPA_DROPOUT_SCALE));
  if (p.has(FS_SDPA_SINK_TOKEN)) {
    const TensorView& t = p.t(FS_SDPA_SINK_TOKEN);
    rt.sinks.resize(p.Hq);
    for (int64_t h = 0; h < p.Hq; ++h)
      rt.sinks[h] = t.dtype == DType::kFloat64 ? t.ptr<const double>()[h] : t.ptr<const float>()[h];
  }
  return rt;
}

float host_attn_scale(const Problem& p) {
  if (!p.has(FS_SDPA_ATTN_SCALE)) return p.a.attn_scale_value.value_or(1.0f);
  return host_scalar(p, FS_SDPA_ATTN_SCALE);
}

float host_scalar(const Problem& p, int slot) {
  const TensorView& t = p.t(slot);
  FS_CHECK_ARG(t.device == DeviceType::kCPU, slot_name(slot), ": a tensor in device memory cannot be read on the host");
  FS_CHECK_ARG(t.data != nullptr, slot_name(slot), ": data pointer is NULL");
  return finite_float(p, slot);
}

std::vector<EmptyBatchFill> empty_batch_fills(const Problem& p) {
  std::vector<EmptyBatchFill> fills;
  if (!p.empty_batch()) return fills;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  auto add = [&](int slot, float value) {
    if (p.has(slot) && p.t(slot).numel() > 0) fills.push_back({slot, value});
  };
  add(FS_SDPA_MAX_LOGIT, kNegInf);
  add(FS_SDPA_DSINK_TOKEN, 0.0f);
  add(FS_SDPA_DBIAS, 0.0f);
  for (int s : {FS_SDPA_AMAX_S, FS_SDPA_AMAX_O, FS_SDPA_AMAX_DQ, FS_SDPA_AMAX_DK, FS_SDPA_AMAX_DV, FS_SDPA_AMAX_DP})
    add(s, 0.0f);
  return fills;
}

float alibi_slope(int64_t h, int64_t num_heads) {
  int64_t n = 1;
  while (n * 2 <= num_heads) n *= 2;
  const double e = h < n ? -8.0 * static_cast<double>(h + 1) / static_cast<double>(n)
                         : -4.0 * static_cast<double>(2 * (h - n) + 1) / static_cast<double>(n);
  return static_cast<float>(std::exp2(e));
}

}  // namespace flashspan::sdpa
