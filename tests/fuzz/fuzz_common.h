// Shared helpers of the libFuzzer targets (tests/fuzz): tensors described through the C ABI
// over harness-owned memory, and the invariants every failed call must satisfy.
//
// The harness never hands the library a descriptor whose extent is larger than the memory
// behind it (that would be a caller bug, not a library bug): every buffer is sized from the
// shape and strides it is described with, and huge shapes come with a NULL data pointer
// only where the library reads no data (q/k/v of plan creation).
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flashspan/flashspan.h"

namespace fsfuzz {

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "FUZZ INVARIANT BROKEN: %s\n", what.c_str());
  std::abort();
}

// Every failed call must return a known status and a message naming what broke ("<argument>: <rule>").
inline void check_error(fs_status_t st, const char* call) {
  if (st == FS_STATUS_SUCCESS) return;
  if (st < FS_STATUS_INVALID_ARGUMENT || st > FS_STATUS_INTERNAL_ERROR)
    fail(std::string(call) + ": unknown status " + std::to_string(int(st)));
  if (st == FS_STATUS_INTERNAL_ERROR || st == FS_STATUS_CUDA_ERROR)
    fail(std::string(call) + ": internal/CUDA error on CPU input: " + fs_get_last_error());
  const std::string msg = fs_get_last_error();
  if (msg.empty()) fail(std::string(call) + ": error without a message");
  if (msg.find(':') == std::string::npos) fail(std::string(call) + ": message names no argument: " + msg);
}

enum DT { kF32, kF16, kBF16, kF64, kI32, kI64, kU8, kBad };
inline fs_dtype_t dtype(int d) {
  switch (d) {
    case kF32: return {FS_DTYPE_FLOAT, 32, 1};
    case kF16: return {FS_DTYPE_FLOAT, 16, 1};
    case kBF16: return {FS_DTYPE_BFLOAT, 16, 1};
    case kF64: return {FS_DTYPE_FLOAT, 64, 1};
    case kI32: return {FS_DTYPE_INT, 32, 1};
    case kI64: return {FS_DTYPE_INT, 64, 1};
    case kU8: return {FS_DTYPE_UINT, 8, 1};
    default: return {FS_DTYPE_FLOAT, 32, 4};  // lanes != 1: unsupported
  }
}
inline int itemsize(fs_dtype_t d) { return d.bits / 8; }

// A tensor described through fs_tensor_t over memory the harness owns (zero-filled, or
// random finite values for floats), large enough for every element its strides reach.
struct Tensor {
  std::vector<int64_t> shape, strides;
  std::vector<unsigned char> mem;
  fs_tensor_t t{};
  bool strided = false;

  Tensor() = default;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  // Sets up the descriptor; allocates memory only when the reachable extent is at most
  // max_bytes (otherwise data stays NULL: for descriptors the library only inspects).
  void make(fs_dtype_t dt, std::vector<int64_t> shp, std::vector<int64_t> str, size_t max_bytes, uint32_t fill_seed) {
    shape = std::move(shp);
    strided = !str.empty();
    strides = strided ? std::move(str) : std::vector<int64_t>(shape.size());
    if (!strided) {
      int64_t s = 1;
      for (int i = int(shape.size()) - 1; i >= 0; --i) {
        strides[i] = s;
        // Saturating: only the harness's extent computation reads these (the library gets NULL strides).
        const __int128 next = __int128(s) * std::max<int64_t>(shape[i], 1);
        s = next > (__int128(1) << 62) ? (int64_t(1) << 62) : int64_t(next);
      }
    }
    t = fs_tensor_t{};
    t.device = {FS_DEVICE_CPU, 0};
    t.ndim = int32_t(shape.size());
    t.dtype = dt;
    t.shape = shape.empty() ? nullptr : shape.data();
    t.strides = strided ? strides.data() : nullptr;
    // Reachable element offsets [lo, hi] (empty tensor: nothing reachable).
    bool empty = false;
    __int128 lo = 0, hi = 0;
    bool huge = false;
    for (size_t i = 0; i < shape.size(); ++i) {
      if (shape[i] <= 0) empty = true;
      if (shape[i] > (int64_t(1) << 40) || strides[i] > (int64_t(1) << 40) || strides[i] < -(int64_t(1) << 40)) {
        huge = true;
      } else if (shape[i] > 1) {
        const __int128 span = __int128(shape[i] - 1) * strides[i];
        (span < 0 ? lo : hi) += span;
      }
    }
    const int isz = std::max(1, itemsize(dt));
    const __int128 bytes = empty ? 0 : huge ? __int128(max_bytes) + 1 : (hi - lo + 1) * isz;
    if (bytes > __int128(max_bytes) || bytes < 0) {
      t.data = nullptr;
      return;
    }
    mem.assign(size_t(bytes) + 64, 0);
    // Finite pseudo-random values for float tensors (a NaN input would hide NaN outputs).
    uint32_t x = fill_seed * 2654435761u + 1;
    if (dt.code == FS_DTYPE_FLOAT && dt.bits == 32) {
      for (size_t i = 0; i + 4 <= mem.size(); i += 4) {
        x = x * 1664525u + 1013904223u;
        float f = float(int32_t(x >> 8) % 2001 - 1000) / 500.0f;
        std::memcpy(&mem[i], &f, 4);
      }
    }
    t.data = mem.data() + size_t(-lo * isz);
  }
  const fs_tensor_t* get() { return &t; }
  template <typename T>
  T* at(int64_t elem) {
    return reinterpret_cast<T*>(static_cast<unsigned char*>(t.data) + elem * int64_t(sizeof(T)));
  }
};

}  // namespace fsfuzz
