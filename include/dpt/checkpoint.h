// Training checkpoints: the CheckpointManager owns everything about them, so "where is a
// checkpoint written" has one answer. It loads one into a position (--resume FILE|auto), decides
// when one is due (--checkpoint-every N|Nepochs|Nsteps|Nmin, and on a stop), writes it (never a
// non-finite state), keeps the newest --keep-checkpoints of its own training, and writes --save at
// the end. Each checkpoint records the training that wrote it (an id made when that training
// started, kept across resumes), so trainings that share a directory never prune, overwrite or
// resume each other's files. Killed writers' temporaries of its names are the pre-flight's to
// remove (check_outputs, once it holds --checkpoint-path's lock; is_checkpoint_name says which).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dpt/config.h"
#include "dpt/files.h"
#include "dpt/metrics.h"
#include "dpt/model_file.h"
#include "dpt/optimizer.h"

namespace dpt {

class Communicator;
class DataParallel;
class StepEngine;

// A training's place at a step boundary: the epoch in progress (0-based; at an epoch's end, the
// epochs done), the steps done in it, and the steps done in all.
struct Position {
  int64_t epoch = 0, epoch_step = 0, global_step = 0;
};

// Where a run starts. With --allow-config-change and other settings than the checkpoint's, the
// images per step it was written with (0: unchanged), so the position can be recomputed.
struct ResumePoint {
  Position at;
  int64_t images_per_step_then = 0;
  std::vector<EpochMetrics> history;  // the epochs before (the report draws them again)
  bool resumed = false;               // false: a fresh start (no --resume, or auto found nothing)
  // The sums of the epoch up to `at` (zero when `at` starts an epoch, or the checkpoint predates
  // them).
  EpochSoFar so_far;
};

// The metadata schema of a checkpoint, read from its header alone (safetensors' read_metadata:
// the file is not trusted, a name says nothing), and, in a survey, what the directory entry is.
struct CheckpointInfo {
  std::string path;
  bool readable = false;  // a safetensors header that passed every check
  int64_t step = -1;      // the global step it records; -1: not a training checkpoint
  std::string training;   // the id of the training that wrote it ("" before ids were recorded)
  std::string started;    // when that training started (UTC)
  std::string config;     // the configuration's JSON it was written with ("" when not recorded)
  std::map<std::string, std::string> digests;  // the data digests it records (kDataDigests' keys)
  bool junk = false;  // unreadable, and not a safetensors file at all (read_checkpoint_info)
  std::string error;  // why the header could not be read ("" when readable)
  // The rest is the survey's (survey_checkpoints): read_checkpoint_info alone leaves them.
  // The step its name says ("<stem>.step<N><ext>"); -1 for --checkpoint-path itself.
  int64_t name_step = -1;
  bool regular = false;  // a regular file (or a symlink to one): the only kind whose header is read
  bool link = false;     // a symbolic link
  int64_t bytes = -1;    // a regular file's size
  // Why no checkpoint can be renamed over it ("a directory", "a FIFO", "a dangling symbolic link",
  // another user's file in a sticky directory, ...); "" when one can.
  std::string unreplaceable;
};
CheckpointInfo read_checkpoint_info(const std::string& path);

// One look at the checkpoint directory: every entry at one of this configuration's checkpoint
// names (--checkpoint-path and "<stem>.step<N><ext>" beside it), whatever it is, classified and,
// where it is a regular file, its header read. The pre-flight takes it once (check_outputs, under
// --checkpoint-path's lock where the run takes one) and every step of the start-up reads that one:
// the outputs' check against --resume auto's inputs, the activation type a resume keeps, the file
// --resume auto takes and the names claim may overwrite. Each listed and read the directory again,
// so a shared directory written meanwhile (another run's new checkpoint) gave them different files:
// the activation type could come from one file and the resume from another.
struct CheckpointSurvey {
  bool taken = false;  // false: none taken (ranks other than 0; a run that needs none)
  // Newest first by the step each records; entries that record none (unreadable headers, --save
  // files, anything not a regular file) after them, newest first by the step their names say, so
  // that a listing of them reads in the checkpoints' order (step100, step10, step9: not the text
  // order), --checkpoint-path itself last among them.
  std::vector<CheckpointInfo> entries;
  // The directory's entries named as AtomicFile's temporaries (files.h's parse_atomic_temp), of any
  // target: the pre-flight removes those of dead writers from this listing.
  std::vector<std::string> temporaries;
};
CheckpointSurvey survey_checkpoints(const TrainConfig& cfg);

// The activation type recorded by the checkpoint a run resumes: --resume FILE's, or for --resume
// auto the first file of `survey` that CheckpointManager::load would resume (the same choice of
// training, by settings and data `digests`, input_metadata's keys; headers only; rank 0): kF32 or
// kBF16; a checkpoint from before types were recorded says "auto", which was fp32 then; none when
// there is no such file or it records no configuration. --activation-dtype auto on a resume follows
// it, so a run continues in the type it was trained in even where auto now resolves to the other.
std::optional<DType> resumed_activation_dtype(
    const TrainConfig& cfg, const CheckpointSurvey& survey,
    const std::map<std::string, std::string>& digests = {});

// The file of a checkpoint at `global_step`: --checkpoint-path itself, or with --keep-checkpoints
// "<stem>.step<N><ext>" beside it.
std::string checkpoint_file(const TrainConfig& cfg, int64_t global_step);
// Whether `name` (a file name, no directory) is one of this configuration's checkpoint names:
// --checkpoint-path's own, or a step-named one beside it ("<stem>.step<digits><ext>", no leading
// zero: the operator's "ck.step4.mybackup.st" or "ck.step0014.st" is none).
bool is_checkpoint_name(const TrainConfig& cfg, const std::string& name);

class CheckpointManager {
 public:
  // `input`: what the data made of the run (data_input_metadata), written into every file.
  CheckpointManager(const TrainConfig& cfg, Communicator& comm, Model& model, DataParallel& ddp,
                    Optimizer& opt, StepEngine& engine,
                    std::map<std::string, std::string> input = {});

  // --resume: rank 0 reads the file (no shared file system needed; under auto the one `survey`
  // points to, which must still be what the survey saw) into the host model and Optimizer (a
  // checkpoint of another optimizer is refused, --allow-config-change or not); the other ranks take
  // its state and position by broadcast; the engine takes the host state and, under --normalize
  // auto, the statistics the file records. A bad file, or one written with other settings or data
  // (its digests against `input`'s) without --allow-config-change, ends every rank with exit 2.
  // Collective.
  ResumePoint load(const CheckpointSurvey& survey);
  // Refuses (exit 2, agreed) a run whose checkpoints would overwrite another training's file: the
  // names it may still write, up to `last_step`, must not hold one. Each other file there (an
  // empty or junk file, a damaged or id-less checkpoint, a --save file) is named in a warning, with
  // what it is, before the run replaces it. Reads `survey` (rank 0), the pre-flight's: a training
  // started beside this run since is refused by save's own check before each write. Collective.
  void claim(int64_t start_step, int64_t last_step, const CheckpointSurvey& survey);

  // Whether --checkpoint-every Nmin is due by this rank's clock (rank 0's decides, agreed by the
  // caller in the step boundary's all-reduce).
  bool minutes_due() const;
  // The checkpoint due at `at`, if any: at an epoch's end (`epoch_end`) by epochs or steps; at a
  // boundary inside an epoch by steps, or by minutes when `minutes_due` (agreed). Collective.
  // `so_far` gives the epoch's running sums (a collective itself): called only when one is due.
  bool save_if_due(const Position& at, bool epoch_end, bool minutes_due,
                   const std::vector<EpochMetrics>& history,
                   const std::function<EpochSoFar()>& so_far = nullptr);
  // The checkpoint at `at`, now (a stop signal). `so_far`, when given, is recorded if `at` is
  // inside an epoch. Collective.
  void save(const Position& at, const std::vector<EpochMetrics>& history,
            const std::optional<EpochSoFar>& so_far = std::nullopt);
  // The most bytes of epoch records (their JSON) a checkpoint keeps: the newest that fit. A
  // checkpoint's metadata goes in the safetensors header, which readers (this one too) refuse above
  // 100 MB; the records grow by about 0.7 KB an epoch, plus 44 bytes per rank (at 1024 ranks, 2,000
  // epochs), and past the limit every checkpoint written was unreadable, found out only at the
  // resume.
  static constexpr size_t kHistoryBytes = size_t{32} << 20;
  // --save at the end (if given). Collective. Where rank 0 cannot write it (a full disk, a quota,
  // a directory gone or made read-only during the run), the trained model is not lost with the
  // error: the message names this run's checkpoint of the same step, or, without one, the copy
  // written to a new private directory under $TMPDIR (else /tmp) or /dev/shm (rescue_model).
  void save_final(int64_t global_step);
  // At the end of a run that trained since its last checkpoint (with checkpoints on): one more at
  // `at`, so that the same command line run again (--resume auto) finds the run finished instead
  // of training its last stretch again. Collective.
  void save_last(const Position& at, const std::vector<EpochMetrics>& history);

  const std::string& training_id() const { return training_; }
  // Whether this run wrote its checkpoint of `global_step` already (a stop at the boundary after
  // an epoch's end then has nothing to add to it).
  bool saved_at(int64_t global_step) const { return last_saved_step_ == global_step; }

 private:
  using Meta = std::map<std::string, std::string>;
  Meta metadata(int64_t epoch, int64_t global_step) const;
  void refuse_nonfinite(const std::string& path) const;
  std::string rescue_model(const Meta& meta) const;
  void prune() const;
  // claim's check that the step names ahead, of the survey's entries, can be written (rank 0).
  void refuse_unreplaceable(const CheckpointSurvey& survey, int64_t start_step,
                            int64_t last_step) const;
  void record(int64_t global_step, const std::string& file) const;
  std::string choose_auto(const CheckpointSurvey& survey, Meta* meta);

  const TrainConfig& cfg_;
  Communicator& comm_;
  Model& model_;
  DataParallel& ddp_;
  Optimizer& opt_;
  Meta input_;  // a resumed --normalize auto run's statistics replace the data's
  StepEngine& engine_;
  std::string training_, started_;  // this training's id and start (rank 0)
  std::string resumed_path_;        // the file resumed (rank 0)
  // Whether `path` names the file resumed (same_file: "ck.st" as typed and the survey's "./ck.st"
  // are one file; compared as text they were not, and the file resumed was warned about as one
  // this run replaces without continuing it).
  bool is_resumed(const std::string& path) const {
    return !resumed_path_.empty() && same_file(path, resumed_path_);
  }
  mutable std::set<std::string> unremovable_;  // files prune() could not remove, warned about once
  bool history_cut_said_ = false;              // the warning that records were left out, once
  double last_save_;
  int64_t last_saved_step_ = -1;  // the global step of this run's last checkpoint
  std::string last_saved_file_;   // and its file (rank 0)
};

}  // namespace dpt
