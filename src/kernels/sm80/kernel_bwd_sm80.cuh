// Flex attention backward kernels for sm_80 and newer (mma.sync m16n8k16, cp.async, ldmatrix).
//
// Algorithm: FlashAttention-2 backward (Dao 2023, Alg. 2) over the plan's backward view
// (tile kBlockQ x kBlockK, payload rows = queries, cols = keys):
//   1. preprocess:  D_i = dO_i . O_i and lse2_i = LSE_i * log2(e) (+inf for an empty row, so
//                   exp2(s - lse2) = 0 there) into the workspace, [Hq, total_q] fp32.
//   2. dK/dV kernel: one CTA per (key block, kv head, batch) task; walks the K2Q lists of
//                   every query head of the kv group (GQA sums stay in registers), recomputing
//                   S = Q K^T, P = exp2(S*scale*log2e - lse2), dP = dO V^T, dS = P (dP - D);
//                   dV += P^T dO, dK += dS^T Q; dK scaled at the end.
//                   deterministic = false (task mode): a persistent grid runs the work items
//                   of the split schedule instead (bwd_split_sm80.cuh): long K2Q walks are cut
//                   into chunks whose dK/dV partial sums meet in fp32 accumulators.
//   3. dQ:          deterministic = false: the dK/dV kernel also forms dS K for its key block
//                   and adds it to an fp32 accumulator in the workspace (atomics), then a
//                   convert kernel writes dq = scale * accumulator.
//                   deterministic = true: a separate kernel, one CTA per (query block, query
//                   head), walks the Q2K lists in ascending key-block order with no atomics
//                   (recomputing S and dP): bitwise reproducible.
// Both GEMM kernels use 16-row warp tiles; payload sub-tile (mt, ct) lives in lane words
// (mt * kBlockK/64 + ct) * 32 + lane (payload_layout.h).
#pragma once

#include <cstdint>

#include "kernels/common/block_range.cuh"
#include "kernels/common/flex_params.h"
#include "kernels/common/mask_apply.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/softmax.cuh"
#include "kernels/common/tile_io.cuh"

namespace flashspan::kern {

constexpr float kLog2e = 1.4426950408889634f;

// ---------------------------------------------------------------------------------------
// 1. Preprocess: one warp per (row, head); grid (ceil(max_seqlen_q / 8), Hq, B), 256 threads.
template <bool kBf16>
__global__ void __launch_bounds__(256) flex_bwd_preprocess_kernel(const FlexBwdParams p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h = blockIdx.y, b = blockIdx.z;
  const int i = blockIdx.x * 8 + warp;
  const int q_start = __ldg(p.cu_seqlens_q + b), len_q = __ldg(p.cu_seqlens_q + b + 1) - q_start;
  if (i >= len_q) return;
  const int64_t row = int64_t(p.varlen ? q_start : 0) + i;
  const uint16_t* o = static_cast<const uint16_t*>(p.o) + int64_t(b) * p.oa.batch_stride + row * p.oa.row_stride +
                      int64_t(h) * p.oa.head_stride;
  const uint16_t* d = static_cast<const uint16_t*>(p.dout) + int64_t(b) * p.doa.batch_stride +
                      row * p.doa.row_stride + int64_t(h) * p.doa.head_stride;
  float acc = 0.0f;
  for (int c = lane * 8; c < p.head_dv; c += 256) {
    const uint4 ov = *reinterpret_cast<const uint4*>(o + c);
    const uint4 dv = *reinterpret_cast<const uint4*>(d + c);
    const uint16_t* oe = reinterpret_cast<const uint16_t*>(&ov);
    const uint16_t* de = reinterpret_cast<const uint16_t*>(&dv);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc += to_float<kBf16>(oe[e]) * to_float<kBf16>(de[e]);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) {
    const int64_t ws = int64_t(h) * p.total_q + q_start + i;
    p.delta[ws] = acc;
    const float lse = p.lse[int64_t(b) * p.lsea.batch_stride + int64_t(h) * p.lsea.head_stride + row * p.lsea.row_stride];
    p.lse2[ws] = lse == -INFINITY ? INFINITY : lse * kLog2e;
  }
}

// ---------------------------------------------------------------------------------------
template <int kBlockQ_, int kBlockK_, int kDqk_, int kDv_, bool kExact_>
struct BwdTraitsSm80 {
  static constexpr int kBlockQ = kBlockQ_, kBlockK = kBlockK_, kDqk = kDqk_, kDv = kDv_;
  // kExact: head dims equal the tile's; no k-step or column block is skipped at run time.
  static constexpr bool kExact = kExact_;
  static_assert(kBlockQ == 64 && kBlockK % 64 == 0 && kDqk % 64 == 0 && kDv % 64 == 0);
  // dK/dV kernel: 8 warps.
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMT = kBlockQ / 16;          // m16 tiles of the S phase
  static constexpr int kWN = kWarps / kMT;          // warps across the key columns
  static constexpr int kNS = kBlockK / kWN / 8;     // n8 blocks of a warp's S tile
  static constexpr int kKT = kBlockK / 16;          // key tiles of the dK/dV phase
  static constexpr int kDS = kWarps / kKT;          // head-dim splits of the dK/dV phase
  static constexpr int kNK = kDqk / kDS / 8;        // n8 blocks of a warp's dK tile
  static constexpr int kNV = kDv / kDS / 8;         // n8 blocks of a warp's dV tile
  static_assert(kWN * kMT == kWarps && kKT * kDS == kWarps && kNK % 2 == 0 && kNV % 2 == 0 && kNS % 2 == 0);
  static constexpr int kSmemK = kBlockK * kDqk * 2;
  static constexpr int kSmemV = kBlockK * kDv * 2;
  static constexpr int kSmemQ = kBlockQ * kDqk * 2;  // x2 (double buffered)
  static constexpr int kSmemO = kBlockQ * kDv * 2;   // dO, x2
  static constexpr int kSmemP = kBlockQ * kBlockK * 2;
  // The split schedule's claimed item {task, begin, end, slot} (int32 x 4) follows the tiles.
  static constexpr int kSmemItem = kSmemK + kSmemV + 2 * (kSmemQ + kSmemO) + 2 * kSmemP;
  static constexpr int kSmemBytes = kSmemItem + 16;
  // dQ kernel: 4 warps, warp w owns query rows 16w.. and every key column.
  static constexpr int kWarpsQ = kBlockQ / 16;
  static constexpr int kThreadsQ = kWarpsQ * 32;
  static constexpr int kNSQ = kBlockK / 8;
  static constexpr int kNQ = kDqk / 8;
  static constexpr int kSmemBytesQ = kSmemQ + kSmemO + 2 * (kSmemK + kSmemV);
};

// Iterates (query head of the kv group, query block) pairs over the K2Q lists of one key block:
// head by head, each head's list in ascending query-block order. seek(begin) then next()
// visits pairs begin, begin + 1, ... of that order, at most `left` of them.
struct K2QWalk {
  const FlexBwdParams* p;
  int h, h_end, b, kb;
  int left;
  BlockCursor cur;

  __device__ __forceinline__ void open_head() {
    const int hm = p->mask_per_head ? h : 0;
    const int64_t r = int64_t(hm) * p->view.num_k_blocks + __ldg(p->view.k_block_start + b) + kb;
    cur = BlockCursor{p->view.k2q_partial_qb, p->view.k2q_full_qb, __ldg(p->view.k2q_partial_ptr + r),
                      __ldg(p->view.k2q_partial_ptr + r + 1), __ldg(p->view.k2q_full_ptr + r),
                      __ldg(p->view.k2q_full_ptr + r + 1)};
  }
  // Opens the head holding pair `begin` (heads before it are skipped whole) and positions
  // the cursor on that pair.
  __device__ __forceinline__ void seek(int begin) {
    open_head();
    while (true) {
      const int n = cur.remaining();
      if (begin < n || h + 1 >= h_end) break;
      begin -= n;
      ++h;
      open_head();
    }
    cur.skip(begin);
  }
  // Next pair; payload = payload index of a partial pair (-1 for a full one).
  __device__ __forceinline__ bool next(int& head, int& qb, int& payload) {
    if (left <= 0) return false;
    while (true) {
      bool partial = false;
      int entry = 0;
      if (cur.next(qb, partial, entry)) {
        --left;
        head = h;
        payload = partial ? __ldg(p->view.k2q_partial_idx + entry) : -1;
        return true;
      }
      if (++h >= h_end) return false;
      open_head();
    }
  }
};

// Row `row` of head h of sample b in a [B,S,H,D] / [T,H,D] tensor (flex_params.h).
__device__ __forceinline__ const uint16_t* row_ptr(const void* base, const FlexTensorAddr& a, int b, int64_t row,
                                                   int h) {
  return static_cast<const uint16_t*>(base) + int64_t(b) * a.batch_stride + row * a.row_stride +
         int64_t(h) * a.head_stride;
}

// ---------------------------------------------------------------------------------------
// 2. dK/dV of one work item: pairs [begin, begin + count) of key block kb of kv head hkv of
// sample b (K2QWalk order). The accumulator slot is read at the end (kept out of registers
// during the walk): -1 without a split schedule, else the claimed item's (shared memory).
// slot < 0: the item is the whole task and writes dk/dv (dk scaled; zeros when no query sees
// the block). slot >= 0: a piece of a split task; its partial sums are added (fp32 atomics,
// unscaled) to accumulator slot `slot`.
// Shared memory: the item's first loads (K, V, Q/dO[0]) are issued before the loop's first
// __syncthreads, so the caller must __syncthreads between two items of one CTA.
template <class T, bool kBf16>
__device__ __forceinline__ void dkdv_item(const FlexBwdParams& p, uint8_t* smem, int kb, int hkv, int b, int begin,
                                          int count) {
  const uint32_t sK = smem_u32(smem);
  const uint32_t sV = sK + T::kSmemK;
  const uint32_t sQ0 = sV + T::kSmemV;                // Q[2]
  const uint32_t sO0 = sQ0 + 2 * T::kSmemQ;           // dO[2]
  const uint32_t sP = sO0 + 2 * T::kSmemO;
  const uint32_t sdS = sP + T::kSmemP;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;

  const int q_start = __ldg(p.cu_seqlens_q + b), len_q = __ldg(p.cu_seqlens_q + b + 1) - q_start;
  const int k_start = __ldg(p.cu_seqlens_k + b), len_k = __ldg(p.cu_seqlens_k + b + 1) - k_start;
  const int key0 = kb * T::kBlockK;
  const int keys_valid = min(T::kBlockK, len_k - key0);
  const int64_t krow = int64_t(p.varlen ? k_start : 0) + key0;
  const int64_t qrow_base = p.varlen ? q_start : 0;

  load_tile_async<T::kBlockK, T::kDqk, T::kThreads>(sK, row_ptr(p.k, p.ka, b, krow, hkv), p.ka.row_stride,
                                                    keys_valid, p.head_dqk, tid);
  load_tile_async<T::kBlockK, T::kDv, T::kThreads>(sV, row_ptr(p.v, p.va, b, krow, hkv), p.va.row_stride,
                                                   keys_valid, p.head_dv, tid);

  K2QWalk walk{&p, hkv * p.group_size, (hkv + 1) * p.group_size, b, kb, count, {}};
  walk.seek(begin);
  int h = 0, qb = 0, payload = -1;
  bool have = walk.next(h, qb, payload);
  auto load_q_do = [&](int buf, int hh, int qq) {
    const int64_t row = qrow_base + int64_t(qq) * T::kBlockQ;
    const int rows = len_q - qq * T::kBlockQ;
    load_tile_async<T::kBlockQ, T::kDqk, T::kThreads>(sQ0 + buf * T::kSmemQ, row_ptr(p.q, p.qa, b, row, hh),
                                                      p.qa.row_stride, rows, p.head_dqk, tid);
    load_tile_async<T::kBlockQ, T::kDv, T::kThreads>(sO0 + buf * T::kSmemO, row_ptr(p.dout, p.doa, b, row, hh),
                                                     p.doa.row_stride, rows, p.head_dv, tid);
  };
  if (have) load_q_do(0, h, qb);
  cp_async_commit();

  float acc_dk[T::kNK][4], acc_dv[T::kNV][4];
#pragma unroll
  for (int n = 0; n < T::kNK; ++n) acc_dk[n][0] = acc_dk[n][1] = acc_dk[n][2] = acc_dk[n][3] = 0.0f;
#pragma unroll
  for (int n = 0; n < T::kNV; ++n) acc_dv[n][0] = acc_dv[n][1] = acc_dv[n][2] = acc_dv[n][3] = 0.0f;

  // S-phase warp tile: rows 16*mt.., key columns c0..c0 + 8*kNS.
  const int mt = warp / T::kWN;
  const int c0 = (warp % T::kWN) * (T::kNS * 8);
  // dK/dV-phase warp tile: keys 16*kt.., head-dim columns from dk0 / dv0.
  const int kt = warp % T::kKT;
  const int dsplit = warp / T::kKT;
  const int dk0 = dsplit * (T::kDqk / T::kDS), dv0 = dsplit * (T::kDv / T::kDS);
  const size_t words_per_tile = size_t(T::kBlockQ) * T::kBlockK / 32;
  // Fragment addresses (tile_io.cuh, LdsmAddr); the Q/dO ones are re-derived per buffer.
  const LdsmAddr<T::kDqk> bK = ldsm_b_nk<T::kDqk>(sK + c0 * T::kDqk * 2, lane);
  const LdsmAddr<T::kDv> bV = ldsm_b_nk<T::kDv>(sV + c0 * T::kDv * 2, lane);
  const LdsmAddr<T::kBlockK> aP = ldsm_a_trans<T::kBlockK>(sP, lane, 2 * kt);
  const LdsmAddr<T::kBlockK> adS = ldsm_a_trans<T::kBlockK>(sdS, lane, 2 * kt);
  int buf = 0;

  while (have) {
    cp_async_wait<0>();
    __syncthreads();  // Q/dO[buf] (and K, V) visible; the previous block's dK/dV phase is done
    int h_next = 0, qb_next = 0, payload_next = -1;
    const bool have_next = walk.next(h_next, qb_next, payload_next);
    if (have_next) load_q_do(buf ^ 1, h_next, qb_next);
    cp_async_commit();
    const uint32_t sQ = sQ0 + buf * T::kSmemQ, sO = sO0 + buf * T::kSmemO;
    const LdsmAddr<T::kDqk> aQ = ldsm_a<T::kDqk>(sQ + mt * 16 * T::kDqk * 2, lane);
    const LdsmAddr<T::kDv> aO = ldsm_a<T::kDv>(sO + mt * 16 * T::kDv * 2, lane);

    // ---- S phase: S = Q K^T, dP = dO V^T for the warp tile, then P and dS into smem.
    // The row statistics are loaded first so their latency hides behind the two GEMMs.
    float lse2[2], delta[2];
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int r = qb * T::kBlockQ + mt * 16 + g + 8 * hi;
      const bool ok = r < len_q;
      const int64_t ws = int64_t(h) * p.total_q + q_start + r;
      lse2[hi] = ok ? __ldg(p.lse2 + ws) : INFINITY;
      delta[hi] = ok ? __ldg(p.delta + ws) : 0.0f;
    }
    float s[T::kNS][4], dp[T::kNS][4];
#pragma unroll
    for (int n = 0; n < T::kNS; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) s[n][i] = dp[n][i] = 0.0f;
    }
    warp_mma_a_bnk<T::kDqk / 16, T::kNS, T::kExact, kBf16>(s, aQ, bK, p.head_dqk);
    warp_mma_a_bnk<T::kDv / 16, T::kNS, T::kExact, kBf16>(dp, aO, bV, p.head_dv);
#pragma unroll
    for (int n = 0; n < T::kNS; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) s[n][i] *= p.scale_log2;
    }
    if (payload >= 0) {
      apply_payload<T::kNS>(s, p.view.q2k_partial_bits + size_t(payload) * words_per_tile, mt, c0, T::kBlockK, lane);
    }
#pragma unroll
    for (int n = 0; n < T::kNS; ++n) {
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const float p0 = exp2_approx(s[n][2 * hi] - lse2[hi]);
        const float p1 = exp2_approx(s[n][2 * hi + 1] - lse2[hi]);
        const float ds0 = p0 * (dp[n][2 * hi] - delta[hi]);
        const float ds1 = p1 * (dp[n][2 * hi + 1] - delta[hi]);
        const int row = mt * 16 + g + 8 * hi;
        const int off = (swz_offset<T::kBlockK>(row, (c0 >> 3) + n) + 2 * t) * 2;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sP + off), "r"(pack2<kBf16>(p0, p1)) : "memory");
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sdS + off), "r"(pack2<kBf16>(ds0, ds1)) : "memory");
      }
    }
    __syncthreads();  // P, dS complete

    // ---- dK/dV phase: dV += P^T dO, dK += dS^T Q for keys 16*kt.. of the block.
    const LdsmAddr<T::kDv> bO = ldsm_b_kn<T::kDv>(sO, lane, dv0 / 8);
    const LdsmAddr<T::kDqk> bQ = ldsm_b_kn<T::kDqk>(sQ, lane, dk0 / 8);
#pragma unroll
    for (int kk = 0; kk < T::kBlockQ / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4_trans(a, aP.at(0, kk * 16));
#pragma unroll
      for (int n = 0; n < T::kNV; n += 2) {
        if (T::kExact || dv0 + n * 8 < p.head_dv) {
          uint32_t bb[4];
          ldmatrix_x4_trans(bb, bO.at(n / 2, kk * 16));
          mma_16816<kBf16>(acc_dv[n], a, bb[0], bb[1]);
          mma_16816<kBf16>(acc_dv[n + 1], a, bb[2], bb[3]);
        }
      }
      ldmatrix_x4_trans(a, adS.at(0, kk * 16));
#pragma unroll
      for (int n = 0; n < T::kNK; n += 2) {
        if (T::kExact || dk0 + n * 8 < p.head_dqk) {
          uint32_t bb[4];
          ldmatrix_x4_trans(bb, bQ.at(n / 2, kk * 16));
          mma_16816<kBf16>(acc_dk[n], a, bb[0], bb[1]);
          mma_16816<kBf16>(acc_dk[n + 1], a, bb[2], bb[3]);
        }
      }
    }
    if (p.dq_accum != nullptr) {
      // ---- dQ phase (atomic path): dQ[q] += dS K over this key block, added in fp32 to the
      // workspace accumulator. Warp tile: rows 16*(w % 4).., head-dim half w / 4.
      constexpr int kNQ = T::kDqk / 2 / 8;
      const int qm = warp % (T::kBlockQ / 16);
      const int dq0 = (warp / (T::kBlockQ / 16)) * (T::kDqk / 2);
      float acc_q[kNQ][4];
#pragma unroll
      for (int n = 0; n < kNQ; ++n) acc_q[n][0] = acc_q[n][1] = acc_q[n][2] = acc_q[n][3] = 0.0f;
      const LdsmAddr<T::kBlockK> aS = ldsm_a<T::kBlockK>(sdS + qm * 16 * T::kBlockK * 2, lane);
      const LdsmAddr<T::kDqk> bKq = ldsm_b_kn<T::kDqk>(sK, lane, dq0 / 8);
#pragma unroll
      for (int kk = 0; kk < T::kBlockK / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(a, aS.at(kk, 0));
#pragma unroll
        for (int n = 0; n < kNQ; n += 2) {
          if (T::kExact || dq0 + n * 8 < p.head_dqk) {
            uint32_t bb[4];
            ldmatrix_x4_trans(bb, bKq.at(n / 2, kk * 16));
            mma_16816<kBf16>(acc_q[n], a, bb[0], bb[1]);
            mma_16816<kBf16>(acc_q[n + 1], a, bb[2], bb[3]);
          }
        }
      }
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const int rr = qb * T::kBlockQ + qm * 16 + g + 8 * hi;
        if (rr < len_q) {
          float* dst = p.dq_accum + (int64_t(h) * p.total_q + q_start + rr) * p.head_dqk;
#pragma unroll
          for (int n = 0; n < kNQ; ++n) {
            const int col = dq0 + n * 8 + 2 * t;
            if (col < p.head_dqk) atomic_add_f32x2(dst + col, acc_q[n][2 * hi], acc_q[n][2 * hi + 1]);
          }
        }
      }
    }
    h = h_next;
    qb = qb_next;
    payload = payload_next;
    have = have_next;
    buf ^= 1;
  }
  cp_async_wait<0>();

  const int slot = p.split.items == nullptr ? -1 : reinterpret_cast<const int32_t*>(smem + T::kSmemItem)[3];
  if (slot >= 0) {
    // ---- Split task: add this item's sums to the slot's fp32 accumulators [block_k, D].
    float* dka = p.split.dk_accum + int64_t(slot) * T::kBlockK * p.head_dqk;
    float* dva = p.split.dv_accum + int64_t(slot) * T::kBlockK * p.head_dv;
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int key = kt * 16 + g + 8 * hi;
      if (key < keys_valid) {
#pragma unroll
        for (int n = 0; n < T::kNK; ++n) {
          const int col = dk0 + n * 8 + 2 * t;
          if (col < p.head_dqk) {
            atomic_add_f32x2(dka + int64_t(key) * p.head_dqk + col, acc_dk[n][2 * hi], acc_dk[n][2 * hi + 1]);
          }
        }
#pragma unroll
        for (int n = 0; n < T::kNV; ++n) {
          const int col = dv0 + n * 8 + 2 * t;
          if (col < p.head_dv) {
            atomic_add_f32x2(dva + int64_t(key) * p.head_dv + col, acc_dv[n][2 * hi], acc_dv[n][2 * hi + 1]);
          }
        }
      }
    }
    return;
  }

  // ---- Epilogue: dK (scaled) and dV; key blocks nobody sees get zeros.
  uint16_t* dk = static_cast<uint16_t*>(p.dk) + int64_t(b) * p.dka.batch_stride + krow * p.dka.row_stride +
                 int64_t(hkv) * p.dka.head_stride;
  uint16_t* dv = static_cast<uint16_t*>(p.dv) + int64_t(b) * p.dva.batch_stride + krow * p.dva.row_stride +
                 int64_t(hkv) * p.dva.head_stride;
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const int key = kt * 16 + g + 8 * hi;
    if (key < keys_valid) {
#pragma unroll
      for (int n = 0; n < T::kNK; ++n) {
        const int col = dk0 + n * 8 + 2 * t;
        if (col < p.head_dqk) {
          *reinterpret_cast<uint32_t*>(dk + int64_t(key) * p.dka.row_stride + col) =
              pack2<kBf16>(acc_dk[n][2 * hi] * p.scale, acc_dk[n][2 * hi + 1] * p.scale);
        }
      }
#pragma unroll
      for (int n = 0; n < T::kNV; ++n) {
        const int col = dv0 + n * 8 + 2 * t;
        if (col < p.head_dv) {
          *reinterpret_cast<uint32_t*>(dv + int64_t(key) * p.dva.row_stride + col) =
              pack2<kBf16>(acc_dv[n][2 * hi], acc_dv[n][2 * hi + 1]);
        }
      }
    }
  }
}

// dK/dV kernel. Without a split schedule (deterministic path, grid mode): one CTA per task
// (or per (key block, kv head) cell in grid mode), the whole K2Q walk, direct writes.
// With one (p.split.items): a persistent grid; each CTA claims items in list order with an
// atomic counter until the list is exhausted (items of long tasks come first).
template <class T, bool kBf16>
__global__ void __launch_bounds__(T::kThreads) flex_bwd_dkdv_kernel_sm80(const FlexBwdParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  int32_t* s_item = reinterpret_cast<int32_t*>(smem + T::kSmemItem);
  for (int round = 0;; ++round) {
    int kb, hkv, b, begin = 0, count = 0x7fffffff;
    if (p.split.items == nullptr) {
      if (round > 0) return;
      if (p.grid_mode) {
        const int gk = blockIdx.x;
        hkv = blockIdx.y;
        b = find_block_owner(p.view.k_block_start, p.batch, gk);
        kb = gk - __ldg(p.view.k_block_start + b);
      } else {
        const int32_t* task = p.view.tasks + 4 * int64_t(blockIdx.x);
        kb = __ldg(task + 0);
        hkv = __ldg(task + 1);
        b = __ldg(task + 2);
      }
    } else {
      __syncthreads();  // every thread is done with the previous item's tiles and s_item
      if (threadIdx.x == 0) {
        const int i = atomicAdd(p.split.hdr + FlexBwdSplit::kCounter, 1);
        int4 it = make_int4(-1, 0, 0, -1);
        if (i < p.split.hdr[FlexBwdSplit::kTotal]) it = reinterpret_cast<const int4*>(p.split.items)[i];
        s_item[0] = it.x;
        s_item[1] = it.y;
        s_item[2] = it.z;
        s_item[3] = it.w;
      }
      __syncthreads();
      const int task_index = s_item[0];
      if (task_index < 0) return;
      begin = s_item[1];
      count = s_item[2] - begin;
      const int32_t* task = p.view.tasks + 4 * int64_t(task_index);
      kb = __ldg(task + 0);
      hkv = __ldg(task + 1);
      b = __ldg(task + 2);
    }
    dkdv_item<T, kBf16>(p, smem, kb, hkv, b, begin, count);
  }
}

// ---------------------------------------------------------------------------------------
// 2b. dQ conversion (atomic path): dq = scale * dq_accum in the input dtype. One warp per
// (row, head); grid (ceil(max_seqlen_q / 8), Hq, B), 256 threads.
template <bool kBf16>
__global__ void __launch_bounds__(256) flex_bwd_dq_convert_kernel(const FlexBwdParams p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h = blockIdx.y, b = blockIdx.z;
  const int i = blockIdx.x * 8 + warp;
  const int q_start = __ldg(p.cu_seqlens_q + b), len_q = __ldg(p.cu_seqlens_q + b + 1) - q_start;
  if (i >= len_q) return;
  const float* src = p.dq_accum + (int64_t(h) * p.total_q + q_start + i) * p.head_dqk;
  uint16_t* dst = static_cast<uint16_t*>(p.dq) + int64_t(b) * p.dqa.batch_stride +
                  (int64_t(p.varlen ? q_start : 0) + i) * p.dqa.row_stride + int64_t(h) * p.dqa.head_stride;
  for (int c = lane * 2; c < p.head_dqk; c += 64) {
    const float2 x = *reinterpret_cast<const float2*>(src + c);
    *reinterpret_cast<uint32_t*>(dst + c) = pack2<kBf16>(x.x * p.scale, x.y * p.scale);
  }
}

// ---------------------------------------------------------------------------------------
// 3. dQ, deterministic: grid (global query block of the backward view, query head).
template <class T, bool kBf16>
__global__ void __launch_bounds__(T::kThreadsQ) flex_bwd_dq_kernel_sm80(const FlexBwdParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sQ = smem_u32(smem);
  const uint32_t sO = sQ + T::kSmemQ;
  const uint32_t sK0 = sO + T::kSmemO;               // K[2]
  const uint32_t sV0 = sK0 + 2 * T::kSmemK;          // V[2]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;

  const int gq = blockIdx.x, h = blockIdx.y;
  const int b = find_block_owner(p.view.q_block_start, p.batch, gq);
  const int qb = gq - __ldg(p.view.q_block_start + b);
  const int hkv = h / p.group_size;
  const int hm = p.mask_per_head ? h : 0;
  const int q_start = __ldg(p.cu_seqlens_q + b), len_q = __ldg(p.cu_seqlens_q + b + 1) - q_start;
  const int k_start = __ldg(p.cu_seqlens_k + b), len_k = __ldg(p.cu_seqlens_k + b + 1) - k_start;
  const int row0 = qb * T::kBlockQ;
  const int rows_valid = min(T::kBlockQ, len_q - row0);
  const int64_t qrow = int64_t(p.varlen ? q_start : 0) + row0;
  const int64_t krow_base = p.varlen ? k_start : 0;

  const int64_t r = int64_t(hm) * p.view.num_q_blocks + gq;
  BlockCursor cur{p.view.q2k_partial_kb, p.view.q2k_full_kb, __ldg(p.view.q2k_partial_ptr + r),
                  __ldg(p.view.q2k_partial_ptr + r + 1), __ldg(p.view.q2k_full_ptr + r),
                  __ldg(p.view.q2k_full_ptr + r + 1)};
  auto load_kv = [&](int buf, int kbb) {
    const int64_t row = krow_base + int64_t(kbb) * T::kBlockK;
    const int rows = len_k - kbb * T::kBlockK;
    load_tile_async<T::kBlockK, T::kDqk, T::kThreadsQ>(sK0 + buf * T::kSmemK, row_ptr(p.k, p.ka, b, row, hkv),
                                                       p.ka.row_stride, rows, p.head_dqk, tid);
    load_tile_async<T::kBlockK, T::kDv, T::kThreadsQ>(sV0 + buf * T::kSmemV, row_ptr(p.v, p.va, b, row, hkv),
                                                      p.va.row_stride, rows, p.head_dv, tid);
  };

  load_tile_async<T::kBlockQ, T::kDqk, T::kThreadsQ>(sQ, row_ptr(p.q, p.qa, b, qrow, h), p.qa.row_stride,
                                                     rows_valid, p.head_dqk, tid);
  load_tile_async<T::kBlockQ, T::kDv, T::kThreadsQ>(sO, row_ptr(p.dout, p.doa, b, qrow, h), p.doa.row_stride,
                                                    rows_valid, p.head_dv, tid);
  int kb = 0, entry = 0;
  bool partial = false;
  bool have = cur.next(kb, partial, entry);
  if (have) load_kv(0, kb);
  cp_async_commit();

  float lse2[2], delta[2];
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const int rr = row0 + warp * 16 + g + 8 * hi;
    const bool ok = rr < len_q;
    const int64_t ws = int64_t(h) * p.total_q + q_start + rr;
    lse2[hi] = ok ? __ldg(p.lse2 + ws) : INFINITY;
    delta[hi] = ok ? __ldg(p.delta + ws) : 0.0f;
  }
  float acc[T::kNQ][4];
#pragma unroll
  for (int n = 0; n < T::kNQ; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  const size_t words_per_tile = size_t(T::kBlockQ) * T::kBlockK / 32;
  const LdsmAddr<T::kDqk> aQ = ldsm_a<T::kDqk>(sQ + warp * 16 * T::kDqk * 2, lane);
  const LdsmAddr<T::kDv> aO = ldsm_a<T::kDv>(sO + warp * 16 * T::kDv * 2, lane);
  int buf = 0;

  while (have) {
    cp_async_wait<0>();
    __syncthreads();  // K/V[buf] visible; everyone is done with K/V[buf ^ 1]
    int kb_next = 0, entry_next = 0;
    bool partial_next = false;
    const bool have_next = cur.next(kb_next, partial_next, entry_next);
    if (have_next) load_kv(buf ^ 1, kb_next);
    cp_async_commit();
    const uint32_t sK = sK0 + buf * T::kSmemK, sV = sV0 + buf * T::kSmemV;
    const LdsmAddr<T::kDqk> bK = ldsm_b_nk<T::kDqk>(sK, lane);
    const LdsmAddr<T::kDv> bV = ldsm_b_nk<T::kDv>(sV, lane);

    float s[T::kNSQ][4], dp[T::kNSQ][4];
#pragma unroll
    for (int n = 0; n < T::kNSQ; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) s[n][i] = dp[n][i] = 0.0f;
    }
    warp_mma_a_bnk<T::kDqk / 16, T::kNSQ, T::kExact, kBf16>(s, aQ, bK, p.head_dqk);
    warp_mma_a_bnk<T::kDv / 16, T::kNSQ, T::kExact, kBf16>(dp, aO, bV, p.head_dv);
#pragma unroll
    for (int n = 0; n < T::kNSQ; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) s[n][i] *= p.scale_log2;
    }
    if (partial) {
      apply_payload<T::kNSQ>(s, p.view.q2k_partial_bits + size_t(entry) * words_per_tile, warp, 0, T::kBlockK, lane);
    }
#pragma unroll
    for (int n = 0; n < T::kNSQ; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float pr = exp2_approx(s[n][i] - lse2[i >> 1]);
        s[n][i] = pr * (dp[n][i] - delta[i >> 1]);  // dS
      }
    }
    // dQ += dS K: dS (registers, 16-bit) is the A operand, K[key][d] the B operand.
    const LdsmAddr<T::kDqk> bKq = ldsm_b_kn<T::kDqk>(sK, lane);
#pragma unroll
    for (int kk = 0; kk < T::kBlockK / 16; ++kk) {
      uint32_t a[4];
      a[0] = pack2<kBf16>(s[2 * kk][0], s[2 * kk][1]);
      a[1] = pack2<kBf16>(s[2 * kk][2], s[2 * kk][3]);
      a[2] = pack2<kBf16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = pack2<kBf16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int n = 0; n < T::kNQ; n += 2) {
        if (T::kExact || n * 8 < p.head_dqk) {
          uint32_t bb[4];
          ldmatrix_x4_trans(bb, bKq.at(n / 2, kk * 16));
          mma_16816<kBf16>(acc[n], a, bb[0], bb[1]);
          mma_16816<kBf16>(acc[n + 1], a, bb[2], bb[3]);
        }
      }
    }
    kb = kb_next;
    partial = partial_next;
    entry = entry_next;
    have = have_next;
    buf ^= 1;
  }
  cp_async_wait<0>();

  uint16_t* dq = static_cast<uint16_t*>(p.dq) + int64_t(b) * p.dqa.batch_stride + qrow * p.dqa.row_stride +
                 int64_t(h) * p.dqa.head_stride;
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const int row = warp * 16 + g + 8 * hi;
    if (row < rows_valid) {
#pragma unroll
      for (int n = 0; n < T::kNQ; ++n) {
        const int col = n * 8 + 2 * t;
        if (col < p.head_dqk) {
          *reinterpret_cast<uint32_t*>(dq + int64_t(row) * p.dqa.row_stride + col) =
              pack2<kBf16>(acc[n][2 * hi] * p.scale, acc[n][2 * hi + 1] * p.scale);
        }
      }
    }
  }
}

}  // namespace flashspan::kern
