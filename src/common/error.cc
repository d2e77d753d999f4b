#include "lmr/common/error.h"

#include <string>

namespace lmr {
namespace {

std::string withLocation(std::string_view message, const SourceLocation& where) {
  std::string text(message);
  std::string_view file = where.file_name();
  if (auto slash = file.find_last_of('/'); slash != std::string_view::npos) file.remove_prefix(slash + 1);
  text += " (";
  text += file;
  text += ':';
  text += std::to_string(where.line);
  text += ')';
  return text;
}

}  // namespace

Error::Error(ErrorKind kind, std::string_view message, SourceLocation where)
    : std::runtime_error(withLocation(message, where)),
      kind_(kind),
      message_(message),
      file_(where.file_name()),
      line_(where.line) {}

std::string_view errorKindName(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "InvalidArgument";
    case ErrorKind::kIo: return "IoError";
    case ErrorKind::kTimeout: return "TimeoutError";
    case ErrorKind::kPeerFailure: return "PeerFailure";
    case ErrorKind::kUnsupported: return "Unsupported";
  }
  return "Error";
}

void throwError(ErrorKind kind, std::string_view message, SourceLocation where) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: throw InvalidArgument(message, where);
    case ErrorKind::kIo: throw IoError(message, where);
    case ErrorKind::kTimeout: throw TimeoutError(message, where);
    case ErrorKind::kPeerFailure: throw PeerFailure(message, where);
    case ErrorKind::kUnsupported: throw Unsupported(message, where);
  }
  throw Error(kind, message, where);
}

}  // namespace lmr
