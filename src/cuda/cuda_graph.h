// One piece of repeated stream work (a training step, an evaluation pass) replayed as a CUDA graph:
// run eagerly until warm, captured once, then launched as one graph. Cuts the per-kernel launch
// cost, which dominates small models such as LeNet on a large GPU. Only compiled in GPU builds.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>

namespace dpt::gpu {

class StreamGraph {
 public:
  enum class Ran { kEager, kCaptured, kReplayed };

  StreamGraph() = default;
  ~StreamGraph();
  StreamGraph(const StreamGraph&) = delete;
  StreamGraph& operator=(const StreamGraph&) = delete;

  // Queues body's work on `stream` (body queues everything on that stream, or on streams that
  // fork from and join back into it through events). The work is
  //  - replayed from the graph when one was captured and no DeviceBuffer was allocated since (a
  //    graph holds raw pointers; buffers only grow, so a new allocation may have freed one it
  //    uses);
  //  - else, when `capture` is true (the caller's decision: warm, and the same on every rank where
  //    the body holds collectives), captured; launched if agree(captured here) says every rank
  //    captured (a collective where the body holds collectives, else the identity);
  //  - else run eagerly.
  // `prepare(capturing)` runs before each attempt at body, outside any capture: the caller resets
  // its per-run state there and sets its capture switches (the reducer's); it is not called for a
  // replay, and a capture's switches stay set after run() returns. A capture that fails here or on
  // another rank throws nothing: it is dropped, failure() says why, prepare(false) runs and the
  // work runs eagerly instead; the caller decides whether to try again. Eager errors propagate.
  Ran run(cudaStream_t stream, bool capture, const std::function<void(bool capturing)>& prepare,
          const std::function<void()>& body, const std::function<bool(bool captured)>& agree);
  bool exists() const { return exec_ != nullptr; }
  // A graph exists and no allocation has happened since its capture.
  bool valid() const;
  // The last run() was eager, allocated nothing itself, and nothing has been allocated since: a
  // capture now would allocate nothing either (the same body, the same shapes), so it is the time
  // to capture. An eager run that allocated is not enough: the model's TensorPool may need more
  // than one step to settle (a buffer lent at one size in a step may be asked for at a larger one
  // in the next: LeNet's second step grows some), and a capture that allocates fails.
  bool warm() const;
  void reset();
  const std::string& failure() const { return failure_; }
  size_t nodes() const { return nodes_; }
  // Graph launches by every StreamGraph of this process so far (tests: graphs really ran).
  static uint64_t launches();

 private:
  cudaGraphExec_t exec_ = nullptr;
  uint64_t captured_at_ = 0;  // DeviceBuffer::allocations() at capture
  // DeviceBuffer::allocations() after the last run, if eager and it allocated nothing.
  uint64_t eager_at_ = ~uint64_t{0};
  size_t nodes_ = 0;
  std::string failure_;
};

}  // namespace dpt::gpu
