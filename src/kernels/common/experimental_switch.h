// Kernel-side switches (host code) with a test override (set: 1 on, 0 off, -1 back to the environment's answer).
// ExperimentalSwitch: off unless FLASHSPAN_EXPERIMENTAL is exactly "1" (read at each on()): the launchers' switches
// of paths not yet run on a GPU. OffSwitch: a launcher path on by default since its GPU tests passed, off with its
// own variable set to exactly "0" (read at each on(); FLASHSPAN_EXPERIMENTAL ignored), e.g.
// kernels/common/fp8_prepass.h fp8_widen_vec_enabled. The environment's rules live in core/env_switch.h
// (experimental_from_env, env_flag_off), shared with dispatch's own switches (dispatch/family.h).
#pragma once

#include <atomic>

#include "core/env_switch.h"

namespace flashspan::kern {

struct ExperimentalSwitch {
  std::atomic<int> override_{-1};

  void set(int on) { override_.store(on < 0 ? -1 : (on ? 1 : 0), std::memory_order_relaxed); }
  bool on() const {
    const int o = override_.load(std::memory_order_relaxed);
    if (o >= 0) return o == 1;
    return experimental_from_env();
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
    return !env_flag_off(var);
  }
};

}  // namespace flashspan::kern
