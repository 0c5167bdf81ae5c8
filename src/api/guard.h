// The C ABI's error convention, shared by every fs_* entry point: run the body, turn a
// thrown flashspan::Error into its status code and store its message as this thread's
// last error (fs_get_last_error); success clears the message.
#pragma once

#include <exception>
#include <new>
#include <string>

#include "core/error.h"
#include "flashspan/flashspan.h"

namespace flashspan::api {

// This thread's last error message (what fs_get_last_error returns).
std::string& last_error();

template <typename F>
fs_status_t guarded(F&& f) {
  try {
    f();
    last_error().clear();
    return FS_STATUS_SUCCESS;
  } catch (const Error& e) {
    last_error() = e.what();
    return static_cast<fs_status_t>(e.status());
  } catch (const std::bad_alloc&) {
    last_error() = "out of host memory";
    return FS_STATUS_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    last_error() = std::string("internal error: ") + e.what();
    return FS_STATUS_INTERNAL_ERROR;
  } catch (...) {
    last_error() = "internal error: unknown exception";
    return FS_STATUS_INTERNAL_ERROR;
  }
}

}  // namespace flashspan::api
