// DataParallel (include/dpt/ddp.h): the replica checks, rank 0's state broadcast, the gradient
// bucket plan (the same on every rank) and the Reducer it feeds, and BatchNorm buffer averaging.
#include "dpt/ddp.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "dpt/error.h"

namespace dpt {

DataParallel::DataParallel(Model& model, Communicator& comm, const DdpOptions& options,
                           std::unique_ptr<ReduceTransport> transport)
    : model_(model), comm_(comm) {
  DPT_INPUT_CHECK(options.bucket_mb > 0, "--bucket-mb must be > 0, got " << options.bucket_mb);
  DPT_INPUT_CHECK(options.last_bucket_mb >= 0,
                  "--last-bucket-mb must be >= 0, got " << options.last_bucket_mb);
  check_replicas();
  broadcast_state();
  ParamStore& store = model_.store();

  std::vector<std::pair<int64_t, int64_t>> bounds;
  for (const auto& p : store.entries())
    if (!p.is_buffer) bounds.emplace_back(p.offset, p.offset + p.numel());
  const double mib = 1024.0 * 1024.0;
  const double first_cap = std::min(options.first_bucket_mb, options.bucket_mb) * mib;
  const double total_bytes = 4.0 * static_cast<double>(store.num_params());
  auto buckets = plan_buckets(bounds, options.bucket_mb * mib, first_cap,
                              std::min(options.last_bucket_mb * mib, total_bytes / 4));
  // Every rank must issue the same all-reduces: compare the plans once.
  const uint64_t h = checksum(buckets.data(), buckets.size() * sizeof(Bucket));
  const auto all = comm_.allgather(h);
  for (int r = 0; r < comm_.size(); ++r)
    DPT_CHECK(all[static_cast<size_t>(r)] == all[0],
              "gradient bucket plan of rank " << r << " differs from rank 0's");
  if (!transport) transport = make_mpi_transport(comm_, store.device_grads(), options.grad_dtype);
  reducer_ = std::make_unique<Reducer>(std::move(transport), std::move(buckets), options.overlap);
  if (options.sync_bn && comm_.size() > 1) {
    // Through the transport: the statistics are in the backend's memory, ordered with its compute.
    ReduceTransport* t = &reducer_->transport();
    model_.net().visit([t](Layer& l) {
      set_batchnorm_sync(
          l, [t](double* data, int64_t n) { t->allreduce_doubles(data, n, "sync-bn statistics"); });
    });
  }
}

void DataParallel::broadcast_state() {
  ParamStore& store = model_.store();
  comm_.broadcast(store.params(), store.num_params(), 0, "broadcast of parameters");
  if (store.num_buffers() > 0)
    comm_.broadcast(store.buffers(), store.num_buffers(), 0, "broadcast of buffers");
}

void DataParallel::check_replicas() {
  // Every rank gathers every rank's signature, so all of them can name the same difference.
  const std::vector<std::string> all = allgather_text(comm_, model_.signature());
  for (int r = 1; r < comm_.size(); ++r) {
    const std::string& ref = all[0];
    const std::string& other = all[static_cast<size_t>(r)];
    if (other == ref) continue;
    // Find the first differing line (tensor).
    size_t a = 0, b = 0;
    for (;;) {
      size_t ea = ref.find('\n', a), eb = other.find('\n', b);
      std::string la = ref.substr(a, ea == std::string::npos ? std::string::npos : ea - a);
      std::string lb = other.substr(b, eb == std::string::npos ? std::string::npos : eb - b);
      if (la != lb || ea == std::string::npos || eb == std::string::npos) {
        throw Error(ErrorKind::kInput,
                    DPT_MSG("model replicas differ: rank "
                            << r << " has '" << (lb.empty() ? "(nothing)" : lb)
                            << "' where rank 0 has '" << (la.empty() ? "(nothing)" : la) << "'"));
      }
      a = ea + 1;
      b = eb + 1;
    }
  }
}

BackwardCtx DataParallel::backward_ctx(bool sync, bool accumulate, Tracer* tracer) {
  BackwardCtx ctx;
  ctx.accumulate = accumulate;
  ctx.tracer = tracer;
  if (sync) {
    Reducer* r = reducer_.get();
    ctx.on_ready = [r](int64_t b, int64_t e) { r->mark_ready(b, e); };
  }
  return ctx;
}

void DataParallel::sync_buffers() {
  ParamStore& store = model_.store();
  if (comm_.size() < 2 || store.num_statistics() == 0) return;
  // The counters (num_batches_tracked), equal on every rank, lie after this range
  // (ParamStore::finalize): averaged, they need not come back equal to themselves.
  comm_.allreduce(store.buffers(), store.num_statistics(), ReduceOp::kAvg,
                  "all-reduce of BatchNorm running statistics");
}

void DataParallel::verify_replicas(int64_t step) {
  ParamStore& store = model_.store();
  const uint64_t h =
      checksum(store.params(), static_cast<size_t>(store.num_params()) * sizeof(float));
  const auto all = comm_.allgather(h);
  std::string bad;
  for (int r = 1; r < comm_.size(); ++r)
    if (all[static_cast<size_t>(r)] != all[0]) bad += (bad.empty() ? "" : ", ") + std::to_string(r);
  if (!bad.empty())
    throw Error(ErrorKind::kInternal,
                DPT_MSG("replicas diverged at step " << step << ": parameters of rank(s) " << bad
                                                     << " differ from rank 0's"));
}

}  // namespace dpt
