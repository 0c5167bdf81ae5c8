// libFuzzer target: the forward and backward operations of the C ABI (create -> check_support
// -> compile -> workspace_size -> execute) on CPU tensors, against small valid plans built once
// (BSHD and THD, with backward metadata).
//
// Each input decodes to a call sequence in which every tensor slot is either right or broken
// in one way (NULL, dtype, device, rank, one extent, strides: permuted, zero, negative or
// arbitrary, a byte offset that misaligns the data), plus the scale, its flag, deterministic,
// a descriptor changed between create and execute, and a skipped lifecycle step.
// Invariants: no crash / sanitizer report / hang; every failure has a known status and a
// message naming the argument; a call that succeeds wrote every element of its NaN-poisoned
// outputs with a non-NaN value (inputs are finite), and execute() after a successful
// create/compile of the same descriptors never fails.
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>

#include "fuzz_common.h"

using namespace fsfuzz;

namespace {

struct Geometry {
  bool varlen;
  int64_t B, Sq, Sk, Hq, Hkv, D, Dv;
  std::vector<int64_t> cuq, cuk;
  int64_t Tq() const { return varlen ? cuq.back() : B * Sq; }
  int64_t Tk() const { return varlen ? cuk.back() : B * Sk; }
  std::vector<int64_t> q() const { return varlen ? std::vector<int64_t>{Tq(), Hq, D} : std::vector<int64_t>{B, Sq, Hq, D}; }
  std::vector<int64_t> k() const { return varlen ? std::vector<int64_t>{Tk(), Hkv, D} : std::vector<int64_t>{B, Sk, Hkv, D}; }
  std::vector<int64_t> v() const { return varlen ? std::vector<int64_t>{Tk(), Hkv, Dv} : std::vector<int64_t>{B, Sk, Hkv, Dv}; }
  std::vector<int64_t> o() const { return varlen ? std::vector<int64_t>{Tq(), Hq, Dv} : std::vector<int64_t>{B, Sq, Hq, Dv}; }
  std::vector<int64_t> lse() const { return varlen ? std::vector<int64_t>{Hq, Tq()} : std::vector<int64_t>{B, Hq, Sq}; }
};

struct PlanCase {
  Geometry g;
  fs_mask_plan_t plan = nullptr;
};

// Two plans with backward metadata, built once: BSHD (B=2, Sq=19, Sk=23, Hq=4, Hkv=2, D=16, Dv=8,
// Hmask=1, nfunc=3) and THD (lengths q 7/0/12, k 9/5/0, Hq=Hkv=2, D=Dv=8, Hmask=Hq, nfunc=1).
PlanCase& plan_case(int which) {
  static PlanCase cases[2];
  PlanCase& c = cases[which];
  if (c.plan) return c;
  c.g = which == 0 ? Geometry{false, 2, 19, 23, 4, 2, 16, 8, {}, {}}
                   : Geometry{true, 3, 12, 9, 2, 2, 8, 8, {0, 7, 7, 19}, {0, 9, 14, 14}};
  const Geometry& g = c.g;
  Tensor q, k, v, mask, cq, ck;
  q.make(dtype(kF32), g.q(), {}, 1 << 20, 1);
  k.make(dtype(kF32), g.k(), {}, 1 << 20, 2);
  v.make(dtype(kF32), g.v(), {}, 1 << 20, 3);
  const int64_t hm = which == 0 ? 1 : g.Hq, nf = which == 0 ? 3 : 1, T = g.Tq();
  mask.make(dtype(kI32), {hm, nf, T}, {}, 1 << 20, 0);
  for (int64_t h = 0; h < hm; ++h)
    for (int64_t r = 0; r < T; ++r) {
      int64_t b = 0, pos = r;
      if (g.varlen) {
        while (r >= g.cuq[size_t(b + 1)]) ++b;
        pos = r - g.cuq[size_t(b)];
      } else {
        b = r / g.Sq;
        pos = r % g.Sq;
      }
      const int64_t klen = g.varlen ? g.cuk[size_t(b + 1)] - g.cuk[size_t(b)] : g.Sk;
      int32_t* e = mask.at<int32_t>(h * nf * T + r);
      e[0] = int32_t(std::min<int64_t>(pos + 1 + h, klen));  // causal-like prefix
      if (nf == 3) {
        e[T] = int32_t(std::min<int64_t>(e[0] + (r * 7) % 5, klen));
        e[2 * T] = int32_t(std::min<int64_t>(e[T] + (r * 3) % 9, klen));
      }
    }
  fs_mask_plan_args_t a{};
  a.mask_func = mask.get();
  a.q = q.get();
  a.k = k.get();
  a.v = v.get();
  if (g.varlen) {
    cq.make(dtype(kI32), {int64_t(g.cuq.size())}, {}, 1 << 20, 0);
    ck.make(dtype(kI32), {int64_t(g.cuk.size())}, {}, 1 << 20, 0);
    for (size_t i = 0; i < g.cuq.size(); ++i) {
      *cq.at<int32_t>(int64_t(i)) = int32_t(g.cuq[i]);
      *ck.at<int32_t>(int64_t(i)) = int32_t(g.cuk[i]);
    }
    a.cu_seqlens_q = cq.get();
    a.cu_seqlens_k = ck.get();
    a.max_seqlen_q = 12;
    a.max_seqlen_k = 9;
  }
  a.pack_gqa = -1;
  a.build_backward = 1;
  if (fs_create_mask_plan(&a, &c.plan) != FS_STATUS_SUCCESS) fail(std::string("fixture plan: ") + fs_get_last_error());
  return c;
}

// Bit pattern of a signalling NaN no arithmetic produces: outputs start with it.
constexpr uint32_t kPoison = 0x7fa5a5a5u;

// One tensor argument: the right descriptor, or one broken in a fuzzer-chosen way.
struct Slot {
  Tensor t;
  bool present = true;
  size_t byte_offset = 0;

  void build(FuzzedDataProvider& f, std::vector<int64_t> shape, bool output, uint32_t seed, bool may_break) {
    const int mode = may_break ? f.ConsumeIntegralInRange(0, 15) : 0;
    fs_dtype_t dt = dtype(kF32);
    std::vector<int64_t> strides;
    switch (mode) {
      case 1: present = false; break;
      case 2: dt = dtype(f.ConsumeIntegralInRange(0, int(kBad))); break;
      case 3: shape.push_back(1); break;
      case 4: if (!shape.empty()) shape.pop_back(); break;
      case 5: if (!shape.empty()) shape[f.ConsumeIntegralInRange<size_t>(0, shape.size() - 1)] += f.ConsumeBool() ? 1 : -1; break;
      case 6: case 7: {  // arbitrary small strides (zero and negative included)
        strides.resize(shape.size());
        for (auto& s : strides) s = f.ConsumeIntegralInRange<int64_t>(-2, 40);
        break;
      }
      case 8: {  // a valid non-compact layout: every stride doubled except the last
        strides.resize(shape.size());
        int64_t acc = 1;
        for (int i = int(shape.size()) - 1; i >= 0; --i) {
          strides[size_t(i)] = acc;
          acc *= std::max<int64_t>(1, shape[size_t(i)]) * (i == int(shape.size()) - 1 ? 1 : 2);
        }
        break;
      }
      case 9: byte_offset = size_t(f.ConsumeIntegralInRange(1, 3)); break;  // misaligned data
      default: break;
    }
    t.make(dt, shape, strides, size_t(1) << 21, seed);
    if (t.t.data == nullptr && present) present = false;
    if (output && t.t.data && dt.code == FS_DTYPE_FLOAT && dt.bits == 32) {
      for (size_t i = 0; i + 4 <= t.mem.size(); i += 4) std::memcpy(&t.mem[i], &kPoison, 4);
    }
    if (mode == 10) t.t.device = {FS_DEVICE_CUDA, 0};
    if (mode == 11) t.t.device = {7, 0};
    if (byte_offset) {
      t.t.byte_offset = byte_offset;
      if (t.mem.size() < byte_offset + 64) present = false;
    }
  }
  const fs_tensor_t* get() { return present ? t.get() : nullptr; }

  // Two different indices of the descriptor reach the same element (brute force: small tensors).
  bool overlaps_itself() {
    if (!present || t.t.data == nullptr) return false;
    int64_t n = 1;
    for (int64_t s : t.shape) n *= std::max<int64_t>(s, 0);
    if (n <= 1) return false;
    std::vector<int64_t> offs, idx(t.shape.size(), 0);
    while (true) {
      int64_t off = 0;
      for (size_t i = 0; i < idx.size(); ++i) off += idx[i] * t.strides[i];
      offs.push_back(off);
      int d = int(idx.size()) - 1;
      while (d >= 0 && ++idx[size_t(d)] == t.shape[size_t(d)]) idx[size_t(d--)] = 0;
      if (d < 0) break;
    }
    std::sort(offs.begin(), offs.end());
    return std::adjacent_find(offs.begin(), offs.end()) != offs.end();
  }

  // Every element the descriptor reaches was written (no longer holds the poison bit pattern;
  // a computed NaN, e.g. from an overflowing scale, has another pattern and counts as written).
  bool all_written() {
    if (!present || t.t.data == nullptr || t.t.dtype.bits != 32 || t.t.dtype.code != FS_DTYPE_FLOAT) return true;
    bool ok = true;
    std::vector<int64_t> idx(t.shape.size(), 0);
    for (int64_t s : t.shape)
      if (s <= 0) return true;
    while (true) {
      int64_t off = 0;
      for (size_t i = 0; i < idx.size(); ++i) off += idx[i] * t.strides[i];
      const float* p = reinterpret_cast<const float*>(static_cast<const unsigned char*>(t.t.data) + t.t.byte_offset) + off;
      uint32_t x;
      std::memcpy(&x, p, 4);
      if (x == kPoison) ok = false;
      int d = int(idx.size()) - 1;
      while (d >= 0 && ++idx[size_t(d)] == t.shape[size_t(d)]) idx[size_t(d--)] = 0;
      if (d < 0) break;
    }
    return ok;
  }
};

float fuzz_scale(FuzzedDataProvider& f) {
  static const float kScales[] = {0.25f, 0.0f, -0.5f, NAN, INFINITY, -INFINITY, 1e30f, 1.0f};
  return kScales[f.ConsumeIntegralInRange(0, 7)];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider f(data, size);
  PlanCase& pc = plan_case(f.ConsumeIntegralInRange(0, 1));
  const Geometry& g = pc.g;
  const bool backward = f.ConsumeBool();
  const bool may_break = f.ConsumeIntegralInRange(0, 2) != 0;
  fs_mask_plan_t plan = f.ConsumeIntegralInRange(0, 31) == 0 ? nullptr : pc.plan;
  // Occasionally the other fixture's plan (incompatible geometry).
  if (f.ConsumeIntegralInRange(0, 31) == 0) plan = plan_case(1 - int(g.varlen)).plan;
  const float scale = fuzz_scale(f);
  const int32_t has_scale = f.ConsumeIntegralInRange(0, 7) == 0 ? f.ConsumeIntegral<int32_t>() : f.ConsumeBool();
  const int skip = f.ConsumeIntegralInRange(0, 15);  // 1: no check_support, 2: no compile
  const int change = f.ConsumeIntegralInRange(0, 7);  // 1: a slot changes between create and execute

  if (!backward) {
    Slot q, k, v, o, lse, ml;
    q.build(f, g.q(), false, 1, may_break);
    k.build(f, g.k(), false, 2, may_break);
    v.build(f, g.v(), false, 3, may_break);
    o.build(f, g.o(), true, 4, may_break);
    lse.build(f, g.lse(), true, 5, may_break);
    ml.build(f, {g.Hq}, true, 6, may_break);
    if (f.ConsumeBool()) lse.present = false;
    if (f.ConsumeBool()) ml.present = false;
    fs_flex_fwd_args_t a{q.get(), k.get(), v.get(), o.get(), plan, lse.get(), ml.get(), scale, has_scale};
    fs_flex_fwd_t op = nullptr;
    fs_status_t s = fs_flex_fwd_create(&a, &op);
    check_error(s, "fs_flex_fwd_create");
    if (s != FS_STATUS_SUCCESS) return 0;
    size_t ws = 0;
    check_error(fs_flex_fwd_workspace_size(op, &ws), "fs_flex_fwd_workspace_size");
    bool ready = true;
    if (skip != 1) {
      s = fs_flex_fwd_check_support(op);
      check_error(s, "fs_flex_fwd_check_support");
      ready = s == FS_STATUS_SUCCESS;
    }
    if (skip != 2) {
      s = fs_flex_fwd_compile(op);
      check_error(s, "fs_flex_fwd_compile");
      ready = ready && s == FS_STATUS_SUCCESS;
    } else {
      ready = false;
    }
    Slot other;
    fs_flex_fwd_args_t e = a;
    if (change == 1) {
      other.build(f, g.o(), true, 7, true);
      e.out = other.get();
    }
    s = fs_flex_fwd_execute(op, &e, nullptr, 0, nullptr);
    check_error(s, "fs_flex_fwd_execute");
    if (ready && change != 1 && s != FS_STATUS_SUCCESS)
      fail(std::string("forward execute failed after create + compile of the same descriptors: ") + fs_get_last_error());
    if (s == FS_STATUS_SUCCESS) {
      Slot* outs[] = {change == 1 ? &other : &o, &lse, &ml};
      for (Slot* x : outs) {
        if (!x->all_written()) fail("forward left NaN-poisoned output elements unwritten");
        if (x->overlaps_itself()) fail("forward accepted an output that overlaps itself (results lost silently)");
      }
    }
    fs_flex_fwd_destroy(op);
    return 0;
  }

  Slot q, k, v, o, dout, lse, dq, dk, dv, dlse;
  q.build(f, g.q(), false, 1, may_break);
  k.build(f, g.k(), false, 2, may_break);
  v.build(f, g.v(), false, 3, may_break);
  o.build(f, g.o(), false, 4, may_break);
  dout.build(f, g.o(), false, 5, may_break);
  lse.build(f, g.lse(), false, 6, may_break);
  dq.build(f, g.q(), true, 7, may_break);
  dk.build(f, g.k(), true, 8, may_break);
  dv.build(f, g.v(), true, 9, may_break);
  dlse.build(f, g.lse(), false, 10, may_break);
  if (f.ConsumeBool()) dlse.present = false;
  const int32_t det = f.ConsumeIntegralInRange(0, 7) == 0 ? f.ConsumeIntegral<int32_t>() : f.ConsumeBool();
  // lse holds the harness's random floats, not the forward's: gradients may overflow, so only
  // writes are checked here (values are checked against autograd in the Python and C++ tests).
  fs_flex_bwd_args_t a{q.get(), k.get(), v.get(), o.get(), dout.get(), lse.get(), dq.get(), dk.get(), dv.get(),
                       plan, scale, has_scale, det, dlse.get()};
  fs_flex_bwd_t op = nullptr;
  fs_status_t s = fs_flex_bwd_create(&a, &op);
  check_error(s, "fs_flex_bwd_create");
  if (s != FS_STATUS_SUCCESS) return 0;
  size_t ws = 0;
  check_error(fs_flex_bwd_workspace_size(op, &ws), "fs_flex_bwd_workspace_size");
  bool ready = true;
  if (skip != 1) {
    s = fs_flex_bwd_check_support(op);
    check_error(s, "fs_flex_bwd_check_support");
    ready = s == FS_STATUS_SUCCESS;
  }
  if (skip != 2) {
    s = fs_flex_bwd_compile(op);
    check_error(s, "fs_flex_bwd_compile");
    ready = ready && s == FS_STATUS_SUCCESS;
  } else {
    ready = false;
  }
  Slot other;
  fs_flex_bwd_args_t e = a;
  if (change == 1) {
    other.build(f, g.k(), true, 11, true);
    e.dk = other.get();
  }
  s = fs_flex_bwd_execute(op, &e, nullptr, 0, nullptr);
  check_error(s, "fs_flex_bwd_execute");
  if (ready && change != 1 && s != FS_STATUS_SUCCESS)
    fail(std::string("backward execute failed after create + compile of the same descriptors: ") + fs_get_last_error());
  if (s == FS_STATUS_SUCCESS) {
    Slot* outs[] = {&dq, change == 1 ? &other : &dk, &dv};
    for (Slot* x : outs) {
      if (!x->all_written()) fail("backward left NaN-poisoned gradient elements unwritten");
      if (x->overlaps_itself()) fail("backward accepted a gradient that overlaps itself (results lost silently)");
    }
  }
  fs_flex_bwd_destroy(op);
  return 0;
}
