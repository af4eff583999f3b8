// Which instruction-set level dptrain's own CPU loops run at (see isa.h): detected once from the
// CPU, lowered by DPT_ISA, overridable by tests; and the report line naming it beside oneDNN's.
#include "cpu/isa.h"

#include <oneapi/dnnl/dnnl.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "dpt/error.h"
#include "dpt/log.h"

namespace dpt::cpu {

namespace {

// The level in use: written once by active_isa()'s decision, then only by a test's ScopedIsa.
std::atomic<int> g_active{0};

// What oneDNN's own dispatch settled on (its names, as ONEDNN_VERBOSE prints them).
std::string onednn_isa() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41:
      return "sse41";
    case dnnl_cpu_isa_avx:
      return "avx";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    default: {
      char hex[32];
      std::snprintf(hex, sizeof hex, "isa 0x%x",
                    static_cast<unsigned>(dnnl_get_effective_cpu_isa()));
      return hex;
    }
  }
}

const char* requested() {
  const char* e = std::getenv("DPT_ISA");
  return e && *e ? e : nullptr;
}

Isa decide() {
  const Isa best = cpu_isa();
  const char* want = requested();
  if (!want) return best;
  const Isa asked = parse_isa(want);
  if (asked <= best) return asked;
  log_warn(DPT_MSG("DPT_ISA=" << want << ", but this CPU runs only " << isa_name(best) << ": using "
                              << isa_name(best)));
  return best;
}

std::string report(Isa isa) {
  std::string s = DPT_MSG(isa_name(isa) << " (CPU: " << isa_name(cpu_isa()));
  if (const char* want = requested()) s += DPT_MSG("; DPT_ISA=" << want);
  return s + "; oneDNN: " + onednn_isa() + ")";
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kGeneric:
      break;
  }
  return "generic";
}

Isa parse_isa(const std::string& s, const char* what) {
  for (Isa isa : kAllIsas)
    if (s == isa_name(isa)) return isa;
  DPT_INPUT_CHECK(false, what << "=" << s << ": expected avx512, avx2 or generic");
  return Isa::kGeneric;
}

Isa cpu_isa() {
  // The levels the loops are compiled for (isa_targets.inc): x86-64-v4 is AVX-512 F/BW/CD/DQ/VL
  // on top of -v3 (AVX2, FMA, BMI1/2, F16C, LZCNT, MOVBE). libgcc checks that the OS saves the
  // wider registers (XGETBV) before it reports them.
  static const Isa best = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4")) return Isa::kAvx512;
    if (__builtin_cpu_supports("x86-64-v3")) return Isa::kAvx2;
    return Isa::kGeneric;
  }();
  return best;
}

Isa active_isa() {
  // The first call decides (a magic static: concurrent first calls wait for that one decision).
  static const bool decided = [] {
    const Isa isa = decide();
    g_active.store(static_cast<int>(isa), std::memory_order_relaxed);
    log_debug("CPU loops: " + report(isa));
    return true;
  }();
  (void)decided;
  return static_cast<Isa>(g_active.load(std::memory_order_relaxed));
}

std::string isa_report() { return report(active_isa()); }

ScopedIsa::ScopedIsa(Isa isa) : previous_(active_isa()) {
  DPT_CHECK(isa <= cpu_isa(),
            "ScopedIsa(" << isa_name(isa) << ") on a CPU that runs only " << isa_name(cpu_isa()));
  g_active.store(static_cast<int>(isa), std::memory_order_release);
}

ScopedIsa::~ScopedIsa() { g_active.store(static_cast<int>(previous_), std::memory_order_release); }

}  // namespace dpt::cpu
