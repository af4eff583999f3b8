// The instruction-set levels dptrain's own CPU loops are compiled for (generic x86-64, AVX2 + FMA,
// AVX-512) and the one place that decides which of them this process runs: the best the CPU and
// OS support, lowered by DPT_ISA=avx512|avx2|generic (read once). oneDNN dispatches on its own
// (ONEDNN_MAX_CPU_ISA caps it); isa_report() names both.
#pragma once

#include <string>

namespace dpt::cpu {

enum class Isa : int { kGeneric = 0, kAvx2 = 1, kAvx512 = 2 };
inline constexpr Isa kAllIsas[] = {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512};

const char* isa_name(Isa isa);  // "generic", "avx2", "avx512"
// "avx512" | "avx2" | "generic" -> the level; anything else is an input error naming `what`.
Isa parse_isa(const std::string& s, const char* what = "DPT_ISA");
// The best level this CPU runs (x86-64-v4 / -v3 features, with the OS saving their registers).
Isa cpu_isa();
// The level the loops run at: cpu_isa(), or DPT_ISA when that is lower (a DPT_ISA above the CPU
// is lowered with a warning; an unknown value is an input error). Decided on the first call and
// logged at debug level on every rank.
Isa active_isa();
// One line for logs and benchmarks: "avx512 (CPU: avx512; oneDNN: avx512_core_bf16)", with
// DPT_ISA named when it lowered the level.
std::string isa_report();

// Tests: runs the loops at `isa` (at most cpu_isa()) until destroyed, within one process; not
// for use while other threads run kernels.
class ScopedIsa {
 public:
  explicit ScopedIsa(Isa isa);
  ~ScopedIsa();
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;

 private:
  Isa previous_;
};

// The entry of `tables` (indexed by Isa: generic, avx2, avx512) for the active level: how a file
// of per-ISA loops (isa_targets.inc) hands out its functions.
template <class Table>
const Table& for_active_isa(const Table (&tables)[3]) {
  return tables[static_cast<int>(active_isa())];
}

}  // namespace dpt::cpu
