// What this build is, for `dptrain --version` and for reports: dptrain's version and git revision,
// the compiler, the backends (oneDNN, the CUDA libraries loaded, the devices visible) and MPI, as
// PyTorch's collect_env gathers them for a bug report.
#pragma once

#include <string>

namespace dpt {

// Several lines, each "name: value", ending in a newline.
std::string version_report();

// What the ranks of a job compare at start-up (preflight.cc) to know they run one build:
// "0.1.0 (git <40 hex digits>)". A revision that does not tell the source (`-dirty`: uncommitted
// changes; `unknown`: built outside git) adds the binary's GNU build-id, a hash of the linked
// program, so two different dirty builds of one commit differ while copies of one binary agree.
std::string build_identity();

}  // namespace dpt
