// The pre-flight (include/dpt/preflight.h): the checks that can refuse a run, each agreed by every
// rank, in the order run_preflight makes them.
#include "dpt/preflight.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iomanip>
#include <map>
#include <new>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "dpt/checkpoint.h"
#include "dpt/clock.h"
#include "dpt/files.h"
#include "dpt/log.h"
#include "dpt/models.h"
#include "dpt/nn.h"
#include "dpt/text.h"
#include "dpt/version.h"

namespace dpt {

int local_rank_of(const std::vector<std::string>& hosts, int rank) {
  int local = 0;
  for (int r = 0; r < rank; ++r)
    if (hosts[static_cast<size_t>(r)] == hosts[static_cast<size_t>(rank)]) ++local;
  return local;
}

namespace {

// The most CPUs a mask or list is read for: larger than any kernel's NR_CPUS, and a bound on what
// a CPU list from a file can make this process allocate.
constexpr int kMaxCpus = 1 << 18;

// A small file's text (a /proc or /sys file: its first 64 KiB), nullopt where it cannot be read.
std::optional<std::string> small_file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string text(64 << 10, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return std::nullopt;
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

}  // namespace

std::vector<int> usable_cpus() {
  // glibc's cpu_set_t holds 1024 CPUs and the call fails (EINVAL) where the kernel's mask is
  // larger, so the mask grows until it fits.
  for (int n = 1024; n <= kMaxCpus; n *= 2) {
    cpu_set_t* set = CPU_ALLOC(n);
    if (!set) break;
    const size_t size = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(size, set);
    const bool ok = sched_getaffinity(0, size, set) == 0;
    const int err = errno;
    std::vector<int> cpus;
    for (int c = 0; ok && c < n; ++c)
      if (CPU_ISSET_S(c, size, set)) cpus.push_back(c);
    CPU_FREE(set);
    if (ok) return cpus;
    if (err != EINVAL) break;
  }
  std::vector<int> all(std::thread::hardware_concurrency());
  std::iota(all.begin(), all.end(), 0);
  return all;
}

std::string cpu_list_text(const std::vector<int>& cpus) {
  std::ostringstream os;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    os << (i ? "," : "") << cpus[i];
    if (j > i) os << "-" << cpus[j];
    i = j + 1;
  }
  return os.str();
}

std::optional<std::vector<int>> read_cpu_list(std::string_view text) {
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  // One CPU id: digits only (read_number, text.h: no '+' or space; a '-' is the range's), below
  // kMaxCpus, so "0-4294967295" is refused rather than counted out.
  const auto id = [](std::string_view digits, int* out) {
    const std::optional<int> v = read_number<int>(digits);
    *out = v.value_or(-1);
    return v && *out >= 0 && *out < kMaxCpus;
  };
  // An empty text (a cpuset of no CPUs) is no items, so no CPUs; an empty item is refused.
  std::vector<std::pair<int, int>> ranges;
  for (const std::string_view item : split_list(text, ',')) {
    const size_t dash = item.find('-');
    int first = -1, last = -1;
    const bool ok = dash == std::string_view::npos
                        ? id(item, &first) && id(item, &last)
                        : id(item.substr(0, dash), &first) && id(item.substr(dash + 1), &last);
    if (!ok || last < first) return std::nullopt;
    ranges.emplace_back(first, last);
  }
  // Each CPU once, however the items overlap: at most kMaxCpus ids, whatever the text repeats.
  std::sort(ranges.begin(), ranges.end());
  std::vector<int> cpus;
  for (const auto& [first, last] : ranges)
    for (int c = cpus.empty() ? first : std::max(first, cpus.back() + 1); c <= last; ++c)
      cpus.push_back(c);
  return cpus;
}

std::vector<int> parse_cpu_list(const std::string& text) {
  const std::optional<std::vector<int>> cpus = read_cpu_list(text);
  DPT_CHECK(cpus, "a CPU list '" << text << "' that cpu_list_text did not write");
  return *cpus;
}

std::vector<std::string> cpuset_files(std::string_view proc_self_cgroup, const std::string& root) {
  std::vector<std::string> files;
  for (size_t at = 0; at < proc_self_cgroup.size();) {
    const size_t nl = std::min(proc_self_cgroup.find('\n', at), proc_self_cgroup.size());
    const std::string_view line = proc_self_cgroup.substr(at, nl - at);
    at = nl + 1;
    // "hierarchy:controllers:path"; the path may hold ':' itself.
    const size_t c1 = line.find(':');
    const size_t c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    const std::string controllers(line.substr(c1 + 1, c2 - c1 - 1));
    std::string dir;
    std::vector<std::string> names;
    if (controllers.empty() && line.substr(0, c1) == "0") {
      dir = root, names = {"cpuset.cpus.effective"};  // v2: the one hierarchy, at the root
    } else if (("," + controllers + ",").find(",cpuset,") != std::string::npos) {
      dir = root + "/" + controllers, names = {"cpuset.effective_cpus", "cpuset.cpus"};  // v1
    } else {
      continue;
    }
    std::vector<std::string> parts;
    for (std::string& part : split_list(line.substr(c2 + 1), '/'))
      if (!part.empty()) parts.push_back(std::move(part));
    // A cgroup outside this namespace's root shows as "/../.."; only the root's files are its.
    if (std::any_of(parts.begin(), parts.end(),
                    [](const std::string& part) { return part == ".." || part == "."; }))
      parts.clear();
    std::vector<std::string> dirs = {dir};
    for (const std::string& part : parts) dirs.push_back(dirs.back() + "/" + part);
    for (auto d = dirs.rbegin(); d != dirs.rend(); ++d)
      for (const std::string& name : names) files.push_back(*d + "/" + name);
  }
  return files;
}

long cpus_allowed_at_most(const std::vector<std::optional<std::string>>& cpusets, long online) {
  for (const std::optional<std::string>& text : cpusets) {
    const std::optional<std::vector<int>> cpus = text ? read_cpu_list(*text) : std::nullopt;
    if (cpus && !cpus->empty()) {
      const long n = static_cast<long>(cpus->size());
      return online > 0 ? std::min(n, online) : n;
    }
  }
  return online;
}

long cgroup_cpus_at_most(long online) {
  std::vector<std::optional<std::string>> texts;
  for (const std::string& f :
       cpuset_files(small_file_text("/proc/self/cgroup").value_or(""), "/sys/fs/cgroup"))
    texts.push_back(small_file_text(f));
  return cpus_allowed_at_most(texts, online);
}

RankPlace this_place(const std::string& host) {
  const char* bound = std::getenv("OMPI_MCA_orte_bound_at_launch");
  return {host, usable_cpus(), bound && std::string(bound) == "1"};
}

// "host\ncpus\nbound", read from the end: the CPU list and the flag hold no newline, whatever the
// host's name (MPI_Get_processor_name's) holds.
std::string place_text(const RankPlace& place) {
  return place.host + "\n" + cpu_list_text(place.cpus) + "\n" + (place.bound_by_mpirun ? "1" : "0");
}

RankPlace parse_place(const std::string& text) {
  const size_t b = text.rfind('\n');
  const size_t a = b == std::string::npos || b == 0 ? std::string::npos : text.rfind('\n', b - 1);
  DPT_CHECK(a != std::string::npos, "a rank's place '" << text << "' without its fields");
  return {text.substr(0, a), parse_cpu_list(text.substr(a + 1, b - a - 1)),
          text.substr(b + 1) == "1"};
}

HostCores host_cores(const std::vector<RankPlace>& places, int rank, long online, long allowed) {
  HostCores hc;
  hc.online = online;
  hc.allowed = allowed;
  std::map<std::string, std::pair<std::set<int>, size_t>> hosts;  // each host's union and ranks
  for (size_t r = 0; r < places.size(); ++r) {
    const RankPlace& p = places[r];
    auto& [cpus, ranks] = hosts[p.host];
    cpus.insert(p.cpus.begin(), p.cpus.end());
    ++ranks;
    if (p.host != places[static_cast<size_t>(rank)].host) continue;
    hc.ranks.push_back(static_cast<int>(r));
    hc.own.push_back(static_cast<int>(p.cpus.size()));
    hc.bound_by_mpirun.push_back(p.bound_by_mpirun);
  }
  for (const auto& [host, u] : hosts)
    if (!u.first.empty() && u.second > u.first.size()) hc.ranks_outnumber_any = true;
  const auto& mine = hosts[places[static_cast<size_t>(rank)].host].first;
  hc.cpus.assign(mine.begin(), mine.end());
  return hc;
}

std::string cores_warning(const HostCores& hc, int threads) {
  const int64_t cores = static_cast<int64_t>(hc.cpus.size());
  const int64_t ranks = static_cast<int64_t>(hc.ranks.size());
  if (cores == 0 || ranks == 0) return "";  // the kernel said nothing
  // "its 1 core(s)" on a host whose nproc says 64 needs its reason. In a container limited to
  // some CPUs (--cpuset-cpus, a cgroup's cpuset) the process can never have the others, so the
  // cores it could have are the cpuset's, not the host's online CPUs.
  const bool in_cpuset = hc.allowed > 0 && (hc.online <= 0 || hc.allowed < hc.online);
  const long most = in_cpuset ? hc.allowed : hc.online;
  const std::string limited =
      most > cores
          ? DPT_MSG(" (CPUs " << cpu_list_text(hc.cpus) << " of "
                              << (in_cpuset
                                      ? DPT_MSG("the " << most << " its cgroup's cpuset allows")
                                      : DPT_MSG("its " << most << " online"))
                              << ": the ranks' affinity masks, which taskset, a "
                              << "container's cpuset, the batch system or mpirun's binding narrow)")
          : std::string();
  if (ranks > cores)
    return DPT_MSG(ranks << " ranks on this host, more than its " << cores << " core(s)" << limited
                         << ": the ranks take turns on the cores and every all-reduce waits for "
                         << "the last of them, which is slower than fewer ranks; start at most "
                         << cores << " rank(s) per host"
                         << (threads > 1 ? ", with --threads 1" : ""));
  // The ranks bound to fewer cores than their threads: with mpirun's binding (one core per rank by
  // default) that is worth a word wherever the host has the cores for every thread, as PyTorch
  // and Horovod users meet it (--bind-to none is the usual fix); otherwise only where their
  // masks together have the cores (a rankfile, srun --cpu-bind), else the count below says it.
  const int64_t total = static_cast<int64_t>(threads) * ranks;
  std::vector<int> narrow;
  int fewest = threads;
  bool by_mpirun = false;
  for (size_t i = 0; i < hc.ranks.size(); ++i)
    if (hc.own[i] > 0 && hc.own[i] < threads) {
      narrow.push_back(hc.ranks[i]);
      fewest = std::min(fewest, hc.own[i]);
      by_mpirun = by_mpirun || hc.bound_by_mpirun[i];
    }
  if (!narrow.empty() && (total <= cores || (by_mpirun && total <= most))) {
    std::ostringstream names;
    for (size_t i = 0; i < narrow.size(); ++i) names << (i ? ", " : "") << narrow[i];
    return DPT_MSG(
        "--threads " << threads << ", but rank(s) " << names.str()
                     << " on this host may run on only " << fewest << " core(s)"
                     << (narrow.size() > 1 ? " each" : "") << ", "
                     << (by_mpirun ? "as mpirun bound them (Open MPI binds each rank to "
                                     "one core by default when there are at most 2)"
                                   : "by their affinity masks")
                     << ": the threads of a rank take turns on its core(s) while "
                     << (in_cpuset ? "its cgroup's cpuset allows " : "the host has ")
                     << std::max<int64_t>(cores, most)
                     << " cores; start mpirun with --bind-to none, or with --map-by slot:PE="
                     << threads << " to give each rank " << threads
                     << " cores (srun: --cpus-per-task=" << threads << ")");
  }
  if (total > cores)
    return DPT_MSG("--threads " << threads << " x " << ranks
                                << " rank(s) on this host is more compute threads than its "
                                << cores << " core(s)" << limited
                                << ": oversubscribed threads wait for each other at every "
                                << "parallel loop, which can be many times slower; use --threads "
                                << std::max<int64_t>(1, cores / ranks));
  return "";
}

std::string data_digest(const ImageSet& set) {
  // The labels as bytes while every class fits one (what the digest hashed when labels were
  // bytes, so checkpoints of those data sets still resume), else as 16-bit little-endian values.
  const int width = set.num_classes <= 256 ? 1 : 2;
  std::vector<uint8_t> labels;
  labels.reserve(set.labels.size() * width);
  for (Label l : set.labels)
    for (int b = 0; b < width; ++b) labels.push_back(static_cast<uint8_t>(l >> (8 * b)));
  std::ostringstream os;
  os << "images " << set.n << " of " << set.shape_text() << ", checksum 0x" << std::hex
     << checksum(labels.data(), labels.size(), checksum(set.images.data(), set.images.size()));
  return os.str();
}

std::vector<DataDigest> data_digests(const Preflight& pf) {
  return {{kDataDigests[0], pf.train_digest}, {kDataDigests[1], pf.test_digest}};
}

std::map<std::string, std::string> input_metadata(const Preflight& pf) {
  std::map<std::string, std::string> m{{"data_format", pf.data_format},
                                       {"augment", pf.augment.text()},
                                       {"normalize", pf.normalize.text()}};
  for (const DataDigest& d : data_digests(pf)) m[d.name.key] = d.digest;
  if (pf.normalize.any()) {
    m["normalize_mean"] = pf.normalize.mean_text();
    m["normalize_std"] = pf.normalize.std_text();
  }
  return m;
}

namespace {

// The first value compared: the build each rank runs (build_identity). Ranks of different builds
// (a stale copy on one host, a rebuilt one on another) ran without a word when their settings
// agreed: the collectives assume one build (the resume broadcasts EpochSoFar as bytes), and a
// build whose optimizer or kernels differ trains replicas that silently drift apart.
constexpr const char* kBuild = "dptrain builds";

// The lines of `text` ("flag<TAB>value" each).
std::vector<std::pair<std::string, std::string>> agreed_lines(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t tab = line.find('\t');
    out.emplace_back(line.substr(0, tab), tab == std::string::npos ? "" : line.substr(tab + 1));
  }
  return out;
}

// Every rank's "flag, value" list against every other rank's: a difference ends every rank with
// exit 2, rank 0 naming the flag and which ranks have which value. One all-gather, on every rank.
void agree_on_values(Communicator& comm,
                     const std::vector<std::pair<std::string, std::string>>& values) {
  std::string mine;
  for (const auto& [flag, value] : values) mine += flag + "\t" + value + "\n";
  const std::vector<std::string> all = allgather_text(comm, mine);
  std::vector<std::vector<std::pair<std::string, std::string>>> lines;
  for (const std::string& text : all) lines.push_back(agreed_lines(text));
  for (size_t i = 0; i < lines[0].size(); ++i) {
    std::vector<std::pair<std::string, std::vector<int>>>
        ranks_of;  // value -> ranks, rank 0's first
    for (int r = 0; r < comm.size(); ++r) {
      const auto& l = lines[static_cast<size_t>(r)];
      const std::string v = i < l.size() && l[i].first == lines[0][i].first
                                ? l[i].second
                                : "(another dptrain version)";
      auto it = std::find_if(ranks_of.begin(), ranks_of.end(),
                             [&](const auto& g) { return g.first == v; });
      if (it == ranks_of.end())
        ranks_of.push_back({v, {r}});
      else
        it->second.push_back(r);
    }
    if (ranks_of.size() == 1) continue;
    std::ostringstream os;
    os << "ranks were started with different " << lines[0][i].first << ":";
    for (const auto& [value, ranks] : ranks_of) {
      os << (ranks.size() == 1 ? " rank " : " ranks ");
      for (size_t k = 0; k < ranks.size(); ++k) os << (k ? "," : "") << ranks[k];
      os << " " << (ranks.size() == 1 ? "has " : "have ") << value << ";";
    }
    os << (lines[0][i].first == kBuild
               ? " every rank must run the same dptrain binary (one build, on a shared file "
                 "system or copied to every host)"
               : " every rank must be given the same training settings and data");
    throw AgreedInputError(os.str(), comm.rank() != 0);
  }
}

}  // namespace

// Ranks started with different settings (an MPMD line, a stale copy of a job script) would train
// different things, or issue different collectives and hang. Compared first of all: until the
// settings agree, no collective may depend on one (a bf16 check only bf16 ranks joined once met
// the fp32 ranks' next collective: MPI_ERR_TRUNCATE).
void agree_on_config(const TrainConfig& cfg, Communicator& comm) {
  std::vector<std::pair<std::string, std::string>> values = {{kBuild, build_identity()}};
  for (auto& v : agreed_values(cfg)) values.push_back(std::move(v));
  agree_on_values(comm, values);
}

void agree_on_data(const Preflight& pf, Communicator& comm) {
  std::vector<std::pair<std::string, std::string>> values;
  for (const DataDigest& d : data_digests(pf)) values.emplace_back(d.name.flag, d.digest);
  agree_on_values(comm, values);
}

// Checked before the first step instead of after hours of training. A FIFO, device or directory
// at an output's path is refused: the atomic writer would put a regular file over it (a --save
// /dev/null run as root replaced /dev/null), and a FIFO would hang the writer. --metrics is a
// stream appended to, so a character device is fine there (/dev/null, or /dev/full as a full disk).
// Each output is locked as it is checked (OutputLock), before anything is truncated: a second run
// with the same file is refused here, naming the run that holds it. Two flags of one run naming
// one file would lock it twice; they are refused naming both. An output naming one of the run's
// inputs would destroy it (a predict --output over its --load, a --metrics appended to the
// checkpoint being resumed, which no later resume could read): refused too, before any output is
// touched (the locks taken by then are on files of their own, removed with them). The one
// exception is the normal case of a resume: --checkpoint-path is the file resumed (or, under
// --resume auto, one of the files it may pick), and is replaced atomically by the run's next
// checkpoint, which continues the same training.
std::vector<OutputLock> check_outputs(const TrainConfig& cfg,
                                      const std::vector<std::string>& data_files,
                                      CheckpointSurvey* survey) {
  std::vector<std::pair<const char*, std::string>> outputs = {{"--metrics", cfg.metrics},
                                                              {"--save", cfg.save},
                                                              {"--report", cfg.report},
                                                              {"--trace", cfg.trace},
                                                              {"--output", cfg.output}};
  if (cfg.checkpoints()) outputs.push_back({"--checkpoint-path", cfg.checkpoint_path});
  std::vector<OutputLock> locks;
  std::vector<std::pair<const char*, std::string>> locked;  // the flag and path of each lock
  for (const auto& [flag, path] : outputs) {
    if (path.empty()) continue;
    // The log's own file: a --metrics opened on it again truncated it, and the records and the log
    // lines then wrote over each other at their two offsets (NUL bytes between); a file renamed
    // over it took the log with it.
    const std::string stream = standard_stream_of(path);
    DPT_INPUT_CHECK(stream.empty(), flag << " " << path << " is the file " << stream
                                         << " goes to: the log and " << flag
                                         << " would write over each other; give " << flag
                                         << " a file of its own");
    for (const auto& [owner, owned] : locked)
      DPT_INPUT_CHECK(!same_file(path, owned), flag << " " << path << " is the file " << owner
                                                    << " names: give each output its own file");
    // Training appends to --metrics as it goes (a character device will do); evaluate's results
    // are one file written whole.
    OutputLock lock =
        check_output_path(path, flag, std::string(flag) == "--metrics" && cfg.command == "train");
    if (lock.file().empty()) continue;
    locks.push_back(std::move(lock));
    locked.push_back({flag, path});
  }
  // The checkpoint directory, surveyed once for the whole start-up (checkpoint.h's
  // CheckpointSurvey), now that --checkpoint-path's lock is held where the run takes one: no other
  // run of these checkpoint names writes there until this one ends (a run that only resumes takes
  // no lock; load checks the file it takes against the survey).
  CheckpointSurvey taken;
  if (cfg.resume == "auto" || cfg.checkpoints()) taken = survey_checkpoints(cfg);
  // What the run reads. --resume auto reads whichever of the checkpoint files it finds is newest:
  // each is an input.
  std::vector<std::pair<std::string, std::string>> inputs;  // (flag as messages name it, path)
  if (cfg.resume == "auto") {
    for (const CheckpointInfo& f : taken.entries)
      if (f.regular) inputs.push_back({"--resume auto", f.path});
  } else if (!cfg.resume.empty()) {
    inputs.push_back({"--resume", cfg.resume});
  }
  if (!cfg.init_from.empty()) inputs.push_back({"--init-from", cfg.init_from});
  if (!cfg.load.empty()) inputs.push_back({"--load", cfg.load});
  for (const std::string& f : data_files) inputs.push_back({"--data", f});
  for (const auto& [flag, path] : outputs) {
    if (path.empty()) continue;
    for (const auto& [in_flag, in_path] : inputs) {
      const bool resumed_checkpoint =
          std::string(flag) == "--checkpoint-path" && in_flag.starts_with("--resume");
      DPT_INPUT_CHECK(resumed_checkpoint || !same_file(path, in_path),
                      flag << " " << path << " is the file " << in_flag << " reads (" << in_path
                           << "): writing it would destroy that input; choose another file");
    }
  }
  for (size_t i = 0; i < locks.size(); ++i) {
    const char* flag = locked[i].first;
    // A killed writer's temporaries of this output (a --save or predict --output killed while
    // writing; a checkpoint's, 85 MB each for ResNet-18), removed now that no other run can be
    // writing it: for --checkpoint-path, those of every checkpoint name beside it (its step-named
    // files'), taken from the survey's listing of the directory, which is not listed again. The
    // one place they are removed: the CheckpointManager scanned the directory again, and without
    // the lock on a run that only resumed. A temporary is never at a checkpoint name: the survey
    // above lists the same entries as it would after their removal.
    std::function<bool(const std::string&)> beside;
    if (std::string(flag) == "--checkpoint-path")
      beside = [&](const std::string& name) { return is_checkpoint_name(cfg, name); };
    for (const std::string& dead : locks[i].remove_dead_temporaries(beside, taken.temporaries))
      log_info("removed " + dead + ", left by a killed writer of " + flag);
  }
  if (!cfg.resume.empty() && cfg.resume != "auto") check_input_file(cfg.resume, "--resume");
  if (!cfg.init_from.empty()) check_input_file(cfg.init_from, "--init-from");
  if (!cfg.load.empty()) check_input_file(cfg.load, "--load");
  if (survey) *survey = std::move(taken);
  return locks;
}

// The probe runs on the CPU: the growth of live tensor storage from batch 2 to batch 4, halved, so
// the fixed costs (parameters, plans) cancel. Activations, their gradients and layer temporaries
// are the same bytes on a GPU. Images larger than 32x32 are probed at 32x32 (a ResNet-18 pass on
// four 512x512 images would take minutes) and the result scaled by the area: every activation of
// these convolutional models grows with H x W.
std::pair<double, double> bytes_per_image(const std::string& name, int classes, const Shape& shape,
                                          DType activations, const ModelOptions& options) {
  // The stem of the run's images, not of the smaller probe's (auto would choose cifar there).
  ModelOptions probe_options = options;
  if (std::string stem = resolve_stem(name, options, shape); !stem.empty())
    probe_options.stem = stem;
  const Shape input{std::min<int64_t>(shape[0], 32), std::min<int64_t>(shape[1], 32), shape[2]};
  const double area =
      static_cast<double>(shape[0] * shape[1]) / static_cast<double>(input[0] * input[1]);
  double per[2] = {0, 0};
  for (int train = 0; train < 2; ++train) {
    auto probe = make_model(name, classes, cpu_backend(), input, probe_options);
    probe->set_activation_dtype(activations);
    int64_t live[2] = {0, 0};
    Tensor x, dl;
    for (int k = 0; k < 2; ++k) {
      const int64_t b = 2 + 2 * k;
      x.resize({b, input[0], input[1], input[2]});
      probe->forward(x, train ? Mode::kTrain : Mode::kInfer);
      if (train) {
        dl.resize({b, classes});
        BackwardCtx ctx;
        probe->backward(dl, ctx);
      }
      live[k] = Tensor::live_bytes();
    }
    per[train] = area * static_cast<double>(live[1] - live[0]) / 2;
  }
  return {per[1], per[0]};
}

double model_fixed_bytes(const std::string& name, int classes, const Shape& input,
                         const std::string& optimizer, const ModelOptions& options) {
  // Inference (no optimizer) keeps only the values and oneDNN's forward copy of the weights.
  const double floats = optimizer.empty() ? 2 : 2 + (optimizer == "adamw" ? 2 : 1) + 2;
  return 4.0 * static_cast<double>(count_parameters(name, classes, input, options)) * floats;
}

void check_data_memory(const std::string& dir, const DataSize& size, int ranks_here,
                       const HostMemory& mem) {
  if (mem.bytes < 0) return;  // nothing known: the loss of a check is not a reason to refuse a run
  auto bytes = [](double b) {
    return DPT_MSG(std::fixed << std::setprecision(2) << b / (1 << 30) << " GiB ("
                              << std::setprecision(0) << b << " bytes)");
  };
  const double need = static_cast<double>(size.bytes) * ranks_here;
  DPT_INPUT_CHECK(
      need <= mem.bytes,
      "--data " << dir << ": the data set needs " << bytes(need) << " of memory on this host ("
                << ranks_here
                << " rank(s), each holding all of it: " << bytes(static_cast<double>(size.bytes))
                << " as the files' headers say; the largest, " << size.largest_file << ", "
                << bytes(static_cast<double>(size.largest_bytes)) << "), but " << bytes(mem.bytes)
                << " is available (" << mem.source
                << "); use a host with more memory, or fewer ranks on it");
}

void check_memory(const TrainConfig& cfg, int world, int classes, int64_t test_n,
                  const DeviceMemory& mem, const Shape& input, std::optional<DType> activations,
                  double unread_data_bytes) {
  const double avail = mem.free_bytes, extra = mem.extra;
  const int sharing = mem.sharing;
  const std::string& where = mem.where;
  if (!mem.checks || avail < 0) return;  // not this rank's to check, or nothing to compare with
  // evaluate and predict only score batches of --eval-batch-size: no training step, gradients or
  // optimizer state, and --batch-size is not theirs (a training default of 256 refused a model
  // that scores one 700x700 image at a time).
  const bool training = cfg.command == "train";
  const auto [train, eval] =
      bytes_per_image(cfg.model, classes, input, activations.value_or(activation_dtype(cfg)),
                      {cfg.stem, cfg.zero_init_residual});
  const double local = training ? static_cast<double>(cfg.batch_size / world) : 0.0;
  // No evaluation at all under --eval-every 0 (a training flag).
  const double eval_batch =
      training && cfg.eval_every == 0
          ? 0.0
          : static_cast<double>(std::min(cfg.eval_batch_size, std::max<int64_t>(test_n, 1)));
  // Evaluation borrows its intermediates from the model's pool (Mode::kInfer) while the
  // activations kept for the next backward stay where they are: the two add up.
  const double fixed =
      mem.model_fixed ? model_fixed_bytes(cfg.model, classes, input, training ? cfg.optimizer : "",
                                          {cfg.stem, cfg.zero_init_residual})
                      : 0.0;
  const double per_rank = train * local + eval * eval_batch + extra + fixed + unread_data_bytes;
  const double need = per_rank * sharing;
  auto gib = [](double b) { return DPT_MSG(std::fixed << std::setprecision(1) << b / (1 << 30)); };
  auto mib = [](double b) { return DPT_MSG(std::fixed << std::setprecision(2) << b / (1 << 20)); };
  const std::string extras = DPT_MSG(
      (extra > 0 ? DPT_MSG(", + " << gib(extra) << " GiB of parameters, data and cuDNN scratch")
                 : std::string())
      << (fixed > 0 ? DPT_MSG(", + " << gib(fixed) << " GiB of parameters, "
                                     << (training ? "gradients, optimizer state and " : "")
                                     << "weight copies")
                    : std::string())
      << (unread_data_bytes > 0
              ? DPT_MSG(", + " << gib(unread_data_bytes) << " GiB of the data set, read after "
                               << "this check")
              : std::string())
      << "), but " << gib(avail) << " GiB is available; use a smaller ");
  const std::string fewer = DPT_MSG(", or fewer ranks per " << (extra > 0 ? "GPU" : "host"));
  if (training) {
    DPT_INPUT_CHECK(need <= avail,
                    "--batch-size "
                        << cfg.batch_size << ": training needs about " << gib(need)
                        << " GiB more memory " << where << " (" << sharing << " rank(s) x "
                        << gib(per_rank) << " GiB: " << mib(train)
                        << " MiB per image of a training step x " << cfg.batch_size / world
                        << (eval_batch > 0
                                ? DPT_MSG(", + " << mib(eval) << " MiB per image of evaluation x "
                                                 << eval_batch)
                                : std::string())
                        << extras << "--batch-size or --eval-batch-size" << fewer);
  } else {
    DPT_INPUT_CHECK(need <= avail, "--eval-batch-size "
                                       << cfg.eval_batch_size << ": " << cfg.command
                                       << " needs about " << gib(need) << " GiB more memory "
                                       << where << " (" << sharing << " rank(s) x " << gib(per_rank)
                                       << " GiB: " << mib(eval) << " MiB per image of evaluation x "
                                       << eval_batch << extras << "--eval-batch-size" << fewer);
  }
  log_debug(DPT_MSG("memory estimate " << where << ": " << gib(need) << " GiB of " << gib(avail)
                                       << " GiB available"));
}

// --device for every rank alike (the flag itself is agreed before): an unusable --device cuda on
// any rank ends all of them (exit 2, the failing ranks say why); auto picks cuda only when every
// rank sees a device, since CPU and GPU ranks cannot share one all-reduce. An explicit --device
// cuda is never turned into the CPU: every rank resolved it to cuda, or the job ended.
namespace {

std::string agree_on_device(const TrainConfig& cfg, Communicator& comm, int local_rank) {
  std::string device;
  agree_on_input(comm, "--device cuda: another rank has no CUDA device visible",
                 [&] { device = resolve_device(cfg.device, local_rank); });
  int32_t cuda = device == "cuda" ? 1 : 0;
  comm.allreduce(&cuda, 1, ReduceOp::kSum, "all-reduce of the device choice");
  if (device == "cuda" && cuda < comm.size()) {
    DPT_CHECK(cfg.device == "auto", "--device " << cfg.device << " resolved to cuda on only "
                                                << cuda << " of " << comm.size()
                                                << " ranks after the ranks agreed on it");
    if (comm.rank() == 0)
      log_warn(DPT_MSG("--device auto: only "
                       << cuda << " of " << comm.size()
                       << " ranks see a CUDA device; every rank uses the CPU"));
    device = "cpu";
  }
  if (device == "cpu" && comm.rank() == 0) {
    if (cfg.tf32) log_warn("--tf32 has no effect on the CPU");
    if (cfg.cudnn_nondeterministic) log_warn("--cudnn-nondeterministic has no effect on the CPU");
  }
  return device;
}

}  // namespace

Preflight run_preflight(const TrainConfig& cfg, Communicator& comm) {
  const int rank = comm.rank(), world = comm.size();
  Preflight pf;
  // Which host each rank runs on (the local rank picks the GPU, and the banner names the hosts)
  // and the CPUs it may run on, in one all-gather.
  std::vector<RankPlace> places;
  for (const std::string& text : allgather_text(comm, place_text(this_place(comm.host()))))
    places.push_back(parse_place(text));
  for (const RankPlace& p : places) pf.hosts.push_back(p.host);
  pf.local_rank = local_rank_of(pf.hosts, rank);
  // More compute threads than this host has cores ran 100x slower without a word (--threads 64
  // on 2 cores: 6.66 against 0.05 s per epoch): said once per host, not refused. The cores are
  // those the ranks may run on (their affinity masks), not the host's: under taskset, a
  // container's cpuset or Slurm's cgroup they are fewer (std::thread::hardware_concurrency counted
  // every online CPU, so `taskset -c 0 mpirun -np 2` said nothing and kept the straggler watch).
  // Every rank has every mask, so each decides ranks_outnumber_cores alike without a collective.
  // Within a container's cpuset, the cpuset's CPUs are all the host it can have.
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  const HostCores cores = host_cores(places, rank, online, cgroup_cpus_at_most(online));
  pf.ranks_here = static_cast<int>(cores.ranks.size());  // the ranks on this rank's host
  if (pf.local_rank == 0)
    if (const std::string warning = cores_warning(cores, cfg.threads); !warning.empty())
      log_warn(warning);
  pf.ranks_outnumber_cores = cores.ranks_outnumber_any;
  // The settings first: every collective after this may depend on them (the device, the data).
  agree_on_config(cfg, comm);
  const std::string kind = agree_on_device(cfg, comm, pf.local_rank);

  // The data set's size from its headers, against this host's memory (its first rank checks for
  // all the ranks on it), before any rank reads it: a small .gz that inflates to more than the
  // memory would otherwise end in the OOM killer's SIGKILL, without a word. The agreement is also
  // the barrier that keeps a rank's load from shrinking the memory another rank measures.
  DataSize header;  // what the headers (or the synthetic spec) say, before any data is read
  agree_on_input(
      comm,
      "--data " + cfg.data +
          ": another rank could not size the data set, or its host has not the memory for it",
      "sizing --data " + cfg.data, [&] {
        header = data_size(cfg.data, cfg.data_format);
        if (pf.local_rank == 0) check_data_memory(cfg.data, header, pf.ranks_here, host_memory());
      });
  const std::vector<std::string>& data_files = header.files;  // none when synthetic
  const uint64_t data_bytes = header.bytes;

  // The device (a GPU's context is created here; the CPU's checks bf16 there), before the data is
  // read: the batch's memory is checked against it from the headers.
  DeviceRequest req;
  req.kind = kind;
  req.local_rank = pf.local_rank;
  req.ranks_here = pf.ranks_here;
  req.tf32 = cfg.tf32;
  req.nondeterministic = cfg.cudnn_nondeterministic;
  req.bf16 = cfg.precision == "bf16";
  agree_on_input(comm, "another rank could not open its device", "opening its device", [&] {
    pf.device = open_device(req);
    pf.activations = activation_dtype(cfg, pf.device->fast_bf16_activations());
  });
  const std::string no_memory = kind == "cpu"
                                    ? "another host has not enough memory for this batch"
                                    : "another rank's GPU has not enough memory for this batch";
  // The batch's memory from the headers' image shape and test count, before the data is read (a
  // synthetic 46341x46341 image took 42 s to draw before its batch was refused). On the CPU the
  // memory measured does not hold the data set yet: its bytes are counted in. Where the training
  // labels decide the classes (idx, npy) the estimate takes 2, the fewest; and a resume under
  // --activation-dtype auto may keep another type than auto's (known once the data's digests are),
  // so bf16's, the smaller, is taken: a refusal here is certain, and the check is made again below
  // once those are known.
  struct Estimate {
    int classes;
    DType activations;
  };
  std::optional<Estimate> checked;
  if (header.image_shape.size() == 3) {
    const Shape shape{header.image_shape[0], header.image_shape[1], header.image_shape[2]};
    // A shape the model cannot take is refused below, naming the data's shape.
    if (model_input_problem(cfg.model, shape).empty()) {
      const Estimate e{header.classes, cfg.activation_dtype == "auto" && !cfg.resume.empty()
                                           ? DType::kBF16
                                           : pf.activations};
      agree_on_input(comm, no_memory, [&] {
        check_memory(cfg, world, std::max(e.classes, 2), header.test_n, pf.device->memory(rank),
                     shape, e.activations, kind == "cpu" ? static_cast<double>(data_bytes) : 0.0);
      });
      checked = e;
    }
  }
  // Every rank reads the data; if any rank fails, all stop with exit code 2 (the failing ranks say
  // why).
  const double t_load = now_seconds();
  const std::string reading = "reading --data " + cfg.data;
  agree_on_input(comm, "another rank could not read --data " + cfg.data, reading, [&] {
    // The memory check above has no margin (what MemAvailable says can be taken by others before
    // the load, and the load's buffers come on top): running out here was "unexpected failure:
    // std::bad_alloc", exit 3, naming nothing.
    DataSets data = [&] {
      try {
        return load_data(cfg.data, cfg.data_format, cfg.seed);
      } catch (const std::bad_alloc&) {
        throw Error(ErrorKind::kInput,
                    DPT_MSG("--data " << cfg.data << ": this host ran out of memory reading it ("
                                      << data_bytes << " bytes of data per rank, " << pf.ranks_here
                                      << " rank(s) on this host); use a host "
                                      << "with more memory, or fewer ranks on it"));
      }
    }();
    pf.data_format = data.format;
    pf.train = std::move(data.train);
    pf.test = std::move(data.test);
    const Shape shape = pf.input_shape();
    const std::string problem = model_input_problem(cfg.model, shape);
    DPT_INPUT_CHECK(problem.empty(), "--data " << cfg.data << " has images of "
                                               << pf.train.shape_text()
                                               << " (HxWxC), which --model " << cfg.model
                                               << " cannot take: " << problem);
    pf.normalize = resolve_normalize(cfg.normalize, &pf.train);
    pf.augment = parse_augment(cfg.augment, pf.train.rows, pf.train.cols);
  });
  if (pf.train.num_classes < 2 && rank == 0 && cfg.command == "train")
    log_warn(DPT_MSG("--data " << cfg.data << ": every training label is class 0, so the model "
                               << "learns nothing (loss 0 and accuracy 1 from the first step); "
                               << "is this the data set meant?"));
  pf.train_digest = data_digest(pf.train);
  pf.test_digest = data_digest(pf.test);
  log_debug(DPT_MSG("data loaded in " << now_seconds() - t_load << " s"));
  agree_on_data(pf, comm);
  const std::string checking = "checking the outputs and the checkpoint directory (rank 0)";
  agree_on_input(comm, "rank 0 cannot write an output file", checking, [&] {
    if (rank == 0) pf.locks = check_outputs(cfg, data_files, &pf.checkpoints);
  });

  if (cfg.activation_dtype == "auto" && !cfg.resume.empty()) {
    // A resume continues in the activation type it was trained in, wherever auto resolves now
    // (a checkpoint from before the CPU's bf16 activations became auto's choice resumes in fp32).
    int32_t recorded = -1;  // rank 0: the DType recorded, or -1 for none
    if (rank == 0)
      if (const auto t = resumed_activation_dtype(cfg, pf.checkpoints, input_metadata(pf)))
        recorded = static_cast<int32_t>(*t);
    comm.broadcast(&recorded, 1, 0, "broadcast of the resumed run's activation type");
    const auto then = static_cast<DType>(recorded);
    if (recorded >= 0 && then != pf.activations) {
      if (rank == 0)
        log_info(DPT_MSG("--activation-dtype auto: the checkpoint was trained with "
                         << (then == DType::kBF16 ? "bf16" : "fp32")
                         << " activations, and the resumed run keeps them"));
      pf.activations = then;
    }
  }
  // Again only where the estimate above took other classes or activations than the run's (the
  // check builds the model twice to measure it).
  if (!checked || checked->classes != pf.train.num_classes ||
      checked->activations != pf.activations)
    agree_on_input(comm, no_memory, [&] {
      check_memory(cfg, world, pf.train.num_classes, pf.test.n, pf.device->memory(rank),
                   pf.input_shape(), pf.activations);
    });
  return pf;
}

}  // namespace dpt
