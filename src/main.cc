// dptrain: parses flags, starts MPI, runs the command (training, or evaluate / predict of a saved
// model). Any error is printed once and ends every rank
// with a nonzero code (2 for bad input, 3 for failures) instead of leaving peers waiting.
#include <malloc.h>
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "dpt/bootstrap.h"
#include "dpt/comm.h"
#include "dpt/config.h"
#include "dpt/error.h"
#include "dpt/log.h"
#include "dpt/run.h"
#include "dpt/version.h"

namespace {

// --version's report and --help's text. A write that failed (stdout on a full disk) said nothing,
// exit 0, and left an empty file for a bug report. A reader that leaves early (`dptrain --help |
// head -1`, EPIPE: SIGPIPE is ignored) is no failure.
int print_to_stdout(const std::string& text, const char* flag) {
  errno = 0;
  if ((std::fputs(text.c_str(), stdout) >= 0 && std::fflush(stdout) == 0) || errno == EPIPE)
    return 0;
  std::fprintf(stderr, "dptrain: error: %s: cannot write to standard output: %s\n", flag,
               std::strerror(errno));
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  // Keep freed blocks in the heap: per-step buffers would otherwise be mmap'd and unmapped every
  // step, paying page faults and zeroing each time.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  // Before MPI starts its threads, so that they inherit the mask (see src/train/signals.h); the
  // watcher from here on, so that a stop signal while MPI starts, or a peer never comes, ends the
  // job instead of waiting for --timeout (or for ever under --timeout 0).
  dpt::block_stop_signals();
  dpt::watch_stop_signals();
  // A reader that goes away (`dptrain ... | head`) must not kill the run with SIGPIPE, losing its
  // checkpoints and --save: writes to the closed pipe fail with EPIPE instead, and the log writers
  // warn once and drop later lines (log.cc). Set before MPI starts, so that nothing it writes
  // during start-up can kill the process either.
  signal(SIGPIPE, SIG_IGN);
  // --version needs no MPI: it answers where MPI cannot start (a broken installation, a bad
  // TMPDIR), which is when a bug report needs it most. Under a launcher only its rank 0 prints.
  for (int i = 1; i < argc && std::string(argv[i]) != "--"; ++i)
    if (std::string(argv[i]) == "--version") {
      const std::string rank = dpt::launcher_rank();
      if (rank != "0" && rank != "?") return 0;
      // The report asks the CPU loops for their level, which reads DPT_ISA: a value there that
      // names none ended the process in std::terminate (exit 134) instead of saying so.
      std::string report;
      try {
        report = dpt::version_report();
      } catch (const dpt::Error& e) {
        std::fprintf(stderr, "dptrain: error: %s\n", e.what());
        return e.exit_code();
      }
      return print_to_stdout(report, "--version");
    }
  if (const std::string why = dpt::singleton_tmpdir_problem(); !why.empty()) {
    std::fprintf(stderr, "dptrain: error: %s\n", why.c_str());
    return 2;
  }
  dpt::prepare_singleton_launcher();
  const double early_timeout = dpt::early_timeout(argc, argv);
  dpt::MpiSession mpi(&argc, &argv, early_timeout);
  const int world = mpi.world().size, rank = mpi.world().rank;
  dpt::TrainConfig cfg;
  std::string help, flag_error;
  int flag_code = 0;
  try {
    if (dpt::parse_config(argc, argv, &cfg, &help)) dpt::validate_config(cfg, world);
  } catch (const dpt::Error& e) {
    flag_error = e.what();
    flag_code = e.exit_code();
  }
  const int code = [&]() -> int {
    try {
      // Bounded from the start (its set-up and the flags' all-reduce below): a rank stopped just
      // after MPI_Init held the others in them for ever, the run's --timeout not yet set.
      auto comm = dpt::make_mpi_communicator(early_timeout);
      // Flags may differ per rank (an MPMD line, a stale job script): a flag error or --help on any
      // rank ends every rank here, before the pre-flight's first collective, where the others would
      // wait for it for ever. The lowest such rank prints it (rank 0 when all were given the same).
      // The command is compared in the same all-reduce (its code and its negation): ranks running
      // different commands would issue different collectives and fail in MPI.
      const int32_t command = cfg.command == "evaluate" ? 1 : cfg.command == "predict" ? 2 : 0;
      int32_t first[4] = {flag_error.empty() ? world : rank, help.empty() ? world : rank, command,
                          -command};
      comm->allreduce(first, 4, dpt::ReduceOp::kMin, "all-reduce of the flag errors");
      if (first[0] < world) {
        // Under mpirun the "[rank r@host]" prefix names the rank whose flags are wrong.
        if (rank == first[0] && world > 1) dpt::log_error(flag_error);
        if (rank == first[0] && world == 1)
          std::fprintf(stderr, "dptrain: error: %s\n", flag_error.c_str());
        return flag_error.empty() ? 2 : flag_code;
      }
      if (first[1] < world) {
        return rank == first[1] ? print_to_stdout(help, "--help") : 0;
      }
      if (first[2] != -first[3]) {
        const auto commands = dpt::allgather_text(*comm, cfg.command);
        if (rank == 0) {
          std::string each;
          for (int r = 0; r < world && r < 8; ++r)
            each += (r ? ", " : "") + std::string("rank ") + std::to_string(r) + " " +
                    commands[static_cast<size_t>(r)];
          if (world > 8) each += ", ...";
          dpt::log_error("the ranks were started with different commands (" + each +
                         "): start every rank with the same one (dptrain, dptrain evaluate or "
                         "dptrain predict)");
        }
        return 2;
      }
      if (cfg.command == "evaluate")
        dpt::run_evaluate(cfg, *comm);
      else if (cfg.command == "predict")
        dpt::run_predict(cfg, *comm);
      else
        dpt::run_training(cfg, *comm);
    } catch (const dpt::AgreedInputError& e) {
      if (!e.quiet) dpt::log_error(e.what());
      return e.exit_code();
    } catch (const dpt::Stopped& s) {
      dpt::log_info("stopped by " + dpt::signal_name(s.signal) +
                    (s.step < 0 ? std::string(" before anything was written")
                                : " after global step " + std::to_string(s.step)) +
                    " (exit " + std::to_string(128 + s.signal) + ")");
      return 128 + s.signal;
    } catch (const dpt::Error& e) {
      dpt::log_error(e.what());
      if (world > 1) dpt::abort_job(e.exit_code());
      return e.exit_code();
    } catch (const std::exception& e) {
      dpt::log_error(std::string("unexpected failure: ") + e.what());
      if (world > 1) dpt::abort_job(3);
      return 3;
    }
    return 0;
  }();
  // MPI_Finalize, in mpi's destructor, waits for every rank: bounded by --timeout like every
  // collective (the default one when the flags were refused, whose --timeout may be the bad value).
  mpi.bound_finalize(flag_error.empty() ? cfg.timeout : dpt::TrainConfig{}.timeout, code);
  return code;
}
