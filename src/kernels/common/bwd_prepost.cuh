// Backward pre- and post-processing, arch-neutral (no mma): the row statistics the dK/dV and
// dQ kernels of every family read, and the conversion of the fp32 dQ accumulator.
//   preprocess:  D_i = dO_i . O_i - dlse_i and lse2_i = LSE_i * log2(e) (+inf for an empty
//                row) into the workspace, [Hq, total_q] fp32 each (params.h, BwdParams).
//   dQ convert:  dq = scale * dq_accum in the input dtype (atomic dQ path).
//   SDPA dBias:  the dS workspace summed over dBias's broadcast dimensions (sdpa_dbias_reduce,
//                sdpa_dbias_reduce_cols), the sm90 kernel's accumulator converted (sdpa_dbias_from_acc),
//                dBias cleared for the direct form (sdpa_dbias_zero_fill).
//   SDPA dSink:  -sum_i exp(sink - LSE_i) D_i per query head, from the preprocess's rows (sdpa_dsink_reduce).
// kAnalytic (SDPA, AnalyticMaskParams): the rows are those of every sample padded to S_q
// (p.varlen = 0, p.seqlen_q = S_q); a row past its sample's length is an empty row (D = 0,
// lse2 = +inf, O / dO / LSE never read) and its dQ is written as 0 when dQ is padded, not at
// all when it is ragged. Tensors start at their own per-sample offsets.
#pragma once

#include <cstdint>

#include "kernels/common/analytic_seqlen.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/sdpa_score_mod.cuh"
#include "kernels/params.h"

namespace flashspan::kern {

// Row t (0 <= t < total_q) of the flattened query rows of head h, as the pre/post kernels
// address it: sample b and the row index in the tensor's S (BSHD) or T (THD) dimension.
struct QueryRow {
  int64_t b, row;
};
__device__ __forceinline__ QueryRow query_row(const BwdParams& p, int64_t t) {
  // THD: tensors index the global row (batch_stride 0). BSHD: every sample has seqlen_q rows.
  if (p.varlen) return {0, t};
  return {t / p.seqlen_q, t % p.seqlen_q};
}

// ---------------------------------------------------------------------------------------
// 1a. Preprocess: the per-row parts of SDPA (kAnalytic) rows, shared by both loops below; lane sl of the row's
// L lanes, columns sl * 8, sl * 8 + 8 L, ... (8 elements a 16-byte access).
// Lanes a (query row, head) unit takes: head_dv / 8 (8 elements a 16-byte access) rounded up to a power of
// two, at most 32 (host and device: the launchers size the grid with it, bwd_preprocess_grid).
__host__ __device__ __forceinline__ int preprocess_lanes(int head_dv) {
  int L = 1;
  while (L < (head_dv + 7) / 8 && L < 32) L <<= 1;
  return L;
}
// O and dO of row r of query head h (the plain case: neither past its sample nor gated); SDPA's
// tensors start at their samples' own offsets (batch_stride 0).
template <class E, bool kAnalytic>
__device__ __forceinline__ void preprocess_row_ptrs(const BwdParams& p, const QueryRow& r, int64_t h,
                                                    const typename E::Storage*& o, const typename E::Storage*& d) {
  using Elem = typename E::Storage;
  o = static_cast<const Elem*>(p.o) + r.b * p.oa.batch_stride + r.row * p.oa.row_stride + h * p.oa.head_stride;
  d = static_cast<const Elem*>(p.dout) + r.b * p.doa.batch_stride + r.row * p.doa.row_stride + h * p.doa.head_stride;
  if constexpr (kAnalytic) {
    o += sample_start(analytic_of(p).start[kSdpaO], int(r.b));
    d += sample_start(analytic_of(p).start[kSdpaDO], int(r.b));
  }
}
// A padded dgate's row past sample b (a ragged one has no such rows): zeros.
template <class E>
__device__ __forceinline__ void preprocess_clear_dgate_row(const AnalyticMaskParams& a, int head_dv, int b, int64_t h,
                                                           int64_t row, int sl, int L) {
  using Elem = typename E::Storage;
  if (a.epi.dgate != nullptr && a.start[kSdpaDGate].ragged.ptr == nullptr) {
    Elem* dg = static_cast<Elem*>(a.epi.dgate) + sample_start(a.start[kSdpaDGate], b) + h * a.epi.dga.head_stride +
               row * a.epi.dga.row_stride;
    for (int c = sl * 8; c < head_dv; c += 8 * L) *reinterpret_cast<uint4*>(dg + c) = make_uint4(0, 0, 0, 0);
  }
}
// Output gate (SdpaEpilogueParams) on row (b, row) of query head h (unit w): O is the gated output, so
// D = dO . O as without it (the lane's share added to acc); dgate = dO * O * (1 - sigmoid(G)), and the
// kernels after this one take dO * sigmoid(G) (a.epi.do_gated, [H_q, total_q, D_v]).
template <class E>
__device__ __forceinline__ void preprocess_gated_row(const BwdParams& p, const AnalyticMaskParams& a, int b,
                                                     int64_t h, int64_t row, int64_t w, int sl, int L, float& acc) {
  using Elem = typename E::Storage;
  const SampleStart* st = a.start;
  const Elem* o = static_cast<const Elem*>(p.o) + sample_start(st[kSdpaO], b) + row * p.oa.row_stride +
                  h * p.oa.head_stride;
  const Elem* d = static_cast<const Elem*>(p.dout) + sample_start(st[kSdpaDO], b) + row * p.doa.row_stride +
                  h * p.doa.head_stride;
  const Elem* g = static_cast<const Elem*>(a.epi.gate) + sample_start(st[kSdpaGate], b) + row * a.epi.ga.row_stride +
                  h * a.epi.ga.head_stride;
  Elem* dg = a.epi.dgate == nullptr ? nullptr
                                    : static_cast<Elem*>(a.epi.dgate) + sample_start(st[kSdpaDGate], b) +
                                          row * a.epi.dga.row_stride + h * a.epi.dga.head_stride;
  Elem* dgo = static_cast<Elem*>(a.epi.do_gated) + w * p.head_dv;  // [H_q, total_q, D_v]
  for (int c = sl * 8; c < p.head_dv; c += 8 * L) {
    const uint4 ov = *reinterpret_cast<const uint4*>(o + c);
    const uint4 dv = *reinterpret_cast<const uint4*>(d + c);
    const uint4 gv = *reinterpret_cast<const uint4*>(g + c);
    const Elem* oe = reinterpret_cast<const Elem*>(&ov);
    const Elem* de = reinterpret_cast<const Elem*>(&dv);
    const Elem* ge = reinterpret_cast<const Elem*>(&gv);
    uint4 dgv, dov;
    uint32_t* dgw = reinterpret_cast<uint32_t*>(&dgv);
    uint32_t* dow = reinterpret_cast<uint32_t*>(&dov);
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
      const float o0 = to_float<E>(oe[e]), o1 = to_float<E>(oe[e + 1]);
      const float d0 = to_float<E>(de[e]), d1 = to_float<E>(de[e + 1]);
      const float s0 = sigmoid_fast(to_float<E>(ge[e])), s1 = sigmoid_fast(to_float<E>(ge[e + 1]));
      acc += o0 * d0 + o1 * d1;
      dgw[e / 2] = pack2<E>(d0 * o0 * (1.0f - s0), d1 * o1 * (1.0f - s1));
      dow[e / 2] = pack2<E>(d0 * s0, d1 * s1);
    }
    if (dg != nullptr) *reinterpret_cast<uint4*>(dg + c) = dgv;
    *reinterpret_cast<uint4*>(dgo + c) = dov;
  }
}

// ---------------------------------------------------------------------------------------
// 1b. Preprocess: L lanes per (query row, head) unit w = h * total_q + t, L = head_dv / 8 rounded up
// to a power of two (at most 32: a lane reads 8 elements a load), so a warp takes 32 / L consecutive
// units at once (two at D = 128, four at 64; one row a warp left half the lanes idle at D = 128 and
// ran the kernel at ~1.4 TB/s, PERF_LOG v2.32); grid-stride over the Hq * total_q units
// (grid_stride_1d(units, 8), 256 threads), so no batch size, head count or sample count reaches a
// grid limit (grid.h). Every lane of a warp runs the same iterations and the L-lane reductions
// (xor shuffles inside aligned groups of L lanes), whatever its row's case.
template <class E, bool kAnalytic>
__device__ __forceinline__ void bwd_preprocess_rows(const BwdParams& p) {
  using Elem = typename E::Storage;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int L = preprocess_lanes(p.head_dv);
  const int rows_per_warp = 32 / L, sl = lane & (L - 1);
  const int64_t units = int64_t(p.num_heads_q) * p.total_q;
  const int64_t warps = int64_t(gridDim.x) * 8;
  for (int64_t w0 = (int64_t(blockIdx.x) * 8 + warp) * rows_per_warp; w0 < units; w0 += warps * rows_per_warp) {
    const int64_t w = w0 + lane / L;
    const bool valid = w < units;
    float acc = 0.0f;
    bool empty = false;      // kAnalytic: a row past its sample (D = 0, lse2 = +inf)
    int64_t lse_off = 0;     // the row's LSE element
    int64_t dlse_off = -1;   // its dlse element (rows neither empty nor gated, when dlse is given)
    if (valid) {
      const int64_t h = w / p.total_q, t = w - h * p.total_q;
      const QueryRow r = query_row(p, t);
      bool gated = false;
      if constexpr (kAnalytic) {
        const AnalyticMaskParams& a = analytic_of(p);
        const int b = int(r.b);
        lse_off = sample_start(a.start[kSdpaStats], b) + h * p.lsea.head_stride + r.row * p.lsea.row_stride;
        if (r.row >= sample_length(a.seq_len_q, a.cu_seq_len_q, a.max_q, b)) {
          empty = true;
          preprocess_clear_dgate_row<E>(a, p.head_dv, b, h, r.row, sl, L);
        } else if (a.epi.gate != nullptr) {
          gated = true;
          preprocess_gated_row<E>(p, a, b, h, r.row, w, sl, L, acc);
        }
      } else {
        lse_off = r.b * p.lsea.batch_stride + h * p.lsea.head_stride + r.row * p.lsea.row_stride;
      }
      if (!empty && !gated) {
        const Elem *o, *d;
        preprocess_row_ptrs<E, kAnalytic>(p, r, h, o, d);
        for (int c = sl * 8; c < p.head_dv; c += 8 * L) {
          const uint4 ov = *reinterpret_cast<const uint4*>(o + c);
          const uint4 dv = *reinterpret_cast<const uint4*>(d + c);
          const Elem* oe = reinterpret_cast<const Elem*>(&ov);
          const Elem* de = reinterpret_cast<const Elem*>(&dv);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc += to_float<E>(oe[e]) * to_float<E>(de[e]);
        }
        if (p.dlse != nullptr) dlse_off = r.b * p.dlsea.batch_stride + h * p.dlsea.head_stride + r.row * p.dlsea.row_stride;
      }
    }
    for (int off = L / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (valid && sl == 0) {
      if (empty) {
        p.delta[w] = 0.0f;
        p.lse2[w] = INFINITY;
      } else {
        if (dlse_off >= 0) acc -= p.dlse[dlse_off];
        p.delta[w] = acc;  // workspace [Hq, total_q]: index h * total_q + t = w
        const float lse = p.lse[lse_off];
        p.lse2[w] = lse == -INFINITY ? INFINITY : lse * kLog2e;
      }
    }
  }
}

// The preprocess with kPreUnits units a lane group per grid pass (the default since PERF_LOG v2.65;
// launch_bwd_common.h bwd_preprocess_paired, FLASHSPAN_BWD_PREPROCESS_PAIRED=0 off): the units of a pass are a grid
// stride apart, and every load of all of them (O, dO, LSE, dlse) is issued before any is reduced
// (bwd_preprocess_rows reads a row's LSE / dlse after its reduction, and its warps' rows ran their
// latencies in series: 1.2 TB/s at D = 128, PERF_LOG v2.32, v2.33). Same results, bit for bit; the grid
// from bwd_preprocess_grid(.., paired).
constexpr int kPreUnits = 2;

template <class E, bool kAnalytic>
__device__ __forceinline__ void bwd_preprocess_rows_paired(const BwdParams& p) {
  using Elem = typename E::Storage;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int L = preprocess_lanes(p.head_dv), rows_per_warp = 32 / L, sl = lane & (L - 1);
  const int64_t units = int64_t(p.num_heads_q) * p.total_q;
  const int64_t stride = int64_t(gridDim.x) * 8 * rows_per_warp;  // units a grid pass's first units span
  for (int64_t w0 = (int64_t(blockIdx.x) * 8 + warp) * rows_per_warp; w0 < units; w0 += kPreUnits * stride) {
    float acc[kPreUnits], lse[kPreUnits], dlse[kPreUnits];
    bool valid[kPreUnits], empty[kPreUnits];  // empty (kAnalytic): a row past its sample (D = 0, lse2 = +inf)
    uint4 ov[kPreUnits], dv[kPreUnits];       // the lane's first 8 elements of the row's O and dO
    const Elem* orow[kPreUnits];              // the rows of the plain case (neither empty nor gated), else null
    const Elem* drow[kPreUnits];
#pragma unroll
    for (int u = 0; u < kPreUnits; ++u) {
      const int64_t w = w0 + u * stride + lane / L;
      valid[u] = w < units;
      acc[u] = lse[u] = dlse[u] = 0.0f;
      empty[u] = false;
      orow[u] = drow[u] = nullptr;
      ov[u] = dv[u] = make_uint4(0, 0, 0, 0);
      if (!valid[u]) continue;
      const int64_t h = w / p.total_q, t = w - h * p.total_q;
      const QueryRow r = query_row(p, t);
      bool gated = false;
      int64_t lse_off = 0;
      if constexpr (kAnalytic) {
        const AnalyticMaskParams& a = analytic_of(p);
        const int b = int(r.b);
        lse_off = sample_start(a.start[kSdpaStats], b) + h * p.lsea.head_stride + r.row * p.lsea.row_stride;
        if (r.row >= sample_length(a.seq_len_q, a.cu_seq_len_q, a.max_q, b)) {
          empty[u] = true;
          preprocess_clear_dgate_row<E>(a, p.head_dv, b, h, r.row, sl, L);
          continue;
        }
        if (a.epi.gate != nullptr) {
          gated = true;
          preprocess_gated_row<E>(p, a, b, h, r.row, w, sl, L, acc[u]);
        }
      } else {
        lse_off = r.b * p.lsea.batch_stride + h * p.lsea.head_stride + r.row * p.lsea.row_stride;
      }
      lse[u] = __ldg(p.lse + lse_off);
      if (gated) continue;
      const Elem *o, *d;
      preprocess_row_ptrs<E, kAnalytic>(p, r, h, o, d);
      orow[u] = o;
      drow[u] = d;
      if (sl * 8 < p.head_dv) {
        ov[u] = __ldg(reinterpret_cast<const uint4*>(o + sl * 8));
        dv[u] = __ldg(reinterpret_cast<const uint4*>(d + sl * 8));
      }
      if (p.dlse != nullptr) {
        dlse[u] = __ldg(p.dlse + r.b * p.dlsea.batch_stride + h * p.dlsea.head_stride + r.row * p.dlsea.row_stride);
      }
    }
#pragma unroll
    for (int u = 0; u < kPreUnits; ++u) {
      if (orow[u] != nullptr) {
        const Elem* oe = reinterpret_cast<const Elem*>(&ov[u]);
        const Elem* de = reinterpret_cast<const Elem*>(&dv[u]);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[u] += to_float<E>(oe[e]) * to_float<E>(de[e]);
        // Columns past 8 L (none up to head dim 256, where L = 32 covers them): the rest of the row.
        for (int c = sl * 8 + 8 * L; c < p.head_dv; c += 8 * L) {
          const uint4 o4 = *reinterpret_cast<const uint4*>(orow[u] + c);
          const uint4 d4 = *reinterpret_cast<const uint4*>(drow[u] + c);
          const Elem* oe2 = reinterpret_cast<const Elem*>(&o4);
          const Elem* de2 = reinterpret_cast<const Elem*>(&d4);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[u] += to_float<E>(oe2[e]) * to_float<E>(de2[e]);
        }
      }
      for (int off = L / 2; off > 0; off >>= 1) acc[u] += __shfl_xor_sync(0xffffffffu, acc[u], off);
      const int64_t w = w0 + u * stride + lane / L;
      if (valid[u] && sl == 0) {
        if (empty[u]) {
          p.delta[w] = 0.0f;
          p.lse2[w] = INFINITY;
        } else {
          p.delta[w] = p.dlse != nullptr && orow[u] != nullptr ? acc[u] - dlse[u] : acc[u];
          p.lse2[w] = lse[u] == -INFINITY ? INFINITY : lse[u] * kLog2e;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// 2b. dQ conversion (atomic path): dq = scale * dq_accum in the input dtype. One warp per
// (query row, head), grid-stride as the preprocess.
template <class E, bool kAnalytic>
__device__ __forceinline__ void bwd_dq_convert_rows(const BwdParams& p) {
  using Elem = typename E::Storage;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t units = int64_t(p.num_heads_q) * p.total_q;
  for (int64_t w = int64_t(blockIdx.x) * 8 + warp; w < units; w += int64_t(gridDim.x) * 8) {
    const int64_t h = w / p.total_q, t = w - h * p.total_q;
    const QueryRow r = query_row(p, t);
    const float* src = p.dq_accum + w * p.head_dqk;  // [Hq, total_q, Dqk]
    Elem* dst = static_cast<Elem*>(p.dq) + r.b * p.dqa.batch_stride + r.row * p.dqa.row_stride +
                h * p.dqa.head_stride;
    if constexpr (kAnalytic) {
      // A padded dQ's rows past the sample are converted too (their accumulator rows are 0);
      // a ragged dQ has no such rows.
      const AnalyticMaskParams& a = analytic_of(p);
      const SampleStart& st = a.start[kSdpaDQ];
      if (st.ragged.ptr != nullptr && r.row >= sample_length(a.seq_len_q, a.cu_seq_len_q, a.max_q, int(r.b))) continue;
      dst += sample_start(st, int(r.b));
    }
    for (int c = lane * 2; c < p.head_dqk; c += 64) {
      const float2 x = *reinterpret_cast<const float2*>(src + c);
      *reinterpret_cast<uint32_t*>(dst + c) = pack2<E>(x.x * p.scale, x.y * p.scale);
    }
  }
}

// ---------------------------------------------------------------------------------------
// 3. SDPA dBias (SdpaBiasParams): each dBias element (b', h', i', j') is the sum of the dS workspace
// ds[b, h, i, j] over every b (h, i, j) when dBias's dimension 0 (1, 2, 3) has size 1, else over
// b = b' (...), in a fixed order: the result is bitwise reproducible. The workspace is 0 outside the
// samples and at masked positions, so those add 0 (and a dBias element no sample reaches is 0).
// B, H: the problem's B, H_q; S_q, S_kv its maxima. Two forms, chosen by the launcher
// (launch_bwd_common.cu launch_sdpa_bwd_dbias) from dBias's shape:
//   keys reduced (dBias's dimension 3 of size 1): sdpa_dbias_reduce, one warp per element, lane l adds
//     the terms l, l + 32, ... of the reduced index space (j fastest: consecutive lanes read consecutive
//     keys), then a fixed shuffle tree;
//   keys kept: sdpa_dbias_reduce_cols, one thread per (element, run of terms), consecutive threads on
//     consecutive keys, so that a warp's reads of one term are one coalesced row segment (a warp per
//     element read 16 scattered sectors for 16 useful floats of a (1, 1, S, S) dBias over 16 heads: the
//     dBias backward ran at 31x the plain one on an H100, PERF_LOG v2.66).
// The sm90 backward has two more (SdpaBiasParams::ds_form, chosen by dispatch's sdpa_dbias_ds_form): outside
// deterministic mode its kernel adds its dS elements with red.global.add into an fp32 accumulator of dBias's
// shape, so the sums are formed there (in no fixed order) and sdpa_dbias_from_acc only converts; and where each
// dBias element has one term (dBias broadcasts nothing the problem has more than one of), it stores dS into
// dBias itself (sdpa_dbias_zero_fill clears dBias first; deterministic or not).

// The dBias reduction's geometry: the element / term spaces and the workspace strides of the reduced
// dimensions (a kept dimension's index is the element's, a reduced one's the term's).
struct DbiasGeometry {
  int64_t n0, n1, n2, n3;  // dBias's sizes (the element space, j fastest)
  int64_t rb, rh, ri, rj;  // the reduced extents (1 along a kept dimension)
  int64_t sb, sh, si;      // workspace strides of b, h, i
  __host__ __device__ __forceinline__ static DbiasGeometry make(const SdpaBiasParams& bp, int64_t B, int64_t H, int64_t Sq, int64_t Skv) {
    DbiasGeometry g;
    g.n0 = bp.dbias_size[0];
    g.n1 = bp.dbias_size[1];
    g.n2 = bp.dbias_size[2];
    g.n3 = bp.dbias_size[3];
    g.rb = g.n0 == 1 ? B : 1;
    g.rh = g.n1 == 1 ? H : 1;
    g.ri = g.n2 == 1 ? Sq : 1;
    g.rj = g.n3 == 1 ? Skv : 1;
    g.si = bp.ds_ld;
    g.sh = Sq * bp.ds_ld;
    g.sb = H * g.sh;
    return g;
  }
  __host__ __device__ __forceinline__ int64_t elems() const { return n0 * n1 * n2 * n3; }
  __host__ __device__ __forceinline__ int64_t terms() const { return rb * rh * ri * rj; }
  // dBias element e's coordinates (b', h', i', j'), j' fastest: decoded once per element, read by the
  // term offsets and the store.
  struct Elem {
    int64_t b, h, i, j;
  };
  __host__ __device__ __forceinline__ Elem element(int64_t e) const {
    return Elem{e / (n3 * n2 * n1), (e / (n3 * n2)) % n1, (e / n3) % n2, e % n3};
  }
};

// dBias's element at element offset `off` (its strides) set to v, in dBias's dtype.
__device__ __forceinline__ void store_dbias_at(const SdpaBiasParams& bp, int64_t off, float acc) {
  if (bp.dbias_dtype == kSdpaBiasF32) {
    static_cast<float*>(bp.dbias)[off] = acc;
  } else if (bp.dbias_dtype == kSdpaBiasBF16) {
    static_cast<__nv_bfloat16*>(bp.dbias)[off] = __float2bfloat16_rn(acc);
  } else {
    static_cast<__half*>(bp.dbias)[off] = __float2half_rn(acc);
  }
}

// dBias's element offset of (b, h, i, j) (a broadcast dimension's stride is 0: its index does not matter).
__host__ __device__ __forceinline__ int64_t dbias_offset(const SdpaBiasParams& bp, int64_t b, int64_t h, int64_t i,
                                                        int64_t j) {
  return b * bp.dbias_stride[0] + h * bp.dbias_stride[1] + i * bp.dbias_stride[2] + j * bp.dbias_stride[3];
}

__device__ __forceinline__ void store_dbias(const SdpaBiasParams& bp, const DbiasGeometry::Elem& x, float acc) {
  store_dbias_at(bp, dbias_offset(bp, x.b, x.h, x.i, x.j), acc);
}

// dS's row (b, h, i) (key 0; keys contiguous) in dBias's dS buffer of the forms that have one (params.h
// SdpaBiasParams::ds_form): the workspace [B, H, S_q, ds_ld], or the accumulator of dBias's shape, which
// a broadcast dimension indexes at 0 (its terms all land on one element).
__host__ __device__ __forceinline__ float* dbias_ds_row(const SdpaBiasParams& bp, int64_t H, int64_t Sq, int64_t b,
                                                        int64_t h, int64_t i) {
  if (bp.ds_form == kDbiasDsWorkspace) return bp.ds + ((b * H + h) * Sq + i) * bp.ds_ld;
  const int64_t n1 = bp.dbias_size[1], n2 = bp.dbias_size[2], n3 = bp.dbias_size[3];
  return bp.ds + (((bp.dbias_size[0] == 1 ? 0 : b) * n1 + (n1 == 1 ? 0 : h)) * n2 + (n2 == 1 ? 0 : i)) * n3;
}

// Every dBias element e (DbiasGeometry's order: a thread an element, coalesced along the keys) set to value(e).
template <class Value>
__device__ __forceinline__ void sdpa_dbias_store_each(const SdpaBiasParams& bp, int64_t B, int64_t H, int64_t Sq,
                                                      int64_t Skv, Value&& value) {
  const DbiasGeometry g = DbiasGeometry::make(bp, B, H, Sq, Skv);
  const int64_t elems = g.elems(), stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < elems; e += stride) {
    store_dbias(bp, g.element(e), value(e));
  }
}

// The accumulator form (kDbiasDsAccumulate): dBias element e is the accumulator's element e, converted.
__device__ __forceinline__ void sdpa_dbias_from_acc(const SdpaBiasParams& bp, int64_t B, int64_t H, int64_t Sq,
                                                    int64_t Skv) {
  sdpa_dbias_store_each(bp, B, H, Sq, Skv, [&](int64_t e) { return bp.ds[e]; });
}

// The direct form (kDbiasDsDirect): dBias zeroed element by element (a dBias that is not one dense block;
// the launcher clears a dense one with a memset).
__device__ __forceinline__ void sdpa_dbias_zero_fill(const SdpaBiasParams& bp, int64_t B, int64_t H, int64_t Sq,
                                                     int64_t Skv) {
  sdpa_dbias_store_each(bp, B, H, Sq, Skv, [](int64_t) { return 0.0f; });
}

__device__ __forceinline__ void sdpa_dbias_reduce(const SdpaBiasParams& bp, int64_t B, int64_t H, int64_t Sq,
                                                  int64_t Skv) {
  const int lane = threadIdx.x & 31;
  const DbiasGeometry g = DbiasGeometry::make(bp, B, H, Sq, Skv);
  const int64_t elems = g.elems(), terms = g.terms();
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t e = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); e < elems; e += warps) {
    const DbiasGeometry::Elem x = g.element(e);
    float acc = 0.0f;
    for (int64_t r = lane; r < terms; r += 32) {
      const int64_t jj = r % g.rj, ii = (r / g.rj) % g.ri, hh = (r / (g.rj * g.ri)) % g.rh, bb = r / (g.rj * g.ri * g.rh);
      const int64_t b = g.n0 == 1 ? bb : x.b, h = g.n1 == 1 ? hh : x.h, i = g.n2 == 1 ? ii : x.i, j = g.n3 == 1 ? jj : x.j;
      acc += bp.ds[b * g.sb + h * g.sh + i * g.si + j];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) store_dbias(bp, x, acc);
  }
}

// The keys-kept form (g.n3 > 1: rj = 1): the terms (bb, hh, ii) of element e in the order ii fastest,
// then hh, bb, cut into `chunks` runs of `chunk` terms. Pass 1 (kFinal = false, chunks > 1): thread
// (e, k) sums run k and writes the partial sum over the run's first term in the workspace (a location
// only that thread reads); with chunks = 1 it writes dBias itself. Pass 2 (kFinal): thread e sums the
// runs' partial sums in order k and writes dBias. Threads e fastest (a warp: 32 consecutive keys).
__device__ __forceinline__ int64_t dbias_term_offset(const DbiasGeometry& g, const DbiasGeometry::Elem& x, int64_t r) {
  const int64_t ii = r % g.ri, hh = (r / g.ri) % g.rh, bb = r / (g.ri * g.rh);
  const int64_t b = g.n0 == 1 ? bb : x.b, h = g.n1 == 1 ? hh : x.h, i = g.n2 == 1 ? ii : x.i;
  return b * g.sb + h * g.sh + i * g.si + x.j;
}

template <bool kFinal>
__device__ __forceinline__ void sdpa_dbias_reduce_cols(const SdpaBiasParams& bp, int64_t B, int64_t H, int64_t Sq,
                                                       int64_t Skv, int64_t chunk, int64_t chunks) {
  const DbiasGeometry g = DbiasGeometry::make(bp, B, H, Sq, Skv);
  const int64_t elems = g.elems(), terms = g.terms();
  const int64_t units = kFinal ? elems : elems * chunks;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += stride) {
    const DbiasGeometry::Elem x = g.element(u % elems);
    float acc = 0.0f;
    if constexpr (kFinal) {
      for (int64_t c = 0; c < chunks; ++c) acc += bp.ds[dbias_term_offset(g, x, c * chunk)];
      store_dbias(bp, x, acc);
    } else {
      const int64_t r0 = (u / elems) * chunk, n = (terms - r0 < chunk ? terms - r0 : chunk);
      int64_t first = -1;
      if (n > 0) {  // (a problem without query rows has no terms: dBias 0)
        // The run's terms walked with counters (no division a term): ii steps by si, then hh, then bb.
        first = dbias_term_offset(g, x, r0);
        const float* x = bp.ds + first;
        const int64_t di = g.n2 == 1 ? g.si : 0, dh = g.n1 == 1 ? g.sh : 0, db = g.n0 == 1 ? g.sb : 0;
        int64_t ii = r0 % g.ri, hh = (r0 / g.ri) % g.rh;
        for (int64_t t = 0; t < n; ++t) {
          acc += *x;
          if (++ii < g.ri) {
            x += di;
          } else {
            ii = 0;
            x -= (g.ri - 1) * di;
            if (++hh < g.rh) {
              x += dh;
            } else {
              hh = 0;
              x += db - (g.rh - 1) * dh;
            }
          }
        }
      }
      if (chunks == 1) {
        store_dbias(bp, x, acc);
      } else {
        bp.ds[first] = acc;  // (chunks > 1: every run has terms)
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// 4. SDPA dSink (SdpaScoreParams::dsink): dSink_h = -sum_i exp(sink_h - LSE_i) D_i over every row of
// query head h, one CTA of 256 threads per head (blockIdx.x): strided partial sums, then a
// shared-memory tree in a fixed order, so the result is bitwise reproducible. Rows past their
// sample have D = 0 and lse2 = +inf (the preprocess), so they add 0. Every family's launcher runs
// it after the preprocess (launch_bwd_common.h launch_sdpa_bwd_dsink).
__device__ __forceinline__ void sdpa_dsink_reduce(const SdpaBwdParams& p) {
  __shared__ float red[256];
  const int h = blockIdx.x;
  const float s2 = __ldg(p.analytic.score.sink + h) * kLog2e;
  const float* lse2 = p.lse2 + int64_t(h) * p.total_q;
  const float* delta = p.delta + int64_t(h) * p.total_q;
  float acc = 0.0f;
  for (int64_t t = threadIdx.x; t < p.total_q; t += 256) acc -= exp2f(s2 - lse2[t]) * delta[t];
  red[threadIdx.x] = acc;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) p.analytic.score.dsink[h] = red[0];
}

// The kernels: flex (plan) rows and SDPA (analytic mask) rows.
// kPaired: bwd_preprocess_rows_paired (the default), else bwd_preprocess_rows.
template <class E, bool kPaired = false>
__global__ void __launch_bounds__(256) flex_bwd_preprocess_kernel(const BwdParams p) {
  if constexpr (kPaired) {
    bwd_preprocess_rows_paired<E, false>(p);
  } else {
    bwd_preprocess_rows<E, false>(p);
  }
}
template <class E, bool kPaired = false>
__global__ void __launch_bounds__(256) sdpa_bwd_preprocess_kernel(const SdpaBwdParams p) {
  if constexpr (kPaired) {
    bwd_preprocess_rows_paired<E, true>(p);
  } else {
    bwd_preprocess_rows<E, true>(p);
  }
}
template <class E>
__global__ void __launch_bounds__(256) flex_bwd_dq_convert_kernel(const BwdParams p) {
  bwd_dq_convert_rows<E, false>(p);
}
template <class E>
__global__ void __launch_bounds__(256) sdpa_bwd_dq_convert_kernel(const SdpaBwdParams p) {
  bwd_dq_convert_rows<E, true>(p);
}

}  // namespace flashspan::kern
