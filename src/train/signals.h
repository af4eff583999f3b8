// Stop signals (INT, TERM, HUP, USR1): taken by a watcher thread and turned into an agreed stop at
// the next step boundary (a checkpoint, then exit 128 + signal). Private to the driver.
#pragma once

#include <array>
#include <utility>

namespace dpt {

class Communicator;

// The signals that stop training at the next step boundary with a checkpoint: INT (a terminal),
// TERM (kill, timeout, scancel), HUP (a closed terminal) and USR1, which mpirun forwards to every
// rank on every host while it would answer TERM/INT itself by killing the ranks after 1 s:
// launch/mpirun.sh turns the signals it receives into USR1 for that reason, and the Slurm script
// asks for USR1 before the time limit.
// They are never delivered asynchronously to a thread that computes: a signal frame pushed onto a
// thread inside oneDNN's JIT sgemm corrupted the heap (2 of 6 ResNet-18 runs stopped under load
// crashed in free() inside dnnl_sgemm, in forward and backward alike). main blocks them before MPI
// starts any thread (block_stop_signals), so every thread inherits the mask, and one watcher
// thread takes them with sigwait. That thread is the process's own, started by main
// (watch_stop_signals) before MPI starts, so that a signal is taken from then on.
// During the start-up (MPI_Init, the pre-flight, the data read, --init-from's read), until
// hold() (before --resume's checkpoint is read: a signal there waits for the agreed stop), a
// stop signal ends the job at once with 128 + signal (end_job_now): nothing has been trained or
// written, so there is nothing to stop cleanly for, and the start-up may wait long (a data set
// read for minutes, a peer that never comes: up to --timeout, or for ever under --timeout 0). It
// was held until the first step boundary: SIGTERM to a rank waiting for a stopped peer went
// unanswered until --timeout ended the job with exit 3. From hold() (or the first agreed() or
// received()) on, a signal waits for the agreed stop. The handlers stay installed for a thread
// that did not inherit the mask (run_training called from elsewhere).
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  // The start-up is over: from here on a stop signal waits for the agreed stop (called before the
  // run writes its first output).
  void hold();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The signal any rank received (0: none) and whether `due` holds on any rank, agreed by every
  // rank in one all-reduce (the step boundary's only collective).
  std::pair<int, bool> agreed(Communicator& comm, bool due) const;
  // The signal this rank received (0: none), without asking the others: for a loop whose ranks
  // run different counts of iterations (evaluate's batches), which stops early and agrees after.
  int received() const;

 private:
  std::array<void (*)(int), 4> old_{};
};

}  // namespace dpt
