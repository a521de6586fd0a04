// A user's files: read whole as untrusted input (configs, token files, text to tokenize), and
// written so that a failure (a full disk) is an error naming the file and leaves nothing partial.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "zerort/runtime/status.h"

namespace zerort {

// A data file, read whole: it must be a regular file (a FIFO, device such as /dev/zero or a
// directory is refused at once, never read) of at most `limit` bytes.
StatusOr<std::string> ReadDataFile(const std::string& path, int64_t limit);

// The whole content of `fd` (a regular file the caller opened and checked), or an error naming
// `path` when it is larger than `limit` bytes. Closes `fd`.
StatusOr<std::string> ReadRegularFd(int fd, const std::string& path, int64_t limit);

// Writes all of `bytes` to `fd`, retrying short writes and EINTR; a failure (a write of 0 bytes
// is a full disk) is ErrnoError(`what`, errno).
Status WriteAll(int fd, std::string_view bytes, std::string_view what);

// InvalidArgument naming `what` when `path` exists and is not a regular file: an output of
// zerort's replaces a file, never a directory, FIFO or device.
Status CheckOutputPath(const std::string& path, std::string_view what);

// [Note: outputs the user named]
// A command's output file or directory that already holds something is not replaced unless the
// command was given --overwrite (`overwrite`): `zerort data corpus config.json`, an argument
// order slipped, or `checkpoint export` into the directory a model was imported from, would
// otherwise destroy what was saved there without a word. (`zerort plot -o` replaces its image: a
// plot is redrawn as a run goes on.)
// OK when `path` does not exist, or when it is a regular file and `overwrite`; else
// InvalidArgument naming `what`, the path and the flag (CheckOutputPath's message where `path` is
// not a regular file: that is never replaced).
Status CheckReplaceable(const std::string& path, bool overwrite, std::string_view what);
// OK when `dir` does not exist, is an empty directory, or is a directory and `overwrite`; else
// InvalidArgument naming `what`, the directory and the flag.
Status CheckOutputDirectory(const std::string& dir, bool overwrite, std::string_view what);

// [Note: a file written beside its target]
// An output of zerort's is written to a new file in the target's directory and renamed over the
// target at the end, so a reader never sees half a file and a failure (a full disk, a kill)
// leaves the target as it was. That file is the target's name followed by
// ".zerort-<8 hex digits>.tmp", created exclusively (O_EXCL, a new random name on a clash): a
// file of the user's beside the target (OUT.tmp, say) is never opened, truncated or removed, and
// two writers of one target never share a file. Only a kill leaves one behind (its name says
// whose it is); every failure zerort sees removes it.

// A replacement of `path` being written ([Note: a file written beside its target]). Not
// committed when destroyed: closed and removed, the target untouched.
class FileReplacement {
 public:
  // CheckOutputPath(`path`, `what`), then the new file (mode 0644 less the umask).
  static StatusOr<FileReplacement> Begin(const std::string& path, std::string_view what);
  FileReplacement(FileReplacement&& other) noexcept;
  FileReplacement& operator=(FileReplacement&& other) noexcept;
  FileReplacement(const FileReplacement&) = delete;
  FileReplacement& operator=(const FileReplacement&) = delete;
  ~FileReplacement();

  int fd() const { return fd_; }
  // The file written, named in every error about it.
  const std::string& temp_path() const { return temp_; }
  // Appends `bytes` (WriteAll; the error names `what` and the file).
  Status Write(std::string_view bytes);
  // The data made durable (fsync), the file closed and renamed over the target; each step
  // checked. On failure the file is removed.
  Status Commit();

 private:
  FileReplacement(std::string target, std::string temp, std::string what, int fd);
  void Discard();
  std::string target_, temp_, what_;
  int fd_ = -1;
};

// Writes `text` to `path` through a FileReplacement: every write, the fsync and the close
// checked, then a rename; on any failure nothing is left and the error names `what` (the config
// key or command) and the file.
Status WriteFileAtomically(const std::string& path, std::string_view text, std::string_view what);

}  // namespace zerort
