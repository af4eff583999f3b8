// All-reduce bus bandwidth, nccl-tests style: for sizes 4 KB..64 MB, raw MPI_Allreduce against
// dptrain's Reducer (buckets of the same bytes all-reduced by its communication thread) on the
// same buffer. Prints one fixed-width table (medians over --iters) or JSON lines with --json.
// busbw = algbw * 2(n-1)/n, the bytes each link carries in a ring all-reduce.
// Usage: mpirun -np 2 build/bench/allreduce_bench [--iters 20] [--min-bytes 4096] [--max-bytes
// 67108864] [--json]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dpt/bootstrap.h"
#include "dpt/comm.h"
#include "dpt/reducer.h"

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  dpt::MpiSession mpi(&argc, &argv);
  int iters = 20;
  long long min_bytes = 4096, max_bytes = 64LL << 20;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc)
      iters = std::atoi(argv[++i]);
    else if (a == "--min-bytes" && i + 1 < argc)
      min_bytes = std::atoll(argv[++i]);
    else if (a == "--max-bytes" && i + 1 < argc)
      max_bytes = std::atoll(argv[++i]);
    else if (a == "--json")
      json = true;
    else {
      if (mpi.world().rank == 0)
        std::fprintf(stderr, "allreduce_bench: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  auto comm = dpt::make_mpi_communicator();
  const int n = comm->size();
  const double factor = n > 1 ? 2.0 * (n - 1) / n : 0.0;
  std::vector<float> buf(static_cast<size_t>(max_bytes / 4));
  if (comm->rank() == 0 && !json) {
    std::printf("# all-reduce, %d ranks, float32, in place, median of %d iterations\n", n, iters);
    std::printf("# %12s %10s | %10s %9s %9s | %10s %9s %9s %7s\n", "bytes", "floats", "mpi_us",
                "algbw", "busbw", "reducer_us", "algbw", "busbw", "ratio");
    std::printf("# %12s %10s | %10s %9s %9s | %10s %9s %9s %7s\n", "", "", "", "GB/s", "GB/s", "",
                "GB/s", "GB/s", "");
  }
  for (long long bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    const int64_t count = bytes / 4;
    std::fill(buf.begin(), buf.begin() + count, 1.f);
    std::vector<double> raw, red;
    for (int it = 0; it < iters + 2; ++it) {  // two warm-up iterations
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = now();
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
      if (it >= 2) raw.push_back(now() - t0);
    }
    // The reducer on one bucket of the same bytes, launched by mark_ready as backward would.
    dpt::Reducer reducer(dpt::make_mpi_transport(*comm, buf.data()), {dpt::Bucket{0, count}}, true);
    for (int it = 0; it < iters + 2; ++it) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = now();
      reducer.begin(it);
      reducer.mark_ready(0, count);
      reducer.wait();
      if (it >= 2) red.push_back(now() - t0);
    }
    const double tr = median(raw), td = median(red);
    const double alg_r = bytes / tr / 1e9, alg_d = bytes / td / 1e9;
    if (comm->rank() == 0) {
      if (json)
        std::printf(
            "{\"bytes\":%lld,\"ranks\":%d,\"mpi_us\":%.2f,\"mpi_busbw\":%.4f,\"reducer_us\":%.2f,"
            "\"reducer_busbw\":%.4f,\"ratio\":%.4f}\n",
            bytes, n, tr * 1e6, alg_r * factor, td * 1e6, alg_d * factor, tr / td);
      else
        std::printf("  %12lld %10lld | %10.1f %9.3f %9.3f | %10.1f %9.3f %9.3f %7.3f\n", bytes,
                    static_cast<long long>(count), tr * 1e6, alg_r, alg_r * factor, td * 1e6, alg_d,
                    alg_d * factor, tr / td);
    }
  }
  return 0;
}
