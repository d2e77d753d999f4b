// Error hierarchy of liblmr. Every failure the library reports is one of these types,
// thrown with the source location that raised it. The Python bindings map each type to
// one Python exception class (see python/bindings/errors.cc).
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace lmr {

// Where an error was raised. (SourceLocation is not usable with every compiler this
// builds with, e.g. clang 14 on libstdc++ 12; the builtins below are.)
struct SourceLocation {
  const char* file = "";
  unsigned line = 0;
  static constexpr SourceLocation current(const char* file = __builtin_FILE(),
                                          unsigned line = __builtin_LINE()) noexcept {
    return SourceLocation{file, line};
  }
  const char* file_name() const noexcept { return file; }
};

enum class ErrorKind { kInvalidArgument, kIo, kTimeout, kPeerFailure, kUnsupported };

// Base of all liblmr errors. what() is "message (file:line)".
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string_view message, SourceLocation where);
  ErrorKind kind() const noexcept { return kind_; }
  // The message without the source location.
  const std::string& message() const noexcept { return message_; }
  const char* file() const noexcept { return file_; }
  unsigned line() const noexcept { return line_; }

 private:
  ErrorKind kind_;
  std::string message_;
  const char* file_;
  unsigned line_;
};

// A caller passed something malformed: bad shape, bad manifest field, bad option.
class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(std::string_view m, SourceLocation w = SourceLocation::current())
      : Error(ErrorKind::kInvalidArgument, m, w) {}
};

// A file, shared-memory segment or device transfer failed.
class IoError : public Error {
 public:
  explicit IoError(std::string_view m, SourceLocation w = SourceLocation::current()) : Error(ErrorKind::kIo, m, w) {}
};

// A bounded wait expired.
class TimeoutError : public Error {
 public:
  explicit TimeoutError(std::string_view m, SourceLocation w = SourceLocation::current())
      : Error(ErrorKind::kTimeout, m, w) {}
};

// A peer rank or daemon failed or broke the protocol.
class PeerFailure : public Error {
 public:
  explicit PeerFailure(std::string_view m, SourceLocation w = SourceLocation::current())
      : Error(ErrorKind::kPeerFailure, m, w) {}
};

// The request is valid but this build or this machine cannot serve it (no CUDA, no NVML).
class Unsupported : public Error {
 public:
  explicit Unsupported(std::string_view m, SourceLocation w = SourceLocation::current())
      : Error(ErrorKind::kUnsupported, m, w) {}
};

// Name of the kind, e.g. "InvalidArgument".
std::string_view errorKindName(ErrorKind kind) noexcept;

// Throws the error type that matches `kind`; used where the kind is data (tests, CLI).
[[noreturn]] void throwError(ErrorKind kind, std::string_view message,
                             SourceLocation where = SourceLocation::current());

}  // namespace lmr
