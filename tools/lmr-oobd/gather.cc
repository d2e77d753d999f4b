#include "gather.h"

#include <gloo/allgather.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
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
    auto context = std::make_shared<gloo::rendezvous::Context>(index, members);
    context->setTimeout(left(deadline));
    auto dev = device;
    context->connectFullMesh(rendezvous, dev);
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
