// The environment's switch rules, one home for dispatch/ (family.h) and kernels/ (kernels/common/experimental_switch.h):
// both read the environment at each call, so that a process may switch a path between calls; callers that read a
// switch once keep its answer themselves.
#pragma once

#include <cstdlib>
#include <cstring>

namespace flashspan {

// Whether the environment variable `name` is exactly "1": the on switch of a path off by default (unset, empty or
// any other value: off), e.g. the measurement switches FLASHSPAN_SM90_BWD_DET_UNORDERED / _DET_CLAIM.
inline bool env_flag_on(const char* name) {
  const char* e = std::getenv(name);
  return e != nullptr && std::strcmp(e, "1") == 0;
}

// Whether the environment turns the experimental GPU paths on: FLASHSPAN_EXPERIMENTAL exactly "1" (unset, empty or
// any other value: off). Dispatch's experimental switches (paged K/V caches on CUDA tensors, sdpa_support.cpp; the
// deterministic sm90 backward's cut of long walks and the split-first item list, launch_sm90.h) and
// kern::ExperimentalSwitch read it.
inline bool experimental_from_env() { return env_flag_on("FLASHSPAN_EXPERIMENTAL"); }

// Whether the environment variable `name` is exactly "0": the off switch of a path on by default (FLASHSPAN_SM90_BWD,
// FLASHSPAN_SM90_SDPA_MODS, ..., kern::OffSwitch; unset, empty or any other value: not off; FLASHSPAN_EXPERIMENTAL
// ignored).
inline bool env_flag_off(const char* name) {
  const char* e = std::getenv(name);
  return e != nullptr && std::strcmp(e, "0") == 0;
}

// A switch that forces one of two answers or leaves the choice to a rule: 1 when `name` is exactly "1", 0 when
// exactly "0", else -1 (unset, empty or any other value: the rule decides), e.g. FLASHSPAN_SM90_BWD_CELLS /
// FLASHSPAN_SM90_BWD_DET_CLAIM.
inline int env_flag_forced(const char* name) { return env_flag_on(name) ? 1 : env_flag_off(name) ? 0 : -1; }

// The switch of an experimental path with a variable of its own (none at present; dispatch's
// FLASHSPAN_SDPA_DBIAS_SOFTCAP_DROPOUT was until on by default, 2026-12-06): `name` unset, FLASHSPAN_EXPERIMENTAL's
// answer (experimental_from_env, so that FLASHSPAN_EXPERIMENTAL=1 turns on every path not yet run on a GPU); exactly
// "0" off; any other value (empty included) on, whatever FLASHSPAN_EXPERIMENTAL says.
inline bool experimental_flag(const char* name) {
  const char* e = std::getenv(name);
  return e == nullptr ? experimental_from_env() : std::strcmp(e, "0") != 0;
}

}  // namespace flashspan
