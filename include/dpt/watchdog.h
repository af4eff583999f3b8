// Watchdog: ends the process with a given code when a call that nothing else can bound (MPI_Init,
// MPI_Finalize, MPI_Abort: src/comm/communicator.cc) has not returned within a running-time limit.
// Header-only and free of MPI, so that it is unit-tested in forked children
// (tests/unit/test_watchdog.cc).
#pragma once

#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <system_error>
#include <thread>

#include "dpt/poll.h"

namespace dpt {

// Ends the process with `code`, after say() has told why, unless done() is called (or the watchdog
// is destroyed) within `seconds` (<= 0 or NaN: never): the bound of the MPI calls that --timeout's
// collectives cannot reach (MPI_Init, MPI_Finalize, MPI_Abort), one mechanism for the three. Its
// thread makes no MPI call and inherits the caller's blocked signals. started() is false where no
// thread could be made: the call is then unbounded, or its caller ends at once.
class Watchdog {
 public:
  Watchdog(double seconds, int code, std::function<void()> say) {
    if (!(seconds > 0)) return;  // a NaN too: timeout_duration would make it 0, an _exit at once
    try {
      thread_ = std::thread([this, seconds, code, say = std::move(say)] {
        // Running time (wait_running): a job suspended during MPI_Init and continued later goes
        // on instead of ending here.
        std::unique_lock<std::mutex> lock(mutex_);
        if (wait_running(cv_, lock, timeout_duration(seconds), [this] { return done_; })) return;
        if (say) say();
        // _exit skips stdio's buffers: what the process printed (a pipe's stdout is fully
        // buffered) would be lost with it.
        std::fflush(stdout);
        std::fflush(stderr);
        _exit(code);
      });
    } catch (const std::system_error&) {
      // No thread: started() says so.
    }
  }
  ~Watchdog() { done(); }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  bool started() const { return thread_.joinable(); }
  void done() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace dpt
