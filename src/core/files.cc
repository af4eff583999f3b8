// The atomic writer, the output locks and the input/output checks of include/dpt/files.h.
// Everything goes through file descriptors opened with O_NOFOLLOW/O_EXCL/O_NONBLOCK: a name checked
// with stat and then opened by name could be swapped in between, a descriptor cannot.
#include "dpt/files.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>
#include <sstream>

#include "dpt/error.h"

namespace dpt {

namespace {

std::string dir_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string base_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// What a non-regular file is, for messages.
const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  return "not a regular file";
}

std::string errno_text() { return std::strerror(errno); }

// Writes all n bytes at fd's offset, retrying interrupted calls; false (errno set) on failure.
bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w, n -= static_cast<size_t>(w);
  }
  return true;
}

// Appends the rest of fd's file from its offset to *out, retrying interrupted reads; false (errno
// set) on failure.
bool read_all(int fd, std::string* out) {
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n == 0;
    out->append(buf, static_cast<size_t>(n));
  }
}

// AtomicFile's temporary for `target`: "<dir>/<name>.tmp.<pid>." and kTempRandom random characters.
constexpr size_t kTempRandom = 10;
std::string temp_stem(const std::string& target) {
  return dir_of(target) + "/" + base_of(target) + ".tmp." + std::to_string(::getpid()) + ".";
}

// The process's umask, read without changing it (umask(2) can only be read by setting it, and
// another thread creating a file meanwhile would get the wrong mode): /proc/self/status has it.
mode_t current_umask() {
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    unsigned mask = 0;
    bool found = false;
    while (!found && std::fgets(line, sizeof line, f))
      found = std::sscanf(line, "Umask: %o", &mask) == 1;
    std::fclose(f);
    if (found) return static_cast<mode_t>(mask);
  }
  const mode_t mask = ::umask(0);
  ::umask(mask);
  return mask;
}

// Refuses to follow the symlink `path` (lst: its lstat) when another user could have planted it:
// the rule of the kernel's fs.protected_symlinks, which never applies here because the link is
// resolved (realpath) and the rename goes to the file it names, and which is off on many machines
// anyway. In a directory others can write (sticky or not: without the sticky bit they could also
// have replaced an operator's own link), a link is followed only when it is the process's (euid)
// or the directory owner's, who could write the file named anyway. A link one made oneself, or
// one in a directory only trusted users write, is followed as before.
void refuse_planted_link(const std::string& path, const std::string& what, const struct stat& lst) {
  const std::string dir = dir_of(path);
  struct stat dst {};
  if (::stat(dir.c_str(), &dst) != 0 || !(dst.st_mode & S_IWOTH)) return;
  if (lst.st_uid == ::geteuid() || lst.st_uid == dst.st_uid) return;
  char target[PATH_MAX];
  const ssize_t n = ::readlink(path.c_str(), target, sizeof target);
  const std::string to =
      n >= 0 ? printable(std::string_view(target, static_cast<size_t>(n)), 200) : "?";
  DPT_INPUT_CHECK(false, what << " " << path << " is a symbolic link (to " << to
                              << ") owned by uid " << lst.st_uid << " in a directory other users "
                              << "can write (" << dir << "): dptrain does not write through it; "
                              << "remove it or choose another path");
}

// The file an output at `path` really is: `path` itself, or the regular file a symlink (chain)
// names. Sets *st when it exists (st->st_mode == 0 when not).
std::string resolve_output(const std::string& path, const std::string& what, struct stat* st) {
  *st = {};
  struct stat lst {};
  if (::lstat(path.c_str(), &lst) != 0) {
    DPT_INPUT_CHECK(errno == ENOENT, what << " " << path << ": " << errno_text());
    return path;
  }
  if (!S_ISLNK(lst.st_mode)) {
    DPT_INPUT_CHECK(!S_ISDIR(lst.st_mode), what << " " << path << " is a directory, not a file");
    DPT_INPUT_CHECK(S_ISREG(lst.st_mode), what << " " << path << " is " << kind_of(lst.st_mode)
                                               << ", not a regular file: refusing to replace it");
    *st = lst;
    return path;
  }
  refuse_planted_link(path, what, lst);
  // A symlink: followed only to an existing regular file, so the rename replaces that file (and
  // the link keeps naming it) instead of putting a regular file where the link was.
  char real[PATH_MAX];
  if (::realpath(path.c_str(), real) == nullptr) {
    const std::string err = errno_text();
    // /dev/stdout, /proc/self/fd/N: a link to a pipe or socket ("pipe:[123]") has no path that
    // realpath can resolve, yet stat reaches it. Name what it is, not "nothing that exists"
    // (predict --output /dev/stdout | head said so).
    struct stat tst {};
    DPT_INPUT_CHECK(::stat(path.c_str(), &tst) != 0,
                    what << " " << path << " is a symlink to " << kind_of(tst.st_mode)
                         << " (such as a pipe to another program), not to a regular file: refusing "
                         << "to write through it; write to a file and read that");
    DPT_INPUT_CHECK(false, what << " " << path << " is a symlink to nothing that exists (" << err
                                << "): refusing to write through it");
  }
  DPT_INPUT_CHECK(::stat(real, st) == 0, what << " " << path << ": " << errno_text());
  DPT_INPUT_CHECK(S_ISREG(st->st_mode), what << " " << path << " is a symlink to " << real
                                             << ", which is " << kind_of(st->st_mode)
                                             << ": refusing to replace it");
  return real;
}

// In a sticky directory (/tmp) only the file's owner, the directory's owner and root may replace
// (rename over, or remove) a file, however writable it is. `st`: the existing file's stat
// (st_mode 0: none), `dst`: its directory's.
bool sticky_forbids_replacing(const struct stat& st, const struct stat& dst) {
  const uid_t me = ::geteuid();
  return st.st_mode != 0 && (dst.st_mode & S_ISVTX) && me != 0 && st.st_uid != me &&
         dst.st_uid != me;
}

}  // namespace

void refuse_planted_link(const std::string& path, const std::string& what) {
  struct stat lst {};
  if (::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode))
    refuse_planted_link(path, what, lst);
}

AtomicFile::AtomicFile(const std::string& path, const std::string& what)
    : path_(path), what_(what) {
  DPT_INPUT_CHECK(!path.empty(), what << ": the path is empty");
  struct stat st {};
  target_ = resolve_output(path, what, &st);
  // The mode of the file replaced, so a 0600 checkpoint stays 0600; a new file gets the umask's.
  mode_t mode = 0666;
  if (st.st_mode == 0) {
    mode &= ~current_umask();
  } else {
    mode = st.st_mode & 07777;
  }
  // An unpredictable name: another user cannot plant a symlink at it in advance, and O_EXCL |
  // O_NOFOLLOW refuses one planted by a lucky guess (we then draw again).
  std::random_device rd;
  static const char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  const std::string stem = temp_stem(target_);
  for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
    std::string suffix(kTempRandom, 'x');
    for (char& c : suffix) c = kAlnum[rd() % (sizeof kAlnum - 1)];
    temp_ = stem + suffix;
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    DPT_INPUT_CHECK(fd_ >= 0 || errno == EEXIST, what << ": cannot create a temporary file beside "
                                                      << path << " (" << temp_
                                                      << "): " << errno_text());
  }
  DPT_INPUT_CHECK(fd_ >= 0, what << ": cannot create a temporary file beside " << path
                                 << ": every name was taken");
  // open's mode is masked by the umask: set the replaced file's mode exactly.
  if (::fchmod(fd_, mode) != 0) {
    const std::string err = errno_text();
    ::close(fd_), fd_ = -1, ::unlink(temp_.c_str());
    DPT_INPUT_CHECK(false, what << ": cannot set the mode of " << temp_ << ": " << err);
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_.empty()) ::unlink(temp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  DPT_CHECK(fd_ >= 0, "AtomicFile::write after commit");
  DPT_INPUT_CHECK(
      write_all(fd_, static_cast<const char*>(data), n),
      "cannot write " << what_ << " " << path_ << " (via " << temp_ << "): " << errno_text());
}

void AtomicFile::commit() {
  DPT_CHECK(fd_ >= 0, "AtomicFile::commit twice");
  // The bytes must be on disk before the rename makes them the file: a power cut would otherwise
  // leave an empty file behind a completed rename.
  DPT_INPUT_CHECK(::fsync(fd_) == 0, "cannot write " << what_ << " " << path_ << " (via " << temp_
                                                     << "): " << errno_text());
  const int rc = ::close(fd_);
  fd_ = -1;
  DPT_INPUT_CHECK(rc == 0, "cannot write " << what_ << " " << path_ << " (via " << temp_
                                           << "): " << errno_text());
  // The target may have become something else since the constructor looked (a FIFO planted in the
  // meantime): look again right before the rename.
  struct stat st {};
  DPT_INPUT_CHECK(resolve_output(path_, what_, &st) == target_,
                  what_ << " " << path_ << " changed while it was being written: not replacing it");
  DPT_INPUT_CHECK(
      ::rename(temp_.c_str(), target_.c_str()) == 0,
      "cannot rename " << temp_ << " to " << what_ << " " << target_ << ": " << errno_text());
  committed_ = true;
  // Persist the rename itself. Best effort: some file systems refuse fsync on directories, and
  // the file is complete either way.
  const int dfd = ::open(dir_of(target_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const std::string& path, std::string_view bytes, const std::string& what) {
  AtomicFile f(path, what);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

bool may_replace_by_rename(const std::string& path, const std::string& what) {
  struct stat st {
  }, dst{};
  const std::string target = resolve_output(path, what, &st);
  return ::stat(dir_of(target).c_str(), &dst) != 0 || !sticky_forbids_replacing(st, dst);
}

size_t in_place_rewrite_from(std::string_view current, std::string_view bytes) {
  const size_t same = static_cast<size_t>(
      std::mismatch(current.begin(), current.end(), bytes.begin(), bytes.end()).first -
      current.begin());
  // A trim (the records past the resume point are the file's last lines) is one cut; the newline
  // of a last record cut short is one append.
  if (same == bytes.size() || same == current.size()) return same;
  // Otherwise from the end of the last whole line the two share: what is written after the cut is
  // whole lines, so a write stopped half-way leaves a last line without its newline, which the
  // next trim reads as a record cut short, never old bytes after new ones.
  const size_t nl = bytes.substr(0, same).rfind('\n');
  return nl == std::string_view::npos ? 0 : nl + 1;
}

void rewrite_file_in_place(const std::string& path, std::string_view bytes,
                           const std::string& what) {
  // O_NONBLOCK and the fstat: whatever the name has become since it was checked, a FIFO or a
  // device is refused at once, never written or waited on. Read through the same descriptor, so
  // the bytes compared are those of the file that is cut.
  const int fd = ::open(path.c_str(), O_RDWR | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  DPT_INPUT_CHECK(fd >= 0, "cannot write " << what << " " << path << ": " << errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    DPT_INPUT_CHECK(false, what << " " << path << " is " << kind_of(st.st_mode)
                                << ", not a regular file: refusing to rewrite it");
  }
  // The cut first, fsynced, then the rest written after it: never a byte overwritten, so whatever
  // stops it (a kill, a full disk, a power cut) leaves the file as it was, or cut, or cut with
  // part of the rest after it (files.h says what each means).
  std::string current;
  bool ok = read_all(fd, &current);
  if (ok) {
    const size_t from = in_place_rewrite_from(current, bytes);
    if (from < current.size())
      ok = ::ftruncate(fd, static_cast<off_t>(from)) == 0 && ::fsync(fd) == 0;
    if (ok && from < bytes.size())
      ok = ::lseek(fd, static_cast<off_t>(from), SEEK_SET) == static_cast<off_t>(from) &&
           write_all(fd, bytes.data() + from, bytes.size() - from) && ::fsync(fd) == 0;
  }
  const std::string err = ok ? "" : errno_text();
  ok = ::close(fd) == 0 && ok;
  DPT_INPUT_CHECK(
      ok, "cannot write " << what << " " << path << ": " << (err.empty() ? errno_text() : err));
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {
  }, sb{};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0)
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  // One or both absent (an output not written yet): compare where they would be. A path that
  // cannot be resolved (a component that is not a directory) is compared as spelled.
  std::error_code ea, eb;
  const auto pa = std::filesystem::weakly_canonical(a, ea),
             pb = std::filesystem::weakly_canonical(b, eb);
  return ea || eb ? a == b : pa == pb;
}

std::string standard_stream_of(const std::string& path) {
  struct stat sp {};
  if (::stat(path.c_str(), &sp) != 0 || !S_ISREG(sp.st_mode)) return "";
  for (const int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    struct stat sf {};
    if (::fstat(fd, &sf) == 0 && sf.st_dev == sp.st_dev && sf.st_ino == sp.st_ino)
      return fd == STDOUT_FILENO ? "this run's standard output" : "this run's standard error";
  }
  // Under launch/mpirun.sh the ranks' streams are pipes to its relays, which copy them to the
  // launcher's own stdout and stderr: it names those files ("HOST DEV:INO DEV:INO", "-" for one
  // that is no regular file), valid on its host only.
  if (const char* e = std::getenv("DPT_LAUNCHER_STREAMS")) {
    std::istringstream in(e);
    std::string host, out, err;
    char name[256] = {};
    if (in >> host >> out >> err && ::gethostname(name, sizeof name - 1) == 0 && host == name) {
      const std::string id = std::to_string(sp.st_dev) + ":" + std::to_string(sp.st_ino);
      if (id == out) return "launch/mpirun.sh's standard output";
      if (id == err) return "launch/mpirun.sh's standard error";
    }
  }
  return "";
}

OutputLock check_output_path(const std::string& path, const std::string& flag, bool stream) {
  DPT_INPUT_CHECK(!path.empty(), flag << ": the path is empty");
  struct stat st {};
  // A planted link to a device is refused too, before the device is looked at.
  if (stream && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
    refuse_planted_link(path, flag, st);
  if (stream && ::stat(path.c_str(), &st) == 0 && S_ISCHR(st.st_mode)) {
    DPT_INPUT_CHECK(::access(path.c_str(), W_OK) == 0,
                    flag << " " << path << ": the device is not writable");
    return {};  // appended to, never replaced: /dev/null discards, /dev/full fails like a full disk
  }
  const std::string target = resolve_output(path, flag, &st);
  const std::string dir = dir_of(target);
  struct stat dst {};
  DPT_INPUT_CHECK(::stat(dir.c_str(), &dst) == 0 && S_ISDIR(dst.st_mode),
                  flag << " " << path << ": the directory " << dir << " does not exist");
  DPT_INPUT_CHECK(::access(dir.c_str(), W_OK) == 0,
                  flag << " " << path << ": the directory " << dir << " is not writable");
  // Another user's file (root's checkpoint, say) could often be replaced by the rename, but a file
  // one may not write is not replaced behind its owner's back; the message says what to do instead
  // (it said only "not writable", and a user resuming root's checkpoint was left guessing).
  DPT_INPUT_CHECK(st.st_mode == 0 || ::access(target.c_str(), W_OK) == 0,
                  flag << " " << path << ": the file exists and is not writable (owned by uid "
                       << st.st_uid << ", mode " << std::oct << (st.st_mode & 07777) << std::dec
                       << "): dptrain does not replace a file you may not write; choose another "
                       << "path"
                       << (flag == "--checkpoint-path"
                               ? " (--resume can still read this one: --resume " + path +
                                     " --checkpoint-path <yours> continues its training)"
                               : ""));
  // In a sticky directory another user's mode-666 file passed every check above, and the rename
  // that ends every write failed (EPERM) after the training (--save) or at the first checkpoint. A
  // stream (--metrics) is appended to in place, which works (and trimmed in place on a resume).
  DPT_INPUT_CHECK(stream || !sticky_forbids_replacing(st, dst),
                  flag << " " << path << ": the file exists and is owned by uid " << st.st_uid
                       << " in a sticky directory (" << dir << "), where only its owner can "
                       << "replace it (dptrain writes a new file and renames it over the old "
                       << "one): choose another path");
  check_temp_name_fits(target, flag);
  return OutputLock(path, flag);
}

void check_temp_name_fits(const std::string& path, const std::string& what) {
  const std::string temp = temp_stem(path) + std::string(kTempRandom, 'x');
  const std::string name = base_of(temp);
  const long limit = ::pathconf(dir_of(path).c_str(), _PC_NAME_MAX);
  const size_t name_max = limit > 0 ? static_cast<size_t>(limit) : NAME_MAX;
  // A name that fits only without the temporary's suffix passed every other check, and the
  // first write failed with ENAMETOOLONG: after the whole training for --save.
  DPT_INPUT_CHECK(name.size() <= name_max,
                  what << " " << path << ": the file name is too long for the temporary file "
                       << "it is written through (" << name.size()
                       << " bytes with '.tmp.<pid>.<random>'; the file system allows " << name_max
                       << "): use a name at least " << name.size() - name_max << " bytes shorter");
  DPT_INPUT_CHECK(temp.size() < PATH_MAX,
                  what << " " << path << ": the path is too long for the temporary file it is "
                       << "written through (" << temp.size() << " bytes with '.tmp.<pid>."
                       << "<random>'; a path has at most " << PATH_MAX - 1 << "): use a path "
                       << "at least " << temp.size() - (PATH_MAX - 1) << " bytes shorter");
}

std::string OutputLock::file_for(const std::string& path, const std::string& flag) {
  struct stat st {};
  return resolve_output(path, flag, &st) + ".lock";
}

OutputLock::OutputLock(const std::string& path, const std::string& flag) {
  const std::string lock = file_for(path, flag);
  for (int attempt = 0; fd_ < 0; ++attempt) {
    // Read-only where the file is another user's (a run of theirs that ended, or one that runs):
    // flock needs no write access, and O_CREAT on another user's file in a sticky directory is
    // refused under fs.protected_regular.
    int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC,
                    0644);
    if (fd < 0 && (errno == EACCES || errno == EPERM))
      fd = ::open(lock.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    DPT_INPUT_CHECK(fd >= 0, flag << " " << path << ": cannot open its lock file " << lock << ": "
                                  << (errno == ELOOP ? "it is a symlink, which is never followed"
                                                     : errno_text()));
    struct stat fst {};
    if (::fstat(fd, &fst) != 0 || !S_ISREG(fst.st_mode)) {
      const mode_t m = fst.st_mode;
      ::close(fd);
      DPT_INPUT_CHECK(false, flag << " " << path << ": its lock file " << lock << " is "
                                  << kind_of(m) << ", not a regular file");
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      char buf[512];
      const ssize_t n = ::pread(fd, buf, sizeof buf, 0);
      const std::string holder =
          n > 0 ? printable(std::string_view(buf, static_cast<size_t>(n))) : "";
      ::close(fd);
      DPT_INPUT_CHECK(err == EWOULDBLOCK, flag << " " << path << ": cannot lock " << lock << ": "
                                               << std::strerror(err));
      DPT_INPUT_CHECK(false,
                      flag << " " << path << " is in use by another run ("
                           << (holder.empty() ? std::string("it has not said which yet") : holder)
                           << "; lock file " << lock
                           << "): two runs writing one file corrupt it; let that run "
                           << "end, or give this one another " << flag);
    }
    struct stat now {};
    if (::lstat(lock.c_str(), &now) == 0 && now.st_dev == fst.st_dev && now.st_ino == fst.st_ino) {
      fd_ = fd;
    } else {
      ::close(fd);  // removed by the run that held it, between our open and our lock: again
      DPT_INPUT_CHECK(attempt < 100,
                      flag << " " << path << ": its lock file " << lock << " keeps being replaced");
    }
  }
  file_ = lock;
  path_dir_ = dir_of(path);
  // Who holds it, for the message of a run refused. A read-only (another user's) file keeps its
  // text.
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
  const std::string text =
      DPT_MSG("pid " << ::getpid() << " on host " << host << ", started " << when);
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, text.data(), text.size(), 0);
}

OutputLock& OutputLock::operator=(OutputLock&& o) noexcept {
  if (this != &o) {
    release();
    file_ = std::move(o.file_);
    path_dir_ = std::move(o.path_dir_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

OutputLock::~OutputLock() { release(); }

// Removed while still locked, and only while the name is still this inode: a run that opened it
// meanwhile finds its lock on a removed file and opens the name again (see the constructor).
void OutputLock::release() {
  if (fd_ < 0) return;
  struct stat mine {
  }, now{};
  if (::fstat(fd_, &mine) == 0 && ::lstat(file_.c_str(), &now) == 0 && mine.st_dev == now.st_dev &&
      mine.st_ino == now.st_ino)
    ::unlink(file_.c_str());
  ::close(fd_);
  fd_ = -1;
}

int open_input_file(const std::string& path, const std::string& what) {
  DPT_INPUT_CHECK(!path.empty(), what << ": the path is empty");
  // O_NONBLOCK: opening a FIFO with no writer returns at once (a blocking open would wait for a
  // writer forever, before any check or --timeout could act); a device is not read from either.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  DPT_INPUT_CHECK(fd >= 0, what << " " << path << ": cannot open for reading: " << errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const mode_t m = st.st_mode;
    ::close(fd);
    DPT_INPUT_CHECK(false, what << " " << path << " is " << kind_of(m) << ", not a regular file");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

void check_input_file(const std::string& path, const std::string& what) {
  ::close(open_input_file(path, what));
}

std::vector<std::string> remove_dead_temporaries(
    const std::vector<std::string>& paths,
    const std::function<bool(const std::string&)>& is_target) {
  std::vector<std::string> removed;
  for (const std::string& path : paths) {
    std::string target;
    pid_t pid = 0;
    if (!parse_atomic_temp(base_of(path), &target, &pid) || !is_target(target)) continue;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid())
      continue;
    if (pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // its writer runs
    std::error_code ec;
    if (std::filesystem::remove(path, ec)) removed.push_back(path);
  }
  return removed;
}

std::vector<std::string> OutputLock::remove_dead_temporaries(
    const std::function<bool(const std::string&)>& beside,
    const std::vector<std::string>& listed) const {
  if (file_.size() <= 5) return {};
  const std::string target = file_.substr(0, file_.size() - 5);  // less ".lock"
  const std::string name = base_of(target), dir = dir_of(target);
  const bool together = beside && same_file(path_dir_, dir);
  std::vector<std::string> removed;
  if (beside)
    removed = dpt::remove_dead_temporaries(
        listed, [&](const std::string& t) { return beside(t) || (together && t == name); });
  if (!together) {
    // The guarded file's directory, where the caller's listing is not of it.
    std::vector<std::string> paths;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
      paths.push_back(e.path().string());
    for (std::string& path :
         dpt::remove_dead_temporaries(paths, [&](const std::string& t) { return t == name; }))
      removed.push_back(std::move(path));
  }
  return removed;
}

bool parse_atomic_temp(const std::string& name, std::string* target_name, pid_t* pid) {
  // "<target>.tmp.<pid>" (older builds) or "<target>.tmp.<pid>.<random>".
  const size_t at = name.rfind(".tmp.");
  if (at == std::string::npos || at == 0) return false;
  const std::string rest = name.substr(at + 5);
  const size_t dot = rest.find('.');
  const std::string digits = rest.substr(0, dot);
  if (digits.empty() || digits.size() > 9 ||
      digits.find_first_not_of("0123456789") != std::string::npos)
    return false;
  if (dot != std::string::npos &&
      (dot + 1 >= rest.size() || rest.find('.', dot + 1) != std::string::npos))
    return false;
  *target_name = name.substr(0, at);
  *pid = static_cast<pid_t>(std::stol(digits));
  return true;
}

}  // namespace dpt
