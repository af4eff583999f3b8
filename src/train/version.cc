// version_report (include/dpt/version.h). The git revision is the dptrain binary's alone: a file
// meson regenerates at every build (src/revision.cc.in, through vcs_tag) defines it, linked into
// dptrain and not into the library, so a commit relinks one program, not every test; elsewhere
// (a test linking the library) the weak reference below is null and the revision "unknown".
#include "dpt/version.h"

#include <elf.h>
#include <link.h>

#include <cstring>

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

// The program's NT_GNU_BUILD_ID note in hex ("" without one): the first object dl_iterate_phdr
// reports is the program itself.
std::string program_build_id() {
  std::string id;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) -> int {
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_NOTE) continue;
          const char* at = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
          const char* end = at + ph.p_memsz;
          while (at + sizeof(ElfW(Nhdr)) <= end) {
            ElfW(Nhdr) nh;
            std::memcpy(&nh, at, sizeof nh);
            const char* name = at + sizeof nh;
            const char* desc = name + ((nh.n_namesz + 3) & ~3u);
            if (desc + nh.n_descsz > end) break;
            if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 &&
                std::memcmp(name, "GNU", 4) == 0) {
              static const char* hex = "0123456789abcdef";
              auto* s = static_cast<std::string*>(out);
              for (uint32_t k = 0; k < nh.n_descsz; ++k) {
                const auto b = static_cast<unsigned char>(desc[k]);
                s->push_back(hex[b >> 4]), s->push_back(hex[b & 15]);
              }
              return 1;
            }
            at = desc + ((nh.n_descsz + 3) & ~3u);
          }
        }
        return 1;  // the program only
      },
      &id);
  return id;
}

}  // namespace

namespace dpt {

std::string version_report() {
  const char* revision = dpt_build_revision ? dpt_build_revision() : "unknown";
  return DPT_MSG("dptrain " << DPT_VERSION << " (git " << revision << ")\n"
                            << "compiler: " << kCompiler << " (C++ " << __cplusplus << ")\n"
                            << backends_report() << "\n"
                            << "MPI: " << mpi_library_version() << "\n");
}

std::string build_identity() {
  const std::string revision = dpt_build_revision ? dpt_build_revision() : "unknown";
  std::string text = DPT_MSG(DPT_VERSION << " (git " << revision);
  if (revision == "unknown" || revision.ends_with("-dirty")) {
    const std::string id = program_build_id();
    text += ", build-id " + (id.empty() ? std::string("none") : id);
  }
  return text + ")";
}

}  // namespace dpt
