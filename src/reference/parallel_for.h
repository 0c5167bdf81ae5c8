// Minimal fork-join helper for the CPU reference: runs f(task) for task in [0, n) on
// up to hardware_concurrency() std::threads that pull task indices from one atomic
// counter (dynamic load balance: masked rows make tasks very uneven in cost).
// The first exception thrown by any task is rethrown on the calling thread after
// all workers have stopped; the remaining tasks are then skipped.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace flashspan::reference {

template <typename F>
void parallel_for(int64_t n, F&& f) {
  if (n <= 0) return;
  const int64_t hw = std::max(1u, std::thread::hardware_concurrency());
  const int64_t nthreads = std::min(hw, n);
  if (nthreads == 1) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&]() {
    try {
      for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) f(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(n);
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(nthreads - 1);
  for (int64_t t = 1; t < nthreads; ++t) {
    try {
      threads.emplace_back(worker);
    } catch (const std::system_error&) {
      break;  // could not start another thread: the ones running (and this one) finish the work
    }
  }
  worker();
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace flashspan::reference
