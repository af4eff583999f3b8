// The MPI Communicator and the process bootstrap. Waits poll MPI_Test with short sleeps instead of
// MPI_Wait: a sleeping waiter leaves the core to the compute thread (2 ranks x 2 threads share 2
// cores here), and polling is what lets every wait end with a clear error after --timeout.
#include <mpi.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

#include "comm/mpi_check.h"
#include "dpt/bootstrap.h"
#include "dpt/comm.h"
#include "dpt/half.h"
#include "dpt/log.h"
#include "dpt/poll.h"
#include "dpt/text.h"
#include "dpt/watchdog.h"

namespace dpt {

namespace {

MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kF64:
      return MPI_DOUBLE;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kI64:
      return MPI_INT64_T;
    case DType::kU64:
      return MPI_UINT64_T;
    case DType::kU8:
      return MPI_UINT8_T;
    case DType::kBF16:
    case DType::kF16:
      return MPI_UINT16_T;  // bit patterns, summed by the operations below
  }
  return MPI_DATATYPE_NULL;
}

// The sum of 16-bit floats as an MPI operation: each pair added in float, the result rounded back
// (MPI has no bfloat16, and MPI_SUM on their bit patterns would add integers).
template <uint16_t (*To)(float), float (*From)(uint16_t)>
void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = To(From(a[i]) + From(b[i]));
}

MPI_Op sum16_op(DType dt) {
  // Created once, after MPI_Init (the first 16-bit reduction comes long after), on whichever
  // thread asks first; MPI frees them at MPI_Finalize.
  static MPI_Op bf16 = MPI_OP_NULL, f16 = MPI_OP_NULL;
  static std::once_flag once;
  std::call_once(once, [] {
    MPI_CHECK(MPI_Op_create(&sum16<bf16_from_float, float_from_bf16>, 1, &bf16));
    MPI_CHECK(MPI_Op_create(&sum16<f16_from_float, float_from_f16>, 1, &f16));
  });
  return dt == DType::kBF16 ? bf16 : f16;
}

MPI_Op mpi_op(ReduceOp op, DType dt) {
  if (dt == DType::kBF16 || dt == DType::kF16) {
    DPT_CHECK(op == ReduceOp::kSum, "16-bit floats are only summed");
    return sum16_op(dt);
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return MPI_SUM;  // kAvg divides after completion
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  return MPI_OP_NULL;
}

void divide(void* data, int64_t count, DType dt, int n) {
  if (dt == DType::kF32) {
    float* p = static_cast<float*>(data);
    const float inv = 1.f / static_cast<float>(n);
    for (int64_t i = 0; i < count; ++i) p[i] *= inv;
  } else if (dt == DType::kF64) {
    double* p = static_cast<double*>(data);
    for (int64_t i = 0; i < count; ++i) p[i] /= n;
  } else {
    throw Error(ErrorKind::kInternal, "ReduceOp::kAvg needs a floating-point type");
  }
}

// Polls `done` until it returns true (poll_with_deadline: a short spin first, since small
// collectives finish in microseconds, then 20 us pauses); after `timeout` s throws an error naming
// the operation, this rank, and what `diagnose` found out about the others.
template <typename Poll>
void poll_until(Poll done, const WaitBound& bound, const std::string& what, int rank,
                const std::function<std::string()>& diagnose) {
  poll_with_deadline(
      bound.seconds(), done,
      [&] {
        throw Error(
            ErrorKind::kInternal,
            timeout_message(
                what, bound, rank,
                ": " + (diagnose ? diagnose()
                                 : std::string("a peer rank is stopped, dead or far behind"))));
      },
      PollPause{std::chrono::microseconds(20), std::chrono::microseconds(20), 64});
}

class MpiRequest : public Request {
 public:
  MpiRequest(MPI_Request req, std::string what, WaitBound bound, int rank,
             std::function<std::string()> diagnose)
      : req_(req),
        what_(std::move(what)),
        bound_(std::move(bound)),
        rank_(rank),
        diagnose_(std::move(diagnose)) {}
  // A request still pending here belongs to a job that is failing (its waiter threw): it is left
  // alone, since waiting could hang on a dead peer and MPI forbids freeing an active collective.
  ~MpiRequest() override = default;
  bool test() override {
    if (done_) return true;
    int flag = 0;
    MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
    if (flag) finish();
    return done_;
  }
  void wait() override {
    poll_until([this] { return test(); }, bound_, what_, rank_, diagnose_);
  }
  std::function<void()> on_complete;

 private:
  void finish() {
    done_ = true;
    if (on_complete) on_complete();
  }
  MPI_Request req_;
  std::string what_;
  WaitBound bound_;
  int rank_;
  std::function<std::string()> diagnose_;
  bool done_ = false;
};

class MpiCommunicator : public Communicator {
 public:
  // `timeout`: the communicator's --timeout, which also bounds its own set-up (below).
  MpiCommunicator(MPI_Comm parent, double timeout) : timeout_(timeout) {
    // The set-up's calls block in MPI (two duplicates and an all-gather, collective over every
    // rank), where no polled request reaches them: a rank stopped or cut off just before them (just
    // after MPI_Init, when main makes its communicator) held every other rank there for ever,
    // whatever --timeout said. A watchdog bounds them as MPI_Init's does.
    Watchdog watch(timeout, static_cast<int>(ErrorKind::kInternal), [timeout] {
      log_error(DPT_MSG("the set-up of a communicator (MPI_Comm_dup and an all-gather of the host "
                        << "names, over every rank) did not complete within --timeout " << timeout
                        << " s: another rank has not reached it (stopped, dead or unreachable); "
                        << "ending this rank with exit code 3 (--timeout 0 waits without limit)"));
    });
    MPI_CHECK(MPI_Comm_dup(parent, &comm_));
    MPI_CHECK(MPI_Comm_dup(parent, &health_));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    MPI_CHECK(MPI_Get_processor_name(name, &len));
    host_.assign(name, static_cast<size_t>(len));
    // Every rank's host, gathered now while every peer can answer: a timeout's message names the
    // host of a silent rank, since a whole host going quiet (its link down) is the usual cause.
    std::vector<char> all(static_cast<size_t>(size_) * MPI_MAX_PROCESSOR_NAME);
    MPI_CHECK(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(),
                            MPI_MAX_PROCESSOR_NAME, MPI_CHAR, health_));
    for (int r = 0; r < size_; ++r)
      hosts_.emplace_back(&all[static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME]);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      MPI_Comm_free(&comm_);
      MPI_Comm_free(&health_);
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& host() const override { return host_; }
  std::unique_ptr<Communicator> duplicate() const override {
    return std::make_unique<MpiCommunicator>(comm_, timeout_);
  }
  void set_timeout(double seconds) override { timeout_ = seconds; }
  double timeout() const override { return timeout_; }

  std::unique_ptr<Request> iallreduce_raw(void* data, int64_t count, DType dt, ReduceOp op,
                                          const std::string& what) override {
    ++seq_;
    MPI_Request req;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, checked_count(count), mpi_type(dt), mpi_op(op, dt),
                             comm_, &req));
    auto r = make_request(req, what);
    if (op == ReduceOp::kAvg) {
      const int n = size_;
      r->on_complete = [data, count, dt, n] { divide(data, count, dt, n); };
    }
    return r;
  }
  void broadcast_raw(void* data, int64_t count, DType dt, int root,
                     const std::string& what) override {
    ++seq_;
    MPI_Request req;
    MPI_CHECK(MPI_Ibcast(data, checked_count(count), mpi_type(dt), root, comm_, &req));
    make_request(req, what)->wait();
  }
  void allgather_raw(const void* send, void* recv, int64_t count, DType dt) override {
    ++seq_;
    MPI_Request req;
    MPI_CHECK(MPI_Iallgather(send, checked_count(count), mpi_type(dt), recv, checked_count(count),
                             mpi_type(dt), comm_, &req));
    make_request(req, "allgather")->wait();
  }
  void barrier(const std::string& what) override {
    ++seq_;
    MPI_Request req;
    MPI_CHECK(MPI_Ibarrier(comm_, &req));
    make_request(req, what)->wait();
  }

  void allreduce_unbounded_raw(void* data, int64_t count, DType dt, ReduceOp op) override {
    ++seq_;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, checked_count(count), mpi_type(dt), mpi_op(op, dt),
                            comm_));
    if (op == ReduceOp::kAvg) divide(data, count, dt, size_);
  }

  // After a timeout: every rank that is still alive sends its collective sequence number to every
  // other on a separate communicator, and listens for 2 s. Who does not answer is stopped, dead or
  // cut off (named with its host); who answers with a smaller number is behind. Sends are left
  // pending on purpose: the job is about to be aborted, and waiting for them could hang on the very
  // rank that is gone.
  std::string diagnose() override {
    std::vector<int64_t> theirs(static_cast<size_t>(size_) * 2, -1);
    int64_t mine[2] = {rank_, seq_};
    std::vector<MPI_Request> recvs;
    std::vector<int> from;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Request sreq;
      MPI_Isend(mine, 2, MPI_INT64_T, r, kHealthTag, health_, &sreq);
      MPI_Request rreq;
      MPI_Irecv(&theirs[static_cast<size_t>(2 * r)], 2, MPI_INT64_T, r, kHealthTag, health_, &rreq);
      recvs.push_back(rreq);
      from.push_back(r);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    std::vector<bool> got(recvs.size(), false);
    while (std::chrono::steady_clock::now() < deadline) {
      bool all = true;
      for (size_t i = 0; i < recvs.size(); ++i) {
        if (got[i]) continue;
        int flag = 0;
        MPI_Test(&recvs[i], &flag, MPI_STATUS_IGNORE);
        got[i] = flag != 0;
        all = all && got[i];
      }
      if (all) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::string silent, behind, silent_hosts;
    std::vector<std::string> named;  // the silent ranks' hosts, each once
    for (size_t i = 0; i < recvs.size(); ++i) {
      const int r = from[i];
      if (!got[i]) {
        silent += (silent.empty() ? "" : ", ") + std::to_string(r);
        const std::string& h = hosts_[static_cast<size_t>(r)];
        if (std::find(named.begin(), named.end(), h) != named.end()) continue;
        named.push_back(h);
        silent_hosts += (silent_hosts.empty() ? "" : ", ") + h;
      } else if (theirs[static_cast<size_t>(2 * r + 1)] < seq_)
        behind += (behind.empty() ? "" : ", ") + std::to_string(r) + " (at collective #" +
                  std::to_string(theirs[static_cast<size_t>(2 * r + 1)]) + ")";
    }
    std::string out;
    if (!silent.empty())
      out += "rank(s) " + silent +
             " did not answer within 2 s (stopped, dead, unreachable, or busy outside MPI; on "
             "host(s) " +
             silent_hosts + ")";
    if (!behind.empty())
      out += std::string(out.empty() ? "" : "; ") + "rank(s) " + behind +
             " behind this rank (at collective #" + std::to_string(seq_) + ")";
    if (out.empty())
      out =
          "every rank answered and none is behind: a collective is mismatched or the network is "
          "stalled";
    return out;
  }

 private:
  static constexpr int kHealthTag = 7301;
  std::unique_ptr<MpiRequest> make_request(MPI_Request req, const std::string& what) {
    return std::make_unique<MpiRequest>(req, what, bound(), rank_, [this] { return diagnose(); });
  }
  static int checked_count(int64_t count) {
    DPT_CHECK(count >= 0 && count <= INT32_MAX, "collective count " << count << " out of range");
    return static_cast<int>(count);
  }
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm health_ = MPI_COMM_NULL;  // only for the timeout diagnosis
  int64_t seq_ = 0;                  // collectives issued on comm_ so far
  int rank_ = 0, size_ = 1;
  std::string host_;
  std::vector<std::string> hosts_;  // every rank's host, by rank in comm_
  double timeout_;
};

}  // namespace

uint64_t checksum(const void* data, size_t bytes, uint64_t h) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 1099511628211ULL;
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

std::vector<std::string> allgather_text(Communicator& comm, const std::string& mine) {
  const auto lens = comm.allgather(static_cast<int64_t>(mine.size()));
  const int64_t width = std::max<int64_t>(1, *std::max_element(lens.begin(), lens.end()));
  std::vector<uint8_t> one(static_cast<size_t>(width), 0),
      all(static_cast<size_t>(width * comm.size()));
  std::copy(mine.begin(), mine.end(), one.begin());
  comm.allgather(one.data(), all.data(), width);
  std::vector<std::string> out;
  for (int r = 0; r < comm.size(); ++r)
    out.emplace_back(reinterpret_cast<const char*>(all.data()) + r * width,
                     static_cast<size_t>(lens[static_cast<size_t>(r)]));
  return out;
}

std::unique_ptr<Communicator> make_mpi_communicator(double timeout) {
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, timeout);
}

std::unique_ptr<Communicator> make_mpi_self_communicator() {
  return std::make_unique<MpiCommunicator>(MPI_COMM_SELF, 0);
}

// ---- bootstrap ---------------------------------------------------------------------------------

namespace {

// Under mpirun or srun: the launcher's daemon made the session directory and launches the ranks.
bool launched() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(var)) return true;
  return false;
}

}  // namespace

void prepare_singleton_launcher() {
#if defined(OPEN_MPI) && OMPI_MAJOR_VERSION < 5  // Open MPI 5's PRRTE has no such component
  if (!launched()) ::setenv("OMPI_MCA_plm", "isolated", 0);
#endif
}

std::string singleton_tmpdir_problem() {
  if (launched()) return "";
  if (std::getenv("OMPI_MCA_orte_tmpdir_base")) return "";
  for (const char* var : {"TMPDIR", "TEMP", "TMP"}) {
    const char* value = std::getenv(var);
    if (!value) continue;
    // Open MPI creates what is missing of the path (as mkdir -p does): the nearest part that
    // exists decides. "" is taken as "/" (Open MPI puts it before "/ompi.<host>...").
    std::filesystem::path dir = *value ? value : "/";
    // A symbolic link to nothing cannot be made into a directory: Open MPI failed with "File
    // exists" and exit 1.
    struct stat st {};
    int rc = 0;
    bool dangling = false;
    while ((rc = ::stat(dir.c_str(), &st)) != 0 && errno == ENOENT && dir.has_relative_path()) {
      if (::lstat(dir.c_str(), &st) == 0) {
        dangling = true;
        break;
      }
      dir = dir.parent_path().empty() ? std::filesystem::path(".") : dir.parent_path();
    }
    std::string why;
    if (dangling) {
      std::error_code ec;
      why = dir.string() + " is a symbolic link to " +
            std::filesystem::read_symlink(dir, ec).string() + ", which does not exist";
    } else if (rc != 0)
      why = std::strerror(errno);
    else if (!S_ISDIR(st.st_mode))
      why = dir.string() + " is not a directory";
    else if (::access(dir.c_str(), W_OK | X_OK) != 0)
      why = dir.string() + " is not writable";
    // PMIx's shared-memory store, in the session directory, takes about 9 MiB: a file system with
    // 8 MiB free failed inside MPI_Init ("PMIX ERROR: OUT-OF-RESOURCE") with exit 1. The same
    // figure as launch/mpirun.sh's session_kib (tests/cli/test_launcher.sh checks they agree).
    constexpr unsigned long long kSessionKiB = 9216;
    struct statvfs fs {};
    if (why.empty() && ::statvfs(dir.c_str(), &fs) == 0) {
      const unsigned long long free_kib =
          static_cast<unsigned long long>(fs.f_bavail) * fs.f_frsize / 1024;
      if (free_kib < kSessionKiB)
        why = DPT_MSG("its file system has " << free_kib
                                             << " KiB free, and the session directory needs about "
                                             << kSessionKiB / 1024 << " MiB");
    }
    if (why.empty()) return "";
    return DPT_MSG(var << "=" << printable(value, PATH_MAX) << ": " << why
                       << ": without mpirun, Open MPI makes its session directory there; unset "
                       << var << " or point it at a directory you can write, with room");
  }
  return "";
}

std::string launcher_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* r = std::getenv(v); r && *r) return r;
  return "?";
}

namespace {
const char* env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// The number of processes the launcher started, from its environment; "" without one (dptrain run
// alone: a singleton). SLURM_NTASKS is the allocation's, in every process of it: it counts the
// ranks only in a step srun started (SLURM_STEP_ID), not in a salloc shell or a batch script.
std::string launcher_size() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"})
    if (const char* n = std::getenv(v); n && *n) return n;
  if (*env_or_empty("SLURM_STEP_ID")) return env_or_empty("SLURM_NTASKS");
  return "";
}
}  // namespace

std::string alone_in_slurm_allocation() {
  // srun sets SLURM_STEP_ID in every task it starts (and PMIX_RANK with --mpi=pmix), mpirun
  // OMPI_COMM_WORLD_SIZE; a salloc shell and a batch script have SLURM_JOB_ID and the allocation's
  // SLURM_NTASKS only. A process started there by hand is an MPI singleton: a job of its own.
  const std::string job = env_or_empty("SLURM_JOB_ID"), tasks = env_or_empty("SLURM_NTASKS");
  const std::optional<long> n = read_number<long>(tasks);
  if (job.empty() || !n || *n < 2 || *env_or_empty("SLURM_STEP_ID") ||
      *env_or_empty("OMPI_COMM_WORLD_SIZE") || *env_or_empty("PMIX_RANK") ||
      *env_or_empty("PMI_RANK"))
    return "";
  return DPT_MSG("this process was started inside Slurm job "
                 << printable(job) << ", an allocation of " << *n
                 << " tasks (SLURM_NTASKS), but not by srun (no SLURM_STEP_ID) nor by mpirun, so "
                 << "it runs alone, a job of one rank, and the allocation's other tasks idle; to "
                 << "run them as ranks, start it with srun --mpi=pmix build/dptrain ..., submit "
                 << "sbatch launch/slurm/dptrain.sbatch ..., or run launch/mpirun.sh -np " << *n
                 << " build/dptrain ...");
}

MpiSession::MpiSession(int* argc, char*** argv, double init_seconds) {
  int provided = 0;
  // Before MPI_Init no rank prefix is set: the message names the launcher's rank and the host. A
  // job of one process has no other rank to wait for: there the time ran out in MPI's own start-up
  // (--timeout 0.001 was blamed on "another rank of the job", which does not exist).
  // Read before MPI_Init, which puts its own variables (OMPI_COMM_WORLD_SIZE, PMIX_RANK) into a
  // singleton's environment.
  const std::string alone = alone_in_slurm_allocation();
  Watchdog watch(init_seconds, static_cast<int>(ErrorKind::kInternal), [init_seconds, alone] {
    char host[256] = "?";
    gethostname(host, sizeof(host) - 1);
    const std::string size = launcher_size();
    if (size.empty() || size == "1")
      std::fprintf(stderr,
                   "[rank %s@%s] error: MPI_Init did not complete within --timeout %g s in a job "
                   "of one process, which has no other rank to wait for: MPI's own start-up took "
                   "longer than that; give a longer --timeout (0 waits without limit)%s%s; ending "
                   "with exit code 3\n",
                   launcher_rank().c_str(), host, init_seconds, alone.empty() ? "" : ". And ",
                   alone.c_str());
    else
      std::fprintf(stderr,
                   "[rank %s@%s] error: MPI_Init did not complete within --timeout %g "
                   "s: another rank of the job has not reached it (stopped or killed before it, "
                   "its host unreachable, or never started by the launcher); ending this rank "
                   "with exit code 3 (--timeout 0 waits without limit)\n",
                   launcher_rank().c_str(), host, init_seconds);
  });
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  watch.done();
  // Errors come back as codes (checked by MPI_CHECK) instead of aborting inside MPI.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_.rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_.size));
  // The split is collective over every rank and blocks in MPI: a rank stopped just after MPI_Init
  // held every other rank here for ever. Bounded as MPI_Init is.
  Watchdog split_watch(init_seconds, static_cast<int>(ErrorKind::kInternal), [init_seconds, this] {
    char host[256] = "?";
    gethostname(host, sizeof(host) - 1);
    std::fprintf(stderr,
                 "[rank %d@%s] error: the ranks' first collective after MPI_Init (grouping them by "
                 "host) did not complete within --timeout %g s: another rank has not reached it "
                 "(stopped or killed just after MPI_Init, or its host unreachable); ending this "
                 "rank with exit code 3 (--timeout 0 waits without limit)\n",
                 world_.rank, host, init_seconds);
  });
  MPI_Comm local;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_.rank, MPI_INFO_NULL,
                                &local));
  split_watch.done();
  MPI_CHECK(MPI_Comm_rank(local, &world_.local_rank));
  MPI_CHECK(MPI_Comm_size(local, &world_.local_size));
  MPI_Comm_free(&local);
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_CHECK(MPI_Get_processor_name(name, &len));
  world_.host.assign(name, static_cast<size_t>(len));
  set_rank_prefix("[rank " + std::to_string(world_.rank) + "@" + world_.host + "] ");
  set_log_rank(world_.rank);
  // Trained alone without a word before: the user asked Slurm for several ranks.
  if (world_.size == 1 && !alone.empty()) log_warn(alone);
  if (provided < MPI_THREAD_MULTIPLE)
    log_warn("MPI provides thread level " + std::to_string(provided) +
             " < MPI_THREAD_MULTIPLE: overlap of communication is disabled");
  thread_multiple_ = provided >= MPI_THREAD_MULTIPLE;
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // Every collective of the run is bounded by --timeout; MPI_Finalize is not (Open MPI fences every
  // rank in it), so a peer SIGSTOPped, or its host's link cut, after the last collective kept this
  // rank, and the launcher waiting for it, there for ever (tests/cli/test_failures.sh). A watchdog
  // ends the process with the run's own code once --timeout has passed: its outputs are written
  // by then, and mpirun or srun ends the job once a rank has gone.
  const double seconds = world_.size > 1 ? finalize_seconds_ : 0;
  const int code = exit_code_;
  Watchdog watch(seconds, code, [seconds, code] {
    log_error(DPT_MSG("MPI_Finalize did not complete within --timeout "
                      << seconds << " s: another rank is stopped, dead or unreachable after the "
                      << "run's last collective (what this rank wrote is complete); ending this "
                      << "rank with exit code " << code));
  });
  MPI_Finalize();
}

void abort_job(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  // MPI_Abort returns (and the process exits) only once this host's Open MPI daemon has answered,
  // and a daemon that does not (stuck, or waiting on mpirun across a link that is down) kept a
  // rank in MPI_Abort until the daemon came back (tests/multihost/test_partition.sh,
  // stalled-daemon). So a watchdog ends this process with the same code if MPI_Abort has not within
  // kAbortGraceSeconds; a reachable daemon answers well within that. The launcher
  // (launch/mpirun.sh) bounds mpirun itself. The thread inherits the blocked stop signals.
  static constexpr int kAbortGraceSeconds = 5;
  Watchdog watch(kAbortGraceSeconds, code, nullptr);
  if (!watch.started()) _exit(code);  // nothing to bound MPI_Abort: ending here beats waiting
  MPI_Abort(MPI_COMM_WORLD, code);
  _exit(code);
}

void end_job_now(int code, const std::string& why) {
  int up = 0, down = 0, size = 1, rank = 0;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  const bool running = up && !down;
  if (running) {
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0)
      log_info(why);
    else
      log_warn(why);
  } else {
    // No rank prefix yet (MPI_Init has not returned): the launcher's rank and the host, as the
    // MPI_Init watchdog names them.
    char host[256] = "?";
    gethostname(host, sizeof(host) - 1);
    std::fprintf(stderr, "[rank %s@%s] %s\n", launcher_rank().c_str(), host, why.c_str());
  }
  if (running && size > 1) abort_job(code);
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(code);
}

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  if (MPI_Get_library_version(text, &len) != MPI_SUCCESS) return "unknown";
  std::string v(text, static_cast<size_t>(std::max(0, len)));
  v = v.substr(0, v.find('\n'));  // Open MPI's is one line and a newline; others may say more
  while (!v.empty() && (v.back() == ' ' || v.back() == '\0' || v.back() == '\r')) v.pop_back();
  return v.empty() ? "unknown" : v;
}

}  // namespace dpt
