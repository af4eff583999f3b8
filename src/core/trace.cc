// Tracer (include/dpt/trace.h): spans in memory while active, gathered to rank 0 at the end and
// written as Chrome-trace JSON ("X" complete events plus process/thread names).
#include "dpt/trace.h"

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
  origin_ = steady_us();
  active_ = true;
}

void Tracer::span(const std::string& name, const char* category, Tid tid, double t0, double t1) {
  if (!active_) return;
  std::lock_guard<std::mutex> lock(mu_);
  spans_.push_back(Span{name, category, static_cast<int>(tid), t0, t1});
}

void Tracer::write(Communicator& comm, const std::string& path, const std::string& host) {
  active_ = false;
  nlohmann::json events = nlohmann::json::array();
  const int rank = comm.rank();
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", rank},
                    {"args", {{"name", "rank " + std::to_string(rank) + "@" + host}}}});
  events.push_back({{"name", "process_sort_index"},
                    {"ph", "M"},
                    {"pid", rank},
                    {"args", {{"sort_index", rank}}}});
  for (int tid : {0, 1})
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", rank},
                      {"tid", tid},
                      {"args", {{"name", tid == 0 ? "compute" : "communication"}}}});
  for (const Span& s : spans_)
    events.push_back({{"name", s.name},
                      {"cat", s.category},
                      {"ph", "X"},
                      {"pid", rank},
                      {"tid", s.tid},
                      {"ts", s.t0},
                      {"dur", s.t1 - s.t0}});
  std::string mine = events.dump();
  // Rank r's events reach rank 0 by a broadcast rooted at r: sizes are known to every rank.
  std::string all;
  for (int r = 0; r < comm.size(); ++r) {
    int64_t len = r == rank ? static_cast<int64_t>(mine.size()) : 0;
    comm.broadcast(&len, 1, r, "broadcast of trace sizes");
    std::string part = r == rank ? mine : std::string(static_cast<size_t>(len), '\0');
    comm.broadcast(reinterpret_cast<uint8_t*>(part.data()), len, r, "broadcast of trace events");
    if (rank == 0) {
      // Each part is a JSON array: splice its elements into one array.
      std::string body = part.substr(1, part.size() - 2);
      if (!body.empty()) all += (all.empty() ? "" : ",") + body;
    }
  }
  if (rank != 0) return;
  write_file_atomic(path, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[" + all + "]}\n",
                    "--trace");
}

}  // namespace dpt
