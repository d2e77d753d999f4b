#include "observer.h"

#include <algorithm>
#include <cstring>
#include <map>

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
}

Observer::~Observer() = default;

void Observer::setUp(Clock::time_point deadline) {
  const auto n = options_.group_ranks.size();
  store_.set(key("ready/" + std::to_string(options_.index)), options_.host);
  hosts_.assign(n, "");
  for (std::size_t i = 0; i < n; ++i) {
    try {
      hosts_[i] = oob::parseHost(store_.get(key("ready/" + std::to_string(i)), deadline));
    } catch (const TimeoutError&) {
      throw TimeoutError("the lmr-oobd daemon of rank " + std::to_string(options_.group_ranks[i]) +
                         " did not register in time");
    }
  }
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
  } catch (const Error& e) {
    // Peers or the store failed mid-round: say so and try a fresh round shortly.
    LMR_LOG(kError, "oobd", "stall round ", next_round_, " failed: ", e.what());
    ++next_round_;
    retry_after_ns_ = oob::nowNs() + options_.join.count() * 1'000'000;
    return std::nullopt;
  }
}

std::optional<std::string> Observer::round(const oob::Snapshot& snapshot, std::int64_t now) {
  const auto t0 = Clock::now();
  std::int64_t latest = 0;
  if (auto v = store_.tryGet(key("latest"))) latest = oob::parseRound(*v);
  if (latest >= next_round_) {
    // Rounds were decided without this daemon: it came late to the current one.
    handled_progress_ns_ = snapshot.progress_ns;
    return adopt(latest);
  }
  const std::int64_t k = next_round_;
  const std::string r = std::to_string(k);
  const auto n = static_cast<std::int64_t>(options_.group_ranks.size());
  store_.set(key("here/" + r + "/" + std::to_string(options_.index)), "");
  std::optional<std::string> members_text = store_.tryGet(key("members/" + r));
  if (!members_text) {
    std::vector<std::string> keys;
    for (std::int64_t i = 0; i < n; ++i) keys.push_back(key("here/" + r + "/" + std::to_string(i)));
    const std::vector<bool> here = store_.waitAll(keys, t0 + options_.join);
    std::vector<std::int64_t> present;
    for (std::int64_t i = 0; i < n; ++i)
      if (here[static_cast<std::size_t>(i)]) present.push_back(i);
    if (store_.claim(key("members/" + r), oob::formatMembers(present))) store_.set(key("latest"), r);
    members_text = store_.get(key("members/" + r), t0 + options_.join + options_.gather);
  }
  const std::vector<std::int64_t> members = oob::parseMembers(*members_text, n);
  const auto me = std::find(members.begin(), members.end(), options_.index);
  if (me == members.end()) {
    handled_progress_ns_ = snapshot.progress_ns;
    return adopt(k);
  }

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

  const int index = static_cast<int>(me - members.begin());
  const std::string mesh = key("mesh/" + r + "/");
  const std::vector<std::string> records =
      allgather(store_, mesh, index, static_cast<int>(members.size()),
                oob::encodeView(options_.token, mesh, toRecord(mine)), Clock::now() + options_.gather, device_);

  std::vector<oob::RankView> views(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    views[static_cast<std::size_t>(i)].rank = options_.group_ranks[static_cast<std::size_t>(i)];
    views[static_cast<std::size_t>(i)].host = hosts_.empty() ? "" : hosts_[static_cast<std::size_t>(i)];
  }
  std::int64_t quiet_ns = -1;
  std::map<std::uint64_t, int> steps;
  for (std::size_t m = 0; m < members.size(); ++m) {
    const std::int64_t rank = options_.group_ranks[static_cast<std::size_t>(members[m])];
    views[static_cast<std::size_t>(members[m])] = fromRecord(oob::decodeView(options_.token, mesh, records[m], rank));
    const oob::RankView& v = views[static_cast<std::size_t>(members[m])];
    quiet_ns = quiet_ns < 0 ? v.stalled_ns : std::min(quiet_ns, v.stalled_ns);
    ++steps[v.snapshot.step];
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
  const double since_snapshot = std::chrono::duration<double>(Clock::now() - t0).count();
  report.detection_latency_s = static_cast<double>(quiet_ns) / kNsPerSec + since_snapshot;
  report.written_by = mine.rank;
  const std::string text = oob::toJson(report).dump(2) + "\n";
  if (index == 0) store_.set(key("report/" + r), text);
  handled_progress_ns_ = snapshot.progress_ns;
  next_round_ = k + 1;
  return writeReport(k, text);
}

std::optional<std::string> Observer::adopt(std::int64_t k) {
  next_round_ = k + 1;
  std::string text;
  try {
    text = store_.get(key("report/" + std::to_string(k)), Clock::now() + options_.gather);
  } catch (const TimeoutError&) {
    LMR_LOG(kWarn, "oobd", "round ", k, " was decided without this daemon and wrote no report");
    return std::nullopt;
  }
  // The report is written as this daemon's own: it must be this round's, of this group.
  oob::ScoutFaultReport report;
  try {
    report = oob::parseReport(text, "the stored report of round " + std::to_string(k));
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

std::string Observer::writeReport(std::int64_t k, const std::string& text) {
  const std::string path = options_.state_dir + "/" + stem_ + "-r" + std::to_string(k) + ".json";
  {
    MutexLock lock(reportFileLock());
    files::replaceFile(path, text);
  }
  LMR_LOG(kInfo, "oobd", "wrote ", path);
  return path;
}

}  // namespace lmr::oobd
