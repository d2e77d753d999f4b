// Small POSIX file helpers shared by the stores: atomic, durable replacement and
// create-if-absent. All throw IoError naming the path and the system error.
#pragma once

#include <optional>
#include <string>

namespace lmr::files {

std::string errnoText(const std::string& what, const std::string& path);
std::string directoryOf(const std::string& path);

// Writes `text` to `fd` completely (retrying short writes and EINTR).
void writeAll(int fd, const std::string& text, const std::string& path);

// Replaces `path` by `text` atomically (temp file, fsync, rename, fsync of the directory):
// readers see the old or the new file, never a partial one.
void replaceFile(const std::string& path, const std::string& text);

// Creates `path` with `text` only when it does not exist, atomically (temp file, link(2)):
// true when this call created it, false when it already existed.
bool createFile(const std::string& path, const std::string& text);

// Removes the temporary files replaceFile(`path`) left behind when a writer was killed
// between creating and renaming them (their writer process no longer exists). Best effort:
// never throws.
void removeStaleTemporaries(const std::string& path) noexcept;

// The whole file, or nullopt when it does not exist.
std::optional<std::string> readFile(const std::string& path);

// mkdir -p; IoError when a component cannot be created or is not a directory.
void makeDirectories(const std::string& path);

}  // namespace lmr::files
