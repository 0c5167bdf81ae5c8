#pragma once
#include "cuda_emu.h"
namespace cub {
template <class T, int N>
struct BlockScan {
  struct TempStorage { T v[N]; };
  TempStorage& s;
  explicit BlockScan(TempStorage& t) : s(t) {}
  void ExclusiveSum(T in, T& out) { T agg; ExclusiveSum(in, out, agg); }
  void ExclusiveSum(T in, T& out, T& agg) {
    s.v[threadIdx.x] = in;
    __syncthreads();
    T acc = 0, tot = 0;
    for (int i = 0; i < N; ++i) { if (i < (int)threadIdx.x) acc += s.v[i]; tot += s.v[i]; }
    out = acc; agg = tot;
    __syncthreads();
  }
};
}  // namespace cub
