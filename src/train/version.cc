// version_report (include/dpt/version.h). The git revision is the dptrain binary's alone: a file
// meson regenerates at every build (src/revision.cc.in, through vcs_tag) defines it, linked into
// dptrain and not into the library, so a commit relinks one program, not every test; elsewhere
// (a test linking the library) the weak reference below is null and the revision "unknown".
#include "dpt/version.h"

#include "dpt/bootstrap.h"
#include "dpt/device.h"
#include "dpt/error.h"

extern "C" const char* dpt_build_revision() __attribute__((weak));

namespace {
#if defined(__clang__)
constexpr const char* kCompiler = "clang++ " __clang_version__;
#else
constexpr const char* kCompiler = "g++ " __VERSION__;
#endif
}  // namespace

namespace dpt {

std::string version_report() {
  const char* revision = dpt_build_revision ? dpt_build_revision() : "unknown";
  return DPT_MSG("dptrain " << DPT_VERSION << " (git " << revision << ")\n"
                            << "compiler: " << kCompiler << " (C++ " << __cplusplus << ")\n"
                            << backends_report() << "\n"
                            << "MPI: " << mpi_library_version() << "\n");
}

}  // namespace dpt
