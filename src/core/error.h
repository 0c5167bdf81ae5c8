// Error type shared by every layer: a status code plus a message that names the
// argument and the rule broken. The C ABI turns it into fs_status_t and the
// per-thread last-error message (src/api/c_api.cpp).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

#include "flashspan/flashspan.h"

namespace flashspan {

enum class Status : int {
  kSuccess = FS_STATUS_SUCCESS,
  kInvalidArgument = FS_STATUS_INVALID_ARGUMENT,
  kTypeError = FS_STATUS_TYPE_ERROR,
  kNotSupported = FS_STATUS_NOT_SUPPORTED,
  kCudaError = FS_STATUS_CUDA_ERROR,
  kOutOfMemory = FS_STATUS_OUT_OF_MEMORY,
  kInternal = FS_STATUS_INTERNAL_ERROR,
};

class Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  Status status() const noexcept { return status_; }

 private:
  Status status_;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// Throws Error(status, message) when `cond` is false. The message parts are streamed.
#define FS_CHECK(cond, status, ...)                                                      \
  do {                                                                                   \
    if (!(cond)) throw ::flashspan::Error((status), ::flashspan::detail::concat(__VA_ARGS__)); \
  } while (0)

#define FS_CHECK_ARG(cond, ...) FS_CHECK(cond, ::flashspan::Status::kInvalidArgument, __VA_ARGS__)
#define FS_CHECK_TYPE(cond, ...) FS_CHECK(cond, ::flashspan::Status::kTypeError, __VA_ARGS__)
#define FS_CHECK_SUPPORTED(cond, ...) FS_CHECK(cond, ::flashspan::Status::kNotSupported, __VA_ARGS__)

}  // namespace flashspan
