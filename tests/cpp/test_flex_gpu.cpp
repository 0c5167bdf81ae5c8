// GPU tests of the sm80 flex kernels (src/kernels/sm80) against the CPU reference.
//
// Every case: random inputs, a host plan (build_mask_plan_host) uploaded to the device,
// outputs poisoned with NaN (0xFF bytes) on the device before each run, then out / LSE /
// max_logit / dQ / dK / dV compared with reference::flex_forward/backward (double
// accumulation) on the same 16-bit inputs. The backward gets the reference's out (rounded
// to the dtype) and LSE, so it is checked on its own.
//
// Error criteria: tests/cpp/error_criteria.h (relative L2 plus an elementwise max-abs bound
// for out / dQ / dK / dV, 2e-3 absolute for LSE / max_logit; the kernels round P and dS to
// the input dtype before the second GEMM, as FlashAttention-2 does, everything else
// accumulates in fp32). softmax_scale is drawn per case (error_criteria.h
// random_softmax_scale: default, zero, random positive, negative when max_logit is off).
// Outputs and both workspaces are NaN / 0xFF-poisoned before every launch.
// Strided tensors keep NaN padding (no stray writes).
// Split-schedule cases (non-deterministic backward, src/kernels/common/bwd_split.cuh) use
// masks with long K2Q lists and also read the schedule header from the workspace to prove
// that some dK/dV task was really split.
// Skips when no CUDA device is visible (or the build has no CUDA).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#ifdef FLASHSPAN_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "core/env_switch.h"
#include "error_criteria.h"
#include "gpu_harness.h"
#include "kernel_internals.h"
#include "mask_gen.h"
#include "plan/plan_layout.h"
#include "plan/planner.h"
#include "planner_masks.h"
#include "reference/reference.h"
#include "scoped_env.h"
#include "test_util.h"

namespace flashspan::test {
namespace {

#ifndef FLASHSPAN_WITH_CUDA

TEST(FlexGpu, Skipped) { GTEST_SKIP() << "flashspan was built without CUDA"; }

#else

// ---------------------------------------------------------------------------
// A test case
// ---------------------------------------------------------------------------

struct Case {
  bool varlen = false;
  int batch = 1;
  int64_t sq = 64, sk = 64;              // BSHD
  std::vector<int64_t> lq, lk;           // THD
  HeadConfig h;
  // "random", a BENCHMARK.md mask name (B = 1, Hmask = 1), or a structured mask for any
  // geometry: "dense", "sink_window", "global" (structured_mask below).
  std::string mask = "random";
  MaskOptions mopt;
  bool strided = false;
  bool backward = true;
  bool deterministic = true;
  bool grid_mode = false;  // kernels ignore the plan's task lists
  bool negative_logits = false;  // q < 0 < k elementwise: every score (and max_logit) negative
  bool expect_split = false;     // the backward must split some dK/dV task (deterministic: sm90 only)
  bool expect_fwd_split = false; // the forward must split some task (and runs twice, bitwise)
  bool fwd_workspace = true;     // false: forward without a workspace (one CTA per task)
  bool fwd_lse = true, fwd_ml = true;  // optional forward outputs requested
  bool pack_gqa = false;         // packed-GQA plan (forward view over packed rows when Hq > Hkv)
  // Plan consumer: consumer_for_plan (as the C API: the 16-row decode forward tile for packed
  // decode plans), or with default_tile the head-dim table's consumer_for tile.
  bool default_tile = false;
  int expect_fwd_bq = 0;         // > 0: the plan's forward tile must have this many rows
  int arch = 80;                 // plan consumer family: 80, or 90 (sm90 forward, sm80 backward)
  // softmax_scale: -1 = drawn from the seed (fs_test::random_softmax_scale; negative only
  // with fwd_ml off), 0 = 1/sqrt(Dqk), 1 = zero, 2 = `scale_value`.
  int scale_kind = -1;
  float scale_value = 0.0f;
  bool dlse = false;             // backward also gets a random LSE gradient (dlse)
  bool expect_full_blocks = false;  // the plan must hold full blocks (fwd, and bwd with backward)
  // Block-structured mask (mask == "blocks", mask_gen.h): tile classes and empty rows.
  fs_test::BlockMaskSpec blocks;
  uint64_t seed = 1;

  std::string describe() const {
    std::ostringstream os;
    os << (varlen ? "THD" : "BSHD") << " B=" << batch;
    if (varlen) {
      os << " lq=[";
      for (auto x : lq) os << x << ",";
      os << "] lk=[";
      for (auto x : lk) os << x << ",";
      os << "]";
    } else {
      os << " Sq=" << sq << " Sk=" << sk;
    }
    os << " Hq=" << h.hq << " Hkv=" << h.hkv << " Hmask=" << h.hmask << " nfunc=" << h.nfunc << " D=" << h.dqk
       << "/" << h.dv << " " << dtype_name(h.dtype) << " mask=" << mask << " gran=" << mopt.granularity
       << (strided ? " strided" : "") << (deterministic ? " det" : " atomic") << (grid_mode ? " grid" : "")
       << (fwd_workspace ? "" : " fwd-no-ws") << (fwd_lse ? "" : " no-lse") << (fwd_ml ? "" : " no-ml")
       << (pack_gqa ? " packgqa" : "") << (default_tile ? " default-tile" : "") << (dlse ? " dlse" : "")
       << " scale_kind=" << scale_kind << " arch=" << arch << " seed=" << seed;
    return os.str();
  }
};

// Everything a case needs on host and device.
struct Problem {
  Case c;
  FlexGeometry g;   // CPU geometry (for the reference)
  FlexGeometry gd;  // the same on cuda:0 (for the kernels)
  std::vector<int32_t> mask;
  std::unique_ptr<MaskPlan> host_plan, plan;
  float scale = 0;
  HostTensor q, k, v, dout, dlse;  // dlse: only with c.dlse
  HostTensor ref_out, ref_lse, ref_ml, ref_dq, ref_dk, ref_dv;
  DevTensor dq_in, dk_in, dv_in, ddout, dref_out, dref_lse, ddlse;  // device inputs
};

// Structured masks with long K2Q lists (key blocks seen by most queries), for any BSHD/THD
// geometry; contiguous int32 [Hmask, nfunc, total_q], sample-local endpoints. Per-head masks
// vary the window with the head.
//   dense        nfunc 1: every row sees every key.
//   sink_window  nfunc 3: keys [0, 64) (sinks) plus a causal window of 150 + 40 hm keys.
//   global       nfunc 5: Longformer-like: keys [0, 16) and the last 8 keys are global
//                columns, a band of radius 90 + 30 hm around the row; every row with
//                pos % 131 == 7 is a global row (sees all keys).
//   blocks       mask_gen.h block-structured mask (Case::blocks): full, empty, partial and
//                full-minus-n tiles, empty rows; nfunc from the mask.
bool is_structured_mask(const std::string& m) { return m == "dense" || m == "sink_window" || m == "global"; }
int structured_nfunc(const std::string& m) { return m == "dense" ? 1 : m == "sink_window" ? 3 : 5; }

std::vector<int32_t> structured_mask(const std::string& kind, const FlexGeometry& g) {
  const int64_t T = g.total_q;
  const int nf = g.nfunc;
  std::vector<int32_t> mask(static_cast<size_t>(g.num_heads_mask) * nf * T);
  std::vector<int64_t> e(nf);
  for (int hm = 0; hm < g.num_heads_mask; ++hm) {
    for (int64_t row = 0; row < T; ++row) {
      const int b = sample_of_row(g, row);
      const int64_t lk = g.seqlen_k(b), pos = row - g.cu_seqlens_q[b];
      auto clamp = [](int64_t x, int64_t lo, int64_t hi) { return std::max(lo, std::min(x, hi)); };
      if (kind == "dense") {
        e[0] = lk;
      } else if (kind == "sink_window") {
        const int64_t w = 150 + 40 * hm;
        e[0] = std::min<int64_t>(64, lk);
        e[1] = clamp(pos - w, e[0], lk);
        e[2] = clamp(pos + 1, e[1], lk);
      } else {
        const int64_t r = 90 + 30 * hm;
        if (pos % 131 == 7) {
          for (int f = 0; f < nf; ++f) e[f] = lk;
        } else {
          e[0] = std::min<int64_t>(16, lk);
          e[1] = clamp(pos - r, e[0], lk);
          e[2] = clamp(pos + r + 1, e[1], std::max(e[1], lk - 8));
          e[3] = clamp(lk - 8, e[2], lk);
          e[4] = lk;
        }
      }
      for (int f = 0; f < nf; ++f) mask[(static_cast<size_t>(hm) * nf + f) * T + row] = static_cast<int32_t>(e[f]);
    }
  }
  return mask;
}

FlexGeometry make_case_geometry(const Case& c) {
  if (c.varlen) return make_thd_geometry(c.lq, c.lk, c.h);
  return make_bshd_geometry(c.batch, c.sq, c.sk, c.h);
}

std::unique_ptr<Problem> make_problem(Case c) {
  auto p = std::make_unique<Problem>();
  Rng rng(c.seed);
  if (c.mask == "blocks") {
    p->g = make_case_geometry(c);
    p->mask = fs_test::block_mask_for_geometry(p->g, c.blocks, c.seed);  // sets g.nfunc
    c.h.nfunc = p->g.nfunc;
    p->c = c;
  } else if (is_structured_mask(c.mask)) {
    c.h.nfunc = structured_nfunc(c.mask);
    p->c = c;
    p->g = make_case_geometry(c);
    p->mask = structured_mask(c.mask, p->g);
  } else if (c.mask != "random") {
    const fs_test::SampleMask m = fs_test::mask_by_name(c.mask, c.sq);
    c.h.nfunc = m.nfunc;
    c.h.hmask = 1;
    c.batch = 1;
    c.sk = c.sq;
    p->c = c;
    p->g = make_case_geometry(c);
    p->mask = m.ep;
  } else {
    p->c = c;
    p->g = make_case_geometry(c);
    p->mask = random_interval_mask(rng, p->g, c.mopt);
  }
  const FlexGeometry& g = p->g;
  p->gd = g;
  p->gd.device = DeviceType::kCUDA;
  p->gd.device_id = 0;
  PlanRequest req;
  req.geometry = &g;
  req.consumer = c.default_tile ? consumer_for(c.arch, g.head_dim_qk, g.head_dim_v)
                                : consumer_for_plan(c.arch, g, c.pack_gqa);
  req.build_backward = c.backward;
  req.pack_gqa = c.pack_gqa;
  p->host_plan = build_mask_plan_host(req, p->mask.data(), false);
  p->plan = upload_plan(*p->host_plan, c.grid_mode);
  switch (c.scale_kind) {
    case 0: p->scale = default_softmax_scale(g.head_dim_qk); break;
    case 1: p->scale = 0.0f; break;
    case 2: p->scale = c.scale_value; break;
    default: p->scale = fs_test::random_softmax_scale(c.seed, g.head_dim_qk, /*allow_negative=*/!c.fwd_ml);
  }

  const DimOrder order = c.strided ? heads_outer_order(g.varlen ? 3 : 4) : DimOrder{};
  const int64_t pad = c.strided ? 8 : 0;
  p->q = make_q(g, order, pad);
  p->k = make_k(g, order, pad);
  p->v = make_v(g, order, pad);
  p->dout = make_out(g, order, pad);
  p->q.fill_uniform(rng, c.negative_logits ? -1.5 : -1.5, c.negative_logits ? -0.25 : 1.5);
  p->k.fill_uniform(rng, c.negative_logits ? 0.25 : -1.5, 1.5);
  p->v.fill_uniform(rng, -1.0, 1.0);
  p->dout.fill_uniform(rng, -1.0, 1.0);

  p->ref_out = make_out(g);
  p->ref_lse = make_lse(g);
  p->ref_ml = HostTensor(DType::kFloat32, {g.num_heads_q});
  reference::FlexForwardArgs fa;
  fa.geometry = &g;
  fa.mask = p->mask.data();
  fa.q = p->q.view();
  fa.k = p->k.view();
  fa.v = p->v.view();
  fa.out = p->ref_out.view();
  fa.lse = p->ref_lse.view();
  if (p->scale >= 0.0f) fa.max_logit = p->ref_ml.view();  // a negative scale excludes max_logit
  fa.softmax_scale = p->scale;
  fa.accumulate_double = true;
  reference::flex_forward(fa);
  if (c.backward) {
    p->ref_dq = make_q(g);
    p->ref_dk = make_k(g);
    p->ref_dv = make_v(g);
    reference::FlexBackwardArgs ba;
    ba.geometry = &g;
    ba.mask = p->mask.data();
    ba.q = p->q.view();
    ba.k = p->k.view();
    ba.v = p->v.view();
    ba.out = p->ref_out.view();
    ba.dout = p->dout.view();
    ba.lse = p->ref_lse.view();
    ba.dq = p->ref_dq.view();
    ba.dk = p->ref_dk.view();
    ba.dv = p->ref_dv.view();
    if (c.dlse) {
      p->dlse = make_lse(g);
      p->dlse.fill_uniform(rng, -1.0, 1.0);
      ba.dlse = p->dlse.view();
    }
    ba.softmax_scale = p->scale;
    ba.accumulate_double = true;
    reference::flex_backward(ba);
  }
  p->dq_in = dev_like(p->q, true);
  p->dk_in = dev_like(p->k, true);
  p->dv_in = dev_like(p->v, true);
  p->ddout = dev_like(p->dout, true);
  p->dref_out = dev_like(p->ref_out, true);
  p->dref_lse = dev_like(p->ref_lse, true);
  if (c.dlse) p->ddlse = dev_like(p->dlse, true);
  return p;
}

// Device outputs of one forward / backward run.
struct FwdOut {
  HostTensor out, lse, ml;
  DevTensor dout_, dlse, dml;
  std::unique_ptr<DevBuf> ws;  // forward workspace (split schedule)
};
struct BwdOut {
  HostTensor dq, dk, dv;
  DevTensor ddq, ddk, ddv;
  std::unique_ptr<DevBuf> ws;
};

std::unique_ptr<FwdOut> alloc_fwd(const Problem& p, bool strided_out) {
  auto f = std::make_unique<FwdOut>();
  const DimOrder order = strided_out ? heads_outer_order(p.g.varlen ? 3 : 4) : DimOrder{};
  f->out = make_out(p.g, order, strided_out ? 8 : 0);
  f->lse = make_lse(p.g, strided_out ? 8 : 0);
  f->ml = HostTensor(DType::kFloat32, {p.g.num_heads_q});
  f->out.poison();
  f->lse.poison();
  f->ml.poison();
  f->dout_ = dev_like(f->out, false);
  f->dlse = dev_like(f->lse, false);
  f->dml = dev_like(f->ml, false);
  f->ws = std::make_unique<DevBuf>(std::max<size_t>(16, flex_fwd_workspace_size(p.gd, *p.plan, true)));
  // Poison the workspace: the split schedule must not rely on zeroed scratch.
  cuda_ok(cudaMemset(f->ws->p, 0xff, f->ws->bytes), "poison workspace");
  return f;
}

void launch_fwd(const Problem& p, FwdOut& f, cudaStream_t s, bool lse = true, bool ml = true) {
  FlexFwdLaunch a;
  a.geometry = &p.gd;
  a.plan = p.plan.get();
  a.q = p.dq_in.view;
  a.k = p.dk_in.view;
  a.v = p.dv_in.view;
  a.out = f.dout_.view;
  if (lse) a.lse = f.dlse.view;
  if (ml) a.max_logit = f.dml.view;
  a.softmax_scale = p.scale;
  a.stream = s;
  if (p.c.fwd_workspace) {
    a.workspace = f.ws->p;
    a.workspace_bytes = f.ws->bytes;
  }
  launch_flex_fwd(a);
}

std::unique_ptr<BwdOut> alloc_bwd(const Problem& p, bool strided_out) {
  auto b = std::make_unique<BwdOut>();
  const DimOrder order = strided_out ? heads_outer_order(p.g.varlen ? 3 : 4) : DimOrder{};
  const int64_t pad = strided_out ? 8 : 0;
  b->dq = make_q(p.g, order, pad);
  b->dk = make_k(p.g, order, pad);
  b->dv = make_v(p.g, order, pad);
  b->ddq = dev_like(b->dq, false);
  b->ddk = dev_like(b->dk, false);
  b->ddv = dev_like(b->dv, false);
  b->ws = std::make_unique<DevBuf>(std::max<size_t>(16, flex_bwd_workspace_size(p.gd, *p.plan, p.c.deterministic)));
  // Poison the workspace: D, LSE*log2(e), the dQ accumulator and the split schedule must be
  // written by the launch before they are read.
  cuda_ok(cudaMemset(b->ws->p, 0xff, b->ws->bytes), "poison workspace");
  return b;
}

void launch_bwd(const Problem& p, BwdOut& b, cudaStream_t s) {
  FlexBwdLaunch a;
  a.geometry = &p.gd;
  a.plan = p.plan.get();
  a.q = p.dq_in.view;
  a.k = p.dk_in.view;
  a.v = p.dv_in.view;
  a.out = p.dref_out.view;
  a.dout = p.ddout.view;
  a.lse = p.dref_lse.view;
  if (p.c.dlse) a.dlse = p.ddlse.view;
  a.dq = b.ddq.view;
  a.dk = b.ddk.view;
  a.dv = b.ddv.view;
  a.softmax_scale = p.scale;
  a.deterministic = p.c.deterministic;
  a.workspace = b.ws->p;
  a.workspace_bytes = b.ws->bytes;
  a.stream = s;
  launch_flex_bwd(a);
}

// A packed-GQA case must really run packed (a planner that ignored the request would make
// the packed tests pass vacuously): signature, and forward query blocks over packed rows
// (mask_plan.h, "Packed GQA").
void expect_packed_plan(const Problem& p) {
  const int G = p.g.group_size();
  EXPECT_EQ(p.plan->signature.pack_gqa, G > 1) << "signature.pack_gqa";
  const int64_t pack = p.plan->signature.pack_gqa ? G : 1;
  const int64_t bq = p.plan->signature.consumer.fwd_block_q;
  int64_t nqb = 0;
  for (int b = 0; b < p.g.batch; ++b) nqb += (p.g.seqlen_q(b) * pack + bq - 1) / bq;
  EXPECT_EQ(p.plan->counts.fwd_num_q_blocks, nqb) << "forward query blocks (packed rows)";
  EXPECT_LE(p.plan->counts.num_tasks, int64_t(p.g.num_heads_q / pack) * nqb) << "forward tasks";
}

// Runs one case end to end and checks every output.
void run_case(const Case& case_in) {
  SCOPED_TRACE(case_in.describe());
  std::unique_ptr<Problem> pp;
  ASSERT_NO_THROW(pp = make_problem(case_in));
  Problem& p = *pp;
  const Case& c = p.c;  // as made (structured masks set nfunc, ...)
  SCOPED_TRACE("softmax_scale " + std::to_string(p.scale));
  if (c.pack_gqa) expect_packed_plan(p);
  if (c.expect_fwd_bq > 0) {
    ASSERT_EQ(p.plan->signature.consumer.fwd_block_q, c.expect_fwd_bq) << "forward tile rows";
  }
  ASSERT_NO_THROW(flex_check_support_gpu(p.gd, *p.plan, c.backward));
  if (c.expect_full_blocks) {
    EXPECT_GT(p.host_plan->counts.fwd_full, 0) << "the mask has no full forward block";
    if (c.backward) {
      EXPECT_GT(p.host_plan->counts.bwd_full, 0) << "the mask has no full backward block";
    }
  }
  const DType dt = p.g.dtype;

  auto f = alloc_fwd(p, c.strided);
  ASSERT_NO_THROW(launch_fwd(p, *f, nullptr, c.fwd_lse, c.fwd_ml));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  download(f->dout_, f->out);
  download(f->dlse, f->lse);
  download(f->dml, f->ml);
  EXPECT_TRUE(fs_test::tensor_close(f->out.to_vector(), p.ref_out.to_vector(), dt)) << "out";
  if (c.fwd_lse) {
    EXPECT_TRUE(fs_test::stat_close(f->lse.to_vector(), p.ref_lse.to_vector())) << "lse";
  } else {
    for (double x : f->lse.to_vector()) ASSERT_TRUE(std::isnan(x)) << "lse written although not requested";
  }
  if (c.fwd_ml) {
    EXPECT_TRUE(fs_test::stat_close(f->ml.to_vector(), p.ref_ml.to_vector())) << "max_logit";
  } else {
    for (double x : f->ml.to_vector()) ASSERT_TRUE(std::isnan(x)) << "max_logit written although not requested";
  }
  EXPECT_EQ(f->out.padding_changed(), 0) << "out: stray writes";
  EXPECT_EQ(f->lse.padding_changed(), 0) << "lse: stray writes";
  if (c.expect_fwd_split) {
    // Schedule header (SplitSchedule): {items, counter, chunk, slots}.
    const FwdWorkspaceLayout wl = fwd_workspace_layout(p.gd, p.plan->signature);
    ASSERT_GT(wl.total, 0u) << "no forward workspace for this geometry";
    int32_t hdr[SplitSchedule::kHdrInts] = {};
    ASSERT_EQ(cudaMemcpy(hdr, static_cast<char*>(f->ws->p) + wl.hdr, sizeof(hdr), cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_GT(hdr[SplitSchedule::kNumSplit], 0) << "no forward task was split (chunk "
                                                    << hdr[SplitSchedule::kChunk] << ")";
    EXPECT_LE(hdr[SplitSchedule::kNumSplit], wl.max_slots) << "slots";
    EXPECT_GT(hdr[SplitSchedule::kTotal], p.plan->counts.num_tasks) << "items";
    EXPECT_LE(hdr[SplitSchedule::kTotal], wl.max_items) << "items";
    EXPECT_GT(hdr[SplitSchedule::kCounter], hdr[SplitSchedule::kTotal]) << "claim counter";
    EXPECT_LE(hdr[SplitSchedule::kCounter], hdr[SplitSchedule::kTotal] + SplitSchedule::kMaxCtas)
        << "claim counter";
    // A second run (poisoned outputs, used workspace) is bitwise identical: items are
    // merged in list order whichever CTA ran them.
    const std::vector<uint8_t> out1 = raw_bytes(f->dout_), lse1 = raw_bytes(f->dlse), ml1 = raw_bytes(f->dml);
    poison(f->dout_);
    poison(f->dlse);
    poison(f->dml);
    ASSERT_NO_THROW(launch_fwd(p, *f, nullptr, c.fwd_lse, c.fwd_ml));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(raw_bytes(f->dout_) == out1) << "out differs between runs";
    EXPECT_TRUE(raw_bytes(f->dlse) == lse1) << "lse differs between runs";
    EXPECT_TRUE(raw_bytes(f->dml) == ml1) << "max_logit differs between runs";
  }

  if (!c.backward) return;
  auto b = alloc_bwd(p, c.strided);
  ASSERT_NO_THROW(launch_bwd(p, *b, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  download(b->ddq, b->dq);
  download(b->ddk, b->dk);
  download(b->ddv, b->dv);
  EXPECT_TRUE(fs_test::tensor_close(b->dq.to_vector(), p.ref_dq.to_vector(), dt)) << "dq";
  EXPECT_TRUE(fs_test::tensor_close(b->dk.to_vector(), p.ref_dk.to_vector(), dt)) << "dk";
  EXPECT_TRUE(fs_test::tensor_close(b->dv.to_vector(), p.ref_dv.to_vector(), dt)) << "dv";
  EXPECT_EQ(b->dq.padding_changed(), 0) << "dq: stray writes";
  EXPECT_EQ(b->dk.padding_changed(), 0) << "dk: stray writes";
  EXPECT_EQ(b->dv.padding_changed(), 0) << "dv: stray writes";
  if (c.expect_split) {
    // Schedule header (BwdSplit): {items, counter, chunk, split tasks, uneven walks}.
    // Deterministic: the sm90 backward's split schedule over every cell (bwd_split.cuh).
    ASSERT_TRUE(!c.deterministic || c.arch == 90) << "the sm80 deterministic path has no split schedule";
    const BwdWorkspaceLayout wl = bwd_workspace_layout(p.gd, p.plan->signature, c.deterministic);
    int32_t hdr[BwdSplit::kHdrInts] = {};
    ASSERT_EQ(cudaMemcpy(hdr, static_cast<char*>(b->ws->p) + wl.hdr, sizeof(hdr), cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_GT(hdr[BwdSplit::kNumSplit], 0) << "no dK/dV task was split (chunk " << hdr[BwdSplit::kChunk]
                                               << ")";
    EXPECT_LE(hdr[BwdSplit::kNumSplit], wl.max_split) << "slots";
    EXPECT_LE(hdr[BwdSplit::kTotal], wl.max_items) << "items";
    EXPECT_GT(hdr[BwdSplit::kTotal], p.plan->counts.num_bwd_tasks) << "items";
    // The deterministic schedule claims its items in list order or hands them out in snake waves
    // (TileScheduler::next_cell_item) without the claim counter, by the kernel's rule (split_det_claims).
    const bool claimed = kern::split_det_claims(sm90::bwd_det_claim(), hdr[BwdSplit::kUneven]);
    if (c.deterministic && !claimed) {
      EXPECT_EQ(hdr[BwdSplit::kCounter], 0) << "claim counter (deterministic: no claims)";
    } else {
      // Every item claimed, then one failed claim per persistent CTA.
      EXPECT_GT(hdr[BwdSplit::kCounter], hdr[BwdSplit::kTotal]) << "claim counter";
      EXPECT_LE(hdr[BwdSplit::kCounter], hdr[BwdSplit::kTotal] + BwdSplit::kMaxCtas) << "claim counter";
    }
  }
}

// ---------------------------------------------------------------------------
// Random case generator
// ---------------------------------------------------------------------------

Case random_case(uint64_t seed) {
  Rng rng(seed * 7919 + 13);
  auto pick = [&](int n) { return int(rng() % uint64_t(n)); };
  Case c;
  c.seed = seed;
  c.h.dtype = pick(2) ? DType::kBFloat16 : DType::kFloat16;
  static const int dims[][2] = {{8, 8},   {40, 40},  {64, 64},  {96, 96},  {128, 128}, {192, 128}, {256, 256},
                                {16, 64}, {128, 40}, {24, 120}, {72, 8},   {64, 128},  {32, 32},   {112, 104}};
  const int nd = sizeof(dims) / sizeof(dims[0]);
  const int di = pick(nd + 3);
  if (di < nd) {
    c.h.dqk = dims[di][0];
    c.h.dv = dims[di][1];
  } else {
    c.h.dqk = 8 * (1 + pick(16));
    c.h.dv = 8 * (1 + pick(16));
  }
  static const int heads[][2] = {{1, 1}, {2, 1}, {4, 2}, {3, 3}, {4, 1}, {6, 2}, {2, 2}};
  const int hi = pick(7);
  c.h.hq = heads[hi][0];
  c.h.hkv = heads[hi][1];
  c.h.hmask = pick(2) ? c.h.hq : 1;
  static const int nfuncs[] = {1, 3, 5};
  c.h.nfunc = nfuncs[pick(3)];
  const bool big = c.h.dqk >= 192;
  const int64_t smax = big ? 200 : 330;
  c.varlen = pick(2) == 0;
  if (c.varlen) {
    const int B = 1 + pick(4);
    for (int b = 0; b < B; ++b) {
      const bool zero_q = pick(6) == 0, zero_k = pick(8) == 0;
      c.lq.push_back(zero_q ? 0 : 1 + pick(int(smax)));
      c.lk.push_back(zero_k ? 0 : 1 + pick(int(smax)));
    }
    c.batch = B;
  } else {
    c.batch = 1 + pick(3);
    c.sq = 1 + pick(int(smax));
    c.sk = 1 + pick(int(smax));
  }
  c.mopt.granularity = pick(3) == 0 ? 64 : (pick(2) ? 16 : 1);
  c.strided = pick(3) == 0;
  c.deterministic = pick(2) == 0;
  // A quarter of the cases use block-structured masks (full, empty, full-minus-n tiles).
  if (pick(4) == 0) {
    c.mask = "blocks";
    c.blocks.tile_q = c.blocks.tile_k = pick(2) ? 128 : 64;
    c.blocks.p_empty_row = pick(2) ? 0.05 : 0.0;
  }
  c.dlse = pick(5) == 0;
  c.fwd_ml = pick(5) != 0;  // off: the scale drawn from the seed may be negative
  return c;
}

TEST(FlexGpu, RandomCases) {
  REQUIRE_GPU();
  for (uint64_t s = 1; s <= 96; ++s) run_case(random_case(s));
}

// Head dims the brief names explicitly, each with both dtypes, on a GQA THD problem.
// HeadDims' problem: THD samples of 150 / 0 / 70 queries and 129 / 40 / 0 keys, GQA.
Case head_dims_case(int dqk, int dv, DType t, uint64_t seed) {
  Case c;
  c.varlen = true;
  c.lq = {150, 0, 70};
  c.lk = {129, 40, 0};
  c.batch = 3;
  c.h = HeadConfig{4, 2, 4, 3, dqk, dv, t};
  c.seed = seed;
  return c;
}

TEST(FlexGpu, HeadDims) {
  REQUIRE_GPU();
  const int dims[][2] = {{8, 8}, {40, 40}, {64, 64}, {96, 96}, {128, 128}, {192, 128}, {256, 256}};
  uint64_t seed = 1000;
  for (const auto& d : dims) {
    for (DType t : {DType::kBFloat16, DType::kFloat16}) run_case(head_dims_case(d[0], d[1], t, ++seed));
  }
}

// Every backward tile of the sm80 kernels (BwdTraitsSm80: 64, 128 with Bk = 128; (192, 128),
// (256, 256) with Bk = 64) on both dQ paths (atomic: the dK/dV kernel's dQ phase and the
// split schedule's accumulators; deterministic: the dQ kernel), with exact and predicated
// head dims (Dqk != Dv and dims that leave whole warp columns idle included), random masks
// at granularity 1 (partial blocks with payloads), GQA, THD with partial key and query blocks.
TEST(FlexGpu, BwdTiles) {
  REQUIRE_GPU();
  const int dims[][2] = {{64, 64}, {128, 128}, {192, 128}, {256, 256}, {40, 64},
                         {72, 40}, {128, 72},  {24, 120},  {112, 104}};
  uint64_t seed = 1100;
  for (const auto& d : dims) {
    for (bool det : {false, true}) {
      Case c;
      c.varlen = true;
      c.lq = {200, 1, 77};
      c.lk = {190, 130, 5};
      c.batch = 3;
      c.h = HeadConfig{4, 2, 4, 3, d[0], d[1], seed % 2 == 0 ? DType::kBFloat16 : DType::kFloat16};
      c.mopt.granularity = 1;
      c.deterministic = det;
      c.seed = ++seed;
      run_case(c);
    }
  }
}

// The eight BENCHMARK.md masks (small S), BSHD B=1, GQA, D=128 and 64.
TEST(FlexGpu, BenchmarkMasks) {
  REQUIRE_GPU();
  uint64_t seed = 2000;
  for (const std::string& name : fs_test::benchmark_mask_names()) {
    Case c;
    c.mask = name;
    c.sq = name == "causal" || name == "tree_bfs" ? 2048 : 1024;
    c.h = HeadConfig{2, 1, 1, 1, 128, 128, DType::kBFloat16};
    if (name == "hstu" || name == "local") c.h = HeadConfig{2, 2, 1, 1, 64, 64, DType::kFloat16};
    c.deterministic = seed % 2 == 0;
    c.seed = ++seed;
    run_case(c);
  }
}

// MQA, Hmask = Hq, a block-granular mask (many full blocks) and a fully empty mask.
TEST(FlexGpu, SpecialMasks) {
  REQUIRE_GPU();
  {
    Case c;
    c.batch = 2;
    c.sq = 300;
    c.sk = 260;
    c.h = HeadConfig{4, 1, 4, 3, 128, 128, DType::kBFloat16};
    c.deterministic = false;
    c.mopt.granularity = 64;
    c.mopt.p_full_row = 0.4;
    c.seed = 3001;
    run_case(c);
  }
  {
    Case c;  // every row empty: out = 0, LSE = -inf, max_logit = -inf, zero gradients
    c.sq = 100;
    c.sk = 90;
    c.h = HeadConfig{2, 1, 1, 1, 64, 64, DType::kFloat16};
    c.mopt.p_empty_row = 1.0;
    c.seed = 3002;
    run_case(c);
  }
  {
    Case c;  // all scores negative: the signed max_logit reduction with negative floats
    c.batch = 2;
    c.sq = 150;
    c.sk = 170;
    c.h = HeadConfig{3, 1, 3, 3, 128, 128, DType::kBFloat16};
    c.negative_logits = true;
    c.seed = 3003;
    run_case(c);
  }
}

// Both preprocess forms (the paired one, PERF_LOG v2.33, the default since v2.65; the one-unit form of
// FLASHSPAN_BWD_PREPROCESS_PAIRED=0) on both families' backward: RandomCases' first 32 cases (random masks, GQA,
// THD with empty samples, dlse, both dtypes) and the head dims of HeadDims (8 .. 256: one to 32 lanes a row),
// every output against the CPU reference.
TEST(FlexGpu, PreprocessForms) {
  REQUIRE_GPU();
  for (int paired_on : {1, 0}) {
    SCOPED_TRACE(paired_on ? "paired preprocess" : "one-unit preprocess");
    const ForcePairedPreprocess paired(paired_on);
    for (uint64_t s = 1; s <= 32; ++s) run_case(random_case(s));
    const int dims[][2] = {{8, 8}, {40, 40}, {64, 64}, {128, 128}, {192, 128}, {256, 256}};
    uint64_t seed = 1700;
    for (const auto& d : dims) {
      ++seed;
      Case c = head_dims_case(d[0], d[1], seed % 2 == 0 ? DType::kBFloat16 : DType::kFloat16, seed);
      c.dlse = true;
      run_case(c);
    }
  }
}

// Two small problems (every kernel family once) for compute-sanitizer runs.
TEST(FlexGpu, SanitizerSmall) {
  REQUIRE_GPU();
  Case a;
  a.batch = 1;
  a.sq = 130;
  a.sk = 140;
  a.h = HeadConfig{2, 1, 2, 3, 128, 128, DType::kBFloat16};
  a.seed = 3501;
  run_case(a);
  Case b;
  b.varlen = true;
  b.lq = {70, 0, 65};
  b.lk = {66, 20, 0};
  b.batch = 3;
  b.h = HeadConfig{2, 2, 1, 1, 256, 256, DType::kFloat16};
  b.strided = true;
  b.deterministic = false;
  b.seed = 3502;
  run_case(b);
  // Split dK/dV tasks (GQA 4: key block 0 has 5 x 4 = 20 pairs > the chunk of 16).
  Case s;
  s.mask = "sink_window";
  s.sq = 320;
  s.sk = 300;
  s.h = HeadConfig{4, 1, 1, 3, 128, 128, DType::kBFloat16};
  s.deterministic = false;
  s.expect_split = true;
  s.seed = 3503;
  run_case(s);
  // Split forward tasks (global rows see all 18 key blocks > the chunk of 16), THD with an
  // uneven and an empty sample, forward only.
  Case f;
  f.mask = "global";
  f.varlen = true;
  f.lq = {1100, 0, 90};
  f.lk = {1150, 30, 0};
  f.batch = 3;
  f.h = HeadConfig{2, 1, 2, 5, 64, 64, DType::kBFloat16};
  f.backward = false;
  f.expect_fwd_split = true;
  f.seed = 3504;
  run_case(f);
}

// Non-deterministic backward with long K2Q lists: the split schedule cuts the long dK/dV
// walks into items (GQA groups of 4 so a walk spans several query heads; THD with uneven
// samples; both dtypes; head dims 64, 128 and (256, 256)).
Case split_case(const std::string& mask, HeadConfig h, uint64_t seed) {
  Case c;
  c.mask = mask;
  c.h = h;
  c.deterministic = false;
  c.expect_split = true;
  c.seed = seed;
  return c;
}

TEST(FlexGpu, SplitLongLists) {
  REQUIRE_GPU();
  {
    Case c = split_case("sink_local", HeadConfig{4, 1, 1, 1, 128, 128, DType::kBFloat16}, 8001);
    c.sq = 2048;
    run_case(c);
  }
  {
    Case c = split_case("longformer", HeadConfig{4, 1, 1, 1, 64, 64, DType::kFloat16}, 8002);
    c.sq = 1024;
    run_case(c);
  }
  {
    Case c = split_case("sink_window", HeadConfig{8, 2, 8, 3, 64, 64, DType::kFloat16}, 8003);
    c.varlen = true;
    c.lq = {1500, 37, 700};
    c.lk = {1300, 64, 900};
    c.batch = 3;
    run_case(c);
  }
  {
    Case c = split_case("sink_window", HeadConfig{4, 1, 1, 3, 128, 128, DType::kBFloat16}, 8004);
    c.batch = 2;
    c.sq = 1024;
    c.sk = 1100;
    c.strided = true;
    run_case(c);
  }
  {
    Case c = split_case("global", HeadConfig{4, 1, 1, 5, 128, 128, DType::kFloat16}, 8005);
    c.varlen = true;
    c.lq = {1100, 300, 0};
    c.lk = {1024, 257, 50};
    c.batch = 3;
    run_case(c);
  }
  {
    Case c = split_case("global", HeadConfig{8, 2, 8, 5, 64, 64, DType::kBFloat16}, 8006);
    c.sq = 1300;
    c.sk = 1300;
    run_case(c);
  }
  {
    Case c = split_case("dense", HeadConfig{4, 1, 1, 1, 128, 128, DType::kFloat16}, 8007);
    c.sq = 1024;
    c.sk = 1000;
    run_case(c);
  }
  {
    Case c = split_case("dense", HeadConfig{4, 1, 1, 1, 256, 256, DType::kBFloat16}, 8008);
    c.varlen = true;
    c.lq = {640, 300};
    c.lk = {600, 700};
    c.batch = 2;
    run_case(c);
  }
  {
    Case c = split_case("sink_window", HeadConfig{4, 1, 4, 3, 256, 256, DType::kFloat16}, 8009);
    c.sq = 1024;
    c.sk = 1024;
    c.strided = true;
    run_case(c);
  }
}

// The same structured masks on the deterministic path (no split schedule) still match.
TEST(FlexGpu, LongListsDeterministic) {
  REQUIRE_GPU();
  Case c = split_case("global", HeadConfig{4, 1, 1, 5, 128, 128, DType::kBFloat16}, 8101);
  c.varlen = true;
  c.lq = {1100, 300};
  c.lk = {1024, 257};
  c.batch = 2;
  c.deterministic = true;
  c.expect_split = false;
  run_case(c);
}

// Plans without task schedules run the kernels over every block (grid mode).
TEST(FlexGpu, GridModeWithoutTasks) {
  REQUIRE_GPU();
  Case c;
  c.varlen = true;
  c.lq = {200, 0, 90};
  c.lk = {150, 70, 0};
  c.batch = 3;
  c.h = HeadConfig{4, 2, 4, 3, 128, 128, DType::kBFloat16};
  c.grid_mode = true;
  c.deterministic = false;
  c.seed = 3601;
  run_case(c);
  c.h = HeadConfig{2, 1, 1, 1, 64, 40, DType::kFloat16};
  c.deterministic = true;
  c.seed = 3602;
  run_case(c);
}

// dq, dk, dv of one backward run of problem p (its bytes).
std::array<std::vector<uint8_t>, 3> bwd_bytes(const Problem& p) {
  auto b = alloc_bwd(p, false);
  launch_bwd(p, *b, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return {raw_bytes(b->ddq), raw_bytes(b->ddk), raw_bytes(b->ddv)};
}

// dq/dk/dv of case c (deterministic = true) bitwise identical over three backward runs.
void expect_bwd_bitwise_repeatable(const Case& c) {
  auto p = make_problem(c);
  const auto first = bwd_bytes(*p);
  for (int run = 1; run < 3; ++run) {
    const auto got = bwd_bytes(*p);
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(got[i] == first[i]) << "run " << run << " differs in output " << i;
  }
}

// deterministic = true: dq/dk/dv bitwise identical over three runs.
TEST(FlexGpu, DeterministicBackward) {
  REQUIRE_GPU();
  Case c;
  c.varlen = true;
  c.lq = {700, 333};
  c.lk = {650, 400};
  c.batch = 2;
  c.h = HeadConfig{4, 2, 1, 3, 128, 128, DType::kBFloat16};
  c.deterministic = true;
  c.seed = 4001;
  expect_bwd_bitwise_repeatable(c);
}

// Forward split schedule: query blocks with rows that see every key (global rows, dense)
// walk more key blocks than the chunk (16), so their tasks are cut into items whose partial
// results the combine kernel merges. GQA, Hmask = Hq, THD with uneven samples, both dtypes,
// head dims 64, 128, (192, 128) and (256, 256), with and without LSE / max_logit.
Case fwd_split_case(const std::string& mask, HeadConfig h, uint64_t seed) {
  Case c;
  c.mask = mask;
  c.h = h;
  c.backward = false;
  c.expect_fwd_split = true;
  c.seed = seed;
  return c;
}

TEST(FlexGpu, FwdSplitLongLists) {
  REQUIRE_GPU();
  {
    Case c = fwd_split_case("global", HeadConfig{8, 2, 8, 5, 64, 64, DType::kBFloat16}, 8201);
    c.sq = 1300;
    c.sk = 1300;
    run_case(c);
  }
  {
    Case c = fwd_split_case("global", HeadConfig{4, 1, 4, 5, 128, 128, DType::kFloat16}, 8202);
    c.varlen = true;
    c.lq = {1100, 300, 0, 77};
    c.lk = {1500, 257, 50, 1090};
    c.batch = 4;
    run_case(c);
  }
  {
    Case c = fwd_split_case("global", HeadConfig{4, 2, 1, 5, 128, 128, DType::kBFloat16}, 8203);
    c.sq = 700;
    c.sk = 2048;
    c.fwd_lse = false;
    c.fwd_ml = false;
    run_case(c);
  }
  {
    Case c = fwd_split_case("global", HeadConfig{4, 2, 4, 5, 64, 64, DType::kFloat16}, 8204);
    c.sq = 1500;
    c.sk = 1400;
    c.fwd_ml = false;
    c.strided = true;
    run_case(c);
  }
  {
    Case c = fwd_split_case("dense", HeadConfig{4, 1, 1, 1, 128, 128, DType::kBFloat16}, 8205);
    c.sq = 1024;
    c.sk = 2048;
    c.fwd_lse = false;
    run_case(c);
  }
  {
    Case c = fwd_split_case("dense", HeadConfig{4, 2, 1, 1, 256, 256, DType::kBFloat16}, 8206);
    c.varlen = true;
    c.lq = {640, 300};
    c.lk = {1200, 700};
    c.batch = 2;
    run_case(c);
  }
  {
    Case c = fwd_split_case("global", HeadConfig{2, 1, 2, 5, 256, 256, DType::kFloat16}, 8207);
    c.sq = 300;
    c.sk = 1500;
    run_case(c);
  }
  {
    Case c = fwd_split_case("dense", HeadConfig{2, 1, 1, 1, 192, 128, DType::kFloat16}, 8208);
    c.sq = 260;
    c.sk = 1200;
    run_case(c);
  }
  {
    Case c = fwd_split_case("longformer", HeadConfig{4, 1, 1, 1, 64, 64, DType::kFloat16}, 8209);
    c.sq = 2048;
    run_case(c);
  }
  {
    // A split forward and a split (non-deterministic) backward in one case.
    Case c = fwd_split_case("global", HeadConfig{4, 1, 1, 5, 128, 128, DType::kBFloat16}, 8210);
    c.sq = 1200;
    c.sk = 1100;
    c.backward = true;
    c.deterministic = false;
    run_case(c);
  }
}

// Block-structured masks (mask_gen.h): tiles of 128 x 128 that are full, empty, partial or
// "full minus n" (1..8 elements hidden at tile corners, edges or inside), so every forward
// and backward tile meets full blocks next to blocks missing a single element (a kernel
// or planner that treated those as full would leave the element unmasked). Every sm80
// tile family (head dims 64, 128, (192, 128), (256, 256), predicated dims), both dQ paths,
// THD with tails, GQA, per-head masks.
TEST(FlexGpu, FullMinusOneBlocks) {
  REQUIRE_GPU();
  const int dims[][2] = {{64, 64}, {128, 128}, {192, 128}, {256, 256}, {96, 96}, {40, 64}};
  uint64_t seed = 3100;
  for (const auto& d : dims) {
    for (bool mostly_minus_one : {false, true}) {
      Case c;
      c.mask = "blocks";
      c.varlen = true;
      c.lq = {300, 130};
      c.lk = {520, 257};
      c.batch = 2;
      c.h = HeadConfig{4, 2, 4, 1, d[0], d[1], seed % 2 == 0 ? DType::kBFloat16 : DType::kFloat16};
      if (mostly_minus_one) {
        c.blocks.p_full = 0.3;
        c.blocks.p_empty = 0.05;
        c.blocks.p_full_minus = 0.6;
        c.blocks.max_missing = 1;
      }
      c.deterministic = seed % 3 != 0;
      c.expect_full_blocks = true;
      c.seed = ++seed;
      run_case(c);
    }
  }
  // Tiles of 64 x 64 (smaller than the 128-row forward tile: a block mixes tile classes).
  Case c;
  c.mask = "blocks";
  c.batch = 2;
  c.sq = 257;
  c.sk = 320;
  c.h = HeadConfig{2, 1, 2, 1, 128, 128, DType::kBFloat16};
  c.blocks.tile_q = c.blocks.tile_k = 64;
  c.seed = 3199;
  run_case(c);
}

// Split schedules (forward combine and dK/dV split) over rows that see nothing: long rows
// (mostly full tiles) with 5 % empty rows and some empty query tiles in between, so the
// combine step meets empty rows (LSE -inf, out 0) inside split tasks.
TEST(FlexGpu, SplitWithEmptyRows) {
  REQUIRE_GPU();
  fs_test::BlockMaskSpec spec;
  spec.p_full = 0.75;
  spec.p_empty = 0.0;
  spec.p_full_minus = 0.2;
  spec.p_empty_row = 0.05;
  spec.p_empty_q_tile = 0.05;
  {
    Case c = fwd_split_case("dense", HeadConfig{4, 1, 1, 1, 128, 128, DType::kBFloat16}, 8501);
    c.mask = "blocks";
    c.blocks = spec;
    c.sq = 1024;
    c.sk = 2048;
    run_case(c);
  }
  {
    Case c = fwd_split_case("dense", HeadConfig{4, 2, 4, 1, 64, 64, DType::kFloat16}, 8502);
    c.mask = "blocks";
    c.blocks = spec;
    c.sq = 1300;
    c.sk = 1300;
    c.fwd_ml = false;
    run_case(c);
  }
  {
    Case c = split_case("dense", HeadConfig{4, 1, 1, 1, 128, 128, DType::kFloat16}, 8503);
    c.mask = "blocks";
    c.blocks = spec;
    c.sq = 1024;
    c.sk = 1000;
    run_case(c);
  }
}

// The split / persistent paths with predicated head dims (not a multiple of the 64-wide
// k-chunk, or Dqk != Dv) on the 128-row forward tile and the 64 x 128 backward tile.
TEST(FlexGpu, SplitPredicatedHeadDims) {
  REQUIRE_GPU();
  const int dims[][2] = {{96, 96}, {40, 64}, {72, 40}, {112, 104}};
  uint64_t seed = 8600;
  for (const auto& d : dims) {
    const DType t = seed % 2 == 0 ? DType::kBFloat16 : DType::kFloat16;
    {
      Case c = fwd_split_case("dense", HeadConfig{4, 1, 1, 1, d[0], d[1], t}, ++seed);
      c.sq = 1024;
      c.sk = 2048;
      run_case(c);
    }
    {
      Case c = split_case("dense", HeadConfig{4, 1, 1, 1, d[0], d[1], t}, ++seed);
      c.sq = 1024;
      c.sk = 1000;
      run_case(c);
    }
  }
}

// max_logit not requested (the kernels' max_logit-off instantiations) for the big-head-dim
// tiles (192, 128) and (256, 256), split and unsplit, LSE on and off, with a negative
// softmax_scale (allowed only without max_logit).
TEST(FlexGpu, MaxLogitOffBigHeadDims) {
  REQUIRE_GPU();
  uint64_t seed = 8700;
  for (const auto& d : {std::pair<int, int>{192, 128}, {256, 256}}) {
    for (bool lse : {true, false}) {
      Case c;
      c.varlen = true;
      c.lq = {200, 1, 77};
      c.lk = {190, 130, 5};
      c.batch = 3;
      c.h = HeadConfig{4, 2, 4, 3, d.first, d.second, lse ? DType::kBFloat16 : DType::kFloat16};
      c.fwd_ml = false;
      c.fwd_lse = lse;
      c.scale_kind = 2;
      c.scale_value = lse ? -0.07f : 0.11f;
      c.seed = ++seed;
      run_case(c);
    }
    Case s = fwd_split_case("dense", HeadConfig{2, 1, 1, 1, d.first, d.second, DType::kBFloat16}, ++seed);
    s.sq = 260;
    s.sk = 1200;
    s.fwd_ml = false;
    s.scale_kind = 2;
    s.scale_value = -0.05f;
    run_case(s);
  }
}

// The LSE gradient (dlse) on both dQ paths, with split dK/dV tasks, GQA, THD tails.
TEST(FlexGpu, DlseBackward) {
  REQUIRE_GPU();
  uint64_t seed = 8800;
  for (const auto& d : {std::pair<int, int>{64, 64}, {128, 128}, {192, 128}, {256, 256}}) {
    for (bool det : {true, false}) {
      Case c;
      c.varlen = true;
      c.lq = {200, 0, 77};
      c.lk = {190, 30, 129};
      c.batch = 3;
      c.h = HeadConfig{4, 2, 4, 3, d.first, d.second, det ? DType::kBFloat16 : DType::kFloat16};
      c.deterministic = det;
      c.dlse = true;
      c.seed = ++seed;
      run_case(c);
    }
  }
  Case s = split_case("sink_window", HeadConfig{4, 1, 1, 3, 128, 128, DType::kBFloat16}, ++seed);
  s.sq = 320;
  s.sk = 300;
  s.dlse = true;
  run_case(s);
}

// Without a workspace (or in grid mode) the forward runs one CTA per task, unsplit.
TEST(FlexGpu, FwdLongListsUnsplit) {
  REQUIRE_GPU();
  Case c = fwd_split_case("global", HeadConfig{4, 1, 4, 5, 64, 64, DType::kBFloat16}, 8301);
  c.sq = 1300;
  c.sk = 1300;
  c.expect_fwd_split = false;
  c.fwd_workspace = false;
  run_case(c);
  c.fwd_workspace = true;
  c.grid_mode = true;
  c.seed = 8302;
  run_case(c);
}

// A split forward captured into a CUDA graph; replays give the eager results bitwise.
TEST(FlexGpu, FwdSplitGraphReplay) {
  REQUIRE_GPU();
  Case c = fwd_split_case("global", HeadConfig{4, 2, 4, 5, 64, 64, DType::kFloat16}, 8401);
  c.sq = 1300;
  c.sk = 1300;
  auto p = make_problem(c);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  auto fe = alloc_fwd(*p, false);
  launch_fwd(*p, *fe, s);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  auto fg = alloc_fwd(*p, false);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  launch_fwd(*p, *fg, s);
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int rep = 0; rep < 2; ++rep) {
    for (DevTensor* d : {&fg->dout_, &fg->dlse, &fg->dml}) poison(*d, s);
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_TRUE(raw_bytes(fg->dout_) == raw_bytes(fe->dout_)) << "out, replay " << rep;
    EXPECT_TRUE(raw_bytes(fg->dlse) == raw_bytes(fe->dlse)) << "lse, replay " << rep;
    EXPECT_TRUE(raw_bytes(fg->dml) == raw_bytes(fe->dml)) << "max_logit, replay " << rep;
  }
  download(fe->dout_, fe->out);
  EXPECT_TRUE(fs_test::tensor_close(fe->out.to_vector(), p->ref_out.to_vector(), p->g.dtype)) << "out";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

// ---------------------------------------------------------------------------
// Packed GQA (plan.signature.pack_gqa): the forward runs one CTA per packed query block of a
// kv head (rows s * G + g = position s of query head hkv * G + g), gathering Q rows and
// scattering O / LSE rows per row, max_logit per head; the backward view is the unpacked one.
// ---------------------------------------------------------------------------

// Random packed cases: G in {2, 4, 8}, Hkv in {1, 2}, Hmask 1 or Hq, BSHD and THD (uneven and
// empty samples), decode-like Sq in {1, 5, 17} and Sq ~ 300, every forward tile with exact
// and predicated head dims, both dtypes, strided tensors, half of them with a backward.
Case packed_random_case(uint64_t seed) {
  Rng rng(seed * 104729 + 17);
  auto pick = [&](int n) { return int(rng() % uint64_t(n)); };
  Case c;
  c.seed = seed;
  c.pack_gqa = true;
  c.h.dtype = pick(2) ? DType::kBFloat16 : DType::kFloat16;
  static const int dims[][2] = {{64, 64}, {128, 128}, {72, 72}, {40, 40},   {128, 64},
                                {64, 128}, {96, 80},  {192, 128}, {256, 256}, {8, 16}};
  const int di = pick(sizeof(dims) / sizeof(dims[0]));
  c.h.dqk = dims[di][0];
  c.h.dv = dims[di][1];
  static const int groups[] = {2, 4, 8};
  const int G = groups[pick(3)];
  c.h.hkv = 1 + pick(2);
  c.h.hq = G * c.h.hkv;
  c.h.hmask = pick(2) ? c.h.hq : 1;
  static const int nfuncs[] = {1, 3, 5};
  c.h.nfunc = nfuncs[pick(3)];
  const bool big = c.h.dqk >= 192;
  auto seqlen_q = [&]() -> int64_t {
    static const int64_t decode[] = {1, 5, 17};
    return pick(2) ? decode[pick(3)] : (big ? 150 : 250) + pick(100);
  };
  const int64_t smax_k = big ? 300 : 500;
  c.varlen = pick(2) == 0;
  if (c.varlen) {
    const int B = 1 + pick(4);
    for (int b = 0; b < B; ++b) {
      c.lq.push_back(pick(6) == 0 ? 0 : seqlen_q());
      c.lk.push_back(pick(8) == 0 ? 0 : 1 + pick(int(smax_k)));
    }
    c.batch = B;
  } else {
    c.batch = 1 + pick(3);
    c.sq = seqlen_q();
    c.sk = 1 + pick(int(smax_k));
  }
  c.mopt.granularity = pick(3) == 0 ? 64 : (pick(2) ? 16 : 1);
  c.strided = pick(3) == 0;
  c.backward = pick(2) == 0;
  c.deterministic = pick(2) == 0;
  c.negative_logits = pick(8) == 0;
  return c;
}

TEST(FlexGpu, PackedGqaRandom) {
  REQUIRE_GPU();
  for (uint64_t s = 1; s <= 40; ++s) run_case(packed_random_case(s));
}

// Decode-like shapes (Sq << Bq: the case packing is for) and one long prefill, every head
// group size, Hmask = 1 and Hq, LSE and max_logit (also all-negative logits for the signed
// per-head max), both layouts.
TEST(FlexGpu, PackedGqaDecode) {
  REQUIRE_GPU();
  uint64_t seed = 9000;
  for (int64_t sq : {1, 5, 17}) {
    for (int G : {2, 4, 8}) {
      Case c;
      c.pack_gqa = true;
      c.batch = 2;
      c.sq = sq;
      c.sk = 700;
      const int hkv = G == 8 ? 1 : 2;
      c.h = HeadConfig{G * hkv, hkv, G == 4 ? G * hkv : 1, 3, 128, 128, DType::kBFloat16};
      c.backward = G == 2;
      c.expect_fwd_bq = sq * G <= kDecodeBlockQ ? kDecodeBlockQ : 128;
      c.seed = ++seed;
      run_case(c);
      if (sq == 1) {
        // The same decode shape on the default 128-row tile (a plan built with consumer_for).
        c.default_tile = true;
        c.expect_fwd_bq = 128;
        c.seed = ++seed;
        run_case(c);
      }
    }
  }
  {
    Case c;  // THD decode batch: uneven lengths, an empty sample, D 64, fp16
    c.pack_gqa = true;
    c.varlen = true;
    c.lq = {1, 0, 5, 17, 3};
    c.lk = {300, 40, 0, 513, 64};
    c.batch = 5;
    c.h = HeadConfig{8, 2, 8, 5, 64, 64, DType::kFloat16};
    c.seed = ++seed;
    run_case(c);
  }
  {
    Case c;  // all scores negative: the signed per-head max_logit with packed rows
    c.pack_gqa = true;
    c.batch = 2;
    c.sq = 33;
    c.sk = 200;
    c.h = HeadConfig{6, 2, 6, 3, 64, 64, DType::kBFloat16};  // G = 3 (not a power of two)
    c.negative_logits = true;
    c.seed = ++seed;
    run_case(c);
  }
  {
    Case c;  // long prefill, G = 4: many packed blocks per kv head, strided tensors
    c.pack_gqa = true;
    c.sq = 600;
    c.sk = 650;
    c.h = HeadConfig{8, 2, 1, 3, 128, 128, DType::kFloat16};
    c.strided = true;
    c.deterministic = false;
    c.seed = ++seed;
    run_case(c);
  }
}

// The forward split schedule over packed tasks: global rows see every key block (> the chunk
// of 16), and a decode batch (few packed tasks, long key walks) is split flash-decoding style.
// The combine kernel writes O / LSE per packed row.
TEST(FlexGpu, PackedGqaFwdSplit) {
  REQUIRE_GPU();
  {
    Case c = fwd_split_case("global", HeadConfig{8, 2, 8, 5, 64, 64, DType::kBFloat16}, 9101);
    c.pack_gqa = true;
    c.sq = 1300;
    c.sk = 1300;
    run_case(c);
  }
  {
    Case c = fwd_split_case("global", HeadConfig{4, 1, 1, 5, 128, 128, DType::kFloat16}, 9102);
    c.pack_gqa = true;
    c.varlen = true;
    c.lq = {1100, 0, 300, 77};
    c.lk = {1500, 50, 257, 1090};
    c.batch = 4;
    c.strided = true;
    run_case(c);
  }
  {
    Case c = fwd_split_case("dense", HeadConfig{16, 2, 1, 1, 128, 128, DType::kBFloat16}, 9103);
    c.pack_gqa = true;  // decode: Sq = 5, 8 x 5 = 40 packed rows, 32 key blocks per task
    c.batch = 2;
    c.sq = 5;
    c.sk = 2048;
    run_case(c);
  }
  {
    Case c = fwd_split_case("global", HeadConfig{8, 1, 8, 5, 256, 256, DType::kFloat16}, 9104);
    c.pack_gqa = true;  // (256, 256) tile (Bq = 64), Hmask = Hq, short queries with a global row (pos 7)
    c.varlen = true;
    c.lq = {17, 1, 40};
    c.lk = {1500, 1100, 1300};
    c.batch = 3;
    c.fwd_lse = false;
    run_case(c);
  }
  {
    Case c = fwd_split_case("global", HeadConfig{4, 2, 4, 5, 192, 128, DType::kBFloat16}, 9105);
    c.pack_gqa = true;  // (192, 128) tile, a split forward then a split backward
    c.sq = 700;
    c.sk = 1200;
    c.backward = true;
    c.deterministic = false;
    run_case(c);
  }
}

// Packed plans without task lists (grid over (packed query block, kv head)) and a packed
// forward without a workspace (one CTA per packed task, unsplit).
TEST(FlexGpu, PackedGqaGridAndNoWorkspace) {
  REQUIRE_GPU();
  Case c;
  c.pack_gqa = true;
  c.varlen = true;
  c.lq = {200, 0, 9};
  c.lk = {150, 70, 0};
  c.batch = 3;
  c.h = HeadConfig{8, 2, 8, 3, 128, 128, DType::kBFloat16};
  c.grid_mode = true;
  c.deterministic = false;
  c.seed = 9201;
  run_case(c);
  c.h = HeadConfig{4, 1, 1, 1, 64, 40, DType::kFloat16};
  c.seed = 9202;
  run_case(c);
  Case d = fwd_split_case("global", HeadConfig{4, 1, 4, 5, 64, 64, DType::kBFloat16}, 9203);
  d.pack_gqa = true;
  d.sq = 1300;
  d.sk = 1300;
  d.expect_fwd_split = false;
  d.fwd_workspace = false;
  d.fwd_ml = false;  // max_logit not requested: its buffer stays untouched
  run_case(d);
}

// A packed forward, then the (unpacked) backward through the same plan fed with the
// forward's own out and LSE; gradients against the reference.
void packed_fwd_then_bwd(const Case& c) {
  SCOPED_TRACE(c.describe());
  std::unique_ptr<Problem> pp;
  ASSERT_NO_THROW(pp = make_problem(c));
  Problem& p = *pp;
  expect_packed_plan(p);
  if (c.expect_fwd_bq > 0) {
    ASSERT_EQ(p.plan->signature.consumer.fwd_block_q, c.expect_fwd_bq) << "forward tile rows";
  }
  const DType dt = p.g.dtype;
  auto f = alloc_fwd(p, c.strided);
  ASSERT_NO_THROW(launch_fwd(p, *f, nullptr));
  auto b = alloc_bwd(p, c.strided);
  FlexBwdLaunch a;
  a.geometry = &p.gd;
  a.plan = p.plan.get();
  a.q = p.dq_in.view;
  a.k = p.dk_in.view;
  a.v = p.dv_in.view;
  a.out = f->dout_.view;
  a.dout = p.ddout.view;
  a.lse = f->dlse.view;
  a.dq = b->ddq.view;
  a.dk = b->ddk.view;
  a.dv = b->ddv.view;
  a.softmax_scale = p.scale;
  a.deterministic = c.deterministic;
  a.workspace = b->ws->p;
  a.workspace_bytes = b->ws->bytes;
  ASSERT_NO_THROW(launch_flex_bwd(a));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  download(f->dout_, f->out);
  download(f->dlse, f->lse);
  EXPECT_TRUE(fs_test::tensor_close(f->out.to_vector(), p.ref_out.to_vector(), dt)) << "out";
  EXPECT_TRUE(fs_test::stat_close(f->lse.to_vector(), p.ref_lse.to_vector())) << "lse";
  download(b->ddq, b->dq);
  download(b->ddk, b->dk);
  download(b->ddv, b->dv);
  EXPECT_TRUE(fs_test::tensor_close(b->dq.to_vector(), p.ref_dq.to_vector(), dt)) << "dq";
  EXPECT_TRUE(fs_test::tensor_close(b->dk.to_vector(), p.ref_dk.to_vector(), dt)) << "dk";
  EXPECT_TRUE(fs_test::tensor_close(b->dv.to_vector(), p.ref_dv.to_vector(), dt)) << "dv";
  EXPECT_EQ(b->dq.padding_changed(), 0) << "dq: stray writes";
}

TEST(FlexGpu, PackedGqaFwdThenBwd) {
  REQUIRE_GPU();
  Case c;
  c.pack_gqa = true;
  c.varlen = true;
  c.lq = {5, 300, 0, 130};
  c.lk = {400, 290, 60, 1};
  c.batch = 4;
  c.h = HeadConfig{8, 2, 8, 3, 128, 128, DType::kBFloat16};
  c.deterministic = false;
  c.seed = 9301;
  packed_fwd_then_bwd(c);
  c.h = HeadConfig{4, 1, 1, 5, 72, 72, DType::kFloat16};
  c.strided = true;
  c.deterministic = true;
  c.seed = 9302;
  packed_fwd_then_bwd(c);
}

// ---------------------------------------------------------------------------
// The 16-row decode forward tile (consumer_for_plan: packed plans with max_seqlen_q * G <=
// 16 and head dims <= 128; one warp per CTA): exact (128) and predicated head dims, Hmask 1
// and Hq, BSHD and THD with empty samples, LSE and max_logit on and off (one-warp tiles test
// p.max_logit at run time), 16 packed rows exactly and just above (default tile), the split
// schedule (persistent kernel + combine) and the unsplit paths (no workspace, grid mode),
// and a packed decode forward followed by the backward.
// ---------------------------------------------------------------------------

TEST(FlexGpu, PackedDecodeTile) {
  REQUIRE_GPU();
  uint64_t seed = 9500;
  auto decode = [&](int64_t sq, int64_t sk, HeadConfig h, int batch = 2) {
    Case c;
    c.pack_gqa = true;
    c.batch = batch;
    c.sq = sq;
    c.sk = sk;
    c.h = h;
    c.backward = false;
    c.expect_fwd_bq = sq * (h.hq / h.hkv) <= kDecodeBlockQ ? kDecodeBlockQ : 128;
    c.seed = ++seed;
    return c;
  };
  // Sq = 1, G = 4, exact 128, Hmask 1; then Hmask = Hq, fp16.
  run_case(decode(1, 700, HeadConfig{8, 2, 1, 3, 128, 128, DType::kBFloat16}, 3));
  run_case(decode(1, 513, HeadConfig{8, 2, 8, 5, 128, 128, DType::kFloat16}));
  // Exactly 16 packed rows (Sq = 2, G = 8; Sq = 8, G = 2), predicated head dims.
  run_case(decode(2, 333, HeadConfig{8, 1, 8, 3, 72, 72, DType::kFloat16}));
  run_case(decode(8, 640, HeadConfig{4, 2, 1, 1, 64, 64, DType::kBFloat16}));
  run_case(decode(2, 250, HeadConfig{16, 2, 16, 3, 128, 64, DType::kBFloat16}));
  run_case(decode(1, 400, HeadConfig{4, 1, 4, 5, 40, 96, DType::kFloat16}));
  // Just above 16 rows: the default tile (Sq = 9, G = 2; Sq = 3, G = 6).
  run_case(decode(9, 300, HeadConfig{4, 2, 4, 3, 128, 128, DType::kBFloat16}));
  run_case(decode(3, 300, HeadConfig{6, 1, 1, 3, 64, 64, DType::kFloat16}));
  {
    // No LSE, no max_logit (the run-time max_logit test of the one-warp kernel); strided.
    Case c = decode(2, 900, HeadConfig{8, 2, 8, 3, 128, 128, DType::kFloat16});
    c.fwd_lse = false;
    c.fwd_ml = false;
    c.strided = true;
    run_case(c);
  }
  {
    // All scores negative: the signed per-head max_logit over packed rows.
    Case c = decode(3, 260, HeadConfig{8, 2, 8, 3, 128, 128, DType::kBFloat16});
    c.negative_logits = true;
    run_case(c);
  }
  {
    // THD decode batch with an empty query sample and an empty key sample, Hmask = Hq.
    Case c = decode(1, 1, HeadConfig{8, 2, 8, 5, 64, 64, DType::kFloat16});
    c.varlen = true;
    c.lq = {1, 0, 4, 2, 3};
    c.lk = {300, 40, 0, 513, 64};
    c.batch = 5;
    c.strided = true;
    run_case(c);
    c.h = HeadConfig{8, 2, 1, 3, 128, 128, DType::kBFloat16};
    c.seed = ++seed;
    run_case(c);
  }
  // The split schedule on decode tiles (flash-decoding): few packed tasks with long walks.
  {
    Case c = fwd_split_case("dense", HeadConfig{16, 4, 1, 1, 128, 128, DType::kBFloat16}, ++seed);
    c.pack_gqa = true;  // Sq = 1, G = 4: 4 packed rows, 64 key blocks per task
    c.batch = 2;
    c.sq = 1;
    c.sk = 4096;
    c.expect_fwd_bq = kDecodeBlockQ;
    run_case(c);
    c.fwd_ml = false;  // persistent one-warp kernel without max_logit
    c.fwd_lse = false;
    c.seed = ++seed;
    run_case(c);
  }
  {
    Case c = fwd_split_case("dense", HeadConfig{8, 1, 8, 1, 72, 72, DType::kFloat16}, ++seed);
    c.pack_gqa = true;  // THD, Sq <= 2, G = 8 (16 rows), predicated dims, Hmask = Hq
    c.varlen = true;
    c.lq = {2, 0, 1, 2};
    c.lk = {3000, 100, 1500, 0};
    c.batch = 4;
    c.expect_fwd_bq = kDecodeBlockQ;
    run_case(c);
  }
  {
    Case c = fwd_split_case("sink_window", HeadConfig{8, 2, 8, 3, 128, 128, DType::kBFloat16}, ++seed);
    c.pack_gqa = true;  // Sq = 2, G = 4, a short walk per row: the schedule splits nothing
    c.sq = 2;
    c.sk = 2500;
    c.expect_fwd_split = false;
    c.expect_fwd_bq = kDecodeBlockQ;
    run_case(c);
  }
  {
    // The same long decode walks unsplit: without a workspace, and in grid mode.
    Case c = fwd_split_case("dense", HeadConfig{8, 2, 1, 1, 128, 128, DType::kFloat16}, ++seed);
    c.pack_gqa = true;
    c.batch = 2;
    c.sq = 3;
    c.sk = 2100;
    c.expect_fwd_split = false;
    c.fwd_workspace = false;
    c.expect_fwd_bq = kDecodeBlockQ;
    run_case(c);
    c.fwd_workspace = true;
    c.grid_mode = true;
    c.h = HeadConfig{8, 2, 8, 1, 64, 64, DType::kBFloat16};
    c.seed = ++seed;
    run_case(c);
  }
  {
    // A packed decode forward on the decode tile, then the backward (its own tile).
    Case c;
    c.pack_gqa = true;
    c.varlen = true;
    c.lq = {1, 4, 0, 2};
    c.lk = {400, 290, 60, 1};
    c.batch = 4;
    c.h = HeadConfig{8, 2, 8, 3, 128, 128, DType::kBFloat16};
    c.deterministic = false;
    c.expect_fwd_bq = kDecodeBlockQ;
    c.seed = ++seed;
    packed_fwd_then_bwd(c);
    c.varlen = false;
    c.batch = 2;
    c.sq = 2;
    c.sk = 700;
    c.h = HeadConfig{8, 1, 1, 5, 72, 72, DType::kFloat16};
    c.deterministic = true;
    c.strided = true;
    c.seed = ++seed;
    packed_fwd_then_bwd(c);
  }
}

// The forward workspace bound covers every packed plan of a geometry: max_tasks >= Hkv x
// the packed query blocks (host arithmetic only; runs without a GPU).
TEST(FlexGpu, PackedFwdWorkspaceBound) {
  Rng rng(9401);
  for (int it = 0; it < 200; ++it) {
    const int hkv = 1 + int(rng() % 3), G = 1 + int(rng() % 8);
    HeadConfig h{G * hkv, hkv, 1, 1, 64, 64, DType::kBFloat16};
    std::vector<int64_t> lq, lk;
    const int B = 1 + int(rng() % 5);
    for (int b = 0; b < B; ++b) {
      lq.push_back(int64_t(rng() % 3000) + (b == 0 ? 1 : 0));
      lk.push_back(1200 + int64_t(rng() % 3000));  // long enough for a split workspace
    }
    const FlexGeometry g = make_thd_geometry(lq, lk, h);
    for (bool pack : {false, true}) {
      for (int bq : {128, kDecodeBlockQ}) {
        PlanSignature sig;
        sig.consumer.fwd_block_q = bq;
        sig.consumer.fwd_block_k = 64;
        sig.pack_gqa = pack;
        const FwdWorkspaceLayout wl = fwd_workspace_layout(g, sig);
        const int64_t P = pack ? G : 1;
        int64_t nqb = 0;
        for (int b = 0; b < B; ++b) nqb += (lq[b] * P + bq - 1) / bq;
        EXPECT_GE(wl.max_tasks, int64_t(g.num_heads_q / P) * nqb) << "G=" << G << " pack=" << pack << " bq=" << bq;
        EXPECT_GT(wl.total, 0u);
      }
    }
  }
}

// Forward and backward captured into one CUDA graph; replays give the eager results
// (bitwise; dq only up to accumulation order on the atomic path).
void graph_replay(bool deterministic) {
  SCOPED_TRACE(deterministic ? "deterministic" : "atomic dq");
  Case c;
  c.batch = 2;
  c.sq = 384;
  c.sk = 320;
  c.h = HeadConfig{4, 2, 4, 3, 64, 64, DType::kFloat16};
  c.deterministic = deterministic;
  c.seed = 5001;
  auto p = make_problem(c);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  auto fe = alloc_fwd(*p, false);
  auto be = alloc_bwd(*p, false);
  launch_fwd(*p, *fe, s);
  launch_bwd(*p, *be, s);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);

  auto fg = alloc_fwd(*p, false);
  auto bg = alloc_bwd(*p, false);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  launch_fwd(*p, *fg, s);
  launch_bwd(*p, *bg, s);
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int rep = 0; rep < 2; ++rep) {
    for (DevTensor* d : {&fg->dout_, &fg->dlse, &fg->dml, &bg->ddq, &bg->ddk, &bg->ddv}) poison(*d, s);
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_TRUE(raw_bytes(fg->dout_) == raw_bytes(fe->dout_)) << "out, replay " << rep;
    EXPECT_TRUE(raw_bytes(fg->dlse) == raw_bytes(fe->dlse)) << "lse, replay " << rep;
    EXPECT_TRUE(raw_bytes(fg->dml) == raw_bytes(fe->dml)) << "max_logit, replay " << rep;
    if (deterministic) {
      EXPECT_TRUE(raw_bytes(bg->ddq) == raw_bytes(be->ddq)) << "dq, replay " << rep;
    } else {
      download(bg->ddq, bg->dq);
      download(be->ddq, be->dq);
      // Atomic dQ accumulation: runs differ only in fp32 summation order.
      EXPECT_TRUE(fs_test::tensor_close(bg->dq.to_vector(), be->dq.to_vector(), p->g.dtype)) << "dq, replay " << rep;
    }
    EXPECT_TRUE(raw_bytes(bg->ddk) == raw_bytes(be->ddk)) << "dk, replay " << rep;
    EXPECT_TRUE(raw_bytes(bg->ddv) == raw_bytes(be->ddv)) << "dv, replay " << rep;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

TEST(FlexGpu, CudaGraphReplay) {
  REQUIRE_GPU();
  graph_replay(true);
  graph_replay(false);
}

// Two streams run forward + backward concurrently on one shared plan.
TEST(FlexGpu, TwoStreamsSharePlan) {
  REQUIRE_GPU();
  Case c;
  c.varlen = true;
  c.lq = {513, 200, 64};
  c.lk = {400, 333, 1};
  c.batch = 3;
  c.h = HeadConfig{4, 4, 1, 3, 128, 128, DType::kBFloat16};
  c.seed = 6001;
  auto p = make_problem(c);
  auto fe = alloc_fwd(*p, false);
  auto be = alloc_bwd(*p, false);
  launch_fwd(*p, *fe, nullptr);
  launch_bwd(*p, *be, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  cudaStream_t s[2];
  std::unique_ptr<FwdOut> f[2];
  std::unique_ptr<BwdOut> b[2];
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking), cudaSuccess);
    f[i] = alloc_fwd(*p, false);
    b[i] = alloc_bwd(*p, false);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int rep = 0; rep < 3; ++rep) {
    for (int i = 0; i < 2; ++i) {
      launch_fwd(*p, *f[i], s[i]);
      launch_bwd(*p, *b[i], s[i]);
    }
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(raw_bytes(f[i]->dout_) == raw_bytes(fe->dout_)) << "out, stream " << i;
    EXPECT_TRUE(raw_bytes(f[i]->dlse) == raw_bytes(fe->dlse)) << "lse, stream " << i;
    EXPECT_TRUE(raw_bytes(b[i]->ddq) == raw_bytes(be->ddq)) << "dq, stream " << i;
    EXPECT_TRUE(raw_bytes(b[i]->ddk) == raw_bytes(be->ddk)) << "dk, stream " << i;
    EXPECT_TRUE(raw_bytes(b[i]->ddv) == raw_bytes(be->ddv)) << "dv, stream " << i;
    cudaStreamDestroy(s[i]);
  }
}

// Forward without the optional outputs leaves their buffers alone.
TEST(FlexGpu, OptionalOutputsOff) {
  REQUIRE_GPU();
  Case c;
  c.sq = 200;
  c.sk = 150;
  c.h = HeadConfig{2, 1, 1, 1, 64, 64, DType::kBFloat16};
  c.backward = false;
  c.seed = 7001;
  auto p = make_problem(c);
  auto f = alloc_fwd(*p, false);
  launch_fwd(*p, *f, nullptr, false, false);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  download(f->dout_, f->out);
  download(f->dlse, f->lse);
  EXPECT_TRUE(fs_test::tensor_close(f->out.to_vector(), p->ref_out.to_vector(), p->g.dtype)) << "out";
  for (double x : f->lse.to_vector()) ASSERT_TRUE(std::isnan(x)) << "lse written although not requested";
}

// Support checks name the argument and the rule.
TEST(FlexGpu, SupportChecks) {
  REQUIRE_GPU();
  Case c;
  c.sq = 64;
  c.sk = 64;
  c.h = HeadConfig{1, 1, 1, 1, 64, 64, DType::kBFloat16};
  c.backward = false;
  auto p = make_problem(c);
  FlexGeometry g = p->gd;
  g.dtype = DType::kFloat32;
  EXPECT_TRUE(throws_error([&] { flex_check_support_gpu(g, *p->plan, false); }, Status::kNotSupported, "q:"));
  g = p->gd;
  EXPECT_TRUE(throws_error([&] { flex_check_support_gpu(g, *p->plan, true); }, Status::kNotSupported,
                           "backward"));
  MaskPlan other;
  other.geometry = p->gd;
  other.signature = p->plan->signature;
  other.signature.consumer.arch = 90;
  EXPECT_TRUE(throws_error([&] { flex_check_support_gpu(g, other, false); }, Status::kNotSupported, "mask_plan"));
  other.signature.consumer = consumer_for(80, 256, 256);
  EXPECT_TRUE(throws_error([&] { flex_check_support_gpu(g, other, false); }, Status::kNotSupported, "tile"));
  // The decode tile exists for head dims <= 128 only; other row counts not at all.
  other.signature.consumer = consumer_for(80, 64, 64);
  other.signature.consumer.fwd_block_q = kDecodeBlockQ;
  EXPECT_NO_THROW(flex_check_support_gpu(g, other, false));
  other.signature.consumer.fwd_block_q = 32;
  EXPECT_TRUE(throws_error([&] { flex_check_support_gpu(g, other, false); }, Status::kNotSupported,
                           "forward tile 32x64 has no sm80 forward kernel"));
  {
    FlexGeometry g192 = g;
    g192.head_dim_qk = 192;
    g192.head_dim_v = 128;
    other.signature.consumer = consumer_for(80, 192, 128);
    other.signature.consumer.fwd_block_q = kDecodeBlockQ;
    EXPECT_TRUE(throws_error([&] { flex_check_support_gpu(g192, other, false); }, Status::kNotSupported,
                             "forward tile 16x64"));
  }
  g.head_dim_qk = 192;
  g.head_dim_v = 192;
  EXPECT_TRUE(throws_error([&] { flex_check_support_gpu(g, *p->plan, false); }, Status::kNotSupported,
                           "head_dim"));
}

// ---------------------------------------------------------------------------
// Long-context plans (issue 17). The CUDA planner on causal endpoints at S = 1,048,576 with
// Hq = Hmask = 64 (forward only and with backward) and S = 4,194,304 with Hmask = 8 -- sizes
// whose per-block lists passed 2^31 entries and crashed the process with an illegal memory
// access. With full blocks stored as runs (plan format 2) these plans are small, so they must
// build (the documented Error(kNotSupported) naming the format limit is accepted only when
// the format's lists really exceed it); their counts must equal the closed-form causal
// counts; the last CSR rows of the last head (lists and payload bits) and a few K2Q rows
// must equal the brute-force classification of those rows; and a small attention call
// afterwards must still match the CPU reference (the CUDA context survived).
// Causal tile arithmetic (S a multiple of both tiles): row q sees keys [0, q + 1), so in query
// block i (rows i*bq .. i*bq+bq-1) key blocks [0, F(i)) are full, [F(i), T(i)) partial, with
// F(i) = floor((i*bq + 1) / bk) and T(i) = min(nkb, floor((i*bq + bq - 1) / bk) + 1).
struct CausalTiles {
  int64_t bq, bk, nqb, nkb;
  int64_t full(int64_t i) const { return std::min(nkb, (i * bq + 1) / bk); }
  int64_t touched(int64_t i) const { return std::min(nkb, (i * bq + bq - 1) / bk + 1); }
};

// Downloads elements [first, first + n) of the plan array `name` (device plan).
std::vector<int32_t> plan_slice(const MaskPlan& plan, const char* name, int64_t first, int64_t n) {
  int64_t count = 0;
  const int32_t* a = plan.array(name, &count);
  EXPECT_NE(a, nullptr) << name;
  EXPECT_LE(first + n, count) << name;
  std::vector<int32_t> out(size_t(std::max<int64_t>(n, 0)));
  if (a && n > 0) cuda_ok(cudaMemcpy(out.data(), a + first, size_t(n) * 4, cudaMemcpyDeviceToHost), name);
  return out;
}

// Full blocks of runs [j0, j1) of the plan's run list `name` ((first, end) pairs), expanded;
// the runs must be canonical (non-empty, ascending, non-adjacent).
std::vector<int32_t> full_blocks(const MaskPlan& plan, const char* name, int64_t j0, int64_t j1) {
  const std::vector<int32_t> runs = plan_slice(plan, name, 2 * j0, 2 * (j1 - j0));
  std::vector<int32_t> out;
  for (size_t j = 0; j + 1 < runs.size(); j += 2) {
    EXPECT_LT(runs[j], runs[j + 1]) << name << ": empty run";
    if (j > 0) {  // braces: EXPECT_* expands to an if/else (-Wdangling-else)
      EXPECT_GT(runs[j], runs[j - 1]) << name << ": runs not maximal";
    }
    for (int32_t x = runs[j]; x < runs[j + 1]; ++x) out.push_back(x);
  }
  return out;
}

// Checks the Q2K rows (lists and payload bits) of query blocks `rows` of CSR head `hm`.
void check_causal_q2k_rows(const MaskPlan& plan, bool bwd, const CausalTiles& t, int hm,
                           const std::vector<int64_t>& rows) {
  const char* pre = bwd ? "bwd_" : "fwd_";
  auto name = [&](const char* s) { return std::string(pre) + s; };
  const int words = payload_words(int(t.bq), int(t.bk));
  for (int64_t i : rows) {
    SCOPED_TRACE(::testing::Message() << pre << "Q2K head " << hm << " query block " << i);
    const int64_t r = hm * t.nqb + i;
    const std::vector<int32_t> pp = plan_slice(plan, name("q2k_partial_ptr").c_str(), r, 2);
    const std::vector<int32_t> fp = plan_slice(plan, name("q2k_full_ptr").c_str(), r, 2);
    const std::vector<int32_t> pkb = plan_slice(plan, name("q2k_partial_kb").c_str(), pp[0], pp[1] - pp[0]);
    const std::vector<int32_t> fkb = full_blocks(plan, name("q2k_full_runs").c_str(), fp[0], fp[1]);
    EXPECT_EQ(fp[1] - fp[0], t.full(i) > 0 ? 1 : 0) << "a causal row's full blocks are one run";
    std::vector<int32_t> want_f, want_p;
    for (int64_t kb = 0; kb < t.full(i); ++kb) want_f.push_back(int32_t(kb));
    for (int64_t kb = t.full(i); kb < t.touched(i); ++kb) want_p.push_back(int32_t(kb));
    EXPECT_EQ(fkb, want_f) << "full key blocks";
    ASSERT_EQ(pkb, want_p) << "partial key blocks";
    const std::vector<int32_t> bits =
        plan_slice(plan, name("q2k_partial_bits").c_str(), int64_t(pp[0]) * words, int64_t(pkb.size()) * words);
    for (size_t e = 0; e < pkb.size(); ++e) {
      std::vector<uint32_t> want(size_t(words), 0u);
      for (int rr = 0; rr < t.bq; ++rr)
        for (int cc = 0; cc < t.bk; ++cc)
          if (int64_t(pkb[e]) * t.bk + cc <= i * t.bq + rr) {
            const PayloadPos pos = payload_position(rr, cc, int(t.bk));
            want[size_t(pos.word)] |= 1u << pos.bit;
          }
      EXPECT_TRUE(std::equal(want.begin(), want.end(), reinterpret_cast<const uint32_t*>(bits.data()) + e * words))
          << "payload of key block " << pkb[e];
    }
  }
}

// K2Q rows of key blocks `kbs` of mask head `hm` (backward view): query blocks i with kb in
// [F(i), T(i)) are partial, with kb < F(i) full.
void check_causal_k2q_rows(const MaskPlan& plan, const CausalTiles& t, int hm, const std::vector<int64_t>& kbs) {
  for (int64_t kb : kbs) {
    SCOPED_TRACE(::testing::Message() << "K2Q head " << hm << " key block " << kb);
    const int64_t r = hm * t.nkb + kb;
    const std::vector<int32_t> pp = plan_slice(plan, "bwd_k2q_partial_ptr", r, 2);
    const std::vector<int32_t> fp = plan_slice(plan, "bwd_k2q_full_ptr", r, 2);
    const std::vector<int32_t> pqb = plan_slice(plan, "bwd_k2q_partial_qb", pp[0], pp[1] - pp[0]);
    const std::vector<int32_t> fqb = full_blocks(plan, "bwd_k2q_full_runs", fp[0], fp[1]);
    std::vector<int32_t> want_p, want_f;
    for (int64_t i = 0; i < t.nqb; ++i) {
      if (kb < t.full(i)) want_f.push_back(int32_t(i));
      else if (kb < t.touched(i)) want_p.push_back(int32_t(i));
    }
    EXPECT_EQ(pqb, want_p) << "partial query blocks";
    EXPECT_EQ(fqb, want_f) << "full query blocks";
  }
}

// Counts of a causal view of `heads` mask heads: partial blocks (one list entry each), full
// blocks, Q2K full runs (one per query block with a full block), K2Q full runs (one per key
// block that some query block sees whole: the query blocks from there to the end).
struct CausalCounts {
  int64_t partial = 0, full = 0, runs = 0, k2q_runs = 0;
};
CausalCounts causal_counts(const CausalTiles& t, int heads) {
  CausalCounts c;
  std::vector<bool> seen_full(size_t(t.nkb), false);
  for (int64_t i = 0; i < t.nqb; ++i) {
    c.full += t.full(i);
    c.runs += t.full(i) > 0;
    c.partial += t.touched(i) - t.full(i);
    for (int64_t kb = 0; kb < t.full(i); ++kb) seen_full[size_t(kb)] = true;
  }
  for (bool f : seen_full) c.k2q_runs += f;
  c.full *= heads;
  c.runs *= heads;
  c.partial *= heads;
  c.k2q_runs *= heads;
  return c;
}

void run_scale_case(int64_t S, int heads, bool backward) {
  SCOPED_TRACE(::testing::Message() << "causal S=" << S << " Hq=Hmask=" << heads << (backward ? " +bwd" : " fwd"));
  FlexGeometry g = fs_test::make_geometry(false, {S}, {S}, heads, heads, heads, 1);
  g.device = DeviceType::kCUDA;
  g.device_id = 0;
  const Consumer c = consumer_for(80, 128, 128);  // forward 128x64, backward 64x128
  const CausalTiles tf{c.fwd_block_q, c.fwd_block_k, S / c.fwd_block_q, S / c.fwd_block_k};
  const CausalTiles tb{c.bwd_block_q, c.bwd_block_k, S / c.bwd_block_q, S / c.bwd_block_k};
  const CausalCounts cf = causal_counts(tf, heads), cb = causal_counts(tb, heads);
  // List entries of plan format 2: partial blocks and full runs.
  const bool over = cf.partial > kMaxListEntries || cf.runs > kMaxListEntries ||
                    (backward && (cb.partial > kMaxListEntries || cb.runs > kMaxListEntries ||
                                  cb.k2q_runs > kMaxListEntries));
  {
    // Causal endpoints [H, 1, S]: head 0 uploaded, copied to the other heads on the device.
    std::vector<int32_t> row(static_cast<size_t>(S));
    for (int64_t q = 0; q < S; ++q) row[size_t(q)] = int32_t(q + 1);
    DevBuf mask(size_t(heads) * size_t(S) * 4);
    cuda_ok(cudaMemcpy(mask.p, row.data(), size_t(S) * 4, cudaMemcpyHostToDevice), "upload mask");
    for (int h = 1; h < heads; ++h)
      cuda_ok(cudaMemcpy(static_cast<int32_t*>(mask.p) + int64_t(h) * S, mask.p, size_t(S) * 4,
                         cudaMemcpyDeviceToDevice),
              "copy mask");
    PlanRequest req;
    req.geometry = &g;
    req.consumer = c;
    req.build_backward = backward;
    std::unique_ptr<MaskPlan> plan;
    try {
      plan = build_mask_plan_cuda(req, static_cast<const int32_t*>(mask.p), nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    } catch (const Error& e) {
      // Only a plan whose lists really pass the format's limit may be refused, and only
      // with the documented error.
      EXPECT_TRUE(over) << "refused although its lists fit: " << e.what();
      EXPECT_EQ(e.status(), Status::kNotSupported) << e.what();
      EXPECT_NE(std::string(e.what()).find("2147483647"), std::string::npos) << e.what();
    }
    if (plan) {
      EXPECT_FALSE(over) << "built a plan whose lists pass the format's limit";
      std::printf("[ scale ] S=%lld Hq=Hmask=%d %s: plan %.3f GiB (fwd %lld partial / %lld full blocks)\n",
                  static_cast<long long>(S), heads, backward ? "+bwd" : "fwd", double(plan->bytes()) / (1 << 30),
                  static_cast<long long>(plan->counts.fwd_partial), static_cast<long long>(plan->counts.fwd_full));
      EXPECT_EQ(plan->counts.fwd_partial, cf.partial);
      EXPECT_EQ(plan->counts.fwd_full, cf.full);
      EXPECT_EQ(plan->counts.fwd_full_runs, cf.runs);
      EXPECT_EQ(plan->counts.visible_pairs, int64_t(heads) * (S * (S + 1) / 2));
      check_causal_q2k_rows(*plan, false, tf, heads - 1, {0, 1, tf.nqb / 2, tf.nqb - 2, tf.nqb - 1});
      if (backward) {
        EXPECT_EQ(plan->counts.bwd_partial, cb.partial);
        EXPECT_EQ(plan->counts.bwd_full, cb.full);
        EXPECT_EQ(plan->counts.bwd_full_runs, cb.runs);
        EXPECT_EQ(plan->counts.bwd_k2q_full_runs, cb.k2q_runs);
        check_causal_q2k_rows(*plan, true, tb, heads - 1, {tb.nqb - 2, tb.nqb - 1});
        check_causal_k2q_rows(*plan, tb, heads - 1, {0, tb.nkb / 2, tb.nkb - 1});
      }
    }
  }
  // The process's CUDA context is still usable: a small attention call matches the reference.
  Case small;
  small.sq = small.sk = 200;
  small.h = HeadConfig{2, 1, 2, 3, 64, 64, DType::kBFloat16};
  small.backward = backward;
  run_case(small);
}

TEST(PlanScaleGpu, Causal1MPerHead64Forward) {
  REQUIRE_GPU();
  run_scale_case(int64_t(1) << 20, 64, false);
}

TEST(PlanScaleGpu, Causal1MPerHead64Backward) {
  REQUIRE_GPU();
  run_scale_case(int64_t(1) << 20, 64, true);
}

TEST(PlanScaleGpu, Causal4MPerHead8Forward) {
  REQUIRE_GPU();
  run_scale_case(int64_t(1) << 22, 8, false);
}

// An allocation failure inside the planner is Error(kOutOfMemory), and the context stays
// usable: with nearly all device memory taken, a S = 1M Hmask = 64 plan cannot get its
// scratch; after releasing it, a small attention call still works.
TEST(PlanScaleGpu, OutOfMemoryIsAnErrorNotACrash) {
  REQUIRE_GPU();
  const int64_t S = int64_t(1) << 20;
  const int heads = 64;
  FlexGeometry g = fs_test::make_geometry(false, {S}, {S}, heads, heads, heads, 1);
  g.device = DeviceType::kCUDA;
  g.device_id = 0;
  {
    DevBuf mask(size_t(heads) * size_t(S) * 4);
    cuda_ok(cudaMemset(mask.p, 0, mask.bytes), "mask");  // every row sees nothing (valid)
    // Take all but ~8 MiB of the free memory (in pieces, as fragmentation allows).
    std::vector<void*> hog;
    for (size_t piece = size_t(1) << 34; piece >= (size_t(1) << 20); piece /= 2) {
      while (true) {
        size_t free_b = 0, total_b = 0;
        cuda_ok(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
        if (free_b < piece + (size_t(8) << 20)) break;
        void* p = nullptr;
        if (cudaMalloc(&p, piece) != cudaSuccess) {
          (void)cudaGetLastError();
          break;
        }
        hog.push_back(p);
      }
    }
    PlanRequest req;
    req.geometry = &g;
    req.consumer = consumer_for(80, 128, 128);
    req.build_backward = true;
    Status st = Status::kSuccess;
    std::string msg;
    try {
      auto plan = build_mask_plan_cuda(req, static_cast<const int32_t*>(mask.p), nullptr);
    } catch (const Error& e) {
      st = e.status();
      msg = e.what();
    }
    for (void* p : hog) cuda_ok(cudaFree(p), "cudaFree");
    EXPECT_EQ(st, Status::kOutOfMemory) << msg;
    EXPECT_NE(msg.find("out of device memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("bytes"), std::string::npos) << msg;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  Case small;
  small.sq = small.sk = 200;
  small.h = HeadConfig{2, 1, 2, 3, 64, 64, DType::kBFloat16};
  run_case(small);
}

// ---------------------------------------------------------------------------
// The sm90 family (src/kernels/sm90: TMA + wgmma forward on consumer_for(90) plans, the tiles
// of tile_sm90.h: 128 x 128, 128 x 64 for (256, 256); kernels of head dims (64, 64),
// (128, 128), (192, 128), (256, 256), smaller dims on the next larger kernel with zero-filled
// tensor-map loads; the backward of such plans runs on the sm90 backward for (64, 64),
// (128, 128), (192, 128), (256, 256), else on the sm80 kernels). Skipped where the device or the build cannot run it
// (sm90::device_supported; REQUIRE_SM90, gpu_harness.h).
// ---------------------------------------------------------------------------

// A random case the sm90 forward covers: fp16/bf16, head dims of every sm90 kernel (a third
// of the cases: dims below the kernel's, multiples of 8, Dqk != Dv), unpacked, random BSHD /
// THD (empty samples), GQA / MQA, Hmask 1 or Hq, lengths not multiples of the tile, random
// interval masks at granularities 1, 16, 128, random softmax scale.
Case random_case_sm90(uint64_t seed) {
  Case c = random_case(seed);
  Rng rng(seed * 104729 + 7);
  auto pick = [&](int n) { return int(rng() % uint64_t(n)); };
  c.arch = 90;
  static const int kernel_dims[][2] = {{64, 64}, {128, 128}, {192, 128}, {256, 256}};
  if (pick(3) == 0) {
    c.h.dqk = 8 * (1 + pick(16));
    c.h.dv = 8 * (1 + pick(16));
  } else {
    const int di = pick(4);
    c.h.dqk = kernel_dims[di][0];
    c.h.dv = kernel_dims[di][1];
  }
  if (c.h.dqk >= 192) {  // CPU reference time: as random_case's big dims
    c.sq = std::min<int64_t>(c.sq, 200);
    c.sk = std::min<int64_t>(c.sk, 200);
    for (auto& l : c.lq) l = std::min<int64_t>(l, 200);
    for (auto& l : c.lk) l = std::min<int64_t>(l, 200);
  }
  if (pick(3) == 0) c.mopt.granularity = 128;
  c.backward = pick(4) == 0;
  return c;
}

TEST(FlexGpuSm90, RandomCases) {
  REQUIRE_SM90();
  for (uint64_t s = 1; s <= 96; ++s) run_case(random_case_sm90(s));
}

// Every kernel head dims pair and dims below them (exact, Dqk != Dv, dims under one 64-column
// slab, odd multiples of 8), both dtypes, on a GQA THD problem with an empty sample and
// lengths off both key tiles (128 and 64); forward and backward (sm90 backward for the kernel
// dims, the sm80 backward on the sm90 plan's backward tile otherwise).
TEST(FlexGpuSm90, HeadDims) {
  REQUIRE_SM90();
  const int dims[][2] = {{64, 64},  {128, 128}, {192, 128}, {256, 256}, {8, 8},   {40, 40},
                         {96, 96},  {16, 64},   {128, 40},  {24, 120},  {72, 8},  {112, 104}};
  uint64_t seed = 9400;
  for (const auto& d : dims) {
    for (DType t : {DType::kBFloat16, DType::kFloat16}) {
      Case c;
      c.arch = 90;
      c.varlen = true;
      c.lq = {150, 0, 70};
      c.lk = {129, 40, 0};
      c.batch = 3;
      c.h = HeadConfig{4, 2, 4, 3, d[0], d[1], t};
      c.seed = ++seed;
      run_case(c);
    }
  }
}

TEST(FlexGpuSm90, BenchmarkMasks) {
  REQUIRE_SM90();
  uint64_t seed = 9000;
  for (const std::string& name : fs_test::benchmark_mask_names()) {
    for (const auto& d : std::vector<std::pair<int, int>>{{128, 128}, {64, 64}, {192, 128}, {256, 256}, {96, 48}}) {
      Case c;
      c.arch = 90;
      c.mask = name;
      c.sq = name == "causal" || name == "tree_bfs" ? 2048 : 1000;
      c.h = HeadConfig{2, 1, 1, 1, d.first, d.second, d.first % 128 == 0 ? DType::kBFloat16 : DType::kFloat16};
      c.backward = false;
      c.seed = ++seed;
      run_case(c);
    }
  }
}

// Single key, a single query, fully empty rows, all-full rows (every block full: no masking
// work at all), negative scores, MQA with Hmask = Hq, lengths off the tile.
TEST(FlexGpuSm90, SpecialCases) {
  REQUIRE_SM90();
  uint64_t seed = 9100;
  {
    Case c;  // one key (forward only: with one visible key dS = P (dP - D) is 0 exactly, so the
             // reference gradients dQ, dK are 0 and the relative L2 check would judge rounding noise)
    c.arch = 90;
    c.batch = 2;
    c.sq = 130;
    c.sk = 1;
    c.h = HeadConfig{2, 1, 2, 1, 128, 128, DType::kBFloat16};
    c.backward = false;
    c.seed = ++seed;
    run_case(c);
  }
  {
    Case c;  // one query, THD with empty samples
    c.arch = 90;
    c.varlen = true;
    c.lq = {1, 0, 3};
    c.lk = {300, 5, 0};
    c.batch = 3;
    c.h = HeadConfig{4, 2, 4, 3, 64, 64, DType::kFloat16};
    c.seed = ++seed;
    run_case(c);
  }
  {
    Case c;  // every row empty
    c.arch = 90;
    c.sq = 200;
    c.sk = 190;
    c.h = HeadConfig{2, 1, 1, 1, 64, 64, DType::kFloat16};
    c.mopt.p_empty_row = 1.0;
    c.seed = ++seed;
    run_case(c);
  }
  {
    Case c;  // every row sees every key, tile-aligned: only full blocks
    c.arch = 90;
    c.batch = 2;
    c.sq = 256;
    c.sk = 384;
    c.h = HeadConfig{4, 2, 1, 1, 128, 128, DType::kBFloat16};
    c.mopt.p_full_row = 1.0;
    c.mopt.p_empty_row = 0.0;
    c.seed = ++seed;
    run_case(c);
    c.h.dqk = c.h.dv = 64;
    c.h.dtype = DType::kFloat16;
    c.seed = ++seed;
    run_case(c);
  }
  {
    Case c;  // all scores negative (signed max_logit), MQA, Hmask = Hq, block-granular mask
    c.arch = 90;
    c.batch = 2;
    c.sq = 300;
    c.sk = 333;
    c.h = HeadConfig{3, 1, 3, 3, 128, 128, DType::kBFloat16};
    c.negative_logits = true;
    c.mopt.granularity = 128;
    c.seed = ++seed;
    run_case(c);
  }
  for (const auto& d : std::vector<std::pair<int, int>>{{192, 128}, {256, 256}, {24, 56}}) {
    {
      Case c;  // one query, THD with empty samples, GQA
      c.arch = 90;
      c.varlen = true;
      c.lq = {1, 0, 3, 65};
      c.lk = {200, 5, 0, 64};
      c.batch = 4;
      c.h = HeadConfig{4, 2, 4, 3, d.first, d.second, DType::kBFloat16};
      c.seed = ++seed;
      run_case(c);
    }
    {
      Case c;  // every row sees every key, tile-aligned: only full blocks
      c.arch = 90;
      c.batch = 2;
      c.sq = 256;
      c.sk = 384;
      c.h = HeadConfig{4, 2, 1, 1, d.first, d.second, DType::kFloat16};
      c.mopt.p_full_row = 1.0;
      c.mopt.p_empty_row = 0.0;
      c.seed = ++seed;
      run_case(c);
    }
    {
      Case c;  // all scores negative, MQA, Hmask = Hq, block-granular mask, strided tensors
      c.arch = 90;
      c.batch = 2;
      c.sq = 190;
      c.sk = 201;
      c.h = HeadConfig{3, 1, 3, 3, d.first, d.second, DType::kBFloat16};
      c.negative_logits = true;
      c.mopt.granularity = 64;
      c.strided = true;
      c.seed = ++seed;
      run_case(c);
    }
  }
  {
    Case c;  // strided (heads-outer, padded) tensors, optional outputs off
    c.arch = 90;
    c.batch = 2;
    c.sq = 257;
    c.sk = 255;
    c.h = HeadConfig{4, 4, 1, 3, 64, 64, DType::kBFloat16};
    c.strided = true;
    c.fwd_lse = false;
    c.fwd_ml = false;
    c.seed = ++seed;
    run_case(c);
  }
}

// Long walks: the split schedule (persistent kernel claiming items, combine of split tasks),
// bitwise identical over two runs; without a workspace and in grid mode: static persistent grid.
TEST(FlexGpuSm90, FwdSplitAndUnsplit) {
  REQUIRE_SM90();
  {
    Case c = fwd_split_case("global", HeadConfig{4, 2, 4, 5, 128, 128, DType::kBFloat16}, 9201);
    c.arch = 90;
    c.sq = 2600;
    c.sk = 2600;
    run_case(c);
  }
  {
    Case c = fwd_split_case("dense", HeadConfig{4, 1, 1, 1, 64, 64, DType::kFloat16}, 9202);
    c.arch = 90;
    c.varlen = true;
    c.lq = {1100, 0, 300};
    c.lk = {2300, 50, 2100};
    c.batch = 3;
    run_case(c);
  }
  {
    Case c = fwd_split_case("longformer", HeadConfig{4, 1, 1, 1, 128, 128, DType::kFloat16}, 9203);
    c.arch = 90;
    c.sq = 4096;
    c.fwd_ml = false;
    run_case(c);
  }
  {
    Case c = fwd_split_case("global", HeadConfig{4, 1, 4, 5, 64, 64, DType::kBFloat16}, 9204);
    c.arch = 90;
    c.sq = 2600;
    c.sk = 2600;
    c.expect_fwd_split = false;
    c.fwd_workspace = false;
    run_case(c);
    c.fwd_workspace = true;
    c.grid_mode = true;
    c.seed = 9205;
    run_case(c);
  }
  {
    Case c = fwd_split_case("global", HeadConfig{4, 2, 4, 5, 192, 128, DType::kBFloat16}, 9206);
    c.arch = 90;
    c.sq = 2600;
    c.sk = 2600;
    run_case(c);
  }
  {
    Case c = fwd_split_case("dense", HeadConfig{2, 1, 1, 1, 256, 256, DType::kFloat16}, 9207);
    c.arch = 90;
    c.varlen = true;
    c.lq = {1100, 0, 300};
    c.lk = {2300, 50, 2100};
    c.batch = 3;
    run_case(c);
  }
  {
    Case c = fwd_split_case("global", HeadConfig{4, 1, 4, 5, 40, 104, DType::kBFloat16}, 9208);
    c.arch = 90;
    c.sq = 2600;
    c.sk = 2600;
    run_case(c);
    c.grid_mode = true;  // grid mode: no task list, nothing split
    c.expect_fwd_split = false;
    c.seed = 9209;
    run_case(c);
  }
}

// Small cases for compute-sanitizer (memcheck / racecheck / synccheck).
TEST(FlexGpuSm90, SanitizerSmall) {
  REQUIRE_SM90();
  Case a;
  a.arch = 90;
  a.batch = 1;
  a.sq = 200;
  a.sk = 140;
  a.h = HeadConfig{2, 1, 2, 3, 128, 128, DType::kBFloat16};
  a.backward = false;
  a.seed = 9301;
  run_case(a);
  Case b;
  b.arch = 90;
  b.varlen = true;
  b.lq = {70, 0, 165};
  b.lk = {66, 20, 0};
  b.batch = 3;
  b.h = HeadConfig{2, 2, 1, 1, 64, 64, DType::kFloat16};
  b.backward = false;
  b.seed = 9302;
  run_case(b);
  Case f = fwd_split_case("global", HeadConfig{2, 1, 2, 5, 64, 64, DType::kBFloat16}, 9303);
  f.arch = 90;
  f.sq = 2200;
  f.sk = 2200;
  run_case(f);
}

// Small cases of the (192, 128) and (256, 256) kernels and of dims below a kernel's (zero-filled
// loads, columns past Dv not stored) for compute-sanitizer (scripts/gpu_check.sh filters).
TEST(FlexGpuSm90, SanitizerHeadDims) {
  REQUIRE_SM90();
  Case a;
  a.arch = 90;
  a.batch = 1;
  a.sq = 200;
  a.sk = 140;
  a.h = HeadConfig{2, 1, 2, 3, 192, 128, DType::kBFloat16};
  a.backward = false;
  a.seed = 9311;
  run_case(a);
  Case b;
  b.arch = 90;
  b.varlen = true;
  b.lq = {70, 0, 165};
  b.lk = {66, 20, 0};
  b.batch = 3;
  b.h = HeadConfig{2, 2, 1, 1, 256, 256, DType::kFloat16};
  b.backward = false;
  b.seed = 9312;
  run_case(b);
  Case d = b;
  d.h = HeadConfig{2, 1, 2, 3, 24, 72, DType::kBFloat16};
  d.seed = 9313;
  run_case(d);
  Case f = fwd_split_case("global", HeadConfig{2, 1, 2, 5, 256, 256, DType::kBFloat16}, 9314);
  f.arch = 90;
  f.sq = 1200;
  f.sk = 1200;
  run_case(f);
}

// ---------------------------------------------------------------------------
// The sm90 backward (kernel_bwd_sm90.cuh: Dqk = Dv in {64, 128} on the 64 x 128 tile ((64, 64) on
// the wide 128 x 128 tile by default, below), (192, 128) and (256, 256) on the 64 x 64 tile,
// fp16/bf16, deterministic or not), run on sm90 plans
// whatever FLASHSPAN_SM90_BWD says (sm90::set_bwd_enabled); every case checks that the sm90
// backward was the kernel that ran (sm90::bwd_launches).
// ---------------------------------------------------------------------------

struct Sm90BwdOn {
  Sm90BwdOn() { sm90::set_bwd_enabled(1); }
  ~Sm90BwdOn() { sm90::set_bwd_enabled(-1); }
};

// The deterministic sm90 backward's cut of long walks switched on in-process at the rule's own
// m = 2 (the default cuts only walks 4x the mean: the small split cases below need not be that long).
struct Sm90DetSplitOn {
  Sm90DetSplitOn() {
    sm90::set_bwd_det_split(1);
    sm90::set_bwd_det_split_above_mean(2);
  }
  ~Sm90DetSplitOn() {
    sm90::set_bwd_det_split(-1);
    sm90::set_bwd_det_split_above_mean(-1);
  }
};

void run_case_sm90_bwd(const Case& c) {
  ASSERT_TRUE(c.backward && c.arch == 90 && sm90::bwd_runs_head_dims_sm90(c.h.dqk, c.h.dv)) << c.describe();
  const int64_t before = sm90::bwd_launches();
  run_case(c);
  EXPECT_GT(sm90::bwd_launches(), before) << "the sm90 backward did not run: " << c.describe();
}

// expect_bwd_bitwise_repeatable (dq / dk / dv bitwise identical over three runs) on the sm90
// backward: each of the three runs must have launched it.
void expect_sm90_bwd_bitwise(const Case& c) {
  const int64_t before = sm90::bwd_launches();
  expect_bwd_bitwise_repeatable(c);
  EXPECT_EQ(sm90::bwd_launches(), before + 3) << "the sm90 backward did not run: " << c.describe();
}

// A random case of the sm90 backward: random_case_sm90 (BSHD / THD with empty samples, GQA /
// MQA, Hmask 1 or Hq, random interval masks at granularities 1 / 16 / 64 / 128, block-structured
// masks with empty rows, strided tensors, dlse, random softmax scale) at D = 128 (two thirds of
// the seeds) or 64.
Case bwd_case_sm90(uint64_t seed) {
  Case c = random_case_sm90(seed);
  c.h.dqk = c.h.dv = seed % 3 == 0 ? 64 : 128;
  c.backward = true;
  c.deterministic = false;
  return c;
}

// One row of an sm90 backward case table (run_sm90_bwd_rows): the heads and dtype (head dims 0:
// the table's), the shape (BSHD batch x sq x sk, or THD when lq is given: one sample per entry),
// the mask ("random" interval masks with mopt, a benchmark mask, or a structured mask of
// split_case) and what is special about the case. Non-deterministic unless det; arch 90.
struct Sm90BwdRow {
  HeadConfig h;
  int batch = 1;
  int64_t sq = 64, sk = 64;
  std::vector<int64_t> lq = {}, lk = {};
  std::string mask = "random";
  MaskOptions mopt = {};
  bool negative = false, strided = false, dlse = false, grid = false, det = false;
  bool split = false;       // as split_case: the schedule must split some dK/dV task
  bool bitwise = false;     // expect_sm90_bwd_bitwise instead of the reference check
  bool dt_by_seed = false;  // dtype from the seed: bf16 on even seeds, fp16 on odd ones
  uint64_t seed = 0;        // 0: the table's next seed
};

constexpr DType kF16 = DType::kFloat16, kBF16 = DType::kBFloat16;

Case sm90_bwd_row_case(const Sm90BwdRow& r, int dqk, int dv, uint64_t seed) {
  Case c;
  c.arch = 90;
  c.h = r.h;
  if (c.h.dqk == 0) {
    c.h.dqk = dqk;
    c.h.dv = dv;
  }
  if (r.dt_by_seed) c.h.dtype = seed % 2 == 0 ? kBF16 : kF16;
  c.varlen = !r.lq.empty();
  c.batch = c.varlen ? int(r.lq.size()) : r.batch;
  c.sq = r.sq;
  c.sk = r.sk;
  c.lq = r.lq;
  c.lk = r.lk;
  c.mask = r.mask;
  c.mopt = r.mopt;
  c.negative_logits = r.negative;
  c.strided = r.strided;
  c.dlse = r.dlse;
  c.grid_mode = r.grid;
  c.deterministic = r.det;
  c.expect_split = r.split;
  c.seed = seed;
  return c;
}

// Runs a table in order at head dims (dqk, dv) (where a row gives none) through `run` (bitwise
// rows through expect_sm90_bwd_bitwise); rows without a seed take ++seed.
void run_sm90_bwd_rows(const std::vector<Sm90BwdRow>& rows, int dqk, int dv, uint64_t& seed,
                       void (*run)(const Case&) = run_case_sm90_bwd) {
  for (const Sm90BwdRow& r : rows) {
    const Case c = sm90_bwd_row_case(r, dqk, dv, r.seed ? r.seed : ++seed);
    if (r.bitwise) {
      expect_sm90_bwd_bitwise(c);
    } else {
      run(c);
    }
  }
}

// The benchmark masks' length: longer for causal and tree_bfs.
int64_t bench_sq(const std::string& name) { return name == "causal" || name == "tree_bfs" ? 2048 : 1000; }

// Rows shared by the special-case tables of the 64 x 128 / (128, 128) tile and the wide tile:
// fully empty rows (zero gradients, no NaN), only full blocks, negative scores with MQA and
// Hmask = Hq, strided tensors with dlse, a GQA group of 8 per key block walk; the split schedule
// (long K2Q walks) and grid mode (no task lists); a deterministic causal GQA THD case bitwise
// over three runs.
const Sm90BwdRow kEmptyRows = {.h = {2, 1, 1, 1, 0, 0, kF16}, .sq = 200, .sk = 190, .mopt = {.p_empty_row = 1.0}};
const Sm90BwdRow kFullBlocks = {.h = {4, 2, 1, 1, 0, 0, kBF16}, .batch = 2, .sq = 256, .sk = 384,
                                .mopt = {.p_empty_row = 0.0, .p_full_row = 1.0}};
const Sm90BwdRow kNegativeMqa = {.h = {3, 1, 3, 3, 0, 0, kBF16}, .batch = 2, .sq = 300, .sk = 333,
                                 .mopt = {.granularity = 128}, .negative = true};
const Sm90BwdRow kStridedDlse = {.h = {4, 4, 1, 3, 0, 0, kBF16}, .batch = 2, .sq = 257, .sk = 255,
                                 .strided = true, .dlse = true};
const Sm90BwdRow kGqa8Thd = {.h = {8, 1, 8, 5, 0, 0, kF16}, .lq = {400, 130}, .lk = {350, 520}};
const Sm90BwdRow kSplitSinkLocal = {.h = {4, 1, 1, 1, 0, 0, kBF16}, .sq = 2048, .mask = "sink_local", .split = true};
const Sm90BwdRow kSplitGlobalThd = {.h = {4, 1, 1, 5, 0, 0, kF16}, .lq = {1100, 300, 0}, .lk = {1024, 257, 50},
                                    .mask = "global", .split = true};
const Sm90BwdRow kGridThd = {.h = {4, 2, 4, 3, 0, 0, kBF16}, .lq = {200, 0, 90}, .lk = {150, 70, 0}, .grid = true};
const Sm90BwdRow kBitwiseThd = {.h = {4, 2, 1, 3, 0, 0, kBF16}, .lq = {1500, 0, 333}, .lk = {1400, 60, 500},
                                .det = true, .bitwise = true};

TEST(FlexGpuSm90, BwdRandomCases) {
  REQUIRE_SM90();
  Sm90BwdOn on;
  for (uint64_t s = 1; s <= 48; ++s) run_case_sm90_bwd(bwd_case_sm90(s + 500));
}

// The register splits of the (128, 128) kernel (sm90::bwd_gemm_order 4: 24 / 240 registers, a uniform warpgroup
// index, the default; 0: 40 / 232; PERF_LOG v2.79) and the experimental GEMM orders (12, 20, 28, 36, 44 at (128, 128);
// the (64, 64) wide tile's late dK 16 from 20 / 28, its deferred dK 32 from 36 / 44; PERF_LOG v2.80; the sanitizer
// test: 4, 28, 44), forced here whatever the environment says: random cases
// at head dims 128 / 96 / 64 (random interval masks, THD with empty samples, GQA / MQA, strided tensors, dlse), the
// special rows, deterministic THD cases bitwise over three runs and the split schedule.
struct Sm90BwdGemmOrder {
  explicit Sm90BwdGemmOrder(int order) { sm90::set_bwd_gemm_order(order); }
  ~Sm90BwdGemmOrder() { sm90::set_bwd_gemm_order(-1); }
};

TEST(FlexGpuSm90, BwdGemmOrders) {
  REQUIRE_SM90();
  Sm90BwdOn on;
  for (int order : {0, 4, 12, 20, 28, 36, 44}) {
    SCOPED_TRACE("bwd_gemm_order " + std::to_string(order));
    Sm90BwdGemmOrder o(order);
    ASSERT_EQ(sm90::bwd_gemm_order(), order);
    // The kernels of this order ran (the launchers' per-order counts): the (128, 128) one and, for the late /
    // deferred dK, the (64, 64) wide tile's.
    const int k128 = sm90::bwd_gemm_order_128(order), kwide = sm90::bwd_gemm_order_wide64(order);
    const int64_t n128 = sm90::bwd_order_launches(k128), nwide = sm90::bwd_order_launches(kwide);
    const uint64_t cases = order == 0 || order == 4 ? 16 : 8;  // (the experimental orders: 8 each, and every row)
    for (uint64_t s = 0; s < cases; ++s) {
      Case c = bwd_case_sm90(7700 + 100 * order + s);
      c.h.dqk = c.h.dv = s % 4 == 3 ? 96 : s % 4 == 1 ? 64 : 128;
      run_case_sm90_bwd(c);
    }
    uint64_t seed = 7900 + 100 * order;
    run_sm90_bwd_rows({kEmptyRows, kFullBlocks, kNegativeMqa, kStridedDlse, kGqa8Thd, kSplitSinkLocal, kGridThd,
                       kBitwiseThd},
                      128, 128, seed);
    EXPECT_GT(sm90::bwd_order_launches(k128), n128) << "no launch of the (128, 128) kernel of order " << k128;
    if (kwide != 0) {
      EXPECT_GT(sm90::bwd_order_launches(kwide), nwide) << "no launch of the (64, 64) wide tile's kernel of order " << kwide;
    }
  }
}

// Small cases of the orders for compute-sanitizer (scripts/gpu_check.sh): BwdSanitizerSmall's rows of the
// (128, 128) kernel.
TEST(FlexGpuSm90, BwdGemmOrderSanitizer) {
  REQUIRE_SM90();
  Sm90BwdOn on;
  for (int order : {4, 28, 44}) {  // (0, the 40 / 232 split, unchanged since PERF_LOG v2.79's sanitizer runs)
    SCOPED_TRACE("bwd_gemm_order " + std::to_string(order));
    Sm90BwdGemmOrder o(order);
    uint64_t seed = 9850 + 10 * order;
    const std::vector<Sm90BwdRow> rows = {
        {.h = {2, 1, 2, 3, 0, 0, kBF16}, .sq = 200, .sk = 140},
        {.h = {2, 2, 1, 1, 0, 0, kF16}, .lq = {70, 0, 165}, .lk = {66, 20, 0}},
        {.h = {2, 1, 2, 5, 0, 0, kBF16}, .sq = 1400, .sk = 1400, .mask = "global", .split = true},
        {.h = {2, 2, 1, 1, 0, 0, kF16}, .lq = {70, 0, 165}, .lk = {66, 20, 0}, .det = true},
        {.h = {2, 1, 2, 5, 96, 96, kF16}, .sq = 1400, .sk = 1400, .mask = "global", .split = true}};
    run_sm90_bwd_rows(rows, 128, 128, seed);
    // The (64, 64) wide tile's late dK (28 -> 16) and deferred dK (44 -> 32).
    if (order & 48) run_sm90_bwd_rows(rows, 64, 64, seed);
  }
}

// Head dims below the kernels' (each a multiple of 8 up to 128, Dqk != Dv included): the (64, 64) /
// (128, 128) kernels with TMA's zero fill past the call's columns, dK / dV / dQ written for the
// call's columns only (tile_sm90.h bwd_runs_head_dims_sm90). Random cases, then the split schedule's
// fp32 slots (rows of the call's dims), THD with empty samples, a deterministic case bitwise over
// three runs and a deterministic split.
TEST(FlexGpuSm90, BwdSmallerHeadDims) {
  REQUIRE_SM90();
  Sm90BwdOn on;
  static const int dims[][2] = {{8, 8}, {32, 32}, {40, 72}, {96, 96}, {80, 80}, {112, 112},
                                {128, 64}, {64, 128}, {120, 128}, {56, 24}, {16, 48}, {104, 88}};
  uint64_t s = 0;
  for (const auto& d : dims) {
    for (int rep = 0; rep < 2; ++rep, ++s) {
      Case c = bwd_case_sm90(s + 5200);
      c.h.dqk = d[0];
      c.h.dv = d[1];
      run_case_sm90_bwd(c);
    }
  }
  uint64_t seed = 5300;
  run_sm90_bwd_rows({{.h = {4, 1, 1, 1, 96, 96, kBF16}, .sq = 2048, .mask = "sink_local", .split = true},
                     {.h = {4, 1, 1, 5, 40, 72, kF16}, .lq = {1100, 300, 0}, .lk = {1024, 257, 50}, .mask = "global",
                      .split = true},
                     {.h = {4, 2, 4, 3, 80, 80, kF16}, .lq = {300, 0, 65}, .lk = {257, 40, 0}, .strided = true},
                     {.h = {4, 2, 1, 1, 32, 32, kBF16}, .sq = 1000, .mask = "causal", .det = true, .bitwise = true},
                     {.h = {4, 2, 1, 1, 112, 112, kBF16}, .sq = 2048, .mask = "document_causal", .det = true}},
                    0, 0, seed);
}

TEST(FlexGpuSm90, BwdBenchmarkMasks) {
  REQUIRE_SM90();
  Sm90BwdOn on;
  std::vector<Sm90BwdRow> rows;
  for (const std::string& name : fs_test::benchmark_mask_names()) {
    for (int d : {128, 64}) rows.push_back({.h = {4, 2, 1, 1, d, d}, .sq = bench_sq(name), .mask = name, .dt_by_seed = true});
  }
  uint64_t seed = 9500;
  run_sm90_bwd_rows(rows, 0, 0, seed);
}

// Fully empty rows (zero gradients, no NaN), only full blocks, one query and THD with empty
// samples, negative scores with MQA and Hmask = Hq, strided tensors with dlse, GQA groups of 8,
// D = 64 on THD with empty samples and strided tensors.
TEST(FlexGpuSm90, BwdSpecialCases) {
  REQUIRE_SM90();
  Sm90BwdOn on;
  uint64_t seed = 9600;
  run_sm90_bwd_rows({kEmptyRows, kFullBlocks,
                     {.h = {4, 2, 4, 3, 0, 0, kF16}, .lq = {1, 0, 3, 70}, .lk = {300, 5, 0, 129}},  // one query
                     kNegativeMqa, kStridedDlse, kGqa8Thd,
                     {.h = {4, 2, 4, 3, 64, 64, kBF16}, .lq = {300, 0, 65}, .lk = {257, 40, 0}, .strided = true}},
                    128, 128, seed);
}

// Long K2Q walks: the split schedule (persistent grid claiming items, fp32 slots converted
// afterwards); plans without task lists (grid mode).
TEST(FlexGpuSm90, BwdSplitAndGrid) {
  REQUIRE_SM90();
  Sm90BwdOn on;
  uint64_t seed = 9700;
  run_sm90_bwd_rows({kSplitSinkLocal, kSplitGlobalThd,
                     {.h = {8, 2, 8, 3, 0, 0, kBF16}, .batch = 2, .sq = 1024, .sk = 1100, .mask = "sink_window",
                      .strided = true, .split = true},
                     kGridThd,
                     {.h = {4, 1, 1, 1, 64, 64, kF16}, .sq = 2048, .mask = "sink_local", .split = true}},
                    128, 128, seed);
}

// The deterministic sm90 backward (dQ tiles added in descending key-block order through their
// counters; long walks cut into items when switched on): random cases and the benchmark masks
// (default: no cut), split cells (cut on) against the reference, and dq / dk / dv bitwise
// identical over three runs of a causal GQA THD case with long K2Q walks and of two cases with
// split cells.
TEST(FlexGpuSm90, BwdDeterministic) {
  REQUIRE_SM90();
  Sm90BwdOn on;
  for (uint64_t s = 1; s <= 24; ++s) {
    Case c = bwd_case_sm90(s + 700);
    c.deterministic = true;
    run_case_sm90_bwd(c);
  }
  std::vector<Sm90BwdRow> masks;
  for (const char* name : {"causal", "document_causal", "tree_bfs", "sink_local"}) {
    masks.push_back({.h = {4, 2, 1, 1, 0, 0}, .sq = 2048, .mask = name, .det = true, .dt_by_seed = true});
  }
  uint64_t seed = 9900;
  run_sm90_bwd_rows(masks, 128, 128, seed);
  // Long walks cut into items (the split schedule's deterministic form, switched on here):
  // sink_local's key block 0 and longformer's global key blocks (test_split_rule.cpp checks these
  // plans split), GQA groups, a THD sink_window case with uneven samples, D = 64; the header
  // proves the split. (Above: the default cut, at m = 4, which cuts the tree_bfs and sink_local
  // cases' longest walks and keeps causal and document_causal whole.)
  Sm90DetSplitOn split_on;
  const std::vector<int64_t> lq = {1500, 37, 700}, lk = {1300, 64, 900};  // uneven THD samples
  seed = 9959;
  run_sm90_bwd_rows({{.h = {4, 2, 1, 1, 0, 0, kBF16}, .sq = 2048, .mask = "sink_local", .det = true, .split = true},
                     {.h = {2, 1, 1, 1, 0, 0, kF16}, .sq = 4096, .mask = "longformer", .det = true, .split = true},
                     {.h = {8, 2, 8, 3, 0, 0, kBF16}, .lq = lq, .lk = lk, .mask = "sink_window", .det = true, .split = true},
                     {.h = {4, 1, 1, 1, 64, 64, kF16}, .sq = 2048, .mask = "sink_local", .det = true, .split = true}},
                    128, 128, seed);
  // Bitwise over three runs: a causal GQA THD case with long K2Q walks, and split cells (GQA
  // sink_local, THD sink_window).
  seed = 9949;
  run_sm90_bwd_rows({kBitwiseThd,
                     {.h = {4, 2, 1, 1, 0, 0, kBF16}, .sq = 2048, .mask = "sink_local", .det = true, .bitwise = true},
                     {.h = {8, 2, 8, 3, 0, 0, kF16}, .lq = lq, .lk = lk, .mask = "sink_window", .det = true, .bitwise = true}},
                    128, 128, seed);
}

// The deterministic list in bands head by head (BwdParams::det_band, experimental, not yet run on a GPU:
// sm90::bwd_det_band_forced) runs the same items as heads fastest, whose dK / dV slots the convert sums in the same
// order and whose dQ additions each tile takes in the same (descending key-block) order, so dq, dk, dv must be
// bitwise those of heads fastest, in bands of 3 blocks and heads slowest: multi-head plans claimed (uneven:
// sink_local, tree_bfs, longformer with cut walks) and in snake waves (causal), GQA, THD; then the reference check
// with heads slowest.
TEST(FlexGpuSm90, BwdDeterministicBandsSameBits) {
  REQUIRE_SM90();
  Sm90BwdOn on;
  struct Reset {
    ~Reset() { sm90::set_bwd_det_band(-1); }
  } reset;
  const std::vector<int64_t> lq = {1500, 37, 700}, lk = {1300, 64, 900};
  const std::vector<Sm90BwdRow> rows = {
      {.h = {4, 4, 1, 1, 0, 0, kBF16}, .sq = 2048, .mask = "causal", .det = true},
      {.h = {4, 2, 1, 1, 0, 0, kF16}, .sq = 2048, .mask = "sink_local", .det = true},
      {.h = {4, 4, 1, 1, 0, 0, kBF16}, .sq = 2048, .mask = "tree_bfs", .det = true},
      {.h = {4, 4, 1, 1, 0, 0, kF16}, .sq = 4096, .mask = "longformer", .det = true},
      {.h = {8, 2, 8, 3, 0, 0, kBF16}, .lq = lq, .lk = lk, .mask = "sink_window", .det = true}};
  uint64_t seed = 9970;
  for (const Sm90BwdRow& r : rows) {
    const Case c = sm90_bwd_row_case(r, 128, 128, ++seed);
    auto p = make_problem(c);
    sm90::set_bwd_det_band(1);
    const auto fastest = bwd_bytes(*p);
    for (const int band : {3, kDetBandAll}) {
      sm90::set_bwd_det_band(band);
      const int64_t before = sm90::bwd_launches();
      const auto banded = bwd_bytes(*p);
      EXPECT_EQ(sm90::bwd_launches(), before + 1) << "the sm90 backward did not run: " << c.describe();
      for (int i = 0; i < 3; ++i) {
        EXPECT_TRUE(banded[i] == fastest[i]) << "band " << band << ": output " << i << " (dq, dk, dv) differs: "
                                             << c.describe();
      }
    }
    run_case_sm90_bwd(c);
  }
}

// The deterministic dQ tiles added in two halves (the default), each by a writer warp of its own in its own chain of
// turns (BwdParams::dq_chunks), against whole tiles (FLASHSPAN_SM90_BWD_DET_DQ_CHUNKS=1): every dQ element takes its
// additions in descending key-block order either way, so dq, dk, dv must be bitwise equal, on every consumer kind
// ((64, 64) on the wide tile, (128, 128), (192, 128) on three warpgroups, (256, 256) column-split), in snake waves
// (causal) and claimed (tree_bfs, longformer, THD sink_window with cut walks), twice each; then the reference check.
TEST(FlexGpuSm90, BwdDeterministicDqChunksSameBits) {
  REQUIRE_SM90();
  Sm90BwdOn on;
  const std::vector<int64_t> lq = {1500, 37, 700}, lk = {1300, 64, 900};
  const std::vector<Sm90BwdRow> rows = {
      {.h = {4, 4, 1, 1, 128, 128, kBF16}, .sq = 2048, .mask = "causal", .det = true},
      {.h = {4, 4, 1, 1, 128, 128, kBF16}, .sq = 2048, .mask = "tree_bfs", .det = true},
      {.h = {4, 4, 1, 1, 128, 128, kF16}, .sq = 4096, .mask = "longformer", .det = true},
      {.h = {8, 2, 8, 3, 128, 128, kBF16}, .lq = lq, .lk = lk, .mask = "sink_window", .det = true},
      {.h = {4, 2, 1, 1, 64, 64, kBF16}, .sq = 2048, .mask = "document_causal", .det = true},
      {.h = {4, 2, 1, 3, 192, 128, kBF16}, .lq = {500, 0, 200}, .lk = {450, 60, 260}, .det = true},
      {.h = {4, 2, 1, 3, 256, 256, kF16}, .lq = {500, 0, 200}, .lk = {450, 60, 260}, .det = true}};
  uint64_t seed = 9990;
  for (const Sm90BwdRow& r : rows) {
    const Case c = sm90_bwd_row_case(r, 0, 0, ++seed);
    auto p = make_problem(c);
    ScopedEnv relaxed("FLASHSPAN_SM90_BWD_DET_RELAXED", nullptr);  // the release hand-off (the default)
    std::array<std::vector<uint8_t>, 3> whole;
    {
      ScopedEnv chunks("FLASHSPAN_SM90_BWD_DET_DQ_CHUNKS", "1");
      whole = bwd_bytes(*p);
    }
    ScopedEnv chunks("FLASHSPAN_SM90_BWD_DET_DQ_CHUNKS", nullptr);  // two halves (the default)
    for (int run = 0; run < 2; ++run) {
      const int64_t before = sm90::bwd_launches();
      const auto halves = bwd_bytes(*p);
      EXPECT_EQ(sm90::bwd_launches(), before + 1) << "the sm90 backward did not run: " << c.describe();
      for (int i = 0; i < 3; ++i) {
        EXPECT_TRUE(halves[i] == whole[i]) << "two halves, run " << run << ": output " << i
                                           << " (dq, dk, dv) differs from whole tiles': " << c.describe();
      }
    }
    run_case_sm90_bwd(c);
  }
}

// Small backward cases for compute-sanitizer (memcheck / racecheck / synccheck): BSHD GQA with
// Hmask = Hq at D = 128 and 64, THD with empty samples (non-deterministic, and deterministic: dQ
// tile counters), the split schedule on a global mask, deterministic split cells (one slot per
// item; test_split_rule.cpp checks this plan splits its key block 0).
TEST(FlexGpuSm90, BwdSanitizerSmall) {
  REQUIRE_SM90();
  Sm90BwdOn on;
  uint64_t seed = 9800;
  run_sm90_bwd_rows({{.h = {2, 1, 2, 3, 0, 0, kBF16}, .sq = 200, .sk = 140},
                     {.h = {2, 2, 1, 1, 0, 0, kF16}, .lq = {70, 0, 165}, .lk = {66, 20, 0}},
                     {.h = {2, 1, 2, 5, 0, 0, kBF16}, .sq = 1400, .sk = 1400, .mask = "global", .split = true},
                     {.h = {2, 1, 2, 3, 64, 64, kBF16}, .sq = 200, .sk = 140},
                     {.h = {2, 2, 1, 1, 0, 0, kF16}, .lq = {70, 0, 165}, .lk = {66, 20, 0}, .det = true},
                     // head dims below the kernel's (zero fill, the call's columns stored)
                     {.h = {2, 1, 2, 3, 40, 72, kBF16}, .sq = 200, .sk = 140},
                     {.h = {2, 1, 2, 5, 96, 96, kF16}, .sq = 1400, .sk = 1400, .mask = "global", .split = true}},
                    128, 128, seed);
  Sm90DetSplitOn split_on;
  run_sm90_bwd_rows({{.h = {2, 1, 1, 1, 0, 0, kBF16}, .sq = 1024, .mask = "sink_local", .det = true, .split = true}},
                    128, 128, seed);
}

// ---------------------------------------------------------------------------
// The wide backward tile of (64, 64): 128 query rows x 128 keys (tile_sm90.h kTileSm90Wide64,
// the key-split consumers with kBq = 128; sm90::bwd_wide64_enabled, on by default, forced on
// here whatever FLASHSPAN_SM90_BWD_WIDE64 says, so every (64, 64) sm90 plan built inside takes
// it; the other sm90 tests' (64, 64) plans take it too, unless FLASHSPAN_SM90_BWD_WIDE64=0). Each case checks that the tile is
// the consumer's and that the sm90 backward ran.
// ---------------------------------------------------------------------------

struct Sm90BwdWide {
  Sm90BwdOn on;
  Sm90BwdWide() { sm90::set_bwd_wide64_enabled(1); }
  ~Sm90BwdWide() { sm90::set_bwd_wide64_enabled(-1); }
};

void run_case_sm90_bwd_wide(const Case& in) {
  Case c = in;
  c.arch = 90;
  c.backward = true;
  c.h.dqk = c.h.dv = 64;
  const Consumer w = consumer_for(90, 64, 64);
  ASSERT_TRUE(sm90::bwd_wide_tile_sm90(64, 64, w.bwd_block_q, w.bwd_block_k)) << "the wide tile is not chosen";
  run_case_sm90_bwd(c);
}

// random_case_sm90 at (64, 64): BSHD / THD with empty samples, GQA / MQA, Hmask 1 or Hq, random
// interval masks at granularities 1 / 16 / 64 / 128 (partial blocks with every element position
// of the 128 x 128 tile masked somewhere), block-structured masks, strided tensors, dlse; a
// third of them deterministic.
TEST(FlexGpuSm90, BwdWideRandom) {
  REQUIRE_SM90();
  Sm90BwdWide on;
  for (uint64_t s = 1; s <= 36; ++s) {
    Case c = bwd_case_sm90(s + 2500);
    c.deterministic = s % 3 == 0;
    run_case_sm90_bwd_wide(c);
  }
}

// Fully empty rows, only full blocks, THD with short and empty samples (lengths around the 64
// and 128 row / key boundaries), MQA with Hmask = Hq and negative scores, strided tensors with
// dlse, a GQA group of 8, the benchmark masks, the split schedule (long K2Q walks) and grid
// mode, and a deterministic case bitwise identical over three runs.
TEST(FlexGpuSm90, BwdWideCases) {
  REQUIRE_SM90();
  Sm90BwdWide on;
  std::vector<Sm90BwdRow> rows = {kEmptyRows, kFullBlocks,
                                  {.h = {4, 2, 4, 3, 0, 0, kF16},  // short and empty THD samples
                                   .lq = {1, 0, 3, 63, 64, 65, 127, 128, 129, 200},
                                   .lk = {300, 5, 0, 129, 64, 63, 128, 1, 127, 255}},
                                  kNegativeMqa, kStridedDlse, kGqa8Thd};
  for (const std::string& name : fs_test::benchmark_mask_names()) {
    rows.push_back({.h = {4, 2, 1, 1, 0, 0}, .sq = bench_sq(name), .mask = name, .dt_by_seed = true});
  }
  rows.insert(rows.end(), {kSplitSinkLocal, kSplitGlobalThd, kGridThd});
  for (const char* name : {"causal", "document_causal", "sink_local"}) {  // deterministic
    rows.push_back({.h = {4, 2, 1, 1, 0, 0, kBF16}, .sq = 2048, .mask = name, .det = true});
  }
  rows.push_back(kBitwiseThd);
  uint64_t seed = 12600;
  run_sm90_bwd_rows(rows, 64, 64, seed, run_case_sm90_bwd_wide);
}

// Small wide-tile cases for compute-sanitizer (memcheck / racecheck / synccheck): BwdSanitizerSmall's
// at (64, 64) (but for split cells).
TEST(FlexGpuSm90, BwdWideSanitizer) {
  REQUIRE_SM90();
  Sm90BwdWide on;
  uint64_t seed = 12800;
  run_sm90_bwd_rows({{.h = {2, 1, 2, 3, 0, 0, kBF16}, .sq = 200, .sk = 140},
                     {.h = {2, 2, 1, 1, 0, 0, kF16}, .lq = {70, 0, 165}, .lk = {66, 20, 0}},
                     {.h = {2, 1, 2, 5, 0, 0, kBF16}, .sq = 1400, .sk = 1400, .mask = "global", .split = true},
                     {.h = {2, 2, 1, 1, 0, 0, kF16}, .lq = {70, 0, 165}, .lk = {66, 20, 0}, .det = true, .seed = 12805}},
                    64, 64, seed, run_case_sm90_bwd_wide);
}

// ---------------------------------------------------------------------------
// The column-split sm90 backward: (192, 128) and (256, 256) on the 64 x 64 tile
// (bwd_consumer_cols).
// ---------------------------------------------------------------------------

// The column-split kernel's (192, 128) runs on the 64 x 64 tile: the 64 x 96 tile (on by default,
// sm90::bwd_wide192_enabled) forced off here; the BwdWide192* tests cover it.
struct Sm90BwdBigDims {
  Sm90BwdOn on;
  Sm90BwdBigDims() { sm90::set_bwd_wide192_enabled(0); }
  ~Sm90BwdBigDims() { sm90::set_bwd_wide192_enabled(-1); }
};

void big_dims(Case& c, bool d256) {
  c.h.dqk = d256 ? 256 : 192;
  c.h.dv = d256 ? 256 : 128;
}

// random_case_sm90 (BSHD / THD with empty samples, GQA / MQA, Hmask 1 or Hq, random interval
// and block-structured masks, strided tensors, dlse, random softmax scale) at (256, 256) (even
// seeds) or (192, 128), lengths up to 200 (CPU reference time).
Case bwd_big_case_sm90(uint64_t seed, bool deterministic) {
  Case c = random_case_sm90(seed);
  big_dims(c, seed % 2 == 0);
  c.sq = std::min<int64_t>(c.sq, 200);
  c.sk = std::min<int64_t>(c.sk, 200);
  for (auto& l : c.lq) l = std::min<int64_t>(l, 200);
  for (auto& l : c.lk) l = std::min<int64_t>(l, 200);
  c.backward = true;
  c.deterministic = deterministic;
  return c;
}

TEST(FlexGpuSm90, BwdBigDimsRandom) {
  REQUIRE_SM90();
  Sm90BwdBigDims on;
  for (uint64_t s = 1; s <= 32; ++s) run_case_sm90_bwd(bwd_big_case_sm90(s + 1500, false));
}

// The cell order of the non-deterministic sm90 backward forced on (sm90::set_bwd_cell_order: every
// key block of every kv head, heads slowest, long walks split; tile_sm90.h bwd_cell_order_sm90): random cases at D = 64 / 128, the
// wide (64, 64) tile and the big dims, and the benchmark masks (sink columns: split items).
TEST(FlexGpuSm90, BwdCellOrder) {
  REQUIRE_SM90();
  Sm90BwdOn on;
  struct CellsOn {
    CellsOn() { sm90::set_bwd_cell_order(1); }
    ~CellsOn() { sm90::set_bwd_cell_order(-1); sm90::set_bwd_split_first(-1); }
  } cells;
  std::vector<Sm90BwdRow> masks;
  for (const char* name : {"sink_local", "document_causal", "longformer"}) {
    for (int d : {128, 64}) {
      const int64_t sq = name[0] == 's' && d == 128 ? 4000 : 1000;  // sink columns of 62 steps: split items first
      masks.push_back({.h = {4, 2, 1, 1, d, d}, .sq = sq, .mask = name, .dt_by_seed = true});
    }
  }
  // Both item lists: task order and split tasks first (experimental).
  for (int split_first : {0, 1}) {
    SCOPED_TRACE(testing::Message() << "split_first " << split_first);
    sm90::set_bwd_split_first(split_first);
    for (uint64_t s = 1; s <= 16; ++s) run_case_sm90_bwd(bwd_case_sm90(s + 4700));
    for (uint64_t s = 1; s <= 8; ++s) run_case_sm90_bwd(bwd_big_case_sm90(s + 4800, false));
    uint64_t seed = 4900;
    run_sm90_bwd_rows(masks, 0, 0, seed);
  }
}

// Fully empty rows, only full blocks, one query with THD empty samples, MQA with Hmask = Hq and
// negative scores, strided tensors with dlse, the causal / document_causal benchmark masks, the
// split schedule (long K2Q walks) and grid mode, each at both head dims.
TEST(FlexGpuSm90, BwdBigDimsCases) {
  REQUIRE_SM90();
  Sm90BwdBigDims on;
  uint64_t seed = 9620;
  for (bool d256 : {false, true}) {
    const DType causal_dt = d256 ? kBF16 : kF16;
    run_sm90_bwd_rows({kEmptyRows,
                       {.h = {4, 2, 1, 1, 0, 0, kBF16}, .sq = 192, .sk = 256,  // only full blocks
                        .mopt = {.p_empty_row = 0.0, .p_full_row = 1.0}},
                       {.h = {4, 2, 4, 3, 0, 0, kF16}, .lq = {1, 0, 3, 70}, .lk = {150, 5, 0, 129}},  // one query
                       {.h = {3, 1, 3, 3, 0, 0, kBF16}, .sq = 150, .sk = 133, .negative = true},  // MQA, Hmask = Hq
                       {.h = {2, 2, 1, 3, 0, 0, kBF16}, .sq = 129, .sk = 127, .strided = true, .dlse = true},
                       {.h = {2, 1, 1, 1, 0, 0, causal_dt}, .sq = 384, .mask = "causal"},
                       {.h = {2, 1, 1, 1, 0, 0, causal_dt}, .sq = 384, .mask = "document_causal"},
                       {.h = {2, 1, 1, 1, 0, 0, kBF16}, .sq = 1024, .mask = "sink_local", .split = true},
                       {.h = {4, 2, 4, 3, 0, 0, kBF16}, .lq = {150, 0, 90}, .lk = {130, 70, 0}, .grid = true}},
                      d256 ? 256 : 192, d256 ? 256 : 128, seed);
  }
}

// Deterministic: random cases against the reference, and dq / dk / dv bitwise identical over
// three runs of a causal GQA THD case.
TEST(FlexGpuSm90, BwdBigDimsDeterministic) {
  REQUIRE_SM90();
  Sm90BwdBigDims on;
  for (uint64_t s = 1; s <= 12; ++s) run_case_sm90_bwd(bwd_big_case_sm90(s + 1700, true));
  uint64_t seed = 9959;
  run_sm90_bwd_rows({{.h = {4, 2, 1, 3, 192, 128, kBF16}, .lq = {500, 0, 200}, .lk = {450, 60, 260}, .det = true, .bitwise = true},
                     {.h = {4, 2, 1, 3, 256, 256, kBF16}, .lq = {500, 0, 200}, .lk = {450, 60, 260}, .det = true, .bitwise = true}},
                    0, 0, seed);
}

// Small cases for compute-sanitizer (memcheck / racecheck / synccheck): BwdSanitizerSmall's at
// (192, 128) and (256, 256), shorter.
TEST(FlexGpuSm90, BwdBigDimsSanitizer) {
  REQUIRE_SM90();
  Sm90BwdBigDims on;
  uint64_t seed = 9810;
  run_sm90_bwd_rows({{.h = {2, 1, 2, 3, 192, 128, kBF16}, .sq = 150, .sk = 140},
                     {.h = {2, 2, 1, 1, 256, 256, kF16}, .lq = {70, 0, 130}, .lk = {66, 20, 0}},
                     {.h = {2, 1, 2, 5, 256, 256, kBF16}, .sq = 600, .sk = 600, .mask = "global", .split = true},
                     {.h = {2, 2, 1, 1, 192, 128, kF16}, .lq = {70, 0, 130}, .lk = {66, 20, 0}, .det = true, .seed = 9815}},
                    0, 0, seed);
}

// ---------------------------------------------------------------------------
// The wide backward tile of (192, 128): 64 query rows x 96 keys (tile_sm90.h kTileSm90Wide192, the
// three-warpgroup consumers with dK / dV transposed, bwd_consumer_t3; sm90::bwd_wide192_enabled,
// on by default, forced on here so that every (192, 128) sm90 plan built inside takes it). 96-key
// blocks: partial payload sub-tiles of 32 columns, key counts around 96 / 192 boundaries. Each
// case checks that the tile is the consumer's and that the sm90 backward ran.
// ---------------------------------------------------------------------------

struct Sm90BwdWide192 {
  Sm90BwdOn on;
  Sm90BwdWide192() { sm90::set_bwd_wide192_enabled(1); }
  ~Sm90BwdWide192() { sm90::set_bwd_wide192_enabled(-1); }
};

void run_case_sm90_bwd_wide192(const Case& in) {
  Case c = in;
  c.arch = 90;
  c.backward = true;
  c.h.dqk = 192;
  c.h.dv = 128;
  const Consumer w = consumer_for(90, 192, 128);
  ASSERT_TRUE(sm90::bwd_wide_tile_sm90(192, 128, w.bwd_block_q, w.bwd_block_k) && w.bwd_block_k == 96)
      << "the 64 x 96 tile is not chosen";
  run_case_sm90_bwd(c);
}

TEST(FlexGpuSm90, BwdWide192Random) {
  REQUIRE_SM90();
  Sm90BwdWide192 on;
  for (uint64_t s = 1; s <= 30; ++s) run_case_sm90_bwd_wide192(bwd_big_case_sm90(s + 5100, s % 3 == 0));
}

// BwdBigDimsCases' rows at (192, 128) on the 64 x 96 tile, lengths around 96-key boundaries, the
// benchmark masks, deterministic masks and a deterministic case bitwise identical over three runs.
TEST(FlexGpuSm90, BwdWide192Cases) {
  REQUIRE_SM90();
  Sm90BwdWide192 on;
  std::vector<Sm90BwdRow> rows = {
      kEmptyRows,
      {.h = {4, 2, 1, 1, 0, 0, kBF16}, .sq = 192, .sk = 288, .mopt = {.p_empty_row = 0.0, .p_full_row = 1.0}},  // only full blocks
      {.h = {4, 2, 4, 3, 0, 0, kF16}, .lq = {1, 0, 3, 70, 65, 97}, .lk = {150, 5, 0, 129, 96, 95}},  // 96-key boundaries
      {.h = {3, 1, 3, 3, 0, 0, kBF16}, .sq = 150, .sk = 193, .negative = true},                 // MQA, Hmask = Hq
      {.h = {2, 2, 1, 3, 0, 0, kBF16}, .sq = 129, .sk = 191, .strided = true, .dlse = true},
      {.h = {2, 1, 1, 1, 0, 0, kBF16}, .sq = 1024, .mask = "sink_local", .split = true},
      {.h = {4, 2, 4, 3, 0, 0, kBF16}, .lq = {150, 0, 90}, .lk = {130, 70, 0}, .grid = true}};
  for (const std::string& name : fs_test::benchmark_mask_names()) {
    rows.push_back({.h = {2, 1, 1, 1, 0, 0}, .sq = bench_sq(name), .mask = name, .dt_by_seed = true});
  }
  for (const char* name : {"causal", "document_causal", "sink_local"}) {  // deterministic
    rows.push_back({.h = {2, 1, 1, 1, 0, 0, kBF16}, .sq = 1024, .mask = name, .det = true});
  }
  rows.push_back({.h = {4, 2, 1, 3, 0, 0, kBF16}, .lq = {500, 0, 200}, .lk = {450, 60, 260}, .det = true, .bitwise = true});
  uint64_t seed = 5300;
  run_sm90_bwd_rows(rows, 192, 128, seed, run_case_sm90_bwd_wide192);
}

// Small cases for compute-sanitizer (memcheck / racecheck / synccheck): BwdBigDimsSanitizer's at
// (192, 128) on the 64 x 96 tile.
TEST(FlexGpuSm90, BwdWide192Sanitizer) {
  REQUIRE_SM90();
  Sm90BwdWide192 on;
  uint64_t seed = 5400;
  run_sm90_bwd_rows({{.h = {2, 1, 2, 3, 0, 0, kBF16}, .sq = 150, .sk = 140},
                     {.h = {2, 2, 1, 1, 0, 0, kF16}, .lq = {70, 0, 130}, .lk = {66, 20, 0}},
                     {.h = {2, 1, 2, 5, 0, 0, kBF16}, .sq = 600, .sk = 600, .mask = "global", .split = true},
                     {.h = {2, 2, 1, 1, 0, 0, kF16}, .lq = {70, 0, 130}, .lk = {66, 20, 0}, .det = true, .seed = 5405}},
                    192, 128, seed, run_case_sm90_bwd_wide192);
}

// ---------------------------------------------------------------------------
// Packed GQA on the sm90 forward (FwdParams::pack = G, a power of two dividing 128: Q's packed
// tensor-map box, the epilogue's (position, head) rows and per-head max_logit; kernel_fwd_sm90.cuh).
// On by default (sm90::fwd_packed_enabled; FLASHSPAN_SM90_PACK_GQA=0 turns it off); these tests
// switch it on for the process (sm90::set_fwd_packed_enabled) whatever the environment says, and check that the sm90 forward was the kernel
// that ran (sm90::fwd_launches). Plans are built with arch 90 directly, so decode shapes run the
// 128-row tile here too (the automatic choice keeps them on sm80: PackedGqaPlanChoice).
// ---------------------------------------------------------------------------

struct Sm90PackedOn {
  Sm90PackedOn() { sm90::set_fwd_packed_enabled(1); }
  ~Sm90PackedOn() { sm90::set_fwd_packed_enabled(-1); }
};

void run_case_sm90_packed(const Case& c) {
  ASSERT_TRUE(c.arch == 90 && c.pack_gqa) << c.describe();
  const int64_t before = sm90::fwd_launches();
  run_case(c);
  EXPECT_GT(sm90::fwd_launches(), before) << "the sm90 forward did not run: " << c.describe();
}

// packed_random_case (G in {2, 4, 8}, Hkv 1 or 2, Hmask 1 or Hq, decode-like and prefill query
// lengths, BSHD / THD with empty samples, granularities 1 / 16 / 64, strided tensors, forward
// and backward, negative logits, random softmax scale) on the sm90 family.
Case packed_random_case_sm90(uint64_t seed) {
  Case c = packed_random_case(seed);
  c.arch = 90;
  Rng rng(seed * 7727 + 3);
  if (rng() % 3 == 0) c.mopt.granularity = 128;
  return c;
}

TEST(FlexGpuSm90, PackedGqaRandom) {
  REQUIRE_SM90();
  Sm90PackedOn on;
  for (uint64_t s = 1; s <= 40; ++s) run_case_sm90_packed(packed_random_case_sm90(s + 300));
}

// Every G in {2, 4, 8} (and 16, 32: one head a row half / a row of a warp's max_logit) on
// BSHD and on THD with empty samples and lengths off the tile, Hmask 1 and Hq, LSE and
// max_logit (also all-negative logits for the signed per-head max), both dtypes, D 64 / 128 and
// a dims pair below its kernel's.
TEST(FlexGpuSm90, PackedGqaShapes) {
  REQUIRE_SM90();
  Sm90PackedOn on;
  uint64_t seed = 9600;
  for (int G : {2, 4, 8, 16, 32}) {
    const int hkv = G <= 4 ? 2 : 1;
    for (int layout = 0; layout < 2; ++layout) {
      for (bool per_head : {false, true}) {
        Case c;
        c.arch = 90;
        c.pack_gqa = true;
        c.h = HeadConfig{G * hkv, hkv, per_head ? G * hkv : 1, 3, G == 8 ? 64 : 128, G == 8 ? 64 : 128,
                         per_head ? DType::kBFloat16 : DType::kFloat16};
        if (layout == 0) {
          c.batch = 2;
          c.sq = G >= 16 ? 21 : 97;
          c.sk = 333;
        } else {
          c.varlen = true;
          c.lq = {G >= 16 ? 9 : 70, 0, 1, G >= 16 ? 30 : 165};
          c.lk = {250, 20, 130, 0};
          c.batch = 4;
        }
        c.backward = G == 4 && per_head;
        c.deterministic = false;
        c.negative_logits = G == 2 && per_head;
        c.seed = ++seed;
        run_case_sm90_packed(c);
      }
    }
  }
  {
    Case c;  // dims below the kernel's (zero-filled columns), optional outputs off, strided
    c.arch = 90;
    c.pack_gqa = true;
    c.batch = 2;
    c.sq = 50;
    c.sk = 300;
    c.h = HeadConfig{8, 2, 8, 5, 40, 104, DType::kBFloat16};
    c.strided = true;
    c.fwd_lse = false;
    c.fwd_ml = false;
    c.seed = ++seed;
    run_case_sm90_packed(c);
  }
  for (const auto& d : std::vector<std::pair<int, int>>{{192, 128}, {256, 256}}) {
    Case c;  // the (192, 128) and (256, 256) kernels, THD with an empty sample
    c.arch = 90;
    c.pack_gqa = true;
    c.varlen = true;
    c.lq = {40, 0, 17};
    c.lk = {200, 10, 190};
    c.batch = 3;
    c.h = HeadConfig{8, 2, 1, 3, d.first, d.second, DType::kBFloat16};
    c.seed = ++seed;
    run_case_sm90_packed(c);
  }
}

// The split schedule on and off over packed tasks: long walks split (combine per packed row,
// bitwise over two runs), a decode batch (few packed tasks, long key walks), then without a
// workspace (static persistent grid over the tasks) and in grid mode (no task list).
TEST(FlexGpuSm90, PackedGqaFwdSplit) {
  REQUIRE_SM90();
  Sm90PackedOn on;
  {
    Case c = fwd_split_case("global", HeadConfig{8, 2, 8, 5, 64, 64, DType::kBFloat16}, 9701);
    c.arch = 90;
    c.pack_gqa = true;
    c.sq = 700;
    c.sk = 2600;
    run_case_sm90_packed(c);
  }
  {
    Case c = fwd_split_case("global", HeadConfig{4, 1, 1, 5, 128, 128, DType::kFloat16}, 9702);
    c.arch = 90;
    c.pack_gqa = true;
    c.varlen = true;
    c.lq = {600, 0, 300, 77};
    c.lk = {2500, 50, 257, 2090};
    c.batch = 4;
    c.strided = true;
    run_case_sm90_packed(c);
  }
  {
    Case c = fwd_split_case("dense", HeadConfig{16, 2, 1, 1, 128, 128, DType::kBFloat16}, 9703);
    c.arch = 90;
    c.pack_gqa = true;  // Sq = 5, 8 x 5 = 40 packed rows, 32 key blocks a task
    c.batch = 2;
    c.sq = 5;
    c.sk = 4096;
    run_case_sm90_packed(c);
  }
  {
    Case c = fwd_split_case("global", HeadConfig{8, 1, 8, 5, 64, 64, DType::kBFloat16}, 9704);
    c.arch = 90;
    c.pack_gqa = true;
    c.sq = 700;
    c.sk = 2600;
    c.expect_fwd_split = false;
    c.fwd_workspace = false;  // split schedule off
    run_case_sm90_packed(c);
    c.fwd_workspace = true;
    c.grid_mode = true;
    c.seed = 9705;
    run_case_sm90_packed(c);
  }
}

// Small packed cases for compute-sanitizer (scripts/gpu_check.sh's memcheck filter): BSHD G = 4,
// THD G = 8 with empty samples and Hmask = Hq, a split packed forward.
TEST(FlexGpuSm90, PackedGqaSanitizer) {
  REQUIRE_SM90();
  Sm90PackedOn on;
  Case a;
  a.arch = 90;
  a.pack_gqa = true;
  a.batch = 2;
  a.sq = 45;
  a.sk = 140;
  a.h = HeadConfig{8, 2, 1, 3, 128, 128, DType::kBFloat16};
  a.backward = false;
  a.seed = 9711;
  run_case_sm90_packed(a);
  Case b;
  b.arch = 90;
  b.pack_gqa = true;
  b.varlen = true;
  b.lq = {20, 0, 3, 33};
  b.lk = {66, 20, 0, 140};
  b.batch = 4;
  b.h = HeadConfig{8, 1, 8, 3, 64, 64, DType::kFloat16};
  b.backward = false;
  b.seed = 9712;
  run_case_sm90_packed(b);
  Case f = fwd_split_case("global", HeadConfig{4, 1, 4, 5, 64, 64, DType::kBFloat16}, 9713);
  f.arch = 90;
  f.pack_gqa = true;
  f.sq = 700;
  f.sk = 2200;
  run_case_sm90_packed(f);
}

// The automatic family choice (choose_plan, arch 0) for packed requests on this sm_90 device:
// with the packed sm90 forward on, packed non-decode shapes take the sm90 family (128-row tile,
// packed), decode shapes (max_seqlen_q * G <= 16) the sm80 decode tile, G not a power of two
// the sm80 family; with it off, every packed request stays on sm80. (FLASHSPAN_KERNEL_FAMILY
// must be unset or auto.)
TEST(FlexGpuSm90, PackedGqaPlanChoice) {
  REQUIRE_SM90();
  const char* fam = std::getenv("FLASHSPAN_KERNEL_FAMILY");
  if (fam != nullptr && std::string(fam) == "sm80") GTEST_SKIP() << "FLASHSPAN_KERNEL_FAMILY=sm80";
  auto geo = [](int64_t sq, int hq, int hkv) {
    FlexGeometry g = make_bshd_geometry(2, sq, 512, HeadConfig{hq, hkv, 1, 1, 128, 128, DType::kBFloat16});
    g.device = DeviceType::kCUDA;
    g.device_id = 0;
    return g;
  };
  {
    Sm90PackedOn on;
    PlanChoice c = choose_plan(0, -1, geo(64, 8, 2));  // 256 packed rows a sample
    EXPECT_EQ(c.arch, 90);
    EXPECT_TRUE(c.pack_gqa);
    EXPECT_EQ(c.consumer.fwd_block_q, 128);
    c = choose_plan(0, 1, geo(300, 8, 2));  // packing asked for, long queries
    EXPECT_EQ(c.arch, 90);
    EXPECT_TRUE(c.pack_gqa);
    c = choose_plan(0, -1, geo(3, 8, 1));  // 24 packed rows: not a decode shape
    EXPECT_EQ(c.arch, 90);
    EXPECT_TRUE(c.pack_gqa);
    c = choose_plan(0, -1, geo(2, 8, 1));  // decode: 16 packed rows
    EXPECT_EQ(c.arch, 80);
    EXPECT_TRUE(c.pack_gqa);
    EXPECT_EQ(c.consumer.fwd_block_q, kDecodeBlockQ);
    c = choose_plan(0, -1, geo(64, 6, 2));  // G = 3
    EXPECT_EQ(c.arch, 80);
    EXPECT_TRUE(c.pack_gqa);
    c = choose_plan(0, -1, geo(300, 8, 2));  // not packed by the heuristic: the unpacked sm90 plan
    EXPECT_EQ(c.arch, 90);
    EXPECT_FALSE(c.pack_gqa);
  }
  sm90::set_fwd_packed_enabled(0);
  PlanChoice c = choose_plan(0, -1, geo(64, 8, 2));
  EXPECT_EQ(c.arch, 80);
  EXPECT_TRUE(c.pack_gqa);
  c = choose_plan(0, 1, geo(300, 8, 2));
  EXPECT_EQ(c.arch, 80);
  sm90::set_fwd_packed_enabled(-1);
}

#endif  // FLASHSPAN_WITH_CUDA

}  // namespace
}  // namespace flashspan::test
