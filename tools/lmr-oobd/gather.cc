#include "gather.h"

#include <gloo/allgather.h>
#include <gloo/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/context.h>
#include <gloo/transport/tcp/device.h>

#include "lmr/common/error.h"

namespace lmr::oobd {
namespace {

using Clock = std::chrono::steady_clock;

// Presents a key prefix of an lmr::oob::Store to Gloo's rendezvous, bounded by a deadline.
class PrefixedStore : public gloo::rendezvous::Store {
 public:
  PrefixedStore(oob::Store& store, std::string prefix, Clock::time_point deadline)
      : store_(store), prefix_(std::move(prefix)), deadline_(deadline) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(prefix_ + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string v = store_.get(prefix_ + key, deadline_);
    return {v.begin(), v.end()};
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, std::chrono::milliseconds(0)); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
    for (const std::string& k : keys) store_.get(prefix_ + k, deadline_);
  }

 private:
  oob::Store& store_;
  std::string prefix_;
  Clock::time_point deadline_;
};

// A Gloo context whose members are connected as a ring: each to the members before and
// after it, all that gloo::allgather's ring algorithm uses. Each member stores the addresses
// of its two pairs under its index and reads its two neighbours' entries: 3 store requests
// and 2 sockets a member. Gloo's full mesh has each member store N - 1 addresses and read
// every other member's list, N^2 requests and N^3 addresses through the one store (about
// 1.2 TB for 2,048 node leaders), and N - 1 sockets a member.
class RingContext : public gloo::Context {
 public:
  RingContext(int rank, int size) : gloo::Context(rank, size) {}

  void connect(gloo::rendezvous::Store& store, const std::shared_ptr<gloo::transport::Device>& device) {
    auto transport = device->createContext(rank, size);
    transport->setTimeout(getTimeout());
    const int prev = (rank + size - 1) % size, next = (rank + 1) % size;
    std::vector<char> mine;  // the address of my pair to prev, then of my pair to next
    for (int peer : {prev, next}) {
      auto& pair = transport->getPair(peer) ? transport->getPair(peer) : transport->createPair(peer);
      const std::vector<char> bytes = pair->address().bytes();
      mine.insert(mine.end(), bytes.begin(), bytes.end());
    }
    store.set(std::to_string(rank), mine);
    // My pair to `next` meets next's pair to its prev (me): the first half of its entry; my
    // pair to `prev` meets prev's pair to its next: the second half. With two members both
    // halves are the one pair. A connect waits for the other side, so each member connects
    // to the lower-ranked neighbour first: the lowest pair not yet connected always has both
    // of its members at it, so the ring cannot wait on itself.
    const auto half = [&](int peer, bool second) {
      const std::vector<char> entry = store.get(std::to_string(peer));
      const std::size_t n = entry.size() / 2;
      return std::vector<char>(entry.begin() + (second ? static_cast<std::ptrdiff_t>(n) : 0),
                               entry.begin() + static_cast<std::ptrdiff_t>(second ? entry.size() : n));
    };
    for (int peer : {std::min(prev, next), std::max(prev, next)}) {
      if (peer == next) transport->getPair(next)->connect(half(next, false));
      else transport->getPair(prev)->connect(half(prev, true));
      if (prev == next) break;
    }
    device_ = device;
    transportContext_ = std::move(transport);
  }
};

std::chrono::milliseconds left(Clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(ms, std::chrono::milliseconds(1));
}

}  // namespace

std::shared_ptr<gloo::transport::Device> makeDevice(const std::string& hostname, const std::string& iface) {
  gloo::transport::tcp::attr attr;
  if (!iface.empty()) attr.iface = iface;
  else attr.hostname = hostname;
  return gloo::transport::tcp::CreateDevice(attr);
}

std::vector<std::string> allgather(oob::Store& store, const std::string& prefix, int index, int members,
                                   const std::string& record, Clock::time_point deadline,
                                   const std::shared_ptr<gloo::transport::Device>& device) {
  if (members == 1) return {record};
  const std::size_t bytes = record.size();
  std::vector<char> out(bytes * static_cast<std::size_t>(members));
  try {
    PrefixedStore rendezvous(store, prefix, deadline);
    auto context = std::make_shared<RingContext>(index, members);
    context->setTimeout(left(deadline));
    context->connect(rendezvous, device);
    gloo::AllgatherOptions options(context);
    options.setInput(const_cast<char*>(record.data()), bytes);
    options.setOutput(out.data(), out.size());
    options.setTimeout(left(deadline));
    gloo::allgather(options);
  } catch (const lmr::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw PeerFailure(std::string("the stall gather failed: ") + e.what());
  }
  std::vector<std::string> records;
  for (int i = 0; i < members; ++i) records.emplace_back(out.data() + i * bytes, bytes);
  return records;
}

}  // namespace lmr::oobd
