// The observer inside lmr-oobd: watches one training rank's progress record and, once its
// visible progress stopped for the threshold, runs one stall round with the daemons of the
// same peer group:
//
//  1. join: write "here/<round>/<rank>" to the store, wait (bounded) for the others;
//  2. membership: the first daemon done waiting claims "members/<round>" with the ranks that
//     answered; everyone uses that list, so daemons that did not answer are named, not
//     waited on; a daemon that arrives after the decision adopts that round's report;
//  3. gather: the members allgather fixed-size views through Gloo (gather.h);
//  4. decide: every member runs oob::diagnose on the same views and writes the same
//     SCOUTFaultReport to its state directory (atomic replace, so a shared directory is
//     fine); the first member also stores it for late daemons.
//
// One report per stall: a new round starts only after the rank made progress again.
// Nothing touches the network between stalls. Not thread-safe: one thread calls poll().
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lmr/common/mutex.h"
#include "lmr/oob/diagnose.h"
#include "lmr/oob/progress.h"
#include "lmr/oob/store.h"

namespace gloo::transport {
class Device;
}

namespace lmr::oobd {

struct ObserverOptions {
  std::string run_id;
  std::string instance;  // an id every daemon of one job shares (keeps jobs' keys apart)
  std::string token;     // the job's secret: views are tagged with it (lmr/oob/wire.h)
  std::int64_t generation = 0;
  std::string group = "world";          // peer group name (scopes the store keys)
  std::vector<std::int64_t> group_ranks;  // global rank of each member of the peer group
  std::int64_t index = 0;                 // this daemon's position in group_ranks
  std::string host;                       // this machine, as reports name it
  std::string gloo_hostname = "127.0.0.1";  // address peers reach this daemon at
  std::string gloo_iface;                   // or an interface name
  std::chrono::nanoseconds threshold{std::chrono::seconds(60)};
  std::chrono::nanoseconds warmup_threshold{std::chrono::seconds(600)};  // before the first completed step
  std::chrono::milliseconds join{1000};    // how long a round waits for the other daemons
  std::chrono::milliseconds gather{2000};  // bound on building the mesh and the allgather
  std::string state_dir;
  oob::DiagnosisOptions diagnosis;
};

// Held while a report file is written: the parent-death exit (main.cc) takes it first, so
// a daemon never dies half-way through a write and leaves a temporary file behind.
Mutex& reportFileLock();

class Observer {
 public:
  Observer(ObserverOptions options, oob::Store& store, const std::string& segment);
  ~Observer();
  Observer(const Observer&) = delete;
  Observer& operator=(const Observer&) = delete;

  // Registers this daemon and waits until every daemon of the group has registered.
  void setUp(std::chrono::steady_clock::time_point deadline);

  // One look at the record; runs a round when a stall passed the threshold. Returns the
  // report path when this call wrote one.
  std::optional<std::string> poll();

  std::int64_t roundsRun() const { return next_round_ - 1; }
  // File name stem of this group's reports: scout-fault-<digest>-g<generation>.
  const std::string& reportStem() const { return stem_; }
  // The prefix of every store key of this group and job.
  const std::string& keyPrefix() const { return prefix_; }

 private:
  std::optional<std::string> round(const oob::Snapshot& snapshot, std::int64_t now);
  std::int64_t thresholdNs(const oob::Snapshot& s) const;
  std::optional<std::string> adopt(std::int64_t round);
  std::string writeReport(std::int64_t round, const std::string& text);
  std::string key(const std::string& suffix) const { return prefix_ + suffix; }

  ObserverOptions options_;
  oob::Store& store_;
  oob::ProgressReader reader_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::string prefix_, stem_;
  std::vector<std::string> hosts_;  // per group member, from set-up
  std::int64_t next_round_ = 1;
  std::int64_t handled_progress_ns_ = -1;  // the stall already reported
  std::int64_t retry_after_ns_ = 0;
  // When this daemon first saw the DataLoader / checkpoint call now in flight.
  std::int64_t dataloader_since_ = 0, dataloader_seen_ = 0;
  std::int64_t checkpoint_since_ = 0, checkpoint_seen_ = 0;
};

}  // namespace lmr::oobd
