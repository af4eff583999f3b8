// Files that cannot be turned against the operator: the one atomic writer every output goes
// through (checkpoints, --save, --report, --trace, the metrics trimming) and the checks that keep
// a FIFO, a device or a planted symlink from hanging a run or being written through.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <string_view>

namespace dpt {

// Writes `path` as a whole or not at all. The temporary file is created beside the target with
// O_CREAT|O_EXCL|O_NOFOLLOW under an unpredictable name ("<name>.tmp.<pid>.<random>", so a planted
// symlink or file makes creation fail rather than be written through), at the mode of the file it
// replaces (or 0666 less the umask for a new one); commit() fsyncs it, renames it over the target
// and fsyncs the directory. A target that is a symlink is followed only to a regular file (the
// link stays, the file it names is replaced); any other existing non-regular target (device, FIFO,
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
  const std::string& target() const { return target_; }  // the regular file replaced (symlinks resolved)

 private:
  std::string path_, what_, target_, temp_;
  int fd_ = -1;
  bool committed_ = false;
};

// AtomicFile in one call.
void write_file_atomic(const std::string& path, std::string_view bytes, const std::string& what);

// Pre-flight for an output: `path` is absent or a regular file (a symlink only to one), it is
// writable, and its directory exists and is writable. Input error naming `flag` otherwise. A
// `stream` (--metrics: appended to, not replaced) may also be a writable character device.
void check_output_path(const std::string& path, const std::string& flag, bool stream = false);

// Opens an input for reading without ever blocking on it: O_NONBLOCK (a FIFO with no writer opens
// at once instead of waiting forever), then fstat must show a regular file, then blocking mode is
// restored. Returns the descriptor (the caller closes it). A FIFO, device, socket or directory, a
// missing or unreadable file: input error naming `what` and the path, within milliseconds.
int open_input_file(const std::string& path, const std::string& what);
// The same check without keeping the file open.
void check_input_file(const std::string& path, const std::string& what);

// Whether `name` (a file name, no directory) is one of AtomicFile's temporaries ("<target>.tmp.<pid>"
// with or without ".<random>"); if so, the target's file name and the pid of its writer.
bool parse_atomic_temp(const std::string& name, std::string* target_name, pid_t* pid);

}  // namespace dpt
