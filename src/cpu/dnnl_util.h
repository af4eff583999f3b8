// The process-wide oneDNN CPU engine and stream, and a debug line naming the implementation
// oneDNN picked for a primitive (brgconv, jit, gemm: the speed depends on it).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>
#include <string>

namespace dpt::cpu {

dnnl::engine& dnnl_engine();
dnnl::stream& dnnl_stream();
void log_dnnl_choice(const char* what, const std::string& impl);

}  // namespace dpt::cpu
