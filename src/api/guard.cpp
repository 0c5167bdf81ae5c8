#include "api/guard.h"

namespace flashspan::api {

std::string& last_error() {
  thread_local std::string message;
  return message;
}

}  // namespace flashspan::api
