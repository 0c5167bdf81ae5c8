// An environment variable set for a scope (tests of the switches read per call: FLASHSPAN_SDPA_FP8_BWD,
// FLASHSPAN_SDPA_FEATURE_PAIRS, FLASHSPAN_SDPA_FP8_SM80, ...): nullptr unsets it; its value before is
// restored after the scope. ScopedSwitch: a dispatch switch's in-process override for a scope. Header-only.
#pragma once

#include <cstdlib>
#include <string>

namespace flashspan::test {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    set(value);
  }
  ~ScopedEnv() { set(had_ ? old_.c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

  void set(const char* value) {
    if (value == nullptr) {
      unsetenv(name_);
    } else {
      setenv(name_, value, 1);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// A dispatch switch's in-process override (dispatch/sdpa_launch.h set_*_enabled(int): 1 on, 0 off, -1 the
// environment's answer) forced to `on` for a scope, the environment's answer back after it; e.g.
// ScopedSwitch thd(flashspan::set_sdpa_sm90_thd_enabled, 1).
class ScopedSwitch {
 public:
  ScopedSwitch(void (*set)(int), int on) : set_(set) { set_(on); }
  ~ScopedSwitch() { set_(-1); }
  ScopedSwitch(const ScopedSwitch&) = delete;
  ScopedSwitch& operator=(const ScopedSwitch&) = delete;

 private:
  void (*set_)(int);
};

}  // namespace flashspan::test
