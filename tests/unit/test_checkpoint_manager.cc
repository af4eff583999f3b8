// The CheckpointManager without a training run: when a checkpoint is due, what it writes, which
// files it prunes (its own training's only), what --resume auto takes, what claim refuses (both,
// and the activation type a resume keeps, from one survey of the directory), the launcher's record,
// and the temporaries it leaves to the pre-flight. One rank (an MPI singleton).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "dpt/checkpoint.h"
#include "dpt/comm.h"
#include "dpt/config.h"
#include "dpt/ddp.h"
#include "dpt/engine.h"
#include "dpt/error.h"
#include "dpt/metrics.h"
#include "dpt/safetensors.h"
#include "engine_rig.h"
#include "test_util.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;

// A LeNet on the CPU with everything the manager works on (engine_rig.h) and the manager;
// `tweak` changes the configuration before anything is built.
struct Rig : test::EngineRig {
  std::unique_ptr<CheckpointManager> manager;

  explicit Rig(const std::string& dir, void (*tweak)(TrainConfig&) = nullptr,
               const std::string& ck = "")
      : EngineRig(config(dir, tweak, ck)) {
    manager = std::make_unique<CheckpointManager>(cfg, *comm, *model, *ddp, *opt, *engine);
  }
  static TrainConfig config(const std::string& dir, void (*tweak)(TrainConfig&),
                            const std::string& ck) {
    TrainConfig c = test::small_config("lenet", dir, 3, 64);
    c.checkpoint_path = ck.empty() ? dir + "/ck.st" : ck;
    c.checkpoint_every = 1;
    if (tweak) tweak(c);
    return c;
  }
  void save_at(int64_t step) { manager->save({0, step, step}, {}); }
  // load and claim over a survey of the directory as it is now, as the pre-flight takes it.
  ResumePoint load() { return manager->load(survey_checkpoints(cfg)); }
  void claim(int64_t start, int64_t last) { manager->claim(start, last, survey_checkpoints(cfg)); }
};

class CheckpointManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::make_temp_dir("ckman");
    test::write_synthetic_dataset(dir_, 256, 64, 3);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("ck", 0) == 0) out.push_back(n);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  std::string dir_;
};

TEST(CheckpointNames, FileForStepAndKeep) {
  TrainConfig c;
  c.checkpoint_path = "/a/b/ck.safetensors";
  EXPECT_EQ(checkpoint_file(c, 40), "/a/b/ck.safetensors");
  c.keep_checkpoints = 2;
  EXPECT_EQ(checkpoint_file(c, 40), "/a/b/ck.step40.safetensors");
}

TEST_F(CheckpointManagerTest, DueByEpochsStepsAndMinutes) {
  Rig r(dir_, [](TrainConfig& c) { c.checkpoint_every = 2, c.checkpoint_every_steps = 3; });
  // At an epoch's end: epochs done a multiple of 2, or the step count a multiple of 3.
  EXPECT_FALSE(r.manager->save_if_due({1, 0, 4}, true, false, {}));
  EXPECT_TRUE(r.manager->save_if_due({2, 0, 8}, true, false, {}));
  EXPECT_TRUE(r.manager->save_if_due({1, 0, 6}, true, false, {}));
  // Inside an epoch: by steps, or by minutes when agreed; never by epochs.
  EXPECT_FALSE(r.manager->save_if_due({2, 1, 7}, false, false, {}));
  EXPECT_TRUE(r.manager->save_if_due({2, 1, 9}, false, false, {}));
  EXPECT_TRUE(r.manager->save_if_due({2, 1, 10}, false, true, {}));
  EXPECT_EQ(read_checkpoint_info(r.cfg.checkpoint_path).step, 10);
  EXPECT_FALSE(r.manager->minutes_due());  // no --checkpoint-every Nmin
  Rig m(
      dir_, [](TrainConfig& c) { c.checkpoint_every = 0, c.checkpoint_every_minutes = 1e-9; },
      dir_ + "/ckm.st");
  usleep(1000);
  EXPECT_TRUE(m.manager->minutes_due());
  m.save_at(1);
  EXPECT_EQ(read_checkpoint_info(dir_ + "/ckm.st").step, 1);
  Rig slow(
      dir_, [](TrainConfig& c) { c.checkpoint_every = 0, c.checkpoint_every_minutes = 60; },
      dir_ + "/cks.st");
  EXPECT_FALSE(slow.manager->minutes_due());
}

TEST_F(CheckpointManagerTest, WritesPositionTrainingAndHistory) {
  Rig r(dir_);
  EpochMetrics e;
  e.epoch = 1;
  e.train_loss = 1.25;
  r.manager->save({1, 3, 7}, {e});
  const StFile f = read_safetensors(r.cfg.checkpoint_path);
  EXPECT_EQ(f.metadata.at("epoch"), "1");
  EXPECT_EQ(f.metadata.at("epoch_step"), "3");
  EXPECT_EQ(f.metadata.at("step"), "7");
  EXPECT_EQ(f.metadata.at("training_id"), r.manager->training_id());
  EXPECT_EQ(r.manager->training_id().size(), 16u);
  EXPECT_EQ(EpochMetrics::from_json(nlohmann::json::parse(f.metadata.at("history")).at(0).dump())
                .train_loss,
            1.25);
  const CheckpointInfo info = read_checkpoint_info(r.cfg.checkpoint_path);
  EXPECT_TRUE(info.readable);
  EXPECT_EQ(info.step, 7);
  EXPECT_EQ(info.training, r.manager->training_id());
  // --save is no checkpoint: it records a step but no optimizer state.
  Rig s(dir_, [](TrainConfig& c) { c.save = c.data + "/final.st"; });
  s.manager->save_final(9);
  EXPECT_EQ(read_checkpoint_info(dir_ + "/final.st").step, -1);
  EXPECT_NE(f.find("optimizer.momentum_buffer"), nullptr);
}

// A checkpoint keeps the newest epoch records that fit in kHistoryBytes: past the 100 MB a
// safetensors header may hold (at 1024 ranks, after about 2,000 epochs) every checkpoint written
// was unreadable ("absurd header length"), found out at the resume. Here 40 records of about 1
// MiB each (a rank timing per entry, as from a large job) against 32 MiB.
TEST_F(CheckpointManagerTest, KeepsTheNewestEpochRecordsThatFitInTheHeader) {
  Rig r(dir_);
  std::vector<EpochMetrics> history(40);
  for (size_t i = 0; i < history.size(); ++i) {
    history[i].epoch = static_cast<int>(i) + 1;
    history[i].rank_compute_seconds.assign(200000, 0.125);  // "0.125,": 6 bytes each
  }
  const size_t one = history[0].to_json().size();
  ASSERT_GT(one * history.size(), CheckpointManager::kHistoryBytes);
  r.manager->save({40, 0, 120}, history);
  const StFile f = read_safetensors(r.cfg.checkpoint_path);  // readable
  const nlohmann::json kept = nlohmann::json::parse(f.metadata.at("history"));
  const size_t want = CheckpointManager::kHistoryBytes / (one + 1);
  ASSERT_EQ(kept.size(), want);
  for (size_t i = 0; i < kept.size(); ++i)  // the newest, oldest first
    EXPECT_EQ(kept[i].at("epoch"), static_cast<int>(history.size() - want + i) + 1);
  // Records that fit are all kept.
  history.resize(3);
  r.manager->save({41, 0, 123}, history);
  EXPECT_EQ(
      nlohmann::json::parse(read_safetensors(r.cfg.checkpoint_path).metadata.at("history")).size(),
      3u);
}

// The writer refuses a header its reader would refuse, instead of writing an unreadable file.
TEST(Safetensors, AHeaderAboveTheReadersLimitIsNotWritten) {
  const std::string dir = test::make_temp_dir("sthdr");
  const std::string path = dir + "/big.st";
  const std::vector<float> x = {1.f};
  EXPECT_THROW(write_safetensors(path, {st_f32("x", {1}, x.data())},
                                 {{"big", std::string(100'000'001, 'a')}}, "test"),
               Error);
  EXPECT_FALSE(fs::exists(path));
  fs::remove_all(dir);
}

TEST_F(CheckpointManagerTest, TwoTrainingsGetDifferentIds) {
  Rig a(dir_), b(dir_);
  EXPECT_NE(a.manager->training_id(), b.manager->training_id());
}

TEST_F(CheckpointManagerTest, PrunesOnlyItsOwnTrainingsFiles) {
  auto keep2 = [](TrainConfig& c) { c.keep_checkpoints = 2; };
  Rig other(dir_, keep2), mine(dir_, keep2);
  other.save_at(100);  // another training's newer file in the same directory
  for (int s = 1; s <= 4; ++s) mine.save_at(s);
  EXPECT_EQ(names(), (std::vector<std::string>{"ck.step100.st", "ck.step3.st", "ck.step4.st"}));
  // A file that is no checkpoint at a checkpoint's name is not removed either.
  std::ofstream(dir_ + "/ck.step0.st") << "not a checkpoint";
  mine.save_at(5);
  EXPECT_EQ(names(), (std::vector<std::string>{"ck.step0.st", "ck.step100.st", "ck.step4.st",
                                               "ck.step5.st"}));
}

TEST_F(CheckpointManagerTest, ClaimRefusesAnotherTrainingsFile) {
  Rig first(dir_);
  first.save_at(6);
  Rig second(dir_);
  try {
    second.claim(0, 100);
    FAIL() << "another training's file at --checkpoint-path was not refused";
  } catch (const AgreedInputError& e) {
    EXPECT_NE(std::string(e.what()).find("is a checkpoint of another training (id " +
                                         first.manager->training_id()),
              std::string::npos)
        << e.what();
    EXPECT_EQ(e.exit_code(), 2);
  }
  // Its own training's file, and the file it resumes, are its to replace.
  EXPECT_NO_THROW(first.claim(6, 100));
  Rig resumer(dir_, [](TrainConfig& c) { c.resume = c.checkpoint_path; });
  const ResumePoint p = resumer.load();
  EXPECT_EQ(p.at.global_step, 6);
  EXPECT_EQ(resumer.manager->training_id(),
            first.manager->training_id());  // the same training goes on
  EXPECT_NO_THROW(resumer.claim(6, 100));
}

// A checkpoint's position is read as every number is (text.h's read_number): std::stoll took
// " 1", "+1" and "1abc" (as 1) from a hand-edited or damaged file.
TEST_F(CheckpointManagerTest, PositionMetadataIsReadAsDecimalOnly) {
  Rig first(dir_);
  first.save_at(6);
  const StFile good = read_safetensors(first.cfg.checkpoint_path);
  const std::string edited = dir_ + "/edited.st";
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"epoch", " 0"},
           {"epoch", "+0"},
           {"epoch_step", "6abc"},
           {"step", "0x6"},
           {"step", "6 "},
           {"optimizer_steps", "99999999999999999999"}}) {
    SCOPED_TRACE(key + "='" + value + "'");
    std::map<std::string, std::string> meta = good.metadata;
    meta[key] = value;
    write_safetensors(edited, good.tensors, meta);
    Rig resumer(dir_, [](TrainConfig& c) { c.resume = c.data + "/edited.st"; });
    try {
      resumer.load();
      ADD_FAILURE() << "resumed";
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2);
      EXPECT_NE(std::string(e.what()).find(edited + ": metadata '" + key + "' is '" + value +
                                           "', which is "),
                std::string::npos)
          << e.what();
    }
  }
  // --resume auto's listing: a step that is not a number is no position (-1), as one missing.
  std::map<std::string, std::string> meta = good.metadata;
  meta["step"] = "+6";
  write_safetensors(edited, good.tensors, meta);
  EXPECT_EQ(read_checkpoint_info(edited).step, -1);
  meta["step"] = "6";
  write_safetensors(edited, good.tensors, meta);
  EXPECT_EQ(read_checkpoint_info(edited).step, 6);
}

TEST_F(CheckpointManagerTest, ClaimWithRotationLooksOnlyAhead) {
  auto keep = [](TrainConfig& c) { c.keep_checkpoints = 3; };
  Rig other(dir_, keep);
  other.save_at(5);
  other.save_at(50);
  Rig mine(dir_, keep);
  EXPECT_THROW(mine.claim(0, 60), AgreedInputError);  // steps 5 and 50 lie ahead
  EXPECT_NO_THROW(mine.claim(10, 40));                // step 5 lies behind, step 50 beyond the run
  fs::remove(dir_ + "/ck.step50.st");
  EXPECT_NO_THROW(mine.claim(10, 60));  // step 5 lies behind: kept, not overwritten
}

// Files that record no step are listed by the step their names say, newest first as the
// checkpoints are, the path itself last: the text order put ck.step10.st between ck.step100.st
// and ck.step9.st, and --resume auto's warning named them so.
TEST_F(CheckpointManagerTest, FilesRecordingNoStepAreListedByTheStepOfTheirNames) {
  auto keep = [](TrainConfig& c) { c.keep_checkpoints = 5, c.resume = "auto"; };
  for (const char* n : {"ck.step9.st", "ck.step100.st", "ck.st", "ck.step10.st", "ck.step11.st"})
    std::ofstream(dir_ + "/" + n) << "not a checkpoint";
  testing::internal::CaptureStderr();
  Rig resumer(dir_, keep);
  EXPECT_FALSE(resumer.load().resumed);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(
      err.find("passed over 5 file(s) that are no checkpoint, their header unreadable: " + dir_ +
               "/ck.step100.st, " + dir_ + "/ck.step11.st, " + dir_ + "/ck.step10.st and 2 more"),
      std::string::npos)
      << err;
  // Behind a checkpoint that records its step (its name says another).
  Rig writer(dir_, [](TrainConfig& c) { c.keep_checkpoints = 5; });
  writer.save_at(3);
  fs::rename(dir_ + "/ck.step3.st", dir_ + "/ck.step1.st");
  std::vector<std::string> listed;
  for (const CheckpointInfo& f : survey_checkpoints(writer.cfg).entries)
    listed.push_back(fs::path(f.path).filename().string());
  EXPECT_EQ(listed, (std::vector<std::string>{"ck.step1.st", "ck.step100.st", "ck.step11.st",
                                              "ck.step10.st", "ck.step9.st", "ck.st"}));
}

// Whatever a run will write over that is no training's checkpoint is named first, once, with
// what it is: an empty file, junk, a damaged checkpoint and a --save file at names ahead were
// replaced without a word (a checkpoint without an id had a warning); other names stay unnamed.
TEST_F(CheckpointManagerTest, ClaimNamesEachFileItWillReplace) {
  Rig r(dir_, [](TrainConfig& c) { c.keep_checkpoints = 9; });
  r.save_at(2);
  const StFile good = read_safetensors(dir_ + "/ck.step2.st");
  std::ofstream(dir_ + "/ck.step4.st").close();
  std::ofstream(dir_ + "/ck.step6.st") << "junk";
  {
    std::ifstream in(dir_ + "/ck.step2.st", std::ios::binary);
    std::string head(200, '\0');
    in.read(head.data(), 200);
    std::ofstream(dir_ + "/ck.step8.st", std::ios::binary) << head;  // cut inside its header
  }
  write_safetensors(dir_ + "/ck.step10.st", good.tensors, {{"step", "10"}});  // --save's kind
  std::ofstream(dir_ + "/ck.step30.st").close();  // beyond the run's last step
  testing::internal::CaptureStderr();
  r.claim(2, 20);
  const std::string err = testing::internal::GetCapturedStderr();
  const std::string prefix = "--checkpoint-path " + r.cfg.checkpoint_path + ": replacing " + dir_;
  for (const std::string& line :
       {prefix + "/ck.step4.st, an empty file, no checkpoint\n",
        prefix + "/ck.step6.st, a file that is no safetensors file, no checkpoint\n",
        prefix + "/ck.step8.st, a file whose header cannot be read (a damaged checkpoint?)\n",
        prefix + "/ck.step10.st, a safetensors file that records no training position (a --save "
                 "file?), no checkpoint\n"}) {
    const size_t at = err.find(line);
    EXPECT_NE(at, std::string::npos) << line << " not in:\n" << err;
    EXPECT_EQ(err.find(line, at + 1), std::string::npos) << line << " twice in:\n" << err;
  }
  EXPECT_EQ(err.find("ck.step30.st"), std::string::npos) << err;
  EXPECT_EQ(err.find("ck.step2.st"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 4) << err;
}

// Two trainings in one directory on the same data: --resume auto continues the one with this run's
// settings, and the activation type comes from that training's file, not from the newest file of
// any. The pre-flight took the newest file's type (the other training's fp32), and the resume,
// asking with that type, then matched neither training's settings and took the other's file:
// refused as a change of --seed instead of resumed.
TEST_F(CheckpointManagerTest, ResumeAutoTakesItsOwnTraining) {
  Rig a(dir_, [](TrainConfig& c) { c.keep_checkpoints = 5, c.activation_dtype = "bf16"; });
  a.save_at(4);
  Rig b(dir_, [](TrainConfig& c) {  // other settings, a newer file
    c.keep_checkpoints = 5, c.seed = 7, c.activation_dtype = "fp32";
  });
  b.save_at(9);
  TrainConfig cfg = a.cfg;
  cfg.resume = "auto";
  cfg.activation_dtype = "auto";
  const CheckpointSurvey survey = survey_checkpoints(cfg);
  EXPECT_EQ(resumed_activation_dtype(cfg, survey), DType::kBF16);
  // The trainer resolves auto to that type before the manager loads.
  testing::internal::CaptureStderr();
  Rig resumer(dir_, [](TrainConfig& c) {
    c.keep_checkpoints = 5, c.resume = "auto", c.activation_dtype = "bf16";
  });
  const ResumePoint p = resumer.manager->load(survey);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(p.resumed);
  EXPECT_EQ(p.at.global_step, 4);
  EXPECT_EQ(resumer.manager->training_id(), a.manager->training_id());
  EXPECT_NE(err.find("passed over the files of other trainings (" + dir_ + "/ck.step9.st)"),
            std::string::npos)
      << err;
}

// The start-up reads the checkpoint directory once (survey_checkpoints, the pre-flight's): the
// activation type a resume keeps and the file --resume auto loads come from that one listing, so a
// newer checkpoint of the same training written after it (another run sharing the directory) is
// seen by neither. Read again, as each step did, it gave the type of step 9's file (bf16) to a run
// that resumed step 4's (fp32), or the other way round.
TEST_F(CheckpointManagerTest, ResumeAutoTakesTypeAndFileFromOneSurvey) {
  auto resume_auto = [](TrainConfig& c) { c.keep_checkpoints = 5, c.resume = "auto"; };
  Rig writer(dir_, [](TrainConfig& c) { c.keep_checkpoints = 5; });
  writer.save_at(4);
  Rig resumer(dir_, resume_auto);
  const CheckpointSurvey survey = survey_checkpoints(resumer.cfg);
  // Step 9 of the same training, trained on bf16 activations, appears after the survey.
  const StFile four = read_safetensors(dir_ + "/ck.step4.st");
  std::map<std::string, std::string> meta = four.metadata;
  meta["step"] = "9";
  meta["epoch_step"] = "9";
  nlohmann::json config = nlohmann::json::parse(meta.at("config"));
  config["activation_dtype"] = "bf16";
  meta["config"] = config.dump();
  write_safetensors(dir_ + "/ck.step9.st", four.tensors, meta);
  EXPECT_EQ(resumed_activation_dtype(resumer.cfg, survey), DType::kF32);
  // A survey taken now sees it (the case above is no accident of the listing).
  EXPECT_EQ(resumed_activation_dtype(resumer.cfg, survey_checkpoints(resumer.cfg)), DType::kBF16);
  const ResumePoint p = resumer.manager->load(survey);
  EXPECT_TRUE(p.resumed);
  EXPECT_EQ(p.at.global_step, 4);
  EXPECT_EQ(resumer.manager->training_id(), writer.manager->training_id());
  // claim reads the same survey: step 9's file, unseen, is not named as one it would replace.
  testing::internal::CaptureStderr();
  resumer.manager->claim(4, 20, survey);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

// The file --resume auto chose is read whole, its header checked again: where another run wrote
// over it since the survey (another training's checkpoint now at that name), the resume is refused
// naming the file and both, never continued from what the survey did not see.
TEST_F(CheckpointManagerTest, ResumeAutoRefusesAFileChangedSinceTheSurvey) {
  Rig writer(dir_, [](TrainConfig& c) { c.keep_checkpoints = 5; });
  writer.save_at(4);
  Rig resumer(dir_, [](TrainConfig& c) { c.keep_checkpoints = 5, c.resume = "auto"; });
  const CheckpointSurvey survey = survey_checkpoints(resumer.cfg);
  // Same settings, another training's id, renamed over writer's file (as its writer would).
  fs::create_directory(dir_ + "/other");
  Rig other(
      dir_, [](TrainConfig& c) { c.keep_checkpoints = 5; }, dir_ + "/other/ck.st");
  other.save_at(4);
  fs::rename(dir_ + "/other/ck.step4.st", dir_ + "/ck.step4.st");
  try {
    resumer.manager->load(survey);
    FAIL() << "resumed a file that changed since the survey";
  } catch (const AgreedInputError& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find(
                  "--resume auto: " + dir_ + "/ck.step4.st changed since this run listed the " +
                  "checkpoints at start-up (it recorded step 4 of training '" +
                  writer.manager->training_id() + "', it now records step 4 of training '" +
                  other.manager->training_id() + "')"),
              std::string::npos)
        << e.what();
  }
}

// Every entry at a checkpoint name, classified once: what claim refuses ahead (a directory, a FIFO,
// a dangling link) and what it may replace, each regular file's header and size; a FIFO is never
// opened (it would block the survey).
TEST_F(CheckpointManagerTest, SurveyClassifiesEveryEntryAtACheckpointName) {
  Rig r(dir_, [](TrainConfig& c) { c.keep_checkpoints = 9; });
  r.save_at(2);
  std::ofstream(dir_ + "/ck.step3.st").close();
  std::ofstream(dir_ + "/ck.step4.st") << "junk";
  fs::create_directory(dir_ + "/ck.step5.st");
  ASSERT_EQ(::mkfifo((dir_ + "/ck.step6.st").c_str(), 0600), 0);
  fs::create_symlink(dir_ + "/nowhere", dir_ + "/ck.step7.st");
  fs::create_symlink(dir_ + "/ck.step2.st", dir_ + "/ck.step8.st");
  std::ofstream(dir_ + "/ck.step08.st") << "an operator's copy: no checkpoint name";
  const CheckpointSurvey survey = survey_checkpoints(r.cfg);
  EXPECT_TRUE(survey.taken);
  std::vector<std::string> got;
  for (const CheckpointInfo& f : survey.entries)
    got.push_back(fs::path(f.path).filename().string() + " " + std::to_string(f.name_step) +
                  (f.regular ? " regular " + std::to_string(f.bytes) : "") +
                  (f.link ? " link" : "") + (f.readable ? " step " + std::to_string(f.step) : "") +
                  (f.junk ? " junk" : "") + (f.unreplaceable.empty() ? "" : " " + f.unreplaceable));
  const auto size = std::to_string(fs::file_size(dir_ + "/ck.step2.st"));
  EXPECT_EQ(got, (std::vector<std::string>{
                     "ck.step8.st 8 regular " + size + " link step 2",
                     "ck.step2.st 2 regular " + size + " step 2",
                     "ck.step7.st 7 link a dangling symbolic link",
                     "ck.step6.st 6 a FIFO",
                     "ck.step5.st 5 a directory",
                     "ck.step4.st 4 regular 4 junk",
                     "ck.step3.st 3 regular 0 junk",
                 }));
  // claim refuses, from the survey, the first of them the run would meet.
  for (const auto& [start, what] : std::vector<std::pair<int64_t, std::string>>{
           {2, "ck.step5.st is a directory"},
           {5, "ck.step6.st is a FIFO"},
           {6, "ck.step7.st is a dangling symbolic link"}}) {
    try {
      r.manager->claim(start, 20, survey);
      ADD_FAILURE() << "claim from step " << start << " did not refuse " << what;
    } catch (const AgreedInputError& e) {
      EXPECT_NE(std::string(e.what()).find(dir_ + "/" + what + ", where this run would write "),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_NO_THROW(r.manager->claim(7, 20, survey));  // the link to step 2's file is replaceable
}

TEST_F(CheckpointManagerTest, RefusesNonFiniteStateAndKeepsTheFile) {
  Rig r(dir_);
  r.save_at(2);
  const auto before = read_safetensors(r.cfg.checkpoint_path).metadata.at("step");
  r.model->store().entries()[0].value.data()[0] = std::nanf("");
  r.engine->from_host();
  EXPECT_THROW(r.save_at(3), AgreedInputError);
  EXPECT_EQ(read_safetensors(r.cfg.checkpoint_path).metadata.at("step"), before);
}

TEST_F(CheckpointManagerTest, RecordsEachCheckpointForTheLauncher) {
  const std::string rec = dir_ + "/record";
  std::ofstream(rec).close();
  setenv("DPT_CHECKPOINT_RECORD", rec.c_str(), 1);
  Rig r(dir_, [](TrainConfig& c) { c.keep_checkpoints = 2; });
  r.save_at(3);
  r.save_at(5);
  unsetenv("DPT_CHECKPOINT_RECORD");
  std::ifstream in(rec);
  std::string l1, l2, l3;
  std::getline(in, l1), std::getline(in, l2);
  EXPECT_EQ(l1, "3 " + dir_ + "/ck.step3.st");
  EXPECT_EQ(l2, "5 " + dir_ + "/ck.step5.st");
  EXPECT_FALSE(std::getline(in, l3));
}

// Killed writers' temporaries are the pre-flight's (check_outputs, under --checkpoint-path's lock;
// tests/unit/test_preflight.cc): the manager scanned the directory for them a second time, and
// removed them on a run that only resumed, holding no lock.
TEST_F(CheckpointManagerTest, LeavesKilledWritersTemporariesToThePreflight) {
  // pid 4194304 is no process: Linux allocates pids below pid_max, which is at most 2^22 (4194303
  // is a pid where systemd sets pid_max to that limit, as it does by default since v243).
  const std::vector<std::string> dead = {dir_ + "/ck.st.tmp.4194304",
                                         dir_ + "/ck.step4.st.tmp.4194304.Ab12"};
  for (const std::string& f : dead) std::ofstream(f) << "x";
  Rig writer(dir_, [](TrainConfig& c) { c.keep_checkpoints = 2; });
  Rig resumer(dir_, [](TrainConfig& c) { c.checkpoint_every = 0, c.resume = "auto"; });
  for (const std::string& f : dead) EXPECT_TRUE(fs::exists(f)) << f;
}

}  // namespace
}  // namespace dpt
