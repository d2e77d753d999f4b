#include "lmr/ckpt/certifier.h"

#include <algorithm>

#include "lmr/ckpt/recovery.h"
#include "lmr/common/error.h"
#include "lmr/replay/replay.h"
#include "names.h"

namespace lmr::ckpt {

std::string_view name(Outcome outcome) noexcept {
  switch (outcome) {
    case Outcome::kHealthy: return "healthy";
    case Outcome::kStraggler: return "straggler";
    case Outcome::kInconclusive: return "inconclusive";
    case Outcome::kSdc: return "sdc";
  }
  return "?";
}

Outcome parseOutcome(std::string_view text) {
  if (auto o = detail::fromName(text, kOutcomes)) return *o;
  throw InvalidArgument("unknown check outcome \"" + std::string(text) + "\" (expected " + detail::namesOf(kOutcomes) +
                        ")");
}

LocalOutcome classify(const CheckEvidence& e, const std::vector<std::string>& catalog) {
  LocalOutcome out;
  out.accepted.assign(catalog.size(), false);
  auto joined = [](const std::vector<std::string>& items) {
    std::string s;
    for (const auto& i : items) s += (s.empty() ? "" : ", ") + i;
    return s;
  };
  if (!e.sdc_sources.empty() || e.sdc_attributed) {
    out.outcome = Outcome::kSdc;
    out.reason = "SDC in " + joined(e.sdc_sources);
    return out;
  }
  std::vector<std::string> split;
  for (const auto& [surface, why] : e.inconclusive_reasons)
    if (why.rfind("no_majority", 0) == 0 && replay::isStateSource(surface)) split.push_back(surface);
  if (!split.empty()) {
    out.outcome = Outcome::kSdc;
    out.reason = "peers disagree with no majority in " + joined(split);
    return out;
  }
  const std::set<std::string> checked(e.checked_recipes.begin(), e.checked_recipes.end());
  const std::set<std::string> inconclusive(e.inconclusive_recipes.begin(), e.inconclusive_recipes.end());
  for (std::size_t i = 0; i < catalog.size(); ++i)
    out.accepted[i] = checked.count(catalog[i]) && !inconclusive.count(catalog[i]);
  if (e.inconclusive) {
    out.outcome = Outcome::kInconclusive;
    for (const auto& [what, why] : e.inconclusive_reasons)
      out.reason += (out.reason.empty() ? "" : "; ") + what + ": " + why;
    if (out.reason.empty()) out.reason = "inconclusive";
    return out;
  }
  out.outcome = e.straggler ? Outcome::kStraggler : Outcome::kHealthy;
  return out;
}

EmergencyReplay emergencyVerdict(Outcome worst, const std::vector<bool>& accepted) {
  if (worst == Outcome::kSdc) return EmergencyReplay::kSdc;
  const bool all = std::all_of(accepted.begin(), accepted.end(), [](bool ok) { return ok; });
  return worst <= Outcome::kStraggler && all ? EmergencyReplay::kClean : EmergencyReplay::kIncomplete;
}

std::string_view name(BoundaryAction action) noexcept {
  switch (action) {
    case BoundaryAction::kSkip: return "skip";
    case BoundaryAction::kCapture: return "capture";
    case BoundaryAction::kObserve: return "observe";
  }
  return "?";
}

Certifier::Certifier(std::vector<std::string> catalog, Manifest manifest, std::int64_t completed, bool dynamic,
                     std::int64_t latest_interval)
    : catalog_(std::move(catalog)),
      catalog_set_(catalog_.begin(), catalog_.end()),
      dynamic_(dynamic),
      latest_interval_(latest_interval),
      manifest_(std::move(manifest)) {
  if (catalog_set_.empty()) throw InvalidArgument("a certification catalog needs at least one recipe");
  if (catalog_set_.size() != catalog_.size()) throw InvalidArgument("the certification catalog repeats a recipe");
  if (completed < 0) throw InvalidArgument("completed steps must be >= 0");
  if (latest_interval < 0) throw InvalidArgument("latest_interval must be >= 0");
  abandoned_ = continueFrom(manifest_, completed);
  last_step_ = completed;
}

std::vector<std::string> Certifier::rejectUntrusted(const std::string& reason, std::int64_t after_step) {
  std::vector<std::string> out;
  for (auto& c : manifest_.checkpoints) {
    const bool untrusted = c.state == TrustState::kLatest || c.state == TrustState::kCandidate;
    const bool abandoned = c.step > after_step && c.state != TrustState::kRejected;
    if (untrusted || abandoned) {
      c.state = TrustState::kRejected;
      c.reason = reason;
      out.push_back(c.id);
    }
  }
  return out;
}

BoundaryAction Certifier::atBoundary(const BoundaryFacts& f) const {
  if (f.checked) return BoundaryAction::kObserve;
  // A corrupted replica stays diverged: once tainted, a later finding adds nothing.
  if (f.integrity_sdc_everywhere && !manifest_.tainted_since) return BoundaryAction::kObserve;
  const bool due = latest_interval_ > 0 && f.step % latest_interval_ == 0;
  return due ? BoundaryAction::kCapture : BoundaryAction::kSkip;
}

Changes Certifier::observe(const CheckOutcome& o) {
  if (o.step < last_step_)
    throw InvalidArgument("check after step " + std::to_string(o.step) + " comes after step " +
                          std::to_string(last_step_));
  last_step_ = o.step;
  Changes ch;
  const std::string at = " at step " + std::to_string(o.step);
  auto& cap = ch.capture;
  if (o.outcome == Outcome::kSdc) {
    if (!manifest_.tainted_since) manifest_.tainted_since = o.step;
    covered_.clear();
    // Every checkpoint that no complete cycle validated may hold the fault: none is kept.
    ch.rejected = rejectUntrusted("SDC detected" + at + (o.reason.empty() ? "" : ": " + o.reason), o.step);
    cap.reason = "rejected: SDC detected" + at;
    ch.recover = manifest_.tainted_since == o.step;
    return ch;
  }
  if (manifest_.tainted_since) {
    cap.reason = "rejected: the state is tainted by SDC detected at step " + std::to_string(*manifest_.tainted_since) +
                 " until the job recovers";
    return ch;
  }
  if (o.outcome == Outcome::kInconclusive) {
    cap.reason = "rejected: inconclusive exact evidence" + at + (o.reason.empty() ? "" : ": " + o.reason);
    return ch;
  }
  cap.performance_fault = o.outcome == Outcome::kStraggler;
  std::size_t this_check = 0;
  for (const auto& r : o.accepted_recipes) {
    if (catalog_set_.count(r)) {
      covered_.insert(r);
      ++this_check;
    }
  }
  const bool dense = !dynamic_ && this_check == catalog_set_.size();
  if (covered_.size() < catalog_set_.size()) {
    cap.latest = true;
    cap.snapshot = latest_interval_ > 0 && o.step % latest_interval_ == 0;
    cap.reason = "accepted" + at + "; cycle " + std::to_string(covered_.size()) + "/" +
                 std::to_string(catalog_set_.size()) + " recipes";
    return ch;
  }
  covered_.clear();
  for (auto& c : manifest_.checkpoints) {
    if (c.state == TrustState::kCandidate && c.step < o.step) {
      c.state = TrustState::kRecoveryVerified;
      c.certified_at = o.step;
      c.reason = "promoted: the cycle ending" + at + " was accepted";
      ch.promoted.push_back(c.id);
    }
  }
  cap.durable = true;
  cap.latest = true;
  // A completed cycle's capture is the one that can become RECOVERY_VERIFIED: with a fast tier
  // it is taken there too, whatever the interval, so an SDC rollback can read it from there.
  cap.snapshot = latest_interval_ > 0;
  cap.state = dense ? TrustState::kRecoveryVerified : TrustState::kCandidate;
  cap.reason = dense ? "dense check accepted" + at : "catalog cycle complete and accepted" + at;
  return ch;
}

CaptureDecision Certifier::boundary(std::int64_t step) const {
  CaptureDecision cap;
  if (manifest_.tainted_since) {
    cap.reason = "rejected: the state is tainted by SDC detected at step " + std::to_string(*manifest_.tainted_since);
    return cap;
  }
  cap.latest = true;
  cap.snapshot = latest_interval_ > 0 && step % latest_interval_ == 0;
  cap.reason = "no check at step " + std::to_string(step);
  return cap;
}

std::vector<std::string> Certifier::captured(Checkpoint checkpoint) {
  if (manifest_.find(checkpoint.id)) throw InvalidArgument("checkpoint id \"" + checkpoint.id + "\" already exists");
  if (!manifest_.checkpoints.empty() && checkpoint.step < manifest_.checkpoints.back().step)
    throw InvalidArgument("checkpoint \"" + checkpoint.id + "\" at step " + std::to_string(checkpoint.step) +
                          " is older than the last one (step " + std::to_string(manifest_.checkpoints.back().step) +
                          ")");
  if (checkpoint.state == TrustState::kCandidate || checkpoint.state == TrustState::kRecoveryVerified)
    checkpoint.certified_at = checkpoint.step;
  std::vector<std::string> commit;
  if (checkpoint.state == TrustState::kRecoveryVerified) commit.push_back(checkpoint.id);
  manifest_.checkpoints.push_back(std::move(checkpoint));
  return commit;
}

bool Certifier::removed(const std::string& id) {
  const auto& d = manifest_.decision;
  if (d && d->status == "pending" && d->checkpoint_id == id) return false;
  auto& list = manifest_.checkpoints;
  list.erase(std::remove_if(list.begin(), list.end(), [&](const Checkpoint& c) { return c.id == id; }), list.end());
  return true;
}

std::vector<Checkpoint> Certifier::snapshots() const {
  std::vector<Checkpoint> out;
  for (const auto& c : manifest_.checkpoints)
    if (c.tier == Tier::kLatest && c.state != TrustState::kRejected) out.push_back(c);
  return out;
}

std::vector<Checkpoint> Certifier::recovered(const std::string& id) {
  auto out = applyRecovery(manifest_, id);
  covered_.clear();
  last_step_ = manifest_.find(id)->step;
  return out;
}

}  // namespace lmr::ckpt
