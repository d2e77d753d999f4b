#include "observer.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>

#include "gather.h"
#include "lmr/common/error.h"
#include "lmr/common/files.h"
#include "lmr/common/hex.h"
#include "lmr/common/log.h"
#include "lmr/common/sha256.h"
#include "lmr/oob/report.h"
#include "lmr/oob/watch.h"
#include "lmr/oob/wire.h"

namespace lmr::oobd {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::int64_t kNsPerSec = 1'000'000'000;

oob::ViewRecord toRecord(const oob::RankView& v) {
  oob::ViewRecord w;
  const oob::Snapshot& s = v.snapshot;
  w.rank = v.rank;
  w.layer = s.layer;
  w.stalled_ns = v.stalled_ns;
  w.step = s.step;
  w.layer_calls = s.layer_calls;
  w.group = s.collective.group;
  w.meta = s.collective.meta;
  w.sequence = s.collective.sequence;
  w.op = s.collective.op;
  w.reduce_or_root = s.collective.reduce_or_root;
  w.in_collective = s.in_collective ? 1 : 0;
  w.dataloader_ns = v.dataloader_ns;
  w.dataloader_observed_ns = v.dataloader_observed_ns;
  w.dataloader_last_ns = s.dataloader_last_ns;
  w.checkpoint_ns = v.checkpoint_ns;
  w.checkpoint_observed_ns = v.checkpoint_observed_ns;
  w.checkpoint_last_ns = s.checkpoint_last_ns;
  std::strncpy(w.host, v.host.c_str(), sizeof(w.host) - 1);
  return w;
}

oob::RankView fromRecord(const oob::ViewRecord& w) {
  oob::RankView v;
  v.rank = w.rank;
  v.present = true;
  v.stalled_ns = w.stalled_ns;
  v.snapshot.step = w.step;
  v.snapshot.layer = w.layer;
  v.snapshot.layer_calls = w.layer_calls;
  v.snapshot.collective = {w.op, w.reduce_or_root, w.group, w.meta, w.sequence};
  v.snapshot.in_collective = w.in_collective != 0;
  v.dataloader_ns = w.dataloader_ns;
  v.dataloader_observed_ns = w.dataloader_observed_ns;
  v.snapshot.dataloader_last_ns = w.dataloader_last_ns;
  v.checkpoint_ns = w.checkpoint_ns;
  v.checkpoint_observed_ns = w.checkpoint_observed_ns;
  v.snapshot.checkpoint_last_ns = w.checkpoint_last_ns;
  v.host = w.host;  // decodeView checked the terminator
  return v;
}

// How long the call in flight since `since` has been watched by this daemon.
std::int64_t watched(std::int64_t since, std::int64_t now, std::int64_t* tracked_since, std::int64_t* first_seen) {
  if (since == 0) {
    *tracked_since = *first_seen = 0;
    return 0;
  }
  if (since != *tracked_since) {
    *tracked_since = since;
    *first_seen = now;
  }
  return now - *first_seen;
}

}  // namespace

Observer::Observer(ObserverOptions options, oob::Store& store, const std::string& segment)
    : options_(std::move(options)), store_(store), reader_(segment) {
  const auto n = static_cast<std::int64_t>(options_.group_ranks.size());
  if (n == 0 || options_.index < 0 || options_.index >= n)
    throw InvalidArgument("the daemon's index " + std::to_string(options_.index) + " is outside its group of " +
                          std::to_string(n));
  if (options_.state_dir.empty()) throw InvalidArgument("lmr-oobd needs a state directory for its reports");
  if (options_.token.empty()) throw InvalidArgument("lmr-oobd needs the job's token (LMR_OOB_TOKEN)");
  // The store answers the round's requests one at a time: a large group needs longer.
  options_.join = std::max(options_.join, std::chrono::milliseconds(n));
  options_.gather = std::max(options_.gather, std::chrono::milliseconds(n + n / 4));
  files::makeDirectories(options_.state_dir);
  Sha256 h;
  h.update("lmr.oobd.v1");
  h.updateU64(options_.run_id.size()).update(options_.run_id);
  h.updateU64(options_.instance.size()).update(options_.instance);
  h.updateU64(options_.group.size()).update(options_.group);
  h.updateU64(static_cast<std::uint64_t>(options_.generation));
  for (std::int64_t r : options_.group_ranks) h.updateU64(static_cast<std::uint64_t>(r));
  const auto d = h.finish();
  const std::string digest = toHex(std::string_view(reinterpret_cast<const char*>(d.data()), 6));
  prefix_ = "oob-" + digest + "/";
  stem_ = "scout-fault-" + digest + "-g" + std::to_string(options_.generation);
  device_ = makeDevice(options_.gloo_hostname, options_.gloo_iface);
  partition();
}

void Observer::partition() {
  const auto n = static_cast<std::int64_t>(options_.group_ranks.size());
  nodes_.clear();
  node_of_.assign(static_cast<std::size_t>(n), 0);
  std::map<std::string, std::int64_t> node_of_host;
  for (std::int64_t i = 0; i < n; ++i) {
    const bool known = hosts_.size() == static_cast<std::size_t>(n) && !hosts_[static_cast<std::size_t>(i)].empty();
    std::int64_t node = static_cast<std::int64_t>(nodes_.size());  // an unknown host: alone
    if (known) node = node_of_host.try_emplace(hosts_[static_cast<std::size_t>(i)], node).first->second;
    if (node == static_cast<std::int64_t>(nodes_.size())) nodes_.emplace_back();
    nodes_[static_cast<std::size_t>(node)].push_back(i);
    node_of_[static_cast<std::size_t>(i)] = node;
  }
  slots_ = 1;
  for (const auto& node : nodes_) slots_ = std::max(slots_, node.size());
}

Observer::~Observer() = default;

void Observer::setUp(Clock::time_point deadline) {
  const auto n = static_cast<std::int64_t>(options_.group_ranks.size());
  store_.set(key("ready/" + std::to_string(options_.index)), options_.host);
  const auto unregistered = [&](std::int64_t i) {
    return TimeoutError("the lmr-oobd daemon of rank " +
                        std::to_string(options_.group_ranks[static_cast<std::size_t>(i)]) +
                        " did not register in time");
  };
  if (options_.index == 0) {
    // The first daemon reads everyone's host once and publishes the table (in chunks under
    // the store's value bound); the others read the table, not each other's keys: N
    // requests instead of N².
    hosts_.assign(static_cast<std::size_t>(n), "");
    for (std::int64_t i = 0; i < n; ++i) {
      try {
        hosts_[static_cast<std::size_t>(i)] = oob::parseHost(store_.get(key("ready/" + std::to_string(i)), deadline));
      } catch (const TimeoutError&) {
        throw unregistered(i);
      }
    }
    oob::setChunked(store_, key("hosts"), oob::formatHosts(hosts_));
  } else {
    std::optional<std::string> table;
    for (oob::Backoff wait(deadline); !(table = oob::tryGetChunked(store_, key("hosts"), deadline));) {
      if (wait.pause()) continue;
      for (std::int64_t i = 0; i < n; ++i)
        if (!store_.tryGet(key("ready/" + std::to_string(i)))) throw unregistered(i);
      throw TimeoutError("the lmr-oobd daemon of rank " + std::to_string(options_.group_ranks[0]) +
                         " did not publish its group's hosts in time");
    }
    hosts_ = oob::parseHosts(*table, n);
    if (hosts_[static_cast<std::size_t>(options_.index)] != options_.host)
      throw PeerFailure("the group's host table names this daemon's host \"" +
                        hosts_[static_cast<std::size_t>(options_.index)] + "\", not \"" + options_.host + "\"");
  }
  partition();
}

std::int64_t Observer::thresholdNs(const oob::Snapshot& s) const {
  return oob::stallThresholdNs(s, options_.threshold.count(), options_.warmup_threshold.count());
}

std::optional<std::string> Observer::poll() {
  const std::optional<oob::Snapshot> s = reader_.snapshot();
  if (!s) return std::nullopt;  // the writer is mid-update; look again next time
  const std::int64_t now = oob::nowNs();
  watched(s->dataloader_since_ns, now, &dataloader_since_, &dataloader_seen_);
  watched(s->checkpoint_since_ns, now, &checkpoint_since_, &checkpoint_seen_);
  if (now - s->progress_ns < thresholdNs(*s)) return std::nullopt;
  if (s->progress_ns == handled_progress_ns_ || now < retry_after_ns_) return std::nullopt;
  try {
    return round(*s, now);
  } catch (const std::exception& e) {  // lmr::Error from peers and the store; anything else too
    // Peers or the store failed mid-round: say so and try a fresh round shortly.
    LMR_LOG(kError, "oobd", "stall round ", next_round_, " failed: ", e.what());
    failed_round_ = next_round_++;
    retry_after_ns_ = oob::nowNs() + options_.join.count() * 1'000'000;
    return std::nullopt;
  }
}

std::pair<std::string, bool> Observer::decide(const std::string& decided, const std::vector<std::string>& keys,
                                              const std::vector<std::int64_t>& ids, Clock::time_point deadline) {
  const std::vector<bool> came = store_.waitAll(keys, deadline, decided);
  std::vector<std::int64_t> present;
  for (std::size_t j = 0; j < ids.size(); ++j)
    if (came[j]) present.push_back(ids[j]);
  const bool claimed = store_.claim(decided, oob::formatMembers(present));  // no-op once decided
  return {store_.get(decided, deadline + options_.gather), claimed};
}

oob::RankView Observer::ownView(const oob::Snapshot& snapshot, std::int64_t now) const {
  oob::RankView mine;
  mine.rank = options_.group_ranks[static_cast<std::size_t>(options_.index)];
  mine.present = true;
  mine.snapshot = snapshot;
  mine.host = options_.host;
  mine.stalled_ns = now - snapshot.progress_ns;
  if (snapshot.dataloader_since_ns != 0) mine.dataloader_ns = now - snapshot.dataloader_since_ns;
  if (snapshot.checkpoint_since_ns != 0) mine.checkpoint_ns = now - snapshot.checkpoint_since_ns;
  mine.dataloader_observed_ns = snapshot.dataloader_since_ns != 0 ? now - dataloader_seen_ : 0;
  mine.checkpoint_observed_ns = snapshot.checkpoint_since_ns != 0 ? now - checkpoint_seen_ : 0;
  return mine;
}

std::optional<std::string> Observer::round(const oob::Snapshot& snapshot, std::int64_t now) {
  const auto t0 = Clock::now();
  if (failed_round_ > 0) {
    // This daemon's last round failed here; if the other nodes decided it, its report is
    // this stall's too (trying the next round alone would move this host's round numbers
    // ahead of the group's). A round still going on, or a report that does not check, is
    // left: the next round starts.
    const std::int64_t k = std::exchange(failed_round_, 0);
    std::optional<std::string> path;
    try {
      path = reportIfReady(k);
    } catch (const Error& e) {
      LMR_LOG(kWarn, "oobd", "round ", k, "'s report is not adopted: ", e.what());
    }
    if (path) {
      handled_progress_ns_ = snapshot.progress_ns;
      return path;
    }
  }
  std::int64_t latest = 0;
  if (auto v = store_.tryGet(key("latest"))) latest = oob::parseRound(*v);
  if (latest >= next_round_) {
    // Rounds were decided without this daemon: it came late to the current one, unless
    // that round's report is of an earlier stall (its step behind this rank's): then the
    // group's numbers moved apart (a host ran a round alone) and this stall starts the next
    // round. A late rank that is a step ahead of its group reports alone (inconclusive)
    // rather than take an old stall's culprit.
    if (reportStepOf(latest).value_or(static_cast<std::int64_t>(snapshot.step)) >=
        static_cast<std::int64_t>(snapshot.step)) {
      handled_progress_ns_ = snapshot.progress_ns;
      return adopt(latest, Clock::now() + 2 * options_.gather);
    }
    next_round_ = latest + 1;
  }
  const std::int64_t k = next_round_;
  const std::string r = std::to_string(k);
  const auto n = static_cast<std::int64_t>(options_.group_ranks.size());
  const std::int64_t node = node_of_[static_cast<std::size_t>(options_.index)];
  const std::string view_prefix = key("view/" + r + "/");
  const oob::RankView mine = ownView(snapshot, now);
  const std::string my_view =
      oob::encodeView(options_.token, view_prefix + std::to_string(options_.index), toRecord(mine));
  store_.set(view_prefix + std::to_string(options_.index), my_view);

  // Level 1: who of this host's daemons came (waiting stops once one of them decided).
  const std::string node_key = key("node/" + r + "/" + std::to_string(node));
  const std::vector<std::int64_t>& local = nodes_[static_cast<std::size_t>(node)];
  std::vector<std::string> views;
  for (std::int64_t i : local) views.push_back(view_prefix + std::to_string(i));
  const std::vector<std::int64_t> here = oob::parseMembers(decide(node_key, views, local, t0 + options_.join).first, n);
  for (std::int64_t i : here)
    if (node_of_[static_cast<std::size_t>(i)] != node)
      throw PeerFailure("the node list of round " + r + " names member " + std::to_string(i) + " of another host");
  // A leader started at most `join` after this daemon, waits up to 2 x join for the other
  // nodes, then gathers within `gather` twice (the membership, the views).
  const auto report_deadline = t0 + 3 * options_.join + 2 * options_.gather;
  const auto position = static_cast<std::size_t>(std::find(here.begin(), here.end(), options_.index) - here.begin());
  if (position == here.size()) {  // came after the node's list was fixed
    handled_progress_ns_ = snapshot.progress_ns;
    return adopt(k, report_deadline);
  }

  // The node's leader is whoever claims it: the list's first at once; the next one after a
  // grace period per place when nobody has (the first died after storing its view).
  const std::string leader_key = key("leader/" + r + "/" + std::to_string(node));
  const std::string abort_key = key("abort/" + r + "/" + std::to_string(node));
  bool leading = position == 0 && store_.claim(leader_key, std::to_string(options_.index));
  if (!leading) {
    const auto grace = std::min<Clock::duration>(options_.join / 2, std::chrono::milliseconds(500));
    const auto take_over_at = Clock::now() + grace * static_cast<int>(position);
    bool tried = position == 0;
    for (oob::Backoff wait(report_deadline);;) {
      if (auto path = reportIfReady(k)) {
        handled_progress_ns_ = snapshot.progress_ns;
        next_round_ = k + 1;
        return path;
      }
      if (store_.tryGet(abort_key)) throw PeerFailure("this host's leading daemon gave up round " + r);
      if (!tried && Clock::now() >= take_over_at) {
        tried = true;
        if ((leading = store_.claim(leader_key, std::to_string(options_.index)))) {
          LMR_LOG(kWarn, "oobd", "round ", k, ": this host's first daemon did not lead it; this one does");
          break;
        }
      }
      if (!wait.pause()) throw PeerFailure("this host's leading daemon wrote no report of round " + r);
    }
  }
  try {
    std::vector<oob::NodeView> share;  // every listed daemon stored its view before the list
    for (std::int64_t i : here)
      share.push_back({i, i == options_.index
                              ? my_view
                              : store_.get(view_prefix + std::to_string(i), Clock::now() + options_.gather)});
    return lead(k, t0, share, snapshot, mine);
  } catch (const Error&) {
    try {  // the node's other daemons stop waiting and try the next round with it
      store_.set(abort_key, "");
    } catch (const Error&) {
    }
    throw;
  }
}

std::optional<std::string> Observer::lead(std::int64_t k, Clock::time_point t0, const std::vector<oob::NodeView>& share,
                                          const oob::Snapshot& snapshot, const oob::RankView& mine) {
  // Leaders wait for the other nodes until 2 x join after their round began: a node whose
  // list took the whole first `join` (a daemon missing) still comes in time.
  const auto t1 = t0 + options_.join;
  const std::string r = std::to_string(k);
  const auto n = static_cast<std::int64_t>(options_.group_ranks.size());
  const auto nodes = static_cast<std::int64_t>(nodes_.size());
  const std::int64_t node = node_of_[static_cast<std::size_t>(options_.index)];
  store_.set(key("lead/" + r + "/" + std::to_string(node)), "");
  std::vector<std::string> marks;
  std::vector<std::int64_t> all_nodes;
  for (std::int64_t m = 0; m < nodes; ++m) {
    marks.push_back(key("lead/" + r + "/" + std::to_string(m)));
    all_nodes.push_back(m);
  }
  // Only the first kDeciders nodes' leaders wait on every node's mark and decide the list;
  // the others wait for the list alone (one key), so this level costs O(nodes) store
  // requests, not O(nodes^2). Should no list come by the time a decider must have claimed
  // it (those nodes' leaders all died), a leader waits on the marks itself.
  const std::string members_key = key("members/" + r);
  std::pair<std::string, bool> decided;
  const auto decide_by = t1 + options_.join;
  if (node < kDeciders) {
    decided = decide(members_key, marks, all_nodes, decide_by);
  } else {
    std::optional<std::string> listed;
    for (oob::Backoff wait(decide_by + std::min<Clock::duration>(options_.join / 2, std::chrono::milliseconds(500)));
         !(listed = store_.tryGet(members_key)) && wait.pause();) {
    }
    decided = listed ? std::pair{*listed, false} : decide(members_key, marks, all_nodes, decide_by);
  }
  const auto& [members_text, claimed] = decided;
  if (claimed) store_.set(key("latest"), r);
  const std::vector<std::int64_t> members = oob::parseMembers(members_text, nodes);
  const auto me = std::find(members.begin(), members.end(), node);
  if (me == members.end()) {
    handled_progress_ns_ = snapshot.progress_ns;
    return adopt(k, Clock::now() + 2 * options_.gather);
  }

  const std::string mesh = key("mesh/" + r + "/");
  const std::vector<std::string> records =
      allgather(store_, mesh, static_cast<int>(me - members.begin()), static_cast<int>(members.size()),
                oob::encodeNodeViews(share, slots_), Clock::now() + options_.gather, device_);

  std::vector<oob::RankView> views(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    views[static_cast<std::size_t>(i)].rank = options_.group_ranks[static_cast<std::size_t>(i)];
    views[static_cast<std::size_t>(i)].host = hosts_.empty() ? "" : hosts_[static_cast<std::size_t>(i)];
  }
  std::int64_t quiet_ns = -1;
  std::map<std::uint64_t, int> steps;
  const std::string view_prefix = key("view/" + r + "/");
  for (std::size_t m = 0; m < members.size(); ++m) {
    for (const oob::NodeView& nv : oob::decodeNodeViews(records[m], slots_, n)) {
      if (node_of_[static_cast<std::size_t>(nv.index)] != members[m])
        throw PeerFailure("the views of node " + std::to_string(members[m]) + " in round " + r + " include member " +
                          std::to_string(nv.index) + " of another host");
      const std::int64_t rank = options_.group_ranks[static_cast<std::size_t>(nv.index)];
      oob::RankView& v = views[static_cast<std::size_t>(nv.index)];
      v = fromRecord(oob::decodeView(options_.token, view_prefix + std::to_string(nv.index), nv.view, rank));
      quiet_ns = quiet_ns < 0 ? v.stalled_ns : std::min(quiet_ns, v.stalled_ns);
      ++steps[v.snapshot.step];
    }
  }
  oob::ScoutFaultReport report = oob::ScoutFaultReport::of(oob::diagnose(views, options_.diagnosis));
  report.report_id = stem_ + "-r" + r;
  report.run_id = options_.run_id;
  report.generation = options_.generation;
  report.round = k;
  report.peer_group = options_.group;
  report.group_ranks = options_.group_ranks;
  report.step = static_cast<std::int64_t>(
      std::max_element(steps.begin(), steps.end(), [](auto& a, auto& b) { return a.second < b.second; })->first);
  report.threshold_s = static_cast<double>(thresholdNs(snapshot)) / kNsPerSec;
  // The group went quiet when its last rank stopped; the report exists now.
  const double since_snapshot =
      static_cast<double>(oob::nowNs() - (snapshot.progress_ns + mine.stalled_ns)) / kNsPerSec;
  report.detection_latency_s = static_cast<double>(quiet_ns) / kNsPerSec + since_snapshot;
  report.written_by = mine.rank;
  const std::string text = oob::toJson(report).dump(2) + "\n";
  // The file first: a daemon of this host that shares the state directory finds it there
  // and reads nothing from the store; the others (and late ones) read the copy the first
  // leader stores (one copy: a report grows with the group).
  const std::string path = writeReport(k, text);
  handled_progress_ns_ = snapshot.progress_ns;
  next_round_ = k + 1;
  if (me == members.begin()) {
    try {
      oob::setChunked(store_, key("report/" + r), text);
    } catch (const Error& e) {  // this daemon's report stands; daemons that need the copy retry
      LMR_LOG(kError, "oobd", "cannot store the report of round ", k, ": ", e.what());
    }
  }
  return path;
}

std::optional<std::string> Observer::adopt(std::int64_t k, Clock::time_point deadline) {
  next_round_ = k;  // a failure below makes poll() move on to k + 1
  for (oob::Backoff wait(deadline);;) {
    if (auto path = reportIfReady(k)) {
      next_round_ = k + 1;
      return path;
    }
    if (wait.pause()) continue;
    next_round_ = k + 1;
    LMR_LOG(kWarn, "oobd", "round ", k, " was decided without this daemon and wrote no report");
    return std::nullopt;
  }
}

std::optional<std::int64_t> Observer::reportStepOf(std::int64_t k) {
  try {
    std::optional<std::string> text = files::readFile(reportPath(k));
    if (!text) text = oob::tryGetChunked(store_, key("report/" + std::to_string(k)), Clock::now() + options_.gather);
    if (!text) return std::nullopt;
    return oob::parseReport(*text, "the report of round " + std::to_string(k)).step;
  } catch (const Error&) {
    return std::nullopt;  // unreadable here: adopting it says why
  }
}

std::optional<std::string> Observer::reportIfReady(std::int64_t k) {
  std::error_code error;
  if (std::filesystem::exists(reportPath(k), error)) return reportPath(k);  // a daemon sharing this directory
  const std::optional<std::string> text =
      oob::tryGetChunked(store_, key("report/" + std::to_string(k)), Clock::now() + options_.gather);
  if (!text) return std::nullopt;
  // The report is written as this daemon's own: it must be this round's, of this group.
  oob::ScoutFaultReport report;
  try {
    report = oob::parseReport(*text, "the stored report of round " + std::to_string(k));
  } catch (const InvalidArgument& e) {
    throw PeerFailure(std::string("a malformed stored report: ") + e.what());
  }
  if (report.report_id != stem_ + "-r" + std::to_string(k) || report.round != k || report.run_id != options_.run_id ||
      report.generation != options_.generation || report.peer_group != options_.group ||
      report.group_ranks != options_.group_ranks)
    throw PeerFailure("the stored report of round " + std::to_string(k) + " is not this group's (" + report.report_id +
                      ")");
  return writeReport(k, oob::toJson(report).dump(2) + "\n");
}

Mutex& reportFileLock() {
  static Mutex mu;
  return mu;
}

std::string Observer::reportPath(std::int64_t k) const {
  return options_.state_dir + "/" + stem_ + "-r" + std::to_string(k) + ".json";
}

std::string Observer::writeReport(std::int64_t k, const std::string& text) {
  const std::string path = reportPath(k);
  {
    MutexLock lock(reportFileLock());
    files::replaceFile(path, text);
  }
  LMR_LOG(kInfo, "oobd", "wrote ", path);
  return path;
}

}  // namespace lmr::oobd
