// Files that cannot be turned against the operator: the one atomic writer every output goes
// through (checkpoints, --save, --report, --trace, the metrics trimming; another user's --metrics
// in a sticky directory is trimmed in place) and the checks that keep a FIFO, a device or a
// planted symlink from hanging a run or being written through, and the lock that keeps two runs
// from writing one output.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dpt {

// Writes `path` as a whole or not at all. The temporary file is created beside the target with
// O_CREAT|O_EXCL|O_NOFOLLOW under an unpredictable name ("<name>.tmp.<pid>.<random>", so a planted
// symlink or file makes creation fail rather than be written through), at the mode of the file it
// replaces (or 0666 less the umask for a new one); commit() fsyncs it, renames it over the target
// and fsyncs the directory. A target that is a symlink is followed only to a regular file (the
// link stays, the file it names is replaced), and then only when it cannot have been planted by
// another user: in a directory others can write, a link owned by neither the euid nor the
// directory's owner is refused (the kernel's fs.protected_symlinks rule); any other existing
// non-regular target (device, FIFO,
// socket, directory) is refused. Every failure is an input error naming `what` (a flag such as
// "--report", or "checkpoint") and the path. Destroyed without commit(): the temporary is removed.
class AtomicFile {
 public:
  AtomicFile(const std::string& path, const std::string& what);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void commit();
  const std::string& target() const {
    return target_;
  }  // the regular file replaced (symlinks resolved)

 private:
  std::string path_, what_, target_, temp_;
  int fd_ = -1;
  bool committed_ = false;
};

// AtomicFile in one call.
void write_file_atomic(const std::string& path, std::string_view bytes, const std::string& what);

// Whether this user may replace the file `path` names (a symlink: the file it leads to, as
// AtomicFile resolves it; an absent file: yes) by renaming another over it: not another user's
// file in a sticky directory that is not this user's either, however writable the file is (only
// its owner, the directory's owner and root may). Input error naming `what` where AtomicFile
// would refuse the path anyway.
bool may_replace_by_rename(const std::string& path, const std::string& what);
// Makes the existing regular file `path` hold `bytes`, in place (the same inode, owner and mode):
// for a file this user may write but not replace (may_replace_by_rename), at the cost of
// AtomicFile's all or nothing. No byte is overwritten: the file is cut at
// in_place_rewrite_from(its bytes, `bytes`) and fsynced, then the rest of `bytes` is written after
// the cut and fsynced. For the --metrics trim, where `bytes` are the file's lines less those past
// the resume point, stopped anywhere (a kill, a full disk, a power cut) it leaves:
//  - the usual trim, dropped records that were the file's last lines: one ftruncate, so the file
//    as it was (the next resume trims it again) or trimmed;
//  - the newline of a last record cut short: that newline, or not yet;
//  - a line kept after a dropped one (a note added by hand, records out of order): the file as it
//    was; or only its lines up to the first dropped one, those kept after it missing; or those
//    and part of the rest, the last line without its newline, which the next resume drops as a
//    record cut short (or ends with its newline where it parses).
// Never old bytes after new ones: every whole line it holds is one of the file's own. A FIFO,
// device or directory is refused at once; every failure is an input error naming `what` and the
// path.
void rewrite_file_in_place(const std::string& path, std::string_view bytes,
                           const std::string& what);
// Where rewrite_file_in_place cuts a file holding `current` to make it `bytes`: their common
// prefix's length where one is a prefix of the other, else the end of the last whole line
// (newline) they share (0: none).
size_t in_place_rewrite_from(std::string_view current, std::string_view bytes);

// A run's claim on one output file, held from the pre-flight to the end of the run, so that a
// second run given the same --metrics, --report, --trace or --checkpoint-path is refused instead
// of truncating what the first is writing. It is a flock(2) on "<file>.lock" beside the file (the
// file a symlink names): not on the file itself, which AtomicFile replaces by a rename (a lock on
// the old inode would not be seen by a run that opens the new one). The kernel drops the lock with
// its process, so a run killed with SIGKILL leaves at most an unlocked file, which refuses nothing
// and is taken over by the next run. The lock file is opened with O_NOFOLLOW (a symlink planted in
// a shared directory is refused, never followed); after locking, the name must still be the inode
// locked, else a run that ended has just removed it and the lock is taken again. The holder writes
// "pid P on host H, started T" into it; a refused run quotes that (printable()). Removed at
// release.
class OutputLock {
 public:
  OutputLock() = default;
  // Locks the output `path` (which check_output_path accepted); input error naming `flag`, the
  // path, the holder and the lock file when another run holds it.
  OutputLock(const std::string& path, const std::string& flag);
  ~OutputLock();
  OutputLock(OutputLock&& o) noexcept
      : file_(std::move(o.file_)), path_dir_(std::move(o.path_dir_)), fd_(o.fd_) {
    o.fd_ = -1;
  }
  OutputLock& operator=(OutputLock&& o) noexcept;
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;
  const std::string& file() const { return file_; }  // the lock file ("" when none is held)
  // remove_dead_temporaries of the file this lock guards (none when no lock is held) and, when
  // `beside` is given, of the names it accepts beside the path the lock was taken for
  // (--checkpoint-path's step-named files), taken from `listed`: the paths in that path's
  // directory as the caller listed them (the checkpoint survey's temporaries), not listed again.
  // The guarded file's directory is listed here only where `listed` is not of it (no `beside`; a
  // symlink's file elsewhere). Each file is removed and returned once.
  std::vector<std::string> remove_dead_temporaries(
      const std::function<bool(const std::string&)>& beside = nullptr,
      const std::vector<std::string>& listed = {}) const;
  // The lock file of the output `path`: "<file>.lock" beside the file it is (symlinks resolved).
  static std::string file_for(const std::string& path, const std::string& flag);

 private:
  void release();
  std::string file_;
  std::string path_dir_;  // the directory of the path locked, as given (symlinks not resolved)
  int fd_ = -1;
};

// Input error when `path` is a symbolic link another user could have planted (AtomicFile's rule):
// for names an output will take later in a run (checkpoints named by their step), checked at its
// start.
void refuse_planted_link(const std::string& path, const std::string& what);

// Pre-flight for an output: `path` is absent or a regular file (a symlink only to one, and not
// another user's planted one: see AtomicFile), it is writable (and, in a sticky directory, this
// user's to replace), its directory exists and is writable, and the temporary file it is written
// through fits the file system's limits (check_temp_name_fits). Input error naming `flag`
// otherwise. A `stream` (--metrics: appended to, not replaced) may also be a writable character
// device, and may be another user's file in a sticky directory.
// Returns the output's lock (OutputLock; none for a device, which no run can corrupt for another).
OutputLock check_output_path(const std::string& path, const std::string& flag, bool stream = false);

// Input error naming `what` when the temporary file AtomicFile writes beside `path`
// ("<name>.tmp.<pid>.<random>") would exceed the file system's name length (NAME_MAX) or PATH_MAX:
// checked before the first step, for every output and for the last step-named checkpoint.
void check_temp_name_fits(const std::string& path, const std::string& what);

// Opens an input for reading without ever blocking on it: O_NONBLOCK (a FIFO with no writer opens
// at once instead of waiting forever), then fstat must show a regular file, then blocking mode is
// restored. Returns the descriptor (the caller closes it). A FIFO, device, socket or directory, a
// missing or unreadable file: input error naming `what` and the path, within milliseconds.
int open_input_file(const std::string& path, const std::string& what);
// The same check without keeping the file open.
void check_input_file(const std::string& path, const std::string& what);

// Whether `a` and `b` name one file: the same device and inode when both exist (so a symlink, a
// hard link or a bind mount is caught), else the same absolute path once symlinks, "." and ".."
// are resolved (std::filesystem::weakly_canonical); neither needs to exist. Two outputs naming one
// file, or an output naming an input, are refused with it.
bool same_file(const std::string& a, const std::string& b);

// "this run's standard output" (or error) when `path` is the regular file this process's stdout
// or stderr is written to (`--metrics /dev/stdout > run.log`, `--report run.log 2> run.log`), or
// "launch/mpirun.sh's standard output" (or error) when it is the file the launcher's is (the ranks'
// are pipes to it; DPT_LAUNCHER_STREAMS names its files), else "". A character device (a terminal,
// /dev/null) or a pipe is never named here.
std::string standard_stream_of(const std::string& path);

// Removes, of the directory entries at `paths` (a listing), the temporaries that AtomicFile writers
// left when they were killed before commit() (SIGKILL, the OOM killer, a power cut; a writer that
// unwinds removes its own): regular files of this user (a symlink is never followed), named for a
// target whose file name `is_target` accepts, whose writer (the pid in the name) no longer runs on
// this host. Returns their paths, for the caller's log. Call it only while the run holds its
// outputs' locks (OutputLock): a live writer on another host sharing the directory holds the same
// lock, so its pid, unknown here, is never taken for a dead one.
std::vector<std::string> remove_dead_temporaries(
    const std::vector<std::string>& paths,
    const std::function<bool(const std::string&)>& is_target);

// Whether `name` (a file name, no directory) is one of AtomicFile's temporaries
// ("<target>.tmp.<pid>" with or without ".<random>"); if so, the target's file name and the pid of
// its writer.
bool parse_atomic_temp(const std::string& name, std::string* target_name, pid_t* pid);

}  // namespace dpt
