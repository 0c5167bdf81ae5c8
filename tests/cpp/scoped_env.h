// An environment variable set for a scope (tests of the switches read per call: FLASHSPAN_SDPA_FP8_BWD,
// FLASHSPAN_SDPA_FEATURE_PAIRS, FLASHSPAN_SDPA_FP8_SM80, ...): nullptr unsets it; its value before is
// restored after the scope. ScopedSwitch: a dispatch switch's in-process override for a scope. expect_off_switch:
// the rule of a switch on by default; expect_experimental_flag: of an experimental one with a variable of its own.
// Header-only.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
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

// "<prefix><var>=<value>, FLASHSPAN_EXPERIMENTAL=<e>" (nullptr: "(unset)"), for the switch rules' failure messages;
// appended piece by piece (GCC 12 warns on some operator+ chains of std::string).
inline std::string switch_where(const char* var, const char* prefix, const char* value, const char* e) {
  auto shown = [](std::string& w, const char* v) {
    if (v == nullptr) {
      w.append("(unset)");
    } else {
      w.append("\"").append(v).append("\"");
    }
  };
  std::string w(prefix);
  w.append(var).append("=");
  shown(w, value);
  w.append(", FLASHSPAN_EXPERIMENTAL=");
  shown(w, e);
  return w;
}

// The rule of a dispatch switch on by default (a path whose GPU tests passed; dispatch/sdpa_launch.h): without its
// override, on unless the environment variable `var` is exactly "0" (core/env_switch.h env_flag_off: unset, empty or
// any other value leaves it on), read per call; FLASHSPAN_EXPERIMENTAL (the switch of the experimental paths) changes
// neither answer; the override (`set`: 1 on, 0 off) wins over the environment both ways, -1 gives the environment's
// answer back. effect(on, where), if given, checks what the switch changes in each state (`where` names the
// environment and the override, for failure messages). Leaves the override at -1 and the environment as it was.
inline void expect_off_switch(const char* var, void (*set)(int), bool (*enabled)(),
                              const std::function<void(bool, const std::string&)>& effect = {}) {
  set(-1);
  ScopedEnv off(var, nullptr);
  ScopedEnv experimental("FLASHSPAN_EXPERIMENTAL", nullptr);
  auto expect = [&](bool on, const std::string& where) {
    EXPECT_EQ(enabled(), on) << where;
    if (effect) effect(on, where);
  };
  auto where = [var](const char* prefix, const char* value, const char* e) {
    return switch_where(var, prefix, value, e);
  };
  for (const char* e : {static_cast<const char*>(nullptr), "0", "1"}) {
    experimental.set(e);
    for (const char* v : {static_cast<const char*>(nullptr), "1", "", "00", " 0", "off", "false"}) {
      off.set(v);
      expect(true, where("", v, e));
    }
    off.set("0");
    expect(false, where("", "0", e));
    set(1);
    expect(true, where("override 1, ", "0", e));
    off.set(nullptr);
    set(0);
    expect(false, where("override 0, ", nullptr, e));
    set(-1);
    expect(true, where("override -1, ", nullptr, e));
  }
}

// The rule of an experimental dispatch switch with a variable of its own (core/env_switch.h experimental_flag; a path
// not yet run on a GPU; none at present: FLASHSPAN_SDPA_DBIAS_SOFTCAP_DROPOUT was until on by default, 2026-12-06):
// without its override, `var` unset gives FLASHSPAN_EXPERIMENTAL's answer (on only when exactly "1"), `var` exactly
// "0" off whatever FLASHSPAN_EXPERIMENTAL says, any other value of `var` (empty included) on; read per call; the
// override (`set`: 1 on, 0 off) wins over the environment both ways, -1 gives the environment's answer back.
// effect(on, where) as expect_off_switch's. Leaves the override at -1 and the environment as it was.
inline void expect_experimental_flag(const char* var, void (*set)(int), bool (*enabled)(),
                                     const std::function<void(bool, const std::string&)>& effect = {}) {
  set(-1);
  ScopedEnv own(var, nullptr);
  ScopedEnv experimental("FLASHSPAN_EXPERIMENTAL", nullptr);
  auto expect = [&](bool on, const std::string& where) {
    EXPECT_EQ(enabled(), on) << where;
    if (effect) effect(on, where);
  };
  for (const char* e : {static_cast<const char*>(nullptr), "0", "1", "", "true"}) {
    experimental.set(e);
    const bool experimental_on = e != nullptr && std::string(e) == "1";
    own.set(nullptr);
    expect(experimental_on, switch_where(var, "", nullptr, e));
    own.set("0");
    expect(false, switch_where(var, "", "0", e));
    for (const char* v : {"1", "", "00", " 0", "off", "false", "yes"}) {
      own.set(v);
      expect(true, switch_where(var, "", v, e));
    }
    own.set("0");
    set(1);
    expect(true, switch_where(var, "override 1, ", "0", e));
    own.set(nullptr);
    set(0);
    expect(false, switch_where(var, "override 0, ", nullptr, e));
    own.set("1");
    expect(false, switch_where(var, "override 0, ", "1", e));
    set(-1);
    expect(true, switch_where(var, "override -1, ", "1", e));
    own.set(nullptr);
    expect(experimental_on, switch_where(var, "override -1, ", nullptr, e));
  }
}

}  // namespace flashspan::test
