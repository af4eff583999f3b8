// StreamGraph (see cuda_graph.h): thread-local stream capture, instantiate, launch; a failed
// capture is ended and dropped so the stream is usable again. Only compiled in GPU builds.
#include "cuda/cuda_graph.h"

#include <atomic>
#include <exception>

#include "cuda/cuda_check.h"
#include "cuda/gpu_context.h"

namespace dpt::gpu {

namespace {
std::atomic<uint64_t> g_launches{0};

void launch(cudaGraphExec_t exec, cudaStream_t stream) {
  CUDA_CHECK(cudaGraphLaunch(exec, stream));
  g_launches.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

uint64_t StreamGraph::launches() { return g_launches.load(std::memory_order_relaxed); }

StreamGraph::~StreamGraph() { reset(); }

void StreamGraph::reset() {
  if (exec_) cudaGraphExecDestroy(exec_);
  exec_ = nullptr;
  nodes_ = 0;
}

bool StreamGraph::valid() const { return exec_ && captured_at_ == DeviceBuffer::allocations(); }

bool StreamGraph::warm() const { return eager_at_ == DeviceBuffer::allocations(); }

StreamGraph::Ran StreamGraph::run(cudaStream_t stream, bool capture,
                                  const std::function<void(bool)>& prepare,
                                  const std::function<void()>& body,
                                  const std::function<bool(bool)>& agree) {
  eager_at_ = ~uint64_t{0};
  if (valid()) {
    launch(exec_, stream);
    return Ran::kReplayed;
  }
  reset();
  if (capture) {
    const uint64_t before = DeviceBuffer::allocations();
    std::string error;
    bool capturing = false;
    // Whatever fails here, every rank still reaches agree() below (it may be a collective).
    try {
      prepare(true);
      // Thread-local mode: a call in this thread that would be unsafe inside a capture (an implicit
      // synchronisation, an allocation) fails instead of silently running outside the graph.
      CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      capturing = true;
      body();
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "an unknown exception";
    }
    cudaGraph_t graph = nullptr;
    if (capturing) {
      const cudaError_t end =
          cudaStreamEndCapture(stream, &graph);  // ends the capture, failed or not
      if (error.empty() && end != cudaSuccess)
        error = DPT_MSG("cudaStreamEndCapture: " << cudaGetErrorString(end));
    }
    if (error.empty() && DeviceBuffer::allocations() != before)
      error = "the work allocated device memory";
    cudaGraphExec_t exec = nullptr;
    size_t nodes = 0;
    if (error.empty()) {
      cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
      if (e == cudaSuccess) e = cudaGraphGetNodes(graph, nullptr, &nodes);
      if (e != cudaSuccess) error = DPT_MSG("graph instantiation: " << cudaGetErrorString(e));
    }
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();  // a failed capture may leave its error as this thread's last one
    // Every rank's verdict before any rank launches: a collective is captured on all ranks or none.
    const bool all_ok = agree(error.empty());
    if (all_ok) {
      exec_ = exec;
      nodes_ = nodes;
      captured_at_ = before;
      failure_.clear();
      launch(exec_, stream);
      return Ran::kCaptured;
    }
    if (exec) cudaGraphExecDestroy(exec);
    failure_ = error.empty() ? "the capture failed on another rank" : error;
  }
  prepare(false);
  const uint64_t eager_before = DeviceBuffer::allocations();
  body();
  if (DeviceBuffer::allocations() == eager_before) eager_at_ = eager_before;  // warm(): see .h
  return Ran::kEager;
}

}  // namespace dpt::gpu
