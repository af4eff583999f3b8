// Unit tests for include/dpt/metrics.h: the epoch record's JSON, the per-rank timings and the
// straggler watch, and MetricsLogger's files (--metrics lines, the resume trim, --report,
// warnings).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "dpt/config.h"
#include "dpt/log.h"
#include "dpt/metrics.h"
#include "test_util.h"

namespace dpt {
namespace {

using nlohmann::json;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(f, line);) out.push_back(line);
  return out;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

EpochMetrics epoch_record(int epoch) {
  EpochMetrics m;
  m.epoch = epoch;
  m.train_loss = 2.0 / epoch;
  m.train_acc = 0.5 + 0.1 * epoch;
  m.test_loss = 1.5 / epoch;
  m.test_acc = 0.45 + 0.1 * epoch;
  m.test_count = 500;
  m.train_count = 2048;
  m.steps = 10;
  m.epoch_seconds = 1.25;
  m.images_per_second = 1638.4;
  m.lr = 0.05;
  return m;
}

StepRecord step_rec(int epoch, int64_t step) {
  StepRecord r;
  r.epoch = epoch;
  r.step = step;
  r.loss = 1.0 + 1.0 / static_cast<double>(step);
  r.train_acc = 0.25;
  r.lr = 0.01 * static_cast<double>(step);
  r.grad_norm = 3.5;
  r.images_per_second = 1000;
  r.allreduce_seconds = 0.002;
  r.exposed_comm_seconds = 0.001;
  r.world_size = 4;
  return r;
}

class MetricsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    set_log_level(LogLevel::kInfo);
    dir_ = test::make_temp_dir("metrics");
    cfg_.metrics = dir_ + "/metrics.jsonl";
    cfg_.progress = "off";
    cfg_.epochs = 3;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
  TrainConfig cfg_;
};

// ---- EpochMetrics JSON ----

TEST(EpochMetricsJson, RoundTripsEveryField) {
  EpochMetrics m;
  m.epoch = 7;
  m.train_loss = 0.123456789012345;
  m.train_acc = 0.9375;
  m.test_loss = 0.3;
  m.test_acc = 0.8125;
  m.test_count = 10000;
  m.train_count = (int64_t{1} << 40) + 3;  // beyond 32 bits
  m.steps = 234;
  m.epoch_seconds = 12.5;
  m.images_per_second = 4800.25;
  m.lr = 1e-3 / 3;
  m.comm_seconds = 0.7;
  m.exposed_comm_seconds = 0.1;
  m.grad_norm = 1.75;
  m.grad_norm_max = 9.5;
  m.nonfinite_steps = 2;
  m.world_size = 4;
  m.slowest_rank = 3;
  m.slowest_compute_seconds = 0.031;
  m.median_compute_seconds = 0.025;
  m.compute_spread = 0.4;
  m.rank_compute_seconds = {0.02, 0.025, 0.025, 0.031};
  m.rank_wait_seconds = {0.011, 0.006, 0.006, 0.001};

  const std::string text = m.to_json();
  EXPECT_EQ(text.find('\n'), std::string::npos);  // one line of --metrics
  const json j = json::parse(text);
  EXPECT_EQ(j.at("type"), "epoch");
  EXPECT_EQ(j.at("train_count").get<int64_t>(), (int64_t{1} << 40) + 3);

  const EpochMetrics r = EpochMetrics::from_json(text);
  EXPECT_EQ(r.epoch, m.epoch);
  EXPECT_EQ(r.train_loss, m.train_loss);
  EXPECT_EQ(r.train_acc, m.train_acc);
  EXPECT_EQ(r.test_loss, m.test_loss);
  EXPECT_EQ(r.test_acc, m.test_acc);
  EXPECT_EQ(r.test_count, m.test_count);
  EXPECT_EQ(r.train_count, m.train_count);
  EXPECT_EQ(r.steps, m.steps);
  EXPECT_EQ(r.epoch_seconds, m.epoch_seconds);
  EXPECT_EQ(r.images_per_second, m.images_per_second);
  EXPECT_EQ(r.lr, m.lr);
  EXPECT_EQ(r.comm_seconds, m.comm_seconds);
  EXPECT_EQ(r.exposed_comm_seconds, m.exposed_comm_seconds);
  EXPECT_EQ(r.grad_norm, m.grad_norm);
  EXPECT_EQ(r.grad_norm_max, m.grad_norm_max);
  EXPECT_EQ(r.nonfinite_steps, m.nonfinite_steps);
  EXPECT_EQ(r.world_size, m.world_size);
  EXPECT_EQ(r.slowest_rank, m.slowest_rank);
  EXPECT_EQ(r.slowest_compute_seconds, m.slowest_compute_seconds);
  EXPECT_EQ(r.median_compute_seconds, m.median_compute_seconds);
  EXPECT_EQ(r.compute_spread, m.compute_spread);
  EXPECT_EQ(r.rank_compute_seconds, m.rank_compute_seconds);
  EXPECT_EQ(r.rank_wait_seconds, m.rank_wait_seconds);
  // And the record it gives back writes the same JSON.
  EXPECT_EQ(r.to_json(), text);
}

TEST(EpochMetricsJson, NanIsNullAndBack) {
  EpochMetrics m = epoch_record(2);
  m.test_loss = std::numeric_limits<double>::quiet_NaN();  // an epoch not evaluated
  m.test_acc = std::numeric_limits<double>::quiet_NaN();
  const std::string text = m.to_json();
  const json j = json::parse(text);  // valid JSON: no bare NaN
  EXPECT_TRUE(j.at("test_loss").is_null());
  EXPECT_TRUE(j.at("test_acc").is_null());
  EXPECT_DOUBLE_EQ(j.at("train_loss").get<double>(), 1.0);
  const EpochMetrics r = EpochMetrics::from_json(text);
  EXPECT_TRUE(std::isnan(r.test_loss));
  EXPECT_TRUE(std::isnan(r.test_acc));
  EXPECT_EQ(r.train_loss, 1.0);
  EXPECT_EQ(r.epoch, 2);
}

TEST(EpochMetricsJson, MissingFieldsKeepDefaults) {
  const EpochMetrics r = EpochMetrics::from_json(R"({"type":"epoch","epoch":4,"train_loss":0.5})");
  const EpochMetrics d;
  EXPECT_EQ(r.epoch, 4);
  EXPECT_EQ(r.train_loss, 0.5);
  EXPECT_EQ(r.world_size, d.world_size);
  EXPECT_EQ(r.test_count, d.test_count);
  EXPECT_TRUE(r.rank_compute_seconds.empty());
}

// ---- set_rank_timings ----

// The sums a mid-epoch checkpoint carries read back bit for bit (the resumed record adds to them
// as the uninterrupted run would), and anything that is not such sums is refused.
TEST(EpochSoFarJson, RoundTripsBitForBitAndRefusesWhatIsNoSums) {
  EpochSoFar e;
  e.loss = 1.0 / 3.0 * 1e5, e.correct = 4097, e.count = 8192, e.steps = 32;
  e.norm_sum = std::nextafter(2.0, 3.0), e.norm_max = 0.1, e.applied = 31, e.nonfinite = 1;
  e.seconds = 12.345678901234567, e.comm_seconds = 1e-300, e.exposed_seconds = 0;
  const EpochSoFar r = EpochSoFar::from_json(e.to_json());
  EXPECT_EQ(r.loss, e.loss);
  EXPECT_EQ(r.norm_sum, e.norm_sum);
  EXPECT_EQ(r.norm_max, e.norm_max);
  EXPECT_EQ(r.seconds, e.seconds);
  EXPECT_EQ(r.comm_seconds, e.comm_seconds);
  EXPECT_EQ(std::tie(r.correct, r.count, r.steps, r.applied, r.nonfinite),
            std::tie(e.correct, e.count, e.steps, e.applied, e.nonfinite));
  auto with = [&](const std::string& key, const nlohmann::json& v) {
    auto j = nlohmann::json::parse(e.to_json());
    j[key] = v;
    return j.dump();
  };
  auto without_steps = nlohmann::json::parse(e.to_json());
  without_steps.erase("steps");
  for (const std::string& bad :
       {with("loss", -1.0), with("count", 1.5), without_steps.dump(), with("seconds", "12"),
        with("correct", 9000), with("applied", -1), with("norm_max", nullptr),
        std::string("[1, 2]"), std::string("{")})
    EXPECT_THROW(EpochSoFar::from_json(bad), std::exception) << bad;
  // More optimizer steps than steps: what a run resumed at a larger batch (--allow-config-change)
  // writes, its steps recounted in the new batch's.
  EXPECT_EQ(EpochSoFar::from_json(with("applied", 40)).applied, 40);
}

TEST(RankTimings, OddCount) {
  EpochMetrics m;
  set_rank_timings(m, {3.0, 0.1, 1.0, 0.2, 2.0, 0.3});  // {compute, wait} of ranks 0, 1, 2
  EXPECT_EQ(m.rank_compute_seconds, (std::vector<double>{3.0, 1.0, 2.0}));
  EXPECT_EQ(m.rank_wait_seconds, (std::vector<double>{0.1, 0.2, 0.3}));
  EXPECT_EQ(m.median_compute_seconds, 2.0);
  EXPECT_EQ(m.slowest_rank, 0);
  EXPECT_EQ(m.slowest_compute_seconds, 3.0);
  EXPECT_DOUBLE_EQ(m.compute_spread, (3.0 - 1.0) / 2.0);
}

TEST(RankTimings, EvenCountAndTies) {
  EpochMetrics m;
  set_rank_timings(m, {1.0, 0, 4.0, 0, 4.0, 0, 2.0, 0});
  EXPECT_EQ(m.median_compute_seconds, (2.0 + 4.0) / 2);  // the mean of the middle two
  EXPECT_EQ(m.slowest_rank, 1);                          // the first of the equal slowest
  EXPECT_EQ(m.slowest_compute_seconds, 4.0);
  EXPECT_DOUBLE_EQ(m.compute_spread, (4.0 - 1.0) / 3.0);

  EpochMetrics two;
  set_rank_timings(two, {0.5, 0.0, 1.5, 0.0});
  EXPECT_EQ(two.median_compute_seconds, 1.0);
  EXPECT_EQ(two.slowest_rank, 1);
  EXPECT_DOUBLE_EQ(two.compute_spread, 1.0);

  EpochMetrics equal;
  set_rank_timings(equal, {0.7, 0.1, 0.7, 0.2, 0.7, 0.3});
  EXPECT_EQ(equal.slowest_rank, 0);
  EXPECT_EQ(equal.compute_spread, 0.0);
}

TEST(RankTimings, OneRankAndZeroMedian) {
  EpochMetrics m;
  set_rank_timings(m, {0.04, 0.001});
  EXPECT_EQ(m.slowest_rank, 0);
  EXPECT_EQ(m.median_compute_seconds, 0.04);
  EXPECT_EQ(m.slowest_compute_seconds, 0.04);
  EXPECT_EQ(m.compute_spread, 0.0);
  EpochMetrics z;
  set_rank_timings(z, {0.0, 0.0, 0.0, 0.0, 1.0, 0.0});  // median 0: no division by it
  EXPECT_EQ(z.median_compute_seconds, 0.0);
  EXPECT_EQ(z.compute_spread, 0.0);
  EXPECT_EQ(z.slowest_rank, 2);
}

// ---- StragglerWatch ----

EpochMetrics timings(const std::vector<double>& compute, double median) {
  EpochMetrics m;
  m.rank_compute_seconds = compute;
  m.rank_wait_seconds.assign(compute.size(), 0.0);
  m.median_compute_seconds = median;
  m.world_size = static_cast<int>(compute.size());
  return m;
}

TEST(StragglerWatchTest, WarnsOnTheThirdConsecutiveSlowEpochOnly) {
  set_log_level(LogLevel::kInfo);
  const std::vector<std::string> hosts = {"h0", "h1", "h2", "h3"};
  const EpochMetrics slow = timings({1.0, 1.0, 1.0, 1.3}, 1.0);     // rank 3 30 % above the median
  const EpochMetrics normal = timings({1.0, 1.0, 1.0, 1.19}, 1.0);  // 19 %: not slow
  StragglerWatch w;
  testing::internal::CaptureStderr();
  EXPECT_TRUE(w.epoch_done(slow, hosts).empty());
  EXPECT_TRUE(w.epoch_done(slow, hosts).empty());
  EXPECT_EQ(w.epoch_done(slow, hosts), std::vector<int>{3});
  EXPECT_TRUE(w.epoch_done(slow, hosts).empty());  // once per streak
  EXPECT_TRUE(w.epoch_done(slow, hosts).empty());
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_of(err, "rank 3 (host h3)"), 1u) << err;
  EXPECT_NE(err.find("30%"), std::string::npos) << err;

  // A normal epoch ends the streak; two slow ones then are not enough, a third is.
  EXPECT_TRUE(w.epoch_done(normal, hosts).empty());
  EXPECT_TRUE(w.epoch_done(slow, hosts).empty());
  EXPECT_TRUE(w.epoch_done(slow, hosts).empty());
  EXPECT_TRUE(w.epoch_done(normal, hosts).empty());
  EXPECT_TRUE(w.epoch_done(slow, hosts).empty());
  EXPECT_TRUE(w.epoch_done(slow, hosts).empty());
  EXPECT_EQ(w.epoch_done(slow, hosts), std::vector<int>{3});
}

TEST(StragglerWatchTest, ReturnsEverySlowRank) {
  const std::vector<std::string> hosts = {"a", "b", "c", "d", "e"};
  const EpochMetrics m = timings({1.0, 2.0, 1.0, 1.0, 1.25}, 1.0);
  StragglerWatch w;
  testing::internal::CaptureStderr();
  EXPECT_TRUE(w.epoch_done(m, hosts).empty());
  EXPECT_TRUE(w.epoch_done(m, hosts).empty());
  EXPECT_EQ(w.epoch_done(m, hosts), (std::vector<int>{1, 4}));
  testing::internal::GetCapturedStderr();
}

TEST(StragglerWatchTest, TwoRanksNeedOneAndAHalfTimes) {
  const std::vector<std::string> hosts = {"a", "b"};
  // With two ranks the median is their mean: x > 1.2 * (1 + x) / 2 holds for x > 1.5.
  const EpochMetrics below = timings({1.0, 1.49}, (1.0 + 1.49) / 2);
  const EpochMetrics above = timings({1.0, 1.51}, (1.0 + 1.51) / 2);
  StragglerWatch w;
  testing::internal::CaptureStderr();
  for (int e = 0; e < 5; ++e) EXPECT_TRUE(w.epoch_done(below, hosts).empty()) << e;
  EXPECT_TRUE(w.epoch_done(above, hosts).empty());
  EXPECT_TRUE(w.epoch_done(above, hosts).empty());
  EXPECT_EQ(w.epoch_done(above, hosts), std::vector<int>{1});
  testing::internal::GetCapturedStderr();
}

TEST(StragglerWatchTest, ZeroMedianNeverWarns) {
  StragglerWatch w;
  const EpochMetrics m = timings({0.0, 0.0, 1.0}, 0.0);
  for (int e = 0; e < 5; ++e) EXPECT_TRUE(w.epoch_done(m, {"a", "b", "c"}).empty());
}

// ---- MetricsLogger ----

TEST_F(MetricsFileTest, FreshRunTruncatesAndAppendsOneLinePerRecord) {
  { std::ofstream(cfg_.metrics) << "stale line from another run\n"; }
  MetricsLogger log(cfg_, 0, 1, {}, false, 0, 0);
  EXPECT_EQ(slurp(cfg_.metrics), "");
  log.step_record(step_rec(1, 1));
  log.step_record(step_rec(1, 2));
  log.epoch_done(epoch_record(1), {"h0"});
  log.step_record(step_rec(2, 3));
  log.epoch_done(epoch_record(2), {"h0"});

  const auto lines = lines_of(cfg_.metrics);
  ASSERT_EQ(lines.size(), 5u);
  const std::vector<std::string> types = {"step", "step", "epoch", "step", "epoch"};
  for (size_t i = 0; i < lines.size(); ++i)
    EXPECT_EQ(json::parse(lines[i]).at("type"), types[i]) << lines[i];
  const json s = json::parse(lines[1]);
  EXPECT_EQ(s.at("epoch"), 1);
  EXPECT_EQ(s.at("step"), 2);
  EXPECT_DOUBLE_EQ(s.at("loss").get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(s.at("train_acc").get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(s.at("lr").get<double>(), 0.02);
  EXPECT_DOUBLE_EQ(s.at("grad_norm").get<double>(), 3.5);
  EXPECT_DOUBLE_EQ(s.at("images_per_second").get<double>(), 1000);
  EXPECT_DOUBLE_EQ(s.at("allreduce_seconds").get<double>(), 0.002);
  EXPECT_DOUBLE_EQ(s.at("exposed_comm_seconds").get<double>(), 0.001);
  EXPECT_EQ(s.at("world_size"), 4);
  const EpochMetrics e2 = EpochMetrics::from_json(lines[4]);
  EXPECT_EQ(e2.epoch, 2);
  EXPECT_EQ(e2.train_loss, 1.0);
  EXPECT_EQ(e2.test_count, 500);
  EXPECT_EQ(lines[2], epoch_record(1).to_json());  // the epoch line is the record's JSON

  EXPECT_EQ(log.history().size(), 2u);
  EXPECT_EQ(log.ran().size(), 2u);
}

TEST_F(MetricsFileTest, ResumeKeepsRecordsUpToTheCheckpointAndAppends) {
  // The file of an interrupted run: steps 1..30 and epochs 1..3, a foreign line after epoch 1.
  std::vector<std::string> written;
  for (int e = 1; e <= 3; ++e) {
    for (int64_t s = 10 * (e - 1) + 1; s <= 10 * e; ++s) {
      const StepRecord r = step_rec(e, s);
      written.push_back(
          json{{"type", "step"}, {"epoch", r.epoch}, {"step", r.step}, {"loss", r.loss}}.dump());
    }
    written.push_back(epoch_record(e).to_json());
    if (e == 1) written.push_back("# a note the operator added (not JSON)");
  }
  {
    std::ofstream f(cfg_.metrics, std::ios::trunc);
    for (const auto& l : written) f << l << "\n";
  }
  ASSERT_EQ(written.size(), 34u);
  const std::vector<std::string> kept(written.begin(),
                                      written.begin() + 12);  // steps 1..10, epoch 1, note

  cfg_.report = dir_ + "/report.svg";
  MetricsLogger log(cfg_, 0, 1, {epoch_record(1)}, true, 1, 10);
  EXPECT_EQ(lines_of(cfg_.metrics), kept);

  log.step_record(step_rec(2, 11));
  log.epoch_done(epoch_record(2), {"h0"});
  const auto lines = lines_of(cfg_.metrics);
  ASSERT_EQ(lines.size(), 14u);
  EXPECT_EQ(std::vector<std::string>(lines.begin(), lines.begin() + 12), kept);
  const json s = json::parse(lines[12]);
  EXPECT_EQ(s.at("type"), "step");
  EXPECT_EQ(s.at("step"), 11);
  EXPECT_EQ(s.at("epoch"), 2);
  EXPECT_EQ(lines[13], epoch_record(2).to_json());

  // history: the checkpoint's epochs and the new one; ran: the new one only.
  ASSERT_EQ(log.history().size(), 2u);
  EXPECT_EQ(log.history()[0].epoch, 1);
  EXPECT_EQ(log.history()[1].epoch, 2);
  ASSERT_EQ(log.ran().size(), 1u);
  EXPECT_EQ(log.ran()[0].epoch, 2);

  // The report draws the history: two points on the train loss curve.
  const std::string svg = slurp(cfg_.report);
  std::smatch mt;
  ASSERT_TRUE(
      std::regex_search(svg, mt, std::regex(R"re(data-name="train loss"[^>]*points="([^"]*)")re")))
      << svg;
  std::istringstream pts(mt[1].str());
  int n = 0;
  for (std::string p; pts >> p;) ++n;
  EXPECT_EQ(n, 2);
}

// Another user's --metrics in a sticky directory (only its owner may rename over it) is trimmed
// in place, as uid 65534 in a child over root's file: the same file, exactly the kept lines, a note
// that followed the dropped records too; and what a trim stopped by a full disk leaves (its last
// line cut short) the next resume trims to the same records.
TEST_F(MetricsFileTest, ResumeTrimsAFileItMayNotReplaceInPlace) {
  if (::geteuid() != 0) GTEST_SKIP() << "another user's file needs root (a file owned by root)";
  const std::string sticky = dir_ + "/sticky";
  ASSERT_EQ(::mkdir(sticky.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(sticky.c_str(), 01777), 0);
  ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);
  cfg_.metrics = sticky + "/metrics.jsonl";
  const auto step_line = [](int epoch, int64_t step) {
    return json{{"type", "step"}, {"epoch", epoch}, {"step", step}}.dump() + "\n";
  };
  const std::string kept = step_line(1, 10) + epoch_record(1).to_json() + "\n";
  const std::string note = "# a note the operator added\n";
  const auto resume_as_nobody = [&] {
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(10);
      try {
        MetricsLogger log(cfg_, 0, 1, {epoch_record(1)}, true, 1, 10);
      } catch (const std::exception&) {
        ::_exit(11);
      }
      ::_exit(0);
    }
    int status = -1;
    EXPECT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "status " << status << " (exit 10: could not drop to uid 65534, 11: an error)";
  };
  {
    std::ofstream(cfg_.metrics) << kept << step_line(2, 11) << epoch_record(2).to_json() << "\n"
                                << note;
  }
  ASSERT_EQ(::chmod(cfg_.metrics.c_str(), 0666), 0);
  struct stat before {};
  ASSERT_EQ(::stat(cfg_.metrics.c_str(), &before), 0);
  resume_as_nobody();
  EXPECT_EQ(slurp(cfg_.metrics), kept + note);
  struct stat after {};
  ASSERT_EQ(::stat(cfg_.metrics.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);  // the same file, root's still
  EXPECT_EQ(after.st_uid, 0u);

  { std::ofstream(cfg_.metrics) << kept << "# a no"; }  // stopped 4 bytes into the note
  resume_as_nobody();
  EXPECT_EQ(slurp(cfg_.metrics), kept);
}

TEST_F(MetricsFileTest, ResumeWithNothingPastTheCheckpointLeavesTheFile) {
  const std::string text = epoch_record(1).to_json() + "\nnot json\n";
  { std::ofstream(cfg_.metrics) << text; }
  MetricsLogger log(cfg_, 0, 1, {epoch_record(1)}, true, 1, 10);
  EXPECT_EQ(slurp(cfg_.metrics), text);
}

TEST_F(MetricsFileTest, ResumeWithoutAFileStartsOne) {
  MetricsLogger log(cfg_, 0, 1, {}, true, 2, 20);
  log.step_record(step_rec(3, 21));
  const auto lines = lines_of(cfg_.metrics);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(json::parse(lines[0]).at("step"), 21);
}

TEST_F(MetricsFileTest, ResumeOnACharacterDeviceAppendsWithoutTrimming) {
  // A private null device (mknod 1,3) in the test's directory, so the real /dev/null is never at
  // risk.
  const std::string dev = dir_ + "/null";
  if (::geteuid() != 0) GTEST_SKIP() << "mknod of a character device needs root";
  if (::mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0)
    GTEST_SKIP() << "mknod refused here";
  cfg_.metrics = dev;
  std::unique_ptr<MetricsLogger> log;
  EXPECT_NO_THROW(log = std::make_unique<MetricsLogger>(
                      cfg_, 0, 1, std::vector<EpochMetrics>{epoch_record(1)}, true, 1, 10));
  ASSERT_NE(log, nullptr);
  log->step_record(step_rec(2, 11));
  testing::internal::CaptureStderr();
  log->epoch_done(epoch_record(2), {"h0"});
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.find("--metrics"), std::string::npos) << err;  // writing to it did not fail
  struct stat st {};
  ASSERT_EQ(::lstat(dev.c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));  // still the device, not replaced by a regular file
  EXPECT_EQ(st.st_rdev, makedev(1, 3));
}

TEST_F(MetricsFileTest, OtherRanksWriteNothing) {
  const std::string text = "{\"type\":\"step\",\"step\":99}\n";
  { std::ofstream(cfg_.metrics) << text; }
  cfg_.report = dir_ + "/report.svg";
  for (bool resumed : {false, true}) {
    MetricsLogger log(cfg_, 1, 2, {}, resumed, 0, 0);
    log.step_record(step_rec(1, 1));
    log.epoch_done(epoch_record(1), {"h0", "h1"});
    log.report_failures();
    EXPECT_EQ(slurp(cfg_.metrics), text);  // neither truncated, trimmed nor appended to
    EXPECT_FALSE(exists(cfg_.report));
    EXPECT_EQ(log.history().size(), 1u);  // every rank keeps the records
    EXPECT_EQ(log.ran().size(), 1u);
  }
  // And with a --metrics path nobody could write, a rank other than 0 does not even try.
  cfg_.metrics = dir_ + "/no/such/dir/m.jsonl";
  EXPECT_NO_THROW(MetricsLogger(cfg_, 1, 2, {}, false, 0, 0));
}

TEST_F(MetricsFileTest, OutputFailedWarnsOncePerFlag) {
  MetricsLogger log(cfg_, 0, 1, {}, false, 0, 0);
  testing::internal::CaptureStderr();
  log.output_failed("--report", "first failure");
  log.output_failed("--report", "second failure");
  log.output_failed("--trace", "third failure");
  log.output_failed("--trace", "fourth failure");
  log.report_failures();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_of(err, "--report: first failure"), 1u) << err;
  EXPECT_EQ(count_of(err, "second failure"), 0u) << err;
  EXPECT_EQ(count_of(err, "--trace: third failure"), 1u) << err;
  EXPECT_EQ(count_of(err, "fourth failure"), 0u) << err;
  EXPECT_NE(err.find("--report, --trace"), std::string::npos) << err;  // the summary at the end
}

TEST_F(MetricsFileTest, FailedMetricsStopsWritingIt) {
  MetricsLogger log(cfg_, 0, 1, {}, false, 0, 0);
  log.step_record(step_rec(1, 1));
  testing::internal::CaptureStderr();
  log.output_failed("--metrics", "writing failed");
  testing::internal::GetCapturedStderr();
  log.step_record(step_rec(1, 2));
  log.epoch_done(epoch_record(1), {"h0"});
  EXPECT_EQ(lines_of(cfg_.metrics).size(), 1u);
}

TEST_F(MetricsFileTest, ReportFailureIsWarnedOnceAndTrainingGoesOn) {
  cfg_.report = dir_ + "/no/such/dir/report.svg";
  MetricsLogger log(cfg_, 0, 1, {}, false, 0, 0);
  testing::internal::CaptureStderr();
  EXPECT_NO_THROW(log.epoch_done(epoch_record(1), {"h0"}));
  EXPECT_NO_THROW(log.epoch_done(epoch_record(2), {"h0"}));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_of(err, "warning: --report:"), 1u) << err;
  EXPECT_EQ(lines_of(cfg_.metrics).size(), 2u);  // --metrics is still written
}

TEST_F(MetricsFileTest, ReportIsAValidSvg) {
  cfg_.report = dir_ + "/report.svg";
  MetricsLogger log(cfg_, 0, 1, {}, false, 0, 0);
  EpochMetrics e1 = epoch_record(1), e2 = epoch_record(2), e3 = epoch_record(3);
  e2.test_loss = e2.test_acc = std::numeric_limits<double>::quiet_NaN();  // not evaluated
  log.epoch_done(e1, {"h0"});
  log.epoch_done(e2, {"h0"});
  log.epoch_done(e3, {"h0"});
  const std::string svg = slurp(cfg_.report);
  ASSERT_FALSE(svg.empty());
  EXPECT_TRUE(svg.rfind("<svg", 0) == 0 || svg.rfind("<?xml", 0) == 0) << svg.substr(0, 80);
  EXPECT_EQ(count_of(svg, "<svg"), 1u);
  const size_t close = svg.rfind("</svg>");
  ASSERT_NE(close, std::string::npos);
  EXPECT_EQ(svg.find_first_not_of(" \n", close + 6), std::string::npos);  // nothing after it
  // No NaN or infinity leaked into a coordinate.
  EXPECT_FALSE(
      std::regex_search(svg, std::regex(R"((^|[^a-z])-?(nan|inf)([^a-z]|$))", std::regex::icase)))
      << svg;
  // Three curves: train loss and train acc with three points, test acc with two.
  for (const auto& [name, points] : std::vector<std::pair<std::string, int>>{
           {"train loss", 3}, {"train acc", 3}, {"test acc", 2}}) {
    std::smatch mt;
    ASSERT_TRUE(std::regex_search(svg, mt,
                                  std::regex("data-name=\"" + name + "\"[^>]*points=\"([^\"]*)\"")))
        << name;
    std::istringstream pts(mt[1].str());
    int n = 0;
    for (std::string p; pts >> p;) ++n;
    EXPECT_EQ(n, points) << name;
  }
}

}  // namespace
}  // namespace dpt
