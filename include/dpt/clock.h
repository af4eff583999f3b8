// The one clock of timings and deadlines: seconds on the steady clock (never stepped by NTP).
#pragma once

#include <chrono>

namespace dpt {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace dpt
