// The CPU's ComputeDevice (include/dpt/device.h): oneDNN's operations, gradients through the
// Reducer's MPI thread, and the host's available memory (MemAvailable or a cgroup's limit).
#include "cpu/device.h"

#include <oneapi/dnnl/dnnl.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

#include "cpu/cpu_backend.h"
#include "cpu/isa.h"
#include "dpt/backend.h"
#include "dpt/error.h"
#include "dpt/text.h"

namespace dpt {

namespace {

// DPT_MEMORY_AVAILABLE: bytes, or with a suffix K, M, G or T (powers of 1024).
double memory_override(const char* v) {
  // The digits are read as every number a user types is (text.h's read_number): decimal only.
  const std::string_view text(v);
  const size_t at = text.empty() ? std::string::npos : std::string("KMGT").find(text.back());
  const size_t power = at == std::string::npos ? 0 : at + 1;  // K: 1024^1
  const std::optional<unsigned long long> read =
      read_number<unsigned long long>(text.substr(0, text.size() - (power ? 1 : 0)));
  const unsigned long long n = read.value_or(0);
  DPT_INPUT_CHECK(read && n > 0, "DPT_MEMORY_AVAILABLE="
                                     << v
                                     << ": not a number of bytes above 0 (e.g. 1073741824, or 1G; "
                                     << "suffixes K, M, G, T)");
  return static_cast<double>(n) * std::pow(1024.0, static_cast<double>(power));
}

}  // namespace

HostMemory host_memory() {
  if (const char* v = std::getenv("DPT_MEMORY_AVAILABLE"); v && *v)
    return {memory_override(v), "DPT_MEMORY_AVAILABLE"};
  HostMemory m{-1, "MemAvailable"};
  std::ifstream mi("/proc/meminfo");
  for (std::string key; mi >> key;) {
    double kb = 0;
    mi >> kb;
    mi.ignore(64, '\n');
    if (key == "MemAvailable:") m.bytes = kb * 1024;
  }
  auto read_number = [](const char* path) {
    std::ifstream f(path);
    double v = -1;
    return (f >> v) ? v : -1.0;
  };
  for (const auto& [limit, usage] :
       {std::pair{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
        {"/sys/fs/cgroup/memory/memory.limit_in_bytes",
         "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const double l = read_number(limit), u = read_number(usage);  // "max" reads as no number
    if (l > 0 && u >= 0 && l < 1e18 && (m.bytes < 0 || l - u < m.bytes))
      m = {std::max(0.0, l - u), DPT_MSG("the memory cgroup's limit less its usage, " << limit)};
  }
  return m;
}

double host_available_bytes() { return host_memory().bytes; }

namespace {

// The host: oneDNN's operations (with bf16, the backend whose convolutions and Linear GEMMs take
// bf16 operands); gradients leave through the Reducer's MPI thread.
class CpuDevice final : public ComputeDevice {
 public:
  // bf16 on a CPU without bf16 instructions would run oneDNN's reference kernels (or none): many
  // times slower than fp32, so it is refused rather than emulated. An input error: the pre-flight
  // opens the device under agree_on_input, after the ranks agreed on --precision.
  explicit CpuDevice(const DeviceRequest& r) : request_(r) {
    if (!r.bf16) return;
    const std::string missing = cpu::cpu_bf16_missing();
    DPT_INPUT_CHECK(missing.empty(), "--precision bf16 on the CPU needs AVX512-BF16 or AMX-BF16: "
                                         << missing << "; use --precision fp32 on this machine");
  }
  const char* kind() const override { return "cpu"; }
  Backend& ops() override { return request_.bf16 ? cpu::cpu_backend_bf16() : cpu_backend(); }
  // Once per host (its first rank): the estimate covers every rank there. MemAvailable already
  // lacks what the ranks have loaded (libraries, the data set); their models are not built yet,
  // so each one's fixed memory is counted (model_fixed).
  DeviceMemory memory(int) override {
    DeviceMemory m;
    m.model_fixed = true;
    m.checks = request_.local_rank == 0;
    if (m.checks) m.free_bytes = host_available_bytes();
    m.sharing = request_.ranks_here;
    m.where = "on this host";
    return m;
  }
  std::unique_ptr<ReduceTransport> transport(Communicator&, float*, int64_t, DType) override {
    return nullptr;
  }
  // With --precision bf16 the convolutions read and write bf16 activations directly and every
  // other activation loop runs in one pass on bf16 (src/cpu/ops.h): ResNet-18 steps 8 % faster
  // than on fp32 activations, in 2/3 of the memory (AMD EPYC Zen 4, docs/PERFORMANCE.md). Every
  // rank of a bf16 run has the instructions (the constructor refuses it otherwise), so the rule is
  // the same on every rank.
  bool fast_bf16_activations() override { return request_.bf16; }

 private:
  DeviceRequest request_;
};

}  // namespace

std::unique_ptr<ComputeDevice> open_cpu_device(const DeviceRequest& request) {
  return std::make_unique<CpuDevice>(request);
}

std::string cpu_backend_report() {
  const dnnl_version_t* v = dnnl_version();
  const std::string bf16 = cpu::cpu_bf16_missing();
  return DPT_MSG("CPU backend: oneDNN "
                 << v->major << "." << v->minor << "." << v->patch << " (" << v->hash << "); loops "
                 << cpu::isa_report()
                 << "; --precision bf16: " << (bf16.empty() ? "available" : bf16));
}

}  // namespace dpt
