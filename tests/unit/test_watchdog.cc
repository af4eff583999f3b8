// Unit tests for dpt::Watchdog (include/dpt/watchdog.h), the bound of MPI_Init, MPI_Finalize and
// MPI_Abort: each case runs it in a forked child, whose end (_exit with the code, or its own exit
// 0) and output (through pipes) this process observes. Timings are bounds a loaded machine cannot
// break: never before `seconds`, and within `seconds` + 10 s.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dpt/watchdog.h"

namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kCode = 42;  // the code under test: no exit of the test's own has it
constexpr char kMessage[] = "watchdog: the call did not return\n";

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

// A child running body(ready, go): ready() tells this process it is ready (after it made its
// watchdog), go() waits for go() here. Its stdout and stderr are pipes read here once it ends.
struct Child {
  pid_t pid = -1;
  int out = -1, err = -1, ready = -1, go = -1;
  clock_type::time_point forked;  // before the fork: whatever the child measures came after it
};

using Body =
    std::function<void(const std::function<void()>& ready, const std::function<void()>& go)>;

Child spawn(const Body& body) {
  // A child that ended early (its watchdog fired) makes send_go() a write to a pipe without a
  // reader: a failed check, not the death of this process by SIGPIPE.
  signal(SIGPIPE, SIG_IGN);
  int out[2], err[2], ready[2], go[2];
  if (pipe(out) != 0 || pipe(err) != 0 || pipe(ready) != 0 || pipe(go) != 0) {
    ADD_FAILURE() << "pipe failed";
    return {};
  }
  Child c;
  c.forked = clock_type::now();
  c.pid = fork();
  if (c.pid == 0) {
    // No gtest assertion here: the child reports by its exit status and its output only.
    signal(SIGPIPE, SIG_DFL);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    for (int fd : {out[0], out[1], err[0], err[1], ready[0], go[1]}) close(fd);
    // stdout is now a pipe: fully buffered, as a rank's is under mpirun.
    body([&] { (void)!write(ready[1], "r", 1); },
         [&] {
           char byte;
           (void)!read(go[0], &byte, 1);
         });
    std::fflush(stdout);
    _exit(0);
  }
  close(out[1]);
  close(err[1]);
  close(ready[1]);
  close(go[0]);
  c.out = out[0];
  c.err = err[0];
  c.ready = ready[0];
  c.go = go[1];
  return c;
}

void wait_ready(const Child& c) {
  char byte = 0;
  ASSERT_EQ(read(c.ready, &byte, 1), 1) << "the child did not start";
}

void send_go(const Child& c) {
  EXPECT_EQ(write(c.go, "g", 1), 1) << "the child is gone before it was told to go on";
}

std::string read_all(int fd) {
  std::string s;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) s.append(buf, static_cast<size_t>(n));
  return s;
}

// How the child ended, and what it wrote.
struct Ended {
  int code = -1;       // its exit status, or 128 + the signal that killed it
  double seconds = 0;  // from before the fork to its end, seen here (an upper bound of its life)
  std::string out, err;
};

Ended finish(const Child& c) {
  Ended e;
  int status = 0;
  EXPECT_EQ(waitpid(c.pid, &status, 0), c.pid);
  e.seconds = seconds_since(c.forked);
  e.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  e.out = read_all(c.out);  // small: the pipes held it all while the child ran
  e.err = read_all(c.err);
  for (int fd : {c.out, c.err, c.ready, c.go}) close(fd);
  return e;
}

// A watchdog of `seconds` whose call never returns: the child sleeps well past the deadline and
// then says so and exits 0. say() prints kMessage on stderr and, on stdout (buffered, flushed only
// by the watchdog before its _exit), how long after its making it fired, measured in the child.
void never_returns(double seconds, const std::function<void()>& ready,
                   const std::function<void()>& /*go*/) {
  std::printf("before the watchdog\n");  // buffered: lost unless the watchdog flushes stdout
  const auto made = clock_type::now();
  dpt::Watchdog dog(seconds, kCode, [made] {
    std::fputs(kMessage, stderr);
    std::printf("fired after %.3f s\n", seconds_since(made));
  });
  ready();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds + 30));
  std::printf("not ended by the watchdog\n");
}

// The "fired after X s" the child printed; -1 when there is none.
double fired_after(const std::string& out) {
  const auto at = out.find("fired after ");
  return at == std::string::npos ? -1 : std::atof(out.c_str() + at + 12);
}

TEST(Watchdog, EndsTheProcessWithItsCodeAfterTheMessageNotBeforeTheDeadline) {
  const double seconds = 2;
  const Child c =
      spawn([&](const auto& ready, const auto& go) { never_returns(seconds, ready, go); });
  ASSERT_GT(c.pid, 0);
  wait_ready(c);
  const Ended e = finish(c);
  EXPECT_EQ(e.code, kCode) << "stdout: " << e.out << "stderr: " << e.err;
  EXPECT_EQ(e.err, kMessage) << "the message, once, and nothing else on stderr";
  EXPECT_EQ(e.out.rfind("before the watchdog\n", 0), 0u)
      << "what the process printed before is flushed before the _exit: " << e.out;
  EXPECT_GE(fired_after(e.out), seconds) << "fired before its deadline: " << e.out;
  EXPECT_LE(e.seconds, seconds + 10) << "fired long after its deadline";
}

TEST(Watchdog, DoneOrTheEndOfItsScopeBeforeTheDeadlineLetsTheProcessGoOn) {
  // done() 0.5 s into a 3 s watchdog, a second one destroyed at the end of its scope: the child
  // then lives 5 s past both deadlines and exits 0 by itself, with nothing on stderr.
  const double seconds = 3;
  const Child c = spawn([&](const auto& ready, const auto&) {
    const auto say = [] { std::fputs(kMessage, stderr); };
    {
      dpt::Watchdog scoped(seconds, kCode, say);
      std::this_thread::sleep_for(milliseconds(500));
    }
    dpt::Watchdog dog(seconds, kCode, say);
    ready();
    std::this_thread::sleep_for(milliseconds(500));
    dog.done();
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds + 5));
    std::printf("went on\n");
  });
  ASSERT_GT(c.pid, 0);
  wait_ready(c);
  const Ended e = finish(c);
  EXPECT_EQ(e.code, 0) << "stderr: " << e.err;
  EXPECT_EQ(e.err, "") << "the watchdog spoke after done()";
  EXPECT_EQ(e.out, "went on\n");
}

TEST(Watchdog, ZeroNegativeOrNaNSecondsNeverFire) {
  // Each in its own child, at once; each lives 3 s with its watchdog and exits 0. timeout_duration
  // reads all three as 0 s: taken for a deadline, they ended the process at once.
  std::vector<std::pair<double, Child>> children;
  for (const double seconds : {0.0, -1.0, std::nan("")}) {
    children.emplace_back(seconds, spawn([seconds](const auto& ready, const auto&) {
                            dpt::Watchdog dog(seconds, kCode, [] { std::fputs(kMessage, stderr); });
                            ready();
                            std::this_thread::sleep_for(milliseconds(3000));
                            std::printf("started %d\n", dog.started() ? 1 : 0);
                          }));
    ASSERT_GT(children.back().second.pid, 0);
  }
  for (const auto& [seconds, c] : children) {
    wait_ready(c);
    const Ended e = finish(c);
    EXPECT_EQ(e.code, 0) << "seconds " << seconds << ": " << e.err;
    EXPECT_EQ(e.err, "") << "seconds " << seconds;
    EXPECT_EQ(e.out, "started 0\n") << "seconds " << seconds << ": no thread, nothing to bound";
  }
}

TEST(Watchdog, TimeStoppedDoesNotCount) {
  // A 4 s watchdog; the child is SIGSTOPped 0.3 s after it made it, for 7 s, then continued, and
  // told 1 s later to call done(): about 1.3 s of running time, under the deadline. Counting the
  // stop, it would have ended the child the moment it ran again, before it was told.
  const double seconds = 4;
  const Child c = spawn([&](const auto& ready, const auto& go) {
    dpt::Watchdog dog(seconds, kCode, [] { std::fputs(kMessage, stderr); });
    ready();
    go();
    dog.done();
    std::printf("went on\n");
  });
  ASSERT_GT(c.pid, 0);
  wait_ready(c);
  std::this_thread::sleep_for(milliseconds(300));
  ASSERT_EQ(kill(c.pid, SIGSTOP), 0);
  std::this_thread::sleep_for(milliseconds(7000));
  ASSERT_EQ(kill(c.pid, SIGCONT), 0);
  std::this_thread::sleep_for(milliseconds(1000));
  send_go(c);
  const Ended e = finish(c);
  EXPECT_EQ(e.code, 0) << "stopped 7 s under a 4 s watchdog, then continued: " << e.err;
  EXPECT_EQ(e.err, "");
  EXPECT_EQ(e.out, "went on\n");
}

TEST(Watchdog, AStopShorterThanTheDeadlineDoesNotKeepItFromFiring) {
  // A 4 s watchdog whose call never returns; the child is stopped 0.3 s in, for 2 s: it still fires
  // once it has run 4 s. The stop did not count: by the child's steady clock it fires about 6 s
  // after its making (a stop that overlaps a wait slice counts for at most the slice, and a loaded
  // machine adds), after 5 s at least; counting the stop, it fired after about 4 s.
  const double seconds = 4, stop = 2;
  const Child c =
      spawn([&](const auto& ready, const auto& go) { never_returns(seconds, ready, go); });
  ASSERT_GT(c.pid, 0);
  wait_ready(c);
  std::this_thread::sleep_for(milliseconds(300));
  ASSERT_EQ(kill(c.pid, SIGSTOP), 0);
  std::this_thread::sleep_for(std::chrono::duration<double>(stop));
  ASSERT_EQ(kill(c.pid, SIGCONT), 0);
  const Ended e = finish(c);
  EXPECT_EQ(e.code, kCode) << "stdout: " << e.out << "stderr: " << e.err;
  EXPECT_EQ(e.err, kMessage);
  EXPECT_GE(fired_after(e.out), seconds + stop / 2) << "the stop counted: " << e.out;
  EXPECT_LE(e.seconds, seconds + stop + 10) << "fired long after its deadline";
}

}  // namespace
