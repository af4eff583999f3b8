// Tracer (include/dpt/trace.h): spans in memory while active, gathered to rank 0 at the end and
// written as Chrome-trace JSON ("X" complete events plus process/thread names).
#include "dpt/trace.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dpt/clock.h"
#include "dpt/comm.h"
#include "dpt/error.h"
#include "dpt/files.h"

namespace dpt {

namespace {
double steady_us() { return now_seconds() * 1e6; }
}  // namespace

double Tracer::now_us() const { return steady_us() - origin_; }

void Tracer::start(Communicator& comm) {
  comm.barrier("barrier at the start of the --trace-steps window");
  share_ = std::max<int64_t>(max_spans_ / comm.size(), 1);
  origin_ = steady_us();
  active_ = true;
}

void Tracer::span(const std::string& name, const char* category, Tid tid, double t0, double t1) {
  if (!active_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<int64_t>(spans_.size()) >= share_) {
    ++dropped_;
    return;
  }
  spans_.push_back(Span{name, category, static_cast<int>(tid), t0, t1});
}

int64_t Tracer::write(Communicator& comm, const std::string& path, const std::string& host) {
  active_ = false;
  const int rank = comm.rank();
  // This rank's events as text, each event dumped as it is made: the same text as one JSON array
  // of them dumped whole, without a tree of every event in memory (about ten times the text).
  std::string mine = "[";
  auto add = [&](const nlohmann::json& event) {
    if (mine.size() > 1) mine += ',';
    mine += event.dump();
  };
  add({{"name", "process_name"},
       {"ph", "M"},
       {"pid", rank},
       {"args", {{"name", "rank " + std::to_string(rank) + "@" + host}}}});
  add({{"name", "process_sort_index"},
       {"ph", "M"},
       {"pid", rank},
       {"args", {{"sort_index", rank}}}});
  for (int tid : {0, 1})
    add({{"name", "thread_name"},
         {"ph", "M"},
         {"pid", rank},
         {"tid", tid},
         {"args", {{"name", tid == 0 ? "compute" : "communication"}}}});
  for (const Span& s : spans_)
    add({{"name", s.name},
         {"cat", s.category},
         {"ph", "X"},
         {"pid", rank},
         {"tid", s.tid},
         {"ts", s.t0},
         {"dur", s.t1 - s.t0}});
  mine += ']';
  std::vector<Span>().swap(spans_);  // the text holds them now
  int64_t dropped = 0;
  for (const int64_t d : comm.allgather(dropped_)) dropped += d;
  // Rank r's events reach rank 0 by broadcasts rooted at r, in pieces (a collective counts at
  // most 2^31 - 1): sizes are known to every rank.
  constexpr int64_t kPiece = int64_t{8} << 20;
  std::string all, part;
  for (int r = 0; r < comm.size(); ++r) {
    int64_t len = r == rank ? static_cast<int64_t>(mine.size()) : 0;
    comm.broadcast(&len, 1, r, "broadcast of trace sizes");
    if (r == rank)
      part.swap(mine);
    else
      part.assign(static_cast<size_t>(len), '\0');
    for (int64_t at = 0; at < len; at += kPiece)
      comm.broadcast(reinterpret_cast<uint8_t*>(part.data() + at), std::min(kPiece, len - at), r,
                     "broadcast of trace events");
    // Each part is a JSON array: rank 0 splices its elements into one array.
    if (rank == 0 && part.size() > 2)
      all.append(all.empty() ? "" : ",").append(part, 1, part.size() - 2);
    std::string().swap(part);
  }
  if (rank != 0) return dropped;
  AtomicFile out(path, "--trace");
  const std::string head = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", tail = "]}\n";
  out.write(head.data(), head.size());
  out.write(all.data(), all.size());
  out.write(tail.data(), tail.size());
  out.commit();
  return dropped;
}

}  // namespace dpt
