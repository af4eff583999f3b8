// Convolution algorithms side by side on the models' shapes: oneDNN's direct kernels (the path
// DPT_WINOGRAD=off takes) against dptrain's Winograd passes, one thread, minimum of --reps calls
// after a warm-up, and each Winograd result's largest error relative to oneDNN's output scale.
// --tile M,MW picks the tiles (F(M,3) forward and backward-data, F(3,MW) backward-weights; default
// 2,4, winograd_choice's for these shapes); DPT_ISA lowers the level of dptrain's loops
// (src/cpu/isa.h). --bf16 (a CPU with AVX512-BF16 or AMX) asks instead whether a bf16 Winograd
// would beat oneDNN's bf16 direct kernels: the forward's alpha^2 GEMMs are timed in fp32 (as the
// Winograd pass runs them) and with bf16 operands, and the fp32 pass's time with the one swapped
// for the other is the estimate. Usage: OMP_NUM_THREADS=1 build/bench/conv_bench [--batch 64]
// [--reps 3] [--tile 2,4] [--cpu-time] [--json] [--bf16]
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
#include "cpu/cpu_backend.h"
#include "cpu/isa.h"
#include "cpu/ops.h"
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

struct Shape {
  const char* name;
  int64_t hw, c, k, kernel, pad;
};

// The bf16 question for one shape (F(m,3) forward): oneDNN's bf16 forward on bf16 activations,
// dptrain's fp32 Winograd forward, its GEMMs (one per tile point, in blocks of tiles as
// winograd.cc's block_tiles makes them) in fp32 and in bf16; all ms.
void bf16_probe(const Shape& s, int64_t batch, int reps, int m) {
  ConvGeom g{batch, s.hw, s.hw, s.c, s.k, s.kernel, 1, s.pad};
  const auto x = random_values(static_cast<size_t>(g.n * g.h * g.w * g.c_in), 1);
  const auto w = random_values(static_cast<size_t>(g.c_out * g.c_in * g.k * g.k), 2);
  std::vector<float> y(static_cast<size_t>(g.n * g.oh() * g.ow() * g.c_out));
  std::vector<dpt::BFloat16> xb(x.size()), yb(y.size());
  dpt::cpu::round_to_bf16(x.data(), xb.data(), static_cast<int64_t>(x.size()));
  dpt::cpu::ConvPrimitives direct(/*bf16=*/true);
  dpt::cpu::WinogradConv wino;
  const double direct_ms =
      best_ms(reps, [&] { direct.forward(g, xb.data(), w.data(), nullptr, yb.data()); });
  const double wino_ms =
      best_ms(reps, [&] { wino.forward(g, m, x.data(), w.data(), nullptr, y.data()); });
  const int64_t alpha = m + g.k - 1, P = alpha * alpha, C = g.c_in, K = g.c_out;
  const int64_t tiles = g.n * ((g.oh() + m - 1) / m) * ((g.ow() + m - 1) / m);
  const int64_t tb = std::min(tiles, std::max<int64_t>(64, (int64_t{4} << 20) / (4 * P * (C + K))));
  const auto v = random_values(static_cast<size_t>(P * tb * C), 5);
  const auto u = random_values(static_cast<size_t>(P * C * K), 6);
  std::vector<dpt::BFloat16> vb(v.size()), ub(u.size());
  dpt::cpu::round_to_bf16(v.data(), vb.data(), static_cast<int64_t>(v.size()));
  dpt::cpu::round_to_bf16(u.data(), ub.data(), static_cast<int64_t>(u.size()));
  std::vector<float> mt(static_cast<size_t>(P * tb * K));
  auto gemms = [&](auto gemm) {
    for (int64_t t0 = 0; t0 < tiles; t0 += tb)
      for (int64_t p = 0; p < P; ++p)
        gemm(std::min(tb, tiles - t0), p * tb * C, p * C * K, p * tb * K);
  };
  const double f32_ms = best_ms(reps, [&] {
    gemms([&](int64_t nb, int64_t a, int64_t b, int64_t c) {
      dpt::cpu::sgemm('N', 'N', nb, K, C, v.data() + a, C, u.data() + b, K, 0.f, mt.data() + c, K);
    });
  });
  const double b16_ms = best_ms(reps, [&] {
    gemms([&](int64_t nb, int64_t a, int64_t b, int64_t c) {
      dpt::cpu::matmul_bf16<float>('N', 'N', nb, K, C, vb.data() + a, C, ub.data() + b, K, 0.f,
                                   mt.data() + c, K);
    });
  });
  const double estimate = wino_ms - f32_ms + b16_ms;
  std::printf("  %-14s %10.2f %9.2f %10.2f %11.2f %10.2f %7.2fx\n", s.name, direct_ms, wino_ms,
              f32_ms, b16_ms, estimate, direct_ms / estimate);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 64;
  int reps = 3;
  bool json = false, bf16 = false;
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
    else if (a == "--bf16")
      bf16 = true;
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
  const Shape shapes[] = {{"resnet layer1", 28, 64, 64, 3, 1},
                          {"resnet layer2", 14, 128, 128, 3, 1},
                          {"resnet layer3", 7, 256, 256, 3, 1},
                          {"resnet layer4", 4, 512, 512, 3, 1}};
  if (bf16) {
    const std::string missing = dpt::cpu::cpu_bf16_missing();
    if (!missing.empty()) {
      std::fprintf(stderr, "conv_bench: --bf16 cannot run here: %s\n", missing.c_str());
      return 2;
    }
    std::printf("# bf16 forward, batch %lld, %d thread(s), best of %d calls, ms; F(%d,3)\n",
                static_cast<long long>(batch), omp_get_max_threads(), reps, tile_m);
    std::printf("# %-14s %10s %9s %10s %11s %10s %8s\n", "shape", "onednn_b16", "wino_f32",
                "gemms_f32", "gemms_bf16", "wino_b16?", "ratio");
    for (const Shape& s : shapes) bf16_probe(s, batch, reps, tile_m);
    return 0;
  }
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
