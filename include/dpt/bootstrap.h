// Process start-up for every dptrain program: MPI_Init_thread (MPI_THREAD_MULTIPLE, which the
// reducer's communication thread needs), world rank/size, local rank on this host, and the rank
// prefix for messages. Ends MPI on destruction; abort_job() ends every rank after an error.
#pragma once

#include <string>

namespace dpt {

struct WorldInfo {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  std::string host;
};

class MpiSession {
 public:
  // init_seconds > 0 bounds MPI_Init: Open MPI's waits (a PMIx fence) for every rank of the job
  // without limit, so a rank stopped before it, or one a launcher never started, held every other
  // rank there for ever. Past init_seconds this rank says so and exits 3 (dptrain passes its
  // --timeout, read ahead of the flags: early_timeout in config.h).
  MpiSession(int* argc, char*** argv, double init_seconds = 0);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  const WorldInfo& world() const { return world_; }
  // Whether MPI granted MPI_THREAD_MULTIPLE (needed to all-reduce from a second thread).
  bool thread_multiple() const { return thread_multiple_; }
  // Bounds the MPI_Finalize of the destructor: Open MPI's waits for every rank (a PMIx fence)
  // without limit, so a rank stopped or a host cut off after the run's last collective held every
  // other rank there for ever, whatever --timeout said. Past `seconds` (<= 0: no bound) this rank
  // says so and ends itself with `code`, the exit code it was about to return.
  void bound_finalize(double seconds, int code) {
    finalize_seconds_ = seconds;
    exit_code_ = code;
  }

 private:
  WorldInfo world_;
  bool thread_multiple_ = false;
  double finalize_seconds_ = 0;
  int exit_code_ = 0;
};

// Before MPI starts: why a singleton (dptrain run without mpirun or srun) cannot start, else "".
// Open MPI's singleton starts its own daemon, which makes its session directory in the first of
// TMPDIR, TEMP and TMP that is set (OMPI_MCA_orte_tmpdir_base wins over them), creating what is
// missing of the path: one that cannot be made (under a file, or a directory this user cannot
// write), or a file system with less than about 9 MiB free (PMIx's store), failed inside MPI_Init
// with pages of Open MPI's text, naming "Permission denied" for a directory that does not exist,
// and exit 1.
std::string singleton_tmpdir_problem();

// Before MPI starts, for a singleton: Open MPI 4's daemon for it chose the rsh launcher, which
// looks for ssh or rsh on PATH although it launches nothing; without them (PATH unset, as under
// `env -i` or a program's own environment, or a PATH of other tools) MPI_Init failed with pages of
// text and exit 1. Sets OMPI_MCA_plm=isolated (the launcher for one host) unless it is set.
void prepare_singleton_launcher();

// Prints nothing (flushes stdout and stderr); calls MPI_Abort(MPI_COMM_WORLD, code) so no peer
// waits forever, and ends this process with `code` itself if MPI_Abort has not within 5 s.
[[noreturn]] void abort_job(int code);

// Ends this process with `code` at once, and the job with it (abort_job where MPI runs with other
// ranks; the launcher ends the job of a rank that leaves during MPI_Init), after saying `why`: rank
// 0's log line, another rank's warning, or a line on stderr naming the launcher's rank while MPI
// starts. Callable from any thread, at any time: a stop signal during the start-up
// (src/train/signals.h).
[[noreturn]] void end_job_now(int code, const std::string& why);

// The rank the launcher gave this process, for use before MPI knows it: Open MPI's, PMIx's, PMI's
// or Slurm's variable (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK, SLURM_PROCID), else "?".
std::string launcher_rank();

// Why this process is a job of one rank although it runs in a Slurm allocation of several tasks
// (SLURM_JOB_ID, SLURM_NTASKS > 1), started there by hand rather than by srun or mpirun (no
// SLURM_STEP_ID, OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_RANK), and how to start it as the
// allocation's ranks; "" otherwise (srun's and mpirun's ranks, a run outside Slurm).
std::string alone_in_slurm_allocation();

// The MPI library's own version line (MPI_Get_library_version, callable before MPI starts), e.g.
// "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022".
std::string mpi_library_version();

}  // namespace dpt
