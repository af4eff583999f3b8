// Unit tests for include/dpt/preflight.h on one MPI rank: local ranks, the cores (affinity masks
// and their warnings), data digests, the output and memory checks, agree_on_input's error mapping,
// and run_preflight on good and FIFO-poisoned data.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "dpt/checkpoint.h"
#include "dpt/comm.h"
#include "dpt/config.h"
#include "dpt/device.h"
#include "dpt/error.h"
#include "dpt/idx.h"
#include "dpt/preflight.h"
#include "dpt/watchdog.h"
#include "test_util.h"

namespace dpt {
namespace {

// Ends the test binary (exit 1) if the scope is still running after `seconds`: a check that
// blocks on a FIFO must fail the suite, not hang it. dpt::Watchdog, the bound of MPI_Init, with
// the message a test's log needs (returned in place: a Watchdog is neither copied nor moved).
Watchdog fail_if_blocked(const std::string& what, double seconds) {
  return Watchdog(seconds, 1, [what, seconds] {
    std::fprintf(stderr,
                 "watchdog: %s still running after %g s: it blocked; failing the test binary\n",
                 what.c_str(), seconds);
  });
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Runs fn, which must throw an input error (of type E) whose message names every one of `names`.
template <typename E = Error>
void expect_input_error(const std::function<void()>& fn, const std::vector<std::string>& names) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown (expected one naming " << (names.empty() ? "" : names.front())
                  << ")";
  } catch (const E& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput) << e.what();
    for (const std::string& n : names)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << n << " not in: " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "an error of another type: " << e.what();
  }
}

class PreflightDir : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::make_temp_dir("preflight"); }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::string fifo(const std::string& name) const {
    const std::string p = path(name);
    EXPECT_EQ(::mkfifo(p.c_str(), 0600), 0) << p;
    return p;
  }
  std::string dir_;
};

// ---- local_rank_of ----

TEST(LocalRank, InterleavedHosts) {
  const std::vector<std::string> hosts = {"a", "b", "a", "b", "a", "c"};
  const std::vector<int> expect = {0, 0, 1, 1, 2, 0};
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r)
    EXPECT_EQ(local_rank_of(hosts, r), expect[r]) << r;
  const std::vector<std::string> blocks = {"x", "x", "y", "y"};
  EXPECT_EQ(local_rank_of(blocks, 1), 1);
  EXPECT_EQ(local_rank_of(blocks, 2), 0);
  EXPECT_EQ(local_rank_of(blocks, 3), 1);
  EXPECT_EQ(local_rank_of({"solo"}, 0), 0);
}

// ---- the cores: affinity masks, their union per host, the warnings ----

TEST(Cores, CpuListTextIsTheKernelsForm) {
  EXPECT_EQ(cpu_list_text({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(cpu_list_text({5}), "5");
  EXPECT_EQ(cpu_list_text({}), "");
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list(""), std::vector<int>{});
  EXPECT_THROW(parse_cpu_list("3-1"), Error);
  EXPECT_THROW(parse_cpu_list("x"), Error);
}

// The cgroup's cpuset files hold the same form; whatever else they hold is no list, never a crash.
TEST(Cores, ReadCpuListTakesTheKernelsFormAndRefusesAnythingElse) {
  EXPECT_EQ(read_cpu_list("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(read_cpu_list("5"), std::vector<int>{5});
  EXPECT_EQ(read_cpu_list(""), std::vector<int>{});
  EXPECT_EQ(read_cpu_list("\n"), std::vector<int>{});
  EXPECT_EQ(read_cpu_list("2-3,0-2"), (std::vector<int>{0, 1, 2, 3}));  // each CPU once
  EXPECT_EQ(read_cpu_list("262143"), std::vector<int>{262143});         // the largest id read
  for (const char* bad : {"x",
                          "3-1",
                          "0-3\n\n",
                          " 0",
                          "0 ",
                          "+1",
                          "-1",
                          "1-",
                          "-",
                          ",",
                          "0,",
                          ",0",
                          "0,,1",
                          "1--3",
                          "0-3-5",
                          "0x1",
                          "262144",
                          "0-4294967295",
                          "99999999999999999999",
                          "0\n1",
                          "0-1\r\n"})
    EXPECT_EQ(read_cpu_list(bad), std::nullopt) << bad;
  EXPECT_EQ(read_cpu_list(std::string_view("0\0", 2)), std::nullopt);
}

TEST(Cores, CpusetFilesAreTheProcessesCgroupThenItsParents) {
  using Files = std::vector<std::string>;
  // cgroup v2 seen from the host (or a container sharing its cgroup namespace).
  EXPECT_EQ(cpuset_files("0::/system.slice/docker-1.scope\n", "/sys/fs/cgroup"),
            (Files{"/sys/fs/cgroup/system.slice/docker-1.scope/cpuset.cpus.effective",
                   "/sys/fs/cgroup/system.slice/cpuset.cpus.effective",
                   "/sys/fs/cgroup/cpuset.cpus.effective"}));
  EXPECT_EQ(cpuset_files("0::/\n", "/r"), Files{"/r/cpuset.cpus.effective"});  // its own namespace
  // cgroup v1 beside v2 (cpuset in v1): v1's files, the effective set first, then v2's.
  EXPECT_EQ(cpuset_files("4:memory:/x\n3:cpuset:/docker/ab\n0::/\n", "/r"),
            (Files{"/r/cpuset/docker/ab/cpuset.effective_cpus", "/r/cpuset/docker/ab/cpuset.cpus",
                   "/r/cpuset/docker/cpuset.effective_cpus", "/r/cpuset/docker/cpuset.cpus",
                   "/r/cpuset/cpuset.effective_cpus", "/r/cpuset/cpuset.cpus",
                   "/r/cpuset.cpus.effective"}));
  EXPECT_EQ(cpuset_files("2:cpu,cpuset:/", "/r"),
            (Files{"/r/cpu,cpuset/cpuset.effective_cpus", "/r/cpu,cpuset/cpuset.cpus"}));
  EXPECT_EQ(cpuset_files("0::/a:b", "/r"),  // a ':' in the path, no newline at the end
            (Files{"/r/a:b/cpuset.cpus.effective", "/r/cpuset.cpus.effective"}));
  // A cgroup outside the namespace's root: only the root's file.
  EXPECT_EQ(cpuset_files("0::/../../a\n", "/r"), Files{"/r/cpuset.cpus.effective"});
  // A '.' part is no directory of the namespace's either: no "/r/./a" or "/r/." files.
  EXPECT_EQ(cpuset_files("0::/./a\n", "/r"), Files{"/r/cpuset.cpus.effective"});
  for (const char* none : {"", "\n\n", "garbage", "1:name=systemd:/", "4:cpusetx:/a", "5::/a"})
    EXPECT_EQ(cpuset_files(none, "/r"), Files{}) << none;
}

TEST(Cores, CpusAllowedAtMostIsTheFirstCpusetThatIsAListElseOnline) {
  using Texts = std::vector<std::optional<std::string>>;
  EXPECT_EQ(cpus_allowed_at_most(Texts{"0-3,8,10-11\n"}, 64), 7);
  // Unreadable, empty or garbage: the next file (a parent) says.
  EXPECT_EQ(cpus_allowed_at_most(Texts{std::nullopt, "", "\n", "garbage", "2\n", "0-63"}, 64), 1);
  EXPECT_EQ(cpus_allowed_at_most(Texts{}, 64), 64);  // none: the online count
  EXPECT_EQ(cpus_allowed_at_most(Texts{std::nullopt, "", "x", "0-99999999999", "-"}, 64), 64);
  EXPECT_EQ(cpus_allowed_at_most(Texts{"0-127"}, 64), 64);  // never more than online
  EXPECT_EQ(cpus_allowed_at_most(Texts{"0-3"}, -1), 4);     // online unknown (sysconf's -1)
  EXPECT_EQ(cpus_allowed_at_most(Texts{"0-262143"}, 0), 262144);
}

// This process's cpuset: its affinity mask is within it, and it is within the online CPUs.
TEST(Cores, ThisProcessesCpusetHoldsItsMaskAndNoMoreThanTheOnlineCpus) {
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  ASSERT_GT(online, 0);
  const long allowed = cgroup_cpus_at_most(online);
  EXPECT_GE(allowed, static_cast<long>(usable_cpus().size()));
  EXPECT_LE(allowed, online);
}

// The kernel's own text of this thread's mask (/proc/thread-self/status), read independently.
std::vector<int> kernel_cpus_allowed() {
  std::ifstream in("/proc/thread-self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("Cpus_allowed_list:", 0) == 0) {
      std::string list = line.substr(line.find(':') + 1);
      list.erase(0, list.find_first_not_of(" \t"));
      return parse_cpu_list(list);
    }
  return {};
}

TEST(Cores, UsableCpusAreTheAffinityMaskNotTheOnlineCount) {
  EXPECT_EQ(usable_cpus(), kernel_cpus_allowed());
  // Narrowed to one CPU (as taskset -c or mpirun's binding does), the count is 1 however many are
  // online; hardware_concurrency still says every online CPU.
  const int one = usable_cpus().back();
  std::vector<int> seen;
  std::thread t([&] {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(one, &set);
    ASSERT_EQ(sched_setaffinity(0, sizeof(set), &set), 0);
    seen = usable_cpus();
  });
  t.join();
  EXPECT_EQ(seen, std::vector<int>{one});
}

TEST(Cores, PlaceTextRoundTrips) {
  const RankPlace p = parse_place(place_text({"node-7", {0, 1, 4}, true}));
  EXPECT_EQ(p.host, "node-7");
  EXPECT_EQ(p.cpus, (std::vector<int>{0, 1, 4}));
  EXPECT_TRUE(p.bound_by_mpirun);
  const RankPlace q = parse_place(place_text({"a\nb", {}, false}));  // whatever the name holds
  EXPECT_EQ(q.host, "a\nb");
  EXPECT_TRUE(q.cpus.empty());
  EXPECT_FALSE(q.bound_by_mpirun);
}

TEST(Cores, TheHostsCoresAreTheUnionOfItsRanksMasks) {
  // mpirun's default binding: ranks 0 and 2 on host a, one core each; rank 1 alone on b.
  const std::vector<RankPlace> places = {
      {"a", {0}, true}, {"b", {0, 1, 2, 3}, false}, {"a", {1}, true}};
  const HostCores a = host_cores(places, 2, 8, 6);
  EXPECT_EQ(a.cpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(a.ranks, (std::vector<int>{0, 2}));
  EXPECT_EQ(a.own, (std::vector<int>{1, 1}));
  EXPECT_EQ(a.online, 8);
  EXPECT_EQ(a.allowed, 6);
  EXPECT_FALSE(a.ranks_outnumber_any);
  EXPECT_EQ(host_cores(places, 1, 4, 4).cpus, (std::vector<int>{0, 1, 2, 3}));
  // Two ranks on one CPU of host a (taskset -c 0 mpirun --bind-to none): every rank, b's too,
  // sees that on some host the ranks outnumber the cores.
  const std::vector<RankPlace> shared = {
      {"a", {0}, false}, {"b", {0, 1}, false}, {"a", {0}, false}};
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(host_cores(shared, r, 2, 2).ranks_outnumber_any) << r;
}

// Outside a container: the cgroup allows every online CPU.
HostCores cores_of(const std::vector<RankPlace>& places, long online) {
  return host_cores(places, 0, online, online);
}

TEST(Cores, TwoRanksOnOneUsableCoreOfTwoOnline) {
  const std::string w = cores_warning(cores_of({{"a", {0}, false}, {"a", {0}, false}}, 2), 1);
  EXPECT_NE(w.find("2 ranks on this host, more than its 1 core(s) (CPUs 0 of its 2 online"),
            std::string::npos)
      << w;
  EXPECT_NE(w.find("start at most 1 rank(s) per host"), std::string::npos) << w;
}

TEST(Cores, ThreadsOnARankMpirunBoundToOneCoreNameTheBinding) {
  // mpirun -np 1 (bound to core 0) --threads 2 on a host of 2 cores.
  const std::string w = cores_warning(cores_of({{"a", {0}, true}}, 2), 2);
  EXPECT_NE(w.find("--threads 2, but rank(s) 0 on this host may run on only 1 core(s), as mpirun "
                   "bound them"),
            std::string::npos)
      << w;
  EXPECT_NE(w.find("--bind-to none"), std::string::npos) << w;
  EXPECT_NE(w.find("--map-by slot:PE=2"), std::string::npos) << w;
  // Two bound ranks of 2 threads on 4 cores: both named, each with 1 core.
  const std::string two = cores_warning(cores_of({{"a", {0}, true}, {"a", {1}, true}}, 4), 2);
  EXPECT_NE(two.find("rank(s) 0, 1 on this host may run on only 1 core(s) each"), std::string::npos)
      << two;
  // A rankfile's narrow rank (not mpirun's default) where the masks together have the cores.
  const std::string rf =
      cores_warning(cores_of({{"a", {0, 1, 2}, false}, {"a", {3}, false}}, 4), 2);
  EXPECT_NE(rf.find("rank(s) 1 on this host may run on only 1 core(s), by their affinity masks"),
            std::string::npos)
      << rf;
}

TEST(Cores, MoreThreadsThanTheHostHasAdviseFewerThreads) {
  // 2 bound ranks x 2 threads on 2 cores: unbinding would not help; fewer threads would.
  const std::string w = cores_warning(cores_of({{"a", {0}, true}, {"a", {1}, true}}, 2), 2);
  EXPECT_NE(w.find("--threads 2 x 2 rank(s) on this host is more compute threads than its 2 "
                   "core(s): "),
            std::string::npos)
      << w;
  EXPECT_NE(w.find("use --threads 1"), std::string::npos) << w;
  // taskset -c 0 on a singleton: its 1 usable core, named.
  const std::string t = cores_warning(cores_of({{"a", {0}, false}}, 2), 2);
  EXPECT_NE(t.find("more compute threads than its 1 core(s) (CPUs 0 of its 2 online"),
            std::string::npos)
      << t;
  // What fits says nothing: 2 ranks x 2 threads on 4 unbound cores, 1 thread on 1 bound core.
  EXPECT_EQ(cores_warning(cores_of({{"a", {0, 1, 2, 3}, false}, {"a", {0, 1, 2, 3}, false}}, 4), 2),
            "");
  EXPECT_EQ(cores_warning(cores_of({{"a", {0}, true}, {"a", {1}, true}}, 2), 1), "");
}

// In a container whose cpuset allows `allowed` of the host's `online` CPUs.
HostCores in_cpuset(const std::vector<RankPlace>& places, long allowed, long online) {
  return host_cores(places, 0, online, allowed);
}

constexpr const char* kWhyNarrow =
    ": the ranks' affinity masks, which taskset, a container's cpuset, the batch system or "
    "mpirun's binding narrow)";

// Inside a container the process can never have the CPUs outside its cpuset: the messages count
// the cpuset's, and the binding advice needs the cores there, not on the host.
TEST(Cores, InAContainerTheCpusetIsTheHost) {
  // taskset -c 0 in a container of 4 CPUs on a host of 64.
  EXPECT_EQ(cores_warning(in_cpuset({{"a", {0}, false}, {"a", {0}, false}}, 4, 64), 1),
            std::string("2 ranks on this host, more than its 1 core(s) (CPUs 0 of the 4 its "
                        "cgroup's cpuset allows") +
                kWhyNarrow +
                ": the ranks take turns on the cores and every all-reduce waits for the last of "
                "them, which is slower than fewer ranks; start at most 1 rank(s) per host");
  // Every CPU of the cpuset (docker --cpuset-cpus 0-1): nothing narrower to explain.
  EXPECT_EQ(
      cores_warning(
          in_cpuset({{"a", {0, 1}, false}, {"a", {0, 1}, false}, {"a", {0, 1}, false}}, 2, 64), 1),
      "3 ranks on this host, more than its 2 core(s): the ranks take turns on the cores and "
      "every all-reduce waits for the last of them, which is slower than fewer ranks; start "
      "at most 2 rank(s) per host");
  // mpirun bound the rank to 1 of the cpuset's 2 CPUs, --threads 4: unbinding gives 2 cores, not
  // the host's 64, so the advice is fewer threads.
  EXPECT_EQ(cores_warning(in_cpuset({{"a", {0}, true}}, 2, 64), 4),
            std::string("--threads 4 x 1 rank(s) on this host is more compute threads than its 1 "
                        "core(s) (CPUs 0 of the 2 its cgroup's cpuset allows") +
                kWhyNarrow +
                ": oversubscribed threads wait for each other at every parallel loop, which can be "
                "many times slower; use --threads 1");
  // Where the cpuset has the cores, the binding and its fix, counted in the cpuset.
  const std::string bound = cores_warning(in_cpuset({{"a", {0}, true}}, 4, 64), 2);
  EXPECT_NE(bound.find("may run on only 1 core(s), as mpirun bound them"), std::string::npos)
      << bound;
  EXPECT_NE(bound.find("take turns on its core(s) while its cgroup's cpuset allows 4 cores; start "
                       "mpirun with --bind-to none"),
            std::string::npos)
      << bound;
  // Outside one (the cgroup allows every online CPU) the host's online count, as before.
  EXPECT_EQ(cores_warning(in_cpuset({{"a", {0}, true}}, 2, 2), 4),
            std::string("--threads 4 x 1 rank(s) on this host is more compute threads than its 1 "
                        "core(s) (CPUs 0 of its 2 online") +
                kWhyNarrow +
                ": oversubscribed threads wait for each other at every parallel loop, which can be "
                "many times slower; use --threads 1");
}

// ---- data_digest ----

ImageSet small_set() {
  ImageSet s;
  s.n = 3, s.rows = 28, s.cols = 28;
  s.images.resize(3 * 28 * 28);
  for (size_t i = 0; i < s.images.size(); ++i) s.images[i] = static_cast<uint8_t>(i * 7 % 251);
  s.labels = {1, 4, 9};
  return s;
}

TEST(DataDigest, EqualSetsEqualDigestsAndOneChangeDiffers) {
  const ImageSet a = small_set(), b = small_set();
  EXPECT_EQ(data_digest(a), data_digest(b));
  EXPECT_EQ(data_digest(a).rfind("images 3 of 28x28x1, checksum 0x", 0), 0u) << data_digest(a);

  for (size_t px : {size_t{0}, size_t{28 * 28 + 13}, a.images.size() - 1}) {
    ImageSet c = small_set();
    c.images[px] ^= 1;  // one pixel, one bit
    EXPECT_NE(data_digest(c), data_digest(a)) << "pixel " << px;
  }
  for (size_t i = 0; i < a.labels.size(); ++i) {
    ImageSet c = small_set();
    c.labels[i] = static_cast<dpt::Label>(c.labels[i] + 1);
    EXPECT_NE(data_digest(c), data_digest(a)) << "label " << i;
  }
  // Swapping a label between images changes the set too.
  ImageSet d = small_set();
  std::swap(d.labels[0], d.labels[1]);
  EXPECT_NE(data_digest(d), data_digest(a));
  // The same bytes read as another shape (a rank given another --data-format) are another set.
  ImageSet e = small_set();
  e.rows = 14, e.cols = 14, e.channels = 4;
  EXPECT_NE(data_digest(e), data_digest(a));
}

// Labels became 16-bit: a set of at most 256 classes must keep the digest it had when labels were
// bytes (checkpoints record it, and a resume compares), i.e. the checksum of the images, then of
// the labels one byte each; past 256 classes both bytes count, so 1 and 257 are different sets.
TEST(DataDigest, ByteClassesKeepTheOldDigestWiderOnesUseBothBytes) {
  ImageSet a = small_set();
  a.num_classes = 10;
  const std::vector<uint8_t> bytes = {1, 4, 9};
  std::ostringstream want;
  want << "images 3 of 28x28x1, checksum 0x" << std::hex
       << dpt::checksum(bytes.data(), bytes.size(),
                        dpt::checksum(a.images.data(), a.images.size()));
  EXPECT_EQ(data_digest(a), want.str());
  ImageSet wide = small_set(), wider = small_set();
  wide.num_classes = wider.num_classes = 1000;
  wider.labels[0] = static_cast<dpt::Label>(wide.labels[0] + 256);
  EXPECT_NE(data_digest(wide), data_digest(wider));
  EXPECT_NE(data_digest(wide), data_digest(a));
}

// ---- check_outputs ----

TEST_F(PreflightDir, CheckOutputsRefusesAFifoAtEveryOutput) {
  const std::string f = fifo("out.fifo");
  const std::vector<std::pair<std::string, std::string TrainConfig::*>> outputs = {
      {"--report", &TrainConfig::report},
      {"--trace", &TrainConfig::trace},
      {"--metrics", &TrainConfig::metrics},
      {"--save", &TrainConfig::save}};
  for (const auto& [flag, field] : outputs) {
    SCOPED_TRACE(flag);
    TrainConfig cfg;
    cfg.*field = f;
    const Watchdog dog = fail_if_blocked("check_outputs " + flag, 20);
    expect_input_error([&] { check_outputs(cfg); }, {flag, f});
  }
  // --checkpoint-path only matters when checkpoints are written.
  TrainConfig cfg;
  cfg.checkpoint_path = f;
  EXPECT_NO_THROW(check_outputs(cfg));
  cfg.checkpoint_every = 1;
  expect_input_error([&] { check_outputs(cfg); }, {"--checkpoint-path", f});
  struct stat st {};
  ASSERT_EQ(::lstat(f.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

TEST_F(PreflightDir, CheckOutputsRefusesAMissingDirectory) {
  TrainConfig cfg;
  cfg.save = path("no/such/dir/model.safetensors");
  expect_input_error([&] { check_outputs(cfg); }, {"--save", cfg.save});
  TrainConfig cfg2;
  cfg2.checkpoint_every = 1;
  cfg2.checkpoint_path = path("missing/ck.safetensors");
  expect_input_error([&] { check_outputs(cfg2); }, {"--checkpoint-path", cfg2.checkpoint_path});
}

TEST_F(PreflightDir, CheckOutputsRefusesAResumeThatIsNotAFile) {
  const Watchdog dog = fail_if_blocked("check_outputs --resume", 20);
  TrainConfig cfg;
  cfg.resume = fifo("ck.fifo");
  const auto t0 = std::chrono::steady_clock::now();
  expect_input_error([&] { check_outputs(cfg); }, {"--resume", cfg.resume});
  EXPECT_LT(seconds_since(t0), 2.0);
  cfg.resume = dir_;
  expect_input_error([&] { check_outputs(cfg); }, {"--resume", dir_});
  cfg.resume = path("absent.safetensors");
  expect_input_error([&] { check_outputs(cfg); }, {"--resume", cfg.resume});
}

TEST_F(PreflightDir, CheckOutputsAcceptsAbsentFilesAndResumeAuto) {
  TrainConfig cfg;
  cfg.metrics = path("m.jsonl");
  cfg.save = path("model.safetensors");
  cfg.report = path("report.svg");
  cfg.trace = path("trace.json");
  cfg.checkpoint_every = 1;
  cfg.checkpoint_path = path("ck.safetensors");
  cfg.resume = "auto";
  EXPECT_NO_THROW(check_outputs(cfg));
  for (const auto& p : {cfg.metrics, cfg.save, cfg.report, cfg.trace, cfg.checkpoint_path})
    EXPECT_FALSE(std::filesystem::exists(p)) << p << " created by a check";
  // Existing regular files, and --resume naming one: the run's own checkpoint, which it replaces
  // (--resume naming another output, such as --save, would be destroyed by it: refused).
  for (const auto& p : {cfg.metrics, cfg.save, cfg.checkpoint_path}) std::ofstream(p) << "x";
  cfg.resume = cfg.checkpoint_path;
  EXPECT_NO_THROW(check_outputs(cfg));
  // Nothing given at all.
  EXPECT_NO_THROW(check_outputs(TrainConfig{}));
}

// Killed writers' temporaries of every checkpoint name (--checkpoint-path's and its step-named
// files') are removed by the pre-flight once it holds the lock, each logged exactly once naming
// --checkpoint-path (the CheckpointManager removed the step-named ones in a second scan, logged
// without the flag); a live writer's, a symlink, another file's and an operator's copy stay. A
// --checkpoint-path that is a symlink into another directory: its file's temporaries there, the
// step names' beside the link.
TEST_F(PreflightDir, CheckOutputsRemovesDeadCheckpointTemporariesOnceEach) {
  const std::string elsewhere = path("elsewhere");
  std::filesystem::create_directories(elsewhere);
  // pid 4194304 is no process: Linux allocates pids below pid_max, which is at most 2^22 (4194303
  // is a pid where systemd sets pid_max to that limit, as it does by default since v243).
  const std::vector<std::string> dead = {path("ck.st.tmp.4194304"),
                                         path("ck.step4.st.tmp.4194304.Ab12"),
                                         path("ck.step10.st.tmp.4194304.Cd34")};
  const std::vector<std::string> kept = {
      path("other.st.tmp.4194304"), path("ck.step0004.st.tmp.4194304"),
      path("ck.step4.st.tmp." + std::to_string(::getpid())), path("ck.st.tmp.4194302")};
  for (const std::string& f : dead) std::ofstream(f) << "x";
  for (size_t i = 0; i + 1 < kept.size(); ++i) std::ofstream(kept[i]) << "x";
  std::filesystem::create_symlink(path("victim"), kept.back());
  std::ofstream(path("victim")) << "keep";
  TrainConfig cfg;
  cfg.checkpoint_every = 1;
  cfg.keep_checkpoints = 2;
  cfg.checkpoint_path = path("ck.st");
  auto removals = [](const std::string& log, const std::string& file) {
    const std::string line = "removed " + file + ", left by a killed writer of --checkpoint-path\n";
    size_t n = 0;
    for (size_t at = log.find(line); at != std::string::npos; at = log.find(line, at + 1)) ++n;
    return n;
  };
  testing::internal::CaptureStdout();
  std::vector<OutputLock> locks = check_outputs(cfg);
  std::string log = testing::internal::GetCapturedStdout();
  for (const std::string& f : dead) {
    EXPECT_FALSE(std::filesystem::exists(f)) << f;
    EXPECT_EQ(removals(log, f), 1u) << f << " in:\n" << log;
  }
  for (const std::string& f : kept)
    EXPECT_TRUE(std::filesystem::exists(std::filesystem::symlink_status(f))) << f;
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 3) << log;
  locks.clear();

  // --checkpoint-path a symlink to elsewhere/real.st.
  const std::string real_dead = elsewhere + "/real.st.tmp.4194304", step_dead = dead[1];
  std::ofstream(real_dead) << "x";
  std::ofstream(step_dead) << "x";
  std::ofstream(elsewhere + "/real.st") << "x";
  cfg.checkpoint_path = path("link.st");
  std::filesystem::create_symlink(elsewhere + "/real.st", cfg.checkpoint_path);
  const std::string link_step_dead = path("link.step6.st.tmp.4194304");
  std::ofstream(link_step_dead) << "x";
  testing::internal::CaptureStdout();
  locks = check_outputs(cfg);
  log = testing::internal::GetCapturedStdout();
  for (const std::string& f : {real_dead, link_step_dead}) {
    EXPECT_FALSE(std::filesystem::exists(f)) << f;
    EXPECT_EQ(removals(log, f), 1u) << f << " in:\n" << log;
  }
  EXPECT_TRUE(std::filesystem::exists(step_dead)) << "another --checkpoint-path's temporary";
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 2) << log;
}

// The checkpoint directory is surveyed by check_outputs, once, holding --checkpoint-path's lock,
// and handed out for the rest of the start-up (the activation type, --resume auto's choice, claim):
// under --resume auto or with checkpoints to write, every entry at a checkpoint name and no other
// file; a run that neither resumes by auto nor writes checkpoints takes none.
TEST_F(PreflightDir, CheckOutputsHandsOutOneSurveyOfTheCheckpoints) {
  std::ofstream(path("ck.step3.st")) << "junk";
  std::ofstream(path("ck.step2.st")).close();
  std::ofstream(path("ck.st")) << "x";
  std::ofstream(path("other.st")) << "x";
  std::ofstream(path("ck.step03.st")) << "an operator's copy";
  TrainConfig cfg;
  cfg.checkpoint_path = path("ck.st");
  cfg.keep_checkpoints = 3;
  auto names = [](const CheckpointSurvey& s) {
    std::vector<std::string> out;
    for (const CheckpointInfo& f : s.entries) out.push_back(f.path);
    return out;
  };
  for (const auto& [resume, every] :
       std::vector<std::pair<std::string, int>>{{"auto", 0}, {"auto", 1}, {path("ck.st"), 1}}) {
    SCOPED_TRACE(resume + " " + std::to_string(every));
    cfg.resume = resume;
    cfg.checkpoint_every = every;
    CheckpointSurvey survey;
    const std::vector<OutputLock> locks = check_outputs(cfg, {}, &survey);
    EXPECT_TRUE(survey.taken);
    EXPECT_EQ(names(survey),
              (std::vector<std::string>{path("ck.step3.st"), path("ck.step2.st"), path("ck.st")}));
    EXPECT_EQ(locks.size(), every ? 1u : 0u);
  }
  cfg.resume = path("ck.st");
  cfg.checkpoint_every = 0;
  CheckpointSurvey none;
  check_outputs(cfg, {}, &none);
  EXPECT_FALSE(none.taken);
  EXPECT_TRUE(none.entries.empty());
}

// An output naming one of the run's inputs would destroy it: refused naming both flags and the
// file, by any spelling (a symlink, "dir/../"), before the file is touched. The one pairing
// allowed is a resume's: --checkpoint-path is the checkpoint resumed (FILE, or one auto may pick).
TEST_F(PreflightDir, CheckOutputsRefusesAnOutputThatIsAnInput) {
  const std::string in = path("in.st"), data = path("train-images-idx3-ubyte");
  std::ofstream(in) << "the input";
  std::ofstream(data) << "the data";
  ASSERT_EQ(::symlink(in.c_str(), path("link.st").c_str()), 0);
  ASSERT_EQ(::mkdir(path("sub").c_str(), 0700), 0);
  const std::vector<std::pair<std::string, std::string TrainConfig::*>> outputs = {
      {"--metrics", &TrainConfig::metrics}, {"--save", &TrainConfig::save},
      {"--report", &TrainConfig::report},   {"--trace", &TrainConfig::trace},
      {"--output", &TrainConfig::output},   {"--checkpoint-path", &TrainConfig::checkpoint_path}};
  const std::vector<std::pair<std::string, std::string TrainConfig::*>> inputs = {
      {"--init-from", &TrainConfig::init_from},
      {"--load", &TrainConfig::load},
      {"--resume", &TrainConfig::resume}};
  for (const auto& [out_flag, out] : outputs) {
    for (const std::string& spelling : {in, path("link.st"), path("sub/../in.st")})
      for (const auto& [in_flag, input] : inputs) {
        if (out_flag == "--checkpoint-path" && in_flag == "--resume") continue;  // below
        SCOPED_TRACE(out_flag + " " + spelling + " " + in_flag);
        TrainConfig cfg;
        cfg.checkpoint_every = 1;
        cfg.checkpoint_path = path("ck.st");
        cfg.*out = spelling;
        cfg.*input = in;
        expect_input_error(
            [&] { check_outputs(cfg); },
            {out_flag + " " + spelling + " is the file " + in_flag + " reads (" + in});
      }
    // The data set's files are inputs too.
    SCOPED_TRACE(out_flag + " --data");
    TrainConfig cfg;
    cfg.checkpoint_every = 1;
    cfg.checkpoint_path = path("ck.st");
    cfg.*out = data;
    expect_input_error(
        [&] {
          check_outputs(cfg, {path("t10k-images-idx3-ubyte"), data});
        },
        {out_flag + " " + data + " is the file --data reads (" + data});
  }
  std::ifstream f(in), g(data);
  std::string text, data_text;
  std::getline(f, text);
  std::getline(g, data_text);
  EXPECT_EQ(text, "the input");
  EXPECT_EQ(data_text, "the data");
  EXPECT_FALSE(std::filesystem::exists(in + ".lock")) << "locked before the refusal";
  // A run resumes from its own checkpoint and replaces it: allowed, by FILE and by auto.
  TrainConfig resume;
  resume.checkpoint_every = 1;
  resume.checkpoint_path = path("link.st");
  resume.resume = in;
  EXPECT_NO_THROW(check_outputs(resume));
  resume.resume = "auto";
  resume.checkpoint_path = in;
  EXPECT_NO_THROW(check_outputs(resume));
  // Under auto every checkpoint file it may pick is an input to the other outputs, even when this
  // run writes no checkpoints (--checkpoint-every 0).
  resume.checkpoint_every = 0;
  resume.metrics = in;
  expect_input_error([&] { check_outputs(resume); },
                     {"--metrics " + in + " is the file --resume auto reads (" + in});
}

// --metrics is appended to, so a character device (/dev/null) is fine there; every other output is
// replaced by the atomic writer and must be refused as a device, whatever --metrics names.
TEST_F(PreflightDir, CheckOutputsAcceptsADeviceOnlyForMetrics) {
  TrainConfig cfg;
  cfg.metrics = "/dev/null";
  EXPECT_NO_THROW(check_outputs(cfg));
  const std::vector<std::pair<std::string, std::string TrainConfig::*>> replaced = {
      {"--save", &TrainConfig::save},
      {"--report", &TrainConfig::report},
      {"--trace", &TrainConfig::trace}};
  for (const auto& [flag, field] : replaced) {
    SCOPED_TRACE(flag);
    TrainConfig alone;
    alone.*field = "/dev/null";
    expect_input_error([&] { check_outputs(alone); }, {flag, "/dev/null"});
    TrainConfig both = alone;
    both.metrics = "/dev/null";  // the same path at --metrics must not make it a stream
    SCOPED_TRACE("--metrics /dev/null as well");
    expect_input_error([&] { check_outputs(both); }, {flag, "/dev/null"});
  }
}

// ---- check_memory / bytes_per_image ----

TEST(CheckMemory, NoCheckWithoutANumberOrNotThisRanks) {
  TrainConfig cfg;  // lenet, batch 256
  DeviceMemory off;
  off.checks = false, off.free_bytes = 1, off.where = "on host x";
  EXPECT_NO_THROW(check_memory(cfg, 1, 10, 10000, off));
  DeviceMemory unknown;
  unknown.checks = true, unknown.free_bytes = -1, unknown.where = "on host x";
  EXPECT_NO_THROW(check_memory(cfg, 1, 10, 10000, unknown));
}

TEST(CheckMemory, TooLittleIsAnInputErrorNamingTheBatchAndThePlace) {
  TrainConfig cfg;
  DeviceMemory tiny;
  tiny.checks = true, tiny.free_bytes = 1 << 20, tiny.where = "on GPU 7 of host testhost";
  expect_input_error([&] { check_memory(cfg, 1, 10, 10000, tiny); }, {"--batch-size", tiny.where});
  DeviceMemory huge = tiny;
  huge.free_bytes = 1e15;
  EXPECT_NO_THROW(check_memory(cfg, 1, 10, 10000, huge));
}

TEST(CheckMemory, TheEstimateIsPerImageTimesBatchPlusExtraTimesSharing) {
  TrainConfig cfg;
  cfg.batch_size = 256;
  cfg.eval_batch_size = 1000;
  const int world = 2;
  const int64_t test_n = 500;  // fewer than --eval-batch-size: evaluation batches hold 500
  const auto [train, eval] = bytes_per_image(cfg.model, 10);
  DeviceMemory mem;
  mem.checks = true, mem.sharing = 2, mem.extra = 3e6, mem.where = "on host h";
  const double need = (train * (256 / world) + eval * 500.0 + mem.extra) * mem.sharing;
  mem.free_bytes = need;
  EXPECT_NO_THROW(check_memory(cfg, world, 10, test_n, mem));
  mem.free_bytes = need * (1 - 1e-6);
  expect_input_error([&] { check_memory(cfg, world, 10, test_n, mem); },
                     {"--batch-size 256", "on host h"});
  // Without evaluation (--eval-every 0) only the training step counts.
  cfg.eval_every = 0;
  const double train_only = (train * (256 / world) + mem.extra) * mem.sharing;
  mem.free_bytes = train_only;
  EXPECT_NO_THROW(check_memory(cfg, world, 10, test_n, mem));
  mem.free_bytes = train_only * (1 - 1e-6);
  expect_input_error([&] { check_memory(cfg, world, 10, test_n, mem); },
                     {"--batch-size 256", "on host h"});
}

// evaluate and predict score batches of --eval-batch-size and nothing else: no training step at
// --batch-size (not one of their flags), no gradients or optimizer state, so the model costs its
// values and oneDNN's forward weight copy (2 floats a parameter), and the refusal names
// --eval-batch-size. A 700x700 LeNet evaluated one image at a time was refused for a training
// step of 256 images.
TEST(CheckMemory, EvaluateCountsOnlyItsBatchAndTheModelsInferenceBytes) {
  const Shape input{64, 64, 1};
  TrainConfig cfg;  // --batch-size 256 as default, which evaluate must not count
  cfg.command = "evaluate";
  cfg.eval_batch_size = 3;
  cfg.eval_every = 0;  // a training flag: evaluate scores its batches whatever it says
  const auto [train, eval] = bytes_per_image(cfg.model, 10, input);
  const double params = static_cast<double>(count_parameters(cfg.model, 10, input));
  DeviceMemory mem;
  mem.checks = true, mem.sharing = 2, mem.extra = 1e6, mem.model_fixed = true;
  mem.where = "on host h";
  const double need = (eval * 3 + mem.extra + 4 * params * 2) * mem.sharing;
  mem.free_bytes = need;
  EXPECT_NO_THROW(check_memory(cfg, 1, 10, 100, mem, input));
  cfg.command = "predict";
  EXPECT_NO_THROW(check_memory(cfg, 1, 10, 100, mem, input));
  mem.free_bytes = need * (1 - 1e-6);
  try {
    check_memory(cfg, 1, 10, 100, mem, input);
    ADD_FAILURE() << "predict fitted in less than it needs";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(what.find("--eval-batch-size 3: predict needs about"), std::string::npos) << what;
    EXPECT_EQ(what.find("--batch-size"), std::string::npos) << what;
    EXPECT_EQ(what.find("optimizer"), std::string::npos) << what;
  }
  // Fewer test images than --eval-batch-size: batches of the test set's size.
  mem.free_bytes = (eval * 2 + mem.extra + 4 * params * 2) * mem.sharing;
  EXPECT_NO_THROW(check_memory(cfg, 1, 10, 2, mem, input));
  // Training with the same memory is refused: the step and its optimizer state are what evaluate
  // leaves out.
  mem.free_bytes = need;
  cfg.command = "train";
  expect_input_error([&] { check_memory(cfg, 1, 10, 100, mem, input); }, {"--batch-size 256"});
  EXPECT_GT(train, 0);
}

// On the host each rank's model is counted too (DeviceMemory::model_fixed): what building it
// allocates (parameters, their gradients, the BatchNorm buffers) and, per parameter, the optimizer
// state and two weight copies in the kernels' layouts: 5 floats under sgd, 6 under adamw.
TEST(CheckMemory, OnTheHostEachRanksModelCountsToo) {
  const int64_t before = Tensor::live_bytes();
  auto m = make_model("resnet18", 10, cpu_backend(), {28, 28, 1});
  const double built = static_cast<double>(Tensor::live_bytes() - before);
  const double params = static_cast<double>(m->num_parameters());
  const double sgd = model_fixed_bytes("resnet18", 10, {28, 28, 1}, "sgd");
  EXPECT_GT(built, 2 * 4 * params * 0.99);  // values and gradients, as Tensors
  EXPECT_GT(sgd, built);
  EXPECT_DOUBLE_EQ(sgd, 4 * params * 5);
  EXPECT_DOUBLE_EQ(model_fixed_bytes("resnet18", 10, {28, 28, 1}, "adamw") - sgd, 4 * params);
  // Inference (no optimizer): the values and one weight copy.
  EXPECT_DOUBLE_EQ(model_fixed_bytes("resnet18", 10, {28, 28, 1}, ""), 4 * params * 2);
  // The pre-flight counts without building: the same count for every model and stem, and the
  // same input refusals as make_model.
  for (const ModelSpec& spec : models())
    for (const Shape& in : {Shape{28, 28, 1}, Shape{64, 48, 3}}) {
      if (!model_input_problem(spec.name, in).empty()) continue;
      EXPECT_EQ(count_parameters(spec.name, 7, in),
                make_model(spec.name, 7, cpu_backend(), in)->num_parameters())
          << spec.name << " " << shape_str(in);
    }
  expect_input_error([] { count_parameters("lenet", 10, {2, 2, 1}); }, {"--model lenet"});
  expect_input_error(
      [] {
        count_parameters("lenet", 10, {28, 28, 1}, {"cifar", false});
      },
      {"--stem cifar"});
  // LeNet's classifier grows with the image.
  EXPECT_GT(model_fixed_bytes("lenet", 10, {56, 56, 1}, "sgd"),
            model_fixed_bytes("lenet", 10, {28, 28, 1}, "sgd"));
  // check_memory adds it per rank, and says so.
  TrainConfig cfg;
  cfg.model = "resnet18";
  cfg.batch_size = 64;
  cfg.eval_every = 0;
  DeviceMemory mem;
  mem.checks = true, mem.sharing = 2, mem.model_fixed = true, mem.where = "on host h";
  const double train = bytes_per_image("resnet18", 10).first;
  const double need = (train * 32 + sgd) * 2;
  mem.free_bytes = need;
  EXPECT_NO_THROW(check_memory(cfg, 2, 10, 100, mem));
  mem.free_bytes = need * (1 - 1e-6);
  expect_input_error([&] { check_memory(cfg, 2, 10, 100, mem); },
                     {"--batch-size 64", "optimizer state and weight copies"});
  mem.model_fixed = false;  // a GPU's `extra` covers it instead
  EXPECT_NO_THROW(check_memory(cfg, 2, 10, 100, mem));
}

TEST(BytesPerImage, TrainingCostsMoreAndResnetMore) {
  const auto [lt, le] = bytes_per_image("lenet", 10);
  EXPECT_GT(le, 0);
  EXPECT_GT(lt, le);
  const auto [rt, re] = bytes_per_image("resnet18", 10);
  EXPECT_GT(re, 0);
  EXPECT_GT(rt, re);
  EXPECT_GT(rt, lt);
  EXPECT_GT(re, le);
  // The same probe gives the same answer.
  const auto again = bytes_per_image("lenet", 10);
  EXPECT_EQ(again.first, lt);
  EXPECT_EQ(again.second, le);
}

// With 16-bit activations every activation and activation gradient takes two bytes instead of
// four; the float input (the probe's own x), the float logits and their gradient stay: the bytes
// per image fall to about half, and by far less than the float parts could explain.
TEST(BytesPerImage, Bf16ActivationsHalveThem) {
  for (const char* model : {"lenet", "resnet18"}) {
    SCOPED_TRACE(model);
    const auto f32 = bytes_per_image(model, 10, {28, 28, 1}, DType::kF32);
    const auto b16 = bytes_per_image(model, 10, {28, 28, 1}, DType::kBF16);
    EXPECT_GT(b16.first / f32.first, 0.45);
    EXPECT_LT(b16.first / f32.first, 0.6);
    EXPECT_GT(b16.second / f32.second, 0.45);
    EXPECT_LT(b16.second / f32.second, 0.6);
  }
}

// Images above 32x32 are probed at 32x32 and scaled by the area. The scaling is what the probe
// measures below that size: ResNet-18's bytes per image grow with H x W (16x16 -> 32x32: 4x).
TEST(CheckMemory, BytesPerImageGrowWithTheImageArea) {
  const auto small = bytes_per_image("resnet18", 10, {16, 16, 3});
  const auto mid = bytes_per_image("resnet18", 10, {32, 32, 3});
  EXPECT_NEAR(mid.first / small.first, 4.0, 0.4);
  EXPECT_NEAR(mid.second / small.second, 4.0, 0.4);
  const auto big = bytes_per_image("resnet18", 10, {64, 64, 3});
  EXPECT_DOUBLE_EQ(big.first, 4 * mid.first);
  EXPECT_DOUBLE_EQ(big.second, 4 * mid.second);
}

// ---- agree_on_input at world size 1 ----

TEST(AgreeOnInput, InputErrorBecomesAgreed) {
  auto comm = test::world_comm(60);
  ASSERT_EQ(comm->size(), 1);
  try {
    agree_on_input(*comm, "elsewhere", [] { DPT_INPUT_CHECK(false, "--data /x: bad magic"); });
    ADD_FAILURE() << "nothing thrown";
  } catch (const AgreedInputError& e) {
    EXPECT_EQ(std::string(e.what()), "--data /x: bad magic");
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_FALSE(e.quiet);  // this rank failed itself: it prints
  }
}

TEST(AgreeOnInput, InternalErrorPropagatesAsIs) {
  auto comm = test::world_comm(60);
  try {
    agree_on_input(*comm, "elsewhere", [] { DPT_CHECK(1 + 1 == 3, "arithmetic broke"); });
    ADD_FAILURE() << "nothing thrown";
  } catch (const AgreedInputError& e) {
    ADD_FAILURE() << "an internal error became an agreed input error: " << e.what();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
    EXPECT_NE(std::string(e.what()).find("arithmetic broke"), std::string::npos) << e.what();
  }
  EXPECT_THROW(
      agree_on_input(*comm, "elsewhere", [] { throw std::logic_error("not a dpt::Error"); }),
      std::logic_error);
  // The communicator is still in step afterwards (no collective was left half done).
  int32_t one = 1;
  comm->allreduce(&one, 1);
  EXPECT_EQ(one, 1);
}

TEST(AgreeOnInput, NoErrorNothingThrown) {
  auto comm = test::world_comm(60);
  int calls = 0;
  EXPECT_NO_THROW(agree_on_input(*comm, "elsewhere", [&] { ++calls; }));
  EXPECT_EQ(calls, 1);
}

// ---- run_preflight ----

TEST_F(PreflightDir, RunPreflightOnSyntheticData) {
  const Watchdog dog = fail_if_blocked("run_preflight on synthetic data", 120);
  test::write_synthetic_dataset(dir_, 96, 40, 3);
  TrainConfig cfg;
  cfg.data = dir_;
  cfg.device = "cpu";
  cfg.quiet = true;
  cfg.batch_size = 32;
  auto comm = test::world_comm(60);
  const Preflight pf = run_preflight(cfg, *comm);
  ASSERT_EQ(pf.hosts.size(), 1u);
  EXPECT_EQ(pf.hosts[0], comm->host());
  EXPECT_EQ(pf.local_rank, 0);
  EXPECT_EQ(pf.ranks_here, 1);
  ASSERT_NE(pf.device, nullptr);
  EXPECT_STREQ(pf.device->kind(), "cpu");
  EXPECT_EQ(pf.train.n, 96);
  EXPECT_EQ(pf.test.n, 40);
  EXPECT_EQ(pf.train.rows, 28);
  EXPECT_EQ(pf.train.cols, 28);
  EXPECT_EQ(pf.train.images.size(), 96u * 784);
  EXPECT_EQ(pf.test.labels.size(), 40u);
  // The training set as it is on disk, read by the IDX reader alone.
  EXPECT_EQ(pf.train.images, read_idx(dir_ + "/train-images-idx3-ubyte").data);
  const std::vector<uint8_t> on_disk = read_idx(dir_ + "/train-labels-idx1-ubyte").data;
  EXPECT_EQ(pf.train.labels, std::vector<dpt::Label>(on_disk.begin(), on_disk.end()));
}

TEST_F(PreflightDir, RunPreflightRefusesAFifoAsData) {
  const std::string good = path("good"), bad = path("bad");
  std::filesystem::create_directories(good);
  std::filesystem::create_directories(bad);
  test::write_synthetic_dataset(good, 64, 20, 4);
  for (const char* name :
       {"train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"})
    std::filesystem::copy_file(good + "/" + name, bad + "/" + name);
  const std::string poisoned = bad + "/train-images-idx3-ubyte";
  ASSERT_EQ(::mkfifo(poisoned.c_str(), 0600), 0);

  TrainConfig cfg;
  cfg.data = bad;
  cfg.device = "cpu";
  cfg.quiet = true;
  cfg.batch_size = 32;
  auto comm = test::world_comm(60);
  const Watchdog dog = fail_if_blocked(
      "run_preflight with a FIFO as the training images (the read blocked on it)", 20);
  const auto t0 = std::chrono::steady_clock::now();
  expect_input_error<AgreedInputError>([&] { run_preflight(cfg, *comm); }, {poisoned});
  EXPECT_LT(seconds_since(t0), 5.0);
  struct stat st {};
  ASSERT_EQ(::lstat(poisoned.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

}  // namespace
}  // namespace dpt
