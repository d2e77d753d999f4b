#include "lmr/replay/replay.h"

#include <algorithm>

#include "lmr/common/error.h"
#include "lmr/common/sha256.h"

namespace lmr::replay {

std::vector<std::string> Plan::recipeIds() const {
  std::vector<std::string> ids;
  if (embedding) ids.push_back("embedding");
  if (hidden_layer) ids.push_back("hidden." + std::to_string(*hidden_layer));
  if (output) ids.push_back("output");
  if (optimizer_slice) ids.push_back("optimizer." + std::to_string(*optimizer_slice));
  return ids;
}

Intervals effectiveIntervals(const Cadence& c, std::int64_t layers) {
  if (layers < 1) throw InvalidArgument("replay needs at least one hidden layer");
  auto check = [](std::int64_t v, const char* name) {
    if (v < -1) throw InvalidArgument(std::string(name) + " must be -1 (inherit), 0 (off) or positive");
  };
  if (c.check_interval < 0) throw InvalidArgument("check_interval must be >= 0 (0: manual checks only)");
  check(c.embedding_interval, "embedding_interval");
  check(c.hidden_interval, "hidden_interval");
  check(c.output_interval, "output_interval");
  check(c.optimizer_interval, "optimizer_interval");
  auto pick = [&](std::int64_t v) { return v == -1 ? c.check_interval : v; };
  std::int64_t hidden = pick(c.hidden_interval);
  if (c.hidden_interval == -1 && hidden > 0) hidden = std::max<std::int64_t>(1, std::min(hidden, 100 / layers));
  return Intervals{pick(c.embedding_interval), hidden, pick(c.output_interval), pick(c.optimizer_interval)};
}

Plan planAt(const Cadence& cadence, std::int64_t step, std::int64_t layers, std::int64_t slices) {
  if (step < 1) throw InvalidArgument("replay steps are 1-based");
  if (slices < 1) throw InvalidArgument("optimizer replay needs at least one slice");
  const Intervals iv = effectiveIntervals(cadence, layers);
  Plan p;
  p.embedding = iv.embedding > 0 && step % iv.embedding == 0;
  if (iv.hidden > 0 && step % iv.hidden == 0) p.hidden_layer = (step / iv.hidden - 1) % layers;
  p.output = iv.output > 0 && step % iv.output == 0;
  if (iv.optimizer > 0 && step % iv.optimizer == 0) p.optimizer_slice = (step / iv.optimizer - 1) % slices;
  return p;
}

Plan fullPlan(std::int64_t step, std::int64_t layers, std::int64_t slices) {
  if (layers < 1 || slices < 1) throw InvalidArgument("a full plan needs layers and slices");
  Plan p;
  p.embedding = true;
  p.hidden_layer = std::max<std::int64_t>(step - 1, 0) % layers;
  p.output = true;
  p.optimizer_slice = std::max<std::int64_t>(step - 1, 0) % slices;
  return p;
}

std::string contractDigest(const std::vector<std::string>& fields) {
  Sha256 h;
  h.update("lmr.replay.contract.v1");
  h.updateU64(fields.size());
  for (const std::string& f : fields) h.updateU64(f.size()).update(f);
  const auto d = h.finish();
  return std::string(reinterpret_cast<const char*>(d.data()), 16);
}

StragglerTracker::StragglerTracker(StragglerOptions options) : options_(std::move(options)) {
  if (options_.confirmation_rounds < 1) throw InvalidArgument("confirmation_rounds must be >= 1");
  if (options_.temporal_window < 1) throw InvalidArgument("temporal_window must be >= 1");
}

StragglerTracker::Verdict StragglerTracker::observe(const std::string& recipe, std::int64_t step,
                                                    const std::vector<double>& seconds,
                                                    const std::vector<std::int64_t>& peer_ranks) {
  Verdict v;
  v.check = consensus::timing(seconds, options_.timing, peer_ranks);
  v.confirmed.assign(seconds.size(), false);
  for (std::size_t i = 0; i < seconds.size(); ++i) {
    const std::int64_t rank = v.check.peer_ranks[i];
    Streak& s = streaks_[{recipe, rank}];
    const bool outlier = v.check.status == consensus::Status::kAttributed && v.check.bitmap[i];
    if (!outlier) {
      s = Streak{};
      continue;
    }
    if (s.count == 0 || step - s.first_step >= options_.temporal_window) s = Streak{0, step};
    ++s.count;
    v.confirmed[i] = s.count >= options_.confirmation_rounds;
  }
  return v;
}

}  // namespace lmr::replay
