// GPU tests of issue 18: no launch depends on grid-dimension limits. Problems whose batch
// size, THD sample count or head count push a naive grid past gridDim.y/z = 65,535 (many
// short sequences: recommendation models, packed fine-tuning batches) run the whole
// pipeline -- CUDA planner, forward (task and grid mode), backward with atomic and with
// deterministic dQ -- and a few samples are checked against the CPU reference.
//
// Outputs are NaN-poisoned before every run. The checked samples (first, second, middle,
// last, and for THD some zero-length ones) are cut out of the large tensors into one-sample
// THD problems; the reference runs the forward on them (out, LSE) and the backward from the
// GPU's own out and LSE (what the GPU backward saw), with the criteria of error_criteria.h.
// Inputs are filled from a table of random 16-bit values (fast for ~10^8 elements).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#ifdef FLASHSPAN_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "error_criteria.h"
#include "gpu_harness.h"
#include "kernel_internals.h"
#include "plan/planner.h"
#include "reference/reference.h"
#include "test_util.h"

namespace flashspan::test {
namespace {

#ifndef FLASHSPAN_WITH_CUDA

TEST(FlexGpu, LaunchLimitsSkipped) { GTEST_SKIP() << "flashspan was built without CUDA"; }

#else

struct LimitCase {
  bool varlen = false;
  int batch = 1;
  int64_t sq = 1, sk = 1;          // BSHD
  std::vector<int64_t> lq, lk;     // THD
  HeadConfig h;
  bool pack_gqa = false;
  uint64_t seed = 1;
};

// Fills a dense 16-bit tensor with values uniform in [lo, hi] (a table of 4096 values, picked
// at random), far faster than element-wise conversion for 10^8 elements.
void fill_fast(HostTensor& t, Rng& rng, double lo, double hi) {
  std::vector<uint16_t> table(4096);
  HostTensor one(t.dtype(), {1});
  std::uniform_real_distribution<double> u(lo, hi);
  for (uint16_t& x : table) {
    write_elem(one.view(), 0, u(rng));
    std::memcpy(&x, one.view().data, 2);
  }
  uint16_t* p = static_cast<uint16_t*>(t.view().data);
  uint64_t s = rng() | 1;
  for (int64_t i = 0, n = t.numel(); i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    p[i] = table[s & 4095];
  }
}

// Random endpoints, contiguous int32 [Hmask, nfunc, total_q]: per row nfunc sorted keys in
// [0, len_k], about one row in eight empty and one in eight full.
std::vector<int32_t> fast_mask(Rng& rng, const FlexGeometry& g) {
  const int64_t T = g.total_q;
  const int nf = g.nfunc;
  std::vector<int32_t> mask(size_t(g.num_heads_mask) * nf * T);
  std::vector<int32_t> e(nf);
  for (int hm = 0; hm < g.num_heads_mask; ++hm) {
    for (int b = 0; b < g.batch; ++b) {
      const int32_t lk = int32_t(g.seqlen_k(b));
      for (int64_t row = g.cu_seqlens_q[b]; row < g.cu_seqlens_q[b + 1]; ++row) {
        const uint64_t r = rng();
        if ((r & 7) == 0) {
          std::fill(e.begin(), e.end(), 0);  // empty row
        } else if ((r & 7) == 1) {
          std::fill(e.begin(), e.end(), lk);  // full row
        } else {
          for (int f = 0; f < nf; ++f) e[f] = int32_t(rng() % uint64_t(lk + 1));
          std::sort(e.begin(), e.end());
        }
        for (int f = 0; f < nf; ++f) mask[(size_t(hm) * nf + f) * T + row] = e[f];
      }
    }
  }
  return mask;
}

// Copies elements [begin, end) of a device tensor's dense storage into a host tensor.
void download_range(const DevTensor& d, HostTensor& h, int64_t begin) {
  const size_t bytes = size_t(h.numel()) * dtype_size(h.dtype());
  if (bytes == 0) return;
  cuda_ok(cudaMemcpy(h.view().data, static_cast<const char*>(d.buf->p) + begin * dtype_size(h.dtype()), bytes,
                     cudaMemcpyDeviceToHost),
          "download range");
}

void copy_range(const HostTensor& src, HostTensor& dst, int64_t begin) {
  std::memcpy(dst.view().data, static_cast<const char*>(src.view().data) + begin * dtype_size(src.dtype()),
              size_t(dst.numel()) * dtype_size(dst.dtype()));
}

// Element offset of LSE (b, h, local row 0) in a dense [B,Hq,Sq] / [Hq,Tq] tensor, and the
// stride between heads.
int64_t lse_offset(const FlexGeometry& g, int b, int h) {
  return g.varlen ? int64_t(h) * g.total_q + g.cu_seqlens_q[b] : (int64_t(b) * g.num_heads_q + h) * g.max_seqlen_q;
}

// Everything of the large problem, on the device.
struct BigRun {
  FlexGeometry g, gd;
  std::vector<int32_t> mask;
  std::unique_ptr<MaskPlan> plan;
  HostTensor q, k, v, dout;
  DevTensor dq_in, dk_in, dv_in, ddout;
  DevTensor out, lse;       // forward outputs
  DevTensor dq, dk, dv;     // backward outputs
  float scale = 0;
};

// Checks sample b of the large run's outputs against the reference on the cut-out sample.
void check_sample(const BigRun& r, int b, bool check_fwd, bool check_bwd) {
  const FlexGeometry& g = r.g;
  const int64_t lq = g.seqlen_q(b), lk = g.seqlen_k(b);
  SCOPED_TRACE(::testing::Message() << "sample " << b << " (len_q " << lq << ", len_k " << lk << ")");
  HeadConfig h;
  h.hq = g.num_heads_q;
  h.hkv = g.num_heads_kv;
  h.hmask = g.num_heads_mask;
  h.nfunc = g.nfunc;
  h.dqk = g.head_dim_qk;
  h.dv = g.head_dim_v;
  h.dtype = g.dtype;
  const FlexGeometry s = make_thd_geometry({lq}, {lk}, h);
  std::vector<int32_t> mask(size_t(h.hmask) * h.nfunc * lq);
  for (int hm = 0; hm < h.hmask; ++hm) {
    for (int f = 0; f < h.nfunc; ++f) {
      for (int64_t i = 0; i < lq; ++i) {
        mask[(size_t(hm) * h.nfunc + f) * lq + i] =
            r.mask[(size_t(hm) * h.nfunc + f) * g.total_q + g.cu_seqlens_q[b] + i];
      }
    }
  }
  const int64_t q0 = g.cu_seqlens_q[b] * h.hq, k0 = g.cu_seqlens_k[b] * h.hkv;
  HostTensor q = make_q(s), k = make_k(s), v = make_v(s), dout = make_out(s);
  copy_range(r.q, q, q0 * h.dqk);
  copy_range(r.k, k, k0 * h.dqk);
  copy_range(r.v, v, k0 * h.dv);
  copy_range(r.dout, dout, q0 * h.dv);
  // The GPU's out and LSE of the sample.
  HostTensor out = make_out(s), lse = make_lse(s);
  download_range(r.out, out, q0 * h.dv);
  for (int hh = 0; hh < h.hq && lq > 0; ++hh) {
    cuda_ok(cudaMemcpy(static_cast<float*>(lse.view().data) + int64_t(hh) * lq,
                       static_cast<const float*>(r.lse.buf->p) + lse_offset(g, b, hh), sizeof(float) * size_t(lq),
                       cudaMemcpyDeviceToHost),
            "download lse");
  }
  if (check_fwd) {
    HostTensor ref_out = make_out(s), ref_lse = make_lse(s);
    reference::FlexForwardArgs fa;
    fa.geometry = &s;
    fa.mask = mask.data();
    fa.q = q.view();
    fa.k = k.view();
    fa.v = v.view();
    fa.out = ref_out.view();
    fa.lse = ref_lse.view();
    fa.softmax_scale = r.scale;
    fa.accumulate_double = true;
    reference::flex_forward(fa);
    EXPECT_TRUE(fs_test::tensor_close(out.to_vector(), ref_out.to_vector(), g.dtype)) << "out";
    EXPECT_TRUE(fs_test::stat_close(lse.to_vector(), ref_lse.to_vector())) << "lse";
  }
  if (check_bwd) {
    HostTensor ref_dq = make_q(s), ref_dk = make_k(s), ref_dv = make_v(s);
    reference::FlexBackwardArgs ba;
    ba.geometry = &s;
    ba.mask = mask.data();
    ba.q = q.view();
    ba.k = k.view();
    ba.v = v.view();
    ba.out = out.view();
    ba.dout = dout.view();
    ba.lse = lse.view();
    ba.dq = ref_dq.view();
    ba.dk = ref_dk.view();
    ba.dv = ref_dv.view();
    ba.softmax_scale = r.scale;
    ba.accumulate_double = true;
    reference::flex_backward(ba);
    HostTensor dq = make_q(s), dk = make_k(s), dv = make_v(s);
    download_range(r.dq, dq, q0 * h.dqk);
    download_range(r.dk, dk, k0 * h.dqk);
    download_range(r.dv, dv, k0 * h.dv);
    EXPECT_TRUE(fs_test::tensor_close(dq.to_vector(), ref_dq.to_vector(), g.dtype)) << "dq";
    EXPECT_TRUE(fs_test::tensor_close(dk.to_vector(), ref_dk.to_vector(), g.dtype)) << "dk";
    EXPECT_TRUE(fs_test::tensor_close(dv.to_vector(), ref_dv.to_vector(), g.dtype)) << "dv";
  }
}

// The samples to check: first, second, middle, last, and up to three zero-length ones.
std::vector<int> samples_to_check(const FlexGeometry& g) {
  std::vector<int> s = {0, std::min(1, g.batch - 1), g.batch / 2, g.batch - 1};
  int zeros = 0;
  for (int b = 0; b < g.batch && zeros < 3; ++b) {
    if (g.seqlen_q(b) == 0 || g.seqlen_k(b) == 0) {
      s.push_back(b);
      ++zeros;
    }
  }
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  return s;
}

void poison_all(BigRun& r) {
  for (DevTensor* t : {&r.out, &r.lse, &r.dq, &r.dk, &r.dv}) poison(*t);
}

// Runs forward (task mode and, without the task lists, grid mode) and backward (atomic and
// deterministic dQ) of the case, checking the samples after each run.
void run_limit_case(const LimitCase& c) {
  BigRun r;
  Rng rng(c.seed);
  r.g = c.varlen ? make_thd_geometry(c.lq, c.lk, c.h) : make_bshd_geometry(c.batch, c.sq, c.sk, c.h);
  const FlexGeometry& g = r.g;
  r.gd = g;
  r.gd.device = DeviceType::kCUDA;
  r.gd.device_id = 0;
  r.scale = default_softmax_scale(g.head_dim_qk);
  r.mask = fast_mask(rng, g);

  // The CUDA planner, as a user's call runs it (its launches are part of the audit).
  DevBuf dmask(std::max<size_t>(4, r.mask.size() * sizeof(int32_t)));
  cuda_ok(cudaMemcpy(dmask.p, r.mask.data(), r.mask.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "mask");
  PlanRequest req;
  req.geometry = &r.gd;
  req.consumer = consumer_for_plan(80, g, c.pack_gqa);
  req.build_backward = true;
  req.pack_gqa = c.pack_gqa;
  ASSERT_NO_THROW(r.plan = build_mask_plan_cuda(req, static_cast<const int32_t*>(dmask.p), nullptr));
  ASSERT_NO_THROW(flex_check_support_gpu(r.gd, *r.plan, true));

  r.q = make_q(g);
  r.k = make_k(g);
  r.v = make_v(g);
  r.dout = make_out(g);
  fill_fast(r.q, rng, -1.5, 1.5);
  fill_fast(r.k, rng, -1.5, 1.5);
  fill_fast(r.v, rng, -1.0, 1.0);
  fill_fast(r.dout, rng, -1.0, 1.0);
  r.dq_in = dev_like(r.q, true);
  r.dk_in = dev_like(r.k, true);
  r.dv_in = dev_like(r.v, true);
  r.ddout = dev_like(r.dout, true);
  {
    HostTensor out = make_out(g), lse = make_lse(g), dq = make_q(g), dk = make_k(g), dv = make_v(g);
    r.out = dev_like(out, false);
    r.lse = dev_like(lse, false);
    r.dq = dev_like(dq, false);
    r.dk = dev_like(dk, false);
    r.dv = dev_like(dv, false);
  }
  const std::vector<int> samples = samples_to_check(g);

  auto forward = [&](const MaskPlan& plan) {
    DevBuf ws(std::max<size_t>(16, flex_fwd_workspace_size(r.gd, plan, false)));
    FlexFwdLaunch a;
    a.geometry = &r.gd;
    a.plan = &plan;
    a.q = r.dq_in.view;
    a.k = r.dk_in.view;
    a.v = r.dv_in.view;
    a.out = r.out.view;
    a.lse = r.lse.view;
    a.softmax_scale = r.scale;
    a.workspace = ws.p;
    a.workspace_bytes = ws.bytes;
    launch_flex_fwd(a);
    cuda_ok(cudaDeviceSynchronize(), "forward");
  };
  auto backward = [&](const MaskPlan& plan, bool deterministic) {
    DevBuf ws(std::max<size_t>(16, flex_bwd_workspace_size(r.gd, plan, deterministic)));
    FlexBwdLaunch a;
    a.geometry = &r.gd;
    a.plan = &plan;
    a.q = r.dq_in.view;
    a.k = r.dk_in.view;
    a.v = r.dv_in.view;
    a.out = r.out.view;
    a.dout = r.ddout.view;
    a.lse = r.lse.view;
    a.dq = r.dq.view;
    a.dk = r.dk.view;
    a.dv = r.dv.view;
    a.softmax_scale = r.scale;
    a.deterministic = deterministic;
    a.workspace = ws.p;
    a.workspace_bytes = ws.bytes;
    launch_flex_bwd(a);
    cuda_ok(cudaDeviceSynchronize(), deterministic ? "backward (deterministic)" : "backward");
  };

  // Task mode: forward, then backward from the GPU's out/LSE, atomic and deterministic dQ.
  poison_all(r);
  ASSERT_NO_THROW(forward(*r.plan));
  for (bool det : {false, true}) {
    SCOPED_TRACE(det ? "deterministic" : "atomic dQ");
    poison(r.dq);
    poison(r.dk);
    poison(r.dv);
    ASSERT_NO_THROW(backward(*r.plan, det));
    for (int b : samples) check_sample(r, b, !det, true);
  }
  // Grid mode (the plan without task lists): folded (block, head) grids.
  {
    SCOPED_TRACE("grid mode");
    std::unique_ptr<MaskPlan> host = copy_plan_to_host(*r.plan);
    std::unique_ptr<MaskPlan> grid = upload_plan(*host, /*drop_tasks=*/true);
    poison_all(r);
    ASSERT_NO_THROW(forward(*grid));
    ASSERT_NO_THROW(backward(*grid, true));
    for (int b : samples) check_sample(r, b, true, true);
  }
}

HeadConfig heads(int hq, int hkv, int hmask, int nfunc, int d) {
  HeadConfig h;
  h.hq = hq;
  h.hkv = hkv;
  h.hmask = hmask;
  h.nfunc = nfunc;
  h.dqk = h.dv = d;
  h.dtype = DType::kBFloat16;
  return h;
}

// BSHD, B = 70,000 short sequences (B x Hq = 140,000 rows of the old (rows, Hq, B) grids).
TEST(FlexGpu, LaunchLimitsBatch70000) {
  REQUIRE_GPU();
  LimitCase c;
  c.batch = 70000;
  c.sq = c.sk = 16;
  c.h = heads(2, 2, 2, 3, 64);
  c.seed = 18001;
  run_limit_case(c);
}

// BSHD, B = 300,000 sequences of one token.
TEST(FlexGpu, LaunchLimitsBatch300000) {
  REQUIRE_GPU();
  LimitCase c;
  c.batch = 300000;
  c.sq = c.sk = 1;
  c.h = heads(1, 1, 1, 1, 64);
  c.seed = 18002;
  run_limit_case(c);
}

// THD, 100,000 samples of 0..24 query and key tokens (zero-length samples on both sides).
TEST(FlexGpu, LaunchLimitsThd100000) {
  REQUIRE_GPU();
  LimitCase c;
  c.varlen = true;
  Rng rng(18003);
  for (int b = 0; b < 100000; ++b) {
    c.lq.push_back(rng() % 8 == 0 ? 0 : int64_t(rng() % 25));
    c.lk.push_back(rng() % 8 == 0 ? 0 : int64_t(rng() % 25));
  }
  c.lq[1] = 0;  // a zero-length query sample and a zero-length key sample among the checked ones
  c.lk[2] = 0;
  c.h = heads(2, 2, 1, 3, 64);
  c.seed = 18003;
  run_limit_case(c);
}

// Hq = 256 query heads on one kv head, unpacked and packed GQA.
TEST(FlexGpu, LaunchLimitsHeads256) {
  REQUIRE_GPU();
  for (bool pack : {false, true}) {
    SCOPED_TRACE(pack ? "pack_gqa" : "unpacked");
    LimitCase c;
    c.batch = 2;
    c.sq = pack ? 4 : 96;
    c.sk = 160;
    c.h = heads(256, 1, 1, 3, 64);
    c.pack_gqa = pack;
    c.seed = pack ? 18005 : 18004;
    run_limit_case(c);
  }
}

#endif  // FLASHSPAN_WITH_CUDA

}  // namespace
}  // namespace flashspan::test
