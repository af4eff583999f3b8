// The MPI Communicator at any world size (run at -np 1, 2 and 4): every result is checked
// against a closed formula of the ranks' contributions.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "dpt/comm.h"
#include "dpt/half.h"
#include "dpt/reducer.h"
#include "test_util.h"

namespace dpt {
namespace {

std::unique_ptr<Communicator> world() { return test::world_comm(); }

TEST(Collectives, AllreduceSumAvgMaxMinAgainstFormulas) {
  auto c = world();
  const int k = c->size(), r = c->rank();
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(r + 1) * static_cast<float>(i % 7);
  c->allreduce(v.data(), static_cast<int64_t>(v.size()));
  for (size_t i = 0; i < v.size(); ++i)
    ASSERT_EQ(v[i], static_cast<float>(k * (k + 1) / 2 * (i % 7)));
  double d[2] = {static_cast<double>(r), 1.0};
  c->allreduce(d, 2, ReduceOp::kAvg);
  EXPECT_DOUBLE_EQ(d[0], (k - 1) / 2.0);
  EXPECT_DOUBLE_EQ(d[1], 1.0);
  int64_t mx = r * 10, mn = r * 10;
  c->allreduce(&mx, 1, ReduceOp::kMax);
  c->allreduce(&mn, 1, ReduceOp::kMin);
  EXPECT_EQ(mx, (k - 1) * 10);
  EXPECT_EQ(mn, 0);
}

TEST(Collectives, AsyncAllreducesInFlightTogether) {
  auto c = world();
  const int k = c->size(), r = c->rank();
  std::vector<std::vector<int32_t>> bufs(5, std::vector<int32_t>(4096));
  std::vector<std::unique_ptr<Request>> reqs;
  for (int b = 0; b < 5; ++b) {
    std::fill(bufs[b].begin(), bufs[b].end(), (r + 1) * (b + 1));
    reqs.push_back(c->iallreduce(bufs[b].data(), 4096));
  }
  for (int b = 4; b >= 0; --b) reqs[static_cast<size_t>(b)]->wait();  // any completion order
  for (int b = 0; b < 5; ++b)
    for (int32_t x : bufs[b]) ASSERT_EQ(x, (b + 1) * k * (k + 1) / 2);
}

TEST(Collectives, BroadcastFromEveryRoot) {
  auto c = world();
  for (int root = 0; root < c->size(); ++root) {
    std::vector<double> v(333, c->rank() == root ? 1.5 * (root + 1) : -1.0);
    c->broadcast(v.data(), 333, root);
    for (double x : v) ASSERT_EQ(x, 1.5 * (root + 1));
  }
}

TEST(Collectives, Allgather) {
  auto c = world();
  const int k = c->size(), r = c->rank();
  auto all = c->allgather(static_cast<int64_t>(100 + r));
  ASSERT_EQ(static_cast<int>(all.size()), k);
  for (int i = 0; i < k; ++i) EXPECT_EQ(all[static_cast<size_t>(i)], 100 + i);
  int32_t pair[2] = {r, -r};
  std::vector<int32_t> got(static_cast<size_t>(2 * k));
  c->allgather(pair, got.data(), 2);
  for (int i = 0; i < k; ++i) {
    EXPECT_EQ(got[static_cast<size_t>(2 * i)], i);
    EXPECT_EQ(got[static_cast<size_t>(2 * i + 1)], -i);
  }
  c->barrier("test barrier");
}

TEST(Collectives, LargeAllreduceOf16MiB) {
  auto c = world();
  const int k = c->size();
  std::vector<float> v(4 << 20, 0.25f * static_cast<float>(c->rank() + 1));
  c->allreduce(v.data(), static_cast<int64_t>(v.size()));
  const float want = 0.25f * static_cast<float>(k * (k + 1) / 2);
  for (size_t i = 0; i < v.size(); i += 4099) ASSERT_EQ(v[i], want);
  EXPECT_EQ(v.back(), want);
}

TEST(Collectives, DuplicateHasItsOwnOrdering) {
  auto c = world();
  auto d = c->duplicate();
  EXPECT_EQ(d->rank(), c->rank());
  EXPECT_EQ(d->size(), c->size());
  float a = 1.f, b = 2.f;
  auto ra = c->iallreduce(&a, 1);
  auto rb = d->iallreduce(&b, 1);
  rb->wait();
  ra->wait();
  EXPECT_EQ(a, static_cast<float>(c->size()));
  EXPECT_EQ(b, 2.f * static_cast<float>(c->size()));
}

// LeNet's parameters as [begin, end) ranges of the gradient buffer, in its order; *total: its size.
std::vector<std::pair<int64_t, int64_t>> lenet_bounds(int64_t* total) {
  std::vector<std::pair<int64_t, int64_t>> bounds;
  *total = 0;
  for (int64_t s : {10, 1280, 128, 102400, 50, 25000, 20, 180})
    bounds.emplace_back(*total, *total + s), *total += s;
  return bounds;
}

// The Reducer under every bucket plan, with gradients whose sums are exact in float (multiples
// of 1/64): every plan gives the same bits, equal to the formula, at any world size.
TEST(Collectives, ReducerPlansGiveExactSums) {
  auto c = world();
  const int k = c->size(), r = c->rank();
  int64_t total = 0;
  const auto bounds = lenet_bounds(&total);
  for (double mb : {1e-7, 0.05, 25.0}) {
    std::vector<float> g(static_cast<size_t>(total));
    for (int64_t i = 0; i < total; ++i)
      g[static_cast<size_t>(i)] = static_cast<float>((r + 1) * (i % 97)) / 64.f;
    Reducer red(make_mpi_transport(*c, g.data()), plan_buckets(bounds, mb * 1048576, mb * 1048576),
                true);
    red.begin(0);
    for (const auto& [b, e] : bounds) red.mark_ready(b, e);  // in backward order, as layers do
    red.wait();
    for (int64_t i = 0; i < total; ++i)
      ASSERT_EQ(g[static_cast<size_t>(i)], static_cast<float>(k * (k + 1) / 2 * (i % 97)) / 64.f)
          << "mb " << mb << " at " << i;
  }
}

// --grad-dtype bf16 / fp16: buckets travel as 16-bit floats (cast, summed in float with each
// partial sum rounded, cast back). At 2 ranks each element is one rounded addition of the two
// rounded inputs, so the result is known exactly; at any size it is within the rounding bound
// (2k - 1) u sum|x| of the exact sum; at 1 rank nothing travels and the gradients stay as they are.
TEST(Collectives, CompressedBucketsSumWithinTheirRounding) {
  auto c = world();
  const int k = c->size(), r = c->rank();
  int64_t total = 0;
  const auto bounds = lenet_bounds(&total);
  // Rank q's gradient i: not representable in 16 bits, of mixed signs and magnitudes.
  auto x = [](int q, int64_t i) {
    return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + q) *
                              std::pow(10.0, static_cast<double>(i % 5) - 3));
  };
  for (const DType wire : {DType::kBF16, DType::kF16}) {
    const double u = wire == DType::kBF16 ? 1.0 / 256 : 1.0 / 2048;  // unit roundoff: 8 and 11 bits
    auto round16 = [wire](float v) {
      uint16_t h;
      float back;
      compress16(&v, &h, 1, wire);
      decompress16(&h, &back, 1, wire);
      return back;
    };
    for (double mb : {0.05, 25.0}) {
      std::vector<float> g(static_cast<size_t>(total));
      for (int64_t i = 0; i < total; ++i) g[static_cast<size_t>(i)] = x(r, i);
      Reducer red(make_mpi_transport(*c, g.data(), wire),
                  plan_buckets(bounds, mb * 1048576, mb * 1048576), true);
      red.begin(0);
      for (const auto& [b, e] : bounds) red.mark_ready(b, e);
      red.wait();
      int64_t inexact = 0;
      for (int64_t i = 0; i < total; ++i) {
        double exact = 0, mag = 0;
        for (int q = 0; q < k; ++q) exact += x(q, i), mag += std::fabs(x(q, i));
        const float got = g[static_cast<size_t>(i)];
        if (k == 1) {
          ASSERT_EQ(got, x(0, i)) << "one rank: nothing travels, at " << i;
          continue;
        }
        if (k == 2) {
          // Both ranks add the same two rounded values (float addition commutes): the same bits.
          ASSERT_EQ(got, round16(round16(x(0, i)) + round16(x(1, i))))
              << "mb " << mb << " at " << i;
        }
        ASSERT_LE(std::fabs(got - exact), (2 * k - 1) * u * mag + 1e-30)
            << "mb " << mb << " at " << i;
        inexact += static_cast<double>(got) != static_cast<double>(static_cast<float>(exact));
      }
      // The 16-bit path really ran: most sums differ from the float ones.
      if (k > 1) {
        EXPECT_GT(inexact, total / 2) << "mb " << mb;
      }
    }
  }
}

TEST(BucketPlan, CapsSplitAtParameterBoundaries) {
  // Parameters of 100, 300, 50, 1000 and 10 floats, given out of order.
  std::vector<std::pair<int64_t, int64_t>> bounds{
      {400, 450}, {0, 100}, {450, 1450}, {100, 400}, {1450, 1460}};
  auto one = plan_buckets(bounds, 1.0, 1.0);  // a byte: every parameter alone
  ASSERT_EQ(one.size(), 5u);
  EXPECT_EQ(one[3].begin, 450);
  EXPECT_EQ(one[3].end, 1450);
  auto all = plan_buckets(bounds, 1e9, 1e9);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].end, 1460);
  // First bucket capped at 400 floats (1600 B), the rest at 1100 floats.
  auto mixed = plan_buckets(bounds, 4400, 1600);
  ASSERT_EQ(mixed.size(), 2u);
  EXPECT_EQ(mixed[0].end, 400);
  EXPECT_EQ(mixed[1].begin, 400);
  EXPECT_EQ(mixed[1].end, 1460);
  // At 1000 floats the 1000-float parameter fills a bucket by itself.
  // A last cap splits the trailing parameters off: 10 floats (40 B) fit 100 B; 1010 floats don't.
  auto tail = plan_buckets(bounds, 1e9, 1e9, 100);
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail[0].end, 1450);
  EXPECT_EQ(tail[1].begin, 1450);
  EXPECT_EQ(tail[1].end, 1460);
  auto tail2 = plan_buckets(bounds, 1e9, 1e9, 4100);  // 1010 floats = 4040 B fit, 1060 do not
  ASSERT_EQ(tail2.size(), 2u);
  EXPECT_EQ(tail2[1].begin, 450);
  // A run exactly the cap's size fits ("at most"): 1010 floats are 4040 B.
  auto exact = plan_buckets(bounds, 1e9, 1e9, 4040);
  ASSERT_EQ(exact.size(), 2u);
  EXPECT_EQ(exact[1].begin, 450);
  auto tail1 = plan_buckets(bounds, 1e9, 1e9, 1);  // at least one parameter moves
  ASSERT_EQ(tail1.size(), 2u);
  EXPECT_EQ(tail1[1].begin, 1450);
  auto no_split = plan_buckets(bounds, 1.0, 1.0, 100);  // the last bucket is one parameter already
  EXPECT_EQ(no_split.size(), 5u);
  auto tight = plan_buckets(bounds, 4000, 1600);
  ASSERT_EQ(tight.size(), 4u);
  EXPECT_EQ(tight[1].end, 450);
  EXPECT_EQ(tight[2].end, 1450);
}

// A transport that records which buckets the Reducer launches, and when; it moves nothing.
class LaunchLog : public ReduceTransport {
 public:
  explicit LaunchLog(std::vector<size_t>* launched) : launched_(launched) {}
  void begin(int64_t) override {}
  void launch(size_t k, const Bucket&, const std::string&) override { launched_->push_back(k); }
  void finish(ReducerStats&) override {}
  void allreduce_doubles(double*, int64_t, const std::string&) override {}

 private:
  std::vector<size_t>* launched_;
};

// Every rank must issue the same all-reduces in the same order, whatever order its backward marks
// the gradients in: bucket k is launched once all of it is marked and bucket k-1 is launched, with
// overlap during backward (mark_ready), with --no-overlap all at wait(); and again every step.
TEST(Reducer, LaunchesEachBucketOnceCompleteAndInOrder) {
  const std::vector<Bucket> plan{{0, 100}, {100, 400}, {400, 450}};
  for (const bool overlap : {true, false}) {
    std::vector<size_t> launched;
    Reducer red(std::make_unique<LaunchLog>(&launched), plan, overlap);
    for (int64_t step = 0; step < 2; ++step) {
      launched.clear();
      red.begin(step);
      red.mark_ready(400, 450);  // bucket 2 complete, before buckets 0 and 1
      red.mark_ready(100, 250);  // half of bucket 1
      red.mark_ready(0, 60);     // part of bucket 0
      EXPECT_TRUE(launched.empty()) << "overlap " << overlap << " step " << step;
      red.mark_ready(60, 100);  // bucket 0 complete: it alone goes (bucket 1 is not)
      EXPECT_EQ(launched, overlap ? std::vector<size_t>{0} : std::vector<size_t>{})
          << "overlap " << overlap << " step " << step;
      red.mark_ready(250, 400);  // bucket 1 complete: then 1 and the waiting 2
      EXPECT_EQ(launched, overlap ? (std::vector<size_t>{0, 1, 2}) : std::vector<size_t>{})
          << "overlap " << overlap << " step " << step;
      red.wait();
      EXPECT_EQ(launched, (std::vector<size_t>{0, 1, 2}))
          << "overlap " << overlap << " step " << step;
    }
  }
}

}  // namespace
}  // namespace dpt
