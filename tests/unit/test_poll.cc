// Unit tests for poll_with_deadline (include/dpt/poll.h), the loop behind every wait of the NCCL
// communicator (set-up, split, collectives), run here without a GPU: a probe done after a known
// number of polls, one that never completes against a short deadline, 0 meaning no deadline, and
// the growing pause. Timings are checked as lower bounds only (a loaded machine only adds time).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "dpt/error.h"
#include "dpt/poll.h"

namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::microseconds;
using std::chrono::milliseconds;

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

TEST(Poll, ReturnsWhenTheProbeReportsDoneAfterExactlyThatManyPolls) {
  for (const int k : {1, 2, 7}) {
    int polls = 0, timeouts = 0;
    const bool done = dpt::poll_with_deadline(
        30.0, [&] { return ++polls == k; }, [&] { ++timeouts; },
        dpt::PollPause{microseconds(1), microseconds(8)});
    EXPECT_TRUE(done) << "k = " << k;
    EXPECT_EQ(polls, k);
    EXPECT_EQ(timeouts, 0);
  }
}

TEST(Poll, AProbeThatNeverCompletesTimesOutOnceAfterTheDeadline) {
  const double deadline = 0.05;
  int polls = 0, timeouts = 0, polls_at_timeout = -1;
  const auto start = clock_type::now();
  const bool done = dpt::poll_with_deadline(
      deadline,
      [&] {
        ++polls;
        return false;
      },
      [&] {
        ++timeouts;
        polls_at_timeout = polls;
      },
      dpt::PollPause{milliseconds(1), milliseconds(10)});
  const double elapsed = seconds_since(start);
  EXPECT_FALSE(done);
  EXPECT_EQ(timeouts, 1);
  EXPECT_GE(elapsed, deadline);
  EXPECT_GE(polls, 1);
  EXPECT_EQ(polls, polls_at_timeout) << "no probe after the timeout";
}

TEST(Poll, AThrowingTimeoutHandlerEndsTheWaitWithItsError) {
  // The NCCL communicator's handler aborts the communicator and throws: the error comes out as is.
  int polls = 0;
  try {
    dpt::poll_with_deadline(
        0.01,
        [&] {
          ++polls;
          return false;
        },
        [] {
          throw dpt::Error(dpt::ErrorKind::kInternal,
                           "set-up did not complete within --timeout 0.01 s");
        });
    FAIL() << "no error";
  } catch (const dpt::Error& e) {
    EXPECT_EQ(e.exit_code(), 3);
    EXPECT_STREQ(e.what(), "set-up did not complete within --timeout 0.01 s");
  }
  EXPECT_GE(polls, 1);
}

TEST(Poll, AGraceExtendsTheBoundAndIsNamedInTheMessage) {
  // agree_on_input's grace: --timeout plus the time the waiting rank took; --timeout 0 stays no
  // bound at all, whatever the grace.
  const dpt::WaitBound plain{3, 0, {}}, graced{3, 5.2, "the time this rank took reading --data d"};
  EXPECT_EQ(plain.seconds(), 3);
  EXPECT_EQ(graced.seconds(), 3 + 5.2);
  EXPECT_EQ((dpt::WaitBound{0, 5.2, "w"}.seconds()), 0);
  EXPECT_EQ(dpt::timeout_message("barrier", plain, 1, ": why"),
            "barrier did not complete within --timeout 3 s on rank 1: why");
  EXPECT_EQ(dpt::timeout_message("agreement", graced, 0, ": rank(s) 1 did not answer"),
            "agreement did not complete within --timeout 3 s + 5.2 s (the time this rank took "
            "reading --data d) on rank 0: rank(s) 1 did not answer");
  // The wait itself runs for the whole bound: a probe that succeeds after the timeout alone but
  // within the grace is waited for.
  const auto t0 = std::chrono::steady_clock::now();
  const dpt::WaitBound short_graced{0.05, 2.0, "g"};
  int timeouts = 0;
  const bool done = dpt::poll_with_deadline(
      short_graced.seconds(),
      [&] { return std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(300); },
      [&] { ++timeouts; });
  EXPECT_TRUE(done);
  EXPECT_EQ(timeouts, 0);
}

TEST(Poll, ZeroTimeoutMeansNeverGiveUp) {
  // Read as a deadline of 0 s, the first unsuccessful poll would already time out.
  int polls = 0, timeouts = 0;
  const bool done = dpt::poll_with_deadline(
      0.0, [&] { return ++polls == 50; }, [&] { ++timeouts; },
      dpt::PollPause{microseconds(100), microseconds(100)});
  EXPECT_TRUE(done);
  EXPECT_EQ(polls, 50);
  EXPECT_EQ(timeouts, 0);
}

TEST(Poll, AnAlreadyCompleteOperationSucceedsWhateverTheDeadline) {
  int polls = 0, timeouts = 0;
  EXPECT_TRUE(dpt::poll_with_deadline(
      1e-9, [&] { return ++polls > 0; }, [&] { ++timeouts; }));
  EXPECT_EQ(polls, 1);
  EXPECT_EQ(timeouts, 0);
}

TEST(Poll, ThePauseDoublesFromFirstUpToMax) {
  // 1 ms, 2 ms, 4 ms, then 4 ms again: each gap between two polls lasts at least its pause.
  std::vector<clock_type::time_point> at;
  dpt::poll_with_deadline(
      0.0,
      [&] {
        at.push_back(clock_type::now());
        return at.size() == 6;
      },
      [] {}, dpt::PollPause{milliseconds(1), milliseconds(4)});
  ASSERT_EQ(at.size(), 6u);
  const double expected_ms[] = {1, 2, 4, 4, 4};
  for (size_t i = 0; i + 1 < at.size(); ++i) {
    const double gap_ms = std::chrono::duration<double, std::milli>(at[i + 1] - at[i]).count();
    EXPECT_GE(gap_ms, expected_ms[i]) << "gap " << i;
  }
}

TEST(Poll, SpinsBeforeTheFirstPauseAndTheFirstLookAtTheClock) {
  // An expired deadline: without spins the first failed probe ends the wait; with 5 the probe runs
  // 6 times first, back to back (the MPI requests' short spin: small collectives finish in
  // microseconds).
  int polls = 0, timeouts = 0;
  EXPECT_FALSE(dpt::poll_with_deadline(
      1e-12, [&] { return ++polls < 0; }, [&] { ++timeouts; }));
  EXPECT_EQ(polls, 1);
  polls = 0;
  const auto t0 = clock_type::now();
  EXPECT_FALSE(dpt::poll_with_deadline(
      1e-12, [&] { return ++polls < 0; }, [&] { ++timeouts; },
      dpt::PollPause{milliseconds(50), milliseconds(50), 5}));
  EXPECT_EQ(polls, 6);
  EXPECT_EQ(timeouts, 2);
  const double ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
  EXPECT_LT(ms, 50.0);  // no pause
}

// timeout_duration: seconds as the steady clock's duration, clamped to [0, 1e7 s]; huge values
// (which overflowed int64 nanoseconds past ~9.2e9 s) give the clamp, a deadline in the future.
TEST(Poll, TimeoutDurationIsClampedBelowTheClocksOverflow) {
  using dur = clock_type::duration;
  const dur max = std::chrono::duration_cast<dur>(std::chrono::seconds(10'000'000));
  EXPECT_EQ(dpt::timeout_duration(0.25), std::chrono::duration_cast<dur>(milliseconds(250)));
  EXPECT_EQ(dpt::timeout_duration(300), std::chrono::duration_cast<dur>(std::chrono::seconds(300)));
  EXPECT_EQ(dpt::timeout_duration(1e7), max);
  for (const double huge : {9.3e9, 1e10, 1e300, std::numeric_limits<double>::infinity()}) {
    EXPECT_EQ(dpt::timeout_duration(huge), max) << huge;
    EXPECT_GT(clock_type::now() + dpt::timeout_duration(huge), clock_type::now()) << huge;
  }
  for (const double none : {0.0, -1.0, std::nan("")})
    EXPECT_EQ(dpt::timeout_duration(none), dur::zero()) << none;
}

// The reducer's wait, as it is written: a condition variable's wait_for bounded by a --timeout of
// 1e10 s must wait for the notification. With std::chrono::duration<double>(1e10) instead, the
// deadline overflowed into the past and wait_for returned false at once.
TEST(Poll, AHugeTimeoutStillWaitsForTheNotification) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  const auto start = clock_type::now();
  std::thread notifier([&] {
    std::this_thread::sleep_for(milliseconds(20));
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
    }
    cv.notify_all();
  });
  bool finished = false;
  {
    std::unique_lock<std::mutex> lock(mu);
    finished = cv.wait_for(lock, dpt::timeout_duration(1e10), [&] { return done; });
  }
  notifier.join();
  EXPECT_TRUE(finished);
  EXPECT_GE(seconds_since(start), 0.02);  // it waited for the notification
}

// poll_with_deadline under the same huge timeout: the probe decides, no timeout.
TEST(Poll, AHugeTimeoutNeverTimesOutEarly) {
  int polls = 0, timeouts = 0;
  EXPECT_TRUE(dpt::poll_with_deadline(
      1e300, [&] { return ++polls == 3; }, [&] { ++timeouts; },
      dpt::PollPause{microseconds(1), microseconds(8)}));
  EXPECT_EQ(polls, 3);
  EXPECT_EQ(timeouts, 0);
}

// A process stopped (SIGSTOP) for longer than its deadline and then continued keeps waiting: the
// time stopped is not waiting time (RunningDeadline). A child waits under a 1.5 s deadline for a
// condition that holds 2.5 s after it starts; this process stops it 0.3 s after it says it has
// started (a pipe: a loaded machine may start it late), for 2 s. Counting the stop, the child
// would time out (exit 3) the moment it runs again; it must finish (exit 0). And a deadline that
// is not stopped still passes: without the stop, a condition that never holds times out (exit 3).
// `wait(completes)` is the wait under test: true when its condition held.
template <class Wait>
void expect_stops_do_not_count(const Wait& wait) {
  const auto child = [&](bool completes) {
    int ready[2];
    EXPECT_EQ(pipe(ready), 0);
    const pid_t pid = fork();
    if (pid == 0) {
      close(ready[0]);
      const bool done = wait(completes, [&] {
        const char byte = 1;
        (void)!write(ready[1], &byte, 1);
      });
      _exit(done ? 0 : 3);
    }
    close(ready[1]);
    char byte = 0;
    EXPECT_EQ(read(ready[0], &byte, 1), 1) << "the child did not start";
    close(ready[0]);
    return pid;
  };
  const auto status_of = [](pid_t pid) {
    int status = 0;
    EXPECT_EQ(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  };
  const pid_t stopped = child(true);
  ASSERT_GT(stopped, 0);
  std::this_thread::sleep_for(milliseconds(300));
  ASSERT_EQ(kill(stopped, SIGSTOP), 0);
  std::this_thread::sleep_for(milliseconds(2000));
  ASSERT_EQ(kill(stopped, SIGCONT), 0);
  EXPECT_EQ(status_of(stopped), 0) << "stopped 2 s under a 1.5 s deadline, then continued";
  const pid_t never = child(false);
  ASSERT_GT(never, 0);
  EXPECT_EQ(status_of(never), 3) << "a condition that never holds, not stopped";
}

TEST(Poll, TimeStoppedDoesNotCountAgainstTheDeadline) {
  expect_stops_do_not_count([](bool completes, const auto& started) {
    const auto start = clock_type::now();
    started();
    return dpt::poll_with_deadline(
        1.5, [&] { return completes && seconds_since(start) >= 2.5; }, [] {},
        dpt::PollPause{microseconds(1000), microseconds(20000)});
  });
}

// The same for the condition-variable wait (the CPU reducer's, the MPI start-up watchdog's): a
// thread sets the condition 2.5 s after the start; wait_running waits under 1.5 s.
TEST(Poll, TimeStoppedDoesNotCountAgainstAConditionWait) {
  expect_stops_do_not_count([](bool completes, const auto& started) {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::thread setter([&] {
      if (!completes) return;
      std::this_thread::sleep_until(clock_type::now() + milliseconds(2500));
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      cv.notify_all();
    });
    started();
    bool held = false;
    {
      std::unique_lock<std::mutex> lock(mu);
      held = dpt::wait_running(cv, lock, std::chrono::milliseconds(1500), [&] { return done; });
    }
    setter.join();
    return held;
  });
}

}  // namespace
