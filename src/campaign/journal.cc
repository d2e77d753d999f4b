#include "lmr/campaign/journal.h"

#include "lmr/campaign/schedule.h"
#include "lmr/common/error.h"

namespace lmr::campaign {

Journal Journal::fromJson(const Json& j, std::string_view source) {
  try {
    json::requireKnownKeys(j, "", {"campaign", "manifest_identity", "attempts"});
    Journal out;
    out.campaign = json::asIdentifier(json::requireMember(j, "", "campaign"), "campaign");
    out.manifest_identity = json::asIdentifier(json::requireMember(j, "", "manifest_identity"), "manifest_identity");
    const Json& attempts = json::requireMember(j, "", "attempts");
    json::requireObject(attempts, "attempts");
    for (const auto& [key, count] : attempts.items()) {
      const std::string path = json::child("attempts", key);
      OccurrenceKey parsed;
      try {
        parsed = parseOccurrenceId(key);
      } catch (const InvalidArgument& e) {
        json::fail(path, "not a candidate key <incident_id>@<iteration>: " + e.message());
      }
      if (parsed.attempt != 1) json::fail(path, "a candidate key has no '#<attempt>' suffix");
      out.attempts[key] = json::asPositiveInteger(count, path);
    }
    return out;
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string(source) + ": " + e.message());
  }
}

Journal Journal::parse(std::string_view text, std::string_view source) {
  return fromJson(json::parse(text, source).value, source);
}

Journal Journal::fresh(const Campaign& campaign) { return Journal{campaign.name(), campaign.identity(), {}}; }

Json Journal::toJson() const {
  Json a = Json::object();
  for (const auto& [k, v] : attempts) a[k] = v;
  return Json{{"campaign", campaign}, {"manifest_identity", manifest_identity}, {"attempts", a}};
}

std::string Journal::dump() const { return json::canonical(toJson()); }

std::int64_t Journal::attemptsAt(std::string_view incident_id, std::int64_t position) const {
  auto it = attempts.find(occurrenceId(incident_id, position));
  return it == attempts.end() ? 0 : it->second;
}

void checkJournalBinding(const Journal& journal, const Campaign& campaign) {
  if (journal.campaign != campaign.name()) {
    throw InvalidArgument("journal belongs to campaign \"" + journal.campaign + "\", not \"" + campaign.name() + "\"");
  }
  if (journal.manifest_identity != campaign.identity()) {
    throw InvalidArgument("journal is stale: it was written for another version of campaign \"" + campaign.name() +
                          "\" (" + journal.manifest_identity + ", the manifest is " + campaign.identity() +
                          "); an edited manifest needs a new state file");
  }
  for (const auto& [key, count] : journal.attempts) {
    const OccurrenceKey k = parseOccurrenceId(key);
    const Incident* inc = campaign.findIncident(k.incident_id);
    const std::string path = json::child("attempts", key);
    if (inc == nullptr) json::fail(path, "names no incident of the manifest");
    if (!inc->trigger.isCandidate(k.position)) json::fail(path, "is not a trigger candidate of that incident");
    const bool too_many = (inc->retrigger == Retrigger::kOnce && count > 1) ||
                          (inc->retrigger == Retrigger::kMaxOccurrences && count > inc->max_occurrences);
    if (too_many) json::fail(path, "records more attempts than the retrigger policy allows");
  }
}

std::optional<std::int64_t> nextAttempt(const Incident& incident, std::int64_t position, const Journal& journal) {
  const std::int64_t done = journal.attemptsAt(incident.incident_id, position);
  switch (incident.retrigger) {
    case Retrigger::kOnce:
      if (done >= 1) return std::nullopt;
      break;
    case Retrigger::kMaxOccurrences:
      if (done >= incident.max_occurrences) return std::nullopt;
      break;
    case Retrigger::kEveryAttempt: break;
  }
  return done + 1;
}

Journal withAttempt(Journal journal, std::string_view incident_id, std::int64_t position, std::int64_t attempt) {
  if (attempt < 1) throw InvalidArgument("an attempt count must be positive");
  journal.attempts[occurrenceId(incident_id, position)] = attempt;
  return journal;
}

void checkJournalSwap(const std::optional<Journal>& expected, const Journal& updated) {
  if (expected && expected->campaign != updated.campaign) {
    throw InvalidArgument("compare_and_swap across campaigns (\"" + expected->campaign + "\" -> \"" + updated.campaign +
                          "\") is not allowed");
  }
  Journal::fromJson(updated.toJson(), "updated journal");  // same validation as a loaded one
}

std::optional<Journal> MemoryStateStore::load() {
  MutexLock lock(mu_);
  return journal_;
}

bool MemoryStateStore::compareAndSwap(const std::optional<Journal>& expected, const Journal& updated) {
  checkJournalSwap(expected, updated);
  MutexLock lock(mu_);
  if (journal_ != expected) return false;
  journal_ = updated;
  return true;
}

}  // namespace lmr::campaign
