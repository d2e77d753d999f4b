#include "lmr/campaign/schedule.h"

#include <algorithm>
#include <charconv>
#include <limits>

#include "lmr/common/error.h"
#include "lmr/common/keyed_hash.h"

namespace lmr::campaign {

bool isSelected(const Campaign& campaign, const Incident& incident, std::int64_t position) {
  if (incident.trigger.probability >= 1.0) return true;
  if (incident.trigger.probability <= 0.0) return false;
  return keyedUniform(campaign.seed(), "campaign.select", {incident.incident_id}, position) <
         incident.trigger.probability;
}

std::string occurrenceId(std::string_view incident_id, std::int64_t position, std::int64_t attempt) {
  std::string id(incident_id);
  id += '@';
  id += std::to_string(position);
  if (attempt > 1) {
    id += '#';
    id += std::to_string(attempt);
  }
  return id;
}

std::string injectionId(std::string_view occurrence_id, std::string_view fault_id) {
  return std::string(occurrence_id) + "/" + std::string(fault_id);
}

namespace {

// A positive decimal without leading zeros.
std::optional<std::int64_t> parsePositive(std::string_view digits) {
  if (digits.empty() || digits[0] == '0') return std::nullopt;
  std::int64_t v = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || end != digits.data() + digits.size() || v <= 0) return std::nullopt;
  return v;
}

}  // namespace

OccurrenceKey parseOccurrenceId(std::string_view text) {
  const auto bad = [&](const char* why) -> OccurrenceKey {
    throw InvalidArgument("occurrence id \"" + std::string(text) + "\": " + why);
  };
  const std::size_t at = text.rfind('@');
  if (at == std::string_view::npos || at == 0) return bad("expected <incident_id>@<iteration>[#<attempt>]");
  OccurrenceKey key;
  key.incident_id = std::string(text.substr(0, at));
  std::string_view rest = text.substr(at + 1);
  if (const std::size_t hash = rest.find('#'); hash != std::string_view::npos) {
    auto attempt = parsePositive(rest.substr(hash + 1));
    if (!attempt || *attempt < 2) return bad("the attempt after '#' must be an integer >= 2 without leading zeros");
    key.attempt = *attempt;
    rest = rest.substr(0, hash);
  }
  auto position = parsePositive(rest);
  if (!position) return bad("the iteration must be a positive integer without leading zeros");
  key.position = *position;
  return key;
}

Schedule::Schedule(std::shared_ptr<const Campaign> campaign, std::int64_t origin_offset,
                   std::int64_t completed_iterations)
    : campaign_(std::move(campaign)), origin_offset_(origin_offset) {
  if (!campaign_) throw InvalidArgument("Schedule needs a campaign");
  if (origin_offset < 0) throw InvalidArgument("Schedule origin offset must be >= 0");
  rewind(completed_iterations);
}

void Schedule::seek(std::size_t incident, std::int64_t after_absolute) {
  const Trigger& t = campaign_->incidents()[incident].trigger;
  const __int128 from = static_cast<__int128>(after_absolute) - origin_offset_ + 1;
  if (from > std::numeric_limits<std::int64_t>::max()) return;
  auto next = t.firstAtOrAfter(static_cast<std::int64_t>(std::max<__int128>(from, 1)));
  if (!next) return;
  const __int128 absolute = static_cast<__int128>(*next) + origin_offset_;
  if (absolute > std::numeric_limits<std::int64_t>::max()) return;  // beyond any reachable iteration
  heap_.emplace(static_cast<std::int64_t>(absolute), incident);
}

void Schedule::rewind(std::int64_t completed_iterations) {
  if (completed_iterations < 0) throw InvalidArgument("completed iterations must be >= 0");
  heap_ = {};
  for (std::size_t i = 0; i < campaign_->incidents().size(); ++i) seek(i, completed_iterations);
}

std::optional<std::int64_t> Schedule::nextDue() const {
  if (heap_.empty()) return std::nullopt;
  return heap_.top().first;
}

std::vector<Candidate> Schedule::dueAt(std::int64_t iteration) {
  std::vector<Candidate> due;
  while (!heap_.empty() && heap_.top().first <= iteration) {
    const auto [at, incident] = heap_.top();
    heap_.pop();
    if (at == iteration) {
      const Incident& inc = campaign_->incidents()[incident];
      const std::int64_t position = at - origin_offset_;
      due.push_back(Candidate{incident, position, at, isSelected(*campaign_, inc, position)});
      seek(incident, at);
    } else {
      seek(incident, iteration - 1);  // a skipped iteration: catch up
    }
  }
  std::sort(due.begin(), due.end(), [](const Candidate& a, const Candidate& b) { return a.incident < b.incident; });
  return due;
}

void forEachCandidate(const Campaign& campaign, std::int64_t origin_offset, std::int64_t after, std::int64_t through,
                      const std::function<void(const Candidate&)>& visit) {
  Schedule schedule(std::shared_ptr<const Campaign>(&campaign, [](const Campaign*) {}), origin_offset, after);
  while (auto next = schedule.nextDue()) {
    if (*next > through) break;
    for (const Candidate& c : schedule.dueAt(*next)) visit(c);
  }
}

}  // namespace lmr::campaign
