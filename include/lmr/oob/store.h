// Rendezvous stores for the lmr-oobd daemons: a small key-value interface with
// create-if-absent, backed by a directory (FileStore) or a TCP server hosted by the rank-0
// daemon (TcpStoreServer / TcpStore).
//
// The daemons use a store only at set-up and during a stall; a client holds no connection
// between calls, so a healthy run makes no store traffic. All calls block for at most the
// client's I/O timeout (or the deadline given); they throw IoError when the store cannot be
// reached and TimeoutError when a key does not appear in time. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "lmr/oob/wire.h"

namespace lmr::oob {

// How a waiter polls: first after 5 ms, then twice as long each time up to 80 ms, never
// past its deadline, so a few hundred daemons waiting on one key (a host's daemons on
// their leader's report) do not saturate the one store thread their leaders need.
class Backoff {
 public:
  explicit Backoff(std::chrono::steady_clock::time_point deadline) : deadline_(deadline) {}
  // Sleeps one period (less when the deadline is nearer); false once the deadline passed.
  bool pause();

 private:
  std::chrono::steady_clock::time_point deadline_;
  std::chrono::milliseconds period_{5};
};

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  virtual std::optional<std::string> tryGet(const std::string& key) = 0;
  // Sets `key` only when absent; true when this call created it.
  virtual bool claim(const std::string& key, const std::string& value) = 0;

  // Waits until `key` exists (polling) or `deadline` passes (TimeoutError naming the key).
  std::string get(const std::string& key, std::chrono::steady_clock::time_point deadline);
  // Waits until every key exists, `until` (when not empty) exists, or `deadline` passes;
  // returns which keys exist.
  std::vector<bool> waitAll(const std::vector<std::string>& keys, std::chrono::steady_clock::time_point deadline,
                            const std::string& until = {});
};

// A value of any size as chunks under the store's value bound: "<key>/<c>" holds chunk c and
// `key` the number of chunks, written last, so a reader that finds `key` finds every chunk.
void setChunked(Store& store, const std::string& key, const std::string& value);
// The whole value, or nothing while `key` is absent. Throws PeerFailure for a malformed count
// and TimeoutError when a chunk does not appear by `deadline`.
std::optional<std::string> tryGetChunked(Store& store, const std::string& key,
                                         std::chrono::steady_clock::time_point deadline);

// One file per key in `directory` (created if needed, mode 0700); values written atomically.
class FileStore : public Store {
 public:
  explicit FileStore(std::string directory);
  void set(const std::string& key, const std::string& value) override;
  std::optional<std::string> tryGet(const std::string& key) override;
  bool claim(const std::string& key, const std::string& value) override;
  // Removes one key (absent: nothing to do).
  void erase(const std::string& key);
  // Removes every key and the directory (the end of a job's rendezvous). Best effort.
  void removeAll() noexcept;

 private:
  std::string path(const std::string& key) const;
  std::string directory_;
};

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  std::chrono::milliseconds io_timeout{2000};    // per request
  std::chrono::milliseconds connect_timeout{0};  // keep retrying a refused connect this long
  std::string token;  // the job's secret: requests and replies are tagged with it (lmr/oob/wire.h)
};

// The server: a listening socket on `bind_address` and one thread that answers one request
// per connection. port 0 picks a free port (see port()). Requests without the job's
// `token` are dropped (and logged) before anything is applied; the data is bounded
// (lmr::oob::StoreState). Not copyable; the destructor stops the thread.
class TcpStoreServer {
 public:
  TcpStoreServer(int port, const std::string& bind_address, std::string token);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  std::uint64_t requests() const { return requests_.load(); }  // applied
  std::uint64_t refused() const { return refused_.load(); }    // dropped: malformed or unauthenticated

 private:
  void serve();
  void answer(int fd);
  void refuse(const std::string& why);
  std::string token_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  int port_ = 0;
  std::atomic<std::uint64_t> requests_{0}, refused_{0};
  StoreState state_;  // only the server thread touches it
  std::thread thread_;
};

class TcpStore : public Store {
 public:
  explicit TcpStore(TcpStoreOptions options);
  void set(const std::string& key, const std::string& value) override;
  std::optional<std::string> tryGet(const std::string& key) override;
  bool claim(const std::string& key, const std::string& value) override;

 private:
  // One request on a fresh connection: returns (status, value).
  std::pair<bool, std::string> call(std::uint8_t op, const std::string& key, const std::string& value);
  TcpStoreOptions options_;
};

}  // namespace lmr::oob
