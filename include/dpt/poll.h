// poll_with_deadline: the one polling loop behind every wait on a peer (the MPI communicator's
// requests; the NCCL communicator's set-up, a split, a collective's launch and its completion): a
// probe is called until it reports done, with a growing pause between calls, and a deadline
// (--timeout) after which on_timeout is called. Header-only and free of CUDA, so that it is
// unit-tested without a GPU (tests/unit/test_poll.cc).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

namespace dpt {

// The longest --timeout (validate_config refuses more; 0 means no limit): 1e7 s, 115 days, far
// beyond any collective's need, and far below the ~292 years at which a steady_clock deadline
// (int64 nanoseconds) overflows.
inline constexpr double kMaxTimeoutSeconds = 1e7;

// A --timeout in seconds as the steady clock's duration, for every wait bounded by it (a
// condition variable's wait_for, poll_with_deadline's deadline): clamped to [0,
// kMaxTimeoutSeconds], rounded up. Unclamped, 1e10 s is more nanoseconds than int64 holds: the
// deadline wrapped into the past and the first all-reduce "timed out" at once. Callers treat
// timeouts <= 0 as "no limit" before asking for a duration; here they (and NaN) read as 0.
inline std::chrono::steady_clock::duration timeout_duration(double seconds) {
  const double s = seconds > 0 ? std::min(seconds, kMaxTimeoutSeconds) : 0.0;
  return std::chrono::ceil<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

// The pause between two polls: `first` after the first unsuccessful poll, doubled after each
// further one up to `max`. A short first pause answers a quick operation quickly; the cap bounds
// how late a slow one is noticed; sleeping at all leaves the core to the threads doing the work
// (NCCL's set-up runs on its own thread, and a rank may have only one core).
struct PollPause {
  std::chrono::microseconds first{1000};
  std::chrono::microseconds max{10000};
  int spins = 0;  // probes before the first pause (and the first look at the clock)
};

// A gap between two looks at the clock longer than the pause slept by more than this is time the
// process did not run (stopped, or frozen with its machine): it does not count against the
// deadline.
inline constexpr std::chrono::seconds kNotRunningGap{1};

// A deadline that time this process spent stopped does not move closer. Time stopped (SIGSTOP,
// SIGTSTP: Ctrl-Z under mpirun, which forwards it to the ranks; Slurm's `scontrol suspend`; a
// debugger) is not waiting, but the steady clock counts it: a whole job suspended for longer than
// --timeout ended in exit 3 the moment it was continued, each rank's pending all-reduce "timed
// out" on its first look at the clock ("every rank answered and none is behind"). So the waiter
// tells passed() how long it meant to pause since its last look; a gap longer than that by
// kNotRunningGap or more moves the deadline by the gap. A peer that is stopped alone is still
// found out: this process keeps running, its looks come a pause apart, and its deadline stays.
// Shared by poll_with_deadline and wait_running.
class RunningDeadline {
 public:
  using clock = std::chrono::steady_clock;
  explicit RunningDeadline(clock::duration limit) : last_(clock::now()), deadline_(last_ + limit) {}
  // A look at the clock after pausing `paused` since the last one: whether the deadline has passed.
  bool passed(clock::duration paused) {
    const auto now = clock::now();
    if (const auto away = now - last_ - paused; away >= kNotRunningGap) deadline_ += away;
    last_ = now;
    return now >= deadline_;
  }
  // What is left of it at the last look (negative once passed).
  clock::duration left() const { return deadline_ - last_; }

 private:
  clock::time_point last_, deadline_;
};

// A condition-variable wait for pred() bounded by `limit` of running time (RunningDeadline): in
// slices of kWaitSlice, because one timed wait_for ends at once after SIGCONT (libstdc++ waits
// until an absolute steady-clock time, which ran on while the process was stopped). True when
// pred() holds. The CPU reducer's wait for its buckets and the MPI start-up and shut-down
// watchdog (dpt/watchdog.h) wait through it. A stop that overlaps a slice is counted for at most
// the slice, so the deadline can come that much early in running time.
inline constexpr std::chrono::milliseconds kWaitSlice{100};
template <class Pred>
bool wait_running(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                  RunningDeadline::clock::duration limit, Pred pred) {
  RunningDeadline deadline(limit);
  RunningDeadline::clock::duration waited{0};
  while (!deadline.passed(waited)) {
    waited = std::min<RunningDeadline::clock::duration>(kWaitSlice, deadline.left());
    if (cv.wait_for(lock, waited, pred)) return true;
  }
  return pred();
}

// Calls probe() until it returns true, then returns true. With timeout_s > 0: once the last probe
// said no and timeout_s seconds (timeout_duration's) or more have passed since the call, calls
// on_timeout() once and returns false, probing no more (on_timeout usually throws: the callers
// abort and report). timeout_s <= 0 waits for ever, as --timeout 0 means. The probe always runs at
// least once, so an operation already complete succeeds whatever the deadline. Time stopped does
// not count (RunningDeadline; the probes return at once: MPI_Test, cudaEventQuery, NCCL's state,
// so a gap between looks is never their work).
template <typename Probe, typename OnTimeout>
bool poll_with_deadline(double timeout_s, Probe&& probe, OnTimeout&& on_timeout,
                        PollPause pause = {}) {
  RunningDeadline deadline(timeout_duration(timeout_s));
  auto sleep = pause.first;
  RunningDeadline::clock::duration slept{0};  // slept since the last look at the clock
  int polls = 0;
  while (!probe()) {
    if (++polls <= pause.spins) continue;
    if (timeout_s > 0 && deadline.passed(slept)) {
      on_timeout();
      return false;
    }
    std::this_thread::sleep_for(sleep);
    slept = sleep;
    sleep = std::min(sleep * 2, pause.max);
  }
  return true;
}

// How long one collective may take: --timeout, and a grace beyond it with what it is for
// (agree_on_input: another rank may still be doing work this rank took that long to do).
struct WaitBound {
  double timeout = 0;  // --timeout, seconds (0: no bound at all)
  double grace = 0;    // seconds beyond it
  std::string why;     // what the grace is for, in the message
  double seconds() const { return timeout > 0 ? timeout + grace : 0; }
};

// The one message of a wait that ran past its bound (MPI, NCCL and the reducer alike):
// "<what> did not complete within --timeout <t> s[ + <g> s (<why>)] on rank <r><detail>".
inline std::string timeout_message(const std::string& what, const WaitBound& bound, int rank,
                                   const std::string& detail) {
  std::ostringstream os;
  os << what << " did not complete within --timeout " << bound.timeout << " s";
  if (bound.grace > 0) os << " + " << bound.grace << " s (" << bound.why << ")";
  os << " on rank " << rank << detail;
  return os.str();
}

}  // namespace dpt
