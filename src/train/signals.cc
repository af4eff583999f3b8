// Stop signals (src/train/signals.h): the process's watcher thread, the mask every thread
// inherits, the start-up's immediate end and the agreement on stopping at a step boundary.
#include "train/signals.h"

#include <signal.h>

#include <csignal>
#include <cstring>  // sigabbrev_np
#include <mutex>
#include <string>
#include <thread>

#include "dpt/bootstrap.h"
#include "dpt/comm.h"
#include "dpt/error.h"
#include "dpt/run.h"

namespace dpt {

namespace {

std::atomic<int> g_stop_signal{0};  // lock-free: also set from a signal handler
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }
constexpr std::array<int, 4> kStopSignals = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};
// Whether a signal the watcher takes waits for the agreed stop (a run's StopSignals, from hold()),
// or ends the job at once (the start-up). Also true after a run: a signal then is only recorded.
std::atomic<bool> g_held{false};

sigset_t stop_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  for (const int s : kStopSignals) sigaddset(&set, s);
  return set;
}

// A signal taken by the watcher.
void take(int sig) {
  if (g_held) {
    g_stop_signal = sig;
    return;
  }
  end_job_now(128 + sig,
              DPT_MSG("stopped by " << signal_name(sig) << " before anything was "
                                    << "written: the start-up has nothing to save, "
                                    << "so the job ends at once (exit " << 128 + sig << ")"));
}

}  // namespace

void watch_stop_signals() {
  static std::once_flag once;
  std::call_once(once, [] {
    block_stop_signals();  // this thread's mask is the watcher's, whoever called first
    // Detached: it waits for signals until the process ends, whatever run comes and goes.
    std::thread([] {
      const sigset_t set = stop_signal_set();
      for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) == 0) take(sig);
      }
    }).detach();
  });
}

StopSignals::StopSignals() {
  g_stop_signal = 0;
  g_held = false;
  for (size_t i = 0; i < kStopSignals.size(); ++i)
    old_[i] = std::signal(kStopSignals[i], on_stop_signal);
  block_stop_signals();
  watch_stop_signals();
}

StopSignals::~StopSignals() {
  g_held = true;
  for (size_t i = 0; i < kStopSignals.size(); ++i) std::signal(kStopSignals[i], old_[i]);
}

void StopSignals::hold() { g_held = true; }

std::pair<int, bool> StopSignals::agreed(Communicator& comm, bool due) const {
  g_held = true;
  int32_t v[2] = {g_stop_signal, due ? 1 : 0};
  if (comm.size() > 1)
    comm.allreduce(v, 2, ReduceOp::kMax,
                   "all-reduce between batches (the ranks' check for stop signals)");
  return {v[0], v[1] != 0};
}

int StopSignals::received() const {
  g_held = true;
  return g_stop_signal;
}

void block_stop_signals() {
  const sigset_t set = stop_signal_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

}  // namespace dpt
