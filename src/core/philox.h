// Philox4x32-10 counter-based random numbers and the SDPA dropout mapping built on them.
// One header for host (CPU reference, tests) and device (GPU kernels), so every backend
// draws exactly the same dropout mask.
//
// Philox4x32-10 (J. Salmon, M. Moraes, R. Dror, D. Shaw, "Parallel random numbers: as easy
// as 1, 2, 3", SC 2011; the Random123 library): a 128-bit counter (c0..c3) and a 64-bit key
// (k0, k1) give four 32-bit words after ten rounds. One round:
//   (hi0, lo0) = 0xD2511F53 * c0,  (hi1, lo1) = 0xCD9E8D57 * c2   (32x32 -> 64-bit products)
//   c' = (hi1 ^ c1 ^ k0,  lo1,  hi0 ^ c3 ^ k1,  lo0)
// and the key is bumped by the Weyl constants (0x9E3779B9, 0xBB67AE85) between rounds.
// Known-answer vectors (Random123 kat_vectors) are checked in tests/cpp/test_sdpa_reference.cpp.
//
// SDPA dropout mapping (flashspan's specification; every backend must follow it):
//   seed   : int64 (an int32 seed tensor is sign-extended); key k0 = low 32 bits, k1 = high 32 bits.
//   offset : int64 (int32 sign-extended), read as an unsigned 64-bit counter base.
//   element (b, h, i, j): batch b, query head h (of H_q), sample-local query row i, sample-local
//   key column j. One Philox call serves the 2 x 4 block of rows {i, i + 8} x columns
//   {j, j + 1, j + 8, j + 9} for i % 16 < 8 and j % 16 < 8, j even (the per-thread pattern of two
//   adjacent n8 blocks of mma.sync and wgmma accumulators), each element a 16-bit half of a word:
//     (c0 | c1 << 32) = offset + 4 (j >> 4) + ((j >> 1) & 3)   (64-bit add, wraps)
//      c2             = (i >> 4) * 8 + (i & 7)                 (row pair within the sample)
//      c3             = b * H_q + h
//     word            = 2 * ((i >> 3) & 1) + (j & 1)
//     half            = (j >> 3) & 1                           (bits 16 half .. 16 half + 15)
//   The element is dropped iff its 16-bit number is below threshold, threshold =
//   min(floor(p * 2^16), 2^16 - 1) (dropout_threshold); kept elements are scaled by 1 / (1 - p).
//   So the dropped fraction is threshold / 2^16, within 2^-16 of p (p < 2^-16 drops nothing).
//   16-bit numbers (eight elements a call, not four) halve the Philox work, which bounds the
//   GPU kernels with dropout (PERF_LOG v2.23); FlashAttention-2 uses 8-bit ones (p within 2^-8).
// Calls that share a seed get independent masks when their offsets differ by at least
// 4 ceil(S_kv / 16) (the largest counter step of a call plus one), as with PyTorch's Philox offsets.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define FS_PHILOX_HD __host__ __device__ __forceinline__
#else
#define FS_PHILOX_HD inline
#endif

namespace flashspan {

struct Philox4 {
  uint32_t x[4];
};

FS_PHILOX_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  uint64_t p;
#if defined(__CUDA_ARCH__)
  // One IMAD.WIDE.U32: from the 64-bit C++ product ptxas (CUDA 13, sm_90a) kept an add of a zero upper
  // word after each of the round's two products (20 dead adds a call; PERF_LOG v2.69).
  asm("mul.wide.u32 %0, %1, %2;" : "=l"(p) : "r"(a), "r"(b));
#else
  p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
#endif
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

// Philox4x32 with 10 rounds.
FS_PHILOX_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)  // (device pass only: the host compiler of a .cu file warns on it)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kM0, c0, &hi0, &lo0);
    philox_mulhilo(kM1, c2, &hi1, &lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// Drop threshold of a dropout probability p in [0, 1): an element is dropped iff its
// 16-bit number is below it. Computed in double on the host and passed to kernels as is.
inline uint32_t dropout_threshold(double p) {
  if (!(p > 0.0)) return 0u;
  const double t = std::floor(p * 65536.0);
  return t >= 65535.0 ? 0xFFFFu : static_cast<uint32_t>(t);
}

// The four words of the Philox call that serves element (b, h, i, j) (see the mapping above).
// bh = b * H_q + h.
FS_PHILOX_HD Philox4 dropout_philox_block(uint64_t seed, uint64_t offset, uint32_t bh, uint32_t i, uint32_t j) {
  const uint64_t ctr = offset + (uint64_t(j >> 4) << 2) + ((j >> 1) & 3u);
  return philox4x32_10(static_cast<uint32_t>(ctr), static_cast<uint32_t>(ctr >> 32), (i >> 4) * 8u + (i & 7u), bh,
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Index of element (i, j)'s word within its Philox block.
FS_PHILOX_HD int dropout_word_index(uint32_t i, uint32_t j) { return static_cast<int>(2u * ((i >> 3) & 1u) + (j & 1u)); }

// Element (i, j)'s 16-bit number in its word (half (j >> 3) & 1).
FS_PHILOX_HD uint32_t dropout_number(uint32_t word, uint32_t j) { return (word >> (((j >> 3) & 1u) * 16u)) & 0xFFFFu; }

// The keep bits of one call's eight elements (the mapping above): bit r (r = 0..3) for word r's low half,
// bit 4 + r for its high half, 1 where the element survives. The GPU kernels' per-thread order: bit r is
// element (n, r) and bit 4 + r element (n + 1, r) of a thread's n8 accumulator blocks n, n + 1
// (kernels/common/sdpa_score_mod.cuh sdpa_dropout_keep_bits).
// Whether the low / high 16-bit number of word w survives a threshold given as threshold16 = threshold << 16:
// both halves compared in the word's top 16 bits (threshold < 2^16), a compare each, no extraction of the high
// half. The GPU kernels' one form of the test (dropout_keep_byte; the transposed keep bits of
// kernels/common/sdpa_score_mod.cuh); dropout_keep below keeps the extracting form as the reference.
FS_PHILOX_HD bool dropout_keeps_low(uint32_t w, uint32_t threshold16) { return (w << 16) >= threshold16; }
FS_PHILOX_HD bool dropout_keeps_high(uint32_t w, uint32_t threshold16) { return w >= threshold16; }

FS_PHILOX_HD uint32_t dropout_keep_byte(const Philox4& w, uint32_t threshold) {
  uint32_t k8 = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < 4; ++r) {
    if (dropout_keeps_low(w.x[r], threshold << 16)) k8 |= 1u << r;
    if (dropout_keeps_high(w.x[r], threshold << 16)) k8 |= 1u << (4 + r);
  }
  return k8;
}

// Whether element (b, h, i, j) survives dropout.
FS_PHILOX_HD bool dropout_keep(uint64_t seed, uint64_t offset, uint32_t bh, uint32_t i, uint32_t j,
                               uint32_t threshold) {
  return dropout_number(dropout_philox_block(seed, offset, bh, i, j).x[dropout_word_index(i, j)], j) >= threshold;
}

}  // namespace flashspan
