// The command-line flags, one table (src/train/flags.cc): each flag's name, --help group and
// text, the TrainConfig field it sets and how, its default, its JSON name and what the ranks (and a
// resumed run) must agree on. The parser, TrainConfig::to_json, agreed_values and
// may_change_on_resume all read it: adding a flag is a TrainConfig field and one entry (an
// integer's range in the entry, anything else in validate_config).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "dpt/config.h"

namespace dpt {

// The commands that take a flag, as a bit set: `dptrain [train]`, `dptrain evaluate` and
// `dptrain predict` (src/train/infer.cc) each take their subset of the table.
enum Command : unsigned {
  kCommandTrain = 1u,
  kCommandEvaluate = 2u,
  kCommandPredict = 4u,
  kCommandAny = kCommandTrain | kCommandEvaluate | kCommandPredict,
  kCommandScore = kCommandEvaluate | kCommandPredict,  // the commands that run a saved model
};
// The command word's bit ("train", "evaluate", "predict"); 0 for any other word.
unsigned command_bit(const std::string& command);

// What ranks must share, checked before training (agreed_values) and against a resumed
// checkpoint's configuration (may_change_on_resume).
enum class Agreement {
  kFree,       // may differ between ranks: paths, threads, logging, --timeout
  kFixed,      // the same on every rank, and a resumed run must keep the checkpoint's value
  kResumable,  // the same on every rank; a resumed run may change it (outputs, checks, --device)
  kGiven,  // only whether it is given is agreed (it decides collectives); a resume may change it
};

// How the flag reads its value.
enum class FlagKind {
  kValue,    // --name V, converted by cxxopts to the field's type
  kSwitch,   // --name: the bool field becomes true
  kNegated,  // --no-x: the bool field (true by default) becomes false
  kCustom,   // --name V, read by the entry's `parse` (a syntax of its own, or several fields)
};

// Where the value comes from when the flag is not given.
enum class Default {
  kConfig,  // TrainConfig's initial value, shown in --help
  kRecipe,  // apply_recipe's, for the model and recipe; an explicit value wins
  kNone,    // none: the field keeps its initial value (an empty path or list)
};

// A TrainConfig field, or (for a value computed from several fields) a function giving its text.
using ConfigField =
    std::variant<std::monostate, std::string TrainConfig::*, bool TrainConfig::*,
                 int TrainConfig::*, int64_t TrainConfig::*, uint64_t TrainConfig::*,
                 double TrainConfig::*, std::vector<int> TrainConfig::*,
                 std::vector<double> TrainConfig::*, std::string (*)(const TrainConfig&)>;

// One key of TrainConfig::to_json (and so of checkpoints' metadata).
struct JsonValue {
  std::string key;
  ConfigField field = {};  // what it holds; the flag's own field when it sets one
  // Its name in agreed_values: "--" + the flag's name, unless one flag sets several keys.
  std::string agreed_as = {};
};

struct Flag {
  std::string name;  // without "--"
  std::string group;
  std::string help;
  ConfigField field = {};  // what it sets (kValue, kSwitch, kNegated); kCustom: see `parse`
  Agreement agreement = Agreement::kFree;
  FlagKind kind = FlagKind::kValue;
  Default from = Default::kConfig;
  bool path = false;  // an empty value is refused (an unset variable), never "not given"
  // kCustom: reads the value into the configuration (an input error naming the flag otherwise),
  // and writes a configuration's value as the flag would take it (--help shows the default's).
  void (*parse)(const std::string& value, TrainConfig* cfg) = nullptr;
  std::string (*format)(const TrainConfig& cfg) = nullptr;
  // Its keys in to_json. flags() fills what an entry leaves out: one key, the name with '_' for
  // '-', holding `field` (or `format` for kCustom); the field; the agreed name.
  std::vector<JsonValue> json = {};
  unsigned commands = kCommandTrain;
  // An integer flag's range (each item's, for a list): [min, max], max the field type's largest
  // when unset; no check when both are unset. The parser refuses a value past the type's range
  // with this range (not the type's, "from -2147483648"), validate_config one inside it.
  std::optional<int64_t> min = std::nullopt, max = std::nullopt;
};

// Every flag, in --help's order within each group.
const std::vector<Flag>& flags();

// validate_config's check of every integer flag with a range (Flag::min, max): the first value
// outside it is an input error, worded as the parser's for a value past the field's type.
void check_flag_ranges(const TrainConfig& cfg);

}  // namespace dpt
