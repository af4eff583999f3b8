// Timeline tracing for --trace: spans (name, category, thread, start, end) recorded by the
// training thread and the communication thread of each rank, written as a Chrome-trace /
// Perfetto JSON file (one process per rank: pid = rank; tid 0 = compute, tid 1 = communication).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace dpt {

class Communicator;

class Tracer {
 public:
  enum Tid { kCompute = 0, kComm = 1 };
  // The spans one job keeps, over all its ranks (each keeps its share): about 0.5 GB of JSON.
  // An unbounded window (--trace-steps 0:1000000000) grew every rank's memory step after step,
  // and the end of the run built the file several times over in memory (a JSON tree of every
  // event, then its text on every rank, then on rank 0 all ranks' twice): the OOM killer, or,
  // past 2 GiB of one rank's text, exit 3 ("collective count ... out of range"), and either
  // before --save was written. Spans past a rank's share are dropped and counted (write()).
  static constexpr int64_t kMaxSpans = int64_t{1} << 22;
  explicit Tracer(int64_t max_spans = kMaxSpans) : max_spans_(max_spans) {}
  // Microseconds on this process's steady clock, relative to the origin set by start().
  double now_us() const;
  // Aligns ranks (a barrier, then each takes its clock as time zero), sets this rank's share of
  // the spans and starts recording.
  void start(Communicator& comm);
  void stop() { active_ = false; }
  bool active() const { return active_; }
  // Thread-safe (the reducer's thread records bucket all-reduces).
  void span(const std::string& name, const char* category, Tid tid, double t0_us, double t1_us);
  // Gathers every rank's spans to rank 0, which writes the JSON file (atomically; input error on a
  // failure to write, after every collective). Every rank returns the number of spans the job
  // dropped past the ranks' shares.
  int64_t write(Communicator& comm, const std::string& path, const std::string& host);
  size_t size() const { return spans_.size(); }
  int64_t share() const { return share_; }  // spans this rank keeps (set by start())

 private:
  struct Span {
    std::string name;
    const char* category;
    int tid;
    double t0, t1;
  };
  std::vector<Span> spans_;
  std::mutex mu_;
  double origin_ = 0;
  std::atomic<bool> active_{false};
  int64_t max_spans_, share_ = 0, dropped_ = 0;
};

// Records [construction, destruction) as one span when the tracer is active.
class TraceScope {
 public:
  TraceScope(Tracer* t, const char* name, const char* category, Tracer::Tid tid = Tracer::kCompute)
      : t_(t && t->active() ? t : nullptr),
        name_(name),
        category_(category),
        tid_(tid),
        t0_(t_ ? t_->now_us() : 0) {}
  ~TraceScope() {
    if (t_) t_->span(name_, category_, tid_, t0_, t_->now_us());
  }

 private:
  Tracer* t_;
  const char* name_;
  const char* category_;
  Tracer::Tid tid_;
  double t0_;
};

}  // namespace dpt
