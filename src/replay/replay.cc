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
  if (moe_layer) ids.push_back("moe." + std::to_string(*moe_layer));
  return ids;
}

Intervals effectiveIntervals(const Cadence& c, std::int64_t layers, std::int64_t moe_layers) {
  if (layers < 1) throw InvalidArgument("replay needs at least one hidden layer");
  if (moe_layers < 0) throw InvalidArgument("MoE layers must be >= 0");
  auto check = [](std::int64_t v, const char* name) {
    if (v < -1) throw InvalidArgument(std::string(name) + " must be -1 (inherit), 0 (off) or positive");
  };
  if (c.check_interval < 0) throw InvalidArgument("check_interval must be >= 0 (0: manual checks only)");
  if (c.coverage_steps < 1) throw InvalidArgument("coverage_steps must be >= 1");
  check(c.embedding_interval, "embedding_interval");
  check(c.hidden_interval, "hidden_interval");
  check(c.output_interval, "output_interval");
  check(c.optimizer_interval, "optimizer_interval");
  check(c.moe_interval, "moe_interval");
  auto pick = [&](std::int64_t v) { return v == -1 ? c.check_interval : v; };
  // A rotating recipe's default interval visits each of its `count` items within coverage_steps.
  auto rotating = [&](std::int64_t v, std::int64_t count) {
    std::int64_t k = pick(v);
    if (v == -1 && k > 0) k = std::max<std::int64_t>(1, std::min(k, c.coverage_steps / count));
    return k;
  };
  return Intervals{pick(c.embedding_interval), rotating(c.hidden_interval, layers), pick(c.output_interval),
                   pick(c.optimizer_interval), moe_layers > 0 ? rotating(c.moe_interval, moe_layers) : 0};
}

Latency worstCaseLatency(const Cadence& cadence, std::int64_t layers, std::int64_t slices, std::int64_t moe_layers,
                         bool pipelined) {
  if (slices < 1) throw InvalidArgument("optimizer replay needs at least one slice");
  const Intervals iv = effectiveIntervals(cadence, layers, moe_layers);
  const std::int64_t late = pipelined ? 1 : 0;
  auto every = [&](std::int64_t interval, std::int64_t items) { return interval > 0 ? interval * items + late : 0; };
  Latency l;
  l.embedding = every(iv.embedding, 1);
  l.hidden = every(iv.hidden, layers);
  l.output = every(iv.output, 1);
  l.optimizer = every(iv.optimizer, slices);
  l.moe = every(iv.moe, moe_layers);
  l.modules = std::max({l.embedding, l.hidden, l.output, l.moe});
  return l;
}

namespace {

Plan masked(Plan p, PlanOptions options) {
  if (!options.modules) {
    p.embedding = p.output = false;
    p.hidden_layer.reset();
    p.moe_layer.reset();
  }
  if (!options.optimizer) p.optimizer_slice.reset();
  return p;
}

}  // namespace

Plan planAt(const Cadence& cadence, std::int64_t step, std::int64_t layers, std::int64_t slices,
            std::int64_t moe_layers, PlanOptions options) {
  if (step < 1) throw InvalidArgument("replay steps are 1-based");
  if (slices < 1) throw InvalidArgument("optimizer replay needs at least one slice");
  const Intervals iv = effectiveIntervals(cadence, layers, moe_layers);
  Plan p;
  p.embedding = iv.embedding > 0 && step % iv.embedding == 0;
  if (iv.hidden > 0 && step % iv.hidden == 0) p.hidden_layer = (step / iv.hidden - 1) % layers;
  p.output = iv.output > 0 && step % iv.output == 0;
  if (iv.optimizer > 0 && step % iv.optimizer == 0) p.optimizer_slice = (step / iv.optimizer - 1) % slices;
  if (iv.moe > 0 && step % iv.moe == 0) p.moe_layer = (step / iv.moe - 1) % moe_layers;
  return masked(p, options);
}

Plan fullPlan(std::int64_t step, std::int64_t layers, std::int64_t slices, std::int64_t moe_layers,
              PlanOptions options) {
  if (layers < 1 || slices < 1) throw InvalidArgument("a full plan needs layers and slices");
  if (moe_layers < 0) throw InvalidArgument("MoE layers must be >= 0");
  Plan p;
  p.embedding = true;
  p.hidden_layer = std::max<std::int64_t>(step - 1, 0) % layers;
  p.output = true;
  p.optimizer_slice = std::max<std::int64_t>(step - 1, 0) % slices;
  if (moe_layers > 0) p.moe_layer = std::max<std::int64_t>(step - 1, 0) % moe_layers;
  return masked(p, options);
}

std::vector<std::string> catalog(const Cadence& cadence, const std::vector<std::int64_t>& layer_ids,
                                 std::int64_t slices, const std::vector<std::int64_t>& moe_layer_ids) {
  if (layer_ids.empty() && moe_layer_ids.empty()) throw InvalidArgument("a catalog needs at least one layer");
  if (slices < 0) throw InvalidArgument("optimizer slices must be >= 0");
  const bool manual = cadence.check_interval == 0;
  const auto moe_layers = static_cast<std::int64_t>(moe_layer_ids.size());
  const Intervals iv =
      manual ? Intervals{1, 1, 1, 1, moe_layers > 0 ? 1 : 0}
             : effectiveIntervals(cadence, std::max<std::int64_t>(1, static_cast<std::int64_t>(layer_ids.size())),
                                  moe_layers);
  std::vector<std::string> out;
  if (iv.embedding > 0) out.emplace_back("embedding");
  if (iv.hidden > 0)
    for (std::int64_t id : layer_ids) out.push_back("hidden." + std::to_string(id));
  if (iv.output > 0) out.emplace_back("output");
  if (iv.optimizer > 0)
    for (std::int64_t s = 0; s < slices; ++s) out.push_back("optimizer." + std::to_string(s));
  if (iv.moe > 0)
    for (std::int64_t id : moe_layer_ids) out.push_back("moe." + std::to_string(id));
  return out;
}

bool isStateSource(std::string_view source) noexcept {
  const std::size_t dot = source.rfind('.');
  const std::string_view last = dot == std::string_view::npos ? source : source.substr(dot + 1);
  return last == "params" || last == "state";
}

std::string contractDigest(const std::vector<std::string>& fields) {
  Sha256 h;
  h.update("lmr.replay.contract.v1");
  h.updateU64(fields.size());
  for (const std::string& f : fields) h.updateU64(f.size()).update(f);
  const auto d = h.finish();
  return std::string(reinterpret_cast<const char*>(d.data()), 16);
}

StragglerOptions stragglerDefaults(bool host_clock) {
  StragglerOptions o;
  if (host_clock) o.timing.absolute_threshold = 0.020;
  return o;
}

CheckDefaults checkDefaults(bool host_clock) {
  CheckDefaults d;
  d.straggler = stragglerDefaults(host_clock);
  if (host_clock) {
    d.pipelined = false;
    d.timing_repeats = 3;
    d.state_integrity = false;
    d.comm_absolute_s = 0.020;
  }
  return d;
}

bool integrityAtRestByDefault(bool replicas, std::int64_t smallest_group) { return !replicas || smallest_group < 3; }

StragglerTracker::StragglerTracker(StragglerOptions options) : options_(std::move(options)) {
  if (options_.confirmation_rounds < 1) throw InvalidArgument("confirmation_rounds must be >= 1");
  if (options_.confirmation_checks < options_.confirmation_rounds)
    throw InvalidArgument("confirmation_checks must be >= confirmation_rounds");
  if (options_.temporal_window < 1) throw InvalidArgument("temporal_window must be >= 1");
}

double fastestRepetition(const std::vector<double>& repetitions) {
  if (repetitions.empty()) throw InvalidArgument("a peer's replay timing needs at least one repetition");
  return *std::min_element(repetitions.begin(), repetitions.end());
}

StragglerTracker::Verdict StragglerTracker::observe(const std::string& recipe, std::int64_t step,
                                                    const std::vector<std::vector<double>>& repetitions,
                                                    const std::vector<std::int64_t>& peer_ranks) {
  std::vector<double> seconds;
  seconds.reserve(repetitions.size());
  for (const auto& reps : repetitions) seconds.push_back(fastestRepetition(reps));
  return confirm(recipe, step, consensus::timing(seconds, options_.timing, peer_ranks));
}

StragglerTracker::Verdict StragglerTracker::confirm(const std::string& recipe, std::int64_t step,
                                                    consensus::TimingResult check) {
  const std::size_t n = check.peer_ranks.size();
  if (check.status == consensus::Status::kAttributed && check.bitmap.size() != n)
    throw InvalidArgument("a decided timing check needs a bitmap entry per peer");
  Verdict v;
  v.check = std::move(check);
  v.confirmed.assign(n, false);
  v.outlier_checks.assign(n, 0);
  const bool conclusive = v.check.status != consensus::Status::kInconclusive;
  for (std::size_t i = 0; i < n; ++i) {
    History& h = history_[{recipe, v.check.peer_ranks[i]}];
    const bool outlier = v.check.status == consensus::Status::kAttributed && v.check.bitmap[i];
    if (conclusive) {
      if (!outlier && h.confirmed) {
        h = History{};  // the episode ended: a new one needs fresh evidence
      } else {
        h.rounds.push_back(Round{step, outlier});
      }
    }
    while (!h.rounds.empty() && (static_cast<std::int64_t>(h.rounds.size()) > options_.confirmation_checks ||
                                 step - h.rounds.front().step >= options_.temporal_window))
      h.rounds.pop_front();
    for (const Round& r : h.rounds) v.outlier_checks[i] += r.outlier ? 1 : 0;
    v.confirmed[i] = outlier && v.outlier_checks[i] >= options_.confirmation_rounds;
    if (conclusive) h.confirmed = v.confirmed[i];
  }
  return v;
}

}  // namespace lmr::replay
