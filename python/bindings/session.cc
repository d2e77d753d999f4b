// Bindings of lmr::campaign::Session and the state stores it claims candidates in. Evidence
// crosses as JSON text; a store written in Python crosses as two callables over journal text.
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <functional>
#include <memory>

#include "bindings.h"
#include "lmr/campaign/session.h"
#include "lmr/common/error.h"

namespace nb = nanobind;

namespace lmr::python {
namespace {

using namespace lmr::campaign;

// A store implemented in Python (the CampaignStateStore protocol), as journal text.
class CallbackStateStore final : public StateStore {
 public:
  using Load = std::function<std::optional<std::string>()>;
  using Swap = std::function<bool(const std::optional<std::string>&, const std::string&)>;
  CallbackStateStore(Load load, Swap swap) : load_(std::move(load)), swap_(std::move(swap)) {}

  std::optional<Journal> load() override {
    std::optional<std::string> text = load_();
    if (!text) return std::nullopt;
    return Journal::parse(*text, "the state store's journal");
  }
  bool compareAndSwap(const std::optional<Journal>& expected, const Journal& updated) override {
    checkJournalSwap(expected, updated);
    return swap_(expected ? std::optional<std::string>(expected->dump()) : std::nullopt, updated.dump());
  }

 private:
  Load load_;
  Swap swap_;
};

Json evidence(const std::string& text, const char* what) { return json::parse(text, what).value; }

template <typename E>
E parsed(std::optional<E> (*parse)(std::string_view) noexcept, const std::string& s, const char* what) {
  auto v = parse(s);
  if (!v) throw InvalidArgument(std::string("unknown ") + what + " \"" + s + "\"");
  return *v;
}

}  // namespace

void registerSession(nb::module_& m) {
  nb::class_<CallbackStateStore, StateStore>(m, "CallbackStateStore")
      .def(nb::init<CallbackStateStore::Load, CallbackStateStore::Swap>(), nb::arg("load"),
           nb::arg("compare_and_swap"));

  nb::class_<ExecutorInfo>(m, "ExecutorInfo")
      .def(
          "__init__",
          [](ExecutorInfo* e, std::string name, const std::vector<std::string>& types, const std::string& max_safety,
             bool one_shot, bool completes_inline, const std::vector<std::string>& surfaces) {
            std::vector<FailureType> supported;
            for (const std::string& t : types) supported.push_back(parsed(parseFailureType, t, "failure type"));
            std::vector<Surface> on;
            for (const std::string& s : surfaces) on.push_back(parsed(parseSurface, s, "surface"));
            new (e) ExecutorInfo{
                std::move(name), std::move(supported), parsed(parseSafetyClass, max_safety, "safety class"),
                one_shot,        completes_inline,     std::move(on)};
          },
          nb::arg("name"), nb::arg("supported_types"), nb::arg("max_safety"), nb::arg("one_shot"),
          nb::arg("completes_inline"), nb::arg("supported_surfaces") = std::vector<std::string>{})
      .def_ro("name", &ExecutorInfo::name);

  nb::class_<Action>(m, "SessionAction")
      .def_ro("incident", &Action::incident)
      .def_ro("fault", &Action::fault)
      .def_ro("position", &Action::position)
      .def_ro("iteration", &Action::iteration)
      .def_ro("attempt", &Action::attempt)
      .def_ro("occurrence_id", &Action::occurrence_id)
      .def_ro("injection_id", &Action::injection_id)
      .def_ro("executor", &Action::executor);

  nb::class_<ArmPlan>(m, "ArmPlan").def_ro("actions", &ArmPlan::actions).def_ro("all_safe", &ArmPlan::all_safe);

  m.def(
      "activation_problem",
      [](const Campaign& c, std::size_t incident, bool one_shot, bool active) {
        return activationProblem(c.incidents().at(incident).lifetime, one_shot, active);
      },
      nb::arg("campaign"), nb::arg("incident"), nb::arg("one_shot"), nb::arg("active"));

  nb::class_<Session>(m, "Session")
      .def(
          "__init__",
          [](Session* s, std::shared_ptr<Campaign> c, std::shared_ptr<StateStore> store, std::int64_t rank,
             std::optional<std::int64_t> world,
             std::int64_t completed) { new (s) Session(std::move(c), std::move(store), rank, world, completed); },
          nb::arg("campaign"), nb::arg("store"), nb::arg("rank"), nb::arg("world").none(), nb::arg("completed"))
      .def(
          "prepare",
          [](Session& s, const std::vector<ExecutorInfo>& executors) {
            std::vector<std::tuple<std::size_t, std::size_t, std::optional<std::size_t>>> out;
            for (const Assignment& a : s.prepare(executors)) out.emplace_back(a.incident, a.fault, a.executor);
            return out;
          },
          "[(incident, fault, executor index or None for the built-in executor)] of this rank's faults.")
      .def(
          "set_placement",
          [](Session& s, const std::vector<std::pair<std::string, std::int64_t>>& places) {
            std::vector<RankPlace> placement;
            for (const auto& [host, local_rank] : places) placement.push_back({host, local_rank});
            s.setPlacement(std::move(placement));
          },
          nb::arg("placement"), "[(node id, local rank)] of every rank, for host-bound targets.")
      .def("execution_rank", &Session::executionRank, nb::arg("target"))
      .def("agreement_digest", &Session::agreementDigest)
      .def("start", &Session::start)
      .def_prop_ro("origin_offset", &Session::originOffset)
      .def("next_due", &Session::nextDue)
      .def("expired", &Session::expired, nb::arg("completed"))
      .def("observe", &Session::observe, nb::arg("completed"))
      .def("arm", &Session::arm, nb::arg("iteration"))
      .def(
          "activated",
          [](Session& s, const std::string& id, const std::string& executor, bool verified, const std::string& ev,
             const std::string& error, bool exhausted) {
            return s.activated(id, executor, verified, evidence(ev, "activation evidence"), error, exhausted);
          },
          nb::arg("injection_id"), nb::arg("executor"), nb::arg("verified"), nb::arg("evidence"), nb::arg("error"),
          nb::arg("exhausted"))
      .def(
          "activation_raised",
          [](Session& s, const std::string& id, const std::string& executor, const std::string& ev,
             const std::string& error) {
            s.activationRaised(id, executor, evidence(ev, "activation evidence"), error);
          },
          nb::arg("injection_id"), nb::arg("executor"), nb::arg("evidence"), nb::arg("error"))
      .def("abandon", &Session::abandon, nb::arg("injection_id"), nb::arg("reason"))
      .def(
          "settle",
          [](Session& s, const std::string& id, bool cancelled, const std::string& failed_reason, bool verified,
             const std::string& ev, const std::string& error, const std::optional<std::string>& deactivation) {
            std::optional<Json> d;
            if (deactivation) d = evidence(*deactivation, "deactivation evidence");
            s.settle(id, cancelled, failed_reason, verified, evidence(ev, "activation evidence"), error, d);
          },
          nb::arg("injection_id"), nb::arg("cancelled"), nb::arg("failed_reason"), nb::arg("verified"),
          nb::arg("evidence"), nb::arg("error"), nb::arg("deactivation").none())
      .def("replaced", &Session::replaced, nb::arg("injection_id"), nb::arg("completed"))
      .def(
          "armed_until",
          [](const Session& s, const std::string& until) { return s.armedUntil(parsed(parseUntil, until, "until")); },
          nb::arg("until"))
      .def("closing", &Session::closing, "[(injection_id, cancelled)] of every armed injection.")
      .def("armed_ids", &Session::armedIds)
      .def("records", &Session::records);
}

}  // namespace lmr::python
