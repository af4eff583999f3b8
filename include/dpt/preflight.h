// The pre-flight: every check that can refuse a run, made before the first step and agreed by
// every rank, so that no rank waits in a collective for one that gave up and nothing is found
// wrong hours into a run. One entry point, run_preflight; its pieces are public for the tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dpt/augment.h"
#include "dpt/checkpoint.h"
#include "dpt/clock.h"
#include "dpt/comm.h"
#include "dpt/config.h"
#include "dpt/dataset.h"
#include "dpt/device.h"
#include "dpt/error.h"
#include "dpt/files.h"
#include "dpt/models.h"
#include "dpt/nn.h"

namespace dpt {

// Runs fn and makes every rank agree on its input errors: when fn throws an input error on any
// rank, every rank throws AgreedInputError (exit 2, no MPI_Abort), the failing ranks with their
// message and the others quietly with `elsewhere`. Other errors propagate (and end the job
// through main's abort). `work` says what fn does ("reading --data DIR"), for the timeout's
// message. A rank may still be doing that work when this one is done with it: reading the data
// from a slower disk, or a cold cache. The agreement waits for it --timeout and as long again as
// fn took here (at least a second of it: a grace, named in the message), so the skew of work
// that takes longer than --timeout is not taken for a dead rank; a rank that is gone is still
// found out within --timeout plus that time.
template <typename F>
void agree_on_input(Communicator& comm, const std::string& elsewhere, const std::string& work,
                    F&& fn) {
  const double start = now_seconds();
  std::string error;
  try {
    fn();
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kInput) throw;
    error = e.what();
  }
  const double took = std::round((now_seconds() - start) * 10) / 10;  // 0.1 s, for the message
  int32_t failed = error.empty() ? 0 : 1;
  {
    GraceScope grace(comm, took >= 1 ? took : 0,
                     "the time this rank took " + work + ", which another rank may still be doing");
    comm.allreduce(&failed, 1, ReduceOp::kSum,
                   "the ranks' agreement after " + work + " (an all-reduce)");
  }
  if (failed) throw AgreedInputError(error.empty() ? elsewhere : error, error.empty());
}
template <typename F>
void agree_on_input(Communicator& comm, const std::string& elsewhere, F&& fn) {
  agree_on_input(comm, elsewhere, "its checks", std::forward<F>(fn));
}

// What a run starts from once every check passed.
struct Preflight {
  std::vector<std::string> hosts;  // every rank's host, in rank order
  int local_rank = 0;              // this rank's position among the ranks on its host
  int ranks_here = 1;              // ranks on this host
  // On some host the ranks outnumber the cores they may run on (the union of their affinity
  // masks; the same on every rank, from the all-gathered masks): they take turns, and their step
  // times tell nothing of the hosts.
  bool ranks_outnumber_cores = false;
  std::unique_ptr<ComputeDevice> device;
  std::string data_format;  // the format read (--data-format, or the one detected)
  ImageSet train, test;
  Normalization normalize;          // --normalize resolved (auto: the training set's statistics)
  AugmentSpec augment;              // --augment, its crop padding sized to the images
  DType activations = DType::kF32;  // --activation-dtype resolved on the opened device
  std::vector<OutputLock> locks;    // rank 0's outputs, held until the run ends (check_outputs)
  // Rank 0's one look at the checkpoint directory (check_outputs), which the resume's activation
  // type, --resume auto's choice and claim all read: taken under --resume auto or checkpoints.
  CheckpointSurvey checkpoints;
  std::string train_digest, test_digest;  // data_digest of each set, compared across ranks
  Shape input_shape() const { return {train.rows, train.cols, train.channels}; }
};

// In order: the settings (agree_on_config, before any collective that depends on one), the device
// (--device auto on a mix of ranks gives the CPU), the data set's size from its headers against
// each host's memory (the ranks there each hold a copy), the data (read by every rank, in
// --data-format; --normalize, --augment and --model checked against its shape), the data digests
// (equal on every rank), rank 0's outputs locked (writable regular files or absent; --resume a
// regular file), the device opened (the CPU's refuses --precision bf16 without bf16 instructions)
// and its memory against the batch. Any failure: AgreedInputError on every rank.
Preflight run_preflight(const TrainConfig& cfg, Communicator& comm);

// What the data made of the run, for checkpoints and --save: data_format, augment, normalize,
// the data digests (data_digest_train, data_digest_test) and, with normalisation, normalize_mean
// and normalize_std ("M1,..,Mc"). save_model adds input_shape.
std::map<std::string, std::string> input_metadata(const Preflight& pf);
// The data digests' names: `flag` as messages name one (the ranks' comparison, a resume's), `key`
// as checkpoints record it; the training set's, then the test set's.
struct DataDigestName {
  const char* flag;
  const char* key;
};
inline constexpr DataDigestName kDataDigests[] = {{"--data (training set)", "data_digest_train"},
                                                  {"--data (test set)", "data_digest_test"}};
// Each name of kDataDigests with its digest in `pf`.
struct DataDigest {
  DataDigestName name;
  std::string digest;
};
std::vector<DataDigest> data_digests(const Preflight& pf);
// The count of lower ranks with the same host name (ranks are numbered host by host or not).
int local_rank_of(const std::vector<std::string>& hosts, int rank);

// ---- the cores: what the ranks may run on, not what the host has ----
// The CPUs this process may run on, sorted: its affinity mask (sched_getaffinity), which taskset,
// a container's cpuset (docker --cpuset-cpus), Slurm's cgroup and mpirun's binding narrow; every
// online CPU where the kernel does not say.
std::vector<int> usable_cpus();
// CPU ids in the kernel's list form ("0-3,8", as taskset -c and /sys write them), and back ("" is
// no CPU). parse_cpu_list reads what cpu_list_text writes (internal error on other text: the lists
// travel between the ranks of one build).
std::string cpu_list_text(const std::vector<int>& cpus);
std::vector<int> parse_cpu_list(const std::string& text);
// The same list from a file, read strictly: sorted distinct ids, with at most one trailing newline
// ("" or "\n": no CPU); nullopt for any other text (an empty item, a space, a sign, a range
// backwards, an id of 2^18 or more), never a crash or an allocation the text's numbers size.
std::optional<std::vector<int>> read_cpu_list(std::string_view text);
// The CPUs this process could be allowed at most, where a container or batch system limits it
// (docker --cpuset-cpus, a cgroup's cpuset): sched_setaffinity can widen a mask up to the
// cpuset, never past it. cpuset_files: the files that may hold it, nearest first, from
// /proc/self/cgroup's text and the cgroup mount point (/sys/fs/cgroup): the v2 line ("0::/a/b")
// gives <root>/a/b/cpuset.cpus.effective then the same in each parent up to <root>; a v1 line
// naming cpuset ("3:cpuset:/a") gives <root>/<controllers>/a/cpuset.effective_cpus and
// cpuset.cpus, then up. The parents: a v2 cgroup without the cpuset controller has no file of its
// own, and a container's cgroup mount starts at its own cgroup though the line may name the full
// path. cpus_allowed_at_most: the first of those texts (nullopt: unreadable) that is a non-empty
// CPU list, counted (at most `online` where that is known); `online` where none is.
// cgroup_cpus_at_most: both over this process's files.
std::vector<std::string> cpuset_files(std::string_view proc_self_cgroup, const std::string& root);
long cpus_allowed_at_most(const std::vector<std::optional<std::string>>& cpusets, long online);
long cgroup_cpus_at_most(long online);
// Where one rank runs, as it tells the others (one all-gather of place_text, parse_place back):
// its host, the CPUs it may run on, and whether mpirun bound it (Open MPI sets
// OMPI_MCA_orte_bound_at_launch=1 in a rank it bound to cores).
struct RankPlace {
  std::string host;
  std::vector<int> cpus;
  bool bound_by_mpirun = false;
};
RankPlace this_place(const std::string& host);
std::string place_text(const RankPlace& place);
RankPlace parse_place(const std::string& text);
// One host's cores as its ranks' masks give them. mpirun binds each rank to one core by default,
// so one rank's mask is not the host's cores: the union of the masks of every rank on the host is.
struct HostCores {
  std::vector<int> cpus;              // the union of the masks of the ranks on the host
  std::vector<int> ranks;             // those ranks (world ranks, ascending)
  std::vector<int> own;               // each one's CPU count, in the order of `ranks`
  std::vector<bool> bound_by_mpirun;  // each one's, in the order of `ranks`
  long online = 0;                    // the host's online CPUs (0: unknown)
  long allowed = 0;                   // the most CPUs it could have (its cpuset; 0: unknown)
  bool ranks_outnumber_any = false;   // on some host (any), the ranks outnumber their union
};
// `rank`'s host, from every rank's place in rank order. Every rank computes the same
// ranks_outnumber_any from the same places, so it needs no further agreement.
HostCores host_cores(const std::vector<RankPlace>& places, int rank, long online, long allowed);
// The warning a host's first rank gives, or "" for none; the first that applies of: more ranks
// than cores (the launch's doing, whatever --threads); a rank bound to fewer cores than --threads
// where the host has the cores (mpirun binds each rank to one core by default), naming the fix;
// --threads x ranks more threads than the cores. Where `allowed` is fewer than `online` (a
// container's cpuset), the host is the cpuset's CPUs: the messages name them, not the online ones.
std::string cores_warning(const HostCores& hc, int threads);
// "images 60000 of 28x28x1, checksum 0x...": a data set as every rank must see it.
std::string data_digest(const ImageSet& set);
// Every rank compares every rank's agreed values (agreed_values), or its data digests; a
// difference ends them all with exit 2 naming the flag and the ranks (rank 0 prints it).
void agree_on_config(const TrainConfig& cfg, Communicator& comm);
void agree_on_data(const Preflight& pf, Communicator& comm);
// Rank 0's outputs (--metrics, --save, --report, --trace, --output, --checkpoint-path) absent or
// regular files it can write, in directories it can write, each its own file and held by no other
// run; --resume (not auto), --init-from and --load regular files. No output may be one of the
// run's inputs (same_file): --resume (a file, or under auto each checkpoint file it may pick),
// --init-from, --load, and `data_files` (the data set's, DataSize::files), except --checkpoint-path
// being the checkpoint resumed. Returns the outputs' locks (OutputLock), for the whole run. Under
// --resume auto or with checkpoints to write, it surveys the checkpoint directory (once, holding
// --checkpoint-path's lock where the run takes it) and hands that to `survey` when given.
std::vector<OutputLock> check_outputs(const TrainConfig& cfg,
                                      const std::vector<std::string>& data_files = {},
                                      CheckpointSurvey* survey = nullptr);
// Input error (naming --data, the largest file and both sizes) when `ranks_here` copies of the data
// set, as data_size sizes it, need more than `mem` (nothing when mem.bytes < 0: unknown).
void check_data_memory(const std::string& dir, const DataSize& size, int ranks_here,
                       const HostMemory& mem);
// Bytes one image costs in a training step and in evaluation, measured on a probe model whose
// activations are of type `activations`, built with `options` (its stem resolved for `input`).
std::pair<double, double> bytes_per_image(const std::string& model, int classes,
                                          const Shape& input = {28, 28, 1},
                                          DType activations = DType::kF32,
                                          const ModelOptions& options = {});
// What a model keeps whatever the batch, in bytes: 4 per parameter for its value, its gradient,
// each optimizer state (sgd: momentum; adamw: two moments) and the two copies of the weights in
// the kernels' layouts (oneDNN's forward and backward-data; the Linear's bf16 copy is smaller).
// An empty `optimizer` is inference (evaluate, predict): 4 per parameter for its value and one
// for oneDNN's forward copy. Built at `input` (the parameter count of LeNet's classifier depends
// on it).
double model_fixed_bytes(const std::string& model, int classes, const Shape& input,
                         const std::string& optimizer, const ModelOptions& options = {});
// Input error when the batch needs more than `mem` can give (see DeviceMemory), with activations
// of type `activations` (default: --activation-dtype as on a device without fast bf16 ones).
// Training (cfg.command "train") counts a step of --batch-size and, unless --eval-every 0, an
// evaluation batch; evaluate and predict count only a batch of --eval-batch-size and the model's
// inference bytes, and name --eval-batch-size. `unread_data_bytes`: what each rank's data set will
// take of the memory measured in `mem`, when checked before the data is read.
void check_memory(const TrainConfig& cfg, int world, int classes, int64_t test_n,
                  const DeviceMemory& mem, const Shape& input = {28, 28, 1},
                  std::optional<DType> activations = std::nullopt, double unread_data_bytes = 0);

}  // namespace dpt
