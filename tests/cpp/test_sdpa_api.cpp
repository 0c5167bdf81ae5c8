// The SDPA C++ API (flashspan.hpp: SdpaAttributes / SdpaFwd / SdpaBwd / SdpaVariantPack) on CPU
// tensors: the forward against a naive double computation written here (GQA, bottom-right
// causal through the deprecated setter, sinks, output gate, stats), the backward against
// central finite differences of the forward in float64 (dQ, dK, dV, dSink, dgate), and errors
// as api::Exception with the status and "<argument>: <rule>". On CUDA descriptors (no GPU
// needed: check_support refuses before any CUDA call) the features the GPU kernels do not run
// yet are named, and the backward's workspace size follows its layout.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/sdpa_problem.h"  // sdpa::empty_batch_fills (EmptyBatchFillsAreTheReductionsIdentities)
#include "dispatch/sdpa_launch.h"  // set_sdpa_dbias_softcap_enabled, ..._sm80_enabled, sdpa_sm90_fused_softcap
#include "flashspan/flashspan.hpp"
#include "scoped_env.h"
#include "test_util.h"  // shape_view (EmptyBatchFillsAreTheReductionsIdentities)

namespace {

using namespace flashspan::api;
using flashspan::test::ScopedEnv;

constexpr fs_dtype_t kF64{FS_DTYPE_FLOAT, 64, 1};
constexpr int64_t B = 2, Hq = 2, Hk = 1, Sq = 5, Skv = 7, D = 8;
constexpr float kScale = 0.45f;

struct Data {
  std::vector<double> q, k, v, gate, sinks;
  Data() {
    std::mt19937 rng(7);
    std::normal_distribution<double> n;
    auto fill = [&](std::vector<double>& x, size_t count) {
      x.resize(count);
      for (auto& e : x) e = n(rng);
    };
    fill(q, B * Hq * Sq * D);
    fill(k, B * Hk * Skv * D);
    fill(v, B * Hk * Skv * D);
    fill(gate, B * Hq * Sq * D);
    fill(sinks, Hq);
  }
};

fs_device_t cpu() { return {FS_DEVICE_CPU, 0}; }

// O and stats through SdpaFwd (BOTTOM_RIGHT causal via set_causal_mask_bottom_right, sinks, gate).
void forward(Data& d, std::vector<double>& o, std::vector<float>* stats) {
  o.assign(B * Hq * Sq * D, NAN);
  TensorDesc q(d.q.data(), kF64, cpu(), {B, Hq, Sq, D}), k(d.k.data(), kF64, cpu(), {B, Hk, Skv, D}),
      v(d.v.data(), kF64, cpu(), {B, Hk, Skv, D}), od(o.data(), kF64, cpu(), {B, Hq, Sq, D});
  TensorDesc sinks(d.sinks.data(), kF64, cpu(), {Hq}), gate(d.gate.data(), kF64, cpu(), {B, Hq, Sq, D});
  if (stats) stats->assign(B * Hq * Sq, NAN);
  TensorDesc st(stats ? stats->data() : nullptr, kFloat32, cpu(), {B, Hq, Sq, 1});
  SdpaAttributes attr;
  attr.set_attn_scale(kScale).set_causal_mask_bottom_right(true).set_sink_token(sinks).set_gate(gate).set_generate_stats(
      stats != nullptr);
  SdpaFwd fwd(q, k, v, od, stats ? &st : nullptr, attr);
  fwd.check_support();
  fwd.compile();
  SdpaVariantPack pack;
  pack.set(FS_SDPA_Q, d.q.data()).set(FS_SDPA_K, d.k.data()).set(FS_SDPA_V, d.v.data()).set(FS_SDPA_O, o.data());
  pack.set(FS_SDPA_SINK_TOKEN, d.sinks.data()).set(FS_SDPA_GATE, d.gate.data());
  if (stats) pack.set(FS_SDPA_STATS, stats->data());
  fwd.execute(pack, nullptr, fwd.workspace_size());
}

TEST(SdpaApi, ForwardMatchesNaiveDouble) {
  Data d;
  std::vector<double> o;
  std::vector<float> stats;
  forward(d, o, &stats);
  const int64_t shift = Skv - Sq;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Sq; ++i) {
        std::vector<double> x;
        double m = d.sinks[h];
        for (int64_t j = 0; j <= i + shift; ++j) {
          double s = 0;
          for (int64_t e = 0; e < D; ++e) s += d.q[((b * Hq + h) * Sq + i) * D + e] * d.k[((b * Hk) * Skv + j) * D + e];
          x.push_back(kScale * s);
          m = std::max(m, x.back());
        }
        double sum = std::exp(d.sinks[h] - m);
        for (double xj : x) sum += std::exp(xj - m);
        const double lse = m + std::log(sum);
        EXPECT_NEAR(stats[(b * Hq + h) * Sq + i], lse, 1e-5);
        for (int64_t e = 0; e < D; ++e) {
          double acc = 0;
          for (size_t j = 0; j < x.size(); ++j) acc += std::exp(x[j] - lse) * d.v[((b * Hk) * Skv + int64_t(j)) * D + e];
          const int64_t oi = ((b * Hq + h) * Sq + i) * D + e;
          acc /= 1.0 + std::exp(-d.gate[oi]);
          EXPECT_NEAR(o[oi], acc, 1e-12) << "b " << b << " h " << h << " i " << i << " d " << e;
        }
      }
}

TEST(SdpaApi, BackwardMatchesFiniteDifferences) {
  Data d;
  std::vector<double> o;
  std::vector<float> stats32;
  forward(d, o, &stats32);
  std::vector<double> dout(o.size());
  std::mt19937 rng(3);
  std::normal_distribution<double> n;
  for (auto& e : dout) e = n(rng);
  // Backward through SdpaBwd (stats are float32: the forward's LSE).
  std::vector<double> dq(d.q.size(), NAN), dk(d.k.size(), NAN), dv(d.v.size(), NAN), dgate(d.gate.size(), NAN);
  std::vector<double> dsink(Hq, NAN);
  TensorDesc q(d.q.data(), kF64, cpu(), {B, Hq, Sq, D}), k(d.k.data(), kF64, cpu(), {B, Hk, Skv, D}),
      v(d.v.data(), kF64, cpu(), {B, Hk, Skv, D}), od(o.data(), kF64, cpu(), {B, Hq, Sq, D}),
      dod(dout.data(), kF64, cpu(), {B, Hq, Sq, D}), st(stats32.data(), kFloat32, cpu(), {B, Hq, Sq, 1}),
      dqd(dq.data(), kF64, cpu(), {B, Hq, Sq, D}), dkd(dk.data(), kF64, cpu(), {B, Hk, Skv, D}),
      dvd(dv.data(), kF64, cpu(), {B, Hk, Skv, D});
  TensorDesc sinks(d.sinks.data(), kF64, cpu(), {Hq}), gate(d.gate.data(), kF64, cpu(), {B, Hq, Sq, D}),
      dsd(dsink.data(), kF64, cpu(), {Hq}), dgd(dgate.data(), kF64, cpu(), {B, Hq, Sq, D});
  SdpaBackwardAttributes attr;
  attr.set_attn_scale(kScale).set_causal_mask_bottom_right(true).set_sink_token(sinks).set_gate(gate);
  attr.set_dsink_token(dsd).set_dgate(dgd).set_deterministic_algorithm(true);
  SdpaBwd bwd(q, k, v, od, dod, st, dqd, dkd, dvd, attr);
  bwd.check_support();
  bwd.compile();
  SdpaVariantPack pack;
  pack.set(FS_SDPA_Q, d.q.data()).set(FS_SDPA_K, d.k.data()).set(FS_SDPA_V, d.v.data()).set(FS_SDPA_O, o.data());
  pack.set(FS_SDPA_DO, dout.data()).set(FS_SDPA_STATS, stats32.data()).set(FS_SDPA_DQ, dq.data());
  pack.set(FS_SDPA_DK, dk.data()).set(FS_SDPA_DV, dv.data()).set(FS_SDPA_SINK_TOKEN, d.sinks.data());
  pack.set(FS_SDPA_GATE, d.gate.data()).set(FS_SDPA_DSINK_TOKEN, dsink.data()).set(FS_SDPA_DGATE, dgate.data());
  bwd.execute(pack, nullptr, bwd.workspace_size());

  // L = sum(O * dO); central differences of every input element.
  auto loss = [&]() {
    std::vector<double> oo;
    forward(d, oo, nullptr);
    double l = 0;
    for (size_t e = 0; e < oo.size(); ++e) l += oo[e] * dout[e];
    return l;
  };
  // The float32 LSE limits the analytic gradients to ~1e-6 relative.
  auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
    for (size_t e = 0; e < x.size(); ++e) {
      const double keep = x[e], h = 1e-5;
      x[e] = keep + h;
      const double lp = loss();
      x[e] = keep - h;
      const double lm = loss();
      x[e] = keep;
      EXPECT_NEAR(grad[e], (lp - lm) / (2 * h), 1e-4 * (1 + std::fabs(grad[e]))) << name << "[" << e << "]";
    }
  };
  check(d.q, dq, "dQ");
  check(d.k, dk, "dK");
  check(d.v, dv, "dV");
  check(d.sinks, dsink, "dSink");
  check(d.gate, dgate, "dgate");
}

TEST(SdpaApi, ErrorsAreExceptionsNamingTheArgument) {
  Data d;
  std::vector<double> o(B * Hq * Sq * D);
  TensorDesc q(d.q.data(), kF64, cpu(), {B, Hq, Sq, D}), k(d.k.data(), kF64, cpu(), {B, Hk, Skv, D}),
      v(d.v.data(), kF64, cpu(), {B, Hk, Skv, D}), od(o.data(), kF64, cpu(), {B, Hq, Sq, D});
  SdpaAttributes attr;
  attr.set_alibi_mask(true);
  try {
    SdpaFwd fwd(q, k, v, od, nullptr, attr);
    FAIL() << "ALiBi without causal masking was accepted";
  } catch (const Exception& e) {
    EXPECT_EQ(e.status(), FS_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(e.what()).rfind("use_alibi_mask: ALiBi requires causal masking", 0), 0u) << e.what();
  }
  SdpaBackwardAttributes battr;
  try {
    battr.set_dsink_token(TensorDesc(nullptr, kFloat32, cpu(), {Hq}));
    SdpaAttributes fattr;
    fattr.set_diagonal_alignment(DiagonalAlignment::kBottomRight);
    SdpaFwd fwd(q, k, v, od, nullptr, fattr);
    FAIL() << "BOTTOM_RIGHT without a band was accepted";
  } catch (const Exception& e) {
    EXPECT_EQ(e.status(), FS_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(e.what()).rfind("diagonal_alignment: BOTTOM_RIGHT only re-anchors a diagonal band", 0), 0u)
        << e.what();
  }
  // A forward-only setter on backward attributes is refused by the C layer.
  EXPECT_NE(fs_sdpa_attributes_set_generate_stats(battr.handle(), 1), FS_STATUS_SUCCESS);
  EXPECT_EQ(std::string(fs_get_last_error()).rfind("set_generate_stats: is a forward attribute", 0), 0u);
}

// ---------------------------------------------------------------------------
// Paged K/V: errors name the paged layout, both page tables and the capacity rule
// ---------------------------------------------------------------------------

// A paged forward on CPU float32: q [2, 2, 1, 8], containers [num_blocks = 8, 1, block, 8] (block_k / block_v;
// 0: that side a dense [2, 1, dense_s, 8]), page tables [2, 1, 4, 1] (max_pages 4) given on the sides `table_k` /
// `table_v`, lengths len_kv. Returns the message of the exception that construction (validation) or execution
// (the runtime values) raises, "" when it ran.
struct PagedCall {
  int64_t block_k = 8, block_v = 8, dense_s = 32, max_pages = 4;
  bool table_k = true, table_v = true;
  int k_rank = 4;
  std::vector<int32_t> len_kv{5, 30};
  int64_t max_seq = 0;  // paged_attention_max_seq_len_kv when > 0

  std::string run() const {
    constexpr int64_t b = 2, h = 2, hk = 1, d = 8, blocks = 8;
    auto kv_shape = [&](bool paged, int64_t block) {
      return paged ? std::vector<int64_t>{blocks, hk, block, d} : std::vector<int64_t>{b, hk, dense_s, d};
    };
    std::vector<int64_t> ks = kv_shape(block_k > 0, block_k), vs = kv_shape(block_v > 0, block_v);
    if (k_rank == 3) ks = {blocks, block_k, d};
    std::vector<float> q(b * h * d, 0.5f), o(b * h * d), k(4096, 0.25f), v(4096, 0.75f);
    std::vector<int32_t> table(b * max_pages), ones(b, 1), lens = len_kv;
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i % blocks);
    TensorDesc qd(q.data(), kFloat32, cpu(), {b, h, 1, d}), kd(k.data(), kFloat32, cpu(), ks),
        vd(v.data(), kFloat32, cpu(), vs), od(o.data(), kFloat32, cpu(), {b, h, 1, d});
    TensorDesc td(table.data(), kInt32, cpu(), {b, 1, max_pages, 1}), lq(ones.data(), kInt32, cpu(), {b}),
        lk(lens.data(), kInt32, cpu(), {b});
    try {
      SdpaAttributes attr;
      attr.set_padding_mask(true).set_seq_len_q(lq).set_seq_len_kv(lk);
      if (table_k) attr.set_paged_attention_k_table(td);
      if (table_v) attr.set_paged_attention_v_table(td);
      if (max_seq > 0) attr.set_paged_attention_max_seq_len_kv(max_seq);
      SdpaFwd fwd(qd, kd, vd, od, nullptr, attr);
      fwd.check_support();
      fwd.compile();
      SdpaVariantPack pack;
      pack.set(FS_SDPA_Q, q.data()).set(FS_SDPA_K, k.data()).set(FS_SDPA_V, v.data()).set(FS_SDPA_O, o.data());
      pack.set(FS_SDPA_SEQ_LEN_Q, ones.data()).set(FS_SDPA_SEQ_LEN_KV, lens.data());
      if (table_k) pack.set(FS_SDPA_PAGE_TABLE_K, table.data());
      if (table_v) pack.set(FS_SDPA_PAGE_TABLE_V, table.data());
      fwd.execute(pack, nullptr, fwd.workspace_size());
    } catch (const Exception& e) {
      EXPECT_EQ(e.status(), FS_STATUS_INVALID_ARGUMENT) << e.what();
      return e.what();
    }
    return "";
  }
};

bool begins(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// An expanded view of a size-1 last dimension (torch's bias.expand(...), stride 0) breaks the bias's and the dropout
// mask's last-dimension rule; the message names the size-1 shape to pass instead (it broadcasts without a copy).
TEST(SdpaApi, ExpandedBroadcastViewNamesTheSizeOneShape) {
  constexpr int64_t s = 16, d = 16;
  std::vector<float> q(s * d, 0.5f), o(s * d), bias(s, 0.25f), scale{1.0f};
  std::vector<uint8_t> mask(s, 1);
  TensorDesc qd(q.data(), kFloat32, cpu(), {1, 1, s, d}), od(o.data(), kFloat32, cpu(), {1, 1, s, d});
  auto message = [&](const SdpaAttributes& attr) -> std::string {
    try {
      SdpaFwd fwd(qd, qd, qd, od, nullptr, attr);
    } catch (const Exception& e) {
      EXPECT_EQ(e.status(), FS_STATUS_INVALID_ARGUMENT) << e.what();
      return e.what();
    }
    return "";
  };
  // [1, 1, 16, 1] expanded to [1, 1, 16, 16]; [1, 1, 1, 1] expanded to [1, 1, 16, 16].
  const TensorDesc rows(bias.data(), kFloat32, cpu(), {1, 1, s, s}, {s, s, 1, 0});
  const TensorDesc one(bias.data(), kFloat32, cpu(), {1, 1, s, s}, {1, 1, 0, 0});
  SdpaAttributes a1;
  a1.set_bias(rows);
  EXPECT_EQ(message(a1),
            "bias: last dimension must be contiguous (stride 1), got stride 0: an expanded (broadcast) view; pass the "
            "size-1 shape [1, 1, 16, 1] instead (dims of size 1 broadcast to [1, 1, 16, 16] without a copy)");
  SdpaAttributes a2;
  a2.set_bias(one);
  EXPECT_TRUE(begins(message(a2), "bias: last dimension must be contiguous (stride 1), got stride 0: an expanded "
                                  "(broadcast) view; pass the size-1 shape [1, 1, 1, 1] instead"))
      << message(a2);
  SdpaAttributes a3;
  a3.set_dropout_mask(TensorDesc(mask.data(), kUInt8, cpu(), {1, 1, s, s}, {s, s, 1, 0}),
                      TensorDesc(scale.data(), kFloat32, cpu(), {1}));
  EXPECT_TRUE(begins(message(a3), "dropout mask: last dimension must be contiguous (stride 1), got stride 0: an "
                                  "expanded (broadcast) view; pass the size-1 shape [1, 1, 16, 1] instead"))
      << message(a3);
  // Another stride keeps the plain rule; the size-1 shape itself is accepted.
  std::vector<float> wide(2 * s * s, 0.25f);
  SdpaAttributes a4;
  a4.set_bias(TensorDesc(wide.data(), kFloat32, cpu(), {1, 1, s, s}, {2 * s * s, 2 * s * s, 2 * s, 2}));
  EXPECT_EQ(message(a4), "bias: last dimension must be contiguous (stride 1), got stride 2");
  SdpaAttributes a5;
  a5.set_bias(TensorDesc(bias.data(), kFloat32, cpu(), {1, 1, s, 1}));
  EXPECT_EQ(message(a5), "");
}

TEST(SdpaApi, PagedErrorsNameThePagedLayout) {
  EXPECT_EQ(PagedCall{}.run(), "");
  // A container of the wrong rank is named as a container, with its page table.
  PagedCall rank;
  rank.k_rank = 3;
  std::string m = rank.run();
  EXPECT_TRUE(begins(m, "k: must be a 4-D tensor [num_blocks, H_k, block_size, D_qk] (a paged container: "
                        "paged_attention_k_table is given), got rank 3")) << m;
  PagedCall block;
  block.block_v = 6;
  m = block.run();
  EXPECT_TRUE(begins(m, "v: the block size (dim 2) of a paged container [num_blocks, H_v, block_size, D_v] must be a "
                        "power of two, got 6")) << m;
  // The dense layout's words are kept for dense tensors.
  PagedCall dense_rank = rank;
  dense_rank.table_k = dense_rank.table_v = false;
  dense_rank.block_v = 0;
  m = dense_rank.run();
  EXPECT_TRUE(begins(m, "k: must be a 4-D tensor [B, H_k, S_kv, D_qk], got rank 3")) << m;
}

TEST(SdpaApi, PagedOneTableOnlyNamesBothTables) {
  for (bool k_side : {true, false}) {
    PagedCall c;
    (k_side ? c.table_v : c.table_k) = false;  // a container given without its table
    const std::string m = c.run();
    const std::string dense = k_side ? "v" : "k", given = k_side ? "paged_attention_k_table" : "paged_attention_v_table",
                      missing = k_side ? "paged_attention_v_table" : "paged_attention_k_table";
    EXPECT_TRUE(begins(m, dense + ": batch 8 differs from q's B = 2 (" + given + " is given but " + missing +
                              " is not")) << m;
    EXPECT_TRUE(contains(m, "pass both paged_attention_k_table and paged_attention_v_table")) << m;
  }
  // K alone paged with a dense V of the right shape runs (the seed's optional per-side tables).
  PagedCall k_alone;
  k_alone.table_v = false;
  k_alone.dense_s = 32;
  k_alone.block_v = 0;
  EXPECT_EQ(k_alone.run(), "");
}

TEST(SdpaApi, PagedCapacityStatesTheRuleWithNumbers) {
  PagedCall max_seq;
  max_seq.max_seq = 40;
  std::string m = max_seq.run();
  EXPECT_TRUE(begins(m, "paged_attention_max_seq_len_kv: 40 exceeds the capacity of the page tables: it must be <= "
                        "max_pages * block_size = 4 * 8 = 32 (max_pages of paged_attention_k_table")) << m;
  // The smaller side bounds it, and is named.
  PagedCall smaller = max_seq;
  smaller.block_v = 4;
  smaller.max_seq = 20;
  m = smaller.run();
  EXPECT_TRUE(contains(m, "max_pages * block_size = 4 * 4 = 16 (max_pages of paged_attention_v_table")) << m;
  // A length past the tables' capacity (the default S_kv).
  PagedCall lens;
  lens.len_kv = {5, 40};
  m = lens.run();
  EXPECT_TRUE(begins(m, "seq_len_kv: sample 1 has length 40, outside [0, S_kv = 32]: with paged K/V a sample's "
                        "length must be <= the page tables' capacity, max_pages * block_size = 4 * 8 = 32")) << m;
  // With paged_attention_max_seq_len_kv, that bound is named.
  PagedCall bounded = lens;
  bounded.max_seq = 16;
  m = bounded.run();
  EXPECT_TRUE(begins(m, "seq_len_kv: sample 1 has length 40, outside [0, paged_attention_max_seq_len_kv = 16]")) << m;
  // A dense side longer than the paged side's capacity is named as the dense side.
  PagedCall dense_v;
  dense_v.table_v = false;
  dense_v.block_v = 0;
  dense_v.dense_s = 64;
  m = dense_v.run();
  EXPECT_TRUE(begins(m, "v: sequence length S_kv = 64 exceeds the capacity of the page tables of the paged side: it "
                        "must be <= max_pages * block_size = 4 * 8 = 32")) << m;
}

// q, k, v in BSHD order [B, S, H, D]: where a rule on H or S breaks and the BSHD reading passes it, the message says so.
TEST(SdpaApi, BshdShapesAreNamedWhereARuleOnHeadsBreaks) {
  std::vector<float> buf(2 * 32 * 4 * 8);
  auto refusal = [&](std::vector<int64_t> qs, std::vector<int64_t> ks, const TensorDesc* sinks) -> std::string {
    TensorDesc q(buf.data(), kFloat32, cpu(), qs), k(buf.data(), kFloat32, cpu(), ks), v(buf.data(), kFloat32, cpu(), ks);
    TensorDesc o(buf.data(), kFloat32, cpu(), {qs[0], qs[1], qs[2], qs[3]});
    SdpaAttributes attr;
    if (sinks != nullptr) attr.set_sink_token(*sinks);
    try {
      SdpaFwd fwd(q, k, v, o, nullptr, attr);
    } catch (const Exception& e) {
      EXPECT_EQ(e.status(), FS_STATUS_INVALID_ARGUMENT);
      return e.what();
    }
    return "";
  };
  const std::string hint = " (q, k, v are read as [B, H, S, D]; read as [B, S, H, D] they would pass this rule, with "
                           "H_q = 4 and S_q = 16: if they are BSHD, pass q.transpose(1, 2), k.transpose(1, 2), "
                           "v.transpose(1, 2), views without a copy)";
  // BSHD q [2, 16, 4, 8], k / v [2, 32, 2, 8]: read as BHSD, H_k = 32 does not divide H_q = 16.
  std::string m = refusal({2, 16, 4, 8}, {2, 32, 2, 8}, nullptr);
  EXPECT_TRUE(begins(m, "k, v: for MHA / GQA / MQA the K and V head counts must divide H_q = 16, got H_k = 32"));
  EXPECT_TRUE(m.size() > hint.size() && m.compare(m.size() - hint.size(), hint.size(), hint) == 0) << m;
  // Four sinks (H = 4) for BSHD q: read as BHSD, H_q = 16.
  std::vector<float> s4(4);
  TensorDesc sinks(s4.data(), kFloat32, cpu(), {4});
  m = refusal({2, 16, 4, 8}, {2, 16, 4, 8}, &sinks);
  EXPECT_TRUE(begins(m, "sink_token: must have 16 element(s)")) << m;
  EXPECT_TRUE(contains(m, hint)) << m;
  // A BHSD call whose sinks fit neither reading: no hint.
  m = refusal({2, 4, 16, 8}, {2, 4, 16, 8}, &sinks);
  EXPECT_EQ(m, "");
  TensorDesc sinks3(s4.data(), kFloat32, cpu(), {3});
  m = refusal({2, 4, 16, 8}, {2, 4, 16, 8}, &sinks3);
  EXPECT_TRUE(begins(m, "sink_token: must have 4 element(s)")) << m;
  EXPECT_FALSE(contains(m, "BSHD")) << m;
}

// ---------------------------------------------------------------------------
// CUDA descriptors: what check_support names before any CUDA call (CPU-testable)
// ---------------------------------------------------------------------------

fs_device_t cuda() { return {FS_DEVICE_CUDA, 0}; }

// check_support() of a forward on CUDA bf16 descriptors [B, H, S, 64] with `setup` applied;
// returns the exception's message ("" when it succeeded or failed for a device reason).
template <class Setup>
std::string cuda_fwd_refusal(Setup setup, int64_t hv = Hk, bool stats = false) {
  TensorDesc q(nullptr, kBFloat16, cuda(), {B, Hq, Sq, 64}), k(nullptr, kBFloat16, cuda(), {B, Hk, Skv, 64}),
      v(nullptr, kBFloat16, cuda(), {B, hv, Skv, 64}), o(nullptr, kBFloat16, cuda(), {B, Hq, Sq, 64});
  TensorDesc st(nullptr, kFloat32, cuda(), {B, Hq, Sq, 1});
  SdpaAttributes attr;
  setup(attr);
  SdpaFwd fwd(q, k, v, o, stats ? &st : nullptr, attr);
  try {
    fwd.check_support();
  } catch (const Exception& e) {
    if (e.status() == FS_STATUS_NOT_SUPPORTED) return e.what();
  }
  return "";
}

// Runs fn with FLASHSPAN_SDPA_FEATURE_PAIRS and FLASHSPAN_EXPERIMENTAL set to `pairs` and `experimental`
// (nullptr: unset), then restores both: the feature pairs (max_logit with sinks, score_max / score_sum_exp
// with a packed O, the bias or dropout with paged K/V) run on CUDA tensors unless FLASHSPAN_SDPA_FEATURE_PAIRS
// is "0" (read per check_support; on by default since their GPU tests passed on an H200), and
// FLASHSPAN_EXPERIMENTAL (their switch before) no longer changes that.
template <class Fn>
void with_pairs_env(const char* pairs, const char* experimental, Fn&& fn) {
  const ScopedEnv p("FLASHSPAN_SDPA_FEATURE_PAIRS", pairs);
  const ScopedEnv e("FLASHSPAN_EXPERIMENTAL", experimental);
  fn();
}

// The feature pairs' refusal with FLASHSPAN_SDPA_FEATURE_PAIRS=0 (sdpa_support.cpp switched_pair).
std::string pair_turned_off(const std::string& feature) {
  return feature + ": turned off on CUDA tensors by FLASHSPAN_SDPA_FEATURE_PAIRS=0; CPU tensors run it on the CPU "
                   "reference";
}

TEST(SdpaApi, CudaFeaturesNotNativeAreNamed) {
  const std::string tail = ": not supported on CUDA tensors yet";
  auto starts = [](const std::string& msg, const std::string& prefix) { return msg.rfind(prefix, 0) == 0; };
  const TensorDesc bias(nullptr, kBFloat16, cuda(), {1, Hq, Sq, Skv});
  // Native now (issue 24): the additive bias (q's dtype or float32, any broadcast form), ALiBi,
  // softcap, sinks, a host attn_scale tensor, H_k != H_v in the forward; no feature refusal
  // (check_support then stops at the device, if any).
  EXPECT_EQ(cuda_fwd_refusal([&](SdpaAttributes& a) { a.set_bias(bias); }), "");
  const TensorDesc bias32(nullptr, kFloat32, cuda(), {B, 1, 1, Skv});
  EXPECT_EQ(cuda_fwd_refusal([&](SdpaAttributes& a) { a.set_bias(bias32).set_softcap(5.0f); }), "");
  EXPECT_EQ(cuda_fwd_refusal([](SdpaAttributes& a) { a.set_causal_mask(true).set_alibi_mask(true); }), "");
  EXPECT_EQ(cuda_fwd_refusal([](SdpaAttributes& a) { a.set_softcap(30.0f); }), "");
  const TensorDesc sinks(nullptr, kFloat32, cuda(), {Hq});
  EXPECT_EQ(cuda_fwd_refusal([&](SdpaAttributes& a) { a.set_sink_token(sinks); }), "");
  const TensorDesc host_scale(nullptr, kFloat32, cpu(), {1, 1, 1, 1});
  EXPECT_EQ(cuda_fwd_refusal([&](SdpaAttributes& a) { a.set_attn_scale(host_scale); }), "");
  EXPECT_EQ(cuda_fwd_refusal([](SdpaAttributes&) {}, /*hv=*/2), "");
  const TensorDesc ml(nullptr, kFloat32, cuda(), {Hq});
  // max_logit with sinks: a feature pair (the sink folded into the statistics after the walk): accepted by
  // default and with FLASHSPAN_SDPA_FEATURE_PAIRS anything but "0" (FLASHSPAN_EXPERIMENTAL whatever it says);
  // refused with "0", naming the pair and the variable.
  auto sink_ml = [&](SdpaAttributes& a) { a.set_sink_token(sinks).set_max_logit(ml); };
  for (const char* experimental : {static_cast<const char*>(nullptr), "0", "1"}) {
    for (const char* pairs : {static_cast<const char*>(nullptr), "1", "", "off"}) {
      with_pairs_env(pairs, experimental, [&] {
        EXPECT_EQ(cuda_fwd_refusal(sink_ml), "")
            << "FLASHSPAN_SDPA_FEATURE_PAIRS=" << (pairs ? pairs : "(unset)")
            << " FLASHSPAN_EXPERIMENTAL=" << (experimental ? experimental : "(unset)");
      });
    }
    with_pairs_env("0", experimental, [&] {
      EXPECT_EQ(cuda_fwd_refusal(sink_ml), pair_turned_off("max_logit together with sink_token"))
          << "FLASHSPAN_EXPERIMENTAL=" << (experimental ? experimental : "(unset)");
    });
  }
  const TensorDesc seed(nullptr, kInt64, cuda(), {1}), offset(nullptr, kInt64, cuda(), {1});
  // Dropout (Philox, and the caller's mask) with rng_dump: native (float64 masks / dumps are not).
  EXPECT_EQ(cuda_fwd_refusal([&](SdpaAttributes& a) { a.set_dropout(0.1f, seed, offset); }), "");
  const TensorDesc dump(nullptr, kUInt8, cuda(), {B, Hq, Sq, Skv}), dump64(nullptr, kFloat64, cuda(), {B, Hq, Sq, Skv});
  EXPECT_EQ(cuda_fwd_refusal([&](SdpaAttributes& a) { a.set_dropout(0.1f, seed, offset).set_rng_dump(dump); }), "");
  EXPECT_TRUE(
      starts(cuda_fwd_refusal([&](SdpaAttributes& a) { a.set_dropout(0.1f, seed, offset).set_rng_dump(dump64); }),
             "rng_dump: float64 is not supported on CUDA tensors"));
  const TensorDesc dmask(nullptr, kUInt8, cuda(), {1, Hq, 1, Skv}), dscale(nullptr, kFloat32, cuda(), {1});
  EXPECT_EQ(cuda_fwd_refusal([&](SdpaAttributes& a) { a.set_dropout_mask(dmask, dscale); }), "");
  // Native too (issue 24): the block_mask, the output gate, score_max / score_sum_exp.
  const TensorDesc bm(nullptr, kUInt8, cuda(), {1, 1, 1, 1});
  EXPECT_EQ(cuda_fwd_refusal([&](SdpaAttributes& a) { a.set_block_mask(bm); }), "");
  const TensorDesc gate(nullptr, kBFloat16, cuda(), {B, Hq, Sq, 64});
  EXPECT_EQ(cuda_fwd_refusal([&](SdpaAttributes& a) { a.set_gate(gate); }), "");
  const TensorDesc row_stat(nullptr, kFloat32, cuda(), {B, Hq, Sq, 1});
  EXPECT_EQ(cuda_fwd_refusal([&](SdpaAttributes& a) { a.set_logit_max(row_stat).set_score_sum_exp(row_stat); }), "");
  const TensorDesc scale(nullptr, kFloat32, cuda(), {1});
  EXPECT_TRUE(starts(cuda_fwd_refusal([&](SdpaAttributes& a) { a.set_attn_scale(scale); }),
                     "attn_scale as a device tensor" + tail + " (the 16-bit kernels take the scale as a float"));
  // Paged K/V: containers [blocks, H, block, D] with page tables (and the padding mask).
  {
    TensorDesc q(nullptr, kBFloat16, cuda(), {B, Hq, Sq, 64}), kc(nullptr, kBFloat16, cuda(), {4, Hk, 4, 64}),
        vc(nullptr, kBFloat16, cuda(), {4, Hk, 4, 64}), o(nullptr, kBFloat16, cuda(), {B, Hq, Sq, 64});
    const TensorDesc table(nullptr, kInt32, cuda(), {B, 1, 2, 1}), lq(nullptr, kInt32, cuda(), {B}),
        lk(nullptr, kInt32, cuda(), {B});
    SdpaAttributes attr;
    attr.set_padding_mask(true).set_seq_len_q(lq).set_seq_len_kv(lk);
    attr.set_paged_attention_k_table(table).set_paged_attention_v_table(table);
    SdpaFwd fwd(q, kc, vc, o, nullptr, attr);
    // On by default (kv_addr.cuh PagedKv); FLASHSPAN_SDPA_PAGED=0 refuses them (test_sdpa_paged.cpp
    // SdpaPaged.CudaRules checks both verdicts). Without a GPU check_support then stops at the device.
    const char* had = std::getenv("FLASHSPAN_SDPA_PAGED");
    if (had == nullptr) {
      try {
        fwd.check_support();
      } catch (const Exception& e) {
        EXPECT_FALSE(starts(e.what(), "paged_attention_k_table")) << e.what();
      }
      setenv("FLASHSPAN_SDPA_PAGED", "0", 1);
      try {
        fwd.check_support();
        ADD_FAILURE() << "paged K/V accepted on CUDA tensors with FLASHSPAN_SDPA_PAGED=0";
      } catch (const Exception& e) {
        EXPECT_EQ(e.status(), FS_STATUS_NOT_SUPPORTED);
        EXPECT_TRUE(starts(e.what(), "paged_attention_k_table, paged_attention_v_table: paged K/V caches on CUDA "
                                     "tensors are turned off by FLASHSPAN_SDPA_PAGED=0"))
            << e.what();
      }
      unsetenv("FLASHSPAN_SDPA_PAGED");
    }
  }
  // Backward-only features.
  {
    TensorDesc q(nullptr, kBFloat16, cuda(), {B, Hq, Sq, 64}), k(nullptr, kBFloat16, cuda(), {B, Hk, Skv, 64}),
        v(nullptr, kBFloat16, cuda(), {B, Hk, Skv, 64}), o(nullptr, kBFloat16, cuda(), {B, Hq, Sq, 64}),
        dO(nullptr, kBFloat16, cuda(), {B, Hq, Sq, 64}), st(nullptr, kFloat32, cuda(), {B, Hq, Sq, 1}),
        dq(nullptr, kBFloat16, cuda(), {B, Hq, Sq, 64}), dk(nullptr, kBFloat16, cuda(), {B, Hk, Skv, 64}),
        dv(nullptr, kBFloat16, cuda(), {B, Hk, Skv, 64});
    // dBias: native; together with softcap on the sm90 backward (sdpa_dispatch.cu check_dbias_with_softcap), on by
    // default since its GPU test passed on an H100, and on the sm80 backward for the other calls (below): with the
    // sm80 one's switch pinned off, refused without an sm_90 device (CI) or with FLASHSPAN_KERNEL_FAMILY=sm80, naming
    // the rule and why the sm90 backward does not take it, on an H100 / H200 accepted; refused with
    // FLASHSPAN_SDPA_DBIAS_SOFTCAP=0, naming the variable (the switch's rule: expect_off_switch). Not a feature pair:
    // whatever FLASHSPAN_SDPA_FEATURE_PAIRS says.
    SdpaBackwardAttributes attr;
    attr.set_bias(bias).set_dbias(bias).set_softcap(20.0f);
    SdpaBwd bwd(q, k, v, o, dO, st, dq, dk, dv, attr);
    const std::string not_taken = "dBias together with softcap: runs on the sm90 backward (an H100 / H200";
    const std::string turned_off = "dBias together with softcap: turned off on CUDA tensors by "
                                   "FLASHSPAN_SDPA_DBIAS_SOFTCAP=0 (unset, the sm90 backward runs it on an H100 / "
                                   "H200, head dims up to 128, padded tensors, and the sm80 backward the other "
                                   "calls); CPU tensors run it on the CPU reference";
    const std::string sm80_off = "and on the sm80 backward, whose path for it is turned off "
                                 "(sdpa_dbias_softcap_sm80_enabled; on unless FLASHSPAN_SDPA_DBIAS_SOFTCAP=0)";
    auto dbias_softcap = [&](bool on, const std::string& where) {
      try {
        bwd.check_support();  // (on: an sm_90 device with this build's sm_90a code)
        EXPECT_TRUE(on) << "dBias with softcap accepted on CUDA tensors with " << where;
      } catch (const Exception& e) {
        EXPECT_EQ(e.status(), FS_STATUS_NOT_SUPPORTED) << where;
        if (on) {
          EXPECT_TRUE(starts(e.what(), not_taken)) << e.what() << " (" << where << ")";
          EXPECT_NE(std::string(e.what()).find("CPU tensors run it on the CPU reference"), std::string::npos)
              << e.what();
        } else {
          EXPECT_EQ(e.what(), turned_off) << where;
        }
      }
    };
    for (const char* pairs : {static_cast<const char*>(nullptr), "0", "1"}) {
      const ScopedEnv p("FLASHSPAN_SDPA_FEATURE_PAIRS", pairs);
      // (the sm80 backward's switch pinned off: on, it takes the calls the sm90 one does not; checked below)
      const flashspan::test::ScopedSwitch sm80_pinned_off(flashspan::set_sdpa_dbias_softcap_sm80_enabled, 0);
      flashspan::test::expect_off_switch("FLASHSPAN_SDPA_DBIAS_SOFTCAP", flashspan::set_sdpa_dbias_softcap_enabled,
                                         flashspan::sdpa_dbias_softcap_enabled, dbias_softcap);
    }
    // The sm80 backward (sdpa_dbias_softcap_sm80_enabled: on by default since its GPU test passed on an H200; off
    // with FLASHSPAN_SDPA_DBIAS_SOFTCAP=0, the pair's one variable, whatever FLASHSPAN_EXPERIMENTAL says; the override
    // wins both ways: expect_off_switch, with the pair's own switch pinned on). With FLASHSPAN_KERNEL_FAMILY=sm80 (the
    // sm90 backward takes nothing): on, the call passes this rule (without a GPU it then stops at the device, with
    // one it is accepted); off, refused naming the rule and the variable. FLASHSPAN_SDPA_DBIAS_SOFTCAP=0 (both
    // switches at their environment's answer) refuses it as turned off, whatever the sm80 switch's override says.
    {
      const ScopedEnv family("FLASHSPAN_KERNEL_FAMILY", "sm80");
      auto sm80_path = [&](bool on, const std::string& where) {
        try {
          bwd.check_support();
          EXPECT_TRUE(on) << "dBias with softcap accepted on CUDA tensors with FLASHSPAN_KERNEL_FAMILY=sm80 and "
                          << where;
        } catch (const Exception& ex) {
          if (on) {
            EXPECT_FALSE(starts(ex.what(), "dBias together with softcap")) << ex.what() << " (" << where << ")";
          } else {
            EXPECT_EQ(ex.status(), FS_STATUS_NOT_SUPPORTED) << where;
            EXPECT_TRUE(starts(ex.what(), not_taken)) << ex.what() << " (" << where << ")";
            EXPECT_NE(std::string(ex.what()).find(sm80_off), std::string::npos) << ex.what();
          }
        }
      };
      {
        const flashspan::test::ScopedSwitch pair_pinned_on(flashspan::set_sdpa_dbias_softcap_enabled, 1);
        flashspan::test::expect_off_switch("FLASHSPAN_SDPA_DBIAS_SOFTCAP",
                                           flashspan::set_sdpa_dbias_softcap_sm80_enabled,
                                           flashspan::sdpa_dbias_softcap_sm80_enabled, sm80_path);
      }
      const ScopedEnv pair_off("FLASHSPAN_SDPA_DBIAS_SOFTCAP", "0");
      for (int forced : {-1, 0, 1}) {
        const flashspan::test::ScopedSwitch sw(flashspan::set_sdpa_dbias_softcap_sm80_enabled, forced);
        try {
          bwd.check_support();
          ADD_FAILURE() << "dBias with softcap accepted on CUDA tensors with FLASHSPAN_SDPA_DBIAS_SOFTCAP=0";
        } catch (const Exception& ex) {
          EXPECT_EQ(ex.what(), turned_off) << "sm80 override " << forced;
        }
      }
    }
    // With dropout too: on the sm80 backward (sdpa_dbias_softcap_dropout_enabled: on by default since its GPU test
    // passed on an H100; FLASHSPAN_SDPA_DBIAS_SOFTCAP_DROPOUT=0 off, expect_off_switch's rule), the sm90 backward
    // refusing the triple (sm90_refusal); off, refused on every GPU, naming the variable. On, the call passes the rule
    // (without a GPU it then stops at the device, with one it is accepted: the sm80 backward runs it).
    {
      SdpaBackwardAttributes attr_drop;
      const TensorDesc seed(nullptr, kInt64, cuda(), {1}), offset(nullptr, kInt64, cuda(), {1});
      attr_drop.set_bias(bias).set_dbias(bias).set_softcap(20.0f).set_dropout(0.1f, seed, offset);
      SdpaBwd bwd_drop(q, k, v, o, dO, st, dq, dk, dv, attr_drop);
      auto triple = [&](bool on, const std::string& where) {
        try {
          bwd_drop.check_support();
          EXPECT_TRUE(on) << "dBias with softcap and dropout accepted on CUDA tensors with " << where;
        } catch (const Exception& e) {
          if (on) {
            EXPECT_FALSE(starts(e.what(), "dBias together with softcap")) << e.what() << " (" << where << ")";
          } else {
            EXPECT_EQ(e.status(), FS_STATUS_NOT_SUPPORTED) << where;
            EXPECT_EQ(e.what(), std::string("dBias together with softcap and dropout: turned off on CUDA tensors by "
                                            "FLASHSPAN_SDPA_DBIAS_SOFTCAP_DROPOUT=0 (unset, the sm80 backward runs "
                                            "it); CPU tensors run it on the CPU reference"))
                << where;
          }
        }
      };
      flashspan::test::expect_off_switch("FLASHSPAN_SDPA_DBIAS_SOFTCAP_DROPOUT",
                                         flashspan::set_sdpa_dbias_softcap_dropout_enabled,
                                         flashspan::sdpa_dbias_softcap_dropout_enabled, triple);
    }
    SdpaBackwardAttributes attr_db;
    attr_db.set_bias(bias).set_dbias(bias);
    SdpaBwd bwd_db(q, k, v, o, dO, st, dq, dk, dv, attr_db);
    try {
      bwd_db.check_support();
    } catch (const Exception& e) {
      EXPECT_NE(e.status(), FS_STATUS_NOT_SUPPORTED) << e.what();
    }
    // H_k != H_v and sinks with dSink: native in the backward too (no feature refusal).
    TensorDesc v2(nullptr, kBFloat16, cuda(), {B, 2 * Hk, Skv, 64}), dv2(nullptr, kBFloat16, cuda(), {B, 2 * Hk, Skv, 64});
    SdpaBackwardAttributes attr2;
    attr2.set_sink_token(TensorDesc(nullptr, kFloat32, cuda(), {Hq}))
        .set_dsink_token(TensorDesc(nullptr, kFloat32, cuda(), {Hq}))
        .set_softcap(20.0f);
    SdpaBwd bwd2(q, k, v2, o, dO, st, dq, dk, dv2, attr2);
    try {
      bwd2.check_support();
    } catch (const Exception& e) {
      EXPECT_NE(e.status(), FS_STATUS_NOT_SUPPORTED) << e.what();
    }
  }
}

// The pair's one variable, FLASHSPAN_SDPA_DBIAS_SOFTCAP, read by both backwards' switches of dBias together with
// softcap (dispatch/sdpa_launch.h sdpa_dbias_softcap_enabled: the sm90 backward, its GPU test passed on an H100;
// sdpa_dbias_softcap_sm80_enabled: the sm80 backward, its GPU test passed on an H200): each on by default, off when
// it is exactly "0" (expect_off_switch: read per call, FLASHSPAN_EXPERIMENTAL ignored, the override wins both ways).
// No CUDA build needed; what they change: CudaFeaturesNotNativeAreNamed.
TEST(SdpaApi, DbiasSoftcapSwitchesReadTheEnvironment) {
  flashspan::test::expect_off_switch("FLASHSPAN_SDPA_DBIAS_SOFTCAP", flashspan::set_sdpa_dbias_softcap_enabled,
                                     flashspan::sdpa_dbias_softcap_enabled);
  flashspan::test::expect_off_switch("FLASHSPAN_SDPA_DBIAS_SOFTCAP", flashspan::set_sdpa_dbias_softcap_sm80_enabled,
                                     flashspan::sdpa_dbias_softcap_sm80_enabled);
}

// The sm90 forward's fused softcap path (dispatch/sdpa_launch.h sdpa_sm90_fused_softcap_enabled, PERF_LOG v2.77): on
// by default, off when FLASHSPAN_SM90_SDPA_FUSED_SOFTCAP is exactly "0" (read per call, FLASHSPAN_EXPERIMENTAL
// ignored, the override wins both ways). What it changes: SdpaParams.FusedSoftcapFollowsItsSwitch.
TEST(SdpaApi, FusedSoftcapSwitchReadsTheEnvironment) {
  flashspan::test::expect_off_switch("FLASHSPAN_SM90_SDPA_FUSED_SOFTCAP",
                                     flashspan::set_sdpa_sm90_fused_softcap_enabled,
                                     flashspan::sdpa_sm90_fused_softcap_enabled);
}

TEST(SdpaApi, CudaLayoutRules) {
  auto starts = [](const std::string& msg, const std::string& prefix) { return msg.rfind(prefix, 0) == 0; };
  // Head dims the GPU kernels do not run.
  {
    TensorDesc q(nullptr, kBFloat16, cuda(), {B, Hq, Sq, 160}), k(nullptr, kBFloat16, cuda(), {B, Hk, Skv, 160}),
        v(nullptr, kBFloat16, cuda(), {B, Hk, Skv, 128}), o(nullptr, kBFloat16, cuda(), {B, Hq, Sq, 128});
    SdpaFwd fwd(q, k, v, o, nullptr, SdpaAttributes());
    try {
      fwd.check_support();
      ADD_FAILURE() << "head dims (160, 128) accepted on CUDA tensors";
    } catch (const Exception& e) {
      EXPECT_EQ(e.status(), FS_STATUS_NOT_SUPPORTED);
      EXPECT_TRUE(starts(e.what(), "q, v: head dims (D_qk, D_v) = (160, 128) are not supported on CUDA tensors"))
          << e.what();
    }
  }
  // A ragged multiplier that cannot keep samples on 16-byte boundaries, and O packed with the
  // stats padded.
  const TensorDesc offs(nullptr, kInt32, cuda(), {B + 1}), lq(nullptr, kInt32, cuda(), {B}), lk(nullptr, kInt32, cuda(), {B});
  EXPECT_TRUE(starts(cuda_fwd_refusal([&](SdpaAttributes& a) {
                       a.set_padding_mask(true).set_seq_len_q(lq).set_seq_len_kv(lk).set_ragged_offset(FS_SDPA_Q, offs, 1);
                     }),
                     "ragged offset of q: the multiplier 1 must be a multiple of 8 on CUDA tensors"));
  EXPECT_TRUE(starts(cuda_fwd_refusal(
                         [&](SdpaAttributes& a) {
                           a.set_padding_mask(true).set_seq_len_q(lq).set_seq_len_kv(lk).set_generate_stats(true);
                           a.set_ragged_offset(FS_SDPA_O, offs, Hq * 64);
                         },
                         Hk, /*stats=*/true),
                     "o, stats: one is packed (ragged offsets) and the other padded"));
  // score_max / score_sum_exp are never packed: with a packed O on CUDA tensors a feature pair (their rows
  // past each sample filled by a kernel of their own): accepted by default, refused with
  // FLASHSPAN_SDPA_FEATURE_PAIRS=0 (FLASHSPAN_EXPERIMENTAL=1 does not bring them back).
  const TensorDesc row_stat(nullptr, kFloat32, cuda(), {B, Hq, Sq, 1});
  auto packed_o_stats = [&](SdpaAttributes& a) {
    a.set_padding_mask(true).set_seq_len_q(lq).set_seq_len_kv(lk).set_logit_max(row_stat);
    a.set_score_sum_exp(row_stat);
    a.set_ragged_offset(FS_SDPA_O, offs, Hq * 64);
  };
  const std::string packed_off = pair_turned_off("score_max together with a packed o (ragged offsets)");
  with_pairs_env(nullptr, nullptr, [&] { EXPECT_EQ(cuda_fwd_refusal(packed_o_stats), ""); });
  with_pairs_env(nullptr, "0", [&] { EXPECT_EQ(cuda_fwd_refusal(packed_o_stats), ""); });
  with_pairs_env("1", nullptr, [&] { EXPECT_EQ(cuda_fwd_refusal(packed_o_stats), ""); });
  with_pairs_env("0", nullptr, [&] { EXPECT_EQ(cuda_fwd_refusal(packed_o_stats), packed_off); });
  with_pairs_env("0", "1", [&] { EXPECT_EQ(cuda_fwd_refusal(packed_o_stats), packed_off); });
}

TEST(SdpaApi, CudaBackwardWorkspaceSize) {
  // D and LSE log2(e) of B * S_q rows per query head (256-byte aligned each), plus the fp32 dQ
  // accumulator unless deterministic; the forward (a decode call) its slots.
  TensorDesc q(nullptr, kBFloat16, cuda(), {B, Hq, Sq, 64}), k(nullptr, kBFloat16, cuda(), {B, Hk, Skv, 64}),
      v(nullptr, kBFloat16, cuda(), {B, Hk, Skv, 64}), o(nullptr, kBFloat16, cuda(), {B, Hq, Sq, 64}),
      dO(nullptr, kBFloat16, cuda(), {B, Hq, Sq, 64}), st(nullptr, kFloat32, cuda(), {B, Hq, Sq, 1}),
      dq(nullptr, kBFloat16, cuda(), {B, Hq, Sq, 64}), dk(nullptr, kBFloat16, cuda(), {B, Hk, Skv, 64}),
      dv(nullptr, kBFloat16, cuda(), {B, Hk, Skv, 64});
  auto align = [](size_t x) { return (x + 255) / 256 * 256; };
  const size_t rows = size_t(Hq * B * Sq) * sizeof(float);
  // The call is one the sm90 backward covers (sdpa_bwd_sm90_refusal: D = 64, bf16, dense), so the
  // accumulator also holds its dQ tiles (one 64 x 64 fp32 tile per (query head, sample, 64-row
  // query block)) and, deterministic, one int32 counter per tile after them; then the cells' item
  // counter in a 256-byte line (the causal band's heads-fastest cells, or the deterministic order).
  const size_t tiles = sizeof(float) * size_t(Hq * B * ((Sq + 63) / 64)) * 64 * 64;
  const size_t sem = sizeof(int32_t) * flashspan::kDqSemStride * size_t(Hq * B * ((Sq + 63) / 64));
  for (bool det : {true, false}) {
    SdpaBackwardAttributes attr;
    attr.set_causal_mask(true).set_deterministic_algorithm(det);
    SdpaBwd bwd(q, k, v, o, dO, st, dq, dk, dv, attr);
    EXPECT_EQ(bwd.workspace_size(), 2 * align(rows) + (det ? align(tiles) + align(sem)
                                                           : align(std::max(align(rows) * 64, tiles))) + 256)
        << "deterministic " << det;
  }
  // The forward of this shape (S_q H_q / H_k = 10 <= 16) is a decode call: the decode forward's slots,
  // [slots, 16, D_v] + [slots, 2, 16] fp32, here 2 tasks (B H_k) of one item each (S_kv: one key block).
  SdpaFwd fwd(q, k, v, o, nullptr, SdpaAttributes());
  EXPECT_EQ(fwd.workspace_size(), align(sizeof(float) * 2 * 16 * 64) + align(sizeof(float) * 2 * 2 * 16));
}

// ---------------------------------------------------------------------------
// An empty batch (B = 0): a valid call, empty outputs, the per-head reductions' identities
// (sdpa::empty_batch_fills; docs/SDPA.md "An empty batch")
// ---------------------------------------------------------------------------

// A forward and a backward of B = 0 on CPU float32 tensors (H_q = 2, H_k = 1, S_q = 5, S_kv = 7, D = 8), with every
// output a batch reduction fills: max_logit (-inf), dSink (0) and a dBias broadcast over the batch (0, given with
// padded strides), pre-filled with other values; the tensors with a batch dim are empty (NULL data pointers). Before
// the change, construction raised "q: batch size must be positive, got 0".
TEST(SdpaApi, EmptyBatchRunsAndFillsThePerHeadReductions) {
  constexpr int64_t b0 = 0;
  const TensorDesc q(nullptr, kFloat32, cpu(), {b0, Hq, Sq, D}), k(nullptr, kFloat32, cpu(), {b0, Hk, Skv, D}),
      v(nullptr, kFloat32, cpu(), {b0, Hk, Skv, D}), o(nullptr, kFloat32, cpu(), {b0, Hq, Sq, D}),
      st(nullptr, kFloat32, cpu(), {b0, Hq, Sq, 1});
  std::vector<float> sinks{0.5f, -0.25f}, max_logit(Hq, 5.0f), bias(Hq * Sq * Skv, 1.0f);
  const TensorDesc sd(sinks.data(), kFloat32, cpu(), {Hq}), mld(max_logit.data(), kFloat32, cpu(), {Hq}),
      bd(bias.data(), kFloat32, cpu(), {1, Hq, Sq, Skv});
  const TensorDesc score(nullptr, kFloat32, cpu(), {b0, Hq, Sq, 1});
  {
    SdpaAttributes attr;
    attr.set_attn_scale(kScale).set_causal_mask(true).set_generate_stats(true).set_sink_token(sd).set_bias(bd);
    attr.set_max_logit(mld).set_logit_max(score).set_score_sum_exp(score);
    SdpaFwd fwd(q, k, v, o, &st, attr);
    fwd.check_support();
    fwd.compile();
    EXPECT_EQ(fwd.workspace_size(), 0u);
    SdpaVariantPack pack;
    pack.set(FS_SDPA_SINK_TOKEN, sinks.data()).set(FS_SDPA_BIAS, bias.data()).set(FS_SDPA_MAX_LOGIT, max_logit.data());
    fwd.execute(pack, nullptr, 0);
    for (float m : max_logit) EXPECT_TRUE(std::isinf(m) && m < 0) << m;  // a head that sees no key
  }
  // Backward: dBias [1, H_q, S_q, S_kv] with rows of S_kv + 3 (the padding must stay untouched), dSink.
  constexpr int64_t row = Skv + 3;
  std::vector<float> dbias(Hq * Sq * row, NAN), dsink(Hq, NAN);
  const TensorDesc dbd(dbias.data(), kFloat32, cpu(), {1, Hq, Sq, Skv}, {Hq * Sq * row, Sq * row, row, 1}),
      dsd(dsink.data(), kFloat32, cpu(), {Hq});
  SdpaBackwardAttributes battr;
  battr.set_attn_scale(kScale).set_causal_mask(true).set_sink_token(sd).set_bias(bd).set_dbias(dbd).set_dsink_token(
      dsd);
  SdpaBwd bwd(q, k, v, o, o, st, q, k, v, battr);
  bwd.check_support();
  bwd.compile();
  EXPECT_EQ(bwd.workspace_size(), 0u);
  SdpaVariantPack pack;
  pack.set(FS_SDPA_SINK_TOKEN, sinks.data()).set(FS_SDPA_BIAS, bias.data()).set(FS_SDPA_DBIAS, dbias.data());
  pack.set(FS_SDPA_DSINK_TOKEN, dsink.data());
  bwd.execute(pack, nullptr, 0);
  for (float g : dsink) EXPECT_EQ(g, 0.0f);
  for (int64_t e = 0; e < Hq * Sq * row; ++e) {
    if (e % row < Skv) {
      EXPECT_EQ(dbias[e], 0.0f) << "dBias element " << e;
    } else {
      EXPECT_TRUE(std::isnan(dbias[e])) << "dBias padding " << e << " was written";
    }
  }
}

// Packed THD with zero samples (B + 1 = 1 ragged offsets and cu_seq_len entries, [0]) and a padded batch of B = 0
// (seq_len of 0 elements): valid, forward and backward.
TEST(SdpaApi, EmptyBatchPackedAndPadded) {
  constexpr int64_t b0 = 0;
  std::vector<int32_t> zero{0};
  const TensorDesc cu(zero.data(), kInt32, cpu(), {1}), none(nullptr, kInt32, cpu(), {0});
  const TensorDesc q(nullptr, kFloat32, cpu(), {b0, Hq, Sq, D}, {0, D, Hq * D, 1}),
      k(nullptr, kFloat32, cpu(), {b0, Hk, Skv, D}, {0, D, Hk * D, 1}),
      st(nullptr, kFloat32, cpu(), {b0, Hq, Sq, 1}, {0, 1, Hq, 1});
  for (bool packed : {true, false}) {
    SCOPED_TRACE(packed ? "packed THD" : "padded");
    SdpaAttributes attr;
    SdpaBackwardAttributes battr;
    attr.set_generate_stats(true).set_padding_mask(true);
    battr.set_padding_mask(true);
    if (packed) {
      attr.set_cu_seq_len_q(cu).set_cu_seq_len_kv(cu);
      battr.set_cu_seq_len_q(cu).set_cu_seq_len_kv(cu);
      for (fs_sdpa_slot_t s : {FS_SDPA_Q, FS_SDPA_K, FS_SDPA_V, FS_SDPA_O, FS_SDPA_STATS}) attr.set_ragged_offset(s, cu);
      for (fs_sdpa_slot_t s : {FS_SDPA_Q, FS_SDPA_K, FS_SDPA_V, FS_SDPA_O, FS_SDPA_STATS, FS_SDPA_DO, FS_SDPA_DQ,
                               FS_SDPA_DK, FS_SDPA_DV})
        battr.set_ragged_offset(s, cu);
    } else {
      attr.set_seq_len_q(none).set_seq_len_kv(none);
      battr.set_seq_len_q(none).set_seq_len_kv(none);
    }
    SdpaVariantPack pack;
    if (packed) {
      for (fs_sdpa_slot_t s : {FS_SDPA_CU_SEQ_LEN_Q, FS_SDPA_CU_SEQ_LEN_KV, FS_SDPA_RAGGED_OFFSET_Q,
                               FS_SDPA_RAGGED_OFFSET_K, FS_SDPA_RAGGED_OFFSET_V, FS_SDPA_RAGGED_OFFSET_O,
                               FS_SDPA_RAGGED_OFFSET_STATS})
        pack.set(s, zero.data());
    }
    SdpaFwd fwd(q, k, k, q, &st, attr);
    fwd.check_support();
    fwd.compile();
    fwd.execute(pack, nullptr, fwd.workspace_size());
    if (packed) {
      for (fs_sdpa_slot_t s : {FS_SDPA_RAGGED_OFFSET_DO, FS_SDPA_RAGGED_OFFSET_DQ, FS_SDPA_RAGGED_OFFSET_DK,
                               FS_SDPA_RAGGED_OFFSET_DV})
        pack.set(s, zero.data());
    }
    SdpaBwd bwd(q, k, k, q, q, st, q, k, k, battr);
    bwd.check_support();
    bwd.compile();
    bwd.execute(pack, nullptr, bwd.workspace_size());
  }
  // The runtime values are still read for B = 0 (the early return comes after read_runtime_host): cumulative
  // lengths of [1] are not prefix sums.
  std::vector<int32_t> one{1};
  SdpaAttributes attr;
  attr.set_generate_stats(true).set_padding_mask(true).set_cu_seq_len_q(cu).set_cu_seq_len_kv(cu);
  for (fs_sdpa_slot_t s : {FS_SDPA_Q, FS_SDPA_K, FS_SDPA_V, FS_SDPA_O, FS_SDPA_STATS}) attr.set_ragged_offset(s, cu);
  SdpaFwd fwd(q, k, k, q, &st, attr);
  fwd.check_support();
  fwd.compile();
  SdpaVariantPack pack;
  for (fs_sdpa_slot_t s : {FS_SDPA_CU_SEQ_LEN_KV, FS_SDPA_RAGGED_OFFSET_Q, FS_SDPA_RAGGED_OFFSET_K,
                           FS_SDPA_RAGGED_OFFSET_V, FS_SDPA_RAGGED_OFFSET_O, FS_SDPA_RAGGED_OFFSET_STATS})
    pack.set(s, zero.data());
  pack.set(FS_SDPA_CU_SEQ_LEN_Q, one.data());
  try {
    fwd.execute(pack, nullptr, 0);
    ADD_FAILURE() << "cu_seq_len_q = [1] with B = 0 was accepted";
  } catch (const Exception& e) {
    EXPECT_EQ(e.status(), FS_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(e.what()).rfind("cu_seq_len_q: must start at 0", 0), 0u) << e.what();
  }
}

// The rule itself (core/sdpa_problem.h empty_batch_fills): what an empty batch writes, and nothing for B >= 1.
TEST(SdpaApi, EmptyBatchFillsAreTheReductionsIdentities) {
  namespace sd = flashspan::sdpa;
  auto view = [](std::vector<int64_t> shape) {
    return flashspan::test::shape_view(flashspan::DType::kFloat32, std::move(shape));
  };
  auto attrs = [&](int64_t b, bool backward) {
    sd::Attributes a;
    a.backward = backward;
    a.tensors[FS_SDPA_Q] = a.tensors[FS_SDPA_O] = view({b, 2, 3, 8});
    a.tensors[FS_SDPA_K] = a.tensors[FS_SDPA_V] = view({b, 1, 4, 8});
    a.tensors[FS_SDPA_STATS] = view({b, 2, 3, 1});
    a.tensors[FS_SDPA_SINK_TOKEN] = view({2});
    a.tensors[FS_SDPA_BIAS] = view({1, 2, 3, 4});
    if (backward) {
      a.tensors[FS_SDPA_DO] = a.tensors[FS_SDPA_DQ] = a.tensors[FS_SDPA_Q];
      a.tensors[FS_SDPA_DK] = a.tensors[FS_SDPA_DV] = a.tensors[FS_SDPA_K];
      a.tensors[FS_SDPA_DSINK_TOKEN] = view({2});
      a.tensors[FS_SDPA_DBIAS] = view({1, 2, 3, 4});
    } else {
      a.tensors[FS_SDPA_MAX_LOGIT] = view({2});
    }
    return a;
  };
  const sd::Problem fwd = sd::validate_forward(attrs(0, false));
  ASSERT_TRUE(fwd.empty_batch());
  std::vector<sd::EmptyBatchFill> f = sd::empty_batch_fills(fwd);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].slot, FS_SDPA_MAX_LOGIT);
  EXPECT_TRUE(std::isinf(f[0].value) && f[0].value < 0);
  const sd::Problem bwd = sd::validate_backward(attrs(0, true));
  f = sd::empty_batch_fills(bwd);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].slot, FS_SDPA_DSINK_TOKEN);
  EXPECT_EQ(f[1].slot, FS_SDPA_DBIAS);
  EXPECT_EQ(f[0].value, 0.0f);
  EXPECT_EQ(f[1].value, 0.0f);
  // A dBias of B = 0 (bias not broadcast over the batch) is empty itself: nothing to fill.
  sd::Attributes a = attrs(0, true);
  a.tensors[FS_SDPA_BIAS] = a.tensors[FS_SDPA_DBIAS] = view({0, 2, 3, 4});
  f = sd::empty_batch_fills(sd::validate_backward(a));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].slot, FS_SDPA_DSINK_TOKEN);
  // B >= 1: the kernels / the reference write those outputs; no fill.
  EXPECT_FALSE(sd::validate_forward(attrs(1, false)).empty_batch());
  EXPECT_TRUE(sd::empty_batch_fills(sd::validate_forward(attrs(1, false))).empty());
  EXPECT_TRUE(sd::empty_batch_fills(sd::validate_backward(attrs(1, true))).empty());
}

// CUDA descriptors of B = 0 (CPU-testable): no workspace either way (nothing runs), and check_support refuses
// nothing for the batch.
TEST(SdpaApi, EmptyBatchOnCudaDescriptors) {
  constexpr int64_t b0 = 0;
  const TensorDesc q(nullptr, kBFloat16, cuda(), {b0, Hq, Sq, 64}), k(nullptr, kBFloat16, cuda(), {b0, Hk, Skv, 64}),
      st(nullptr, kFloat32, cuda(), {b0, Hq, Sq, 1}), dbias(nullptr, kFloat32, cuda(), {1, Hq, Sq, Skv}),
      sinks(nullptr, kFloat32, cuda(), {Hq});
  auto refusal = [](auto& op) -> std::string {
    try {
      op.check_support();
    } catch (const Exception& e) {
      return e.what();
    }
    return "";
  };
  // (On a GPU the message is empty; without one, or without CUDA in the build, it names only that.)
  auto device_only = [](const std::string& m) {
    return m.empty() || (!contains(m, "batch") && !contains(m, "B * S_q") && !contains(m, "workspace"));
  };
  for (bool causal : {false, true}) {
    SdpaAttributes attr;
    attr.set_causal_mask(causal).set_generate_stats(true);
    SdpaFwd fwd(q, k, k, q, &st, attr);
    EXPECT_EQ(fwd.workspace_size(), 0u);
    const std::string m = refusal(fwd);
    EXPECT_TRUE(device_only(m)) << m;
    for (bool det : {false, true}) {
      SdpaBackwardAttributes battr;
      battr.set_causal_mask(causal).set_deterministic_algorithm(det).set_bias(dbias).set_dbias(dbias);
      battr.set_sink_token(sinks).set_dsink_token(sinks);
      SdpaBwd bwd(q, k, k, q, q, st, q, k, k, battr);
      EXPECT_EQ(bwd.workspace_size(), 0u) << "deterministic " << det;
      const std::string mb = refusal(bwd);
      EXPECT_TRUE(device_only(mb)) << mb;
    }
  }
}

}  // namespace
