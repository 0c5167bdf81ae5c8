// Measurement instrument of the sm90 backward (issue 22, PERF_LOG v2.32's "next measurement"): a
// per-step timestamp trace of the dQ writer's chain (dQ tile ready, poll start, turn, tile read,
// tile written, counter released) and of one consumer thread's step, into a global buffer that
// the host sets through cudaMemcpyToSymbol (no kernel parameter changes).
//
// Compiled only with FLASHSPAN_BWD_TRACE=1 (CMake option FLASHSPAN_BWD_TRACE, OFF by default).
// Without it BwdTraceWriter / BwdTraceConsumer are empty structs with empty member functions, so
// the kernels' code is byte-identical to the untraced source (scripts/sass_diff.sh).
//
// Buffer (u64 words; the host hook flashspan_debug_bwd_trace_sm90 in launch_bwd_sm90.cu sets it,
// benchmarks/bwd_trace.py reads it): max_ctas slots of kSlotWords, slot i for blockIdx.x == i
// (CTAs beyond max_ctas record nothing):
//   header (kHeaderWords): [0] writer steps of the launch (may exceed cap: records beyond cap are
//     dropped), [1] consumer steps, [2] %smid, [3] blockIdx.x, [4] globaltimer at the writer's start
//   cap writer records of kRecWords: [0] dq_accum tile index (query head * num_q_blocks + global
//     query block), [1] CTA step index (low 32) | rank (high 32: the tile's turn, -1 when not
//     ordered), [2] key block (low 32) | step of the item (high 32), [3] item index of the CTA,
//     [4 + 2e] globaltimer (ns), [5 + 2e] clock64 of writer event e (0: not reached)
//   cap consumer records of kRecWords (thread 0 of consumer warpgroup 0): [0] tile, [1] CTA step
//     index, [2] key block | step of the item << 32, [3] item index, [4 + 2e], [5 + 2e] event e.
// The host zeroes the buffer before the traced launch (an event never reached reads 0). One launch
// per set buffer: a second launch overwrites the slots (trace one backward).
// The records of the writer events are stored as they happen (plain stores, lane 0) except the
// "written" time, held in registers and stored after the counter's release, so that the release
// (red.release.gpu orders the writer's earlier stores) does not wait on a trace store just issued.
#pragma once

#include <cstdint>

#ifndef FLASHSPAN_BWD_TRACE
#define FLASHSPAN_BWD_TRACE 0
#endif

namespace flashspan::kern90 {

// Writer events (record word 4 + 2e / 5 + 2e).
enum BwdTraceWriterEvent : int {
  kTrReady = 0,     // dq_full waited: the consumers' dQ tile is in shared memory
  kTrPoll = 1,      // the tile's rank is in (the dQ order warp): the counter poll starts (ordered only)
  kTrTurn = 2,      // the counter equals the rank: the writer's turn (ordered only)
  kTrRead = 3,      // the bulk reduce-add has read the shared tile (dq_empty arrives)
  kTrWritten = 4,   // the reduce-add is written to global memory (ordered only: bulk_wait_group<0>)
  kTrReleased = 5,  // the counter is released (red.release.gpu issued; ordered only)
};
// Consumer events (thread 0 of warpgroup 0).
enum BwdTraceConsumerEvent : int {
  kTrStepStart = 0,  // top of the step, before qdo_full
  kTrQdoFull = 1,    // Q, dO of the step landed
  kTrDqDone = 2,     // the step's dQ GEMM is done (before the dq_empty wait)
  kTrDqEmpty = 3,    // the shared dQ tile is free (dq_empty waited: the writer has read the last one)
  kTrDqFull = 4,     // the dQ tile is stored and dq_full arrived
  kTrStepEnd = 5,    // dK (dV) of the step done, Q / dO released
};

struct BwdTraceConfig {
  uint64_t* buf;  // nullptr: off
  int max_ctas;
  int cap;  // records per CTA and role
};
inline constexpr int kBwdTraceHeaderWords = 8;
inline constexpr int kBwdTraceRecWords = 16;
inline constexpr int kBwdTraceVersion = 1;

#if FLASHSPAN_BWD_TRACE

// One copy per translation unit (whole-program compilation): the host hook sets the copy of
// launch_bwd_sm90.cu, so the flex kernels are traced; the SDPA units' copies stay null.
static __device__ BwdTraceConfig g_bwd_trace_sm90;

__device__ __forceinline__ uint64_t bwd_trace_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint64_t* bwd_trace_slot() {
  const BwdTraceConfig c = *const_cast<const BwdTraceConfig*>(&g_bwd_trace_sm90);
  if (c.buf == nullptr || int(blockIdx.x) >= c.max_ctas) return nullptr;
  return c.buf + uint64_t(blockIdx.x) * (kBwdTraceHeaderWords + 2ull * kBwdTraceRecWords * c.cap);
}
__device__ __forceinline__ void bwd_trace_store(uint64_t* rec, int e, uint64_t ns, uint64_t clk) {
  *reinterpret_cast<ulonglong2*>(rec + 4 + 2 * e) = make_ulonglong2(ns, clk);
}

// The dQ writer's trace (lane 0 of warp 1 of WG0).
struct BwdTraceWriter {
  uint64_t* slot = nullptr;
  uint64_t* rec = nullptr;
  int cap = 0;
  uint64_t held_ns = 0, held_clk = 0;
  __device__ __forceinline__ void begin() {
    slot = bwd_trace_slot();
    if (slot != nullptr) {
      cap = g_bwd_trace_sm90.cap;
      int smid;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
      slot[2] = uint64_t(smid);
      slot[3] = blockIdx.x;
      slot[4] = bwd_trace_ns();
    }
  }
  __device__ __forceinline__ void step(uint32_t n) {
    rec = (slot != nullptr && n < uint32_t(cap)) ? slot + kBwdTraceHeaderWords + uint64_t(n) * kBwdTraceRecWords : nullptr;
  }
  __device__ __forceinline__ void mark(int e) {
    if (rec != nullptr) bwd_trace_store(rec, e, bwd_trace_ns(), clock64());
  }
  __device__ __forceinline__ void hold() {  // the "written" time, stored by flush_held()
    if (rec != nullptr) {
      held_ns = bwd_trace_ns();
      held_clk = clock64();
    }
  }
  __device__ __forceinline__ void flush_held() {
    if (rec != nullptr) bwd_trace_store(rec, kTrWritten, held_ns, held_clk);
  }
  __device__ __forceinline__ void info(int64_t tile, uint32_t n, int rank, int kb, int s, uint32_t item_it) {
    if (rec != nullptr) {
      rec[0] = uint64_t(tile);
      rec[1] = uint64_t(n) | (uint64_t(uint32_t(rank)) << 32);
      rec[2] = uint64_t(uint32_t(kb)) | (uint64_t(uint32_t(s)) << 32);
      rec[3] = item_it;
    }
  }
  __device__ __forceinline__ void end(uint32_t steps) {
    if (slot != nullptr) slot[0] = steps;
  }
};

// One consumer thread's trace (threadIdx.x == 128: thread 0 of consumer warpgroup 0).
struct BwdTraceConsumer {
  uint64_t* slot = nullptr;
  uint64_t* rec = nullptr;
  int cap = 0;
  __device__ __forceinline__ void begin() {
    slot = threadIdx.x == 128 ? bwd_trace_slot() : nullptr;
    if (slot != nullptr) cap = g_bwd_trace_sm90.cap;
  }
  __device__ __forceinline__ void step(uint32_t n, int kb, int s, uint32_t item_it) {
    rec = (slot != nullptr && n < uint32_t(cap))
              ? slot + kBwdTraceHeaderWords + uint64_t(cap + n) * kBwdTraceRecWords
              : nullptr;
    if (rec != nullptr) {
      rec[1] = n;
      rec[2] = uint64_t(uint32_t(kb)) | (uint64_t(uint32_t(s)) << 32);
      rec[3] = item_it;
      bwd_trace_store(rec, kTrStepStart, bwd_trace_ns(), clock64());
    }
  }
  __device__ __forceinline__ void mark(int e) {
    if (rec != nullptr) bwd_trace_store(rec, e, bwd_trace_ns(), clock64());
  }
  __device__ __forceinline__ void tile(int64_t t) {
    if (rec != nullptr) rec[0] = uint64_t(t);
  }
  __device__ __forceinline__ void end(uint32_t steps) {
    if (slot != nullptr) slot[1] = steps;
  }
};

#else  // no trace: empty, no code

struct BwdTraceWriter {
  __device__ __forceinline__ void begin() {}
  __device__ __forceinline__ void step(uint32_t) {}
  __device__ __forceinline__ void mark(int) {}
  __device__ __forceinline__ void hold() {}
  __device__ __forceinline__ void flush_held() {}
  __device__ __forceinline__ void info(int64_t, uint32_t, int, int, int, uint32_t) {}
  __device__ __forceinline__ void end(uint32_t) {}
};
struct BwdTraceConsumer {
  __device__ __forceinline__ void begin() {}
  __device__ __forceinline__ void step(uint32_t, int, int, uint32_t) {}
  __device__ __forceinline__ void mark(int) {}
  __device__ __forceinline__ void tile(int64_t) {}
  __device__ __forceinline__ void end(uint32_t) {}
};

#endif

}  // namespace flashspan::kern90
