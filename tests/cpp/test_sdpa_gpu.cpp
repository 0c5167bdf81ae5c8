// GPU tests of SDPA on the analytic-mask kernels (the C++ API on CUDA tensors: check_support,
// workspace_size, execute; dispatch/sdpa_dispatch.cu, kernels/sm80 sdpa_*_kernel_sm80, and the
// sm90 forward and backward, kernels/sm90 sdpa_fwd_kernel_sm90 / sdpa_bwd_kernel_sm90 and their
// instantiations with score modifiers and dropout: SdpaGpu.Sm90Forward*, SdpaGpu.Sm90Backward*,
// SdpaGpu.Sm90Dropout*) against
// the SDPA CPU reference run through the same API on host copies of the same 16-bit inputs.
//
// Every case: random shapes (S_q != S_kv), head dims, GQA / MQA, float16 / bfloat16, a mask in
// either alignment (none, causal, bands, windows), padding (seq_len or cu_seq_len, int32 or
// int64) and ragged (packed THD) sides with gaps and zero-length samples, BHSD / BSHD /
// padded-stride layouts. Inputs are NaN outside the samples (padding rows, gaps: never
// read); outputs and workspaces are NaN / 0xFF-poisoned before every run; padded outputs must
// hold 0 / -inf past the samples and ragged ones must leave the gaps untouched. The backward
// takes the reference's O (rounded) and LSE, with their padding re-poisoned, so it is checked
// on its own. Error criteria: tests/cpp/error_criteria.h.
// Skips when no CUDA device is visible (or the build has no CUDA).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "core/philox.h"  // dropout_keep, dropout_threshold (Sm90DropoutKeepMaskIsSm80s)
#include "error_criteria.h"
#include "flashspan/flashspan.hpp"
#include "gpu_harness.h"
#include "scoped_env.h"  // ScopedSwitch, ScopedEnv
#include "sdpa_case.h"
#ifdef FLASHSPAN_WITH_CUDA
#include "dispatch/sdpa_launch.h"     // set_sdpa_fwd_sm90_enabled, set_sdpa_bwd_sm90_enabled
#include "kernels/sm80/launch_sm80.h"  // sm80::set_sdpa_sm80_features_forced, sdpa_*_mask_only_launches
#include "kernels/sm90/launch_sm90.h"  // sm90::sdpa_fwd_launches, sdpa_bwd_launches, device_supported
#include "kernels/sm90/sample_maps_sm90.h"  // Sm90SampleMapsFlagMisalignedStarts
#include "kernels/sm90/tma_sm90.h"
#endif

namespace flashspan::test {
namespace {

#ifndef FLASHSPAN_WITH_CUDA

TEST(SdpaGpu, Skipped) { GTEST_SKIP() << "flashspan was built without CUDA"; }

#else

namespace api = flashspan::api;
using namespace sdpa_case;

// ---------------------------------------------------------------------------
// A tensor: host storage in its layout (sdpa_case.h), a device twin, its descriptors
// ---------------------------------------------------------------------------

struct Tensor : Storage {
  std::unique_ptr<DevBuf> dev;

  void alloc(const Layout& l, DType t) {
    alloc_host(l, t);
    dev = std::make_unique<DevBuf>(host.size());
  }
  void upload() { cuda_ok(cudaMemcpy(dev->p, host.data(), host.size(), cudaMemcpyHostToDevice), "upload"); }
  void poison_device() { cuda_ok(cudaMemset(dev->p, 0xff, host.size()), "poison"); }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> out(host.size());
    cuda_ok(cudaMemcpy(out.data(), dev->p, out.size(), cudaMemcpyDeviceToHost), "download");
    return out;
  }
  api::TensorDesc desc(bool cuda) const {
    const fs_dtype_t t = dtype == DType::kFloat32    ? api::kFloat32
                         : dtype == DType::kBFloat16 ? api::kBFloat16
                         : dtype == DType::kUInt8    ? api::kUInt8
                                                     : api::kFloat16;
    const fs_device_t d{cuda ? FS_DEVICE_CUDA : FS_DEVICE_CPU, 0};
    return api::TensorDesc(nullptr, t, d, {lay.B, lay.H, lay.S, lay.D}, lay.strides);
  }
  void* ptr(bool cuda) const { return cuda ? dev->p : const_cast<uint8_t*>(host.data()); }
};

// An int32 / int64 index tensor on host and device.
struct Index {
  std::vector<int64_t> values;
  bool is64 = false;
  std::vector<uint8_t> host;
  std::unique_ptr<DevBuf> dev;

  void make(std::vector<int64_t> v, bool i64) {
    values = std::move(v);
    is64 = i64;
    const size_t es = i64 ? 8 : 4;
    host.resize(std::max<size_t>(values.size(), 1) * es);
    for (size_t i = 0; i < values.size(); ++i) {
      if (i64) {
        std::memcpy(host.data() + 8 * i, &values[i], 8);
      } else {
        const int32_t x = int32_t(values[i]);
        std::memcpy(host.data() + 4 * i, &x, 4);
      }
    }
    dev = std::make_unique<DevBuf>(host.size());
    cuda_ok(cudaMemcpy(dev->p, host.data(), host.size(), cudaMemcpyHostToDevice), "upload index");
  }
  bool defined() const { return dev != nullptr; }
  api::TensorDesc desc(bool cuda) const {
    return api::TensorDesc(nullptr, is64 ? api::kInt64 : api::kInt32, fs_device_t{cuda ? FS_DEVICE_CUDA : FS_DEVICE_CPU, 0},
                           {int64_t(values.size())});
  }
  void* ptr(bool cuda) const { return cuda ? dev->p : const_cast<uint8_t*>(host.data()); }
};

// Everything one case runs on: inputs, outputs, lengths, offsets.
struct Problem {
  Case c;
  std::vector<int64_t> len_q, len_kv;
  Layout lq_qk, lq_v, lq_stats, lkv_qk, lkv_v;  // Q side (D_qk / D_v / stats), KV side
  Tensor q, k, v, o, stats, dO, dq, dk, dv;
  Tensor max_logit;
  Tensor sink, dsink;  // [H_q] float32 (sinks)
  Tensor gate, dgate;  // O's layout (Case::gate)
  Tensor smax, ssum;   // [B, H_q, S_q, 1] float32, padded (Case::score_stats)
  Tensor bias, dbias;  // Case::bias (bias_layout: any broadcast form), Case::dbias
  Tensor dump;         // Case::rng_dump: float32 [B, H_q, S_q, S_kv]
  Index drop_seed, drop_offset;  // Case::philox()
  Tensor drop_mask, drop_scale, drop_scale_inv;  // Case::dropout_mask; its scale and 1 / scale ([1] float32)
  BlockMaskBits bm;    // Case::block_mask, with its device copy
  std::unique_ptr<DevBuf> bm_dev;
  float scale_host[1] = {0};  // the (1, 1, 1, 1) host attn_scale tensor (scale_tensor)
  Index seq_q, seq_kv, cu_q, cu_kv, rag_q, rag_kv;

  bool padding() const { return c.lengths != 0 || c.kind_q == Kind::kThd || c.kind_kv == Kind::kThd; }
};

std::unique_ptr<Problem> make_problem(const Case& c) {
  auto p = std::make_unique<Problem>();
  p->c = c;
  std::mt19937_64 rng(c.seed * 7919 + 17);
  const bool pad = p->padding();
  sample_lengths(c, rng, p->len_q, p->len_kv);
  // cu_seq_len describes packed samples without gaps; seq_len allows gaps.
  const bool gaps = c.lengths != 2;
  const std::vector<int64_t> tok_q = token_offsets(p->len_q, gaps, rng), tok_kv = token_offsets(p->len_kv, gaps, rng);
  p->lq_qk = make_layout(c.kind_q, c.B, c.Hq, c.Sq, c.Dqk, tok_q);
  p->lq_v = make_layout(c.kind_q, c.B, c.Hq, c.Sq, c.Dv, tok_q);
  p->lq_stats = make_layout(c.kind_q == Kind::kThd ? Kind::kThd : Kind::kBhsd, c.B, c.Hq, c.Sq, 1, tok_q);
  p->lkv_qk = make_layout(c.kind_kv, c.B, c.Hk, c.Skv, c.Dqk, tok_kv);
  p->lkv_v = make_layout(c.kind_kv, c.B, c.heads_v(), c.Skv, c.Dv, tok_kv);
  p->q.alloc(p->lq_qk, c.dtype);
  p->k.alloc(p->lkv_qk, c.dtype);
  p->v.alloc(p->lkv_v, c.dtype);
  p->o.alloc(p->lq_v, c.dtype);
  p->dO.alloc(p->lq_v, c.dtype);
  p->dq.alloc(p->lq_qk, c.dtype);
  p->dk.alloc(p->lkv_qk, c.dtype);
  p->dv.alloc(p->lkv_v, c.dtype);
  p->stats.alloc(p->lq_stats, DType::kFloat32);
  Layout ml;
  ml.B = 1;
  ml.H = c.Hq;
  ml.S = 1;
  ml.D = 1;
  ml.strides = {c.Hq, 1, 1, 1};
  ml.storage = c.Hq;
  p->max_logit.alloc(ml, DType::kFloat32);
  if (c.sinks) {
    p->sink.alloc(ml, DType::kFloat32);
    p->dsink.alloc(ml, DType::kFloat32);
    std::normal_distribution<double> n(0.0, 1.5);
    for (int64_t h = 0; h < c.Hq; ++h) {
      const double x = n(rng);
      p->sink.set(h, c.sinks_neg_inf && h % 2 == 0 ? -std::numeric_limits<double>::infinity() : x);
    }
    p->sink.upload();
  }
  if (c.gate) {
    p->gate.alloc(p->lq_v, c.dtype);
    p->dgate.alloc(p->lq_v, c.dtype);
    fill_valid(p->gate, p->len_q, rng, 2.0);
    p->gate.upload();
  }
  if (c.score_stats) {
    const Layout ls = make_layout(Kind::kBhsd, c.B, c.Hq, c.Sq, 1, tok_q);
    p->smax.alloc(ls, DType::kFloat32);
    p->ssum.alloc(ls, DType::kFloat32);
  }
  if (c.block_mask) {
    p->bm.make(c, rng);
    p->bm_dev = std::make_unique<DevBuf>(p->bm.bytes.size());
    cuda_ok(cudaMemcpy(p->bm_dev->p, p->bm.bytes.data(), p->bm.bytes.size(), cudaMemcpyHostToDevice), "upload block_mask");
  }
  if (c.bias) {
    p->bias.alloc(bias_layout(c), c.bias_f32 ? DType::kFloat32 : c.dtype);
    fill_bias(p->bias, c, p->len_q, p->len_kv, rng);
    p->bias.upload();
    if (c.dbias) p->dbias.alloc(p->bias.lay, p->bias.dtype);
  }
  if (c.dropout_mask) {
    p->drop_mask.alloc(dropout_mask_layout(c), c.dropout_mask_dtype);
    fill_dropout_mask(p->drop_mask, c, p->len_q, p->len_kv, rng);
    p->drop_mask.upload();
    Layout one;
    one.B = one.H = one.S = one.D = 1;
    one.strides = {1, 1, 1, 1};
    one.storage = 1;
    p->drop_scale.alloc(one, DType::kFloat32);
    p->drop_scale.set(0, c.dropout_scale);
    p->drop_scale.upload();
    p->drop_scale_inv.alloc(one, DType::kFloat32);
    p->drop_scale_inv.set(0, 1.0 / c.dropout_scale);
    p->drop_scale_inv.upload();
  }
  if (c.philox()) {
    p->drop_seed.make({c.dropout_seed}, c.dropout_i64);
    p->drop_offset.make({c.dropout_offset}, c.dropout_i64);
    if (c.rng_dump) {
      Layout l = make_layout(Kind::kBhsd, c.B, c.Hq, c.Sq, c.Skv, {});
      p->dump.alloc(l, DType::kFloat32);
    }
  }
  p->scale_host[0] = c.scale;
  fill_valid(p->q, p->len_q, rng);
  fill_valid(p->k, p->len_kv, rng);
  fill_valid(p->v, p->len_kv, rng);
  fill_valid(p->dO, p->len_q, rng);
  for (Tensor* t : {&p->q, &p->k, &p->v, &p->dO}) t->upload();
  if (c.lengths == 1 || (pad && c.lengths == 0)) {
    p->seq_q.make(p->len_q, c.lengths64);
    p->seq_kv.make(p->len_kv, c.lengths64);
  } else if (c.lengths == 2) {
    p->cu_q.make(prefix_sums(p->len_q), c.lengths64);
    p->cu_kv.make(prefix_sums(p->len_kv), c.lengths64);
  }
  if (c.kind_q == Kind::kThd) p->rag_q.make(tok_q, !c.lengths64);
  if (c.kind_kv == Kind::kThd) p->rag_kv.make(tok_kv, c.lengths64);
  return p;
}

// The options of a case on an attribute object (forward or backward).
template <class Attr>
void set_options(const Problem& p, Attr& a, bool cuda) {
  const Case& c = p.c;
  if (c.scale_tensor) {
    // A host scalar tensor of shape (1, 1, 1, 1), also with CUDA tensors (pass by value).
    a.set_attn_scale(api::TensorDesc(nullptr, api::kFloat32, fs_device_t{FS_DEVICE_CPU, 0}, {1, 1, 1, 1}));
  } else {
    a.set_attn_scale(c.scale);
  }
  if (c.softcap > 0) a.set_softcap(c.softcap);
  if (c.alibi) a.set_alibi_mask(true);
  if (c.sinks) a.set_sink_token(api::TensorDesc(nullptr, api::kFloat32, fs_device_t{cuda ? FS_DEVICE_CUDA : FS_DEVICE_CPU, 0}, {c.Hq}));
  if (c.gate) a.set_gate(p.gate.desc(cuda));
  if (c.bias) a.set_bias(p.bias.desc(cuda));
  if (c.philox()) a.set_dropout(c.dropout_p, p.drop_seed.desc(cuda), p.drop_offset.desc(cuda));
  if (c.dropout_mask) {
    const api::TensorDesc one(nullptr, api::kFloat32, fs_device_t{cuda ? FS_DEVICE_CUDA : FS_DEVICE_CPU, 0}, {1});
    if constexpr (std::is_same_v<Attr, api::SdpaBackwardAttributes>) {
      a.set_dropout(p.drop_mask.desc(cuda), one, one);  // with scale_inv (the seed's backward form)
    } else {
      a.set_dropout(p.drop_mask.desc(cuda), one);
    }
  }
  if (c.block_mask) {
    a.set_block_mask(api::TensorDesc(nullptr, api::kUInt8, fs_device_t{cuda ? FS_DEVICE_CUDA : FS_DEVICE_CPU, 0},
                                     {p.bm.shape[0], p.bm.shape[1], p.bm.shape[2], p.bm.shape[3]}, p.bm.strides()));
  }
  if (c.bottom_right) a.set_diagonal_alignment(api::DiagonalAlignment::kBottomRight);
  if (c.has_left) a.set_diagonal_band_left_bound(c.left);
  if (c.has_right) a.set_diagonal_band_right_bound(c.right);
  if (p.padding()) {
    a.set_padding_mask(true);
    if (p.seq_q.defined()) a.set_seq_len_q(p.seq_q.desc(cuda)).set_seq_len_kv(p.seq_kv.desc(cuda));
    if (p.cu_q.defined()) a.set_cu_seq_len_q(p.cu_q.desc(cuda)).set_cu_seq_len_kv(p.cu_kv.desc(cuda));
  }
}

// Ragged offsets (token offsets, multiplier = the row stride) of the side's tensors.
template <class Attr>
void set_ragged(const Problem& p, Attr& a, bool cuda, std::initializer_list<std::pair<fs_sdpa_slot_t, const Tensor*>> ts) {
  for (const auto& [slot, t] : ts) {
    if (!t->lay.ragged()) continue;
    const bool q_side = slot == FS_SDPA_Q || slot == FS_SDPA_O || slot == FS_SDPA_STATS || slot == FS_SDPA_DO ||
                        slot == FS_SDPA_DQ || slot == FS_SDPA_GATE || slot == FS_SDPA_DGATE;
    a.set_ragged_offset(slot, (q_side ? p.rag_q : p.rag_kv).desc(cuda), t->lay.strides[2]);
  }
}

// Index tensors of the variant pack; the gradient slots' ragged offsets only for the backward
// (an operation refuses a pointer for a tensor its attributes do not have).
void set_index_pointers(const Problem& p, api::SdpaVariantPack& pack, bool cuda, bool backward) {
  if (p.c.scale_tensor) pack.set(FS_SDPA_ATTN_SCALE, const_cast<float*>(p.scale_host));
  if (p.c.sinks) pack.set(FS_SDPA_SINK_TOKEN, p.sink.ptr(cuda));
  if (p.c.bias) pack.set(FS_SDPA_BIAS, p.bias.ptr(cuda));
  if (p.c.philox()) {
    pack.set(FS_SDPA_DROPOUT_SEED, p.drop_seed.ptr(cuda)).set(FS_SDPA_DROPOUT_OFFSET, p.drop_offset.ptr(cuda));
  }
  if (p.c.dropout_mask) {
    pack.set(FS_SDPA_DROPOUT_MASK, p.drop_mask.ptr(cuda)).set(FS_SDPA_DROPOUT_SCALE, p.drop_scale.ptr(cuda));
    if (backward) pack.set(FS_SDPA_DROPOUT_SCALE_INV, p.drop_scale_inv.ptr(cuda));
  }
  if (p.c.rng_dump && !backward) pack.set(FS_SDPA_RNG_DUMP, p.dump.ptr(cuda));
  if (p.c.bias && p.c.dbias && backward) pack.set(FS_SDPA_DBIAS, p.dbias.ptr(cuda));
  if (p.c.block_mask) {
    pack.set(FS_SDPA_BLOCK_MASK, cuda ? p.bm_dev->p : const_cast<uint8_t*>(p.bm.bytes.data()));
  }
  if (p.seq_q.defined()) pack.set(FS_SDPA_SEQ_LEN_Q, p.seq_q.ptr(cuda)).set(FS_SDPA_SEQ_LEN_KV, p.seq_kv.ptr(cuda));
  if (p.cu_q.defined()) pack.set(FS_SDPA_CU_SEQ_LEN_Q, p.cu_q.ptr(cuda)).set(FS_SDPA_CU_SEQ_LEN_KV, p.cu_kv.ptr(cuda));
  const std::pair<fs_sdpa_slot_t, const Tensor*> q_side[] = {
      {FS_SDPA_RAGGED_OFFSET_Q, &p.q}, {FS_SDPA_RAGGED_OFFSET_O, &p.o}, {FS_SDPA_RAGGED_OFFSET_STATS, &p.stats},
      {FS_SDPA_RAGGED_OFFSET_DO, &p.dO}, {FS_SDPA_RAGGED_OFFSET_DQ, &p.dq}};
  for (const auto& [slot, t] : q_side) {
    const bool grad = slot == FS_SDPA_RAGGED_OFFSET_DO || slot == FS_SDPA_RAGGED_OFFSET_DQ;
    if (t->lay.ragged() && (backward || !grad)) pack.set(slot, p.rag_q.ptr(cuda));
  }
  if (p.c.gate) {
    pack.set(FS_SDPA_GATE, p.gate.ptr(cuda));
    if (p.gate.lay.ragged()) pack.set(FS_SDPA_RAGGED_OFFSET_GATE, p.rag_q.ptr(cuda));
    if (backward) {
      pack.set(FS_SDPA_DGATE, p.dgate.ptr(cuda));
      if (p.dgate.lay.ragged()) pack.set(FS_SDPA_RAGGED_OFFSET_DGATE, p.rag_q.ptr(cuda));
    }
  }
  const std::pair<fs_sdpa_slot_t, const Tensor*> kv_side[] = {
      {FS_SDPA_RAGGED_OFFSET_K, &p.k}, {FS_SDPA_RAGGED_OFFSET_V, &p.v}, {FS_SDPA_RAGGED_OFFSET_DK, &p.dk},
      {FS_SDPA_RAGGED_OFFSET_DV, &p.dv}};
  for (const auto& [slot, t] : kv_side) {
    const bool grad = slot == FS_SDPA_RAGGED_OFFSET_DK || slot == FS_SDPA_RAGGED_OFFSET_DV;
    if (t->lay.ragged() && (backward || !grad)) pack.set(slot, p.rag_kv.ptr(cuda));
  }
}

// The forward on the CPU reference (cuda = false, host buffers) or the GPU (device buffers).
void run_forward(Problem& p, bool cuda, bool log2, void* stream = nullptr) {
  api::SdpaAttributes a;
  set_options(p, a, cuda);
  set_ragged(p, a, cuda, {{FS_SDPA_Q, &p.q}, {FS_SDPA_K, &p.k}, {FS_SDPA_V, &p.v}, {FS_SDPA_O, &p.o},
                          {FS_SDPA_STATS, &p.stats}});
  if (p.c.gate) set_ragged(p, a, cuda, {{FS_SDPA_GATE, &p.gate}});
  a.set_generate_stats(true).set_stats_use_log2(log2);
  if (p.c.score_stats) a.set_logit_max(p.smax.desc(cuda)).set_score_sum_exp(p.ssum.desc(cuda));
  if (p.c.rng_dump) a.set_rng_dump(p.dump.desc(cuda));
  if (p.c.max_logit) a.set_max_logit(api::TensorDesc(nullptr, api::kFloat32, fs_device_t{cuda ? FS_DEVICE_CUDA : FS_DEVICE_CPU, 0}, {p.c.Hq}));
  const api::TensorDesc st = p.stats.desc(cuda);
  api::SdpaFwd fwd(p.q.desc(cuda), p.k.desc(cuda), p.v.desc(cuda), p.o.desc(cuda), &st, a);
  fwd.check_support();
  fwd.compile();
  api::SdpaVariantPack pack;
  pack.set(FS_SDPA_Q, p.q.ptr(cuda)).set(FS_SDPA_K, p.k.ptr(cuda)).set(FS_SDPA_V, p.v.ptr(cuda));
  pack.set(FS_SDPA_O, p.o.ptr(cuda)).set(FS_SDPA_STATS, p.stats.ptr(cuda));
  if (p.c.max_logit) pack.set(FS_SDPA_MAX_LOGIT, p.max_logit.ptr(cuda));
  if (p.c.score_stats) pack.set(FS_SDPA_SCORE_MAX, p.smax.ptr(cuda)).set(FS_SDPA_SCORE_SUM_EXP, p.ssum.ptr(cuda));
  set_index_pointers(p, pack, cuda, false);
  const size_t ws = fwd.workspace_size();
  DevBuf w(cuda ? ws : 0);
  if (cuda && ws) cuda_ok(cudaMemset(w.p, 0xff, ws), "poison workspace");
  fwd.execute(pack, w.p, ws, stream);
  if (cuda) cuda_ok(cudaDeviceSynchronize(), "sdpa forward");
}

// Called by run_backward between a CUDA operation's check_support and its workspace_size, when set (tests of what
// an operation fixes at check_support: DbiasFormFixedAtCheckSupport).
std::function<void()> g_after_check_support;

void run_backward(Problem& p, bool cuda, void* stream = nullptr) {
  api::SdpaBackwardAttributes a;
  set_options(p, a, cuda);
  set_ragged(p, a, cuda, {{FS_SDPA_Q, &p.q}, {FS_SDPA_K, &p.k}, {FS_SDPA_V, &p.v}, {FS_SDPA_O, &p.o},
                          {FS_SDPA_STATS, &p.stats}, {FS_SDPA_DO, &p.dO}, {FS_SDPA_DQ, &p.dq}, {FS_SDPA_DK, &p.dk},
                          {FS_SDPA_DV, &p.dv}});
  if (p.c.gate) {
    set_ragged(p, a, cuda, {{FS_SDPA_GATE, &p.gate}, {FS_SDPA_DGATE, &p.dgate}});
    a.set_dgate(p.dgate.desc(cuda));
  }
  a.set_deterministic_algorithm(p.c.deterministic);
  if (p.c.bias && p.c.dbias) a.set_dbias(p.dbias.desc(cuda));
  if (p.c.sinks) a.set_dsink_token(api::TensorDesc(nullptr, api::kFloat32, fs_device_t{cuda ? FS_DEVICE_CUDA : FS_DEVICE_CPU, 0}, {p.c.Hq}));
  api::SdpaBwd bwd(p.q.desc(cuda), p.k.desc(cuda), p.v.desc(cuda), p.o.desc(cuda), p.dO.desc(cuda),
                   p.stats.desc(cuda), p.dq.desc(cuda), p.dk.desc(cuda), p.dv.desc(cuda), a);
  bwd.check_support();
  if (cuda && g_after_check_support) g_after_check_support();
  bwd.compile();
  api::SdpaVariantPack pack;
  pack.set(FS_SDPA_Q, p.q.ptr(cuda)).set(FS_SDPA_K, p.k.ptr(cuda)).set(FS_SDPA_V, p.v.ptr(cuda));
  pack.set(FS_SDPA_O, p.o.ptr(cuda)).set(FS_SDPA_DO, p.dO.ptr(cuda)).set(FS_SDPA_STATS, p.stats.ptr(cuda));
  pack.set(FS_SDPA_DQ, p.dq.ptr(cuda)).set(FS_SDPA_DK, p.dk.ptr(cuda)).set(FS_SDPA_DV, p.dv.ptr(cuda));
  if (p.c.sinks) pack.set(FS_SDPA_DSINK_TOKEN, p.dsink.ptr(cuda));
  set_index_pointers(p, pack, cuda, true);
  const size_t ws = bwd.workspace_size();
  DevBuf w(cuda ? ws : 0);
  if (cuda && ws) cuda_ok(cudaMemset(w.p, 0xff, ws), "poison workspace");
  bwd.execute(pack, w.p, ws, stream);
  if (cuda) cuda_ok(cudaDeviceSynchronize(), "sdpa backward");
}

// got (device result) against ref (host reference result), both whole storages: the error
// criteria on the written elements, and elements the reference left NaN (gaps of ragged
// tensors) still NaN on the device.
::testing::AssertionResult same_result(const Tensor& ref, const std::vector<uint8_t>& got_bytes, bool stat,
                                       double floor = fs_test::kFloor) {
  const std::vector<double> r = Tensor::values(ref.host, ref.dtype), g = Tensor::values(got_bytes, ref.dtype);
  for (size_t i = 0; i < r.size(); ++i)
    if (std::isnan(r[i]) && !std::isnan(g[i]))
      return ::testing::AssertionFailure() << "element " << i << " outside the samples was written: " << g[i];
  return stat ? fs_test::stat_close(g, r) : fs_test::tensor_close(g, r, ref.dtype, floor);
}

// max |x| over the finite elements of a host storage (NaN padding skipped).
double max_abs(const Tensor& t) {
  double m = 0;
  for (double x : Tensor::values(t.host, t.dtype))
    if (std::isfinite(x)) m = std::max(m, std::abs(x));
  return m;
}

// chain: the GPU backward takes the GPU forward's O and LSE (the reference backward the
// reference's), so that the forward's stats convention is checked through the backward too.
void run_case(const Case& c, bool backward = true, bool chain = false) {
  SCOPED_TRACE(c.str());
  auto p = make_problem(c);
  // Reference forward on the host buffers (outputs NaN before), GPU forward on poisoned
  // device outputs; the same for the backward, which takes the reference's O and LSE.
  const bool log2 = c.log2_stats && !backward;
  run_forward(*p, /*cuda=*/false, log2);
  p->o.poison_device();
  p->stats.poison_device();
  p->max_logit.poison_device();
  if (c.score_stats) {
    p->smax.poison_device();
    p->ssum.poison_device();
  }
  if (c.rng_dump) p->dump.poison_device();
  run_forward(*p, /*cuda=*/true, log2);
  if (c.rng_dump) {
    // The keep mask: bitwise the reference's (core/philox.h on both sides).
    const std::vector<double> r = Tensor::values(p->dump.host, DType::kFloat32);
    const std::vector<double> g = Tensor::values(p->dump.download(), DType::kFloat32);
    int64_t diff = 0;
    for (size_t i = 0; i < r.size(); ++i) diff += r[i] != g[i];
    EXPECT_EQ(diff, 0) << "rng_dump elements differ";
  }
  EXPECT_TRUE(same_result(p->o, p->o.download(), false)) << "O";
  EXPECT_TRUE(same_result(p->stats, p->stats.download(), true)) << "stats";
  if (c.score_stats) {
    EXPECT_TRUE(same_result(p->smax, p->smax.download(), true)) << "score_max";
    // Relative (the sums reach S_kv): their logs on the LSE criterion (log 0 = -inf matches exactly).
    auto logs = [](std::vector<double> x) {
      for (double& e : x) e = std::log(e);
      return x;
    };
    EXPECT_TRUE(fs_test::stat_close(logs(Tensor::values(p->ssum.download(), DType::kFloat32)),
                                    logs(Tensor::values(p->ssum.host, DType::kFloat32))))
        << "score_sum_exp";
  }
  if (c.max_logit) {
    EXPECT_TRUE(same_result(p->max_logit, p->max_logit.download(), true)) << "max_logit";
  }
  if (!backward) return;
  // The backward's O / LSE: the reference's, padding rows NaN again (never read). In a chain both
  // backwards read the GPU forward's O (D = rowsum(dO O) then has the same inputs on both sides, so
  // that dSink, a sum over rows whose terms cancel, is not compared through the rounding of O to
  // the input dtype: 0.0078 relative L2 on bf16 with the eager softmax, 0.0129 with the lazy one,
  // H200, seed 14204) and each its own LSE.
  // Not for a dBias summed over keys (a bias of key extent 1): sum_j dS_ij = rowsum(dO (O - O~)) is then 0 up to
  // the rounding of O to the input dtype (and of P for the forward's P V), which differs between the two sides
  // once they read one O with each its own LSE (relative L2 0.9 of that noise, H100, seed 15340), while the
  // reference's O and LSE on both sides leave fp32 rounding alone.
  const bool chained = chain && !(c.bias && c.dbias && c.bias_shape()[3] == 1);
  if (chained) p->o.host = p->o.download();
  poison_padding(p->o, p->len_q);
  poison_padding(p->stats, p->len_q);
  if (!chained) {
    p->o.upload();
    p->stats.upload();
  }
  run_backward(*p, /*cuda=*/false);
  for (Tensor* t : {&p->dq, &p->dk, &p->dv}) t->poison_device();
  if (c.gate) p->dgate.poison_device();
  if (c.sinks) p->dsink.poison_device();
  if (c.bias && c.dbias) p->dbias.poison_device();
  run_backward(*p, /*cuda=*/true);
  if (c.sinks) {
    // dSink (fp32): a sum over every row, against the reference's with the fp16 numbers (both
    // sides read the same O, in a chain too).
    EXPECT_TRUE(fs_test::tensor_close(Tensor::values(p->dsink.download(), DType::kFloat32),
                                      Tensor::values(p->dsink.host, DType::kFloat32), DType::kFloat16))
        << "dSink";
  }
  // dQ / dK floors: the rounding of dP - D (error_criteria.h, grad_floor).
  const double mdo = max_abs(p->dO), mv = max_abs(p->v);
  EXPECT_TRUE(same_result(p->dq, p->dq.download(), false, fs_test::grad_floor(c.scale, c.Dv, mdo, mv, max_abs(p->k))))
      << "dQ";
  EXPECT_TRUE(same_result(p->dk, p->dk.download(), false, fs_test::grad_floor(c.scale, c.Dv, mdo, mv, max_abs(p->q))))
      << "dK";
  EXPECT_TRUE(same_result(p->dv, p->dv.download(), false)) << "dV";
  if (c.gate) {
    EXPECT_TRUE(same_result(p->dgate, p->dgate.download(), false)) << "dgate";
  }
  if (c.bias && c.dbias) {
    // dBias: the criterion of q's dtype (also for a float32 dBias), with a floor for the sums over
    // broadcast dimensions, whose exact value can be 0 (sum_j dS_ij = 0): the rounding of dP - D
    // (grad_floor without the scale and K) times the rows summed into one element.
    const std::vector<int64_t> bs = c.bias_shape();
    const double rows = double(bs[0] == 1 ? c.B : 1) * double(bs[1] == 1 ? c.Hq : 1) * double(bs[2] == 1 ? c.Sq : 1);
    double floor = 4.0 * rows * fs_test::grad_floor(1.0, c.Dv, mdo, mv, 1.0);
    if (c.gate && bs[3] == 1) {
      // Summed over keys with the gate: sum_j dS_ij = rowsum(dO~ O) - D, 0 but for roundings, where the kernels' dO~
      // (the preprocess's gated dO, dO sigmoid(G)) is rounded to q's dtype and the reference's is not; that
      // rounding, times O, is of the size of the value itself (relative L2 1.03, H200, seed 15340: D = 16, Skv 271).
      const double unit = c.dtype == DType::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
      floor = std::max(floor, rows * unit * std::sqrt(double(c.Dv)) * mdo * mv);
    }
    const std::vector<double> r = Tensor::values(p->dbias.host, p->dbias.dtype);
    const std::vector<double> g = Tensor::values(p->dbias.download(), p->dbias.dtype);
    EXPECT_TRUE(fs_test::tensor_close(g, r, c.dtype, floor)) << "dBias";
  }
}

TEST(SdpaGpu, RandomCases) {
  REQUIRE_GPU();
  for (uint64_t seed = 1; seed <= 120; ++seed) {
    run_case(random_case(seed));
    if (::testing::Test::HasFailure()) return;
  }
}

// ---------------------------------------------------------------------------
// The sm90 forward with the analytic mask (kernel_fwd_sm90.cuh AnalyticSourceSm90), chosen by
// sdpa_fwd_runs_sm90 (sdpa_family.cpp): forced on and off per test (set_sdpa_fwd_sm90_enabled),
// sm90::sdpa_fwd_launches() says which family ran. Forward only (the backward is the sm80 one's).
// ---------------------------------------------------------------------------

// Forces the SDPA forward's family for a scope (1: the sm90 forward where it covers the call,
// 0: the sm80 kernels), the environment's answer again after it.
struct ForceSdpaSm90 {
  explicit ForceSdpaSm90(int on) { set_sdpa_fwd_sm90_enabled(on); }
  ~ForceSdpaSm90() { set_sdpa_fwd_sm90_enabled(-1); }
};

// Packed (THD) tensors on the sm90 forward and backward (sdpa_sm90_thd_enabled: on unless FLASHSPAN_SM90_SDPA_THD=0)
// forced on or off for a scope.
struct ForceSdpaSm90Thd {
  explicit ForceSdpaSm90Thd(int on) { set_sdpa_sm90_thd_enabled(on); }
  ~ForceSdpaSm90Thd() { set_sdpa_sm90_thd_enabled(-1); }
};

// Forces the decode forward (kernel_decode_sm80.cuh; on by default, FLASHSPAN_SDPA_DECODE=0 off;
// set_sdpa_decode_enabled) on or off for a scope, the environment's answer again after it.
struct ForceSdpaDecodeAlibi {  // ALiBi in the decode forward (on by default)
  explicit ForceSdpaDecodeAlibi(int on) { set_sdpa_decode_alibi_enabled(on); }
  ~ForceSdpaDecodeAlibi() { set_sdpa_decode_alibi_enabled(-1); }
};
struct ForceSdpaDecode {
  explicit ForceSdpaDecode(int on) { set_sdpa_decode_enabled(on); }
  ~ForceSdpaDecode() { set_sdpa_decode_enabled(-1); }
};

// Forces the sm90 forward's kernel with score modifiers (on by default, FLASHSPAN_SM90_SDPA_MODS=0
// off; set_sdpa_fwd_sm90_mods_enabled) on or off for a scope, the environment's answer again after it.
struct ForceSdpaSm90Mods {
  explicit ForceSdpaSm90Mods(int on) { set_sdpa_fwd_sm90_mods_enabled(on); }
  ~ForceSdpaSm90Mods() { set_sdpa_fwd_sm90_mods_enabled(-1); }
};

// The same for the sm90 backward's modifiers (on by default, FLASHSPAN_SM90_SDPA_BWD_MODS=0 off; its
// own switch: set_sdpa_bwd_sm90_mods_enabled); the tests of the sm80 backward of modifier calls pin it off.
struct ForceSdpaBwdSm90Mods {
  explicit ForceSdpaBwdSm90Mods(int on) { set_sdpa_bwd_sm90_mods_enabled(on); }
  ~ForceSdpaBwdSm90Mods() { set_sdpa_bwd_sm90_mods_enabled(-1); }
};


// A random case the sm90 forward covers (sdpa_fwd_sm90_refusal): random_case's masks in both
// alignments, padding (seq_len / cu_seq_len on dense tensors, int32 / int64, a sample without
// keys), GQA / MQA, dtypes, LSE bases, max_logit and layouts (BHSD, BSHD, padded strides), head
// dims up to 128 (the (64, 64) and (128, 128) kernels); odd seeds take longer sequences (up to
// 1100 rows and keys: several query blocks a sample, walks of up to 9 key blocks, more cells than
// the persistent grid's CTAs for B H > 16).
Case sm90_case(uint64_t seed) {
  Case c = random_case(seed);
  std::mt19937_64 rng(seed * 131 + 7);
  static const std::pair<int64_t, int64_t> dims[] = {{64, 64}, {128, 128}, {32, 32}, {96, 96},
                                                     {8, 16},  {128, 64},  {40, 120}, {72, 128}};
  if (c.Dqk > 128 || c.Dv > 128) std::tie(c.Dqk, c.Dv) = dims[rng() % 8];
  if (c.kind_q == Kind::kThd) c.kind_q = Kind::kBshd;
  if (c.kind_kv == Kind::kThd) c.kind_kv = Kind::kStrided;
  if (seed % 2) {
    c.Sq = 1 + int64_t(rng() % 1100);
    c.Skv = 1 + int64_t(rng() % 1100);
    if (c.has_left) c.left = 1 + int64_t(rng() % 400);
  }
  return c;
}

struct ForceSdpaBwdSm90 {
  explicit ForceSdpaBwdSm90(int on) { set_sdpa_bwd_sm90_enabled(on); }
  ~ForceSdpaBwdSm90() { set_sdpa_bwd_sm90_enabled(-1); }
};

// The four switches of an sm90 forward and backward with modifiers, for a scope.
struct ForceSm90WithMods {
  ForceSdpaSm90 fwd{1};
  ForceSdpaSm90Mods fwd_mods{1};
  ForceSdpaBwdSm90 bwd{1};
  ForceSdpaBwdSm90Mods bwd_mods{1};
};

// Runs c (its backward too with `backward`; chain: run_case's) and expects `fwd` sm90 forward and `bwd` sm90 backward
// launches (sm90::sdpa_fwd_launches / sdpa_bwd_launches; 0: the sm80 kernels ran that pass;
// kAnyLaunches: not checked): which family ran each pass.
// The decode forward (sdpa_decode_refusal: S_q H_q / H_k <= 16) is pinned off for a forward that must
// run on the sm90 kernels.
constexpr int kAnyLaunches = -1;
void run_case_expect_sm90(const Case& c, bool backward, int fwd, int bwd, bool chain = false) {
  std::optional<ForceSdpaDecode> no_decode;
  if (fwd != kAnyLaunches) no_decode.emplace(0);
  const int64_t f0 = sm90::sdpa_fwd_launches(), b0 = sm90::sdpa_bwd_launches();
  run_case(c, backward, chain);
  if (fwd != kAnyLaunches) {
    EXPECT_EQ(sm90::sdpa_fwd_launches(), f0 + fwd) << "sm90 forward launches of " << c.str();
  }
  if (bwd != kAnyLaunches) {
    EXPECT_EQ(sm90::sdpa_bwd_launches(), b0 + bwd) << "sm90 backward launches of " << c.str();
  }
}

// sm90_case's cases first..last forced onto the sm90 kernels (on = 1) or the sm80 kernels (on =
// 0): the forward alone, or with `backward` forward and backward, the backward forced the same
// way (set_sdpa_bwd_sm90_enabled); the launch counter of the pass under test
// (sm90::sdpa_fwd_launches / sdpa_bwd_launches) says which family ran it.
void run_sm90_cases(uint64_t first, uint64_t last, int on, bool backward = false) {
  const ForceSdpaSm90 force(on);
  std::optional<ForceSdpaBwdSm90> force_bwd;
  if (backward) force_bwd.emplace(on);
  for (uint64_t seed = first; seed <= last; ++seed) {
    run_case_expect_sm90(sm90_case(seed), backward, backward ? kAnyLaunches : on, backward ? on : kAnyLaunches);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, Sm90ForwardRandom) {
  REQUIRE_SM90();
  run_sm90_cases(9001, 9100, 1);
}

TEST(SdpaGpu, Sm90ForwardOffRunsSm80) {
  // The same cases forced onto the sm80 kernels.
  REQUIRE_SM90();
  run_sm90_cases(9001, 9030, 0);
}

TEST(SdpaGpu, Sm90ForwardFallsBackToSm80) {
  // With the sm90 forward on, what it does not cover runs the sm80 kernels (and is right):
  // packed THD, softcap, Philox dropout, a block_mask, the gate (the kernel with modifiers pinned
  // off: Sm90ForwardMods* test it on; H_k != H_v runs on sm90: Sm90ForwardHkNeHv).
  REQUIRE_SM90();
  const ForceSdpaSm90 force(1);
  const ForceSdpaSm90Mods mods_off(0);
  const ForceSdpaSm90Thd thd_off(0);  // (Sm90ForwardThdExperimental runs packed tensors on it)
  for (int i = 0; i < 4; ++i) {
    Case c = sm90_case(9200 + uint64_t(i));
    c.kind_q = c.kind_kv = Kind::kBhsd;
    switch (i) {
      case 0: c.kind_q = c.kind_kv = Kind::kThd; c.lengths = 1; break;
      case 1: c.softcap = 5.0f; break;
      case 2: c.dropout_p = 0.25f; c.dropout_seed = 77; c.dropout_offset = 3; break;
      default: c.gate = true; c.block_mask = 2; c.has_right = true; c.right = 0; c.has_left = false; break;
    }
    run_case_expect_sm90(c, /*backward=*/false, 0, kAnyLaunches);
    if (::testing::Test::HasFailure()) return;
  }
}

// ---------------------------------------------------------------------------
// Packed (THD) q, k, v, o, stats on the sm90 forward (sdpa_sm90_thd_enabled: on by default, FLASHSPAN_SM90_SDPA_THD=0
// off; per-sample tensor maps built on the device, kernels/sm90/sample_maps_sm90.h). The tests force the switch either
// way; scripts/gpu_check.sh runs the THD tests of the default environment once more with it off (the sm80 kernels).
// ---------------------------------------------------------------------------

Case sm90_mods_case(uint64_t seed);  // (below: the sm90 forward with score modifiers)

// sm90_case's cases (masks in both alignments, GQA / MQA, dtypes, LSE bases, max_logit, S up to 1100 on odd
// seeds) with the query side packed (THD with gaps between samples, q, o and the stats packed), the key side
// packed on even seeds (else BHSD padded strides), lengths as seq_len or cu_seq_len, a sample without keys on
// some; (192, 128) and (256, 256) on one seed in ten each; sm90_mods_case's modifiers (softcap, ALiBi, sinks,
// bias, a packed gate, score statistics) on every third of the others.
Case sm90_thd_case(uint64_t seed) {
  Case c = seed % 3 == 1 ? sm90_mods_case(seed) : sm90_case(seed);
  c.kind_q = Kind::kThd;
  c.kind_kv = seed % 2 == 0 ? Kind::kThd : Kind::kStrided;
  c.lengths = 1 + int(seed / 2 % 2);
  c.zero_kv_sample = seed % 5 == 0;
  c.B = 1 + int64_t(seed % 4);
  if (seed % 3 != 1) {
    if (seed % 10 == 3) std::tie(c.Dqk, c.Dv) = std::pair<int64_t, int64_t>{192, 128};
    if (seed % 10 == 7) c.Dqk = c.Dv = 256;
  }
  return c;
}

TEST(SdpaGpu, Sm90ForwardThdExperimental) {
  // sm90_thd_case's cases on the sm90 forward (the launch counter says it ran each): O, the stats (and
  // max_logit, the score statistics) against the CPU reference on NaN-poisoned outputs, the gaps between
  // packed samples left untouched (same_result); every fourth case also the backward (the sm90 one with the
  // switch on, packed too, but for a block_mask: Sm90BackwardThdExperimental checks it) on the GPU forward's O and
  // LSE.
  REQUIRE_SM90();
  const ForceSm90WithMods force;
  const ForceSdpaSm90Thd thd(1);
  for (uint64_t seed = 15101; seed <= 15160; ++seed) {
    const Case c = sm90_thd_case(seed);
    const bool backward = seed % 4 == 0;
    run_case_expect_sm90(c, backward, 1, kAnyLaunches, /*chain=*/true);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, Sm90ForwardThdOffRunsSm80) {
  // The switch off: the same packed calls take the sm80 forward.
  REQUIRE_SM90();
  const ForceSm90WithMods force;
  const ForceSdpaSm90Thd thd(0);
  for (uint64_t seed = 15101; seed <= 15106; ++seed) {
    run_case_expect_sm90(sm90_thd_case(seed), /*backward=*/false, 0, kAnyLaunches);
    if (::testing::Test::HasFailure()) return;
  }
}

// The per-sample maps' pre-pass (sample_maps_sm90.h) over a packed q of three samples (H = 2, D = 64) whose second
// starts 3 elements past a 16-byte boundary: flags {0, 1, 0} after the job's maps. The NaN fill then covers that
// sample's rows of a packed O (every head, D_v columns) and of its packed stats, nothing else. fp8: the sm90 FP8
// forward's job (an FP8 q's map, 1-byte elements, its q and k in the forward's 3 slots a sample) and NaN codes 0x7F
// over an FP8 O; else bf16 (one tensor a sample).
void sample_maps_flag_misaligned(bool fp8) {
  constexpr int B = 3, H = 2, D = 64, S = 8;
  const int es = fp8 ? 1 : 2;  // bytes an element of q and O
  const DType qt = fp8 ? DType::kFloat8E4M3 : DType::kBFloat16;
  const std::vector<int32_t> len = {5, 7, 4};
  const std::vector<int64_t> tok = {0, 5, 12, 16};  // token offsets of the packed O / stats
  const std::vector<int64_t> q_start = {0, 5 * H * D + 3, 12 * H * D};  // elements: sample 1 misaligned
  const int64_t tokens = tok.back() + 1, q_elems = tokens * H * D + 8;
  DevBuf q(size_t(q_elems * es)), o(size_t(tokens * H * D * es)), lse(size_t(tokens * H) * 4);
  cuda_ok(cudaMemset(q.p, 0, q.bytes), "q");
  cuda_ok(cudaMemset(o.p, 0, o.bytes), "o");
  cuda_ok(cudaMemset(lse.p, 0, lse.bytes), "lse");
  std::vector<int64_t> o_off(B), s_off(B);
  for (int b = 0; b < B; ++b) o_off[size_t(b)] = tok[size_t(b)] * H * D, s_off[size_t(b)] = tok[size_t(b)] * H;
  auto upload = [](DevBuf& d, const void* h, size_t n) { cuda_ok(cudaMemcpy(d.p, h, n, cudaMemcpyHostToDevice), "up"); };
  DevBuf d_len(B * 4), d_q(B * 8), d_o(B * 8), d_s(B * 8);
  upload(d_len, len.data(), B * 4);
  upload(d_q, q_start.data(), B * 8);
  upload(d_o, o_off.data(), B * 8);
  upload(d_s, s_off.data(), B * 8);

  TensorView qv;
  qv.data = q.p;
  qv.dtype = fp8 ? DType::kUInt8 : qt;
  qv.device = DeviceType::kCUDA;
  qv.ndim = 4;
  qv.shape = {1, S, H, D};  // the template's BSHD view: one sample's extent
  qv.strides = {0, H * D, D, 1};
  sm90::SampleMapsJob job;
  SampleStart qs;
  qs.ragged = IndexArray{d_q.p, 1};
  const CUtensorMap mq = fp8 ? sm90::make_tensor_map_fp8_sm90(qv, 64, 128, "q")
                             : sm90::make_tensor_map_sm90(qv, false, DType::kBFloat16, 128, "q");
  job.add(mq, q.p, qs, /*query_side=*/1);
  if (fp8) {  // (k: sample b at b H D, aligned; its map the q template's, never read here)
    SampleStart ks;
    ks.batch_stride = H * D;
    job.add(mq, q.p, ks, 0);
    job.elem_bytes = 1;
    job.slots = sm90::kSampleMapsFwd;
  }
  job.seq_len[0] = job.seq_len[1] = IndexArray{d_len.p, 0};
  job.max_len[0] = job.max_len[1] = S;
  const int slots = fp8 ? sm90::kSampleMapsFwd : 1;
  DevBuf ws(sm90::sample_maps_bytes(B, slots) + sm90::kTensorMapBytes);
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(ws.p) + 127) / 128 * 128);
  char* const at = base + size_t(B) * slots * sm90::kTensorMapBytes;
  cuda_ok(cudaMemset(at, 0x7f, B * 4), "flags");
  int32_t* flags = sm90::launch_sample_maps_sm90(job, B, base, nullptr);
  EXPECT_EQ(static_cast<void*>(flags), static_cast<void*>(at));
  cuda_ok(cudaDeviceSynchronize(), "sample maps");
  std::vector<int32_t> f(B);
  cuda_ok(cudaMemcpy(f.data(), flags, B * 4, cudaMemcpyDeviceToHost), "flags");
  EXPECT_EQ(f, (std::vector<int32_t>{0, 1, 0}));

  SdpaFwdParams p;
  p.batch = B;
  p.num_heads_q = H;
  p.head_dv = D;
  p.o = o.p;
  p.oa.head_stride = D;
  p.oa.row_stride = H * D;
  p.lse = static_cast<float*>(lse.p);
  p.lsea.head_stride = 1;
  p.lsea.row_stride = H;
  p.analytic.max_q = S;
  p.analytic.seq_len_q = IndexArray{d_len.p, 0};
  p.analytic.start[kSdpaO].ragged = IndexArray{d_o.p, 1};
  p.analytic.start[kSdpaStats].ragged = IndexArray{d_s.p, 1};
  sm90::launch_sample_poison_sm90(p, qt, flags, nullptr);
  cuda_ok(cudaDeviceSynchronize(), "NaN fill");
  std::vector<uint8_t> ob(o.bytes);
  std::vector<float> lh(size_t(tokens * H));
  cuda_ok(cudaMemcpy(ob.data(), o.p, o.bytes, cudaMemcpyDeviceToHost), "o");
  cuda_ok(cudaMemcpy(lh.data(), lse.p, lse.bytes, cudaMemcpyDeviceToHost), "lse");
  for (int64_t t = 0; t < tokens; ++t) {
    const bool in1 = t >= tok[1] && t < tok[1] + len[1];  // sample 1's rows
    for (int64_t e = 0; e < H * D; ++e) {
      const size_t x = size_t(t * H * D + e);
      uint16_t bf = 0;
      if (!fp8) std::memcpy(&bf, ob.data() + 2 * x, 2);
      const bool nan = fp8 ? ob[x] == 0x7f : (bf & 0x7f80) == 0x7f80 && (bf & 0x7f) != 0;
      ASSERT_EQ(nan, in1) << "O token " << t << " element " << e;
    }
    for (int h = 0; h < H; ++h) ASSERT_EQ(std::isnan(lh[size_t(t * H + h)]), in1) << "LSE token " << t << " head " << h;
  }
}

TEST(SdpaGpu, Sm90SampleMapsFlagMisalignedStarts) {
  REQUIRE_SM90();
  sample_maps_flag_misaligned(/*fp8=*/false);
}

TEST(SdpaGpu, Sm90SampleMapsFlagMisalignedStartsFp8) {
  // The sm90 FP8 forward's (experimental, its own switch sdpa_fp8_sm90_thd_enabled; not yet run on a GPU). The
  // pre-pass and the NaN fill are called here directly: no dispatch switch is read.
  REQUIRE_SM90();
  sample_maps_flag_misaligned(/*fp8=*/true);
}

// The small packed cases of the THD sanitizer tests (i < 3), on the (64, 64), (128, 128) and (192, 128) kernels:
// B = 3 with gaps between the samples, the last ending 2 tokens before the end of the storage (a box past it must
// read zeros, not past the allocation), H_q = 4 with GQA and then MQA, bottom-right causal with a sample without
// keys on the first, fp16 on the second, seq_len / cu_seq_len in turn. The forward's (seed 15200 + i): S up to
// ~300, a window on the second with the key side padded, no mask on the third; the backward's (15400 + i): S up
// to ~220, every tensor packed, causal on the first two, deterministic on the first, the gate on the second.
Case thd_sanitizer_case(int i, bool backward) {
  Case c;
  c.seed = (backward ? 15400 : 15200) + uint64_t(i);
  c.B = 3;
  c.Hq = 4;
  c.Hk = i == 2 ? 1 : 2;
  c.Sq = backward ? 150 + 40 * i : 200 + 50 * i;
  c.Skv = backward ? 220 - 30 * i : 300 - 40 * i;
  c.Dqk = c.Dv = i == 0 ? 64 : 128;
  if (i == 2) c.Dqk = 192;
  c.has_right = i < 2;
  c.bottom_right = i == 0;
  c.kind_q = Kind::kThd;
  c.kind_kv = Kind::kThd;
  c.lengths = 1 + i % 2;
  c.zero_kv_sample = i == 0;
  c.dtype = i == 1 ? DType::kFloat16 : DType::kBFloat16;
  if (backward) {
    c.deterministic = i == 0;
    c.gate = i == 1;
  } else {
    c.has_left = i == 1;
    c.left = 70;
    if (i == 1) c.kind_kv = Kind::kStrided;
  }
  return c;
}

TEST(SdpaGpu, Sm90ForwardThdSanitizerSmall) {
  // thd_sanitizer_case's forward cases, for compute-sanitizer (memcheck, synccheck).
  REQUIRE_SM90();
  const ForceSm90WithMods force;
  const ForceSdpaSm90Thd thd(1);
  for (int i = 0; i < 3; ++i) run_case_expect_sm90(thd_sanitizer_case(i, false), /*backward=*/false, 1, kAnyLaunches);
}

// H_k != H_v on the sm90 forward (both mask sources: the producer loads V of each query head's own V
// head, kv_addr.cuh v_head): sm90_case's masks in both alignments (none, causal, bands, windows, either
// side alone), padding (seq_len / cu_seq_len on dense tensors, int32 / int64, NaN-poisoned padding rows,
// a sample without keys), layouts, dtypes, LSE bases and max_logit, S up to 1100 on odd seeds, with
// H_q = 8 and every (H_k, H_v) of {1, 2, 4} x {1, 2, 4, 8} with H_v != H_k in turn; head dims 64, 128 and
// smaller ones ((40, 40), (72, 72), (40, 120), (128, 64)), (192, 128) and (256, 256) on one seed in ten
// each (pure-mask: the kernels with modifiers stop at 128); softcap on about half of the others (the
// kernel with modifiers), with sinks or an additive bias on some of those.
Case sm90_hk_ne_hv_case(uint64_t seed) {
  Case c = sm90_case(seed);
  std::mt19937_64 rng(seed * 577 + 29);
  static const int64_t heads[] = {1, 2, 4, 8};
  c.Hq = 8;
  c.Hk = heads[seed % 3];
  int64_t others[3], n = 0;
  for (int64_t h : heads) {
    if (h != c.Hk) others[n++] = h;
  }
  c.Hv = others[seed / 3 % 3];
  static const std::pair<int64_t, int64_t> dims[] = {{64, 64},  {128, 128}, {40, 40},  {72, 72},
                                                     {40, 120}, {128, 64},  {64, 64}, {128, 128}};
  std::tie(c.Dqk, c.Dv) = dims[seed % 8];
  if (seed % 10 == 3) std::tie(c.Dqk, c.Dv) = std::pair<int64_t, int64_t>{192, 128};
  if (seed % 10 == 7) c.Dqk = c.Dv = 256;
  if (c.Dqk <= 128 && c.Dv <= 128 && seed / 4 % 2) {
    c.softcap = float(4 + rng() % 20) * 0.5f;
    c.scale = 3.0f / std::sqrt(float(c.Dqk));  // larger scores: softcap and sinks matter
    if (rng() % 3 == 0) {
      c.sinks = true;
      c.max_logit = false;  // refused together on CUDA tensors
    }
    if (rng() % 3 == 0) {
      c.bias = 1 + int(rng() % 16);
      c.bias_f32 = rng() % 2;
    }
  }
  return c;
}

TEST(SdpaGpu, Sm90ForwardHkNeHv) {
  // sm90_hk_ne_hv_case's cases on the sm90 forward (the launch counter says it ran each), O, the stats
  // and max_logit against the CPU reference on NaN-poisoned outputs; every fourth case also the
  // backward, on the sm90 kernels too (every (H_k, H_v) here has one a multiple of the other:
  // Sm90BackwardHkNeHv tests that backward), on the GPU forward's O and LSE.
  REQUIRE_SM90();
  const ForceSm90WithMods force;
  for (uint64_t seed = 15001; seed <= 15048; ++seed) {
    const Case c = sm90_hk_ne_hv_case(seed);
    ASSERT_NE(c.Hk, c.heads_v()) << c.str();
    const bool backward = seed % 4 == 0;
    run_case_expect_sm90(c, backward, 1, backward ? 1 : 0, /*chain=*/true);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, Sm90BigDims) {
  // (192, 128) and (256, 256) on the sm90 forward and backward (sdpa_{fwd,bwd}_sm90_d{192,256}.cu;
  // the backward's column-split consumers with the analytic mask): sm90_case's masks in both
  // alignments, padding with NaN-poisoned rows and a sample without keys, GQA / MQA, layouts, dtypes,
  // deterministic on about half the seeds, with the big dims; forward and backward against the CPU
  // reference, the launch counters say both ran on sm90.
  REQUIRE_SM90();
  const ForceSdpaSm90 force(1);
  const ForceSdpaBwdSm90 force_bwd(1);
  // (192, 128) on the column-split kernel's 64 x 64 tile (the 64 x 96 one, the default: Sm90BackwardWide192).
  sm90::set_bwd_wide192_enabled(0);
  struct Restore {
    ~Restore() { sm90::set_bwd_wide192_enabled(-1); }
  } restore;
  for (uint64_t seed = 9401; seed <= 9430; ++seed) {
    Case c = sm90_case(seed);
    if (seed % 3 == 0) {
      c.Dqk = c.Dv = 256;
    } else {
      c.Dqk = 192;
      c.Dv = 128;
    }
    run_case_expect_sm90(c, /*backward=*/true, 1, 1);
    if (::testing::Test::HasFailure()) return;
  }
}

// The (192, 128) backward on the 64 x 96 tile (sm90::bwd_wide192_enabled forced on; the
// three-warpgroup consumers with the analytic mask: element masks from positions, padded rows and
// keys past a sample zeroed by all three warpgroups): Sm90BigDims' cases at (192, 128), lengths
// around 96-key boundaries, deterministic on every third seed; the launch counter says sm90 ran.
Case sm90_bwd_small_case(int i);  // below: the sm90 SDPA kernels' small sanitizer cases

struct ForceWide192 {
  ForceWide192() { sm90::set_bwd_wide192_enabled(1); }
  ~ForceWide192() { sm90::set_bwd_wide192_enabled(-1); }
};

TEST(SdpaGpu, Sm90BackwardWide192) {
  REQUIRE_SM90();
  const ForceSdpaSm90 force(1);
  const ForceSdpaBwdSm90 force_bwd(1);
  const ForceWide192 wide;
  for (uint64_t seed = 9501; seed <= 9524; ++seed) {
    Case c = sm90_case(seed);
    c.Dqk = 192;
    c.Dv = 128;
    if (seed % 4 == 0) c.Skv = 96 * int64_t(1 + seed % 3) + int64_t(seed % 5) - 2;  // around 96-key block ends
    if (seed % 3 == 0) c.deterministic = true;
    run_case_expect_sm90(c, /*backward=*/true, kAnyLaunches, 1);
    if (::testing::Test::HasFailure()) return;
  }
}

// Small cases of the 64 x 96 SDPA backward for compute-sanitizer: Sm90BackwardSanitizerSmall's
// cases at (192, 128).
TEST(SdpaGpu, Sm90BackwardWide192SanitizerSmall) {
  REQUIRE_SM90();
  const ForceSdpaSm90 force_fwd(1);
  const ForceSdpaBwdSm90 force_bwd(1);
  const ForceWide192 wide;
  for (int i = 0; i < 5; ++i) {
    Case c = sm90_bwd_small_case(i);
    c.Dqk = 192;
    c.Dv = 128;
    run_case_expect_sm90(c, /*backward=*/true, kAnyLaunches, 1);
  }
}

TEST(SdpaGpu, Sm90ForwardSanitizerSmall) {
  // Small sm90 cases for compute-sanitizer memcheck: NaN-padded samples (one without keys) under
  // bottom-right causal with GQA on the (64, 64) kernel (overlapped consumers), a window with
  // max_logit and base-2 stats on the (128, 128) kernel (serial consumers), a dense MQA case, and
  // the dense MQA case again on the (192, 128) kernel.
  REQUIRE_SM90();
  const ForceSdpaSm90 force(1);
  for (int i = 0; i < 4; ++i) {
    Case c;
    c.seed = 9300 + uint64_t(i);
    c.B = 3;
    c.Hq = 4;
    c.Hk = i >= 2 ? 1 : 2;
    c.Sq = 200 + 50 * i;
    c.Skv = 300 - 40 * i;
    c.Dqk = c.Dv = i == 0 ? 64 : 128;
    if (i == 3) c.Dqk = 192;
    c.has_right = true;
    c.bottom_right = i == 0;
    c.has_left = i == 1;
    c.left = 70;
    c.kind_q = i == 1 ? Kind::kBshd : Kind::kBhsd;
    c.kind_kv = i == 1 ? Kind::kStrided : Kind::kBhsd;
    c.lengths = i == 2 ? 0 : 1;
    c.lengths64 = i == 1;
    c.zero_kv_sample = i == 0;
    c.log2_stats = i == 1;
    c.max_logit = i == 1;
    c.dtype = i == 1 ? DType::kFloat16 : DType::kBFloat16;
    run_case_expect_sm90(c, /*backward=*/false, 1, kAnyLaunches);
  }
}

// ---------------------------------------------------------------------------
// The sm90 forward with score modifiers, sinks and the epilogue options (kernel_fwd_sm90.cuh
// sdpa_fwd_kernel_sm90 with AnalyticModSourceSm90), on by default: forced on here
// (ForceSdpaSm90Mods, whatever FLASHSPAN_SM90_SDPA_MODS says) with the sm90 forward; the launch
// counter says which family ran. The backward of such calls runs the sm80 kernels here (the sm90
// backward's modifiers pinned off; Sm90BackwardMods* test them).
// ---------------------------------------------------------------------------

// sm90_case (masks in both alignments, padding with a sample without keys, GQA / MQA, head dims
// up to 128 with 96 and other non-powers, layouts, S up to 1100 on odd seeds) with at least one
// of: softcap, ALiBi (causal), sinks, the additive bias (every broadcast form, float32 or 16-bit,
// padded strides), the output gate, score_max / score_sum_exp, a block_mask, a host scale tensor.
Case sm90_mods_case(uint64_t seed) {
  Case c = sm90_case(seed);
  std::mt19937_64 rng(seed * 613 + 11);
  if (rng() % 4 == 0) c.Dqk = c.Dv = 96;
  if (rng() % 2) c.softcap = float(2 + rng() % 40) * 0.5f;
  if (rng() % 3 == 0) {
    c.alibi = true;
    c.has_right = true;
    c.right = 0;
  }
  c.sinks = rng() % 2;
  if (rng() % 2) {
    c.bias = 1 + int(rng() % 16);
    c.bias_f32 = rng() % 2;
    c.bias_strided = rng() % 3 == 0;
  }
  c.gate = rng() % 4 == 0;
  c.score_stats = rng() % 4 == 0;
  if (rng() % 5 == 0) c.block_mask = 1 + int(rng() % 4);
  c.scale_tensor = rng() % 4 == 0;
  if (rng() % 2) c.scale = 3.0f / std::sqrt(float(c.Dqk));  // larger scores: softcap and sinks matter
  if (c.softcap == 0 && !c.alibi && !c.sinks && !c.bias && !c.gate && !c.score_stats) c.softcap = 8.0f;
  if (c.sinks) c.max_logit = false;  // refused together on CUDA tensors
  return c;
}

// sm90_mods_case's cases first..last on the sm90 forward with modifiers (the launch counter checks
// it ran them); `backward`: forward and backward, the GPU backward (sm80 kernels wherever the call
// has a modifier, sink or gate: the sm90 backward's modifiers pinned off, Sm90BackwardMods* test
// them) taking the GPU forward's O and LSE (run_case's chain).
void run_sm90_mods_cases(uint64_t first, uint64_t last, bool backward = false) {
  const ForceSdpaSm90 force(1);
  const ForceSdpaSm90Mods mods(1);
  const ForceSdpaBwdSm90Mods bwd_mods_off(0);
  for (uint64_t seed = first; seed <= last; ++seed) {
    Case c = sm90_mods_case(seed);
    if (backward && c.bias && c.softcap == 0) c.dbias = seed % 2;  // dBias is refused with softcap
    const bool modified = c.softcap > 0 || c.alibi || c.sinks || c.bias || c.gate;  // its backward: sm80's
    run_case_expect_sm90(c, backward, 1, backward && modified ? 0 : kAnyLaunches, /*chain=*/true);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, Sm90ForwardModsRandom) {
  REQUIRE_SM90();
  run_sm90_mods_cases(14001, 14100);
}

// The fused softcap path (dispatch/sdpa_launch.h sdpa_sm90_fused_softcap_enabled, on by default, forced on here;
// passed on an H200, PERF_LOG v2.77): softcap alone -- with sinks, score_max / score_sum_exp, no ALiBi, no bias -- on the sm90
// forward against the CPU reference, S up to 1100: full key blocks take the fused path, partial ones (diagonals,
// padding, windows) Variant::logits'.
TEST(SdpaGpu, Sm90ForwardFusedSoftcap) {
  REQUIRE_SM90();
  const ForceSdpaSm90 force(1);
  const ForceSdpaSm90Mods mods(1);
  const flashspan::test::ScopedSwitch fused(set_sdpa_sm90_fused_softcap_enabled, 1);
  for (uint64_t seed = 14301; seed <= 14340; ++seed) {
    Case c = sm90_case(seed);
    c.softcap = float(2 + seed % 40) * 0.5f;
    if (seed % 2) c.scale = 3.0f / std::sqrt(float(c.Dqk));  // larger scores: softcap saturates
    c.sinks = seed % 3 == 0;
    if (c.sinks) c.max_logit = false;  // refused together on CUDA tensors
    c.score_stats = seed % 4 == 0;
    run_case_expect_sm90(c, /*backward=*/false, 1, kAnyLaunches);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, Sm90ForwardModsFeedsTheBackward) {
  // The forward's O and LSE (sink included) as the sm80 backward reads them: dQ, dK, dV, dSink,
  // dgate and dBias against the reference's.
  REQUIRE_SM90();
  run_sm90_mods_cases(14201, 14224, /*backward=*/true);
}

// The multi-block shape of the EachAlone / EachForm tests, feature f of them: B = 3, H_q = 4, H_k = 2,
// S_q = 300 + 37 f, S_kv = 500 - 23 f, head dims (dim, dim), bottom-right causal, cu_seq_len padding
// (int64 on odd f) with a sample without keys, fp16 on odd f (else bf16), scale 2 / sqrt(dim).
Case multi_block_case(uint64_t seed, int f, int64_t dim) {
  Case c;
  c.seed = seed;
  c.dtype = f % 2 ? DType::kFloat16 : DType::kBFloat16;
  c.B = 3;
  c.Hq = 4;
  c.Hk = 2;
  c.Sq = 300 + 37 * f;
  c.Skv = 500 - 23 * f;
  c.Dqk = c.Dv = dim;
  c.has_right = true;
  c.bottom_right = true;
  c.lengths = 2;  // cu_seq_len on padded tensors
  c.lengths64 = f % 2;
  c.zero_kv_sample = true;
  c.scale = 2.0f / std::sqrt(float(c.Dqk));
  return c;
}

TEST(SdpaGpu, Sm90ForwardModsEachAlone) {
  // Each feature alone, then all together, on multi-block shapes (GQA, padding by cu_seq_len with
  // a sample without keys, bottom-right causal), head dims 64, 96 and 128, fp16 and bf16.
  REQUIRE_SM90();
  const ForceSdpaSm90 force(1);
  const ForceSdpaSm90Mods mods(1);
  for (int f = 0; f < 13; ++f) {
    Case c = multi_block_case(14500 + uint64_t(f), f, f % 3 == 0 ? 64 : f % 3 == 1 ? 96 : 128);
    switch (f) {
      case 0: c.softcap = 3.0f; break;
      case 1: c.alibi = true; break;
      case 2: c.sinks = true; break;
      case 3: c.bias = 1 + 1; c.bias_f32 = true; break;  // [1, H_q, S_q, S_kv] (broadcast over B)
      case 4: c.bias = 1 + 2 + 4; break;                  // [B, 1, 1, S_kv] in q's dtype
      case 5: c.bias = 1 + 8; c.bias_strided = true; break;  // [B, H_q, S_q, 1] (over keys)
      case 6: c.gate = true; break;
      case 7: c.score_stats = true; break;
      case 8: c.block_mask = 3; c.Skv = 700; break;
      case 9: c.softcap = 5.0f; c.bias = 1 + 4; c.max_logit = true; break;  // max_logit with modifiers
      case 10: c.alibi = true; c.sinks = true; c.log2_stats = true; c.kind_q = Kind::kBshd; c.kind_kv = Kind::kStrided; break;
      case 11: c.Hk = 1; c.sinks = true; c.gate = true; c.score_stats = true; c.scale_tensor = true; break;  // MQA
      default:
        c.softcap = 4.0f;
        c.alibi = true;
        c.sinks = true;
        c.bias = 1 + 2;  // [B, 1, S_q, S_kv]
        c.gate = true;
        c.score_stats = true;
        c.block_mask = 2;
        break;
    }
    run_case_expect_sm90(c, /*backward=*/false, 1, kAnyLaunches);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, Sm90ForwardModsFallsBackToSm80) {
  // With the modifiers' kernel on, what it does not run keeps the sm80 kernels (and is right):
  // packed THD with gaps and a sample without keys (softcap, sinks), (192, 128) with ALiBi,
  // (256, 256) with sinks and the gate, Philox dropout with a bias (H_k != H_v runs on sm90:
  // Sm90ForwardHkNeHv).
  REQUIRE_SM90();
  const ForceSdpaSm90 force(1);
  const ForceSdpaSm90Mods mods(1);
  const ForceSdpaSm90Thd thd_off(0);  // (with it: the Sm90*Thd* tests)
  set_sdpa_sm90_dropout_enabled(0);  // (with it: the Sm90Dropout* tests)
  struct Restore {
    ~Restore() { set_sdpa_sm90_dropout_enabled(-1); }
  } restore;
  for (int i = 0; i < 4; ++i) {
    Case c = sm90_case(14600 + uint64_t(i));
    c.kind_q = c.kind_kv = Kind::kBhsd;
    c.max_logit = false;
    switch (i) {
      case 0: c.kind_q = c.kind_kv = Kind::kThd; c.lengths = 1; c.zero_kv_sample = true; c.softcap = 5.0f; c.sinks = true; break;
      case 1: c.Dqk = 192; c.Dv = 128; c.alibi = true; c.has_right = true; c.right = 0; break;
      case 2: c.Dqk = c.Dv = 256; c.sinks = true; c.gate = true; break;
      default: c.bias = 1 + 2; c.dropout_p = 0.25f; c.dropout_seed = 77; c.dropout_offset = 3; break;
    }
    run_case_expect_sm90(c, /*backward=*/false, 0, kAnyLaunches);
    if (::testing::Test::HasFailure()) return;
  }
}

// The small sanitizer cases of the sm90 SDPA kernels (scripts/gpu_check.sh; the backward's, and the base of
// the modifiers' forward cases, Sm90ForwardModsSanitizerSmall): small, NaN-padded
// samples (one without keys) under bottom-right causal with GQA on the (64, 64) kernel, a window
// on the (128, 128) kernel with D = 96 (the column bounds of the stores), a dense MQA case
// deterministic; then the column-split kernels: case 0's padding and mask on (192, 128), case 1's
// window deterministic on (256, 256).
Case sm90_bwd_small_case(int i) {
  if (i >= 3) {
    Case c = sm90_bwd_small_case(i - 3);
    c.seed = 9400 + uint64_t(i);
    c.Dqk = i == 3 ? 192 : 256;
    c.Dv = i == 3 ? 128 : 256;
    c.deterministic = i == 4;
    return c;
  }
  Case c;
  c.seed = 9400 + uint64_t(i);
  c.B = 3;
  c.Hq = 4;
  c.Hk = i == 2 ? 1 : 2;
  c.Sq = 200 + 50 * i;
  c.Skv = 300 - 40 * i;
  c.Dqk = c.Dv = i == 0 ? 64 : i == 1 ? 96 : 128;
  c.has_right = true;
  c.bottom_right = i == 0;
  c.has_left = i == 1;
  c.left = 70;
  c.kind_q = i == 1 ? Kind::kBshd : Kind::kBhsd;
  c.kind_kv = i == 1 ? Kind::kStrided : Kind::kBhsd;
  c.lengths = i == 2 ? 0 : 1;
  c.lengths64 = i == 1;
  c.zero_kv_sample = i == 0;
  c.dtype = i == 1 ? DType::kFloat16 : DType::kBFloat16;
  c.deterministic = i == 2;
  return c;
}

// A form of the staged-bias tests (Sm90ForwardBiasStaged, Sm90BackwardBiasStaged): S_kv, head dims,
// Case::bias, a float32 bias, padded strides, softcap, a negative scale.
struct StagedBiasForm {
  int64_t skv, dim;
  int bias;
  bool f32, strided;
  float softcap;
  bool negative_scale = false;
};

// Form i's case: a multi-block shape (GQA, padding by cu_seq_len with a sample without keys, bottom-right
// causal) with S_q = 150 (not a multiple of the tile), fp16 on odd i, else bf16 (a 16-bit bias: q's).
Case staged_bias_case(uint64_t seed, int i, const StagedBiasForm& f) {
  Case c = multi_block_case(seed, i % 2, f.dim);
  c.Sq = 150;
  c.Skv = f.skv;
  c.bias = f.bias;
  c.bias_f32 = f.f32;
  c.bias_strided = f.strided;
  c.softcap = f.softcap;
  if (f.negative_scale) c.scale = -c.scale;
  return c;
}

TEST(SdpaGpu, Sm90ForwardBiasStaged) {
  // The sm90 forward stages a 16-bit bias of whole aligned 16-byte row chunks (SdpaBiasParams::chunks:
  // S_kv and the strides multiples of 8) through shared memory (the producer's TMA copies of a key
  // block's tile: row 0 only when broadcast over rows) and adds it after the S GEMM (with the scale folded into the softmax or not: a negative
  // scale); it reads any other bias element by element: full, broadcast and padded-stride layouts,
  // bf16 / fp16 / float32 (staged_bias_case's shapes). Small enough for compute-sanitizer memcheck
  // (gpu_check.sh).
  REQUIRE_SM90();
  const ForceSdpaSm90 force(1);
  const ForceSdpaSm90Mods mods(1);
  static const StagedBiasForm forms[] = {
      {200, 128, 1, false, false, 0.0f},              // [B, H_q, S_q, S_kv] bf16, staged
      {200, 128, 1, false, false, 0.0f},              // the same in fp16, staged
      {201, 64, 1 + 1 + 2, false, false, 0.0f},       // [1, 1, S_q, S_kv], S_kv not a multiple of 8: elements
      {208, 128, 1 + 1 + 2 + 4, false, false, 3.0f},  // [1, 1, 1, S_kv] fp16 with softcap, staged through L1
      {200, 96, 1 + 1, false, true, 0.0f},            // padded strides, staged
      {200, 64, 1 + 1, true, true, 0.0f},             // float32: elements
      {200, 128, 1 + 2, false, false, 0.0f, true},    // [B, 1, S_q, S_kv], negative scale, staged
      {216, 64, 1 + 4, false, false, 0.0f},           // [B, H_q, 1, S_kv]: row 0 staged
  };
  for (int i = 0; i < 8; ++i) {
    run_case_expect_sm90(staged_bias_case(14800 + uint64_t(i), i, forms[i]), /*backward=*/false, 1, kAnyLaunches);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, Sm90ForwardModsSanitizerSmall) {
  // Small cases of the modifiers' kernel for compute-sanitizer memcheck: NaN-padded samples (one
  // without keys) on the (64, 64) kernel with softcap, ALiBi, sinks, a float32 bias broadcast over
  // B, the gate and the statistics; D = 96 on the (128, 128) kernel with a 16-bit bias over keys
  // only (padded strides), a block_mask and max_logit; a dense MQA case with sinks and base-2 stats.
  REQUIRE_SM90();
  const ForceSdpaSm90 force(1);
  const ForceSdpaSm90Mods mods(1);
  for (int i = 0; i < 3; ++i) {
    Case c = sm90_bwd_small_case(i);  // shapes, masks, padding and layouts of the backward's cases
    c.seed = 14700 + uint64_t(i);
    c.deterministic = false;  // a forward
    c.scale = 2.0f / std::sqrt(float(c.Dqk));
    switch (i) {
      case 0:
        c.softcap = 4.0f;
        c.alibi = true;
        c.sinks = true;
        c.bias = 1 + 1;
        c.bias_f32 = true;
        c.gate = true;
        c.score_stats = true;
        break;
      case 1:
        c.bias = 1 + 8;
        c.bias_strided = true;
        c.block_mask = 1;
        c.max_logit = true;
        c.softcap = 6.0f;
        break;
      default:
        c.sinks = true;
        c.log2_stats = true;
        break;
    }
    run_case_expect_sm90(c, /*backward=*/false, 1, kAnyLaunches);
  }
}

// ---------------------------------------------------------------------------
// The sm90 backward with the analytic mask (kernel_bwd_sm90.cuh AnalyticSourceBwdSm90), chosen by
// sdpa_bwd_runs_sm90 (sdpa_family.cpp): forced on and off per test (set_sdpa_bwd_sm90_enabled;
// the forward with it), sm90::sdpa_bwd_launches() says which family ran the backward.
// ---------------------------------------------------------------------------

// sm90_case's cases (every mask form in both alignments, padding with a sample without keys,
// GQA / MQA, head dims up to 128 on the (64, 64) and (128, 128) kernels, layouts, deterministic
// on even seeds) forward and backward, both forced onto the sm90 kernels: 100 cases in four tests
// (gtest shards run them side by side: the CPU reference dominates), a quarter each.
void run_sm90_bwd_quarter(int quarter) {
  const uint64_t first = 9001 + 25 * uint64_t(quarter - 1);
  run_sm90_cases(first, first + 24, 1, /*backward=*/true);
}

TEST(SdpaGpu, Sm90BackwardRandom1) { REQUIRE_SM90(); run_sm90_bwd_quarter(1); }
TEST(SdpaGpu, Sm90BackwardRandom2) { REQUIRE_SM90(); run_sm90_bwd_quarter(2); }
TEST(SdpaGpu, Sm90BackwardRandom3) { REQUIRE_SM90(); run_sm90_bwd_quarter(3); }
TEST(SdpaGpu, Sm90BackwardRandom4) { REQUIRE_SM90(); run_sm90_bwd_quarter(4); }

TEST(SdpaGpu, Sm90BackwardOffRunsSm80) {
  // The same cases, forward and backward forced onto the sm80 kernels.
  REQUIRE_SM90();
  run_sm90_cases(9001, 9020, 0, /*backward=*/true);
}

TEST(SdpaGpu, Sm90BackwardFallsBackToSm80) {
  // With the sm90 backward on, what it does not cover runs the sm80 kernels (and is right):
  // packed THD, softcap, H_k != H_v with neither a multiple of the other (H_q = 6, H_k = 3, H_v = 2;
  // the others: Sm90BackwardHkNeHv), a block_mask with the gate (the modifiers' part pinned
  // off: Sm90BackwardMods* test it on).
  REQUIRE_SM90();
  const ForceSdpaSm90 force_fwd(1);
  const ForceSdpaBwdSm90 force_bwd(1);
  const ForceSdpaBwdSm90Mods mods_off(0);
  const ForceSdpaSm90Thd thd_off(0);  // (Sm90BackwardThdExperimental runs packed tensors on it)
  for (int i = 0; i < 4; ++i) {
    Case c = sm90_case(9200 + uint64_t(i));
    c.kind_q = c.kind_kv = Kind::kBhsd;
    switch (i) {
      case 0: c.kind_q = c.kind_kv = Kind::kThd; c.lengths = 1; break;
      case 1: c.softcap = 5.0f; break;
      case 2: c.Hq = 6; c.Hk = 3; c.Hv = 2; break;
      default: c.gate = true; c.block_mask = 2; c.has_right = true; c.right = 0; c.has_left = false; break;
    }
    run_case_expect_sm90(c, /*backward=*/true, kAnyLaunches, 0);
    if (::testing::Test::HasFailure()) return;
  }
}

// Packed (THD) tensors on the sm90 backward (sdpa_sm90_thd_enabled, the forward's switch: on by default; per-sample
// maps of q, k, v and the main dO): sm90_thd_case's cases without a block_mask (the sm90 backward leaves it to
// sm80), forward and backward on the sm90 kernels (both launch counters checked), every gradient against the CPU
// reference on NaN-poisoned outputs, the gaps between packed samples untouched; deterministic on every third,
// H_k != H_v (H_v = 2 H_k: the item slots and their sum kernel) on every fifth, the gate (a packed gate and dgate)
// and dBias (no softcap) on some of the modifier cases.
Case sm90_thd_bwd_case(uint64_t seed) {
  Case c = sm90_thd_case(seed);
  c.block_mask = 0;
  c.deterministic = seed % 3 == 0;
  if (seed % 5 == 0 && c.Dqk <= 128 && c.Dv <= 128) {
    c.Hq = 8;
    c.Hk = 2;
    c.Hv = 4;
  }
  if (c.bias && c.softcap == 0) c.dbias = true;  // (4 of the 48 cases)
  return c;
}

TEST(SdpaGpu, Sm90BackwardThdExperimental) {
  REQUIRE_SM90();
  const ForceSm90WithMods force;
  const ForceSdpaSm90Thd thd(1);
  for (uint64_t seed = 15301; seed <= 15348; ++seed) {
    run_case_expect_sm90(sm90_thd_bwd_case(seed), /*backward=*/true, 1, 1, /*chain=*/true);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, Sm90BackwardThdSanitizerSmall) {
  // thd_sanitizer_case's backward cases (forward and backward on the sm90 kernels), for compute-sanitizer
  // (memcheck, synccheck).
  REQUIRE_SM90();
  const ForceSm90WithMods force;
  const ForceSdpaSm90Thd thd(1);
  for (int i = 0; i < 3; ++i) run_case_expect_sm90(thd_sanitizer_case(i, true), /*backward=*/true, 1, 1, /*chain=*/true);
}

// Both forms of the backward preprocess (bwd_prepost.cuh bwd_preprocess_rows_paired, the default since PERF_LOG
// v2.65, and the one-unit form of FLASHSPAN_BWD_PREPROCESS_PAIRED=0), each forced: the small backward cases (NaN-padded samples, one
// without keys, the gate with dgate, sinks, base-2 statistics, MQA) on the sm90 and the sm80 SDPA
// backward, every gradient against the CPU reference. Small enough for memcheck (gpu_check.sh).
TEST(SdpaGpu, PreprocessForms) {
  REQUIRE_GPU();
  for (int paired_on : {1, 0}) {
    SCOPED_TRACE(paired_on ? "paired preprocess" : "one-unit preprocess");
    const ForcePairedPreprocess paired(paired_on);
    for (int sm90 : {1, 0}) {
      if (sm90 && !sm90_device()) continue;
      const ForceSdpaBwdSm90 force_bwd(sm90);
      for (int i = 0; i < 5; ++i) {
        run_case(sm90_bwd_small_case(i), /*backward=*/true);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

TEST(SdpaGpu, Sm90BackwardSanitizerSmall) {
  REQUIRE_SM90();
  const ForceSdpaSm90 force_fwd(1);
  const ForceSdpaBwdSm90 force_bwd(1);
  for (int i = 0; i < 5; ++i) {
    const Case c = sm90_bwd_small_case(i);
    run_case_expect_sm90(c, /*backward=*/true, kAnyLaunches, 1);
  }
}

// The (128, 128) kernel's register splits (sm90::bwd_gemm_order 4: 24 / 240 registers, a uniform warpgroup index, the
// default; 0: 40 / 232; PERF_LOG v2.79) and its experimental GEMM orders (12, 20, 28, 36, 44: early dQ, late /
// deferred dK; PERF_LOG v2.80), forced for a scope on the sm90 forward and backward.
struct Sm90BwdGemmOrder {
  const ForceSdpaSm90 force_fwd{1};
  const ForceSdpaBwdSm90 force_bwd{1};
  explicit Sm90BwdGemmOrder(int o) { sm90::set_bwd_gemm_order(o); }
  ~Sm90BwdGemmOrder() { sm90::set_bwd_gemm_order(-1); }
};

// sm90_case's cases at head dims 128 / 96 / 64 / 40 (every mask form, padding, GQA / MQA, layouts, deterministic on
// even seeds) forward and backward, in each order (the smaller dims run the (64, 64) kernel, the same either way).
TEST(SdpaGpu, Sm90BackwardGemmOrders) {
  REQUIRE_SM90();
  for (int order : {0, 4, 12, 20, 28, 36, 44}) {
    SCOPED_TRACE("bwd_gemm_order " + std::to_string(order));
    const Sm90BwdGemmOrder o(order);
    ASSERT_EQ(sm90::bwd_gemm_order(), order);
    const int64_t n = sm90::bwd_order_launches(order);  // the (128, 128) kernel of this order ran (D = 128 cases)
    for (uint64_t seed = 9451; seed <= 9462; ++seed) {
      Case c = sm90_case(seed + 50 * uint64_t(order));
      c.Dqk = c.Dv = std::vector<int64_t>{128, 96, 64, 40}[seed % 4];
      run_case_expect_sm90(c, /*backward=*/true, kAnyLaunches, 1);
      if (::testing::Test::HasFailure()) return;
    }
    EXPECT_GT(sm90::bwd_order_launches(order), n) << "no launch of the (128, 128) kernel of order " << order;
  }
}

// Sm90BackwardSanitizerSmall's cases in each order (scripts/gpu_check.sh: compute-sanitizer).
TEST(SdpaGpu, Sm90BackwardGemmOrderSanitizerSmall) {
  REQUIRE_SM90();
  for (int order : {4, 28, 44}) {  // (0 unchanged since PERF_LOG v2.79's sanitizer runs)
    SCOPED_TRACE("bwd_gemm_order " + std::to_string(order));
    const Sm90BwdGemmOrder o(order);
    for (int i = 0; i < 3; ++i) run_case_expect_sm90(sm90_bwd_small_case(i), /*backward=*/true, kAnyLaunches, 1);
  }
}

// The deterministic backward's shape of the bitwise tests: B = 2, H_q = 8, H_k = 2, S_q = 700, S_kv = 650
// (several key blocks a sample), head dim d, bottom-right causal, BHSD, padded samples.
Case sm90_bitwise_case(int64_t d, uint64_t seed) {
  Case c;
  c.seed = seed;
  c.B = 2;
  c.Hq = 8;
  c.Hk = 2;
  c.Sq = 700;
  c.Skv = 650;
  c.Dqk = c.Dv = d;
  c.has_right = true;
  c.bottom_right = true;
  c.kind_q = c.kind_kv = Kind::kBhsd;
  c.lengths = 1;
  c.deterministic = true;
  return c;
}

// Case c's backward on the sm90 kernels three times, on the GPU forward's O and LSE (padding rows
// poisoned), every gradient output (dQ, dK, dV; dSink, dgate, dBias where c has them) NaN-poisoned
// before each run: each run launches the sm90 backward (mods_kernel: its modifiers' kernel; both
// switched on here) and gives run 0's bytes. A deterministic c runs its cells ungrouped (run 0), in claimed L2
// groups of 3 pairs (run 1: grouped where c has more than 3 (sample, item head) pairs, which the launch count
// checks) and in the default order (run 2): the grouped order keeps every dQ tile's order of additions.
void expect_sm90_backward_bitwise_reproducible(const Case& c, bool mods_kernel) {
  const ForceSdpaBwdSm90 force_bwd(1);
  const ForceSdpaBwdSm90Mods mods(1);
  auto p = make_problem(c);
  run_forward(*p, false, false);
  poison_padding(p->o, p->len_q);
  poison_padding(p->stats, p->len_q);
  p->o.upload();
  p->stats.upload();
  std::vector<std::vector<uint8_t>> first;
  for (int run = 0; run < 3; ++run) {
    std::vector<Tensor*> outs = {&p->dq, &p->dk, &p->dv};
    if (c.sinks) outs.push_back(&p->dsink);
    if (c.gate) outs.push_back(&p->dgate);
    if (c.dbias) outs.push_back(&p->dbias);
    for (Tensor* t : outs) t->poison_device();
    const int64_t before = sm90::sdpa_bwd_launches(), mods_before = sm90::sdpa_bwd_mods_launches();
    const int64_t grouped_before = sm90::sdpa_bwd_l2_grouped_launches();
    {
      const char* group = !c.deterministic ? nullptr : run == 0 ? "0" : run == 1 ? "3" : nullptr;
      const ScopedEnv det_group("FLASHSPAN_SM90_BWD_DET_L2_GROUP", group);
      run_backward(*p, true);
    }
    EXPECT_EQ(sm90::sdpa_bwd_launches(), before + 1) << c.str();
    if (mods_kernel) {
      EXPECT_EQ(sm90::sdpa_bwd_mods_launches(), mods_before + 1) << c.str();
    }
    if (c.deterministic && run < 2) {
      const int64_t pairs = c.B * std::max(c.Hk, c.Hv > 0 ? c.Hv : c.Hk);
      EXPECT_EQ(sm90::sdpa_bwd_l2_grouped_launches(), grouped_before + (run == 1 && pairs > 3 ? 1 : 0))
          << c.str() << ": run " << run;
    }
    std::vector<std::vector<uint8_t>> now;
    for (Tensor* t : outs) now.push_back(t->download());
    if (run == 0) {
      first = now;
    } else {
      EXPECT_TRUE(now == first) << c.str() << ": run " << run << " differs bitwise from run 0";
    }
  }
}

TEST(SdpaGpu, Sm90BackwardDeterministicIsBitwiseReproducible) {
  // Padded samples (lengths), GQA, bottom-right causal, several key blocks a sample: dQ tiles
  // added in descending key-block order through their counters; three runs bitwise equal.
  REQUIRE_SM90();
  for (int64_t d : {64, 128}) expect_sm90_backward_bitwise_reproducible(sm90_bitwise_case(d, 3100 + uint64_t(d)), false);
}

// ---------------------------------------------------------------------------
// The sm90 backward with score modifiers, sinks and the gate (kernel_bwd_mods_sm90.cuh
// sdpa_bwd_mods_kernel_sm90, AnalyticModSourceBwdSm90: softcap with its derivative, ALiBi, the
// bias with dBias; dSink and the gated dO around either sm90 kernel), on by default: forced on here
// (ForceSdpaBwdSm90Mods, whatever FLASHSPAN_SM90_SDPA_BWD_MODS says) with the sm90 backward, and the sm90
// forward with its modifiers; sm90::sdpa_bwd_launches says the sm90 backward ran, and
// sdpa_bwd_mods_launches which kernel (the one with modifiers for softcap, ALiBi, the bias).
// ---------------------------------------------------------------------------

// Whether the backward of c runs the kernel with score modifiers (else the pure-mask one, with
// dSink / the gated dO around it).
bool bwd_mods_kernel(const Case& c) { return c.softcap > 0 || c.alibi || c.bias; }

// Runs c forward and backward on the sm90 kernels (switches forced by the caller), checking the
// launch counters: the sm90 forward and backward ran, the backward's kernel with modifiers when c
// has softcap, ALiBi or the bias.
void run_sm90_bwd_mods_case(const Case& c, bool chain = false) {
  const int64_t m0 = sm90::sdpa_bwd_mods_launches();
  run_case_expect_sm90(c, /*backward=*/true, 1, 1, chain);
  EXPECT_EQ(sm90::sdpa_bwd_mods_launches(), m0 + (bwd_mods_kernel(c) ? 1 : 0)) << "backward kernel of " << c.str();
}

// sm90_mods_case (masks in both alignments, padding with a sample without keys, GQA / MQA, head
// dims up to 128 with 96, layouts, softcap, ALiBi, sinks, every bias form, the gate, the host scale
// tensor) without the block_mask (the sm80 backward's), with dBias on two of three bias cases
// without softcap (with softcap: Sm90BackwardDbiasWithSoftcap), deterministic on even seeds.
Case sm90_bwd_mods_case(uint64_t seed) {
  Case c = sm90_mods_case(seed);
  c.block_mask = 0;
  if (c.softcap == 0 && !c.alibi && !c.sinks && !c.bias && !c.gate) {  // score_max / score_sum_exp alone
    c.sinks = true;
    c.max_logit = false;
  }
  c.dbias = c.bias && c.softcap == 0 && seed % 3 != 0;
  c.deterministic = seed % 2 == 0;
  return c;
}

// sm90_bwd_mods_case's cases first..last; every third backward takes the GPU forward's O and LSE.
void run_sm90_bwd_mods_cases(uint64_t first, uint64_t last) {
  const ForceSm90WithMods force;
  for (uint64_t seed = first; seed <= last; ++seed) {
    run_sm90_bwd_mods_case(sm90_bwd_mods_case(seed), /*chain=*/seed % 3 == 0);
    if (::testing::Test::HasFailure()) return;
  }
}

// 80 cases in two tests (gtest shards run them side by side).
TEST(SdpaGpu, Sm90BackwardModsRandom1) {
  REQUIRE_SM90();
  run_sm90_bwd_mods_cases(14801, 14840);
}
TEST(SdpaGpu, Sm90BackwardModsRandom2) {
  REQUIRE_SM90();
  run_sm90_bwd_mods_cases(14841, 14880);
}

TEST(SdpaGpu, Sm90BackwardModsEachAlone) {
  // Each feature alone (with its gradient), then combinations, on multi-block shapes (GQA, padding
  // by cu_seq_len with a sample without keys, bottom-right causal), head dims 64, 96 and 128, fp16
  // and bf16, deterministic on odd f.
  REQUIRE_SM90();
  const ForceSm90WithMods force;
  for (int f = 0; f < 13; ++f) {
    Case c = multi_block_case(14900 + uint64_t(f), f, f % 3 == 0 ? 64 : f % 3 == 1 ? 96 : 128);
    c.deterministic = f % 2;
    switch (f) {
      case 0: c.softcap = 3.0f; break;
      case 1: c.alibi = true; break;
      case 2: c.sinks = true; break;
      case 3: c.bias = 1 + 1; c.bias_f32 = true; c.dbias = true; break;  // [1, H_q, S_q, S_kv]
      case 4: c.bias = 1 + 2 + 4; c.dbias = true; break;                  // [B, 1, 1, S_kv] in q's dtype
      case 5: c.bias = 1 + 8; c.bias_strided = true; c.dbias = true; break;  // [B, H_q, S_q, 1]
      case 6: c.gate = true; break;
      case 7: c.softcap = 5.0f; c.bias = 1; break;  // softcap's derivative with a full bias (no dBias)
      case 8:  // BSHD / padded strides
        c.alibi = true;
        c.sinks = true;
        c.gate = true;
        c.bias = 1 + 2;
        c.dbias = true;
        c.kind_q = Kind::kBshd;
        c.kind_kv = Kind::kStrided;
        break;
      case 9: c.Hk = 1; c.sinks = true; c.gate = true; c.scale_tensor = true; break;  // MQA
      case 10: c.softcap = 4.0f; c.alibi = true; c.has_left = true; c.left = 90; break;  // a window
      case 11: c.bias = 1; c.dbias = true; c.Hk = 4; break;  // a full bias, MHA
      default:
        c.softcap = 4.0f;
        c.alibi = true;
        c.sinks = true;
        c.bias = 1 + 4;  // [B, H_q, 1, S_kv]
        c.gate = true;
        break;
    }
    run_sm90_bwd_mods_case(c);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, Sm90BackwardBiasStaged) {
  // The sm90 backward stages a 16-bit bias of whole aligned 16-byte row chunks (SdpaBiasParams::chunks)
  // through shared memory a step ahead (kernel_bwd_mods_sm90.cuh stage_bias: the consumer warps'
  // cp.async, read transposed with ldmatrix; row 0 only when broadcast over rows) and reads any other
  // bias element by element (and so do calls with softcap, on the softcap kernel): full, broadcast and
  // padded-stride layouts, bf16 / fp16 / float32 (staged_bias_case's shapes), dBias on the forms without
  // softcap, deterministic on odd forms; D = 64 and 128 kernels. Small enough for compute-sanitizer
  // memcheck (gpu_check.sh).
  REQUIRE_SM90();
  const ForceSm90WithMods force;
  static const StagedBiasForm forms[] = {
      {200, 128, 1, false, false, 0.0f},              // [B, H_q, S_q, S_kv] bf16, staged
      {200, 64, 1, false, false, 0.0f},               // the same in fp16 on the (64, 64) kernel, staged
      {201, 64, 1 + 1 + 2, false, false, 0.0f},       // [1, 1, S_q, S_kv], S_kv not a multiple of 8: elements
      {208, 128, 1 + 1 + 2 + 4, false, false, 3.0f},  // [1, 1, 1, S_kv] fp16 with softcap: elements
      {200, 96, 1 + 1, false, true, 0.0f},            // padded strides, staged
      {200, 64, 1 + 1, true, true, 0.0f},             // float32: elements
      {264, 128, 1 + 2 + 4, false, false, 0.0f},      // [B, 1, 1, S_kv] bf16, row 0 staged, dBias over rows
  };
  for (int i = 0; i < 7; ++i) {
    Case c = staged_bias_case(15100 + uint64_t(i), i, forms[i]);
    c.dbias = forms[i].softcap == 0.0f;
    c.deterministic = i % 2;
    run_sm90_bwd_mods_case(c);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, Sm90BackwardModsDbiasEveryBroadcastForm) {
  // dBias of each of the 16 broadcast forms from the sm90 kernel's dS workspace (one multi-block
  // shape: GQA, padding with a sample without keys on some, causal bottom-right), D = 64 and 128,
  // deterministic on odd forms, dBias in float32 and in q's dtype, padded strides on some.
  REQUIRE_SM90();
  const ForceSm90WithMods force;
  for (int form = 1; form <= 16; ++form) {
    Case c;
    c.seed = 14950 + uint64_t(form);
    c.dtype = form % 2 ? DType::kBFloat16 : DType::kFloat16;
    c.B = 2;
    c.Hq = 4;
    c.Hk = 2;
    c.Sq = 150 + 20 * (form % 4);
    c.Skv = 210 + 30 * (form % 3);
    c.Dqk = c.Dv = form % 2 ? 64 : 128;
    c.has_right = true;
    c.bottom_right = true;
    c.lengths = 1;
    c.zero_kv_sample = form % 3 == 0;
    c.deterministic = form % 2;
    c.scale = 0.125f;
    c.bias = form;
    c.bias_f32 = form % 4 < 2;
    c.bias_strided = form % 5 == 0;
    c.dbias = true;
    run_sm90_bwd_mods_case(c);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, DbiasReduceForms) {
  // dBias's forms, each forced, on every broadcast form against the reference: the workspace's two reductions of a
  // dBias that keeps the key dimension (bwd_prepost.cuh: sdpa_dbias_reduce_cols, runs of terms in one pass or two;
  // the warp per element, FLASHSPAN_SDPA_DBIAS_COLS=0), the accumulator form (the kernel's red.add into a buffer of
  // dBias's shape; calls outside deterministic mode) and the direct form (the kernel's stores into dBias; dBias
  // with one term an element). dispatch's sdpa_dbias_ds_form picks among them; each case checks which form ran.
  // Shapes small (several runs an element, pass 2) and two larger (forms 4 and 8 below).
  REQUIRE_SM90();
  const ForceSm90WithMods force;
  // Variant 4: the direct form on the edges of its rule -- H_q = 1 (a head-broadcast dBias is one term), S_q = 1 (a
  // query-broadcast one; with H_k != H_v), both -- on forms 3, 5, 7 only. Philox dropout on forms 2 and 9 (the
  // kernel with dropout: the workspace, accumulator and direct forms of form 2, the workspace form of form 9).
  const flashspan::test::ScopedSwitch dropout(set_sdpa_sm90_dropout_enabled, 1);
  for (int variant : {0, 1, 2, 3, 4}) {  // workspace (cols), workspace (warp), accumulator, direct, direct's edges
    set_sdpa_dbias_cols(variant != 1);
    set_sdpa_dbias_acc_enabled(variant == 2);
    set_sdpa_dbias_direct_enabled(variant >= 3);
    for (int form = 1; form <= 16; ++form) {
      if (variant == 4 && form != 3 && form != 5 && form != 7) continue;
      Case c;
      c.seed = 15650 + uint64_t(form) + 100 * uint64_t(variant == 1) + 1000 * uint64_t(variant);
      c.dtype = form % 2 ? DType::kBFloat16 : DType::kFloat16;
      c.B = variant == 3 && form % 2 == 0 ? 1 : 2;  // (direct: B = 1 makes a batch-broadcast dBias one term too)
      c.Hk = 2;
      // Forms 4 and 8 larger: (1, 1, S, S) with runs of the 16 (b, h) terms; (1, 1, 1, S) with runs of ~26 of its
      // B H S_q terms, so that runs cross from one head's last query row to the next head's first.
      const bool big = form == 4 || form == 8;
      c.Sq = big ? 600 : 130 + 10 * (form % 4);
      c.Skv = big ? 700 : 190 + 30 * (form % 3);
      c.Hq = big ? 8 : 4;
      c.Dqk = c.Dv = form % 3 ? 64 : 128;
      c.has_right = form % 2 == 0;
      c.bottom_right = c.has_right;
      c.lengths = form % 3 == 1;
      // (direct: form 1, a dBias of the problem's shape, in deterministic mode too)
      c.deterministic = form % 4 == 3 || (variant == 3 && form == 1);
      // H_k != H_v (one dividing the other, the sm90 backward's rule) on forms 5, 10 and 15.
      if (form % 5 == 0) c.Hv = 4;
      c.scale = 0.125f;
      c.bias = form;
      c.bias_f32 = form % 4 < 2;
      c.bias_strided = variant == 3 && form == 2;  // (a dBias of the direct form with strides: zeroed by a kernel)
      if (variant == 4) {
        if (form != 5) c.Hq = c.Hk = 1;  // forms 3 and 7 (heads broadcast)
        if (form != 3) {                 // forms 5 and 7 (queries broadcast)
          c.Sq = 1;
          c.lengths = 0;
        }
        if (form != 5) c.Hv = 0;  // (form 5 keeps H_v = 4 of H_q = 4, H_k = 2)
      }
      if (form == 2 || form == 9) {
        c.dropout_p = 0.25f;
        c.dropout_seed = 4321 + form;
        c.dropout_offset = 96;
      }
      c.dbias = true;
      const std::vector<int64_t> bs = c.bias_shape();
      const bool keys_kept = bs[3] != 1;
      const bool one_term = (bs[0] == c.B || c.B == 1) && (bs[1] == c.Hq || c.Hq == 1) &&
                            (bs[2] == c.Sq || c.Sq == 1) && keys_kept;
      const int want = variant >= 3 && one_term                          ? kDbiasDsDirect
                       : variant == 2 && keys_kept && !c.deterministic ? kDbiasDsAccumulate
                                                                         : kDbiasDsWorkspace;
      if (variant == 4) {
        ASSERT_EQ(want, kDbiasDsDirect) << "the direct rule's edges: " << c.str();
      }
      const int64_t before = sdpa_dbias_form_launches(want);
      run_sm90_bwd_mods_case(c);
      EXPECT_EQ(sdpa_dbias_form_launches(want) - before, 1) << "dBias form " << want << ": " << c.str();
      if (::testing::Test::HasFailure()) break;
    }
    set_sdpa_dbias_cols(-1);
    set_sdpa_dbias_acc_enabled(-1);
    set_sdpa_dbias_direct_enabled(-1);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, DbiasFormFixedAtCheckSupport) {
  // An operation keeps the dBias form its check_support chose (Problem::dbias_ds_form): both form switches turned
  // off between check_support and workspace_size (g_after_check_support) change neither the workspace nor the form
  // that runs (before, execute read them again and failed on a workspace sized for the other form).
  REQUIRE_SM90();
  const ForceSm90WithMods force;
  for (int form : {int(kDbiasDsDirect), int(kDbiasDsAccumulate)}) {
    Case c;
    c.seed = 15990 + uint64_t(form);
    c.dtype = DType::kBFloat16;
    c.B = 2;
    c.Hq = 4;
    c.Hk = 2;
    c.Sq = 200;
    c.Skv = 260;
    c.Dqk = c.Dv = 64;
    c.scale = 0.125f;
    c.bias = 1;  // (B, H_q, S_q, S_kv): one term an element
    c.dbias = true;
    const flashspan::test::ScopedSwitch acc(set_sdpa_dbias_acc_enabled, 1);
    const flashspan::test::ScopedSwitch direct(set_sdpa_dbias_direct_enabled, form == kDbiasDsDirect ? 1 : 0);
    g_after_check_support = [] {
      set_sdpa_dbias_direct_enabled(0);
      set_sdpa_dbias_acc_enabled(0);
    };
    const int64_t before = sdpa_dbias_form_launches(form);
    run_sm90_bwd_mods_case(c);
    g_after_check_support = nullptr;
    EXPECT_EQ(sdpa_dbias_form_launches(form) - before, 1) << "dBias form " << form << ": " << c.str();
    if (::testing::Test::HasFailure()) return;
  }
}

// Form `form` (1..16) of the dBias-with-softcap tests: every broadcast form (c.bias = form), softcap 2-30, head dims
// dims[form % dims.size()], ALiBi on some, deterministic on odd forms, dBias in float32 and in q's dtype, padded
// strides on some; a larger scale on a third so that softcap saturates some elements (1 - t^2 near 0, dBias's terms
// not); GQA / MQA; padding with a sample without keys on a third.
Case dbias_softcap_case(int form, uint64_t seed0, std::initializer_list<int64_t> dims) {
  Case c;
  c.seed = seed0 + uint64_t(form);
  c.dtype = form % 2 ? DType::kBFloat16 : DType::kFloat16;
  c.B = 2;
  c.Hq = 4;
  c.Hk = form % 4 == 0 ? 1 : 2;
  c.Sq = 150 + 20 * (form % 4);
  c.Skv = 210 + 30 * (form % 3);
  c.Dqk = c.Dv = dims.begin()[size_t(form) % dims.size()];
  c.has_right = true;
  c.bottom_right = true;
  c.lengths = 1;
  c.zero_kv_sample = form % 3 == 0;
  c.deterministic = form % 2;
  c.scale = form % 3 == 2 ? 3.0f / std::sqrt(float(c.Dqk)) : 0.125f;
  c.softcap = form % 3 == 2 ? 2.0f + float(form % 5) : float(5 + 5 * (form % 6));
  c.alibi = form % 4 == 1;
  c.bias = form;
  c.bias_f32 = form % 4 < 2;
  c.bias_strided = form % 5 == 0;
  c.dbias = true;
  return c;
}

TEST(SdpaGpu, Sm90BackwardDbiasWithSoftcap) {
  // dBias together with softcap (on by default, forced on here; the sm90 backward: kernel_bwd_mods_sm90.cuh stores
  // dBias's dS, P (dP - D), before softcap's factor 1 - t^2; the bias is added after softcap): dbias_softcap_case's
  // forms, D = 64, 96 and 128.
  REQUIRE_SM90();
  const ForceSm90WithMods force;
  const flashspan::test::ScopedSwitch pair(set_sdpa_dbias_softcap_enabled, 1);
  for (int form = 1; form <= 16; ++form) {
    run_sm90_bwd_mods_case(dbias_softcap_case(form, 16501, {64, 96, 128}), /*chain=*/form % 3 == 1);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, Sm80BackwardDbiasWithSoftcap) {
  // dBias together with softcap on the sm80 backward (sdpa_dbias_softcap_sm80_enabled: on by default since this test,
  // then Sm80BackwardDbiasWithSoftcapExperimental, passed on an H200, 2026-12-05; off with
  // FLASHSPAN_SDPA_DBIAS_SOFTCAP=0; forced on here, with the pair's switch; the sm90 kernels forced off, the
  // FLASHSPAN_KERNEL_FAMILY=sm80 switches): its dK/dV kernel stores the fp32 P in the dS workspace at the logits
  // step and P (dP - D) over it at the dS step, since its dS holds softcap's factor 1 - t^2 (kernel_bwd_sm80.cuh).
  // dbias_softcap_case's forms on the sm80 tiles: D = 64, 96, 128 and 256, H_k != H_v on one (the dV pass, which
  // stores no dS). dBias against the CPU reference on NaN-poisoned outputs (run_case); a chained forward only where
  // the bias is not broadcast over keys (run_case: that dBias, sum_j dS_ij, is exactly 0).
  REQUIRE_GPU();
  const ForceSdpaSm90 fwd90(0);
  const ForceSdpaBwdSm90 bwd90(0);
  const flashspan::test::ScopedSwitch pair(set_sdpa_dbias_softcap_enabled, 1);
  const flashspan::test::ScopedSwitch sm80(set_sdpa_dbias_softcap_sm80_enabled, 1);
  for (int form = 1; form <= 16; ++form) {
    Case c = dbias_softcap_case(form, 16601, {64, 96, 128, 256});
    if (form == 7) {  // H_k != H_v: a dK pass and a dV pass
      c.Hq = 6;
      c.Hk = 2;
      c.Hv = 3;
    }
    const bool chain = form % 3 == 1 && c.bias_shape()[3] != 1;
    run_case_expect_sm90(c, /*backward=*/true, 0, 0, chain);  // (no sm90 launch: the sm80 kernels ran both)
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, Sm80BackwardDbiasSoftcapDropout) {
  // dBias together with softcap and dropout (sdpa_dbias_softcap_dropout_enabled: on by default since this test, then
  // ...Experimental, passed on an H100, 2026-12-06; forced on here, with the pair's switches): the sm80 backward's
  // kernel of the pair, whose dS step forms P (m dP - D) with each element's dropout multiplier m; the sm90 backward refuses the triple (no sm90 backward
  // launch, on any GPU). dbias_softcap_case's forms with Philox dropout on even forms (p 0.1-0.5, int32 / int64 seed
  // and offset) and the caller's mask on odd ones (every broadcast form, each mask dtype, scale 1 / (1 - p)), D = 64,
  // 96, 128 and 256, H_k != H_v on one; dQ, dK, dV and dBias against the CPU reference on NaN-poisoned outputs.
  REQUIRE_GPU();
  const flashspan::test::ScopedSwitch pair(set_sdpa_dbias_softcap_enabled, 1);
  const flashspan::test::ScopedSwitch sm80(set_sdpa_dbias_softcap_sm80_enabled, 1);
  const flashspan::test::ScopedSwitch triple(set_sdpa_dbias_softcap_dropout_enabled, 1);
  static const DType kMaskTypes[] = {DType::kUInt8, DType::kFloat16, DType::kBFloat16, DType::kFloat32};
  for (int form = 1; form <= 12; ++form) {
    Case c = dbias_softcap_case(form, 16701, {64, 96, 128, 256});
    const float prob = 0.1f + 0.2f * float(form % 3);
    if (form % 2 == 0) {
      c.dropout_p = prob;
      c.dropout_seed = 1000 + 37 * form - (form % 3 == 0 ? 5000 : 0);
      c.dropout_offset = 11 * form;
      c.dropout_i64 = form % 4 == 0;
    } else {
      c.dropout_mask = 1 + (form % 16);
      c.dropout_mask_dtype = kMaskTypes[(form / 2) % 4];
      c.dropout_mask_strided = form % 5 == 0;
      c.dropout_scale = 1.0f / (1.0f - prob);
    }
    if (form == 7) {  // H_k != H_v: a dK pass and a dV pass
      c.Hq = 6;
      c.Hk = 2;
      c.Hv = 3;
    }
    run_case_expect_sm90(c, /*backward=*/true, kAnyLaunches, 0);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, Sm90BackwardModsDeterministicIsBitwiseReproducible) {
  // The deterministic sm90 backward with modifiers: dQ, dK, dV, dBias, dSink, dgate bitwise equal
  // over three runs. D = 64: ALiBi, a bias with dBias, sinks, the gate; D = 128: softcap, ALiBi,
  // sinks, the gate, a bias; padded samples, GQA, bottom-right causal, several key blocks a sample.
  REQUIRE_SM90();
  for (int64_t d : {64, 128}) {
    Case c = sm90_bitwise_case(d, 3300 + uint64_t(d));
    c.alibi = true;
    c.sinks = true;
    c.gate = true;
    c.bias = d == 64 ? 1 + 1 : 1 + 4;
    c.dbias = d == 64;
    if (d == 128) c.softcap = 6.0f;
    expect_sm90_backward_bitwise_reproducible(c, /*mods_kernel=*/true);
  }
}

TEST(SdpaGpu, Sm90BackwardModsFallsBackToSm80) {
  // With the modifiers' part on, what the sm90 backward does not run keeps the sm80 kernels (and is
  // right): a block_mask with softcap, packed THD with sinks and a sample without keys, (192, 128)
  // with ALiBi, H_k != H_v with neither a multiple of the other (H_q = 6, H_k = 2, H_v = 3) with sinks,
  // Philox dropout with a bias.
  REQUIRE_SM90();
  const ForceSm90WithMods force;
  const ForceSdpaSm90Thd thd_off(0);  // (with it: the Sm90*Thd* tests)
  set_sdpa_sm90_dropout_enabled(0);  // (with it: the Sm90Dropout* tests)
  struct Restore {
    ~Restore() { set_sdpa_sm90_dropout_enabled(-1); }
  } restore;
  for (int i = 0; i < 5; ++i) {
    Case c = sm90_case(14990 + uint64_t(i));
    c.kind_q = c.kind_kv = Kind::kBhsd;
    c.max_logit = false;
    switch (i) {
      case 0: c.block_mask = 2; c.softcap = 5.0f; break;
      case 1: c.kind_q = c.kind_kv = Kind::kThd; c.lengths = 1; c.zero_kv_sample = true; c.sinks = true; break;
      case 2: c.Dqk = 192; c.Dv = 128; c.alibi = true; c.has_right = true; c.right = 0; break;
      case 3: c.Hq = 6; c.Hk = 2; c.Hv = 3; c.sinks = true; break;
      default: c.bias = 1 + 2; c.dbias = true; c.dropout_p = 0.25f; c.dropout_seed = 77; c.dropout_offset = 3; break;
    }
    run_case_expect_sm90(c, /*backward=*/true, kAnyLaunches, 0);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, Sm90BackwardModsOffRunsSm80) {
  // The modifiers' part of the sm90 backward off (FLASHSPAN_SM90_SDPA_BWD_MODS=0's switch): the
  // backward of such calls runs the sm80 kernels, the sm90 forward with modifiers before it.
  REQUIRE_SM90();
  const ForceSdpaSm90 fwd(1);
  const ForceSdpaSm90Mods fwd_mods(1);
  const ForceSdpaBwdSm90 bwd(1);
  const ForceSdpaBwdSm90Mods bwd_mods(0);
  for (uint64_t seed = 14801; seed <= 14810; ++seed) {
    run_case_expect_sm90(sm90_bwd_mods_case(seed), /*backward=*/true, kAnyLaunches, 0);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, Sm90BackwardModsSanitizerSmall) {
  // Small cases of the sm90 backward with modifiers for compute-sanitizer memcheck (scripts/
  // gpu_check.sh), on sm90_bwd_small_case's shapes: NaN-padded samples (one without keys), GQA,
  // bottom-right causal on the (64, 64) kernel with softcap, ALiBi, sinks, the gate and a float32
  // bias broadcast over B; D = 96 on the (128, 128) kernel, a window, a 16-bit bias over keys only
  // (padded strides) with dBias and sinks; a dense MQA case deterministic with ALiBi, a full bias
  // with dBias and the gate.
  REQUIRE_SM90();
  const ForceSm90WithMods force;
  for (int i = 0; i < 3; ++i) {
    Case c = sm90_bwd_small_case(i);
    c.seed = 14700 + uint64_t(i);
    c.scale = 2.0f / std::sqrt(float(c.Dqk));
    switch (i) {
      case 0:
        c.softcap = 4.0f;
        c.alibi = true;
        c.sinks = true;
        c.gate = true;
        c.bias = 1 + 1;
        c.bias_f32 = true;
        break;
      case 1:
        c.bias = 1 + 8;
        c.bias_strided = true;
        c.dbias = true;
        c.sinks = true;
        break;
      default:
        c.alibi = true;
        c.bias = 1;
        c.dbias = true;
        c.gate = true;
        break;
    }
    run_sm90_bwd_mods_case(c);
  }
}

// ---------------------------------------------------------------------------
// Dropout on the sm90 SDPA kernels (kernel_fwd_sm90.cuh sdpa_fwd_kernel_sm90 with AnalyticDropSourceSm90,
// kernel_bwd_mods_sm90.cuh sdpa_bwd_mods_kernel_sm90<..., true>; by default since PERF_LOG v2.23,
// FLASHSPAN_SM90_SDPA_DROPOUT=0 off: sdpa_sm90_dropout_enabled), Philox and the caller's mask: forced on
// here (ForceSm90WithDropout, with the sm90 forward and backward and their modifiers);
// sm90::sdpa_fwd_drop_launches / sdpa_bwd_drop_launches say the dropout kernels ran. Passed on an H200
// in two sessions (2026-12-03).
// ---------------------------------------------------------------------------

struct ForceSm90Dropout {
  explicit ForceSm90Dropout(int on) { set_sdpa_sm90_dropout_enabled(on); }
  ~ForceSm90Dropout() { set_sdpa_sm90_dropout_enabled(-1); }
};

// The switches of an sm90 forward and backward with dropout (and modifiers), for a scope.
struct ForceSm90WithDropout {
  ForceSm90WithMods mods;
  ForceSm90Dropout dropout{1};
};

// sm90_case (masks in both alignments, padding with a sample without keys, GQA / MQA, layouts, S up
// to 1100 on odd seeds, deterministic at random) with dropout: Philox on even seeds (probabilities 0,
// 0.1, 0.25, 0.5, 0.9; int32 / int64 seed and offset, seeds of both signs, rng_dump on half), the
// caller's mask on odd ones (every broadcast form; uint8, float16, bfloat16, float32; padded strides on
// a third; scale 1 / (1 - p)); head dims up to 128 with 32 and 96 on a quarter; softcap, a bias, sinks or
// ALiBi (the modifiers' run-time flags in the same kernels) on two thirds.
Case sm90_dropout_case(uint64_t seed) {
  Case c = sm90_case(seed);
  std::mt19937_64 rng(seed * 977 + 3);
  if (rng() % 4 == 0) c.Dqk = c.Dv = rng() % 2 ? 32 : 96;
  static const float kProbs[] = {0.0f, 0.1f, 0.25f, 0.5f, 0.9f};
  const float prob = kProbs[rng() % 5];
  if (seed % 2 == 0) {
    c.dropout_p = prob;
    c.dropout_p_zero = prob == 0.0f;
    c.dropout_seed = int64_t(rng() % 100000) - (rng() % 3 == 0 ? 50000 : 0);
    c.dropout_offset = int64_t(rng() % 1000);
    c.dropout_i64 = rng() % 2;
    c.rng_dump = rng() % 2;
  } else {
    static const DType kMaskTypes[] = {DType::kUInt8, DType::kFloat16, DType::kBFloat16, DType::kFloat32};
    c.dropout_mask = 1 + int(rng() % 16);
    c.dropout_mask_dtype = kMaskTypes[rng() % 4];
    c.dropout_mask_strided = rng() % 3 == 0;
    c.dropout_scale = 1.0f / (1.0f - prob);
  }
  switch (rng() % 6) {
    case 0: c.softcap = float(2 + rng() % 40) * 0.5f; break;
    case 1: c.bias = 1 + int(rng() % 16); c.bias_f32 = rng() % 2; break;
    case 2: c.sinks = true; c.max_logit = false; break;
    case 3: c.alibi = true; c.has_right = true; c.right = 0; break;
    default: break;
  }
  return c;
}

// Runs c on the sm90 kernels with dropout (switches forced by the caller): the forward alone, or
// forward and backward (`chain`: the backward takes the GPU forward's O and LSE); the launch counters
// say the dropout kernels ran.
void run_sm90_dropout_case(const Case& c, bool backward, bool chain = false) {
  const int64_t fd0 = sm90::sdpa_fwd_drop_launches(), bd0 = sm90::sdpa_bwd_drop_launches();
  run_case_expect_sm90(c, backward, 1, backward ? 1 : kAnyLaunches, chain);
  EXPECT_EQ(sm90::sdpa_fwd_drop_launches(), fd0 + 1) << "forward kernel of " << c.str();
  if (backward) {
    EXPECT_EQ(sm90::sdpa_bwd_drop_launches(), bd0 + 1) << "backward kernel of " << c.str();
  }
}

TEST(SdpaGpu, Sm90DropoutForwardRandom) {
  // O, the LSE (every element in the row sums), rng_dump (bitwise the reference's) against the CPU
  // reference, 60 cases; H_k != H_v on every fourth (H_q = 8, H_k = 2, H_v = 4 or 1: the forward takes it,
  // the keep mask is the query head's).
  REQUIRE_SM90();
  const ForceSm90WithDropout force;
  for (uint64_t seed = 15001; seed <= 15060; ++seed) {
    Case c = sm90_dropout_case(seed);
    if (seed % 4 == 0) {
      c.Hq = 8;
      c.Hk = 2;
      c.Hv = seed % 8 == 0 ? 4 : 1;
    }
    run_sm90_dropout_case(c, /*backward=*/false);
    if (::testing::Test::HasFailure()) return;
  }
}

// Forward and backward (dQ, dK, dV and, with sinks, dSink against the reference's): 60 cases in two
// tests (gtest shards run them side by side), every third backward on the GPU forward's O and LSE,
// deterministic on every other pair of seeds.
void run_sm90_dropout_bwd_cases(uint64_t first, uint64_t last) {
  const ForceSm90WithDropout force;
  for (uint64_t seed = first; seed <= last; ++seed) {
    Case c = sm90_dropout_case(seed);
    c.deterministic = (seed / 2) % 2;
    run_sm90_dropout_case(c, /*backward=*/true, /*chain=*/seed % 3 == 0);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, Sm90DropoutBackwardRandom1) {
  REQUIRE_SM90();
  run_sm90_dropout_bwd_cases(15101, 15130);
}
TEST(SdpaGpu, Sm90DropoutBackwardRandom2) {
  REQUIRE_SM90();
  run_sm90_dropout_bwd_cases(15131, 15160);
}

// The Philox-only dropout backward kernel (sm90::bwd_dropout_philox_enabled: 1 it, 0 the modifiers' dropout
// kernel) forced for a scope.
struct ForceBwdDropoutPhilox {
  explicit ForceBwdDropoutPhilox(int on) { sm90::set_bwd_dropout_philox_enabled(on); }
  ~ForceBwdDropoutPhilox() { sm90::set_bwd_dropout_philox_enabled(-1); }
};

TEST(SdpaGpu, Sm90DropoutBackwardKernelForms) {
  // Philox dropout without modifiers (the calls sdpa_bwd_drop_kernel_sm90 takes; sinks and the gate are not the
  // main loop's) on each kernel (the Philox-only one and the modifiers' one), forward and backward against the
  // CPU reference (passed on an H100, PERF_LOG v2.72, with a third form since removed): multi-block shapes (GQA,
  // padding by cu_seq_len with a sample without keys, bottom-right causal, a window, no band; items of several
  // steps, stages and items) at D = 64, 128 and 40, and random
  // shapes (sm90_dropout_case's Philox seeds, modifiers taken out); deterministic on odd cases, every third
  // backward on the GPU forward's O and LSE. sdpa_bwd_drop_philox_launches says which kernel ran.
  REQUIRE_SM90();
  const ForceSm90WithDropout force;
  for (int form = 0; form <= 1; ++form) {
    const ForceBwdDropoutPhilox kernel_form(form);
    for (int f = 0; f < 10; ++f) {
      Case c;
      if (f < 5) {
        c = multi_block_case(15300 + uint64_t(f), f, f % 3 == 0 ? 64 : f % 3 == 1 ? 128 : 40);
        c.dropout_p = f == 2 ? 0.9f : f == 3 ? 0.5f : 0.1f;
        c.dropout_seed = 1000 * f - 1500;
        c.dropout_offset = 7 * f;
        c.dropout_i64 = f % 2;
        c.rng_dump = f == 1;
        if (f == 3) c.has_right = c.bottom_right = false;  // no band: every step full
        if (f == 4) {
          c.has_left = true;  // a window
          c.left = 120;
          c.sinks = true;
          c.gate = true;
        }
      } else {
        c = sm90_dropout_case(15400 + 2 * uint64_t(f));  // even: Philox
        c.softcap = 0.0f;
        c.bias = 0;
        c.alibi = false;
        c.dropout_p_zero = false;
        if (c.dropout_p == 0.0f) c.dropout_p = 0.25f;
      }
      c.deterministic = f % 2;
      const int64_t ph0 = sm90::sdpa_bwd_drop_philox_launches();
      run_sm90_dropout_case(c, /*backward=*/true, /*chain=*/f % 3 == 0);
      EXPECT_EQ(sm90::sdpa_bwd_drop_philox_launches(), ph0 + form)
          << "the Philox-only kernel " << (form != 0 ? "did not run " : "ran ") << c.str();
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(SdpaGpu, Sm90DropoutEachForm) {
  // Multi-block shapes (GQA, padding by cu_seq_len with a sample without keys, bottom-right causal or a
  // window) for each form: Philox at p = 0, 0.5 and 0.9 (rng_dump), the mask in each dtype and a few
  // broadcast forms; D = 64, 128 and 40; forward and backward, deterministic on odd f.
  REQUIRE_SM90();
  const ForceSm90WithDropout force;
  for (int f = 0; f < 8; ++f) {
    Case c = multi_block_case(15200 + uint64_t(f), f, f % 3 == 0 ? 64 : f % 3 == 1 ? 128 : 40);
    if (f == 5) {
      c.has_left = true;
      c.left = 90;
    }
    c.deterministic = f % 2;
    switch (f) {
      case 0: c.dropout_p_zero = true; c.dropout_seed = 5; c.rng_dump = true; break;
      case 1: c.dropout_p = 0.5f; c.dropout_seed = -77; c.dropout_offset = 1; c.dropout_i64 = true; c.rng_dump = true; break;
      case 2: c.dropout_p = 0.9f; c.dropout_seed = 123456789; c.dropout_offset = 1000; c.rng_dump = true; break;
      case 3: c.dropout_mask = 1; c.dropout_mask_dtype = DType::kUInt8; c.dropout_scale = 1.5f; break;  // [B, H_q, S_q, S_kv]
      case 4: c.dropout_mask = 1 + 1 + 2; c.dropout_mask_dtype = DType::kFloat16; c.dropout_scale = 2.0f; break;  // [1, 1, S_q, S_kv]
      case 5: c.dropout_mask = 1 + 4; c.dropout_mask_dtype = DType::kBFloat16; c.dropout_mask_strided = true; break;  // [B, H_q, 1, S_kv]
      case 6: c.dropout_mask = 1 + 8; c.dropout_mask_dtype = DType::kFloat32; c.dropout_scale = 1.25f; break;  // [B, H_q, S_q, 1]
      default:  // Philox with every modifier of the kernels besides
        c.dropout_p = 0.25f;
        c.dropout_seed = 99;
        c.dropout_offset = 3;
        c.softcap = 4.0f;
        c.alibi = true;
        c.sinks = true;
        c.bias = 1 + 2;
        c.gate = true;
        break;
    }
    run_sm90_dropout_case(c, /*backward=*/true);
    if (::testing::Test::HasFailure()) return;
  }
}

// The keep mask the kernels apply, read back through their outputs (Philox): Q = 0 makes every logit
// 0, so P = 1 / len_kv on every key of a sample (no band). With V one-hot on key chunk cc (V[j, d] = 1
// for j = cc D + d), O[i, d] = P m(i, cc D + d): nonzero exactly where element (i, cc D + d) is kept
// (the forward's fragment). With dO one-hot on query chunk rr (dO[i, d] = 1 for i = rr D + d), dV[j, d]
// = P m(rr D + d, j): nonzero exactly where element (rr D + d, j) is kept (the backward's transposed
// fragment; MHA, so dV sums no heads). Each against core/philox.h on the host (the CPU reference's
// rule) for every element inside the samples, for the sm90 and the sm80 kernels (so the two families'
// masks are equal bit for bit), and the forward's rng_dump of the same calls against it too.
int64_t keep_mask_mismatches(const Problem& p, const Tensor& out, bool backward, int64_t chunk,
                             std::vector<uint8_t>* dump) {
  const Case& c = p.c;
  const uint32_t thr = dropout_threshold(c.dropout_p);
  const std::vector<double> got = Tensor::values(out.download(), out.dtype);
  std::vector<double> dumped;
  if (dump != nullptr) dumped = Tensor::values(*dump, DType::kFloat32);
  int64_t bad = 0;
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t h = 0; h < c.Hq; ++h) {
      for (int64_t x = 0; x < (backward ? p.len_kv[size_t(b)] : p.len_q[size_t(b)]); ++x) {
        for (int64_t d = 0; d < c.Dv; ++d) {
          const int64_t i = backward ? chunk * c.Dv + d : x, j = backward ? x : chunk * c.Dv + d;
          if (i >= p.len_q[size_t(b)] || j >= p.len_kv[size_t(b)]) continue;
          const bool want = dropout_keep(uint64_t(c.dropout_seed), uint64_t(c.dropout_offset), uint32_t(b * c.Hq + h),
                                         uint32_t(i), uint32_t(j), thr);
          const bool kept = got[size_t(out.lay.at(b, h, x, d))] != 0.0;
          bad += kept != want;
          if (dump != nullptr) bad += (dumped[size_t(p.dump.lay.at(b, h, i, j))] != 0.0) != want;
        }
      }
    }
  }
  return bad;
}

// The sm80 forward's Philox form (sdpa_dropout_o_scaled_enabled: 1 / (1 - p) on O, on by default; 0: on each P)
// forced for a scope, the environment's answer again after it.
struct ForceDropoutOScale {
  explicit ForceDropoutOScale(int on) { set_sdpa_dropout_o_scaled_enabled(on); }
  ~ForceDropoutOScale() { set_sdpa_dropout_o_scaled_enabled(-1); }
};

// The keep mask read off the outputs of both families (V / dO one-hot columns, Q = 0: O and dV hold the kept
// elements' multipliers), the sm90 kernels against the sm80 ones and the reference's rng_dump.
void check_keep_mask_both_families() {
  const ForceSm90WithMods mods;
  for (int64_t dim : {128, 64, 32}) {
    Case c;
    c.seed = 15300 + uint64_t(dim);
    c.dtype = dim == 64 ? DType::kFloat16 : DType::kBFloat16;
    c.B = 2;
    c.Hq = c.Hk = 2;
    c.Sq = 200;  // two 128-row forward blocks, four 64-row backward blocks
    c.Skv = 300;  // three 128-key blocks
    c.Dqk = c.Dv = dim;
    c.lengths = 1;  // sample 1 shorter (random lengths)
    c.dropout_p = 0.3f;
    c.dropout_seed = 1234567 + dim;
    c.dropout_offset = 11;
    c.dropout_i64 = dim != 64;
    c.rng_dump = true;
    SCOPED_TRACE(c.str());
    auto p = make_problem(c);
    for (int64_t b = 0; b < c.B; ++b)  // Q = 0 inside the samples (the NaN padding stays)
      for (int64_t h = 0; h < c.Hq; ++h)
        for (int64_t i = 0; i < p->len_q[size_t(b)]; ++i)
          for (int64_t d = 0; d < c.Dqk; ++d) p->q.set(p->q.lay.at(b, h, i, d), 0.0);
    p->q.upload();
    for (int on : {1, 0}) {
      const ForceSm90Dropout drop(on);
      // Forward: one call per key chunk.
      for (int64_t cc = 0; cc * c.Dv < c.Skv; ++cc) {
        for (int64_t b = 0; b < c.B; ++b)
          for (int64_t h = 0; h < c.Hk; ++h)
            for (int64_t j = 0; j < p->len_kv[size_t(b)]; ++j)
              for (int64_t d = 0; d < c.Dv; ++d) p->v.set(p->v.lay.at(b, h, j, d), j == cc * c.Dv + d ? 1.0 : 0.0);
        p->v.upload();
        p->o.poison_device();
        p->dump.poison_device();
        const int64_t f0 = sm90::sdpa_fwd_drop_launches(), s0 = sm90::sdpa_fwd_launches();
        run_forward(*p, /*cuda=*/true, false);
        EXPECT_EQ(sm90::sdpa_fwd_drop_launches(), f0 + on) << "key chunk " << cc;
        EXPECT_EQ(sm90::sdpa_fwd_launches(), s0 + on) << "key chunk " << cc;
        std::vector<uint8_t> dump = p->dump.download();
        EXPECT_EQ(keep_mask_mismatches(*p, p->o, false, cc, &dump), 0)
            << (on ? "sm90" : "sm80") << " forward, key chunk " << cc;
      }
      // Backward: the reference's O and LSE (P = 1 / len_kv), one call per query chunk.
      run_forward(*p, /*cuda=*/false, false);
      poison_padding(p->o, p->len_q);
      poison_padding(p->stats, p->len_q);
      p->o.upload();
      p->stats.upload();
      for (int64_t rr = 0; rr * c.Dv < c.Sq; ++rr) {
        for (int64_t b = 0; b < c.B; ++b)
          for (int64_t h = 0; h < c.Hq; ++h)
            for (int64_t i = 0; i < p->len_q[size_t(b)]; ++i)
              for (int64_t d = 0; d < c.Dv; ++d) p->dO.set(p->dO.lay.at(b, h, i, d), i == rr * c.Dv + d ? 1.0 : 0.0);
        p->dO.upload();
        for (Tensor* t : {&p->dq, &p->dk, &p->dv}) t->poison_device();
        const int64_t b0 = sm90::sdpa_bwd_drop_launches(), s0 = sm90::sdpa_bwd_launches();
        run_backward(*p, /*cuda=*/true);
        EXPECT_EQ(sm90::sdpa_bwd_drop_launches(), b0 + on) << "query chunk " << rr;
        EXPECT_EQ(sm90::sdpa_bwd_launches(), s0 + on) << "query chunk " << rr;
        EXPECT_EQ(keep_mask_mismatches(*p, p->dv, true, rr, nullptr), 0)
            << (on ? "sm90" : "sm80") << " backward, query chunk " << rr;
      }
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(SdpaGpu, Sm90DropoutKeepMaskIsSm80s) {
  REQUIRE_SM90();
  check_keep_mask_both_families();
}

TEST(SdpaGpu, DropoutFormsKeepMask) {
  // Both forms of the sm80 forward's Philox dropout (1 / (1 - p) on O, the default since PERF_LOG v2.71, or on each
  // P) keep the mask bit for bit: the sm90 kernels' against the sm80 ones'.
  REQUIRE_SM90();
  for (int o_scaled : {1, 0}) {
    SCOPED_TRACE(o_scaled ? "1 / (1 - p) on O" : "1 / (1 - p) on each P");
    const ForceDropoutOScale form(o_scaled);
    check_keep_mask_both_families();
    if (::testing::Test::HasFailure()) return;
  }
}


TEST(SdpaGpu, Sm90DropoutOffRunsSm80) {
  // The dropout switch off (FLASHSPAN_SM90_SDPA_DROPOUT=0's answer), the rest on: dropout calls keep the
  // sm80 kernels in both directions (and are right there, both forms).
  REQUIRE_SM90();
  const ForceSm90WithMods mods;
  const ForceSm90Dropout off(0);
  for (uint64_t seed = 15101; seed <= 15108; ++seed) {
    run_case_expect_sm90(sm90_dropout_case(seed), /*backward=*/true, 0, 0);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, Sm90DropoutSanitizerSmall) {
  // Small cases of the dropout kernels for compute-sanitizer memcheck (scripts/gpu_check.sh), on
  // sm90_bwd_small_case's shapes (NaN-padded samples, one without keys, GQA, bottom-right causal on the
  // (64, 64) kernel; D = 96 with a window on the (128, 128) kernel; a dense MQA case deterministic):
  // Philox with rng_dump and softcap; a uint8 mask broadcast over B with padded strides and a bias; a
  // float32 mask broadcast over keys with sinks; then Philox alone on the first two shapes, on the Philox-only
  // backward kernel (sdpa_bwd_drop_kernel_sm90) and on the modifiers' one. Forward and backward.
  REQUIRE_SM90();
  const ForceSm90WithDropout force;
  for (int i = 0; i < 5; ++i) {
    Case c = sm90_bwd_small_case(i % 3);
    c.seed = 15400 + uint64_t(i);
    const ForceBwdDropoutPhilox kernel_form(i == 4 ? 0 : 1);
    const int64_t ph0 = sm90::sdpa_bwd_drop_philox_launches();
    if (i >= 3) {
      c.dropout_p = 0.2f;
      c.dropout_seed = 7 + i;
      c.dropout_offset = 3;
    }
    switch (i) {
      case 3:
      case 4:
        break;
      case 0:
        c.dropout_p = 0.3f;
        c.dropout_seed = 42;
        c.dropout_offset = 5;
        c.rng_dump = true;
        c.softcap = 4.0f;
        break;
      case 1:
        c.dropout_mask = 1 + 1;
        c.dropout_mask_dtype = DType::kUInt8;
        c.dropout_mask_strided = true;
        c.dropout_scale = 1.25f;
        c.bias = 1 + 8;
        break;
      default:
        c.dropout_mask = 1 + 8;
        c.dropout_mask_dtype = DType::kFloat32;
        c.dropout_scale = 2.0f;
        c.sinks = true;
        break;
    }
    run_sm90_dropout_case(c, /*backward=*/true);
    EXPECT_EQ(sm90::sdpa_bwd_drop_philox_launches(), ph0 + (i == 3 ? 1 : 0)) << "case " << i << ": " << c.str();
  }
}

// ---------------------------------------------------------------------------
// H_k != H_v on the sm90 backward (kernel_bwd_sm90.cuh AnalyticSourceBwdSm90): work items of the query
// heads that share one K head and one V head, their partial dK / dV in slots summed per head by
// sdpa_bwd_dkdv_sum_kernel_sm90; every instantiation (pure-mask, modifiers, dropout, every head dim).
// ---------------------------------------------------------------------------

// sm90_case (masks in both alignments: none, causal, bands, windows, either side alone; layouts, dtypes,
// S up to 1100 on odd seeds) with H_k != H_v, one a multiple of the other, in turn: H_q = 8 with
// (H_k, H_v) = (1, 2), (2, 4), (4, 1), (8, 2), (2, 8), (1, 8), (8, 1), (4, 8), (8, 4) (one side MHA-like
// on the last five), H_q = 4 with (4, 2) and (1, 4), H_q = 16 with (16, 4); padding (seq_len /
// cu_seq_len, NaN-poisoned padding rows) with a sample without keys on every fourth seed; head dims 64,
// 96 and 128, (192, 128) on one seed in ten (the 64 x 96 tile on half of those, the column-split 64 x 64
// one on the others) and (256, 256) on another; on odd seeds (head dims up to 128) score modifiers at
// random (softcap, ALiBi, sinks with dSink, a bias with dBias where softcap allows it, the gate: at
// least one); deterministic on every third seed.
Case sm90_bwd_hk_ne_hv_case(uint64_t seed) {
  Case c = sm90_case(seed);
  std::mt19937_64 rng(seed * 733 + 5);
  static const int64_t heads[][3] = {{8, 1, 2}, {8, 2, 4}, {8, 4, 1}, {8, 8, 2}, {8, 2, 8}, {8, 1, 8},
                                     {8, 8, 1}, {8, 4, 8}, {8, 8, 4}, {4, 4, 2}, {4, 1, 4}, {16, 16, 4}};
  const int64_t* h = heads[seed % 12];
  c.Hq = h[0];
  c.Hk = h[1];
  c.Hv = h[2];
  static const int64_t dims[] = {64, 96, 128};
  c.Dqk = c.Dv = dims[rng() % 3];
  if (seed % 10 == 3) std::tie(c.Dqk, c.Dv) = std::pair<int64_t, int64_t>{192, 128};
  if (seed % 10 == 7) c.Dqk = c.Dv = 256;
  if (seed % 4 == 0) {
    c.B = std::max<int64_t>(c.B, 2);
    c.lengths = 1 + int(seed / 4 % 2);
    c.zero_kv_sample = true;
  }
  c.deterministic = seed % 3 == 0;
  if (c.Dqk <= 128 && seed % 2) {
    if (rng() % 2) c.softcap = float(4 + rng() % 20) * 0.5f;
    if (rng() % 3 == 0) {
      c.alibi = true;
      c.has_right = true;
      c.right = 0;
    }
    c.sinks = rng() % 3 == 0;
    if (rng() % 2) {
      c.bias = 1 + int(rng() % 16);
      c.bias_f32 = rng() % 2;
      c.dbias = c.softcap == 0;  // (refused together)
    }
    c.gate = rng() % 4 == 0;
    if (c.softcap == 0 && !c.alibi && !c.sinks && !c.bias && !c.gate) c.softcap = 8.0f;
    c.scale = 3.0f / std::sqrt(float(c.Dqk));  // larger scores: the modifiers matter
    if (c.sinks) c.max_logit = false;          // refused together on CUDA tensors
  }
  return c;
}

// The (192, 128) backward's tile for a scope: 1 the 64 x 96 one, 0 the column-split 64 x 64 one.
struct ForceWide192To {
  explicit ForceWide192To(int on) { sm90::set_bwd_wide192_enabled(on); }
  ~ForceWide192To() { sm90::set_bwd_wide192_enabled(-1); }
};

TEST(SdpaGpu, Sm90BackwardHkNeHv) {
  // sm90_bwd_hk_ne_hv_case's 40 cases forward and backward on the sm90 kernels (the launch counters say
  // both ran there, and the backward's kernel: with modifiers when the case has softcap, ALiBi or a bias),
  // dQ, dK, dV (and dSink, dgate, dBias) against the CPU reference on NaN-poisoned outputs; every third
  // backward on the GPU forward's O and LSE.
  REQUIRE_SM90();
  const ForceSm90WithMods force;
  for (uint64_t seed = 15301; seed <= 15340; ++seed) {
    const Case c = sm90_bwd_hk_ne_hv_case(seed);
    ASSERT_NE(c.Hk, c.heads_v()) << c.str();
    std::optional<ForceWide192To> tile;
    if (c.Dqk == 192) tile.emplace(seed % 20 == 3 ? 1 : 0);
    run_sm90_bwd_mods_case(c, /*chain=*/seed % 3 == 1);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, Sm90BackwardHkNeHvDropout) {
  // H_k != H_v with dropout on the sm90 kernels with dropout (their switch forced on):
  // sm90_dropout_case's cases (Philox or the caller's mask, modifiers on two thirds) with H_q = 8 and
  // (H_k, H_v) = (2, 4), (4, 1), (1, 8), (8, 2) in turn, deterministic on every other seed.
  REQUIRE_SM90();
  const ForceSm90WithDropout force;
  static const int64_t heads[][2] = {{2, 4}, {4, 1}, {1, 8}, {8, 2}};
  for (uint64_t seed = 15351; seed <= 15362; ++seed) {
    Case c = sm90_dropout_case(seed);
    c.Hq = 8;
    c.Hk = heads[seed % 4][0];
    c.Hv = heads[seed % 4][1];
    c.deterministic = seed % 2;
    run_sm90_dropout_case(c, /*backward=*/true, /*chain=*/seed % 3 == 0);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, Sm90BackwardHkNeHvDeterministicIsBitwiseReproducible) {
  // The deterministic sm90 backward of H_k != H_v: dQ, dK, dV (and dSink, dBias) bitwise equal over three
  // runs. D = 64: H_q = 8, H_k = 2, H_v = 4 (dK summed over two items), pure mask; D = 128: H_k = 4, H_v = 1
  // (dV summed over four items) with ALiBi, sinks and a bias with dBias; padded samples, bottom-right
  // causal, several key blocks a sample.
  REQUIRE_SM90();
  for (int64_t d : {64, 128}) {
    Case c = sm90_bitwise_case(d, 3500 + uint64_t(d));
    c.Hk = d == 64 ? 2 : 4;
    c.Hv = d == 64 ? 4 : 1;
    if (d == 128) {
      c.alibi = true;
      c.sinks = true;
      c.bias = 1 + 1;
      c.dbias = true;
    }
    expect_sm90_backward_bitwise_reproducible(c, /*mods_kernel=*/false);
  }
}

TEST(SdpaGpu, Sm90BackwardHkNeHvSanitizerSmall) {
  // Small H_k != H_v cases of the sm90 backward for compute-sanitizer memcheck (scripts/gpu_check.sh), on
  // sm90_bwd_small_case's shapes (NaN-padded samples, one without keys, bottom-right causal; a window with
  // padded strides; a dense case deterministic): H_q = 4 with (H_k, H_v) = (2, 4) pure mask on the (64, 64)
  // kernel, (1, 2) with softcap and sinks at D = 96, (4, 1) with ALiBi and a bias with dBias at D = 128.
  REQUIRE_SM90();
  const ForceSm90WithMods force;
  static const int64_t heads[][2] = {{2, 4}, {1, 2}, {4, 1}};
  for (int i = 0; i < 3; ++i) {
    Case c = sm90_bwd_small_case(i);
    c.seed = 15400 + uint64_t(i);
    c.Hq = 4;
    c.Hk = heads[i][0];
    c.Hv = heads[i][1];
    if (i == 1) {
      c.softcap = 4.0f;
      c.sinks = true;
      c.max_logit = false;
    } else if (i == 2) {
      c.alibi = true;
      c.bias = 1;
      c.dbias = true;
    }
    run_sm90_bwd_mods_case(c);
  }
}

// A random case with issue 24's score modifiers on top (seeded): softcap, ALiBi (its masks made
// causal), sinks (no max_logit with them: the GPU refuses the pair), the host scale tensor,
// H_v != H_k (the backward's two dK/dV passes).
Case score_mod_case(uint64_t seed) {
  Case c = random_case(seed);
  std::mt19937_64 rng(seed * 31 + 5);
  if (rng() % 2) c.softcap = float(2 + rng() % 40) * 0.5f;
  if (rng() % 3 == 0) {
    c.alibi = true;
    c.has_right = true;
    c.right = 0;
  }
  c.sinks = rng() % 2;
  if (c.sinks) c.max_logit = false;
  c.scale_tensor = rng() % 3 == 0;
  // Larger scales make softcap and the sinks matter.
  if (rng() % 2) c.scale = 3.0f / std::sqrt(float(c.Dqk));
  if (rng() % 4 == 0 && c.Hq % 2 == 0 && c.Hk > 0) {
    // H_v != H_k, both dividing H_q.
    c.Hv = c.Hk == c.Hq ? c.Hq / 2 : c.Hq;
  }
  if (c.Hv == c.Hk) c.Hv = 0;
  return c;
}

TEST(SdpaGpu, ScoreModifiersRandom) {
  // softcap (forward and its derivative), ALiBi, sinks with dSink, host attn_scale tensor, H_k != H_v.
  REQUIRE_GPU();
  for (uint64_t seed = 5001; seed <= 5080; ++seed) {
    run_case(score_mod_case(seed));
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, ScoreModifiersEachAlone) {
  // Each feature alone on one multi-block shape (GQA, padding, both alignments for the band).
  REQUIRE_GPU();
  for (int f = 0; f < 6; ++f)
    for (int det = 0; det < 2; ++det) {
      Case c;
      c.seed = 6000 + 2 * f + det;
      c.B = 2;
      c.Hq = 4;
      c.Hk = 2;
      c.Sq = 200;
      c.Skv = 300;
      c.has_right = true;
      c.bottom_right = true;
      c.lengths = 1;
      c.deterministic = det;
      c.scale = 2.0f / 8.0f;
      switch (f) {
        case 0: c.softcap = 3.0f; break;
        case 1: c.alibi = true; break;
        case 2: c.sinks = true; break;
        case 3: c.scale_tensor = true; break;
        case 4: c.Hv = 4; break;
        default: c.softcap = 5.0f; c.alibi = true; c.sinks = true; c.kind_q = c.kind_kv = Kind::kThd; break;
      }
      run_case(c);
      if (::testing::Test::HasFailure()) return;
    }
}

// ---------------------------------------------------------------------------
// The sm80 SDPA kernels' two instantiations (launch_sdpa_{fwd,bwd}_sm80.cu): a call without the
// main loops' features (params.h sdpa_fwd_has_features / sdpa_bwd_has_features) runs the
// mask-only kernels (the flex kernels' loops), the others the features kernels; the sm80
// launchers' counters of mask-only launches say which ran.
// ---------------------------------------------------------------------------

// Forces the features kernels for a scope (1), or not (0); the environment's answer after it.
struct ForceSm80Features {
  explicit ForceSm80Features(int on) { sm80::set_sdpa_sm80_features_forced(on); }
  ~ForceSm80Features() { sm80::set_sdpa_sm80_features_forced(-1); }
};

// Case c on the sm80 kernels (the sm90 ones forced off), features kernels forced or not; expects
// fwd_mask_only / bwd_mask_only launches of the mask-only kernels (0 or 1 each).
void run_sm80_instantiation(const Case& c, int forced, int fwd_mask_only, int bwd_mask_only) {
  SCOPED_TRACE(testing::Message() << "features forced " << forced);
  const ForceSdpaSm90 fwd90(0);
  const ForceSdpaBwdSm90 bwd90(0);
  const ForceSm80Features force(forced);
  const ForceSdpaDecode no_decode(0);
  const int64_t f0 = sm80::sdpa_fwd_mask_only_launches(), b0 = sm80::sdpa_bwd_mask_only_launches();
  run_case(c);
  EXPECT_EQ(sm80::sdpa_fwd_mask_only_launches() - f0, fwd_mask_only) << "forward instantiation of " << c.str();
  EXPECT_EQ(sm80::sdpa_bwd_mask_only_launches() - b0, bwd_mask_only) << "backward instantiation of " << c.str();
}

// Pure-mask calls (random_case: every mask in both alignments, padding / THD with gaps and a
// sample without keys, GQA / MQA, layouts, head dims of every tile, LSE bases, max_logit,
// deterministic on some) first..last, on the mask-only kernels and the same calls forced onto the
// features kernels: both against the CPU reference (outputs NaN-poisoned, run_case). Odd seeds
// take longer sequences: several blocks a walk, partial and full tiles, walks of different
// lengths in the grids' longest-first orders.
void run_sm80_mask_only_cases(uint64_t first, uint64_t last) {
  for (uint64_t seed = first; seed <= last; ++seed) {
    Case c = random_case(seed);
    if (seed % 2) {
      c.Sq = 150 + int64_t(seed * 37 % 450);
      c.Skv = 150 + int64_t(seed * 53 % 450);
      if (c.has_left) c.left = 1 + int64_t(seed * 11 % 300);
    }
    for (int forced = 0; forced < 2; ++forced) run_sm80_instantiation(c, forced, forced ? 0 : 1, forced ? 0 : 1);
    if (::testing::Test::HasFailure()) return;
  }
}

// 40 cases in two tests (gtest shards run them side by side: the CPU reference dominates).
TEST(SdpaGpu, Sm80MaskOnlyAndFeaturesKernels1) {
  REQUIRE_GPU();
  run_sm80_mask_only_cases(12001, 12020);
}
TEST(SdpaGpu, Sm80MaskOnlyAndFeaturesKernels2) {
  REQUIRE_GPU();
  run_sm80_mask_only_cases(12021, 12040);
}

TEST(SdpaGpu, Sm80FeaturesPickTheirInstantiation) {
  // What each feature runs on (params.h sdpa_*_has_features): softcap, ALiBi, a block_mask and
  // H_k != H_v the features kernels both ways; sinks the features forward and the mask-only
  // backward (dSink has its own kernel); the gate and score_max / score_sum_exp the mask-only
  // kernels (the epilogue's and the preprocess's), each against the CPU reference.
  REQUIRE_GPU();
  for (int f = 0; f < 6; ++f) {
    Case c = random_case(12100 + f);
    c.Sq = 260;
    c.Skv = 330;
    c.max_logit = false;  // (not with sinks)
    int fwd = 0, bwd = 0;
    switch (f) {
      case 0: c.softcap = 5.0f; break;
      case 1: c.alibi = true; c.has_right = true; c.right = 0; break;
      case 2: c.block_mask = 1; break;
      case 3: c.Hq = 4; c.Hk = 2; c.Hv = 4; break;
      case 4: c.sinks = true; bwd = 1; break;
      default: c.gate = true; c.score_stats = c.kind_q != Kind::kThd; fwd = bwd = 1; break;
    }
    run_sm80_instantiation(c, 0, fwd, bwd);
    if (::testing::Test::HasFailure()) return;
  }
}

// A score-modifier case (score_mod_case) with the epilogue options on top: the output gate (with
// dgate; packed like O on THD) and the score_max / score_sum_exp outputs (padded O only: the GPU
// refuses them with a packed O).
Case epilogue_case(uint64_t seed) {
  Case c = score_mod_case(seed);
  std::mt19937_64 rng(seed * 131 + 7);
  const int pick = int(rng() % 3);  // 0: gate, 1: statistics, 2: both
  c.gate = pick != 1;
  c.score_stats = pick != 0 && c.kind_q != Kind::kThd;
  return c;
}

TEST(SdpaGpu, BlockMaskRandom) {
  // block_mask (every broadcast form) combined with the analytic masks, score modifiers and the
  // epilogue options of random cases.
  REQUIRE_GPU();
  for (uint64_t seed = 9001; seed <= 9040; ++seed) {
    Case c = epilogue_case(seed);
    c.block_mask = 1 + int(seed % 4);
    if (seed % 2) {  // longer sequences: several 128 x 128 blocks
      c.Sq = 100 + int64_t(seed * 37 % 300);
      c.Skv = 100 + int64_t(seed * 53 % 600);
    }
    run_case(c);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, EpilogueOptionsRandom) {
  // Output gate O * sigmoid(G) with dgate, score_max / score_sum_exp, over random cases.
  REQUIRE_GPU();
  for (uint64_t seed = 8001; seed <= 8040; ++seed) {
    run_case(epilogue_case(seed));
    if (::testing::Test::HasFailure()) return;
  }
}

// A case with issue 24's additive bias on top of a score-modifier case (seeded): every broadcast
// form, float32 or q's dtype, contiguous or padded strides, NaN where no sample reads it; dBias
// in 3 of 4 (not with softcap: refused on CUDA tensors).
Case bias_case(uint64_t seed) {
  Case c = score_mod_case(seed);
  std::mt19937_64 rng(seed * 977 + 3);
  c.bias = 1 + int(rng() % 16);
  c.bias_f32 = rng() % 3 == 0;
  c.bias_strided = rng() % 3 == 0;
  c.dbias = rng() % 4 != 0;
  if (c.dbias) c.softcap = 0.0f;
  return c;
}

TEST(SdpaGpu, BiasRandom) {
  // The additive bias in the forward and the backward's recomputation, dBias reduced over the
  // broadcast dimensions, with the analytic masks, padding / THD and the score modifiers.
  REQUIRE_GPU();
  for (uint64_t seed = 11001; seed <= 11064; ++seed) {
    run_case(bias_case(seed));
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, BiasEveryBroadcastForm) {
  // Each of the 16 broadcast forms on one multi-block shape (GQA, padding with a sample without
  // keys, causal bottom-right), both backward paths, dBias in float32 and in q's dtype.
  REQUIRE_GPU();
  for (int form = 1; form <= 16; ++form) {
    Case c;
    c.seed = 12000 + uint64_t(form);
    c.dtype = form % 2 ? DType::kBFloat16 : DType::kFloat16;
    c.B = 2;
    c.Hq = 4;
    c.Hk = 2;
    c.Sq = 150;
    c.Skv = 210;
    c.Dqk = c.Dv = 64;
    c.has_right = true;
    c.bottom_right = true;
    c.lengths = 1;
    c.zero_kv_sample = form % 3 == 0;
    c.deterministic = form % 2;
    c.scale = 0.125f;
    c.bias = form;
    c.bias_f32 = form % 4 < 2;
    c.bias_strided = form % 5 == 0;
    c.dbias = true;
    run_case(c);
    if (::testing::Test::HasFailure()) return;
  }
}

// A random Philox dropout case (int32 / int64 seed and offset, probabilities 0.1 .. 0.6, rng_dump on half) on a
// case with the bias (odd seeds) or the score modifiers, the analytic masks and padding / THD.
Case dropout_random_case(uint64_t seed) {
  Case c = seed % 2 ? bias_case(seed) : score_mod_case(seed);
  std::mt19937_64 rng(seed * 71 + 9);
  c.dropout_p = 0.1f * float(1 + rng() % 6);
  c.dropout_seed = int64_t(rng() % 100000) - (seed % 3 == 0 ? 50000 : 0);
  c.dropout_offset = int64_t(rng() % 1000);
  c.dropout_i64 = rng() % 2;
  c.rng_dump = rng() % 2;
  return c;
}

TEST(SdpaGpu, DropoutRandom) {
  // Philox dropout in the forward's P V product and the backward's dV and dS, rng_dump bitwise the
  // reference's (dropout_random_case).
  REQUIRE_GPU();
  for (uint64_t seed = 13001; seed <= 13048; ++seed) {
    run_case(dropout_random_case(seed));
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, DropoutFormsRandom) {
  // DropoutRandom's cases (bias / score modifiers, masks, THD, rng_dump) on the sm80 kernels
  // (FLASHSPAN_SM90_SDPA_DROPOUT=0's answer) in both forms of the sm80 forward's Philox dropout.
  REQUIRE_GPU();
  const ForceSm90Dropout drop(0);
  for (int o_scaled : {1, 0}) {
    const ForceDropoutOScale form(o_scaled);
    for (uint64_t seed = 13001; seed <= 13016; ++seed) {
      SCOPED_TRACE(o_scaled ? "1 / (1 - p) on O" : "1 / (1 - p) on each P");
      run_case(dropout_random_case(seed));
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// ---------------------------------------------------------------------------
// The decode forward (kernel_decode_sm80.cuh: packed GQA on the 16-row decode tile, the key walk split
// into items and merged by a combine kernel), chosen by sdpa_fwd_runs_decode for S_q H_q / H_k <= 16;
// sm80::sdpa_decode_launches() says it ran.
// ---------------------------------------------------------------------------

// A random call the decode forward takes: random_case's masks in both alignments, padding / THD with
// gaps and a sample without keys, layouts, dtypes, LSE bases, max_logit; S_q G <= 16 (decode proper S_q
// = 1 on most, a few positions a block on the others, the block's rows then spanning positions); head
// dims up to 128; H_k = H_v; S_kv up to 4000 on odd seeds (items of several key blocks, up to ~60
// splits of a walk), softcap, sinks, the gate and the statistics outputs on some.
Case decode_case(uint64_t seed) {
  Case c = random_case(seed);
  std::mt19937_64 rng(seed * 977 + 3);
  static const int64_t groups[][2] = {{1, 1}, {4, 1}, {8, 2}, {16, 4}, {2, 2}, {8, 1}, {6, 3}, {12, 12}};
  const auto* g = groups[rng() % 8];
  c.Hq = g[0];
  c.Hk = g[1];
  const int64_t G = c.Hq / c.Hk;
  c.Sq = rng() % 3 ? 1 : 1 + int64_t(rng() % (16 / G));
  if (c.Dqk > 128 || c.Dv > 128) c.Dqk = c.Dv = 128;
  c.Skv = seed % 2 ? 1 + int64_t(rng() % 4000) : 1 + int64_t(rng() % 300);
  if (c.has_left) c.left = 1 + int64_t(rng() % (seed % 2 ? 1500 : 90));
  if (rng() % 3 == 0) c.softcap = 2.0f + float(rng() % 30);
  c.sinks = rng() % 4 == 0;
  if (c.sinks) c.max_logit = false;  // (max_logit together with sinks is refused)
  c.gate = rng() % 5 == 0;
  c.score_stats = rng() % 5 == 0 && c.kind_q != Kind::kThd;  // (score stats need a padded O)
  return c;
}

// Runs c's forward (backward too with `backward`: the prefill kernels' backward from the reference's O
// and LSE) expecting `decode` decode launches (1: it took the call, 0: it did not).
void run_decode_case(const Case& c, int decode, bool backward = false) {
  const int64_t d0 = sm80::sdpa_decode_launches();
  run_case(c, backward);
  EXPECT_EQ(sm80::sdpa_decode_launches(), d0 + decode) << "decode launches of " << c.str();
}

TEST(SdpaGpu, DecodeRandom) {
  REQUIRE_GPU();
  const ForceSdpaDecode on(1);
  for (uint64_t seed = 12001; seed <= 12160; ++seed) {
    run_decode_case(decode_case(seed), 1);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, DecodeFeedsTheBackward) {
  // The backward of decode shapes (the prefill kernels') from the decode forward's O and LSE (chain).
  REQUIRE_GPU();
  const ForceSdpaDecode on(1);
  for (uint64_t seed = 12201; seed <= 12230; ++seed) {
    const Case c = decode_case(seed);
    const int64_t d0 = sm80::sdpa_decode_launches();
    run_case(c, /*backward=*/true, /*chain=*/true);
    EXPECT_EQ(sm80::sdpa_decode_launches(), d0 + 1) << c.str();
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, DecodeOffRunsThePrefillKernels) {
  REQUIRE_GPU();
  const ForceSdpaDecode off(0);
  for (uint64_t seed = 12001; seed <= 12030; ++seed) {
    run_decode_case(decode_case(seed), 0);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, DecodeLeavesWhatItDoesNotTake) {
  // ALiBi (with its decode switch off), a bias, dropout, a block_mask, H_k != H_v and S_q G > 16 run the
  // prefill kernels (and are right).
  REQUIRE_GPU();
  const ForceSdpaDecode on(1);
  const ForceSdpaDecodeAlibi no_alibi(0);
  for (int i = 0; i < 6; ++i) {
    Case c = decode_case(12300 + uint64_t(i));
    c.kind_q = c.kind_kv = Kind::kBhsd;
    c.softcap = 0.0f;
    c.sinks = c.gate = c.score_stats = false;
    switch (i) {
      case 0: c.alibi = true; c.has_right = true; c.has_left = false; c.right = 0; break;
      case 1: c.bias = 1; break;
      case 2: c.dropout_p = 0.25f; c.dropout_seed = 5; c.dropout_offset = 9; break;
      case 3: c.block_mask = 2; break;
      case 4: c.Hq = 4; c.Hk = 2; c.Hv = 1; break;
      default: c.Hq = 8; c.Hk = 1; c.Sq = 3; break;
    }
    run_decode_case(c, 0);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, DecodeAlibiRandom) {
  // ALiBi in the decode forward (switched on here, whatever the environment says): each packed row's head's slope and
  // position, causal in either alignment (ALiBi requires it), with or without a window, softcap, sinks,
  // THD, GQA groups up to 16, against the CPU reference. Written without a GPU (2026-12-04).
  REQUIRE_GPU();
  const ForceSdpaDecode on(1);
  const ForceSdpaDecodeAlibi alibi(1);
  for (uint64_t seed = 12501; seed <= 12560; ++seed) {
    Case c = decode_case(seed);
    c.alibi = true;
    c.has_right = true;
    c.right = 0;
    c.bias = 0;
    run_decode_case(c, 1);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, DecodeSanitizerSmall) {
  // Small decode calls for compute-sanitizer memcheck: packed THD with gaps and a sample without keys,
  // several positions a block, every epilogue option, softcap and sinks, many splits (S_kv 2000, one task
  // a kv head); ALiBi (switched on here) in the second.
  REQUIRE_GPU();
  const ForceSdpaDecode on(1);
  const ForceSdpaDecodeAlibi alibi(1);
  for (int i = 0; i < 3; ++i) {
    Case c;
    c.seed = 12400 + uint64_t(i);
    c.B = 3;
    c.Hq = 8;
    c.Hk = 2;
    c.Sq = i == 0 ? 1 : 3;
    c.Skv = 2000;
    c.Dqk = c.Dv = i == 2 ? 72 : 128;
    c.has_right = true;
    c.bottom_right = true;
    c.has_left = i == 1;
    c.left = 300;
    c.kind_q = i == 0 ? Kind::kThd : Kind::kBshd;
    c.kind_kv = i == 2 ? Kind::kThd : Kind::kStrided;
    c.lengths = 1 + i % 2;
    c.zero_kv_sample = true;
    c.softcap = i == 1 ? 0.0f : 20.0f;
    c.sinks = i != 0;
    c.gate = true;
    c.score_stats = i != 0;
    c.log2_stats = i == 2;
    c.alibi = i == 1;  // (causal: has_right, right = 0 by default)
    run_decode_case(c, 1);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, SanitizerSmall) {
  // One small case per backward path with every new feature on (softcap, ALiBi, sinks / dSink,
  // host scale tensor, H_k != H_v's two dK/dV passes), packed THD with gaps and a sample without
  // keys: the case to run under compute-sanitizer --tool memcheck.
  REQUIRE_GPU();
  for (int det = 0; det < 2; ++det) {
    Case c;
    c.seed = 7000 + det;
    c.B = 3;
    c.Hq = 4;
    c.Hk = 2;
    c.Hv = 1;
    c.Sq = 70;
    c.Skv = 150;
    c.Dqk = c.Dv = 32;
    c.has_right = true;
    c.bottom_right = true;
    c.kind_q = c.kind_kv = Kind::kThd;
    c.lengths = 1;
    c.zero_kv_sample = true;
    c.deterministic = det;
    c.softcap = 4.0f;
    c.alibi = true;
    c.sinks = true;
    c.scale_tensor = true;
    c.gate = true;  // packed gate and dgate
    run_case(c);
  }
  {
    // The epilogue options on padded outputs: gate / dgate rows past the samples, score_max /
    // score_sum_exp (never packed).
    Case c;
    c.seed = 7002;
    c.B = 2;
    c.Hq = 4;
    c.Hk = 2;
    c.Sq = 70;
    c.Skv = 90;
    c.Dqk = c.Dv = 32;
    c.has_right = true;
    c.lengths = 1;
    c.zero_kv_sample = true;
    c.sinks = true;
    c.gate = true;
    c.score_stats = true;
    c.block_mask = 2;
    c.Skv = 300;  // three 128-column blocks
    run_case(c);
  }
  for (int det = 0; det < 2; ++det) {
    // The additive bias (broadcast over H_q, padded strides, NaN where no sample reads it) with
    // dBias (the dS workspace and its reduction), on packed THD and on padded tensors.
    Case c;
    c.seed = 7003 + uint64_t(det);
    c.B = 3;
    c.Hq = 4;
    c.Hk = 2;
    c.Sq = 70;
    c.Skv = 150;
    c.Dqk = c.Dv = 32;
    c.has_right = true;
    c.bottom_right = true;
    c.kind_q = c.kind_kv = det ? Kind::kBhsd : Kind::kThd;
    c.lengths = 1;
    c.zero_kv_sample = true;
    c.deterministic = det;
    c.alibi = true;
    c.sinks = true;
    c.bias = 1 + 2;  // [B, 1, S_q, S_kv]
    c.bias_strided = true;
    c.bias_f32 = det;
    c.dbias = true;
    c.dropout_p = 0.25f;  // Philox dropout with rng_dump
    c.dropout_seed = 1234 + det;
    c.dropout_offset = 7;
    c.dropout_i64 = det;
    c.rng_dump = true;
    run_case(c);
  }
}

TEST(SdpaGpu, MasksInBothAlignments) {
  // Every mask kind with S_q < S_kv and S_q > S_kv, both alignments, padded and THD.
  REQUIRE_GPU();
  uint64_t seed = 1000;
  for (const auto& [sq, skv] : {std::pair<int64_t, int64_t>{77, 200}, {200, 77}, {128, 128}})
    for (int br = 0; br < 2; ++br)
      for (int m = 0; m < 5; ++m) {
        Case c;
        c.seed = ++seed;
        c.B = 2;
        c.Hq = 4;
        c.Hk = 2;
        c.Sq = sq;
        c.Skv = skv;
        c.bottom_right = br;
        c.has_right = m != 3;
        c.right = m == 2 ? 5 : 0;
        c.has_left = m >= 1 && m != 2;
        c.left = m == 4 ? 1 : 33;
        if (br && !c.has_left && !c.has_right) c.has_right = true;
        c.kind_q = c.kind_kv = m % 2 ? Kind::kThd : Kind::kBhsd;
        c.lengths = m % 3 == 0 ? 0 : 1;
        run_case(c);
        if (::testing::Test::HasFailure()) return;
      }
}

TEST(SdpaGpu, ZeroLengthKvRowGivesZeroNotNaN) {
  // A sample with no keys: O = 0, LSE = -inf, zero gradients, nothing NaN (the seed's
  // kernels return NaN there).
  REQUIRE_GPU();
  for (Kind kind : {Kind::kBhsd, Kind::kThd}) {
    Case c;
    c.seed = 77;
    c.B = 3;
    c.Hq = 2;
    c.Hk = 1;
    c.Sq = 50;
    c.Skv = 90;
    c.has_right = true;
    c.bottom_right = true;
    c.kind_q = c.kind_kv = kind;
    c.lengths = 1;
    c.zero_kv_sample = true;
    SCOPED_TRACE(c.str());
    auto p = make_problem(c);
    ASSERT_EQ(p->len_kv[1], 0);
    p->o.poison_device();
    p->stats.poison_device();
    run_forward(*p, true, false);
    const std::vector<double> o = Tensor::values(p->o.download(), c.dtype);
    const std::vector<double> st = Tensor::values(p->stats.download(), DType::kFloat32);
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < p->len_q[1]; ++i) {
        EXPECT_EQ(st[size_t(p->stats.lay.at(1, h, i, 0))], -INFINITY);
        for (int64_t d = 0; d < c.Dv; ++d) EXPECT_EQ(o[size_t(p->o.lay.at(1, h, i, d))], 0.0);
      }
    run_case(c);
  }
}

TEST(SdpaGpu, HeadDims) {
  REQUIRE_GPU();
  const std::pair<int64_t, int64_t> dims[] = {{8, 8},   {16, 32}, {32, 32},  {48, 64},  {64, 64},   {64, 128},
                                              {80, 80}, {96, 96}, {112, 64}, {128, 128}, {192, 128}, {256, 256}};
  uint64_t seed = 2000;
  for (const auto& [dqk, dv] : dims)
    for (DType t : {DType::kFloat16, DType::kBFloat16}) {
      Case c;
      c.seed = ++seed;
      c.dtype = t;
      c.B = 2;
      c.Hq = 2;
      c.Hk = 1;
      c.Sq = 150;
      c.Skv = 170;
      c.Dqk = dqk;
      c.Dv = dv;
      c.has_right = true;
      c.has_left = true;
      c.left = 60;
      c.lengths = 1;
      c.scale = 1.0f / std::sqrt(float(dqk));
      run_case(c);
      if (::testing::Test::HasFailure()) return;
    }
}

TEST(SdpaGpu, DeterministicBackwardIsBitwiseReproducible) {
  REQUIRE_GPU();
  Case c;
  c.seed = 3000;
  c.B = 2;
  c.Hq = 8;
  c.Hk = 2;
  c.Sq = 300;
  c.Skv = 260;
  c.Dqk = c.Dv = 128;
  c.has_right = true;
  c.bottom_right = true;
  c.kind_q = c.kind_kv = Kind::kThd;
  c.lengths = 1;
  c.deterministic = true;
  auto p = make_problem(c);
  run_forward(*p, false, false);
  poison_padding(p->o, p->len_q);
  poison_padding(p->stats, p->len_q);
  p->o.upload();
  p->stats.upload();
  std::vector<std::vector<uint8_t>> first;
  for (int run = 0; run < 3; ++run) {
    for (Tensor* t : {&p->dq, &p->dk, &p->dv}) t->poison_device();
  if (c.gate) p->dgate.poison_device();
    run_backward(*p, true);
    std::vector<std::vector<uint8_t>> now = {p->dq.download(), p->dk.download(), p->dv.download()};
    if (run == 0) {
      first = now;
    } else {
      EXPECT_TRUE(now == first) << "run " << run << " differs bitwise from run 0";
    }
  }
}

TEST(SdpaGpu, LayoutsPerSide) {
  // Every pairing of the Q side's and the KV side's layouts (one side packed, the other dense).
  REQUIRE_GPU();
  uint64_t seed = 4000;
  for (Kind kq : kAllKinds)
    for (Kind kkv : kAllKinds) {
      run_case(layout_case(++seed, kq, kkv));
      if (::testing::Test::HasFailure()) return;
    }
}

// ---------------------------------------------------------------------------
// The feature pairs (dispatch/sdpa_launch.h sdpa_feature_pairs_enabled: on by default since these tests passed
// on an H200, FLASHSPAN_SDPA_FEATURE_PAIRS=0 off; forced on here): max_logit with sinks (the prefill kernels
// fold the sink into the row statistics after the walk, softmax.cuh OnlineSoftmax::fold_sink_row, so that
// max_logit keeps the scores' maximum; the decode combine adds the sink anyway) and score_max / score_sum_exp
// with a packed O (their padded rows past each sample set by fwd_launch.h launch_sdpa_fwd_stats_padding). The
// paged pairs (bias, dropout): test_sdpa_paged_gpu.cpp.
// ---------------------------------------------------------------------------

struct ForceFeaturePairs {
  ForceFeaturePairs() { set_sdpa_feature_pairs_enabled(1); }
  ~ForceFeaturePairs() { set_sdpa_feature_pairs_enabled(-1); }
};

// c with sinks and max_logit (and the statistics outputs on some seeds: score_max includes the sink,
// max_logit does not). The sinks are N(0, 1.5) (make_problem) against scores of about unit spread, so
// some rows' sink dominates (the fold's factor well below 1) and some rows' scores do; a larger scale on a
// third of the seeds. A positive scale (random_softmax_scale's rule with max_logit).
Case with_sinks_and_max_logit(Case c) {
  c.sinks = true;
  c.max_logit = true;
  c.score_stats = c.score_stats || c.seed % 3 == 0;
  c.scale = c.seed % 3 == 1 ? 3.0f / std::sqrt(float(c.Dqk)) : fs_test::random_softmax_scale(c.seed, int(c.Dqk), false);
  return c;
}

TEST(SdpaGpu, MaxLogitWithSinksSm90) {
  // The sm90 forward with modifiers (its sink source); a quarter with the backward chained onto the
  // GPU forward's O and LSE (dSink, dQ / dK / dV through the folded LSE; the backward's family free).
  REQUIRE_SM90();
  const ForceFeaturePairs pairs;
  const ForceSdpaSm90 force(1);
  const ForceSdpaSm90Mods mods(1);
  for (uint64_t seed = 16001; seed <= 16048; ++seed) {
    const Case c = with_sinks_and_max_logit(sm90_mods_case(seed));
    run_case_expect_sm90(c, /*backward=*/seed % 4 == 0, 1, kAnyLaunches, /*chain=*/true);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, MaxLogitWithSinksSm80) {
  // The sm80 forward (random_case: every head dim, THD with gaps and a sample without keys, masks in both
  // alignments), the sm90 forward and the decode forward pinned off.
  REQUIRE_GPU();
  const ForceFeaturePairs pairs;
  const ForceSdpaSm90 sm90_off(0);
  const ForceSdpaDecode decode_off(0);
  for (uint64_t seed = 16101; seed <= 16160; ++seed) {
    Case c = with_sinks_and_max_logit(random_case(seed));
    if (seed % 5 == 0) c.softcap = 6.0f;
    run_case(c, /*backward=*/seed % 4 == 0, /*chain=*/true);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, MaxLogitWithSinksDecode) {
  // The decode forward: its items seed nothing and its combine adds the sink, so max_logit is the items'.
  REQUIRE_GPU();
  const ForceFeaturePairs pairs;
  const ForceSdpaDecode on(1);
  for (uint64_t seed = 16201; seed <= 16240; ++seed) {
    Case c = with_sinks_and_max_logit(decode_case(seed));
    if (c.kind_q == Kind::kThd) c.score_stats = false;  // (ScoreStatsWithPackedO)
    run_decode_case(c, 1);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, SinksMinusInfinityKeylessRows) {
  // A sink of -inf adds nothing (exp(-inf) = 0): rows without keys (a sample without keys; bottom-right causal
  // with S_q > S_kv) keep score_sum_exp = 0, score_max = -inf, LSE = -inf, O = 0, on every forward family: the
  // sm90 forward with modifiers (its sink seeds the rows: OnlineSoftmax::seed_row), the sm80 forward (seeded too),
  // both with max_logit (the fold after the walk), the decode forward (its combine); dSink of such heads 0.
  REQUIRE_GPU();
  const ForceFeaturePairs pairs;
  for (int f = 0; f < 10; ++f) {
    const int family = f % 5;  // 0, 1: sm90 mods (seeded, folded), 2, 3: sm80 (seeded, folded), 4: decode
    if (family < 2 && !sm90_device()) continue;
    Case c = family == 4 ? decode_case(16401 + uint64_t(f)) : multi_block_case(16401 + uint64_t(f), 4 + f, f < 5 ? 64 : 128);
    c.sinks = true;
    c.sinks_neg_inf = true;
    c.score_stats = c.kind_q != Kind::kThd;
    c.max_logit = family == 1 || family == 3;
    if (family == 4) {
      c.B = 2;
      c.lengths = 1;
      c.zero_kv_sample = true;
      const ForceSdpaDecode on(1);
      run_decode_case(c, 1);
    } else if (family < 2) {
      const ForceSdpaSm90 force(1);
      const ForceSdpaSm90Mods mods(1);
      run_case_expect_sm90(c, /*backward=*/f >= 5, 1, kAnyLaunches, /*chain=*/true);
    } else {
      const ForceSdpaSm90 sm90_off(0);
      const ForceSdpaDecode decode_off(0);
      run_case(c, /*backward=*/f >= 5, /*chain=*/true);
    }
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, ScoreStatsWithPackedO) {
  // score_max / score_sum_exp (padded [B, H_q, S_q, 1], NaN-poisoned) beside a packed O: the rows past each
  // sample are the fill kernel's (-inf, 0), the others the forward's; on the sm80 forward (sm90 off), the
  // default families (on an H100 / H200 the sm90 forward with modifiers, which takes packed THD by default; with
  // FLASHSPAN_SM90_SDPA_THD=0 and on other GPUs the sm80 one) and the decode forward.
  REQUIRE_GPU();
  const ForceFeaturePairs pairs;
  for (uint64_t seed = 16301; seed <= 16360; ++seed) {
    const int form = int(seed % 3);
    Case c = form == 2 ? decode_case(seed) : random_case(seed);
    c.B = 2 + int64_t(seed % 2);  // (sample 0 is full: later samples leave rows for the fill kernel)
    c.kind_q = Kind::kThd;
    if (c.lengths == 0) c.lengths = 1 + int(seed % 2);
    c.score_stats = true;
    if (seed % 4 == 0) c.sinks = true;
    if (seed % 5 == 0) c.gate = true;
    std::optional<ForceSdpaSm90> sm90_off;
    std::optional<ForceSdpaDecode> decode;
    if (form == 0) sm90_off.emplace(0);
    if (form != 2) decode.emplace(0);
    if (form == 2) {
      run_decode_case(c, 1);
    } else {
      run_case(c, /*backward=*/false);
    }
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SdpaGpu, FeaturePairsSanitizerSmall) {
  // Small cases of the pairs for compute-sanitizer (scripts/gpu_check.sh memcheck): the sm80 and (on
  // sm_90) sm90 forwards with sinks and max_logit, the fill kernel beside a packed O.
  REQUIRE_GPU();
  const ForceFeaturePairs pairs;
  for (int i = 0; i < 3; ++i) {
    Case c = layout_case(16400 + uint64_t(i), i == 2 ? Kind::kThd : Kind::kBhsd, Kind::kBshd);
    c.sinks = true;
    c.max_logit = i < 2;
    c.score_stats = true;
    const ForceSdpaSm90 fam(i == 1 ? 1 : 0);
    const ForceSdpaDecode decode_off(0);
    run_case(c, /*backward=*/false);
    if (::testing::Test::HasFailure()) return;
  }
}

// An empty batch (B = 0; core/sdpa_problem.h empty_batch_fills, dispatch/sdpa_dispatch.cu fill_empty_batch_gpu):
// check_support accepts it, no workspace, no attention kernel launched (the launch counters stay), and the outputs
// reduced over the batch get their identities on the stream: max_logit -inf, dSink 0 and a dBias broadcast over the
// batch 0 (padded rows: a 2-D memset per head, its padding untouched), in both directions, deterministic or not, on
// every family's switches. The CPU reference's answer is SdpaApi.EmptyBatchRunsAndFillsThePerHeadReductions.
TEST(SdpaGpu, EmptyBatch) {
  REQUIRE_GPU();
  constexpr int64_t B0 = 0, Hq = 2, Hk = 1, Sq = 5, Skv = 7, D = 64, row = Skv + 3;
  const fs_device_t dev{FS_DEVICE_CUDA, 0};
  const fs_dtype_t bf16{FS_DTYPE_BFLOAT, 16, 1}, f32{FS_DTYPE_FLOAT, 32, 1};
  const api::TensorDesc q(nullptr, bf16, dev, {B0, Hq, Sq, D}), k(nullptr, bf16, dev, {B0, Hk, Skv, D}),
      st(nullptr, f32, dev, {B0, Hq, Sq, 1});
  DevBuf ml(Hq * sizeof(float)), sinks(Hq * sizeof(float)), dsink(Hq * sizeof(float)),
      bias(Hq * Sq * Skv * sizeof(float)), dbias(Hq * Sq * row * sizeof(float));
  const api::TensorDesc mld(ml.p, f32, dev, {Hq}), sd(sinks.p, f32, dev, {Hq}), dsd(dsink.p, f32, dev, {Hq}),
      bd(bias.p, f32, dev, {1, Hq, Sq, Skv}), dbd(dbias.p, f32, dev, {1, Hq, Sq, Skv}, {Hq * Sq * row, Sq * row, row, 1});
  std::vector<float> five(Hq, 5.0f), nan_h(Hq, NAN), nan_b(Hq * Sq * row, NAN), zeros(Hq * Sq * Skv, 0.0f);
  cuda_ok(cudaMemcpy(sinks.p, zeros.data(), sinks.bytes, cudaMemcpyHostToDevice), "sinks");
  cuda_ok(cudaMemcpy(bias.p, zeros.data(), bias.bytes, cudaMemcpyHostToDevice), "bias");
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreate(&stream), "cudaStreamCreate");
  auto launches = [] {
    return sm90::sdpa_fwd_launches() + sm90::sdpa_bwd_launches() + sm90::sdpa_bwd_mods_launches() +
           sm80::sdpa_fwd_mask_only_launches() + sm80::sdpa_bwd_mask_only_launches() + sm80::sdpa_decode_launches();
  };
  for (int sm90_on : {1, 0}) {
    SCOPED_TRACE(sm90_on ? "sm90 switches on" : "sm90 switches off");
    const ForceSdpaSm90 fam(sm90_on);
    const ForceSdpaBwdSm90 bwd_fam(sm90_on);
    const int64_t before = launches();
    cuda_ok(cudaMemcpy(ml.p, five.data(), ml.bytes, cudaMemcpyHostToDevice), "max_logit");
    api::SdpaAttributes attr;
    attr.set_causal_mask(true).set_generate_stats(true).set_bias(bd).set_max_logit(mld);
    api::SdpaFwd fwd(q, k, k, q, &st, attr);
    fwd.check_support();
    fwd.compile();
    EXPECT_EQ(fwd.workspace_size(), 0u);
    api::SdpaVariantPack pack;
    pack.set(FS_SDPA_BIAS, bias.p).set(FS_SDPA_MAX_LOGIT, ml.p);
    fwd.execute(pack, nullptr, 0, stream);
    cuda_ok(cudaStreamSynchronize(stream), "forward");
    std::vector<float> got(Hq);
    cuda_ok(cudaMemcpy(got.data(), ml.p, ml.bytes, cudaMemcpyDeviceToHost), "max_logit back");
    for (float m : got) EXPECT_TRUE(std::isinf(m) && m < 0) << "max_logit " << m;
    for (bool det : {false, true}) {
      cuda_ok(cudaMemcpy(dsink.p, nan_h.data(), dsink.bytes, cudaMemcpyHostToDevice), "dSink");
      cuda_ok(cudaMemcpy(dbias.p, nan_b.data(), dbias.bytes, cudaMemcpyHostToDevice), "dBias");
      api::SdpaBackwardAttributes battr;
      battr.set_causal_mask(true).set_deterministic_algorithm(det).set_sink_token(sd).set_dsink_token(dsd);
      battr.set_bias(bd).set_dbias(dbd);
      api::SdpaBwd bwd(q, k, k, q, q, st, q, k, k, battr);
      bwd.check_support();
      bwd.compile();
      EXPECT_EQ(bwd.workspace_size(), 0u);
      api::SdpaVariantPack bp;
      bp.set(FS_SDPA_SINK_TOKEN, sinks.p).set(FS_SDPA_DSINK_TOKEN, dsink.p).set(FS_SDPA_BIAS, bias.p);
      bp.set(FS_SDPA_DBIAS, dbias.p);
      bwd.execute(bp, nullptr, 0, stream);
      cuda_ok(cudaStreamSynchronize(stream), "backward");
      std::vector<float> gs(Hq), gb(Hq * Sq * row);
      cuda_ok(cudaMemcpy(gs.data(), dsink.p, dsink.bytes, cudaMemcpyDeviceToHost), "dSink back");
      cuda_ok(cudaMemcpy(gb.data(), dbias.p, dbias.bytes, cudaMemcpyDeviceToHost), "dBias back");
      for (float g : gs) EXPECT_EQ(g, 0.0f) << "dSink, deterministic " << det;
      for (int64_t e = 0; e < Hq * Sq * row; ++e) {
        if (e % row < Skv) {
          EXPECT_EQ(gb[size_t(e)], 0.0f) << "dBias element " << e << ", deterministic " << det;
        } else {
          EXPECT_TRUE(std::isnan(gb[size_t(e)])) << "dBias padding " << e << " was written";
        }
      }
    }
    EXPECT_EQ(launches(), before) << "an attention kernel ran for an empty batch";
  }
  cuda_ok(cudaGetLastError(), "empty batch");
  cudaStreamDestroy(stream);
}

#endif  // FLASHSPAN_WITH_CUDA

}  // namespace
}  // namespace flashspan::test
