// What this build is, for `dptrain --version` and for reports: dptrain's version and git revision,
// the compiler, the backends (oneDNN, the CUDA libraries loaded, the devices visible) and MPI, as
// PyTorch's collect_env gathers them for a bug report.
#pragma once

#include <string>

namespace dpt {

// Several lines, each "name: value", ending in a newline.
std::string version_report();

}  // namespace dpt
