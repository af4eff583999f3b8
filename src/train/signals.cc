// Stop signals (src/train/signals.h): the watcher thread, the mask every thread inherits, and the
// agreement on stopping at a step boundary.
#include "train/signals.h"

#include <signal.h>

#include <csignal>
#include <cstring>  // sigabbrev_np
#include <string>

#include "dpt/comm.h"
#include "dpt/run.h"

namespace dpt {

namespace {

std::atomic<int> g_stop_signal{0};  // lock-free: also set from a signal handler
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }
constexpr std::array<int, 4> kStopSignals = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};

sigset_t stop_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  for (const int s : kStopSignals) sigaddset(&set, s);
  return set;
}

}  // namespace

StopSignals::StopSignals() {
  g_stop_signal = 0;
  for (size_t i = 0; i < kStopSignals.size(); ++i)
    old_[i] = std::signal(kStopSignals[i], on_stop_signal);
  block_stop_signals();
  watcher_ = std::thread([this] {
    const sigset_t set = stop_signal_set();
    const timespec poll{0, 100'000'000};  // how soon the watcher sees that training ended
    while (!done_) {
      const int sig = sigtimedwait(&set, nullptr, &poll);
      if (sig > 0) g_stop_signal = sig;
    }
  });
}

StopSignals::~StopSignals() {
  done_ = true;
  watcher_.join();
  for (size_t i = 0; i < kStopSignals.size(); ++i) std::signal(kStopSignals[i], old_[i]);
}

std::pair<int, bool> StopSignals::agreed(Communicator& comm, bool due) const {
  int32_t v[2] = {g_stop_signal, due ? 1 : 0};
  if (comm.size() > 1)
    comm.allreduce(v, 2, ReduceOp::kMax,
                   "all-reduce between batches (the ranks' check for stop signals)");
  return {v[0], v[1] != 0};
}

int StopSignals::received() const { return g_stop_signal; }

void block_stop_signals() {
  const sigset_t set = stop_signal_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

}  // namespace dpt
