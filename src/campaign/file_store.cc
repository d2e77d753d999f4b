// JsonFileStateStore: flock-serialised compare-and-swap with write-temp, fsync, rename,
// fsync-directory durability.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "lmr/campaign/journal.h"
#include "lmr/common/error.h"
#include "lmr/common/files.h"

namespace lmr::campaign {
namespace {

using files::directoryOf;
using files::errnoText;
using files::replaceFile;

// Holds flock(2) on "<journal>.lock" for its lifetime.
class FileLock {
 public:
  FileLock(const std::string& journal_path, int operation) : path_(journal_path + ".lock") {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw IoError(errnoText("cannot open lock file", path_));
    while (::flock(fd_, operation) != 0) {
      if (errno != EINTR) {
        const std::string message = errnoText("cannot lock", path_);
        ::close(fd_);
        throw IoError(message);
      }
    }
  }
  ~FileLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace

JsonFileStateStore::JsonFileStateStore(std::string path) : path_(std::move(path)) {
  if (path_.empty()) throw InvalidArgument("JsonFileStateStore needs a file path");
  struct stat st{};
  const std::string dir = directoryOf(path_);
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw IoError("the directory of the journal " + path_ + " does not exist");
  }
}

std::optional<Journal> JsonFileStateStore::readUnlocked() const {
  const std::optional<std::string> text = files::readFile(path_);
  if (!text) return std::nullopt;
  return Journal::parse(*text, path_);
}

std::optional<Journal> JsonFileStateStore::load() {
  FileLock lock(path_, LOCK_SH);
  return readUnlocked();
}

bool JsonFileStateStore::compareAndSwap(const std::optional<Journal>& expected, const Journal& updated) {
  checkJournalSwap(expected, updated);
  const std::string text = updated.dump() + "\n";
  FileLock lock(path_, LOCK_EX);
  if (readUnlocked() != expected) return false;
  replaceFile(path_, text);
  return true;
}

}  // namespace lmr::campaign
