// The CheckpointManager (include/dpt/checkpoint.h): loading, when a checkpoint is due, writing,
// pruning, the names and metadata of checkpoint files, and --save.
#include "dpt/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <type_traits>

#include "dpt/clock.h"
#include "dpt/comm.h"
#include "dpt/ddp.h"
#include "dpt/engine.h"
#include "dpt/files.h"
#include "dpt/log.h"
#include "dpt/preflight.h"
#include "dpt/safetensors.h"
#include "dpt/text.h"

namespace dpt {

namespace {

// A recorded --activation-dtype as the type the run had: checkpoints written before the type was
// recorded resolved (trainer.cc) say "auto", which was fp32 everywhere then, so they resume as
// they were trained. The one place that rule is written.
std::string resolved_activation_dtype(const std::string& recorded) {
  return recorded == "auto" ? "fp32" : recorded;
}

std::filesystem::path dir_of(const std::filesystem::path& p) {
  return p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
}

// The step in `name` when it is one of this configuration's step-named checkpoints,
// "<stem>.step<digits><ext>" beside the path; else -1. Only digits between: an operator's
// "ck.step4.mybackup.st" or "ck.stepBEST.st" is no checkpoint name, so retention never removes it.
int64_t step_of_name(const TrainConfig& cfg, const std::string& name) {
  const std::filesystem::path p(cfg.checkpoint_path);
  const std::string prefix = p.stem().string() + ".step", ext = p.extension().string();
  if (name.size() <= prefix.size() + ext.size() || name.rfind(prefix, 0) != 0 ||
      name.compare(name.size() - ext.size(), ext.size(), ext) != 0)
    return -1;
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - ext.size());
  // As checkpoint_file writes them: no leading zero ("ck.step0014.st" is the operator's copy).
  if (digits.size() > 18 || (digits.size() > 1 && digits[0] == '0') ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return read_number<int64_t>(digits).value_or(-1);
}

// A new training's id: a digest of its configuration, where and when it started, and 64 random
// bits (two trainings with the same settings started in the same second still differ).
std::string new_training_id(const TrainConfig& cfg, const std::string& host) {
  std::random_device rd;
  const uint64_t salt = (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
  const std::string seed =
      cfg.to_json() + host + std::to_string(std::time(nullptr)) + std::to_string(salt);
  char out[17];
  std::snprintf(out, sizeof out, "%016llx",
                static_cast<unsigned long long>(std::hash<std::string>{}(seed) ^ salt));
  return out;
}

std::string utc_now() {
  char buf[32];
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// The checkpoint's training settings against this run's: "--lr 0.1 -> 0.2" for each value that
// differs and that a resumed run may not change silently.
std::vector<std::string> config_changes(const TrainConfig& cfg, const std::string& path,
                                        const std::string& then_json) {
  std::vector<std::pair<std::string, std::string>> then;
  try {
    then = agreed_values(then_json);
  } catch (const Error& e) {  // parse_metadata_json's: too deep
    throw Error(ErrorKind::kInput,
                DPT_MSG(path << ": metadata 'config' is not valid JSON (" << e.what() << ")"));
  } catch (const std::exception&) {
    throw Error(ErrorKind::kInput, DPT_MSG(path << ": metadata 'config' is not valid JSON"));
  }
  auto now_values = agreed_values(cfg);
  // Compared as resolved types (a configuration not yet resolved, as a test may hand in, reads
  // the same way).
  for (auto* values : {&then, &now_values})
    for (auto& [flag, value] : *values)
      if (flag == "--activation-dtype" && value.starts_with('"'))  // a JSON string (agreed_values)
        value = nlohmann::json(
                    resolved_activation_dtype(nlohmann::json::parse(value).get<std::string>()))
                    .dump();
  std::vector<std::string> changed;
  for (size_t i = 0; i < then.size(); ++i)  // both in agreed_values' order
    if (!may_change_on_resume(then[i].first) && then[i].second != "(not recorded)" &&
        then[i].second != now_values[i].second)
      changed.push_back(then[i].first + " " + printable(then[i].second) + " -> " +
                        printable(now_values[i].second));
  return changed;
}

}  // namespace

namespace {

// The metadata schema's fields of a header (`meta`) into `info`: the files listed
// (read_checkpoint_info) and the file --resume auto read (which must be the file surveyed) alike.
void read_schema(const std::map<std::string, std::string>& meta, CheckpointInfo* info) {
  info->readable = true;
  auto get = [&](const std::string& key) {
    auto it = meta.find(key);
    return it == meta.end() ? std::string() : it->second;
  };
  info->training = get("training_id");
  info->started = get("training_started");
  info->config = get("config");
  for (const auto& [flag, key] : kDataDigests)
    if (meta.count(key)) info->digests[key] = get(key);
  // A --save file has no optimizer state: it records a step, but is no checkpoint to resume.
  if (meta.count("optimizer_steps")) info->step = read_number<int64_t>(get("step")).value_or(-1);
}

}  // namespace

CheckpointInfo read_checkpoint_info(const std::string& path) {
  CheckpointInfo info;
  info.path = path;
  bool junk = false;
  try {
    read_schema(read_metadata(path, &junk), &info);
  } catch (const Error& e) {
    info.junk = junk;
    info.error = e.what();  // unreadable: listed last, still tried by --resume auto unless junk
  }
  return info;
}

namespace {
// Whether `f` records a data digest other than `digests` has under the same key (input_metadata's
// keys; a key either side lacks is no difference).
bool other_data(const CheckpointInfo& f, const std::map<std::string, std::string>& digests) {
  for (const auto& [key, digest] : f.digests)
    if (const auto is = digests.find(key); is != digests.end() && is->second != digest) return true;
  return false;
}

// --resume auto's reading of a survey, the one place its choice is made: the files to try, newest
// first (the one before where one cannot be used), of this run's training. When the directory
// holds several trainings' files, this run's is the one whose newest file has this run's settings
// and data (`digests`), else its settings alone, else the newest; the others' files are passed
// over. Asked twice from one survey, it answers twice alike: by the pre-flight for the activation
// type (resumed_activation_dtype) and by load for the file (choose_auto).
struct AutoChoice {
  std::vector<const CheckpointInfo*> candidates;  // regular files, junk included (load skips it)
  std::vector<std::string> others;                // the files of other trainings passed over
};

AutoChoice choose_among(const TrainConfig& cfg, const CheckpointSurvey& survey,
                        const std::map<std::string, std::string>& digests) {
  DPT_CHECK(survey.taken, "--resume auto: the checkpoint directory beside "
                              << cfg.checkpoint_path << " was not surveyed at start-up");
  // Settings alone do not tell two trainings apart: two users running the same command on other
  // data in one directory have the same configuration. Under --activation-dtype auto (the
  // pre-flight asks before the type is resolved) the type is no difference: the resume takes the
  // checkpoint's, and load, asking with that type, then chooses alike.
  auto same_training = [&](const CheckpointInfo& f, bool data) {
    try {
      if (f.config.empty()) return false;
      for (const std::string& change : config_changes(cfg, f.path, f.config))
        if (cfg.activation_dtype != "auto" || !change.starts_with("--activation-dtype "))
          return false;
    } catch (const Error&) {
      return false;
    }
    return !data || !other_data(f, digests);
  };
  std::vector<const CheckpointInfo*> files;
  for (const CheckpointInfo& f : survey.entries)
    if (f.regular) files.push_back(&f);
  std::string mine;  // the training chosen ("" when the readable files name at most one)
  std::vector<std::string> ids;
  for (const CheckpointInfo* f : files)
    if (!f->training.empty() && std::find(ids.begin(), ids.end(), f->training) == ids.end())
      ids.push_back(f->training);
  if (ids.size() > 1) {
    // Settings and data first, then settings alone (a change of data that --allow-config-change
    // accepts continues this training, not another's), else the newest.
    for (const bool data : {true, false}) {
      for (const std::string& id : ids) {  // files are newest first: each id's first is its newest
        const auto newest = std::find_if(
            files.begin(), files.end(), [&](const CheckpointInfo* f) { return f->training == id; });
        if (same_training(**newest, data)) {
          mine = id;
          break;
        }
      }
      if (!mine.empty()) break;
    }
    if (mine.empty()) mine = ids.front();
  }
  AutoChoice choice;
  for (const CheckpointInfo* f : files)
    if (mine.empty() || f->training.empty() || f->training == mine)
      choice.candidates.push_back(f);
    else
      choice.others.push_back(f->path);
  return choice;
}

}  // namespace

std::optional<DType> resumed_activation_dtype(const TrainConfig& cfg,
                                              const CheckpointSurvey& survey,
                                              const std::map<std::string, std::string>& digests) {
  CheckpointInfo info;
  if (cfg.resume == "auto") {
    // The first file load would resume: the first of the chosen training's files that records a
    // position (those before it cannot be loaded). One whose tensors then fail to load makes load
    // take the one before, whose type may differ: load's comparison of settings refuses that.
    for (const CheckpointInfo* f : choose_among(cfg, survey, digests).candidates)
      if (f->readable && f->step >= 0) {
        info = *f;
        break;
      }
  } else if (!cfg.resume.empty()) {
    info = read_checkpoint_info(cfg.resume);
  }
  if (info.config.empty()) return std::nullopt;
  try {
    const auto j = parse_metadata_json(info.config);
    return resolved_activation_dtype(j.value("activation_dtype", std::string("auto"))) == "bf16"
               ? DType::kBF16
               : DType::kF32;
  } catch (const std::exception&) {
    return std::nullopt;  // a damaged configuration: the resume itself reports it
  }
}

bool is_checkpoint_name(const TrainConfig& cfg, const std::string& name) {
  return name == std::filesystem::path(cfg.checkpoint_path).filename().string() ||
         step_of_name(cfg, name) >= 0;
}

std::string checkpoint_file(const TrainConfig& cfg, int64_t global_step) {
  if (cfg.keep_checkpoints == 0) return cfg.checkpoint_path;
  const std::filesystem::path p(cfg.checkpoint_path);
  return (p.parent_path() /
          (p.stem().string() + ".step" + std::to_string(global_step) + p.extension().string()))
      .string();
}

namespace {

// What the entry at `path`, one of the checkpoint names, is: the one place an entry is classified
// (survey_checkpoints). `dir`: its directory's stat (nullptr: unknown), for the sticky rule.
// Nothing when it is gone meanwhile.
std::optional<CheckpointInfo> classify_entry(const TrainConfig& cfg,
                                             const std::filesystem::path& path,
                                             const struct stat* dir) {
  struct stat ls {
  }, st{};
  if (::lstat(path.c_str(), &ls) != 0) return std::nullopt;
  const bool resolves = ::stat(path.c_str(), &st) == 0;
  CheckpointInfo info;
  if (resolves && S_ISREG(st.st_mode)) {
    info = read_checkpoint_info(path);
    info.regular = true;
    info.bytes = st.st_size;
  } else {
    info.path = path;  // never opened: a FIFO would block the reader
  }
  info.name_step = step_of_name(cfg, path.filename().string());
  info.link = S_ISLNK(ls.st_mode);
  // Where claim's rename would fail at the step, ending the run with exit 2 (and every resume):
  // what it is, or another user's file in a sticky directory, which only its owner, the
  // directory's and root may replace.
  const uid_t me = ::geteuid();
  info.unreplaceable =
      !resolves              ? "a dangling symbolic link"
      : S_ISDIR(st.st_mode)  ? "a directory"
      : S_ISFIFO(st.st_mode) ? "a FIFO"
      : !S_ISREG(st.st_mode) ? "not a regular file"
      : dir && (dir->st_mode & S_ISVTX) && me != 0 && ls.st_uid != me && dir->st_uid != me
          ? DPT_MSG("owned by uid " << ls.st_uid << " in a sticky directory, where this user "
                                    << "cannot replace it")
          : "";
  return info;
}

}  // namespace

CheckpointSurvey survey_checkpoints(const TrainConfig& cfg) {
  CheckpointSurvey survey;
  survey.taken = true;
  const std::filesystem::path dir = dir_of(cfg.checkpoint_path);
  struct stat ds {};
  const bool dir_known = ::stat(dir.c_str(), &ds) == 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    std::string target;
    pid_t pid = 0;
    if (is_checkpoint_name(cfg, name)) {
      if (auto info = classify_entry(cfg, e.path(), dir_known ? &ds : nullptr))
        survey.entries.push_back(std::move(*info));
    } else if (parse_atomic_temp(name, &target, &pid)) {
      survey.temporaries.push_back(e.path().string());
    }
  }
  // The path's text alone put "ck.step10.st" between "ck.step100.st" and "ck.step9.st" in the
  // warnings that list files recording no step.
  std::sort(survey.entries.begin(), survey.entries.end(),
            [](const CheckpointInfo& a, const CheckpointInfo& b) {
              return std::tie(a.step, a.name_step, a.path) > std::tie(b.step, b.name_step, b.path);
            });
  return survey;
}

namespace {

// Metadata key of rank r's timed convolution plans (Backend::conv_plan_choices).
std::string plans_key(int r) { return "conv_plans.rank" + std::to_string(r); }

}  // namespace

CheckpointManager::CheckpointManager(const TrainConfig& cfg, Communicator& comm, Model& model,
                                     DataParallel& ddp, Optimizer& opt, StepEngine& engine,
                                     Meta input)
    : cfg_(cfg),
      comm_(comm),
      model_(model),
      ddp_(ddp),
      opt_(opt),
      input_(std::move(input)),
      engine_(engine),
      last_save_(now_seconds()) {
  if (comm.rank() != 0) return;
  training_ = new_training_id(cfg, comm.host());
  started_ = utc_now();
}

// --resume auto, rank 0: the newest file of `survey` by the step each records, of this run's
// training (choose_among); one that cannot be read falls back to the one before. The files of other
// trainings are named and passed over. A file whose header is not a safetensors header at all
// (junk, an empty file, another user's) is no checkpoint: passed over with a warning, it does not
// stop a fresh start. Returns "" for a fresh start.
std::string CheckpointManager::choose_auto(const CheckpointSurvey& survey, Meta* meta) {
  const AutoChoice choice = choose_among(cfg_, survey, input_);
  if (!choice.others.empty())
    log_warn("--resume auto: passed over the files of other trainings (" +
             summarize(choice.others) + ")");
  // A directory may hold thousands of files that fail: the first few are warned about one by one,
  // the rest in one line, so the log stays readable.
  constexpr size_t kWarned = 3;
  std::vector<std::string> tried;
  std::vector<std::string> junk;  // files whose header cannot be read: no checkpoint
  std::string junk_why;           // the first one's reason, as the survey read it
  auto warn_rest = [&] {
    if (!junk.empty())
      log_warn(DPT_MSG("--resume auto: passed over "
                       << junk.size()
                       << " file(s) that are no checkpoint, their header unreadable: "
                       << summarize(junk) << " (" << printable(junk_why, 300) << ")"));
    if (tried.size() > kWarned)
      log_warn(
          DPT_MSG("--resume auto: more files beside "
                  << cfg_.checkpoint_path << " could not be used either: "
                  << summarize(std::vector<std::string>(tried.begin() + kWarned, tried.end()))));
  };
  for (const CheckpointInfo* f : choice.candidates) {
    if (f->junk) {
      if (junk.empty()) junk_why = f->error;
      junk.push_back(f->path);
      continue;
    }
    // The whole file is read now, its header checked again: it is the survey's entry only if
    // nobody wrote over it since, which is checked below.
    try {
      OptimizerState state = opt_.state();
      *meta = load_model(f->path, model_, &state);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kInput) throw;
      if (tried.size() < kWarned)
        log_warn("--resume auto: " + printable(f->path, PATH_MAX) + " cannot be used (" +
                 printable(e.what(), 500) + "): trying the one before");
      tried.push_back(f->path);
      continue;
    }
    // The file read must be the one surveyed: the pre-flight took the activation type from that
    // entry, and the choice of training and the claim rest on it. Another run writing in a shared
    // directory may have replaced it since (a resume-only run holds no lock there).
    CheckpointInfo read;
    read_schema(*meta, &read);
    DPT_INPUT_CHECK(
        read.step == f->step && read.training == f->training && read.config == f->config,
        "--resume auto: " << printable(f->path, PATH_MAX)
                          << " changed since this run listed the checkpoints at "
                          << "start-up (it recorded step " << f->step << " of training '"
                          << printable(f->training) << "', it now records step " << read.step
                          << " of training '" << printable(read.training)
                          << "'): another run is writing beside --checkpoint-path "
                          << cfg_.checkpoint_path << "; run again once it is done");
    warn_rest();
    return f->path;
  }
  warn_rest();
  DPT_INPUT_CHECK(tried.empty(), "--resume auto: no checkpoint beside " << cfg_.checkpoint_path
                                                                        << " could be read ("
                                                                        << summarize(tried) << ")");
  log_info("--resume auto: no checkpoint at or beside " + cfg_.checkpoint_path +
           ": starting fresh");
  return "";
}

ResumePoint CheckpointManager::load(const CheckpointSurvey& survey) {
  // epoch, epoch step, global step, optimizer steps, images per step then, found (--resume auto)
  int64_t pos[6] = {0, 0, 0, 0, 0, 1};
  std::vector<EpochMetrics> history;
  std::string path;  // the file resumed (rank 0)
  std::vector<std::string> plans(
      static_cast<size_t>(comm_.size()));  // per rank (rank 0 reads them)
  std::string
      recorded_normalize;  // --normalize auto: the statistics the checkpoint recorded (rank 0)
  EpochSoFar so_far;  // the sums of the epoch resumed part-way, when recorded (rank 0, then all)
  CheckpointInfo resumed;  // the schema's fields of the file read (rank 0)
  const std::string reading = "reading --resume " + cfg_.resume + " (rank 0)";
  agree_on_input(comm_, "rank 0 could not read --resume " + cfg_.resume, reading, [&] {
    if (comm_.rank() != 0) return;
    std::map<std::string, std::string> meta;
    if (cfg_.resume == "auto") {
      path = choose_auto(survey, &meta);
      if (path.empty()) {
        pos[5] = 0;
        return;
      }
    } else {
      path = cfg_.resume;
      OptimizerState state = opt_.state();
      meta = load_model(path, model_, &state);
    }
    read_schema(meta, &resumed);
    // Read as every number is (text.h's read_number): std::stoll took " 4", "+4" and "4abc".
    auto num = [&](const char* key) -> int64_t {
      auto it = meta.find(key);
      DPT_INPUT_CHECK(it != meta.end(),
                      path << ": metadata '" << key << "' is missing: not a dptrain checkpoint");
      NumberError why = NumberError::kNone;
      const std::optional<int64_t> v = read_number<int64_t>(it->second, &why);
      DPT_INPUT_CHECK(v, path << ": metadata '" << key << "' is '" << printable(it->second)
                              << "', which " << number_error_text<int64_t>(why));
      return *v;
    };
    // Range-checked: a damaged or hand-edited file must not train "epoch -2147483169".
    auto in_range = [&](const char* key, int64_t hi) {
      const int64_t v = num(key);
      DPT_INPUT_CHECK(v >= 0 && v <= hi, path << ": metadata '" << key << "' is " << v
                                              << ", outside [0, " << hi
                                              << "]: not a checkpoint of a run this can continue");
      return v;
    };
    pos[0] = in_range("epoch", 1'000'000);
    pos[1] = in_range("epoch_step", 1'000'000'000);
    pos[2] = in_range("step", 1'000'000'000'000);
    // Not bounded by the step: --allow-config-change at a larger batch counts the epoch's images
    // done in fewer, larger global steps, while the optimizer keeps the count of steps it took, so
    // the checkpoints after such a resume record more optimizer steps than global steps.
    pos[3] = in_range("optimizer_steps", 1'000'000'000'000);
    // The epoch's sums up to its checkpoint (a checkpoint written before they were recorded has
    // none: the resumed epoch's record then covers the steps after it, as it did).
    if (auto e = meta.find("epoch_so_far"); e != meta.end() && pos[1] > 0) {
      try {
        so_far = EpochSoFar::from_json(e->second);
      } catch (const std::exception&) {
        throw Error(ErrorKind::kInput,
                    DPT_MSG(path << ": metadata 'epoch_so_far' is not the running sums of an epoch "
                                 << "(an object of non-negative finite numbers, whole counts)"));
      }
      DPT_INPUT_CHECK(so_far.steps == pos[1], path << ": metadata 'epoch_so_far' counts "
                                                   << so_far.steps << " steps, 'epoch_step' is "
                                                   << pos[1]);
    }
    if (auto h = meta.find("history"); h != meta.end()) {
      try {
        for (const auto& rec : parse_metadata_json(h->second))
          history.push_back(EpochMetrics::from_json(rec.dump()));
      } catch (const std::exception&) {
        throw Error(ErrorKind::kInput,
                    DPT_MSG(path << ": metadata 'history' is not a list of epoch records"));
      }
    }
    // The same training, or an explicit change (--allow-config-change).
    auto then = meta.find("config");
    std::vector<std::string> changed =
        then == meta.end() ? std::vector<std::string>{} : config_changes(cfg_, path, then->second);
    // On the same data: other images (of the same shape, at the same path or not) are a change like
    // any other. A checkpoint written before digests were recorded cannot tell, and says so.
    for (const auto& [flag, key] : kDataDigests) {
      const auto was = meta.find(key), is = input_.find(key);
      if (is == input_.end()) continue;  // a manager told nothing of the data
      if (was == meta.end()) {
        log_warn(
            path +
            " records no digest of the data it was trained on (written before dptrain recorded "
            "one): whether --data is that data cannot be checked");
        break;
      }
      if (was->second != is->second)
        changed.push_back(std::string(flag) + " " + was->second + " -> " + is->second);
    }
    if (!changed.empty()) {
      std::string list;
      for (const std::string& c : changed) list += (list.empty() ? "" : ", ") + c;
      DPT_INPUT_CHECK(cfg_.allow_config_change,
                      path << ": the checkpoint was written with other training settings or data ("
                           << list
                           << "); a resumed run continues the same training (--allow-config-change "
                              "accepts the change and recomputes the position)");
      log_warn("--allow-config-change: resuming " + path + " with " + list);
      const auto j = parse_metadata_json(then->second);
      pos[4] = j.value("batch_size", cfg_.batch_size) *
               j.value("accum_steps", static_cast<int64_t>(cfg_.accum_steps));
    }
    // --normalize auto, then and now: the training goes on with the statistics it has used (not
    // this data's, which differ on other data and could differ in the last bit on a new reading).
    const auto mean = meta.find("normalize_mean"), stdev = meta.find("normalize_std");
    if (cfg_.normalize == "auto" && then != meta.end() && mean != meta.end() &&
        stdev != meta.end() &&
        parse_metadata_json(then->second).value("normalize", std::string()) == "auto") {
      Normalization n;
      try {
        n = resolve_normalize(mean->second + "/" + stdev->second, nullptr);
      } catch (const Error& e) {
        throw Error(ErrorKind::kInput,
                    DPT_MSG(path << ": metadata normalize_mean and normalize_std: " << e.what()));
      }
      DPT_INPUT_CHECK(static_cast<int64_t>(n.mean.size()) == engine_.channels(),
                      path << ": metadata normalize_mean has " << n.mean.size()
                           << " channel(s), the data's images have " << engine_.channels());
      recorded_normalize = n.text();
    }
    // Each rank's timed convolution plans, replayed so the resumed run runs the same kernels;
    // at another world size, rank 0's for every rank (the float sums differ then anyway).
    for (int r = 0; r < comm_.size(); ++r) {
      auto it = meta.find(plans_key(r));
      if (it == meta.end()) it = meta.find(plans_key(0));
      if (it != meta.end()) plans[static_cast<size_t>(r)] = it->second;
    }
    auto ws = meta.find("world_size");
    if (ws != meta.end() && ws->second != std::to_string(comm_.size()))
      log_warn(path + " was written at world size " + printable(ws->second) + ", resuming at " +
               std::to_string(comm_.size()) +
               ": the data order is the same, float sums may differ");
  });
  comm_.broadcast(pos, 6, 0, "broadcast of the resume position");
  if (!pos[5]) return {};  // --resume auto found nothing: a fresh start on every rank
  // Every rank takes the recorded statistics (rank 0's text; "" for none), and the checkpoints
  // from here on record them again.
  if (const std::string text =
          allgather_text(comm_, comm_.rank() == 0 ? recorded_normalize : "")[0];
      !text.empty()) {
    const Normalization n = resolve_normalize(text, nullptr);
    engine_.set_normalization(n);
    input_["normalize"] = n.text();
    input_["normalize_mean"] = n.mean_text();
    input_["normalize_std"] = n.std_text();
    log_info("--normalize auto: continuing with the statistics the checkpoint recorded (" + text +
             ")");
  }
  // Rank 0's sums as it parsed them (zeros for none), sent as bytes: every rank runs one build,
  // and parsing them again from text on every rank was a second parse of what rank 0 checked.
  static_assert(std::is_trivially_copyable_v<EpochSoFar>);
  comm_.broadcast(reinterpret_cast<uint8_t*>(&so_far), static_cast<int64_t>(sizeof so_far), 0,
                  "broadcast of the resumed epoch's sums");
  if (comm_.rank() == 0) {
    // The same training goes on: its id and start stay (a file written before ids gets a new one).
    // The file's id as it was read whole (its header once more would be a third read, and could
    // be another file's by now).
    resumed_path_ = path;
    if (!resumed.training.empty()) training_ = resumed.training, started_ = resumed.started;
  }
  ddp_.broadcast_state();
  const OptimizerState state = opt_.state();
  for (const auto& [name, values] : state.buffers)
    if (!values->empty())
      comm_.broadcast(values->data(), static_cast<int64_t>(values->size()), 0,
                      "broadcast of the optimizer state");
  for (const auto& [name, count] : state.counters)
    comm_.broadcast(count, 1, 0, "broadcast of the optimizer state");
  opt_.set_steps(pos[3]);
  engine_.from_host();
  // Rank 0 hands each rank its plans: lengths, then the texts end to end.
  std::vector<int64_t> lengths(plans.size());
  for (size_t r = 0; r < plans.size(); ++r) lengths[r] = static_cast<int64_t>(plans[r].size());
  comm_.broadcast(lengths.data(), static_cast<int64_t>(lengths.size()), 0,
                  "broadcast of the convolution plans");
  std::vector<uint8_t> bytes(
      static_cast<size_t>(std::accumulate(lengths.begin(), lengths.end(), int64_t{0})));
  if (!bytes.empty()) {
    if (comm_.rank() == 0) {
      size_t at = 0;
      for (const std::string& t : plans)
        at = std::copy(t.begin(), t.end(), bytes.begin() + static_cast<std::ptrdiff_t>(at)) -
             bytes.begin();
    }
    comm_.broadcast(bytes.data(), static_cast<int64_t>(bytes.size()), 0,
                    "broadcast of the convolution plans");
    const int64_t from =
        std::accumulate(lengths.begin(), lengths.begin() + comm_.rank(), int64_t{0});
    const std::string mine(bytes.begin() + from,
                           bytes.begin() + from + lengths[static_cast<size_t>(comm_.rank())]);
    agree_on_input(comm_, "a rank could not take the convolution plans of --resume " + cfg_.resume,
                   [&] { engine_.set_conv_plan_choices(mine); });
  }
  log_info(DPT_MSG("resumed from " << printable(path, PATH_MAX) << " at epoch " << pos[0] + 1
                                   << ", step " << pos[1] << " (global step " << pos[2] << ")"));
  return {{pos[0], pos[1], pos[2]}, pos[4], std::move(history), true, so_far};
}

void CheckpointManager::claim(int64_t start_step, int64_t last_step,
                              const CheckpointSurvey& survey) {
  if (!cfg_.checkpoints()) return;
  agree_on_input(comm_, "rank 0 found another training's checkpoint at --checkpoint-path", [&] {
    if (comm_.rank() != 0) return;
    DPT_CHECK(survey.taken, "--checkpoint-path " << cfg_.checkpoint_path
                                                 << ": the checkpoint directory was not surveyed "
                                                 << "at start-up");
    if (cfg_.keep_checkpoints > 0) {
      refuse_unreplaceable(survey, start_step, last_step);
      // The step names grow with the step: the last one's temporary must fit as
      // --checkpoint-path's does (checked in the pre-flight).
      check_temp_name_fits(checkpoint_file(cfg_, last_step),
                           "--checkpoint-path " + cfg_.checkpoint_path + ": the checkpoint name");
    }
    for (const CheckpointInfo& f : survey.entries) {
      // Files of this training and the file resumed are this run's to replace; what is no regular
      // file is refuse_unreplaceable's (ahead) or never written (behind).
      if (!f.regular || f.training == training_ || is_resumed(f.path)) continue;
      const bool at_path = f.name_step < 0;  // --checkpoint-path itself (survey_checkpoints)
      // A name this run may still write (the name, not the step the file records: a copy under
      // another step's name is overwritten at the step of its name).
      const bool ahead = f.name_step > start_step && f.name_step <= last_step;
      if (cfg_.keep_checkpoints == 0 ? !at_path : !ahead) continue;
      const std::string shown = printable(f.path, PATH_MAX);
      if (f.training.empty()) {
        // No training's (written without an id, no checkpoint, or unreadable): this run's to
        // replace, as before, but never in silence. An empty or junk file there was replaced
        // without a word, and a damaged checkpoint too.
        const std::string what =
            f.step >= 0  ? DPT_MSG("a checkpoint at step "
                                   << f.step << " that records no training id; --resume " << shown
                                   << " would have continued it")
            : f.readable ? "a safetensors file that records no training position (a --save file?), "
                           "no checkpoint"
            : f.junk && f.bytes == 0 ? "an empty file, no checkpoint"
            : f.junk                 ? "a file that is no safetensors file, no checkpoint"
                                     : "a file whose header cannot be read (a damaged checkpoint?)";
        log_warn(DPT_MSG("--checkpoint-path " << cfg_.checkpoint_path << ": replacing " << shown
                                              << ", " << what));
        continue;
      }
      DPT_INPUT_CHECK(false, "--checkpoint-path "
                                 << cfg_.checkpoint_path << ": " << shown
                                 << " is a checkpoint of another training (id "
                                 << printable(f.training) << ", started "
                                 << (f.started.empty() ? "?" : printable(f.started)) << ", at step "
                                 << f.step << ") that this run would overwrite; "
                                 << "continue that training with --resume " << shown
                                 << " (or --resume auto), or choose another --checkpoint-path");
    }
  });
}

// Every step name this run may still write must be replaceable now, not only at its step: a FIFO,
// a directory or a dangling link there, or another user's file in a sticky directory (which the
// rename cannot replace), ended the run at that step with exit 2, and every resume again.
void CheckpointManager::refuse_unreplaceable(const CheckpointSurvey& survey, int64_t start_step,
                                             int64_t last_step) const {
  // The names ahead in the order the run would meet them, so the refusal names the first.
  std::vector<const CheckpointInfo*> ahead;
  for (const CheckpointInfo& f : survey.entries)
    if (f.name_step > start_step && f.name_step <= last_step) ahead.push_back(&f);
  std::sort(ahead.begin(), ahead.end(), [](const CheckpointInfo* a, const CheckpointInfo* b) {
    return a->name_step < b->name_step;
  });
  for (const CheckpointInfo* e : ahead) {
    const CheckpointInfo& f = *e;
    // Whether another user could have planted a link is files.cc's rule (AtomicFile's), which
    // reads the link's owner and directory itself: asked of the survey's links alone.
    if (f.link)
      refuse_planted_link(f.path,
                          "--checkpoint-path " + cfg_.checkpoint_path + ": the checkpoint name");
    DPT_INPUT_CHECK(f.unreplaceable.empty(),
                    "--checkpoint-path "
                        << cfg_.checkpoint_path << ": " << printable(f.path, PATH_MAX) << " is "
                        << f.unreplaceable << ", where this run would write its checkpoint of step "
                        << f.name_step << "; remove it or choose another --checkpoint-path");
  }
}

bool CheckpointManager::minutes_due() const {
  return comm_.rank() == 0 && cfg_.checkpoint_every_minutes > 0 &&
         (now_seconds() - last_save_) / 60.0 >= cfg_.checkpoint_every_minutes;
}

bool CheckpointManager::save_if_due(const Position& at, bool epoch_end, bool minutes_due,
                                    const std::vector<EpochMetrics>& history,
                                    const std::function<EpochSoFar()>& so_far) {
  const bool by_steps =
      cfg_.checkpoint_every_steps > 0 && at.global_step % cfg_.checkpoint_every_steps == 0;
  const bool by_epochs =
      epoch_end && cfg_.checkpoint_every > 0 && at.epoch % cfg_.checkpoint_every == 0;
  if (!(by_steps || by_epochs || (!epoch_end && minutes_due))) return false;
  save(at, history, so_far ? std::optional(so_far()) : std::nullopt);
  return true;
}

void CheckpointManager::save(const Position& at, const std::vector<EpochMetrics>& history,
                             const std::optional<EpochSoFar>& so_far) {
  engine_.sync_buffers();
  engine_.to_host();
  const std::string file = checkpoint_file(cfg_, at.global_step);
  refuse_nonfinite(file);
  const std::vector<std::string> plans = allgather_text(comm_, engine_.conv_plan_choices());
  if (comm_.rank() == 0) {
    // The newest records that fit in kHistoryBytes, oldest first.
    std::vector<std::string> records;
    size_t bytes = 0;
    for (auto m = history.rbegin(); m != history.rend(); ++m) {
      std::string text = m->to_json();
      if (bytes + text.size() + 1 > kHistoryBytes) break;
      bytes += text.size() + 1;
      records.push_back(std::move(text));
    }
    if (records.size() < history.size() && !history_cut_said_) {
      history_cut_said_ = true;
      log_warn(DPT_MSG("checkpoint "
                       << file << ": the records of " << history.size() << " epochs outgrow "
                       << "the checkpoint's metadata (" << (kHistoryBytes >> 20)
                       << " MiB of them, within the 100 MB a safetensors header may hold): it "
                       << "keeps the newest " << records.size() << ", so a resumed run's "
                       << "--report starts "
                       << (records.empty()
                               ? std::string("without them")
                               : "at epoch " +
                                     std::to_string(history[history.size() - records.size()].epoch))
                       << " (--metrics has them all)"));
    }
    std::string hist = "[";
    // Appended piece by piece: g++ 12 warns (-Wrestrict, a false positive) on "," + a temporary.
    for (auto text = records.rbegin(); text != records.rend(); ++text) {
      if (hist.size() > 1) hist += ',';
      hist += *text;
    }
    Meta meta = metadata(at.epoch, at.global_step);
    meta.insert({{"epoch_step", std::to_string(at.epoch_step)},
                 {"optimizer_steps", std::to_string(opt_.steps())},
                 {"history", hist + "]"},
                 {"training_id", training_},
                 {"training_started", started_}});
    if (so_far && at.epoch_step > 0) meta["epoch_so_far"] = so_far->to_json();
    for (size_t r = 0; r < plans.size(); ++r)
      if (!plans[r].empty()) meta[plans_key(static_cast<int>(r))] = plans[r];
    // Never over another training's file (one started beside this run after its claim).
    const CheckpointInfo there = read_checkpoint_info(file);
    DPT_INPUT_CHECK(there.training.empty() || there.training == training_ || is_resumed(file),
                    "not writing checkpoint "
                        << file << ": it now holds a checkpoint of another training (id "
                        << printable(there.training) << "); two trainings share --checkpoint-path");
    const OptimizerState state = opt_.state();
    save_model(file, model_, meta, &state);
    prune();
    record(at.global_step, file);
    last_saved_file_ = file;
  }
  comm_.barrier("barrier after rank 0 wrote checkpoint " + file);
  last_save_ = now_seconds();
  last_saved_step_ = at.global_step;
  log_info("checkpoint written to " + file + " (global step " + std::to_string(at.global_step) +
           ")");
}

// With --keep-checkpoints K: only the K newest of this training's files (by the step each
// records) stay; other trainings' files and files that are no checkpoint are never removed.
void CheckpointManager::prune() const {
  if (cfg_.keep_checkpoints == 0) return;
  int kept = 0;
  std::error_code ec;
  // The directory now, listed again: this run has just written to it, and the start-up's survey
  // knows none of its files since.
  for (const CheckpointInfo& f : survey_checkpoints(cfg_).entries) {
    if (f.training != training_ && !is_resumed(f.path)) continue;
    if (++kept > cfg_.keep_checkpoints && f.path != cfg_.checkpoint_path &&
        !std::filesystem::remove(f.path, ec) && ec && unremovable_.insert(f.path).second)
      // Another user's file in a sticky directory (a training this user continued): it stayed
      // without a word, so --keep-checkpoints kept more files than it said.
      log_warn(DPT_MSG("--keep-checkpoints "
                       << cfg_.keep_checkpoints << ": cannot remove " << printable(f.path, PATH_MAX)
                       << ", an older checkpoint of this training: " << ec.message()
                       << "; it stays"));
  }
}

// launch/mpirun.sh's restart decision: a line "<step> <file>" appended to the file it names in
// DPT_CHECKPOINT_RECORD after every checkpoint, so the launcher need not know the file names.
void CheckpointManager::record(int64_t global_step, const std::string& file) const {
  const char* to = std::getenv("DPT_CHECKPOINT_RECORD");
  if (!to || !*to) return;
  const int fd = ::open(to, O_WRONLY | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  struct stat st {};
  // One line per checkpoint: a newline in the path (its bytes escaped by printable()) made two,
  // and the launcher's restart message named the part after it as the newest checkpoint.
  const std::string line = std::to_string(global_step) + " " + printable(file, PATH_MAX) + "\n";
  const bool ok = fd >= 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                  ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  if (fd >= 0) ::close(fd);
  if (!ok)
    log_warn(DPT_MSG("DPT_CHECKPOINT_RECORD "
                     << to << ": cannot append the checkpoint's record; a launcher "
                     << "restart may not see it"));
}

void CheckpointManager::save_last(const Position& at, const std::vector<EpochMetrics>& history) {
  if (!cfg_.checkpoints() || last_saved_step_ == at.global_step) return;
  save(at, history);
}

void CheckpointManager::save_final(int64_t global_step) {
  if (cfg_.save.empty()) return;
  engine_.to_host();  // buffers were averaged before the last evaluation; parameters are equal by
                      // construction
  refuse_nonfinite(cfg_.save);
  if (comm_.rank() == 0) {
    const Meta meta = metadata(cfg_.epochs, global_step);
    try {
      save_model(cfg_.save, model_, meta, nullptr, "--save");
    } catch (const Error& e) {
      // The run's result outlives the error: the job still ends with it (exit 2, the file asked
      // for is not there), and the message says where the model is.
      const std::string where = saved_at(global_step) && !last_saved_file_.empty()
                                    ? "the trained model is in this run's checkpoint " +
                                          last_saved_file_ + " (global step " +
                                          std::to_string(global_step) +
                                          "), which evaluate, predict and --init-from read"
                                    : rescue_model(meta);
      throw Error(e.kind(), std::string(e.what()) + "; " + where);
    }
  }
  comm_.barrier("barrier after rank 0 wrote --save " + cfg_.save);
  log_info("saved " + cfg_.save);
}

// A --save that failed, written elsewhere: a new directory under $TMPDIR (else /tmp), then
// /dev/shm (memory: there when the disks are full), made by mkdtemp, so it is this user's alone
// (mode 0700; the model may be private, and /tmp is shared) and nothing planted there can be
// written through. The file keeps --save's name. Returns the message's tail: where the model is,
// or why no copy could be written.
std::string CheckpointManager::rescue_model(const Meta& meta) const {
  const char* env = std::getenv("TMPDIR");
  const std::string name = std::filesystem::path(cfg_.save).filename().string();
  std::string why;
  for (const std::string& parent :
       {std::string(env && *env ? env : "/tmp"), std::string("/dev/shm")}) {
    std::string dir = parent + "/dptrain-rescue-XXXXXX";
    if (!::mkdtemp(dir.data())) {
      why += "; " + parent + ": " + std::strerror(errno);
      continue;
    }
    const std::string file = dir + "/" + name;
    try {
      save_model(file, model_, meta, nullptr, "the copy of --save");
      return "the trained model was written to " + file +
             " instead (a directory only this user can read): move it where it belongs";
    } catch (const Error& e) {
      why += std::string("; ") + e.what();
      ::rmdir(dir.c_str());
    }
  }
  return "no copy could be written elsewhere either" + why + "; the trained model is lost";
}

// Metadata of --save files and checkpoints alike; checkpoints add their position in the epoch.
CheckpointManager::Meta CheckpointManager::metadata(int64_t epoch, int64_t global_step) const {
  Meta m{{"config", cfg_.to_json()},
         {"epoch", std::to_string(epoch)},
         {"step", std::to_string(global_step)},
         {"seed", std::to_string(cfg_.seed)},
         {"world_size", std::to_string(comm_.size())}};
  m.insert(input_.begin(), input_.end());
  return m;
}

// Nothing non-finite is ever written over a good file (a BatchNorm buffer can still take a NaN
// from a forward pass whose step was then skipped). The host state is the same on every rank
// (parameters by construction, buffers averaged, the optimizer's state), so every rank refuses
// alike.
void CheckpointManager::refuse_nonfinite(const std::string& path) const {
  auto finite = [](const float* v, int64_t n) {
    return std::all_of(v, v + n, [](float x) { return std::isfinite(x); });
  };
  std::string bad;
  for (const Param& p : model_.store().entries())
    if (bad.empty() && !finite(p.value.data(), p.numel())) bad = p.name;
  for (const auto& [name, values] : opt_.state().buffers)
    if (bad.empty() && !finite(values->data(), static_cast<int64_t>(values->size()))) bad = name;
  if (!bad.empty())
    throw AgreedInputError(
        DPT_MSG("not writing " << path << ": '" << bad << "' holds non-finite values (the file "
                               << "there, if any, is kept)"),
        comm_.rank() != 0);
}

}  // namespace dpt
