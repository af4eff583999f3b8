// Unit tests for include/dpt/files.h: the atomic writer (whole replacement, modes, symlinks,
// planted names, refused FIFOs/directories/devices), the non-blocking input open, the output
// pre-flight and its locks; and error.h's printable()/summarize(), which every message quoting a
// file's text uses.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "dpt/error.h"
#include "dpt/files.h"
#include "test_util.h"

namespace dpt {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

void put(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

// The names in `dir` (without "." and "..").
std::set<std::string> list_dir(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    out.insert(e.path().filename().string());
  return out;
}

mode_t lmode(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode;
}

// Runs fn, which must throw an input error whose message names every one of `names`.
void expect_input_error(const std::function<void()>& fn, const std::vector<std::string>& names) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown (expected an input error naming " << names.front() << ")";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput) << e.what();
    for (const std::string& n : names)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << n << " not in: " << e.what();
  }
}

class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::make_temp_dir("files"); }
  void TearDown() override {
    ::chmod(dir_.c_str(), 0700);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::string dir_;
};

// ---- AtomicFile / write_file_atomic ----

TEST_F(FilesTest, ReplacesContentWhole) {
  const std::string p = path("out.txt");
  put(p, std::string(4096, 'o') + "old tail");
  write_file_atomic(p, "new", "--report");
  EXPECT_EQ(slurp(p), "new");  // no byte of the longer old content survives
  EXPECT_EQ(list_dir(dir_), std::set<std::string>{"out.txt"});  // and no temporary is left
  // Binary content with NUL bytes goes through unchanged too.
  const std::string bin("a\0b\0\xff", 5);
  write_file_atomic(p, bin, "--report");
  EXPECT_EQ(slurp(p), bin);
  // A new file.
  write_file_atomic(path("fresh"), "x", "--save");
  EXPECT_EQ(slurp(path("fresh")), "x");
}

TEST_F(FilesTest, PlantedSymlinksAtOldTempNamesAreNotWrittenThrough) {
  const std::string victim_dir = test::make_temp_dir("victim");
  const std::string victim = victim_dir + "/victim";
  put(victim, "precious");
  for (bool target_exists : {false, true}) {
    SCOPED_TRACE(target_exists ? "target exists" : "target absent");
    const std::string p = path(target_exists ? "existing.out" : "absent.out");
    if (target_exists) put(p, "old");
    const std::vector<std::string> planted = {p + ".tmp", p + ".tmp." + std::to_string(::getpid())};
    for (const auto& s : planted) ASSERT_EQ(::symlink(victim.c_str(), s.c_str()), 0) << s;
    write_file_atomic(p, "payload", "--report");
    EXPECT_EQ(slurp(victim), "precious");
    EXPECT_EQ(slurp(p), "payload");
    EXPECT_TRUE(S_ISREG(lmode(p)));
    for (const auto& s : planted) EXPECT_TRUE(S_ISLNK(lmode(s))) << s;  // left alone, still links
  }
  struct stat st {};
  ASSERT_EQ(::stat(victim.c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 1u);
  std::filesystem::remove_all(victim_dir);
}

TEST_F(FilesTest, KeepsTheModeOfAReplacedFile) {
  const std::string p = path("ck.safetensors");
  put(p, "old");
  ASSERT_EQ(::chmod(p.c_str(), 0600), 0);
  const mode_t old_mask = ::umask(022);  // a umask that would give 0644 to a new file
  write_file_atomic(p, "new", "checkpoint");
  ::umask(old_mask);
  EXPECT_EQ(lmode(p) & 07777, 0600u);
  EXPECT_EQ(slurp(p), "new");

  // An unusual mode survives as well.
  ASSERT_EQ(::chmod(p.c_str(), 0640), 0);
  write_file_atomic(p, "newer", "checkpoint");
  EXPECT_EQ(lmode(p) & 07777, 0640u);
}

TEST_F(FilesTest, NewFileGets0666LessTheUmask) {
  for (mode_t mask : {mode_t{022}, mode_t{027}, mode_t{077}, mode_t{002}}) {
    const std::string p = path("new_" + std::to_string(mask));
    const mode_t old_mask = ::umask(mask);
    write_file_atomic(p, "x", "--save");
    ::umask(old_mask);
    EXPECT_EQ(lmode(p) & 07777, 0666u & ~mask) << "umask 0" << std::oct << mask;
  }
}

// A temporary is never more open than the file it becomes, from its first byte: a run killed
// mid-write leaves it readable only by those who may read the final file.
TEST_F(FilesTest, TheTemporaryHasTheFinalModeWhileWritten) {
  for (mode_t mask : {mode_t{077}, mode_t{027}, mode_t{0}}) {
    const std::string p = path("t_" + std::to_string(mask));
    const mode_t old_mask = ::umask(mask);
    AtomicFile f(p, "--save");
    ::umask(old_mask);
    f.write("x", 1);
    std::string temp;
    for (const std::string& n : list_dir(dir_))
      if (n.rfind("t_" + std::to_string(mask) + ".tmp.", 0) == 0) temp = path(n);
    ASSERT_FALSE(temp.empty());
    EXPECT_EQ(lmode(temp) & 07777, 0666u & ~mask) << "umask 0" << std::oct << mask;
    f.commit();
    EXPECT_EQ(lmode(p) & 07777, 0666u & ~mask) << "umask 0" << std::oct << mask;
  }
}

// The temporary's name ("<name>.tmp.<pid>.<10 random>") must fit NAME_MAX and PATH_MAX: a name
// that fits only without it failed at the first write, after training.
TEST_F(FilesTest, ANameTooLongForItsTemporaryIsRefused) {
  const std::string fits = path(std::string(200, 'n'));
  check_temp_name_fits(fits, "--save");
  write_file_atomic(fits, "x", "--save");
  const std::string too_long = path(std::string(240, 'n'));
  expect_input_error([&] { check_temp_name_fits(too_long, "--save"); },
                     {"--save", too_long, "the file name is too long for the temporary file"});
  std::string deep = dir_;
  while (deep.size() < PATH_MAX - 20) deep += "/" + std::string(200, 'd');
  expect_input_error([&] { check_temp_name_fits(deep + "/m.st", "--report"); },
                     {"--report", "the path is too long for the temporary file"});
}

TEST_F(FilesTest, RefusesAFifoTargetAndLeavesIt) {
  const std::string p = path("fifo");
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  expect_input_error([&] { write_file_atomic(p, "x", "--report"); }, {"--report", p});
  expect_input_error([&] { AtomicFile f(p, "--trace"); }, {"--trace", p});
  EXPECT_TRUE(S_ISFIFO(lmode(p)));
  EXPECT_EQ(list_dir(dir_), std::set<std::string>{"fifo"});  // no temporary left behind
}

TEST_F(FilesTest, RefusesADirectoryTarget) {
  const std::string p = path("sub");
  ASSERT_EQ(::mkdir(p.c_str(), 0700), 0);
  expect_input_error([&] { write_file_atomic(p, "x", "--save"); }, {"--save", p});
  EXPECT_TRUE(S_ISDIR(lmode(p)));
  EXPECT_TRUE(list_dir(p).empty());
  EXPECT_EQ(list_dir(dir_), std::set<std::string>{"sub"});
}

TEST_F(FilesTest, RefusesACharacterDeviceTarget) {
  const std::string p = path("null");
  if (::geteuid() != 0) GTEST_SKIP() << "mknod of a character device needs root";
  if (::mknod(p.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0)
    GTEST_SKIP() << "mknod refused here: " << std::strerror(errno);
  expect_input_error([&] { write_file_atomic(p, "x", "--save"); }, {"--save", p});
  const mode_t m = lmode(p);
  EXPECT_TRUE(S_ISCHR(m));
  struct stat st {};
  ASSERT_EQ(::lstat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_rdev, makedev(1, 3));
  EXPECT_EQ(list_dir(dir_), std::set<std::string>{"null"});
}

TEST_F(FilesTest, RefusesASymlinkToAFifo) {
  const std::string fifo = path("fifo"), link = path("link");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_EQ(::symlink(fifo.c_str(), link.c_str()), 0);
  expect_input_error([&] { write_file_atomic(link, "x", "--metrics"); }, {"--metrics", link});
  EXPECT_TRUE(S_ISLNK(lmode(link)));
  EXPECT_TRUE(S_ISFIFO(lmode(fifo)));
}

TEST_F(FilesTest, SymlinkToARegularFileStaysALink) {
  const std::string real_dir = test::make_temp_dir("real");
  const std::string real = real_dir + "/model.safetensors", link = path("model.safetensors");
  put(real, "old");
  ASSERT_EQ(::chmod(real.c_str(), 0600), 0);
  ASSERT_EQ(::symlink(real.c_str(), link.c_str()), 0);
  {
    AtomicFile f(link, "--save");
    char resolved[PATH_MAX];
    ASSERT_NE(::realpath(real.c_str(), resolved), nullptr);
    EXPECT_EQ(f.target(), std::string(resolved));
    f.write("new content", 11);
    f.commit();
  }
  EXPECT_TRUE(S_ISLNK(lmode(link)));
  char buf[PATH_MAX] = {};
  ASSERT_GT(::readlink(link.c_str(), buf, sizeof buf - 1), 0);
  EXPECT_EQ(std::string(buf), real);
  EXPECT_EQ(slurp(real), "new content");
  EXPECT_EQ(lmode(real) & 07777, 0600u);
  EXPECT_EQ(list_dir(real_dir), std::set<std::string>{"model.safetensors"});  // no temporary there
  EXPECT_EQ(list_dir(dir_), std::set<std::string>{"model.safetensors"});      // nor here
  std::filesystem::remove_all(real_dir);
}

// The kernel's fs.protected_symlinks rule, applied by dptrain itself (the kernel's never applies:
// the link is resolved and the file it names replaced by a rename): in a directory others can
// write, a link owned by neither this process's user nor the directory's owner is not followed.
// Links owned by another uid need lchown, hence root.
TEST_F(FilesTest, RefusesAnotherUsersSymlinkInADirectoryOthersCanWrite) {
  if (::geteuid() != 0) GTEST_SKIP() << "a symlink owned by another uid needs root (lchown)";
  const uid_t other = 65534;  // nobody: neither this process (root) nor the directory's owner
  const std::string victim = path("victim"), shared = path("shared");
  put(victim, "precious");
  ASSERT_EQ(::mkdir(shared.c_str(), 0700), 0);
  for (const mode_t dir_mode : {01777, 0777, 0773}) {  // sticky or not, others can write
    SCOPED_TRACE(dir_mode);
    ASSERT_EQ(::chmod(shared.c_str(), dir_mode), 0);
    const std::string link = shared + "/ck.st";
    ASSERT_EQ(::symlink(victim.c_str(), link.c_str()), 0);
    ASSERT_EQ(::lchown(link.c_str(), other, static_cast<gid_t>(-1)), 0);
    const std::vector<std::string> names = {link, "uid 65534", victim, "other users can write",
                                            "does not write through it"};
    std::vector<std::string> with_flag = names;
    with_flag.insert(with_flag.begin(), "--checkpoint-path");
    expect_input_error([&] { write_file_atomic(link, "payload", "--checkpoint-path"); }, with_flag);
    with_flag[0] = "--save";
    expect_input_error([&] { check_output_path(link, "--save"); }, with_flag);
    with_flag[0] = "--metrics";
    expect_input_error([&] { check_output_path(link, "--metrics", true); }, with_flag);
    expect_input_error([&] { OutputLock::file_for(link, "--metrics"); }, with_flag);
    EXPECT_EQ(slurp(victim), "precious");
    EXPECT_TRUE(S_ISLNK(lmode(link)));
    EXPECT_EQ(list_dir(shared), std::set<std::string>{"ck.st"});  // no temporary, no lock left
    // A planted link to a character device is refused for a stream as well.
    const std::string dev_link = shared + "/m.jsonl";
    ASSERT_EQ(::symlink("/dev/null", dev_link.c_str()), 0);
    ASSERT_EQ(::lchown(dev_link.c_str(), other, static_cast<gid_t>(-1)), 0);
    expect_input_error([&] { check_output_path(dev_link, "--metrics", true); },
                       {"--metrics", dev_link, "uid 65534", "/dev/null"});
    ASSERT_EQ(::unlink(dev_link.c_str()), 0);
    ASSERT_EQ(::unlink(link.c_str()), 0);
  }
  std::filesystem::remove_all(shared);
}

// What the rule lets through: one's own link in a shared directory, a link of the directory's
// owner (who could write the file anyway), and any link in a directory others cannot write.
TEST_F(FilesTest, FollowsTrustedSymlinks) {
  if (::geteuid() != 0) GTEST_SKIP() << "a symlink owned by another uid needs root (lchown)";
  const uid_t other = 65534;
  const std::string victim = path("victim"), dir = path("d");
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  const std::string link = dir + "/out.json";
  struct Case {
    const char* name;
    mode_t dir_mode;
    uid_t dir_owner, link_owner;
  };
  for (const Case& c : {Case{"own link, shared directory", 01777, 0, 0},
                        Case{"the directory owner's link", 01777, other, other},
                        Case{"another user's link, private directory", 0755, 0, other}}) {
    SCOPED_TRACE(c.name);
    put(victim, "old");
    ASSERT_EQ(::chmod(dir.c_str(), c.dir_mode), 0);
    ASSERT_EQ(::chown(dir.c_str(), c.dir_owner, static_cast<gid_t>(-1)), 0);
    ASSERT_EQ(::symlink(victim.c_str(), link.c_str()), 0);
    ASSERT_EQ(::lchown(link.c_str(), c.link_owner, static_cast<gid_t>(-1)), 0);
    EXPECT_NO_THROW(check_output_path(link, "--report"));
    write_file_atomic(link, "new", "--report");
    EXPECT_EQ(slurp(victim), "new");
    EXPECT_TRUE(S_ISLNK(lmode(link)));
    ASSERT_EQ(::unlink(link.c_str()), 0);
  }
  std::filesystem::remove_all(dir);
}

TEST_F(FilesTest, RefusesADanglingSymlink) {
  const std::string missing = path("missing"), link = path("dangling");
  ASSERT_EQ(::symlink(missing.c_str(), link.c_str()), 0);
  expect_input_error([&] { write_file_atomic(link, "x", "--trace"); }, {"--trace", link});
  EXPECT_TRUE(S_ISLNK(lmode(link)));
  struct stat st {};
  EXPECT_NE(::lstat(missing.c_str(), &st), 0);  // the link's target was not created
  EXPECT_EQ(list_dir(dir_), std::set<std::string>{"dangling"});
}

TEST_F(FilesTest, DestroyedWithoutCommitLeavesTheOldFile) {
  const std::string p = path("keep.txt");
  put(p, "old content");
  {
    AtomicFile f(p, "--report");
    f.write("half a new", 10);
    EXPECT_EQ(list_dir(dir_).size(), 2u);  // the target and its temporary
  }
  EXPECT_EQ(slurp(p), "old content");
  EXPECT_EQ(list_dir(dir_), std::set<std::string>{"keep.txt"});
  {
    AtomicFile f(path("never"), "--report");  // a new file, never committed
  }
  EXPECT_EQ(list_dir(dir_), std::set<std::string>{"keep.txt"});
}

TEST_F(FilesTest, TemporaryNamesAreUnpredictable) {
  const std::string p = path("ck.st");
  put(p, "old");
  std::set<std::string> temps;
  {
    AtomicFile a(p, "checkpoint"), b(p, "checkpoint");
    const std::set<std::string> names = list_dir(dir_);
    ASSERT_EQ(names.size(), 3u);  // the target and two distinct temporaries
    for (const std::string& n : names) {
      if (n == "ck.st") continue;
      temps.insert(n);
      EXPECT_NE(n, "ck.st.tmp");
      EXPECT_NE(n, "ck.st.tmp." + std::to_string(::getpid()));
      std::string target;
      pid_t pid = 0;
      EXPECT_TRUE(parse_atomic_temp(n, &target, &pid)) << n;
      EXPECT_EQ(target, "ck.st");
      EXPECT_EQ(pid, ::getpid());
    }
    a.write("A", 1);
    b.write("B", 1);
    b.commit();
    EXPECT_EQ(slurp(p), "B");
  }
  EXPECT_EQ(temps.size(), 2u);
  EXPECT_EQ(list_dir(dir_), std::set<std::string>{"ck.st"});  // a's temporary removed, b's renamed
  EXPECT_EQ(slurp(p), "B");
}

// ---- open_input_file / check_input_file ----

// Runs fn in a forked child under alarm(3), so a blocked open is killed instead of hanging the
// suite. Returns the child's exit code (128+signal when killed) and the seconds it took.
std::pair<int, double> run_in_child(const std::function<int()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(3);
    int rc = 99;
    try {
      rc = fn();
    } catch (...) {
      rc = 98;
    }
    std::_Exit(rc);
  }
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), secs};
}

// In the child: 0 when fn throws an input error naming `what` and the path, 1 when it returns, 2
// for another error.
int input_error_in_child(const std::function<void()>& fn, const std::string& what,
                         const std::string& path) {
  try {
    fn();
    return 1;
  } catch (const Error& e) {
    const std::string m = e.what();
    return e.kind() == ErrorKind::kInput && m.find(what) != std::string::npos &&
                   m.find(path) != std::string::npos
               ? 0
               : 2;
  }
}

TEST_F(FilesTest, OpenInputFileOnAFifoWithoutWriterFailsAtOnce) {
  const std::string p = path("data.fifo");
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  for (bool keep_open : {true, false}) {
    SCOPED_TRACE(keep_open ? "open_input_file" : "check_input_file");
    const auto [rc, secs] = run_in_child([&] {
      return input_error_in_child(
          [&] {
            if (keep_open)
              ::close(open_input_file(p, "--data"));
            else
              check_input_file(p, "--data");
          },
          "--data", p);
    });
    EXPECT_EQ(rc, 0) << "128+14 means the open blocked until alarm(3) (SIGALRM)";
    EXPECT_LT(secs, 1.0);
  }
  EXPECT_TRUE(S_ISFIFO(lmode(p)));
}

TEST_F(FilesTest, OpenInputFileRefusesDirectoriesAndDevices) {
  expect_input_error([&] { open_input_file(dir_, "--resume"); }, {"--resume", dir_});
  expect_input_error([&] { check_input_file(dir_, "--resume"); }, {"--resume", dir_});
  // /dev/null would read as an empty file: refused as a device (in a child, in case it blocks).
  const auto [rc, secs] = run_in_child([] {
    return input_error_in_child([] { ::close(open_input_file("/dev/null", "--data")); }, "--data",
                                "/dev/null");
  });
  EXPECT_EQ(rc, 0);
  EXPECT_LT(secs, 1.0);
  expect_input_error([&] { open_input_file(path("absent"), "--data"); },
                     {"--data", path("absent")});
  expect_input_error([&] { open_input_file("", "--data"); }, {"--data"});
}

TEST_F(FilesTest, OpenInputFileGivesABlockingReadableDescriptor) {
  const std::string p = path("in.bin");
  put(p, "hello");
  const int fd = open_input_file(p, "--data");
  ASSERT_GE(fd, 0);
  const int flags = ::fcntl(fd, F_GETFL);
  ASSERT_GE(flags, 0);
  EXPECT_EQ(flags & O_NONBLOCK, 0);
  EXPECT_EQ(flags & O_ACCMODE, O_RDONLY);
  char buf[16] = {};
  EXPECT_EQ(::read(fd, buf, sizeof buf), 5);
  EXPECT_EQ(std::string(buf), "hello");
  ::close(fd);
  EXPECT_NO_THROW(check_input_file(p, "--data"));
  // Through a symlink to a regular file as well.
  const std::string link = path("in.link");
  ASSERT_EQ(::symlink(p.c_str(), link.c_str()), 0);
  const int fd2 = open_input_file(link, "--data");
  ASSERT_GE(fd2, 0);
  ::close(fd2);
}

// ---- parse_atomic_temp ----

TEST(ParseAtomicTemp, AcceptsBothForms) {
  std::string target;
  pid_t pid = 0;
  ASSERT_TRUE(parse_atomic_temp("ck.st.tmp.123", &target, &pid));
  EXPECT_EQ(target, "ck.st");
  EXPECT_EQ(pid, 123);
  target.clear(), pid = 0;
  ASSERT_TRUE(parse_atomic_temp("ck.st.tmp.123.AbC9", &target, &pid));
  EXPECT_EQ(target, "ck.st");
  EXPECT_EQ(pid, 123);
}

TEST(ParseAtomicTemp, RejectsOtherNames) {
  for (const char* name : {"ck.st.tmp.", "ck.st.tmp.x1", "ck.st.tmp.1.a.b", ".tmp.1", "ck.st",
                           "ck.st.tmp", "ck.st.tmp.1."}) {
    std::string target = "unchanged";
    pid_t pid = -7;
    EXPECT_FALSE(parse_atomic_temp(name, &target, &pid)) << name;
  }
}

// ---- check_output_path ----

TEST_F(FilesTest, CheckOutputPath) {
  // Absent in a writable directory, and an existing regular file: fine.
  EXPECT_NO_THROW(check_output_path(path("absent.json"), "--metrics"));
  put(path("present.json"), "x");
  EXPECT_NO_THROW(check_output_path(path("present.json"), "--metrics"));
  EXPECT_EQ(slurp(path("present.json")), "x");  // only checked, not touched
  // A missing directory.
  const std::string missing = path("no/such/dir/out.svg");
  expect_input_error([&] { check_output_path(missing, "--report"); },
                     {"--report", missing, "does not exist"});
  // A FIFO and a directory.
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  expect_input_error([&] { check_output_path(path("fifo"), "--trace"); },
                     {"--trace", path("fifo")});
  EXPECT_TRUE(S_ISFIFO(lmode(path("fifo"))));
  expect_input_error([&] { check_output_path(dir_, "--save"); }, {"--save", dir_});
  expect_input_error([&] { check_output_path("", "--save"); }, {"--save"});
}

// A stream (--metrics, appended to) may be a writable character device; nothing else may.
TEST_F(FilesTest, CheckOutputPathStreamAcceptsACharacterDeviceOnly) {
  // /dev/null is only looked at (stat, access), never opened or written.
  expect_input_error([&] { check_output_path("/dev/null", "--save"); }, {"--save", "/dev/null"});
  expect_input_error([&] { check_output_path("/dev/null", "--save", false); },
                     {"--save", "/dev/null"});
  EXPECT_NO_THROW(check_output_path("/dev/null", "--metrics", true));
  EXPECT_TRUE(S_ISCHR(lmode("/dev/null")));
  // A FIFO or a directory is no stream target either.
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  expect_input_error([&] { check_output_path(path("fifo"), "--metrics", true); },
                     {"--metrics", path("fifo")});
  expect_input_error([&] { check_output_path(dir_, "--metrics", true); }, {"--metrics", dir_});
  // Regular and absent files as before.
  EXPECT_NO_THROW(check_output_path(path("m.jsonl"), "--metrics", true));
  put(path("m.jsonl"), "x");
  EXPECT_NO_THROW(check_output_path(path("m.jsonl"), "--metrics", true));
}

// The two access checks of check_output_path: a directory the user cannot write, and an existing
// file it cannot write (in a directory it can). root passes every access(W_OK), and CI runs as
// root, so there the checks run in a child that has dropped to uid/gid 65534 ("nobody"): the same
// files are then unwritable for it. The writable cases are the control: the same calls accept them.
TEST_F(FilesTest, CheckOutputPathRefusesAnUnwritableDirectoryOrFile) {
  const std::string ro = path("ro"), wdir = path("open");
  ASSERT_EQ(::mkdir(ro.c_str(), 0500), 0);
  ASSERT_EQ(::mkdir(wdir.c_str(), 0700), 0);
  put(wdir + "/locked.json", "x");
  ASSERT_EQ(::chmod((wdir + "/locked.json").c_str(), 0444), 0);
  put(wdir + "/free.json", "x");
  ASSERT_EQ(::chmod((wdir + "/free.json").c_str(), 0666), 0);
  const bool root = ::geteuid() == 0;
  if (root) {
    // Another user reaches the files through directories it may search: ro it may not write,
    // open it may.
    ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);
    ASSERT_EQ(::chmod(ro.c_str(), 0555), 0);
    ASSERT_EQ(::chmod(wdir.c_str(), 0777), 0);
  }
  // Each check's failures, as text down a pipe: the child's exit status alone would not say which.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    std::string failures;
    if (root && (::setgid(65534) != 0 || ::setuid(65534) != 0)) {
      failures += "cannot drop to uid 65534: " + std::string(std::strerror(errno)) + "\n";
    } else {
      auto refused = [&](const std::string& p, const std::string& want) {
        try {
          check_output_path(p, "--metrics");
          failures += p + ": accepted (expected '" + want + "')\n";
        } catch (const Error& e) {
          const std::string what = e.what();
          if (e.kind() != ErrorKind::kInput || what.find("--metrics") == std::string::npos ||
              what.find(want) == std::string::npos)
            failures += p + ": wrong error: " + what + "\n";
        }
      };
      auto accepted = [&](const std::string& p) {
        try {
          check_output_path(p, "--metrics");
        } catch (const std::exception& e) {
          failures += p + ": refused: " + e.what() + "\n";
        }
      };
      refused(ro + "/out.json", "the directory " + ro + " is not writable");
      refused(wdir + "/locked.json", "the file exists and is not writable");
      accepted(wdir + "/new.json");
      accepted(wdir + "/free.json");
    }
    const ssize_t w = ::write(fds[1], failures.data(), failures.size());
    ::_exit(w == static_cast<ssize_t>(failures.size()) && failures.empty() ? 0 : 1);
  }
  ::close(fds[1]);
  std::string report;
  char buf[512];
  for (ssize_t got; (got = ::read(fds[0], buf, sizeof buf)) > 0;) report.append(buf, got);
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << report;
  EXPECT_EQ(report, "");
  ::chmod(ro.c_str(), 0700);
}

// ---- a file one may write but not replace: --metrics trimmed in place ----

ino_t inode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_ino;
}

TEST_F(FilesTest, RewriteInPlaceKeepsTheFileAndCutsItToTheNewBytes) {
  const std::string m = path("m.jsonl");
  put(m, "{\"epoch\":1}\n{\"epoch\":2}\n{\"epoch\":3}\n");
  ASSERT_EQ(::chmod(m.c_str(), 0640), 0);
  const ino_t ino = inode_of(m);
  rewrite_file_in_place(m, "{\"epoch\":1}\n", "--metrics");  // shorter: cut
  EXPECT_EQ(slurp(m), "{\"epoch\":1}\n");
  rewrite_file_in_place(m, "{\"epoch\":1}\n{\"epoch\":2}\n", "--metrics");  // longer: grown
  EXPECT_EQ(slurp(m), "{\"epoch\":1}\n{\"epoch\":2}\n");
  EXPECT_EQ(inode_of(m), ino);  // the same file, not a new one renamed over it
  EXPECT_EQ(lmode(m) & 07777, 0640u);
  EXPECT_EQ(list_dir(dir_), std::set<std::string>{"m.jsonl"});  // no temporary
  // Through a symlink: the file it names, and the link stays.
  ASSERT_EQ(::symlink(m.c_str(), path("link").c_str()), 0);
  rewrite_file_in_place(path("link"), "", "--metrics");
  EXPECT_EQ(slurp(m), "");
  EXPECT_TRUE(S_ISLNK(lmode(path("link"))));
  // Never created, never a FIFO (refused at once, no reader waited for) or a directory.
  expect_input_error([&] { rewrite_file_in_place(path("absent"), "x", "--metrics"); },
                     {"--metrics", path("absent")});
  EXPECT_FALSE(std::filesystem::exists(path("absent")));
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  expect_input_error([&] { rewrite_file_in_place(path("fifo"), "x", "--metrics"); },
                     {"--metrics", path("fifo")});
  expect_input_error([&] { rewrite_file_in_place(dir_, "x", "--metrics"); }, {"--metrics", dir_});
}

TEST(InPlaceRewriteFrom, CutsAtTheCommonPrefixOrTheLastWholeLineShared) {
  EXPECT_EQ(in_place_rewrite_from("a\nb\nc\n", "a\n"), 2u);            // a trim: one cut
  EXPECT_EQ(in_place_rewrite_from("a\nb\n", "a\nb\n"), 4u);            // nothing to do
  EXPECT_EQ(in_place_rewrite_from("a\n{\"x\"", "a\n{\"x\"\n"), 6u);    // a cut record's newline
  EXPECT_EQ(in_place_rewrite_from("a\nb1\nnote\n", "a\nnote\n"), 2u);  // a line kept after
  EXPECT_EQ(in_place_rewrite_from("ab\nc\n", "ac\n"), 0u);             // no whole line shared
  EXPECT_EQ(in_place_rewrite_from("", ""), 0u);
  EXPECT_EQ(in_place_rewrite_from("x\n", ""), 0u);
}

// Kills this process with SIGSYS at its first call of system call `nr` (seccomp): a run stopped
// exactly there, as a kill or a power cut between two steps of the rewrite would stop it. False
// where seccomp is not allowed.
bool die_at_syscall(long nr) {
  sock_filter code[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<__u32>(nr), 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof code / sizeof code[0]), code};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

// rewrite_file_in_place(m, kept) in a child that dies at its first call of `nr` (none: -1) with
// the file size limited to `max_size` bytes (a full disk: writes past it fail, EFBIG); the child's
// wait status, or -1 where seccomp was refused.
int rewrite_in_child(const std::string& m, const std::string& kept, long nr, rlim_t max_size) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);  // the write fails instead of killing
    const rlimit limit{max_size, max_size};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(10);
    if (nr >= 0 && !die_at_syscall(nr)) ::_exit(11);
    try {
      rewrite_file_in_place(m, kept, "--metrics");
    } catch (const Error& e) {
      ::_exit(std::string(e.what()).find("File too large") != std::string::npos ? 20 : 21);
    }
    ::_exit(0);
  }
  int status = -1;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) && WEXITSTATUS(status) == 11 ? -1 : status;
}

bool killed_by_sigsys(int status) { return WIFSIGNALED(status) && WTERMSIG(status) == SIGSYS; }

// Stopped anywhere, the rewrite leaves whole lines of the file's own, then at most one line cut
// short: never old bytes after new ones (written over the start and then cut, a stop between the
// two left the kept lines, then the old file's tail from mid-line).
TEST_F(FilesTest, RewriteInPlaceStoppedAnywhereLeavesNoOldBytesAfterNewOnes) {
  const std::string m = path("m.jsonl");
  const std::string e1 = "{\"epoch\":1}\n", e2 = "{\"epoch\":2}\n", e3 = "{\"epoch\":3}\n",
                    note = "# a note\n";
  const rlim_t unlimited = RLIM_INFINITY;
  // The usual trim, the records past the resume point last: one ftruncate and nothing written.
  put(m, e1 + e2 + e3);
  int st = rewrite_in_child(m, e1, SYS_ftruncate, unlimited);
  if (st == -1) GTEST_SKIP() << "seccomp refused here";
  EXPECT_TRUE(killed_by_sigsys(st)) << st;
  EXPECT_EQ(slurp(m), e1 + e2 + e3);  // stopped before the cut: as it was, trimmed next time
  st = rewrite_in_child(m, e1, SYS_write, unlimited);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;  // never reached a write
  EXPECT_EQ(slurp(m), e1);

  // A line kept after a dropped one: cut at the line before the first dropped one, then the rest.
  const std::string before = e1 + e2 + note + e3, kept = e1 + note;
  put(m, before);
  st = rewrite_in_child(m, kept, SYS_ftruncate, unlimited);
  EXPECT_TRUE(killed_by_sigsys(st)) << st;
  EXPECT_EQ(slurp(m), before);  // stopped before anything changed
  st = rewrite_in_child(m, kept, SYS_write, unlimited);
  EXPECT_TRUE(killed_by_sigsys(st)) << st;
  EXPECT_EQ(slurp(m), e1);  // cut; the note not yet written again
  put(m, before);
  st = rewrite_in_child(m, kept, -1, e1.size() + 3);  // the disk full 3 bytes into the note
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 20) << st;
  EXPECT_EQ(slurp(m), e1 + "# a");  // a last line cut short, which the next trim drops
  rewrite_file_in_place(m, e1, "--metrics");
  EXPECT_EQ(slurp(m), e1);
  put(m, before);
  rewrite_file_in_place(m, kept, "--metrics");  // not stopped: the kept lines exactly
  EXPECT_EQ(slurp(m), kept);

  // A last record cut short, kept with its newline: one byte appended, nothing cut.
  put(m, e1 + "{\"epoch\":2}");
  st = rewrite_in_child(m, e1 + e2, SYS_ftruncate, unlimited);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  EXPECT_EQ(slurp(m), e1 + e2);
}

// In a sticky directory only the file's owner, the directory's owner and root may rename over a
// file: checked as uid 65534 in a child (root may replace anything), the same files as root.
TEST_F(FilesTest, MayReplaceByRenameIsFalseOnlyForAnotherUsersFileInAStickyDirectory) {
  if (::geteuid() != 0) GTEST_SKIP() << "another user's file needs root (a file owned by root)";
  const std::string sticky = path("sticky"), open_dir = path("open");
  ASSERT_EQ(::mkdir(sticky.c_str(), 0700), 0);
  ASSERT_EQ(::mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(sticky.c_str(), 01777), 0);
  ASSERT_EQ(::chmod(open_dir.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);
  for (const std::string& f : {sticky + "/roots.jsonl", open_dir + "/roots.jsonl"}) {
    put(f, "root's\n");
    ASSERT_EQ(::chmod(f.c_str(), 0666), 0);
  }
  EXPECT_TRUE(may_replace_by_rename(sticky + "/roots.jsonl", "--metrics"));  // root may
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(10);
    put(sticky + "/mine.jsonl", "mine\n");
    int code = 0;
    if (may_replace_by_rename(sticky + "/roots.jsonl", "--metrics")) code |= 1;     // root's here
    if (!may_replace_by_rename(sticky + "/mine.jsonl", "--metrics")) code |= 2;     // its own
    if (!may_replace_by_rename(sticky + "/absent.jsonl", "--metrics")) code |= 4;   // none yet
    if (!may_replace_by_rename(open_dir + "/roots.jsonl", "--metrics")) code |= 8;  // not sticky
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "bits: 1 root's file in the sticky directory said replaceable, 2 its own file not, 4 an "
         "absent one not, 8 root's file in a non-sticky directory not, 10 could not drop to uid "
         "65534";
}

// ---- OutputLock ----

TEST_F(FilesTest, OutputLockRefusesASecondRunNamingTheHolder) {
  const std::string out = path("m.jsonl");
  put(out, "x");
  ASSERT_EQ(::symlink(out.c_str(), path("link").c_str()), 0);
  {
    OutputLock first = check_output_path(out, "--metrics", true);
    EXPECT_EQ(first.file(), out + ".lock");
    // flock locks are per open file: a second lock in this process conflicts as another run's
    // would.
    const std::string holder = "pid " + std::to_string(::getpid()) + " on host";
    expect_input_error([&] { OutputLock second(out, "--report"); },
                       {"--report", out, "in use by another run", holder, out + ".lock"});
    // Through a symlink it is the same file, so the same lock.
    expect_input_error([&] { check_output_path(path("link"), "--trace"); },
                       {"--trace", path("link"), holder});
  }
  // Released: the lock file is gone with it, and the next run takes the output.
  EXPECT_EQ(list_dir(dir_), (std::set<std::string>{"m.jsonl", "link"}));
  EXPECT_EQ(slurp(out), "x");
  EXPECT_NO_THROW(OutputLock(out, "--metrics"));
}

// A run killed with SIGKILL leaves its lock file, unlocked: it refuses nobody.
TEST_F(FilesTest, OutputLockDiesWithItsProcess) {
  const std::string out = path("r.svg");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    OutputLock lock(out, "--report");
    (void)!::write(ready[1], "1", 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  expect_input_error([&] { OutputLock second(out, "--report"); },
                     {"--report", out, "pid " + std::to_string(child) + " on host"});
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(ready[0]), ::close(ready[1]);
  EXPECT_TRUE(std::filesystem::exists(out + ".lock"));
  EXPECT_NO_THROW(OutputLock(out, "--report"));
}

TEST_F(FilesTest, OutputLockNeverFollowsAPlantedSymlinkOrFifo) {
  ASSERT_EQ(::symlink(path("victim").c_str(), path("m.jsonl.lock").c_str()), 0);
  expect_input_error([&] { OutputLock l(path("m.jsonl"), "--metrics"); },
                     {"--metrics", path("m.jsonl.lock"), "symlink"});
  EXPECT_FALSE(std::filesystem::exists(path("victim")));
  ASSERT_EQ(::mkfifo(path("t.json.lock").c_str(), 0600), 0);
  expect_input_error([&] { OutputLock l(path("t.json"), "--trace"); },
                     {"--trace", path("t.json.lock"), "a FIFO"});
}

// ---- printable / summarize (error.h) ----

TEST(Printable, EscapesControlBytesAndCutsLongText) {
  EXPECT_EQ(printable("plain id 0123"), "plain id 0123");
  EXPECT_EQ(printable(std::string("a\nb\x1b[31m\t\r\0\x7f\xc3\xa9\\", 15)),
            "a\\nb\\x1b[31m\\t\\r\\x00\\x7f\\xc3\\xa9\\\\");
  const std::string big(100000, 'i');
  EXPECT_EQ(printable(big), std::string(120, 'i') + "... (100000 bytes)");
  EXPECT_EQ(printable(big, 5), "iiiii... (100000 bytes)");
  EXPECT_EQ(printable(""), "");
}

TEST(Summarize, ShowsTheFirstFewAndCountsTheRest) {
  EXPECT_EQ(summarize({}), "");
  EXPECT_EQ(summarize({"a", "b", "c"}), "a, b, c");
  std::vector<std::string> many(3000, "f");
  many[0] = "x\ny";
  EXPECT_EQ(summarize(many), "x\\ny, f, f and 2,997 more");
  EXPECT_EQ(summarize(std::vector<std::string>(1234567, "f"), 1), "f and 1,234,566 more");
}

}  // namespace
}  // namespace dpt
