#include "lmr/oob/store.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "lmr/common/error.h"
#include "lmr/common/files.h"
#include "lmr/common/hex.h"
#include "lmr/common/log.h"
#include "lmr/oob/wire.h"

namespace lmr::oob {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kLastPoll = std::chrono::milliseconds(80);

std::string sysError(const std::string& what) { return what + ": " + std::strerror(errno); }

// Reads or writes exactly n bytes; false on EOF, timeout or error.
bool readExact(int fd, void* data, std::size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

bool writeExact(int fd, const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t r = ::send(fd, p, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

// Reads a big-endian u32 length (at most `limit`) and appends it and `extra` more bytes
// than it says to `frame`; false on EOF, timeout, error or a length over the limit.
bool readPart(int fd, std::size_t limit, std::size_t extra, std::string* frame) {
  unsigned char n[4];
  if (!readExact(fd, n, 4)) return false;
  const std::size_t len = (std::size_t{n[0]} << 24) | (std::size_t{n[1]} << 16) | (std::size_t{n[2]} << 8) | n[3];
  if (len > limit) return false;
  const std::size_t at = frame->size();
  frame->append(reinterpret_cast<const char*>(n), 4);
  frame->resize(at + 4 + len + extra);
  return readExact(fd, frame->data() + at + 4, len + extra);
}

void setTimeouts(int fd, std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

}  // namespace

bool Backoff::pause() {
  const auto left = deadline_ - Clock::now();
  if (left <= Clock::duration::zero()) return false;
  std::this_thread::sleep_for(std::min<Clock::duration>(period_, left));
  period_ = std::min(period_ * 2, kLastPoll);
  return true;
}

std::string Store::get(const std::string& key, Clock::time_point deadline) {
  for (Backoff wait(deadline);;) {
    if (auto v = tryGet(key)) return *v;
    if (!wait.pause()) throw TimeoutError("rendezvous key \"" + key + "\" did not appear in time");
  }
}

std::vector<bool> Store::waitAll(const std::vector<std::string>& keys, Clock::time_point deadline,
                                 const std::string& until) {
  std::vector<bool> have(keys.size(), false);
  for (Backoff wait(deadline);;) {
    if (!until.empty() && tryGet(until)) return have;
    bool all = true;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (!have[i]) have[i] = tryGet(keys[i]).has_value();
      all = all && have[i];
    }
    if (all || !wait.pause()) return have;
  }
}

void setChunked(Store& store, const std::string& key, const std::string& value) {
  constexpr std::size_t kChunk = kMaxStoreValue / 2;
  std::size_t chunks = 0;
  for (std::size_t at = 0; at < value.size() || chunks == 0; at += kChunk, ++chunks)
    store.set(key + "/" + std::to_string(chunks), value.substr(at, kChunk));
  store.set(key, std::to_string(chunks));
}

std::optional<std::string> tryGetChunked(Store& store, const std::string& key, Clock::time_point deadline) {
  const std::optional<std::string> count = store.tryGet(key);
  if (!count) return std::nullopt;
  const std::int64_t chunks = parseRound(*count);  // a positive count, parsed strictly
  std::string value;
  for (std::int64_t c = 0; c < chunks; ++c) value += store.get(key + "/" + std::to_string(c), deadline);
  return value;
}

// ---- FileStore ----------------------------------------------------------------------------

FileStore::FileStore(std::string directory) : directory_(std::move(directory)) {
  files::makeDirectories(directory_);
  ::chmod(directory_.c_str(), 0700);  // the job's user only: the files are not authenticated
}

std::string FileStore::path(const std::string& key) const {
  // Keys may hold '/' and other characters a file name cannot: name files by the key's hex.
  return directory_ + "/" + toHex(key);
}

void FileStore::set(const std::string& key, const std::string& value) { files::replaceFile(path(key), value); }

std::optional<std::string> FileStore::tryGet(const std::string& key) { return files::readFile(path(key)); }

bool FileStore::claim(const std::string& key, const std::string& value) { return files::createFile(path(key), value); }

void FileStore::erase(const std::string& key) {
  if (::unlink(path(key).c_str()) != 0 && errno != ENOENT) throw IoError(sysError("cannot remove " + path(key)));
}

void FileStore::removeAll() noexcept {
  if (DIR* d = ::opendir(directory_.c_str()); d != nullptr) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") ::unlink((directory_ + "/" + name).c_str());
    }
    ::closedir(d);
  }
  ::rmdir(directory_.c_str());
}

// ---- TcpStoreServer -----------------------------------------------------------------------

TcpStoreServer::TcpStoreServer(int port, const std::string& bind_address, std::string token)
    : token_(std::move(token)) {
  if (token_.empty()) throw InvalidArgument("the rendezvous store needs the job's token");
  if (port < 0 || port > 65535) throw InvalidArgument("a TCP port is 0..65535, got " + std::to_string(port));
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw IoError(sysError("cannot create the rendezvous socket"));
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, bind_address.c_str(), &addr.sin_addr) != 1) {
    ::close(listen_fd_);
    throw InvalidArgument("the rendezvous bind address must be an IPv4 address, got \"" + bind_address + "\"");
  }
  // Every daemon of a stalled group connects at about the same moment: a short queue drops
  // their SYNs and each costs a one-second retransmit (128 did at 256 daemons). The kernel
  // caps the length at net.core.somaxconn.
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(listen_fd_, 65535) != 0) {
    const std::string message = sysError("cannot listen on " + bind_address + ":" + std::to_string(port));
    ::close(listen_fd_);
    throw IoError(message);
  }
  socklen_t len = sizeof(addr);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  if (::pipe2(wake_, O_CLOEXEC) != 0) {
    ::close(listen_fd_);
    throw IoError(sysError("cannot create a pipe"));
  }
  thread_ = std::thread([this] { serve(); });
}

TcpStoreServer::~TcpStoreServer() {
  const char byte = 0;
  [[maybe_unused]] const ssize_t n = ::write(wake_[1], &byte, 1);
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

void TcpStoreServer::serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    setTimeouts(fd, std::chrono::milliseconds(2000));
    answer(fd);
    ::close(fd);
  }
}

void TcpStoreServer::answer(int fd) {
  // One request per connection; a malformed, unauthenticated or slow client just loses its
  // connection, before anything it sent is applied.
  std::string frame(1, '\0');
  if (!readExact(fd, frame.data(), 1) || !readPart(fd, kMaxStoreKey, 0, &frame) ||
      !readPart(fd, kMaxStoreValue, 32, &frame)) {
    refuse("a truncated or oversized request");
    return;
  }
  StoreRequest request;
  try {
    request = decodeRequest(token_, frame);
  } catch (const Error& e) {
    refuse(e.what());
    return;
  }
  requests_.fetch_add(1);
  const auto [status, reply] = state_.apply(request);
  if (status == kStatusFull) refuse("the store is full (key \"" + request.key + "\" refused)");
  const std::string out = encodeReply(token_, request.tag, status, reply);
  writeExact(fd, out.data(), out.size());
}

void TcpStoreServer::refuse(const std::string& why) {
  const std::uint64_t n = refused_.fetch_add(1) + 1;
  if (n <= 10 || n % 1000 == 0) LMR_LOG(kWarn, "oob.store", "dropped a rendezvous request (", n, " so far): ", why);
}

// ---- TcpStore -----------------------------------------------------------------------------

TcpStore::TcpStore(TcpStoreOptions options) : options_(std::move(options)) {
  if (options_.port <= 0 || options_.port > 65535)
    throw InvalidArgument("the rendezvous port must be 1..65535, got " + std::to_string(options_.port));
  if (options_.host.empty()) throw InvalidArgument("the rendezvous host is empty");
  if (options_.token.empty()) throw InvalidArgument("the rendezvous store needs the job's token");
}

std::pair<bool, std::string> TcpStore::call(std::uint8_t op, const std::string& key, const std::string& value) {
  const std::string request = encodeRequest(options_.token, op, key, value);  // checks the key and size
  Tag request_tag;
  std::memcpy(request_tag.data(), request.data() + request.size() - 32, 32);
  const std::string where = options_.host + ":" + std::to_string(options_.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(options_.host.c_str(), std::to_string(options_.port).c_str(), &hints, &found);
      rc != 0) {
    throw IoError("cannot resolve the rendezvous host " + where + ": " + ::gai_strerror(rc));
  }
  const auto give_up = Clock::now() + options_.connect_timeout;
  int fd = -1;
  for (;;) {
    for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
      fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      setTimeouts(fd, options_.io_timeout);
      if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        ::close(fd);
        fd = -1;
      }
    }
    if (fd >= 0 || Clock::now() >= give_up) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::freeaddrinfo(found);
  if (fd < 0) throw IoError(sysError("cannot reach the rendezvous store at " + where));
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::string reply(1, '\0');
  const bool ok = writeExact(fd, request.data(), request.size()) && readExact(fd, reply.data(), 1) &&
                  readPart(fd, kMaxStoreValue, 32, &reply);
  ::close(fd);
  if (!ok) throw IoError("the rendezvous store at " + where + " did not answer (a wrong token is refused)");
  auto [status, answer] = decodeReply(options_.token, request_tag, reply);
  if (status == kStatusFull)
    throw IoError("the rendezvous store at " + where + " is full: key \"" + key + "\" refused");
  return {status == kStatusYes, std::move(answer)};
}

void TcpStore::set(const std::string& key, const std::string& value) { call(kStoreSet, key, value); }

std::optional<std::string> TcpStore::tryGet(const std::string& key) {
  auto [found, value] = call(kStoreGet, key, {});
  if (!found) return std::nullopt;
  return value;
}

bool TcpStore::claim(const std::string& key, const std::string& value) { return call(kStoreClaim, key, value).first; }

}  // namespace lmr::oob
