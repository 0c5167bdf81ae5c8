#pragma once
#include "cuda_emu.h"
#include <numeric>
namespace cub {
struct DeviceRadixSort {
  template <class K, class V, class N>
  static cudaError_t SortPairs(void* tmp, size_t& bytes, const K* kin, K* kout, const V* vin, V* vout, N n,
                               int begin_bit, int end_bit, cudaStream_t = nullptr) {
    if (!tmp) { bytes = 16; return cudaSuccess; }
    std::vector<long long> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    auto key = [&](long long i) {
      unsigned long long k = (unsigned long long)kin[i] >> begin_bit;
      if (end_bit - begin_bit < 64) k &= (1ull << (end_bit - begin_bit)) - 1;
      return k;
    };
    std::stable_sort(idx.begin(), idx.end(), [&](long long a, long long b) { return key(a) < key(b); });
    std::vector<K> ko(n); std::vector<V> vo(n);
    for (long long i = 0; i < (long long)n; ++i) { ko[i] = kin[idx[i]]; vo[i] = vin[idx[i]]; }
    std::copy(ko.begin(), ko.end(), kout); std::copy(vo.begin(), vo.end(), vout);
    return cudaSuccess;
  }
  template <class K, class N>
  static cudaError_t SortKeys(void* tmp, size_t& bytes, const K* kin, K* kout, N n, int begin_bit, int end_bit,
                              cudaStream_t = nullptr) {
    if (!tmp) { bytes = 16; return cudaSuccess; }
    std::vector<K> v(kin, kin + n);
    std::stable_sort(v.begin(), v.end(), [&](K a, K b) {
      auto m = [&](K k) { unsigned long long x = (unsigned long long)k >> begin_bit;
        if (end_bit - begin_bit < 64) x &= (1ull << (end_bit - begin_bit)) - 1;
      return x; };
      return m(a) < m(b); });
    std::copy(v.begin(), v.end(), kout);
    return cudaSuccess;
  }
};
}  // namespace cub
