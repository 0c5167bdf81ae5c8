// libFuzzer target: the SDPA forward and backward operations of the C ABI (attributes ->
// create -> check_support -> compile -> workspace_size -> execute) on CPU tensors.
//
// Each input decodes to a small problem (B <= 3, S <= 12, head dims 8..32, GQA groups) and a
// random subset of the options: scale (float or tensor, finite or not), bias broadcasts, ALiBi,
// softcap, sinks, output gate, block mask, padding with per-sample or cumulative lengths,
// packed (ragged) Q and KV sides with gaps, paged K/V (forward), diagonal alignment and band
// bounds (huge and negative included), Philox or mask dropout, rng_dump, the statistics
// outputs, deterministic; tensors in BHSD, BSHD or padded-strided layouts. With "break" on,
// a fuzzer-chosen slot is broken in one way (NULL, dtype, device, rank, an extent, strides,
// a misaligned variant-pack pointer) and setters get arbitrary values.
// Invariants: no crash / sanitizer report / hang; every failure has a known status and a
// message naming the argument; execute() after a successful create + compile fails only for
// the runtime values (lengths, offsets, page entries, scale tensor) or the pointers; a call
// that succeeds wrote every element of its NaN-poisoned float32 outputs (padding rows
// included) and never an output that overlaps itself; a float32 forward without Philox
// dropout matches a float64 computation written here (O, stats, row max, sum of exp, per-head
// max logit).
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "fuzz_common.h"

using namespace fsfuzz;

namespace {

constexpr uint32_t kPoison = 0x7fa5a5a5u;

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Slot {
  Tensor t;
  bool bound = false;
  bool output = false;
  bool ragged = false;     // packed: rows of sample b start at offsets[b] * row_stride
  int64_t rows_stride = 0; // element stride between tokens of a packed tensor
  std::vector<int64_t> offsets;
  std::vector<int64_t> offsets_mem;  // what the offsets tensor holds (int64)
  Tensor offs;
  void* pack = nullptr;    // variant-pack pointer
  const fs_tensor_t* desc() { return bound ? t.get() : nullptr; }
  float* f32() { return static_cast<float*>(t.t.data); }
};

// Element offset of (b, h, s, d) in a slot (dense strides or packed rows).
int64_t at(const Slot& s, int64_t b, int64_t h, int64_t i, int64_t d) {
  const auto& st = s.t.strides;
  if (s.ragged) return s.offsets[size_t(b)] * s.rows_stride + h * st[1] + i * st[2] + d * st[3];
  return b * st[0] + h * st[1] + i * st[2] + d * st[3];
}

fs_dtype_t f32() { return dtype(kF32); }

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
    case FS_SDPA_GATE: return FS_SDPA_RAGGED_OFFSET_GATE;
    case FS_SDPA_DGATE: return FS_SDPA_RAGGED_OFFSET_DGATE;
    default: return -1;
  }
}

struct Problem {
  int64_t B, Hq, Hk, Hv, Sq, Skv, Dqk, Dv;
  bool backward;
  fs_dtype_t io;
};

// Layout of a logical [B, H, S, D] tensor: compact BHSD, BSHD, or padded strides.
std::vector<int64_t> layout(FuzzedDataProvider& f, int64_t B, int64_t H, int64_t S, int64_t D) {
  switch (f.ConsumeIntegralInRange(0, 3)) {
    case 1: return {S * H * D, D, H * D, 1};
    case 2: return {H * (S + 1) * (D + 8), (S + 1) * (D + 8), D + 8, 1};
    default: (void)B; return {};
  }
}

void poison(Tensor& t) {
  if (t.t.data == nullptr || t.t.dtype.code != FS_DTYPE_FLOAT || t.t.dtype.bits != 32) return;
  for (size_t i = 0; i + 4 <= t.mem.size(); i += 4) std::memcpy(&t.mem[i], &kPoison, 4);
}

bool is_poison(const float* p) {
  uint32_t x;
  std::memcpy(&x, p, 4);
  return x == kPoison;
}

// How often inputs reach each stage (printed at exit when FSFUZZ_STATS is set): a harness whose
// inputs never get past validation would check nothing.
struct Stats {
  long inputs = 0, created = 0, executed = 0, value_checked = 0, value_checked_alibi = 0;
  ~Stats() {
    if (std::getenv("FSFUZZ_STATS"))
      std::fprintf(stderr, "fuzz_sdpa stats: %ld inputs, %ld created, %ld executed, %ld value-checked (%ld with ALiBi)\n",
                   inputs, created, executed, value_checked, value_checked_alibi);
  }
};
Stats g_stats;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider f(data, size);
  ++g_stats.inputs;
  Problem P{};
  P.backward = f.ConsumeBool();
  // Choices are arranged so that an exhausted input (FuzzedDataProvider then returns the range
  // minimum) still decodes to a rich, valid problem: B = 2, GQA, S_q = 5, S_kv = 7, float32, bias,
  // causal ALiBi, softcap, sinks, gate, block mask, stats.
  const bool brk = f.ConsumeIntegralInRange(0, 3) == 3;  // break one thing
  P.B = 1 + (f.ConsumeIntegralInRange<int64_t>(0, 2) + 1) % 3;
  P.Hk = f.ConsumeIntegralInRange<int64_t>(1, 2);
  P.Hq = P.Hk * (1 + (f.ConsumeIntegralInRange<int64_t>(0, 2) + 1) % 3);
  P.Hv = f.ConsumeBool() ? P.Hk : (f.ConsumeBool() ? P.Hq : 1);
  static const int64_t kDims[] = {8, 16, 24, 32};
  P.Dqk = kDims[(f.ConsumeIntegralInRange(0, 3) + 1) % 4];
  P.Dv = f.ConsumeBool() ? P.Dqk : kDims[f.ConsumeIntegralInRange(0, 3)];
  P.Sq = (f.ConsumeIntegralInRange<int64_t>(0, 12) + 5) % 13;
  P.Skv = (f.ConsumeIntegralInRange<int64_t>(0, 12) + 7) % 13;
  const int dsel = f.ConsumeIntegralInRange(0, 7);
  P.io = dsel == 5 ? dtype(kF16) : dsel == 6 ? dtype(kBF16) : dsel == 7 ? dtype(kF64) : f32();
  const bool io32 = P.io.code == FS_DTYPE_FLOAT && P.io.bits == 32;

  // --- sequence lengths, packing, paging --------------------------------------------------
  const bool padding = f.ConsumeBool();
  const bool rag_q = padding && f.ConsumeIntegralInRange(0, 2) == 0;
  const bool rag_kv = padding && f.ConsumeIntegralInRange(0, 2) == 0;
  const bool paged = !P.backward && padding && !rag_kv && f.ConsumeIntegralInRange(0, 3) == 0;
  std::vector<int64_t> len_q(size_t(P.B), P.Sq), len_kv(size_t(P.B), P.Skv);
  if (padding) {
    for (auto& l : len_q) l = P.Sq - f.ConsumeIntegralInRange<int64_t>(0, P.Sq);
    for (auto& l : len_kv) l = P.Skv - f.ConsumeIntegralInRange<int64_t>(0, P.Skv);
  }
  // Token offsets of a packed side (prefix sums with optional gaps).
  auto token_offsets = [&](const std::vector<int64_t>& len) {
    std::vector<int64_t> off;
    int64_t pos = 0;
    for (int64_t l : len) {
      pos += f.ConsumeIntegralInRange<int64_t>(0, 1);
      off.push_back(pos);
      pos += l;
    }
    off.push_back(pos);
    return off;
  };
  const std::vector<int64_t> off_q = rag_q ? token_offsets(len_q) : std::vector<int64_t>{};
  const std::vector<int64_t> off_kv = rag_kv ? token_offsets(len_kv) : std::vector<int64_t>{};

  std::unique_ptr<Slot[]> slots(new Slot[FS_SDPA_NUM_SLOTS]);
  auto S = [&](int slot) -> Slot& { return slots[size_t(slot)]; };
  uint32_t seed = 1;
  // With "break": one fuzzer-chosen slot is broken right after it is made, before any setter or
  // create copies its descriptor (modes 5 and 6 act on the variant-pack pointer instead).
  const int broken = brk ? f.ConsumeIntegralInRange(0, FS_SDPA_NUM_SLOTS - 1) : -1;
  const int bmode = brk ? f.ConsumeIntegralInRange(0, 6) : -1;
  bool null_pointer = false;
  auto maybe_break = [&](int slot) {
    if (slot != broken) return;
    Slot& s = S(slot);
    if (!s.bound || s.ragged || s.t.t.data == nullptr) return;
    // A new dtype or extent gets memory for its new extent (the library may accept it).
    auto remake = [&](fs_dtype_t dt, std::vector<int64_t> shape) {
      std::vector<int64_t> strides = s.t.strided ? s.t.strides : std::vector<int64_t>{};
      if (strides.size() != shape.size()) strides.clear();
      s.t.make(dt, shape, strides, size_t(1) << 22, seed++);
      if (s.output) poison(s.t);
    };
    switch (bmode) {
      case 0: remake(dtype(f.ConsumeIntegralInRange(0, int(kBad))), s.t.shape); break;
      case 1: s.t.t.device = {FS_DEVICE_CUDA, 0}; break;
      case 2: if (s.t.t.ndim > 1) --s.t.t.ndim; break;
      case 3: {
        std::vector<int64_t> shape = s.t.shape;
        if (!shape.empty()) shape[size_t(f.ConsumeIntegralInRange<size_t>(0, shape.size() - 1))] += 1;
        remake(s.t.t.dtype, shape);
        break;
      }
      case 4: {  // a zero stride: reads stay inside the memory, an output overlaps itself
        if (s.t.t.ndim > 0) {
          s.t.strides[size_t(f.ConsumeIntegralInRange(0, s.t.t.ndim - 1))] = 0;
          s.t.t.strides = s.t.strides.data();
        }
        break;
      }
      case 5: s.pack = static_cast<char*>(s.t.t.data) + 1; break;  // misaligned pointer
      default: null_pointer = true; break;                          // a NULL pack pointer for a bound slot
    }
    if (s.t.t.data == nullptr) null_pointer = true;
  };
  // A sequence tensor [B, H, Sd, D] (dense layout or packed rows).
  auto seq = [&](int slot, int64_t H, bool q_side, int64_t D, fs_dtype_t dt, bool output) {
    Slot& s = S(slot);
    s.bound = true;
    s.output = output;
    const bool rag = q_side ? rag_q : rag_kv;
    const int64_t Sd = q_side ? P.Sq : P.Skv;
    if (rag) {
      const auto& off = q_side ? off_q : off_kv;
      s.ragged = true;
      s.offsets = off;
      s.rows_stride = H * D;
      const int64_t T = off.back() + f.ConsumeIntegralInRange<int64_t>(0, 1);
      // memory (T, H, D); descriptor [B, H, Sd, D] with token stride H * D
      Tensor mem;
      s.t.make(dt, {P.B, H, Sd, D}, {0, D, H * D, 1}, 0, 0);  // descriptor only
      s.t.mem.clear();
      mem.make(dt, {std::max<int64_t>(T, 1), H, D}, {}, size_t(1) << 22, seed++);
      s.t.mem = std::move(mem.mem);
      s.t.t.data = s.t.mem.data();
      s.offs.make(dtype(kI64), {P.B + 1}, {}, 1 << 12, 0);
      for (int64_t b = 0; b <= P.B; ++b) *s.offs.at<int64_t>(b) = off[size_t(b)];
    } else {
      s.t.make(dt, {P.B, H, Sd, D}, layout(f, P.B, H, Sd, D), size_t(1) << 22, seed++);
    }
    if (output) poison(s.t);
    maybe_break(slot);
  };

  seq(FS_SDPA_Q, P.Hq, true, P.Dqk, P.io, false);
  int64_t bs_k = 0, bs_v = 0;
  if (paged) {
    for (int side = 0; side < 2; ++side) {
      const int slot = side == 0 ? FS_SDPA_K : FS_SDPA_V;
      const int64_t bs = int64_t(1) << f.ConsumeIntegralInRange(0, 3);
      const int64_t pages = std::max<int64_t>(1, cdiv(P.Skv, bs));
      const int64_t nblocks = f.ConsumeIntegralInRange<int64_t>(1, 2 * pages * P.B);
      Slot& s = S(slot);
      s.bound = true;
      s.t.make(P.io, {nblocks, side == 0 ? P.Hk : P.Hv, bs, side == 0 ? P.Dqk : P.Dv}, {}, size_t(1) << 22, seed++);
      Slot& pt = S(side == 0 ? FS_SDPA_PAGE_TABLE_K : FS_SDPA_PAGE_TABLE_V);
      pt.bound = true;
      pt.t.make(dtype(kI32), {P.B, 1, pages, 1}, {}, 1 << 16, 0);
      const bool wild = brk && f.ConsumeIntegralInRange(0, 3) == 0;
      for (int64_t e = 0; e < P.B * pages; ++e)
        *pt.t.at<int32_t>(e) = wild ? f.ConsumeIntegral<int32_t>() : int32_t(f.ConsumeIntegralInRange<int64_t>(0, nblocks - 1));
      (side == 0 ? bs_k : bs_v) = bs;
      maybe_break(slot);
      maybe_break(side == 0 ? FS_SDPA_PAGE_TABLE_K : FS_SDPA_PAGE_TABLE_V);
    }
  } else {
    seq(FS_SDPA_K, P.Hk, false, P.Dqk, P.io, false);
    seq(FS_SDPA_V, P.Hv, false, P.Dv, P.io, false);
  }
  seq(FS_SDPA_O, P.Hq, true, P.Dv, P.io, !P.backward);
  (void)bs_k;
  (void)bs_v;

  fs_sdpa_attributes_t attr = nullptr;
  if (fs_sdpa_attributes_create(P.backward, &attr) != FS_STATUS_SUCCESS) fail("attributes_create failed");
  auto set = [&](fs_status_t st, const char* what) { check_error(st, what); };

  // --- options ------------------------------------------------------------------------------
  const bool stats = P.backward || !f.ConsumeBool();
  if (stats) {
    Slot& s = S(FS_SDPA_STATS);
    s.bound = true;
    s.output = !P.backward;
    if (rag_q && f.ConsumeBool()) {  // packed (T, H, 1) stats
      s.ragged = true;
      s.offsets = off_q;
      s.rows_stride = P.Hq;
      s.t.make(f32(), {P.B, P.Hq, P.Sq, 1}, {0, 1, P.Hq, 1}, 0, 0);
      Tensor mem;
      mem.make(f32(), {std::max<int64_t>(off_q.back(), 1), P.Hq, 1}, {}, 1 << 20, seed++);
      s.t.mem = std::move(mem.mem);
      s.t.t.data = s.t.mem.data();
      s.offs.make(dtype(kI64), {P.B + 1}, {}, 1 << 12, 0);
      for (int64_t b = 0; b <= P.B; ++b) *s.offs.at<int64_t>(b) = off_q[size_t(b)];
    } else {
      s.t.make(f32(), {P.B, P.Hq, P.Sq, 1}, {}, 1 << 20, seed++);
    }
    if (s.output) poison(s.t);
    maybe_break(FS_SDPA_STATS);
  }
  if (!P.backward && f.ConsumeIntegralInRange(0, 3) == 0)
    set(fs_sdpa_attributes_set_generate_stats(attr, brk ? f.ConsumeIntegralInRange(-1, 2) : stats), "set_generate_stats");
  if (!P.backward && f.ConsumeBool()) set(fs_sdpa_attributes_set_stats_use_log2(attr, 1), "set_stats_use_log2");
  bool want_rowstats = !P.backward && f.ConsumeBool();
  if (want_rowstats) {
    for (int slot : {FS_SDPA_SCORE_MAX, FS_SDPA_SCORE_SUM_EXP}) {
      Slot& s = S(slot);
      s.bound = true;
      s.output = true;
      s.t.make(f32(), {P.B, P.Hq, P.Sq, 1}, {}, 1 << 20, seed++);
      poison(s.t);
      maybe_break(slot);
    }
    set(fs_sdpa_attributes_set_logit_max(attr, S(FS_SDPA_SCORE_MAX).desc()), "set_logit_max");
    set(fs_sdpa_attributes_set_score_sum_exp(attr, S(FS_SDPA_SCORE_SUM_EXP).desc()), "set_score_sum_exp");
  }
  if (!P.backward && f.ConsumeBool()) {
    Slot& s = S(FS_SDPA_MAX_LOGIT);
    s.bound = true;
    s.output = true;
    s.t.make(f32(), {P.Hq}, {}, 1 << 12, seed++);
    poison(s.t);
    maybe_break(FS_SDPA_MAX_LOGIT);
    set(fs_sdpa_attributes_set_max_logit(attr, s.desc()), "set_max_logit");
  }

  // scale
  float scale = 1.0f;
  const int scale_mode = f.ConsumeIntegralInRange(0, 7);
  static const float kScales[] = {0.25f, 0.5f, 0.125f, -0.3f, NAN, INFINITY, 1e30f, 0.0f};
  const float sv = kScales[f.ConsumeIntegralInRange(0, brk ? 7 : 3)];
  if (scale_mode == 1) {
    set(fs_sdpa_attributes_set_attn_scale(attr, sv), "set_attn_scale");
    scale = sv;
  } else if (scale_mode == 2) {
    Slot& s = S(FS_SDPA_ATTN_SCALE);
    s.bound = true;
    s.t.make(f32(), {1}, {}, 64, 0);
    *s.t.at<float>(0) = sv;
    scale = sv;
    maybe_break(FS_SDPA_ATTN_SCALE);
    set(fs_sdpa_attributes_set_attn_scale_tensor(attr, s.desc()), "set_attn_scale_tensor");
  }
  // bias
  std::vector<int64_t> bias_shape;
  if (f.ConsumeIntegralInRange(0, 2) == 0) {
    bias_shape = {f.ConsumeBool() ? 1 : P.B, f.ConsumeBool() ? 1 : P.Hq, f.ConsumeBool() ? 1 : P.Sq,
                  f.ConsumeBool() ? 1 : P.Skv};
    Slot& s = S(FS_SDPA_BIAS);
    s.bound = true;
    s.t.make(f.ConsumeBool() ? f32() : P.io, bias_shape, {}, 1 << 20, seed++);
    maybe_break(FS_SDPA_BIAS);
    set(fs_sdpa_attributes_set_bias(attr, s.desc()), "set_bias");
    if (P.backward && f.ConsumeBool()) {
      Slot& d = S(FS_SDPA_DBIAS);
      d.bound = true;
      d.output = true;
      d.t.make(f32(), bias_shape, {}, 1 << 20, seed++);
      poison(d.t);
      maybe_break(FS_SDPA_DBIAS);
      set(fs_sdpa_attributes_set_dbias(attr, d.desc()), "set_dbias");
    }
  }
  // band
  const int band = f.ConsumeIntegralInRange(0, 7);
  bool has_left = false, has_right = false;
  int64_t left = 0, right = 0;
  auto bound_value = [&](int64_t lo) -> int64_t {
    if (brk && f.ConsumeIntegralInRange(0, 3) == 0) {
      static const int64_t kWild[] = {0, -1, INT64_MAX, INT64_MIN, int64_t(1) << 40};
      return kWild[f.ConsumeIntegralInRange(0, 4)];
    }
    return f.ConsumeIntegralInRange<int64_t>(lo, 14);
  };
  int32_t align = FS_SDPA_TOP_LEFT;
  if (band & 1) {
    right = bound_value(0);
    has_right = true;
    set(fs_sdpa_attributes_set_diagonal_band_right_bound(attr, right), "set_diagonal_band_right_bound");
  }
  if (band & 2) {
    left = bound_value(1);
    has_left = true;
    set(fs_sdpa_attributes_set_diagonal_band_left_bound(attr, left), "set_diagonal_band_left_bound");
  }
  if (band & 4) {
    align = brk && f.ConsumeBool() ? f.ConsumeIntegral<int32_t>() : FS_SDPA_BOTTOM_RIGHT;
    set(fs_sdpa_attributes_set_diagonal_alignment(attr, align), "set_diagonal_alignment");
  }
  if (f.ConsumeIntegralInRange(0, 7) == 0) {  // deprecated spelling
    set(fs_sdpa_attributes_set_causal_mask(attr, 1), "set_causal_mask");
    align = FS_SDPA_TOP_LEFT;
    if (!has_right) has_right = true, right = 0;
  }
  const bool alibi = f.ConsumeIntegralInRange(0, 4) == 0;
  if (alibi) {
    set(fs_sdpa_attributes_set_alibi_mask(attr, 1), "set_alibi_mask");
    if (f.ConsumeIntegralInRange(0, 3) != 0 && !(has_right && right == 0)) {  // mostly the causal band it needs
      right = 0;
      has_right = true;
      set(fs_sdpa_attributes_set_diagonal_band_right_bound(attr, 0), "set_diagonal_band_right_bound");
    }
  }
  float softcap = 0.0f;
  if (f.ConsumeIntegralInRange(0, 3) == 0) {
    static const float kCaps[] = {2.0f, 5.0f, 0.0f, -1.0f, NAN};
    softcap = kCaps[f.ConsumeIntegralInRange(0, brk ? 4 : 1)];
    set(fs_sdpa_attributes_set_softcap(attr, softcap), "set_softcap");
  }
  if (f.ConsumeIntegralInRange(0, 3) == 0) {
    Slot& s = S(FS_SDPA_SINK_TOKEN);
    s.bound = true;
    s.t.make(f32(), {P.Hq}, {}, 1 << 12, seed++);
    maybe_break(FS_SDPA_SINK_TOKEN);
    set(fs_sdpa_attributes_set_sink_token(attr, s.desc()), "set_sink_token");
    if (P.backward && f.ConsumeBool()) {
      Slot& d = S(FS_SDPA_DSINK_TOKEN);
      d.bound = true;
      d.output = true;
      d.t.make(f32(), {P.Hq}, {}, 1 << 12, seed++);
      poison(d.t);
      maybe_break(FS_SDPA_DSINK_TOKEN);
      set(fs_sdpa_attributes_set_dsink_token(attr, d.desc()), "set_dsink_token");
    }
  }
  if (f.ConsumeIntegralInRange(0, 4) == 0) {
    seq(FS_SDPA_GATE, P.Hq, true, P.Dv, P.io, false);
    set(fs_sdpa_attributes_set_gate(attr, S(FS_SDPA_GATE).desc()), "set_gate");
    if (P.backward && f.ConsumeBool()) {
      seq(FS_SDPA_DGATE, P.Hq, true, P.Dv, P.io, true);
      set(fs_sdpa_attributes_set_dgate(attr, S(FS_SDPA_DGATE).desc()), "set_dgate");
    }
  }
  if (f.ConsumeIntegralInRange(0, 5) == 0) {
    Slot& s = S(FS_SDPA_BLOCK_MASK);
    s.bound = true;
    s.t.make(dtype(kU8), {f.ConsumeBool() ? 1 : P.B, f.ConsumeBool() ? 1 : P.Hq, cdiv(P.Sq, 128), cdiv(cdiv(P.Skv, 128), 8)},
             {}, 1 << 12, 0);
    for (size_t i = 0; i < s.t.mem.size(); ++i) s.t.mem[i] = uint8_t(~f.ConsumeIntegral<uint8_t>());
    maybe_break(FS_SDPA_BLOCK_MASK);
    set(fs_sdpa_attributes_set_block_mask(attr, s.desc()), "set_block_mask");
  }
  // dropout
  bool philox = false;
  const int drop = f.ConsumeIntegralInRange(0, 5);
  if (drop == 1) {
    static const float kP[] = {0.0f, 0.3f, 0.5f, 1.0f, -0.1f, NAN};
    const float p = kP[f.ConsumeIntegralInRange(0, brk ? 5 : 2)];
    Slot &sd = S(FS_SDPA_DROPOUT_SEED), &so = S(FS_SDPA_DROPOUT_OFFSET);
    sd.bound = so.bound = true;
    const bool i32 = f.ConsumeBool();
    sd.t.make(dtype(i32 ? kI32 : kI64), {1}, {}, 64, 0);
    so.t.make(dtype(i32 ? kI32 : kI64), {1}, {}, 64, 0);
    const int64_t a = f.ConsumeIntegral<int64_t>(), b = f.ConsumeIntegral<int64_t>();
    if (i32) {
      *sd.t.at<int32_t>(0) = int32_t(a);
      *so.t.at<int32_t>(0) = int32_t(b);
    } else {
      *sd.t.at<int64_t>(0) = a;
      *so.t.at<int64_t>(0) = b;
    }
    maybe_break(FS_SDPA_DROPOUT_SEED);
    maybe_break(FS_SDPA_DROPOUT_OFFSET);
    set(fs_sdpa_attributes_set_dropout(attr, p, sd.desc(), so.desc()), "set_dropout");
    philox = true;
    if (!P.backward && f.ConsumeBool()) {
      Slot& r = S(FS_SDPA_RNG_DUMP);
      r.bound = true;
      r.output = true;
      r.t.make(f32(), {P.B, P.Hq, P.Sq, P.Skv}, {}, 1 << 20, seed++);
      poison(r.t);
      maybe_break(FS_SDPA_RNG_DUMP);
      set(fs_sdpa_attributes_set_rng_dump(attr, r.desc()), "set_rng_dump");
    }
  } else if (drop == 2) {
    Slot &m = S(FS_SDPA_DROPOUT_MASK), &sc = S(FS_SDPA_DROPOUT_SCALE);
    m.bound = sc.bound = true;
    const bool u8 = f.ConsumeBool();
    m.t.make(dtype(u8 ? kU8 : kF32), {f.ConsumeBool() ? 1 : P.B, f.ConsumeBool() ? 1 : P.Hq, f.ConsumeBool() ? 1 : P.Sq,
                                      f.ConsumeBool() ? 1 : P.Skv}, {}, 1 << 20, seed++);
    if (u8)
      for (auto& x : m.t.mem) x = f.ConsumeBool();
    sc.t.make(f32(), {1}, {}, 64, 0);
    *sc.t.at<float>(0) = 1.0f / 0.7f;
    Slot& si = S(FS_SDPA_DROPOUT_SCALE_INV);
    if (P.backward && f.ConsumeBool()) {
      si.bound = true;
      si.t.make(f32(), {1}, {}, 64, 0);
      *si.t.at<float>(0) = 0.7f;
    }
    maybe_break(FS_SDPA_DROPOUT_MASK);
    maybe_break(FS_SDPA_DROPOUT_SCALE);
    maybe_break(FS_SDPA_DROPOUT_SCALE_INV);
    set(fs_sdpa_attributes_set_dropout_mask(attr, m.desc(), sc.desc(), si.desc()), "set_dropout_mask");
  }
  // lengths
  if (padding) {
    set(fs_sdpa_attributes_set_padding_mask(attr, 1), "set_padding_mask");
    for (int side = 0; side < 2; ++side) {
      const auto& len = side == 0 ? len_q : len_kv;
      const bool cu = f.ConsumeBool();
      const int slot = side == 0 ? (cu ? FS_SDPA_CU_SEQ_LEN_Q : FS_SDPA_SEQ_LEN_Q)
                                 : (cu ? FS_SDPA_CU_SEQ_LEN_KV : FS_SDPA_SEQ_LEN_KV);
      Slot& s = S(slot);
      s.bound = true;
      const bool i32 = f.ConsumeBool();
      const int64_t n = P.B + (cu ? 1 : 0);
      s.t.make(dtype(i32 ? kI32 : kI64), f.ConsumeBool() ? std::vector<int64_t>{n} : std::vector<int64_t>{n, 1, 1, 1}, {},
               1 << 12, 0);
      int64_t acc = 0;
      for (int64_t b = 0; b < n; ++b) {
        int64_t value = cu ? acc : len[size_t(b)];
        if (cu && b < P.B) acc += len[size_t(b)];
        // Wild values only where the harness memory does not depend on them (a packed side's
        // memory holds exactly its declared samples: a larger valid length would be a caller bug).
        if (brk && !(side == 0 ? rag_q : rag_kv) && f.ConsumeIntegralInRange(0, 7) == 0) value = f.ConsumeIntegral<int64_t>();
        if (i32) *s.t.at<int32_t>(b) = int32_t(value);
        else *s.t.at<int64_t>(b) = value;
      }
      maybe_break(slot);
      const fs_tensor_t* d = s.desc();
      if (slot == FS_SDPA_SEQ_LEN_Q) set(fs_sdpa_attributes_set_seq_len_q(attr, d), "set_seq_len_q");
      if (slot == FS_SDPA_SEQ_LEN_KV) set(fs_sdpa_attributes_set_seq_len_kv(attr, d), "set_seq_len_kv");
      if (slot == FS_SDPA_CU_SEQ_LEN_Q) set(fs_sdpa_attributes_set_cu_seq_len_q(attr, d), "set_cu_seq_len_q");
      if (slot == FS_SDPA_CU_SEQ_LEN_KV) set(fs_sdpa_attributes_set_cu_seq_len_kv(attr, d), "set_cu_seq_len_kv");
    }
    if (paged) {
      set(fs_sdpa_attributes_set_paged_attention_k_table(attr, S(FS_SDPA_PAGE_TABLE_K).desc()), "set_paged_k");
      set(fs_sdpa_attributes_set_paged_attention_v_table(attr, S(FS_SDPA_PAGE_TABLE_V).desc()), "set_paged_v");
      const int64_t cap = std::min(S(FS_SDPA_PAGE_TABLE_K).t.shape[2] * S(FS_SDPA_K).t.shape[2],
                                   S(FS_SDPA_PAGE_TABLE_V).t.shape[2] * S(FS_SDPA_V).t.shape[2]);
      if (f.ConsumeBool() || cap != P.Skv) {
        const int64_t m = brk && f.ConsumeBool() ? f.ConsumeIntegral<int64_t>() : P.Skv;
        set(fs_sdpa_attributes_set_paged_attention_max_seq_len_kv(attr, m), "set_paged_attention_max_seq_len_kv");
      }
    }
    if ((rag_q || rag_kv) && f.ConsumeIntegralInRange(0, 3) == 0) {
      const int64_t total = (rag_q ? off_q : off_kv).back();
      const int64_t v = brk && f.ConsumeBool() ? f.ConsumeIntegral<int64_t>() : total + f.ConsumeIntegralInRange(0, 2);
      if (rag_q) set(fs_sdpa_attributes_set_max_total_seq_len_q(attr, v), "set_max_total_seq_len_q");
      else set(fs_sdpa_attributes_set_max_total_seq_len_kv(attr, v), "set_max_total_seq_len_kv");
    }
  }

  // backward tensors
  if (P.backward) {
    seq(FS_SDPA_DO, P.Hq, true, P.Dv, P.io, false);
    seq(FS_SDPA_DQ, P.Hq, true, P.Dqk, P.io, true);
    seq(FS_SDPA_DK, P.Hk, false, P.Dqk, P.io, true);
    seq(FS_SDPA_DV, P.Hv, false, P.Dv, P.io, true);
    if (f.ConsumeBool()) set(fs_sdpa_attributes_set_deterministic_algorithm(attr, 1), "set_deterministic_algorithm");
  }
  // ragged offsets of every packed slot
  for (int slot = 0; slot < FS_SDPA_NUM_SLOTS; ++slot) {
    Slot& s = S(slot);
    if (!s.bound || !s.ragged) continue;
    set(fs_sdpa_attributes_set_ragged_offset(attr, slot, s.offs.get(), s.rows_stride), "set_ragged_offset");
  }

  // Descriptors of the main tensors.
  fs_status_t st;
  fs_sdpa_fwd_t fop = nullptr;
  fs_sdpa_bwd_t bop = nullptr;
  // Tensor setters re-read the descriptor at create for q/k/v/o/stats (and dO, dQ, dK, dV).
  if (!P.backward) {
    st = fs_sdpa_fwd_create(S(FS_SDPA_Q).desc(), S(FS_SDPA_K).desc(), S(FS_SDPA_V).desc(), S(FS_SDPA_O).desc(),
                            S(FS_SDPA_STATS).desc(), attr, &fop);
    check_error(st, "fs_sdpa_fwd_create");
  } else {
    st = fs_sdpa_bwd_create(S(FS_SDPA_Q).desc(), S(FS_SDPA_K).desc(), S(FS_SDPA_V).desc(), S(FS_SDPA_O).desc(),
                            S(FS_SDPA_DO).desc(), S(FS_SDPA_STATS).desc(), S(FS_SDPA_DQ).desc(), S(FS_SDPA_DK).desc(),
                            S(FS_SDPA_DV).desc(), attr, &bop);
    check_error(st, "fs_sdpa_bwd_create");
  }
  fs_sdpa_attributes_destroy(attr);  // the operation keeps its own copy
  if (st != FS_STATUS_SUCCESS) return 0;
  ++g_stats.created;

  const int skip = f.ConsumeIntegralInRange(0, 15);  // 1: no check_support, 2: no compile
  bool ready = true;
  size_t ws = 0;
  if (skip != 1) {
    st = P.backward ? fs_sdpa_bwd_check_support(bop) : fs_sdpa_fwd_check_support(fop);
    check_error(st, "check_support");
    ready = st == FS_STATUS_SUCCESS;
  }
  if (skip != 2) {
    st = P.backward ? fs_sdpa_bwd_compile(bop) : fs_sdpa_fwd_compile(fop);
    check_error(st, "compile");
    ready = ready && st == FS_STATUS_SUCCESS;
  } else {
    ready = false;
  }
  check_error(P.backward ? fs_sdpa_bwd_workspace_size(bop, &ws) : fs_sdpa_fwd_workspace_size(fop, &ws), "workspace_size");

  // Variant pack.
  void* pack[FS_SDPA_NUM_SLOTS] = {};
  for (int slot = 0; slot < FS_SDPA_NUM_SLOTS; ++slot) {
    Slot& s = S(slot);
    if (!s.bound) continue;
    pack[slot] = s.pack ? s.pack : s.t.t.data;
    if (s.ragged) pack[ragged_slot_of(slot)] = s.offs.t.data;
  }
  if (null_pointer) pack[broken] = nullptr;
  st = P.backward ? fs_sdpa_bwd_execute(bop, pack, FS_SDPA_NUM_SLOTS, nullptr, 0, nullptr)
                  : fs_sdpa_fwd_execute(fop, pack, FS_SDPA_NUM_SLOTS, nullptr, 0, nullptr);
  check_error(st, "execute");
  if (ready && !brk && st != FS_STATUS_SUCCESS)
    fail(std::string("execute failed on valid runtime values after create + compile: ") + fs_get_last_error());

  if (st == FS_STATUS_SUCCESS) ++g_stats.executed;
  if (st == FS_STATUS_SUCCESS) {
    // Every element of every float32 output was written (padding rows too; packed outputs: sample rows).
    for (int slot = 0; slot < FS_SDPA_NUM_SLOTS; ++slot) {
      Slot& s = S(slot);
      if (!s.bound || !s.output || s.t.t.data == nullptr || s.t.t.dtype.bits != 32 || s.t.t.dtype.code != FS_DTYPE_FLOAT)
        continue;
      const auto& sh = s.t.shape;
      if (sh.size() == 1) {
        for (int64_t i = 0; i < sh[0]; ++i)
          if (is_poison(s.f32() + i)) fail(std::string("unwritten element of a per-head output, slot ") + std::to_string(slot));
        continue;
      }
      const bool kv_side = slot == FS_SDPA_DK || slot == FS_SDPA_DV;
      for (int64_t b = 0; b < sh[0]; ++b) {
        const int64_t rows = s.ragged ? (kv_side ? len_kv : len_q)[size_t(b)] : sh[2];
        for (int64_t h = 0; h < sh[1]; ++h)
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t d = 0; d < sh[3]; ++d) {
              const int64_t e = slot == FS_SDPA_DBIAS || slot == FS_SDPA_RNG_DUMP
                                    ? b * s.t.strides[0] + h * s.t.strides[1] + i * s.t.strides[2] + d * s.t.strides[3]
                                    : at(s, b, h, i, d);
              if (is_poison(s.f32() + e))
                fail("unwritten output element: slot " + std::to_string(slot) + " (" + std::to_string(b) + ", " +
                     std::to_string(h) + ", " + std::to_string(i) + ", " + std::to_string(d) + ")");
            }
      }
    }
  }

  // --- float64 check of a float32 call (no Philox dropout; small problems): the forward's O, stats,
  // row max, sum of exp and max logit; the backward's dV = sum_i P_ij dropout_ij dO_i (gated), with
  // P_ij = exp(x_ij - stats_i) from the given stats (a check of the backward's logits, masks, GQA
  // reduction and packed / strided addressing; dQ / dK are checked against finite differences in
  // tests/cpp/test_sdpa_api.cpp and against autograd in the Python suites).
  if (st == FS_STATUS_SUCCESS && io32 && !philox && std::isfinite(scale) && std::fabs(scale) < 10 && broken < 0) {
    ++g_stats.value_checked;
    if (alibi) ++g_stats.value_checked_alibi;
    auto ld = [&](int slot, int64_t e) -> double {
      const Slot& s = S(slot);
      if (s.t.t.dtype.code == FS_DTYPE_UINT) return double(static_cast<const uint8_t*>(s.t.t.data)[e]);
      if (s.t.t.dtype.bits == 16) return 0.0;  // 16-bit bias/gate: zero-filled by the harness
      return double(static_cast<const float*>(s.t.t.data)[e]);
    };
    auto bc = [&](const Slot& s, int64_t b, int64_t h, int64_t i, int64_t j) {
      const auto& sh = s.t.shape;
      const auto& str = s.t.strides;
      return (sh[0] == 1 ? 0 : b * str[0]) + (sh[1] == 1 ? 0 : h * str[1]) + (sh[2] == 1 ? 0 : i * str[2]) +
             (sh[3] == 1 ? 0 : j * str[3]);
    };
    // K/V row (b, h, j) element d, through the page table when paged.
    auto kv = [&](int slot, int64_t b, int64_t h, int64_t j, int64_t d) -> double {
      const Slot& s = S(slot);
      if (!paged) return ld(slot, at(s, b, h, j, d));
      const Slot& pt = S(slot == FS_SDPA_K ? FS_SDPA_PAGE_TABLE_K : FS_SDPA_PAGE_TABLE_V);
      const int64_t bs = s.t.shape[2];
      const int64_t pages = pt.t.shape[2];
      const int64_t blk = static_cast<const int32_t*>(pt.t.t.data)[b * pages + j / bs];
      const auto& str = s.t.strides;
      return ld(slot, blk * str[0] + h * str[1] + (j % bs) * str[2] + d * str[3]);
    };
    std::vector<double> head_max(size_t(P.Hq), -INFINITY);
    std::vector<double> dv_acc(P.backward ? size_t(P.B * P.Hv * P.Skv * P.Dv) : 0, 0.0);
    for (int64_t b = 0; b < P.B; ++b) {
      const int64_t lq = len_q[size_t(b)], lk = len_kv[size_t(b)];
      const int64_t sh = align == FS_SDPA_BOTTOM_RIGHT ? lk - lq : 0;
      for (int64_t h = 0; h < P.Hq; ++h) {
        const int64_t hk = h / (P.Hq / P.Hk), hv = h / (P.Hq / P.Hv);
        int64_t n2 = 1;
        while (n2 * 2 <= P.Hq) n2 *= 2;
        const double slope = std::exp2(h < n2 ? -8.0 * double(h + 1) / double(n2) : -4.0 * double(2 * (h - n2) + 1) / double(n2));
        for (int64_t i = 0; i < lq; ++i) {
          std::vector<double> x(size_t(lk), -INFINITY);
          double m = -INFINITY;
          for (int64_t j = 0; j < lk; ++j) {
            // __int128: bounds can be huge
            if (has_right && __int128(j) > __int128(i) + sh + right) continue;
            if (has_left && __int128(j) <= __int128(i) + sh - left) continue;
            if (S(FS_SDPA_BLOCK_MASK).bound) {
              const Slot& bm = S(FS_SDPA_BLOCK_MASK);
              const int64_t kb = j / 128;
              const int64_t e = (bm.t.shape[0] == 1 ? 0 : b * bm.t.strides[0]) + (bm.t.shape[1] == 1 ? 0 : h * bm.t.strides[1]) +
                                (i / 128) * bm.t.strides[2] + (kb / 8) * bm.t.strides[3];
              if (!((static_cast<const uint8_t*>(bm.t.t.data)[e] >> (kb % 8)) & 1)) continue;
            }
            double s = 0;
            for (int64_t d = 0; d < P.Dqk; ++d) s += ld(FS_SDPA_Q, at(S(FS_SDPA_Q), b, h, i, d)) * kv(FS_SDPA_K, b, hk, j, d);
            s *= scale;
            if (softcap > 0) s = softcap * std::tanh(s / softcap);
            if (S(FS_SDPA_BIAS).bound) s += ld(FS_SDPA_BIAS, bc(S(FS_SDPA_BIAS), b, h, i, j));
            if (alibi) s += slope * double(j - i - sh);
            x[size_t(j)] = s;
            m = std::max(m, s);
          }
          head_max[size_t(h)] = std::max(head_max[size_t(h)], m);
          if (P.backward) {
            const double lse_in = S(FS_SDPA_STATS).f32()[at(S(FS_SDPA_STATS), b, h, i, 0)];
            for (int64_t j = 0; j < lk; ++j) {
              if (!(x[size_t(j)] > -INFINITY)) continue;
              double p = std::exp(x[size_t(j)] - lse_in);
              if (S(FS_SDPA_DROPOUT_MASK).bound) p *= ld(FS_SDPA_DROPOUT_MASK, bc(S(FS_SDPA_DROPOUT_MASK), b, h, i, j)) / 0.7;
              for (int64_t d = 0; d < P.Dv; ++d) {
                double g = ld(FS_SDPA_DO, at(S(FS_SDPA_DO), b, h, i, d));
                if (S(FS_SDPA_GATE).bound) g /= 1.0 + std::exp(-ld(FS_SDPA_GATE, at(S(FS_SDPA_GATE), b, h, i, d)));
                dv_acc[size_t(((b * P.Hv + hv) * P.Skv + j) * P.Dv + d)] += p * g;
              }
            }
            continue;
          }
          const double sink = S(FS_SDPA_SINK_TOKEN).bound ? ld(FS_SDPA_SINK_TOKEN, h) : -INFINITY;
          const double mall = std::max(m, sink);
          double sum = 0, lse = -INFINITY;
          std::vector<double> o(size_t(P.Dv), 0.0);
          if (mall > -INFINITY) {
            for (int64_t j = 0; j < lk; ++j) sum += x[size_t(j)] > -INFINITY ? std::exp(x[size_t(j)] - mall) : 0.0;
            if (sink > -INFINITY) sum += std::exp(sink - mall);
            lse = mall + std::log(sum);
            for (int64_t j = 0; j < lk; ++j) {
              if (!(x[size_t(j)] > -INFINITY)) continue;
              double p = std::exp(x[size_t(j)] - lse);
              if (S(FS_SDPA_DROPOUT_MASK).bound) p *= ld(FS_SDPA_DROPOUT_MASK, bc(S(FS_SDPA_DROPOUT_MASK), b, h, i, j)) / 0.7;
              for (int64_t d = 0; d < P.Dv; ++d) o[size_t(d)] += p * kv(FS_SDPA_V, b, hv, j, d);
            }
          }
          double omax = 1.0;
          for (double y : o) omax = std::max(omax, std::fabs(y));
          for (int64_t d = 0; d < P.Dv; ++d) {
            double want = o[size_t(d)];
            if (S(FS_SDPA_GATE).bound) want /= 1.0 + std::exp(-ld(FS_SDPA_GATE, at(S(FS_SDPA_GATE), b, h, i, d)));
            const double got = S(FS_SDPA_O).f32()[at(S(FS_SDPA_O), b, h, i, d)];
            if (!(std::fabs(got - want) <= 1e-3 * omax)) {
              fail("O differs from the float64 computation at (" + std::to_string(b) + ", " + std::to_string(h) + ", " +
                   std::to_string(i) + ", " + std::to_string(d) + "): " + std::to_string(got) + " vs " + std::to_string(want));
            }
          }
          auto check_row = [&](int slot, double want, const char* what) {
            if (!S(slot).bound) return;
            const double got = S(slot).f32()[at(S(slot), b, h, i, 0)];
            const bool ok = std::isinf(want) ? got == want : std::fabs(got - want) <= 1e-3 * (1.0 + std::fabs(want));
            if (!ok) fail(std::string(what) + " differs from the float64 computation: " + std::to_string(got) + " vs " + std::to_string(want));
          };
          (void)check_row;
          if (S(FS_SDPA_SCORE_MAX).bound) check_row(FS_SDPA_SCORE_MAX, mall, "score_max");
          if (S(FS_SDPA_SCORE_SUM_EXP).bound) check_row(FS_SDPA_SCORE_SUM_EXP, mall > -INFINITY ? sum : 0.0, "score_sum_exp");
          // stats: natural log, or base 2 when stats_use_log2 was set (not tracked here: either matches)
          if (S(FS_SDPA_STATS).bound) {
            const double got = S(FS_SDPA_STATS).f32()[at(S(FS_SDPA_STATS), b, h, i, 0)];
            const double w2 = lse * 1.4426950408889634;
            const bool ok = std::isinf(lse) ? got == lse
                                            : std::fabs(got - lse) <= 1e-3 * (1.0 + std::fabs(lse)) ||
                                                  std::fabs(got - w2) <= 1e-3 * (1.0 + std::fabs(w2));
            if (!ok) fail("stats differ from the float64 computation: " + std::to_string(got) + " vs " + std::to_string(lse));
          }
        }
      }
    }
    if (P.backward) {
      double vmax = 1.0;
      for (double y : dv_acc) vmax = std::max(vmax, std::fabs(y));
      for (int64_t b = 0; b < P.B; ++b)
        for (int64_t hv = 0; hv < P.Hv; ++hv)
          for (int64_t j = 0; j < len_kv[size_t(b)]; ++j)
            for (int64_t d = 0; d < P.Dv; ++d) {
              const double want = dv_acc[size_t(((b * P.Hv + hv) * P.Skv + j) * P.Dv + d)];
              const double got = S(FS_SDPA_DV).f32()[at(S(FS_SDPA_DV), b, hv, j, d)];
              if (!(std::fabs(got - want) <= 1e-3 * vmax))
                fail("dV differs from the float64 computation at (" + std::to_string(b) + ", " + std::to_string(hv) +
                     ", " + std::to_string(j) + ", " + std::to_string(d) + "): " + std::to_string(got) + " vs " +
                     std::to_string(want));
            }
    }
    if (S(FS_SDPA_MAX_LOGIT).bound) {
      for (int64_t h = 0; h < P.Hq; ++h) {
        const double got = S(FS_SDPA_MAX_LOGIT).f32()[h], want = head_max[size_t(h)];
        const bool ok = std::isinf(want) ? got == want : std::fabs(got - want) <= 1e-3 * (1.0 + std::fabs(want));
        if (!ok) fail("max_logit differs from the float64 computation: " + std::to_string(got) + " vs " + std::to_string(want));
      }
    }
  }
  if (fop) fs_sdpa_fwd_destroy(fop);
  if (bop) fs_sdpa_bwd_destroy(bop);
  return 0;
}
