// The observer inside lmr-oobd: watches one training rank's progress record and, once its
// visible progress stopped for the threshold, runs one stall round with the daemons of the
// same peer group, in two levels so that no daemon talks to every other:
//
//  1. node: every daemon stores its view under "view/<round>/<index>" and waits (until
//     join after it began, or until one of them decided) for the views of the group's other
//     daemons on its host; the first done waiting claims "node/<round>/<node>" with the ones
//     that came. The first of that list claims "leader/<round>/<node>" and leads; the others
//     wait for the round's report and write it as theirs, and the next one claims the lead
//     after a grace period when nobody has (the first died after storing its view). A leader
//     whose round fails marks "abort/<round>/<node>", so its host's daemons give the round up
//     with it. A daemon that came after the claim adopts the round's report.
//  2. leaders: each node leader marks its node present ("lead/<round>/<node>"). The leaders
//     of the first two nodes wait (until 2 x join after they began) for the other nodes'
//     marks; the first done waiting claims "members/<round>" with the nodes that answered,
//     so daemons that did not are named, not waited on. The other leaders wait for that list
//     only (and for the marks themselves if it does not come). A leader that came after
//     the list was fixed adopts the report.
//  3. gather: the leaders allgather their nodes' views through Gloo (gather.h: a ring, two
//     sockets a leader), as fixed slots (lmr/oob/wire.h, encodeNodeViews); each view keeps
//     its own daemon's tag.
//  4. decide: every leader runs oob::diagnose on the same views, writes the same
//     SCOUTFaultReport to its state directory (atomic replace, so a shared directory is
//     fine); the first leader also stores it ("report/<round>", in chunks). The other
//     daemons find the file when they share their leader's directory (one per job and host,
//     as the hang monitor sets it up) and read the stored copy otherwise.
//
// With one daemon per host every daemon leads its node and the round is one level. Per
// round the store sees O(N x daemons per host) requests and a leader opens 2 sockets,
// instead of N^2 and N - 1 (docs/scale.md).
//
// One report per stall: a new round starts only after the rank made progress again.
// Nothing touches the network between stalls. Not thread-safe: one thread calls poll().
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "lmr/common/mutex.h"
#include "lmr/oob/diagnose.h"
#include "lmr/oob/progress.h"
#include "lmr/oob/store.h"
#include "lmr/oob/wire.h"

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
  // How long a round waits for the other daemons, and the bound on the allgather. A group
  // of N daemons takes at least N ms and 1.25 N ms: a round costs the one store about 17
  // requests a daemon, and a store answers about 20 thousand a second (docs/scale.md).
  std::chrono::milliseconds join{1000};
  std::chrono::milliseconds gather{2000};
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
  // The round's waits as this daemon runs them (the options', at least what the group's size needs).
  std::chrono::milliseconds join() const { return options_.join; }
  std::chrono::milliseconds gather() const { return options_.gather; }

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
  // Level 2 for a node leader: `share` holds its node's views of round `k`, begun at `t0`.
  std::optional<std::string> lead(std::int64_t k, std::chrono::steady_clock::time_point t0,
                                  const std::vector<oob::NodeView>& share, const oob::Snapshot& snapshot,
                                  const oob::RankView& mine);
  oob::RankView ownView(const oob::Snapshot& snapshot, std::int64_t now) const;
  // One level's decision: waits until `deadline` for `keys` (ids[j] came when keys[j]
  // exists) or until `decided` exists, claims `decided` with the ids that came unless it is
  // taken, and returns its value and whether this call set it.
  std::pair<std::string, bool> decide(const std::string& decided, const std::vector<std::string>& keys,
                                      const std::vector<std::int64_t>& ids,
                                      std::chrono::steady_clock::time_point deadline);
  std::int64_t thresholdNs(const oob::Snapshot& s) const;
  static constexpr std::int64_t kDeciders = 2;  // the nodes whose leaders decide level 2's list
  // A late daemon's wait for round k's report (reportIfReady); gives up with a log line.
  std::optional<std::string> adopt(std::int64_t round, std::chrono::steady_clock::time_point deadline);
  // Round k's report for this daemon, when there is one: the file, when a daemon sharing the
  // state directory wrote it, or else the stored copy, checked and written as this daemon's.
  std::optional<std::string> reportIfReady(std::int64_t round);
  // The step of round k's report (file or stored copy), when there is a readable one.
  std::optional<std::int64_t> reportStepOf(std::int64_t round);
  void partition();  // nodes_ from hosts_
  std::string writeReport(std::int64_t round, const std::string& text);
  std::string reportPath(std::int64_t round) const;
  std::string key(const std::string& suffix) const { return prefix_ + suffix; }

  ObserverOptions options_;
  oob::Store& store_;
  oob::ProgressReader reader_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::string prefix_, stem_;
  std::vector<std::string> hosts_;  // per group member, from set-up
  // The group's members by host, hosts in order of their first member (before set-up,
  // every member alone); node_of_[i] is member i's position in nodes_.
  std::vector<std::vector<std::int64_t>> nodes_;
  std::vector<std::int64_t> node_of_;
  std::size_t slots_ = 1;  // the most members on one host
  std::int64_t next_round_ = 1;
  std::int64_t failed_round_ = 0;  // the round that failed here last (0: none)
  std::int64_t handled_progress_ns_ = -1;  // the stall already reported
  std::int64_t retry_after_ns_ = 0;
  // When this daemon first saw the DataLoader / checkpoint call now in flight.
  std::int64_t dataloader_since_ = 0, dataloader_seen_ = 0;
  std::int64_t checkpoint_since_ = 0, checkpoint_seen_ = 0;
};

}  // namespace lmr::oobd
