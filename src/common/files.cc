#include "lmr/common/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "lmr/common/error.h"

namespace lmr::files {
namespace {

void fsyncPath(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) throw IoError(errnoText("cannot open", path));
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  if (rc != 0) throw IoError(errnoText("cannot fsync", path));
}

// Writes a durable temporary file next to `path` and returns its name.
std::string writeTemp(const std::string& path, const std::string& text) {
  static std::atomic<unsigned> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(errnoText("cannot create", tmp));
  try {
    writeAll(fd, text, tmp);
    if (::fsync(fd) != 0) throw IoError(errnoText("cannot fsync", tmp));
    if (::close(fd) != 0) throw IoError(errnoText("cannot close", tmp));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  return tmp;
}

}  // namespace

void removeStaleTemporaries(const std::string& path) noexcept {
  const std::string dir = directoryOf(path);
  const std::string base = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  const std::string prefix = base + ".tmp.";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    if (pid <= 0 || pid == ::getpid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) ::unlink((dir + "/" + name).c_str());
  }
  ::closedir(d);
}

std::string errnoText(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

std::string directoryOf(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

void writeAll(int fd, const std::string& text, const std::string& path) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError(errnoText("cannot write", path));
    }
    done += static_cast<std::size_t>(n);
  }
}

void replaceFile(const std::string& path, const std::string& text) {
  const std::string tmp = writeTemp(path, text);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string message = errnoText("cannot rename " + tmp + " to", path);
    ::unlink(tmp.c_str());
    throw IoError(message);
  }
  fsyncPath(directoryOf(path), O_RDONLY | O_DIRECTORY);
}

bool createFile(const std::string& path, const std::string& text) {
  const std::string tmp = writeTemp(path, text);
  const int rc = ::link(tmp.c_str(), path.c_str());
  const int saved = errno;
  ::unlink(tmp.c_str());
  if (rc != 0) {
    if (saved == EEXIST) return false;
    errno = saved;
    throw IoError(errnoText("cannot create", path));
  }
  fsyncPath(directoryOf(path), O_RDONLY | O_DIRECTORY);
  return true;
}

std::optional<std::string> readFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw IoError(errnoText("cannot open", path));
  }
  std::string out;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string message = errnoText("cannot read", path);
      ::close(fd);
      throw IoError(message);
    }
    if (n == 0) break;
    out.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

void makeDirectories(const std::string& path) {
  if (path.empty()) throw IoError("an empty directory path");
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    const std::string part = path.substr(0, pos);
    if (part.empty()) continue;
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) throw IoError(errnoText("cannot create directory", part));
  }
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) throw IoError(path + " is not a directory");
}

}  // namespace lmr::files
