// The driver's small components on their own: the device registry (what the CPU device offers
// and which rank checks its memory), stop signals (a signal becomes the agreed stop, and stays
// pending until asked), the host's memory (DPT_MEMORY_AVAILABLE, the data set's copies against it)
// and the non-finite guard (skip up to the bound, then stop naming the step); the --trace writer's
// bound on the spans it keeps.
// One rank (an MPI singleton).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "cpu/cpu_backend.h"
#include "dpt/comm.h"
#include "dpt/config.h"
#include "dpt/ddp.h"
#include "dpt/device.h"
#include "dpt/engine.h"
#include "dpt/error.h"
#include "dpt/preflight.h"
#include "dpt/run.h"
#include "dpt/trace.h"
#include "engine_rig.h"
#include "test_util.h"
#include "train/guard.h"
#include "train/signals.h"

namespace dpt {
namespace {

TEST(DeviceRegistry, CpuDeviceOffersTheCpuOperationsAndNoTransport) {
  DeviceRequest r;
  r.kind = "cpu";
  r.local_rank = 0;
  r.ranks_here = 3;
  auto d = open_device(r);
  EXPECT_STREQ(d->kind(), "cpu");
  EXPECT_EQ(&d->ops(), &cpu_backend());
  auto comm = test::world_comm();
  float g[4] = {};
  EXPECT_EQ(d->transport(*comm, g, 4, DType::kF32), nullptr);  // the Reducer's MPI thread
  const DeviceMemory m = d->memory(0);
  EXPECT_TRUE(m.checks);  // a host's first rank checks for every rank there
  EXPECT_EQ(m.sharing, 3);
  EXPECT_EQ(m.extra, 0);
  EXPECT_EQ(m.where, "on this host");
  EXPECT_GT(m.free_bytes, 0);
  EXPECT_EQ(m.free_bytes > 0, host_available_bytes() > 0);
  r.local_rank = 1;
  const DeviceMemory other = open_device(r)->memory(1);
  EXPECT_FALSE(other.checks);  // the other ranks of the host do not check again
}

// DPT_MEMORY_AVAILABLE replaces the host's figure (bytes, or K/M/G/T); a bad value names it.
TEST(DeviceRegistry, MemoryAvailableOverride) {
  struct Env {
    explicit Env(const char* v) { setenv("DPT_MEMORY_AVAILABLE", v, 1); }
    ~Env() { unsetenv("DPT_MEMORY_AVAILABLE"); }
  };
  {
    Env e("123456");
    EXPECT_EQ(host_memory().bytes, 123456);
    EXPECT_EQ(host_memory().source, "DPT_MEMORY_AVAILABLE");
  }
  {
    Env e("3G");
    EXPECT_EQ(host_available_bytes(), 3.0 * (1 << 30));
  }
  for (const char* bad : {"0", "-5", "1.5G", "12X", "G", "1KB", " 12"}) {
    Env e(bad);
    try {
      host_memory();
      ADD_FAILURE() << bad << " was taken";
    } catch (const Error& err) {
      EXPECT_EQ(err.kind(), ErrorKind::kInput) << bad;
      EXPECT_NE(std::string(err.what()).find(std::string("DPT_MEMORY_AVAILABLE=") + bad),
                std::string::npos)
          << err.what();
    }
  }
  EXPECT_NE(host_memory().source, "DPT_MEMORY_AVAILABLE");
}

// The data set's copies on a host against its memory: every rank there holds one.
TEST(DeviceRegistry, DataMemoryCountsEveryRankOnTheHost) {
  DataSize size;
  size.bytes = 1000;
  size.largest_file = "d/train-images-idx3-ubyte.gz";
  size.largest_bytes = 900;
  check_data_memory("d", size, 2, {2000, "MemAvailable"});  // exactly enough
  check_data_memory("d", size, 4, {-1, "MemAvailable"});    // unknown: not refused
  try {
    check_data_memory("d", size, 3, {2999, "MemAvailable"});
    ADD_FAILURE() << "3 copies of 1000 bytes fitted in 2999";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    const std::string what = e.what();
    for (const char* needle :
         {"--data d:", "(3000 bytes)", "3 rank(s)", "d/train-images-idx3-ubyte.gz", "(900 bytes)",
          "(2999 bytes) is available (MemAvailable)"})
      EXPECT_NE(what.find(needle), std::string::npos) << needle << " not in: " << what;
  }
}

TEST(DeviceRegistry, CudaRequestWithoutTheGpuBuildOrDeviceIsRefused) {
  DeviceRequest r;
  r.kind = "cuda";
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is visible: tests/gpu covers it";
  // Without a device (or without the GPU backend) the registry refuses, as resolve_device does
  // first in the driver: never a CPU device in place of the GPU asked for.
  for (const auto& open : {std::function<void()>([&] { open_device(r); }),
                           std::function<void()>([] { resolve_device("cuda", 0); })}) {
    try {
      open();
      ADD_FAILURE() << "a cuda request opened without a visible device";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput);
      EXPECT_NE(std::string(e.what()).find("--device cuda: no CUDA device visible"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(resolve_device("auto", 0), "cpu");
  r.kind = "tpu";
  EXPECT_THROW(open_device(r), Error);
  r.kind = "cpu";
  EXPECT_STREQ(open_device(r)->kind(), "cpu");
  // --activation-dtype auto's rule on the CPU: bf16 activations with the bf16 backend, whose
  // convolutions read and write them directly; fp32 with the fp32 one.
  EXPECT_FALSE(open_device(r)->fast_bf16_activations());
  r.bf16 = true;
  if (cpu::cpu_bf16_missing().empty()) {
    EXPECT_TRUE(open_device(r)->fast_bf16_activations());
  }
}

TEST(StopSignals, ASignalBecomesTheAgreedStop) {
  auto comm = test::world_comm();
  StopSignals signals;
  EXPECT_EQ(signals.agreed(*comm, false), std::make_pair(0, false));
  EXPECT_EQ(signals.agreed(*comm, true), std::make_pair(0, true));
  ::kill(::getpid(), SIGUSR1);  // blocked in this thread: the watcher takes it
  std::pair<int, bool> got{0, false};
  for (int i = 0; i < 50 && got.first == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    got = signals.agreed(*comm, false);
  }
  EXPECT_EQ(got.first, SIGUSR1);
  EXPECT_EQ(signal_name(SIGUSR1), "SIGUSR1");
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
}

TEST(StopSignals, EachTrainingStartsWithoutAStop) {
  auto comm = test::world_comm();
  StopSignals signals;  // the previous test's signal is forgotten
  EXPECT_EQ(signals.agreed(*comm, false).first, 0);
}

// The guard on a real engine (the error names the first non-finite gradient).
struct GuardRig {
  std::string dir = test::make_temp_dir("guard");
  std::unique_ptr<test::EngineRig> rig;
  GuardRig(const std::string& mode, int64_t max_skips) {
    test::write_synthetic_dataset(dir, 128, 32, 5);
    TrainConfig c = test::small_config("lenet", dir, 1, 64);
    c.nonfinite = mode;
    c.nonfinite_max_skips = max_skips;
    rig = std::make_unique<test::EngineRig>(c);
  }
  ~GuardRig() {
    rig.reset();
    std::filesystem::remove_all(dir);
  }
};

TEST(NonFiniteGuard, SkipsUpToTheBoundThenStopsNamingTheStep) {
  GuardRig r("skip", 2);
  NonFiniteGuard guard(r.rig->cfg, *r.rig->comm, *r.rig->engine);
  guard.check(1.5, 0, 0);  // finite: nothing
  EXPECT_EQ(guard.skipped(), 0);
  guard.check(std::nan(""), 3, 0);
  guard.check(INFINITY, 4, 0);
  EXPECT_EQ(guard.skipped(), 2);
  try {
    guard.check(std::nan(""), 6, 1);
    FAIL() << "a third non-finite step with --nonfinite-max-skips 2 was skipped";
  } catch (const AgreedInputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("step 7 (epoch 2): the gradients are not finite"), std::string::npos) << m;
    EXPECT_NE(m.find("after 2 skipped steps (--nonfinite-max-skips)"), std::string::npos) << m;
    EXPECT_FALSE(e.quiet);  // rank 0 says it
  }
}

TEST(NonFiniteGuard, StopEndsAtTheFirst) {
  GuardRig r("stop", 10);
  NonFiniteGuard guard(r.rig->cfg, *r.rig->comm, *r.rig->engine);
  EXPECT_THROW(guard.check(std::nan(""), 0, 0), AgreedInputError);
}

// --trace keeps at most its share of spans and counts the rest: an unbounded window grew without
// limit, and its end-of-run file ran out of memory or past a collective's count (exit 3, before
// --save). The file is the events kept, in order, one JSON document; a name with quotes and a
// backslash is escaped.
TEST(Tracer, KeepsAtMostItsShareOfSpansAndCountsTheRest) {
  auto comm = test::world_comm();
  const std::string dir = test::make_temp_dir("trace");
  Tracer t(100);
  t.span("before the start", "x", Tracer::kCompute, 0, 1);  // not active yet: not kept, not counted
  t.start(*comm);
  EXPECT_EQ(t.share(), 100);  // one rank: the whole limit
  for (int i = 0; i < 250; ++i)
    t.span(i == 0 ? std::string("a \"quoted\" \\ name") : "span " + std::to_string(i), "compute",
           i % 2 ? Tracer::kComm : Tracer::kCompute, i, i + 0.5);
  EXPECT_EQ(t.size(), 100u);
  const std::string path = dir + "/t.json";
  EXPECT_EQ(t.write(*comm, path, "host"), 150);
  std::ifstream in(path);
  const nlohmann::json doc = nlohmann::json::parse(in);
  const nlohmann::json& events = doc.at("traceEvents");
  ASSERT_EQ(events.size(), 4u + 100u);  // process name, sort index, two thread names; the spans
  EXPECT_EQ(events[0].at("args").at("name"), "rank 0@host");
  EXPECT_EQ(events[4].at("name"), "a \"quoted\" \\ name");
  for (int i = 0; i < 100; ++i) {
    const nlohmann::json& e = events[static_cast<size_t>(4 + i)];
    EXPECT_EQ(e.at("ph"), "X");
    EXPECT_EQ(e.at("tid"), i % 2);
    EXPECT_EQ(e.at("ts").get<double>(), i);
    EXPECT_EQ(e.at("dur").get<double>(), 0.5);
    if (i > 0) {
      EXPECT_EQ(e.at("name"), "span " + std::to_string(i));
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dpt
