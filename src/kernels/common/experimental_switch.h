// Kernel-side switches (host code) with a test override (set: 1 on, 0 off, -1 back to the environment's answer).
// ExperimentalSwitch: off unless FLASHSPAN_EXPERIMENTAL is exactly "1" (read at each on()): the launchers' switches
// of paths not yet run on a GPU. OffSwitch: a launcher path on by default since its GPU tests passed, off with its
// own variable set to exactly "0" (read at each on(); FLASHSPAN_EXPERIMENTAL ignored), e.g.
// kernels/common/fp8_prepass.h fp8_widen_vec_enabled. Dispatch's own switches live in dispatch/ (family.h
// experimental_from_env, env_flag_off).
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace flashspan::kern {

struct ExperimentalSwitch {
  std::atomic<int> override_{-1};

  void set(int on) { override_.store(on < 0 ? -1 : (on ? 1 : 0), std::memory_order_relaxed); }
  bool on() const {
    const int o = override_.load(std::memory_order_relaxed);
    if (o >= 0) return o == 1;
    const char* e = std::getenv("FLASHSPAN_EXPERIMENTAL");
    return e != nullptr && std::strcmp(e, "1") == 0;
  }
};

struct OffSwitch {
  const char* var;  // the environment variable whose "0" turns it off
  std::atomic<int> override_{-1};

  explicit OffSwitch(const char* name) : var(name) {}
  void set(int on) { override_.store(on < 0 ? -1 : (on ? 1 : 0), std::memory_order_relaxed); }
  bool on() const {
    const int o = override_.load(std::memory_order_relaxed);
    if (o >= 0) return o == 1;
    const char* e = std::getenv(var);
    return e == nullptr || std::strcmp(e, "0") != 0;
  }
};

}  // namespace flashspan::kern
