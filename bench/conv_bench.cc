// Convolution algorithms side by side on the models' shapes: oneDNN's direct kernels (the path
// DPT_WINOGRAD=off takes) against dptrain's Winograd passes, one thread, minimum of --reps calls
// after a warm-up, and each Winograd result's largest error relative to oneDNN's output scale.
// --tile M,MW picks the tiles (F(M,3) forward and backward-data, F(3,MW) backward-weights; default
// 2,4, winograd_choice's for these shapes); DPT_ISA lowers the level of dptrain's loops
// (src/cpu/isa.h). Usage: OMP_NUM_THREADS=1 build/bench/conv_bench [--batch 64] [--reps 3] [--tile
// 2,4] [--cpu-time] [--json]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "cpu/conv.h"
#include "cpu/isa.h"
#include "cpu/winograd.h"
#include "dpt/rng.h"

namespace {

using dpt::cpu::ConvGeom;

std::vector<float> random_values(size_t n, uint64_t seed) {
  dpt::Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(r.uniform(-1, 1));
  return v;
}

double rel_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(got[i] - ref[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(ref[i])));
  }
  return worst / scale;
}

// Milliseconds now: wall clock, or with --cpu-time this thread's CPU time (at one thread every
// pass runs on the calling thread, so a machine shared with other jobs preempts it without
// counting against it; caches and memory bandwidth are still shared).
bool g_cpu_time = false;
double now_ms() {
  if (!g_cpu_time)
    return std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

template <class F>
double best_ms(int reps, F f) {
  f();  // warm-up: primitive creation, first-touch page faults
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_ms();
    f();
    best = std::min(best, now_ms() - t0);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 64;
  int reps = 3;
  bool json = false;
  int tile_m = 2, tile_mw = 4;  // winograd_choice's tiles for these shapes
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--batch" && i + 1 < argc)
      batch = std::atoll(argv[++i]);
    else if (a == "--reps" && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (a == "--json")
      json = true;
    else if (a == "--cpu-time")
      g_cpu_time = true;
    else if (a == "--tile" && i + 1 < argc &&
             std::sscanf(argv[++i], "%d,%d", &tile_m, &tile_mw) == 2)
      continue;
    else {
      std::fprintf(stderr, "conv_bench: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (batch < 1 || reps < 1) {
    std::fprintf(stderr, "conv_bench: --batch and --reps must be >= 1\n");
    return 2;
  }
  // The oneDNN baseline: ConvPrimitives with Winograd off and oneDNN's own backward.
  setenv("DPT_WINOGRAD", "off", 1);
  setenv("DPT_CONV_BACKWARD", "onednn", 1);
  struct Shape {
    const char* name;
    int64_t hw, c, k, kernel, pad;
  } shapes[] = {{"resnet layer1", 28, 64, 64, 3, 1},
                {"resnet layer2", 14, 128, 128, 3, 1},
                {"resnet layer3", 7, 256, 256, 3, 1},
                {"resnet layer4", 4, 512, 512, 3, 1}};
  if (!json) {
    std::printf(
        "# convolution, batch %lld, %d thread(s), best of %d calls, ms%s; loops %s; tiles F(%d,3) "
        "F(3,%d)\n",
        static_cast<long long>(batch), omp_get_max_threads(), reps,
        g_cpu_time ? " of thread CPU time" : "", dpt::cpu::isa_report().c_str(), tile_m, tile_mw);
    std::printf("# %-14s %9s %11s %9s %10s %10s %7s %9s\n", "shape", "onednn_fwd", "onednn_bwd",
                "wino_fwd", "wino_bwd_x", "wino_bwd_w", "speedup", "max_err");
  }
  for (const Shape& s : shapes) {
    ConvGeom g{batch, s.hw, s.hw, s.c, s.k, s.kernel, 1, s.pad};
    const auto choice = dpt::cpu::WinogradChoice{tile_m, tile_mw};
    const auto x = random_values(static_cast<size_t>(g.n * g.h * g.w * g.c_in), 1);
    const auto w = random_values(static_cast<size_t>(g.c_out * g.c_in * g.k * g.k), 2);
    const auto b = random_values(static_cast<size_t>(g.c_out), 3);
    const auto dy = random_values(static_cast<size_t>(g.n * g.oh() * g.ow() * g.c_out), 4);
    std::vector<float> y1(dy.size()), y2(dy.size()), dx1(x.size()), dx2(x.size()), dw1(w.size()),
        dw2(w.size()), db(b.size());
    dpt::cpu::ConvPrimitives direct;
    dpt::cpu::WinogradConv wino;
    const double f1 =
        best_ms(reps, [&] { direct.forward(g, x.data(), w.data(), b.data(), y1.data()); });
    const double b1 = best_ms(reps, [&] {
      direct.backward(g, x.data(), w.data(), dy.data(), dx1.data(), dw1.data(), db.data(), false);
    });
    const double f2 =
        best_ms(reps, [&] { wino.forward(g, choice.m, x.data(), w.data(), b.data(), y2.data()); });
    const double d2 =
        best_ms(reps, [&] { wino.backward_data(g, choice.m, w.data(), dy.data(), dx2.data()); });
    const double w2 = best_ms(
        reps, [&] { wino.backward_weights(g, choice.mw, x.data(), dy.data(), dw2.data(), false); });
    const double err = std::max({rel_error(y2, y1), rel_error(dx2, dx1), rel_error(dw2, dw1)});
    const double speedup = (f1 + b1) / (f2 + d2 + w2);
    if (json)
      std::printf(
          "{\"shape\":\"%s\",\"batch\":%lld,\"onednn_fwd_ms\":%.3f,\"onednn_bwd_ms\":%.3f,"
          "\"wino_fwd_ms\":%.3f,\"wino_bwd_data_ms\":%.3f,\"wino_bwd_weights_ms\":%.3f,"
          "\"speedup\":%.3f,\"max_rel_err\":%.2e,\"tile\":[%d,%d],\"isa\":\"%s\"}\n",
          s.name, static_cast<long long>(batch), f1, b1, f2, d2, w2, speedup, err, choice.m,
          choice.mw, dpt::cpu::isa_name(dpt::cpu::active_isa()));
    else
      std::printf("  %-14s %9.2f %11.2f %9.2f %10.2f %10.2f %6.2fx %9.1e\n", s.name, f1, b1, f2, d2,
                  w2, speedup, err);
  }
  return 0;
}
