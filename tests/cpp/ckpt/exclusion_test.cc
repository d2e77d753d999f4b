#include "lmr/ckpt/exclusion.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "lmr/ckpt/recovery.h"
#include "lmr/common/error.h"

namespace lmr::ckpt {
namespace {

Blame blameOn(BlameKind kind, std::string host, std::int64_t step, std::int64_t generation, bool confirmed = true) {
  Blame b;
  b.kind = kind;
  b.ranks = {2};
  b.hosts = {std::move(host)};
  b.sources = {"hidden.1.output"};
  b.step = step;
  b.generation = generation;
  b.confirmed = confirmed;
  return b;
}

std::string failureOf(auto&& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "";
}

// The broken-GPU case: the first SDC rolls back, the same host blamed again after the
// rollback is excluded, and a later fault on another host only rolls back.
TEST(Exclusion, AnSdcThatComesBackAfterARollbackExcludesItsHost) {
  ExclusionLedger ledger;
  const RecoveryPolicy policy;
  ExclusionDecision d = decideExclusion(policy, ledger, blameOn(BlameKind::kSdc, "node-b", 12, 0), 3);
  EXPECT_EQ(d.action, Action::kRollback);
  EXPECT_EQ(d.occurrence, 1);
  EXPECT_TRUE(d.exclude.empty());
  d = decideExclusion(policy, ledger, blameOn(BlameKind::kSdc, "node-b", 12, 1), 3);
  EXPECT_EQ(d.action, Action::kExcludeAndRollback);
  EXPECT_EQ(d.exclude, std::vector<std::string>{"node-b"});
  EXPECT_EQ(d.occurrence, 2);
  EXPECT_TRUE(ledger.isExcluded("node-b"));
  ASSERT_EQ(ledger.excluded.size(), 1u);
  EXPECT_EQ(ledger.excluded[0].generation, 1);
  EXPECT_EQ(decideExclusion(policy, ledger, blameOn(BlameKind::kSdc, "node-a", 30, 2), 2).action, Action::kRollback);
  EXPECT_EQ(ledger.history.size(), 3u);
  EXPECT_EQ(ledger.decisions.size(), 3u);
  // A host already excluded cannot be blamed again: the caller has stale evidence.
  EXPECT_NE(failureOf([&] {
              decideExclusion(policy, ledger, blameOn(BlameKind::kSdc, "node-b", 31, 2), 2);
            }).find("already excluded"),
            std::string::npos);
}

TEST(Exclusion, InconclusiveEvidenceAndATransientFaultExcludeNobody) {
  ExclusionLedger ledger;
  RecoveryPolicy policy;
  policy.sdc_exclude_after = 1;
  EXPECT_EQ(decideExclusion(policy, ledger, blameOn(BlameKind::kSdc, "node-b", 5, 0, false), 3).action,
            Action::kRollback);
  EXPECT_EQ(decideExclusion(policy, ledger, blameOn(BlameKind::kHealth, "node-b", 5, 0, false), 3).action,
            Action::kWarn);
  EXPECT_TRUE(ledger.excluded.empty());
  // Unconfirmed blames do not count towards a later confirmed one.
  policy.sdc_exclude_after = 2;
  EXPECT_EQ(decideExclusion(policy, ledger, blameOn(BlameKind::kSdc, "node-b", 9, 1), 3).action, Action::kRollback);
}

TEST(Exclusion, EachKindFollowsItsRule) {
  RecoveryPolicy policy;
  ExclusionLedger ledger;
  for (int i = 0; i < 4; ++i)  // stragglers warn unless the policy opts in
    EXPECT_EQ(decideExclusion(policy, ledger, blameOn(BlameKind::kComputeStraggler, "node-c", 10 + i, 0), 3).action,
              Action::kWarn);
  policy.straggler_exclude = true;
  policy.straggler_exclude_after = 2;
  ExclusionLedger opted;
  EXPECT_EQ(decideExclusion(policy, opted, blameOn(BlameKind::kCommStraggler, "node-c", 10, 0), 3).action,
            Action::kWarn);
  EXPECT_EQ(decideExclusion(policy, opted, blameOn(BlameKind::kCommStraggler, "node-c", 11, 0), 3).action,
            Action::kExcludeAndRollback);

  ExclusionLedger health;  // a fatal event at once, a non-fatal one never
  Blame event = blameOn(BlameKind::kHealth, "node-d", 7, 0);
  EXPECT_EQ(decideExclusion(policy, health, event, 3).action, Action::kWarn);
  event.fatal = true;
  event.sources = {"xid:79"};
  EXPECT_EQ(decideExclusion(policy, health, event, 3).action, Action::kExcludeAndRollback);

  ExclusionLedger hang;  // a hang culprit on recurrence; other kinds do not count towards it
  EXPECT_EQ(decideExclusion(policy, hang, blameOn(BlameKind::kSdc, "node-e", 3, 0), 3).action, Action::kRollback);
  EXPECT_EQ(decideExclusion(policy, hang, blameOn(BlameKind::kHang, "node-e", 4, 1), 3).action, Action::kRollback);
  EXPECT_EQ(decideExclusion(policy, hang, blameOn(BlameKind::kHang, "node-e", 4, 2), 3).action,
            Action::kExcludeAndRollback);
}

TEST(Exclusion, TheLimitsEscalateInsteadOfLooping) {
  RecoveryPolicy policy;
  ExclusionLedger one_node;  // one node: nothing to exclude down to
  decideExclusion(policy, one_node, blameOn(BlameKind::kSdc, "solo", 8, 0), 1);
  ExclusionDecision d = decideExclusion(policy, one_node, blameOn(BlameKind::kSdc, "solo", 8, 1), 1);
  EXPECT_EQ(d.action, Action::kEscalate);
  EXPECT_NE(d.reason.find("fewer than min_nodes=1"), std::string::npos) << d.reason;
  EXPECT_TRUE(one_node.excluded.empty());

  ExclusionLedger budget;  // max_excluded spent
  policy.sdc_exclude_after = 1;
  EXPECT_EQ(decideExclusion(policy, budget, blameOn(BlameKind::kSdc, "node-a", 1, 0), 4).action,
            Action::kExcludeAndRollback);
  d = decideExclusion(policy, budget, blameOn(BlameKind::kSdc, "node-b", 2, 1), 3);
  EXPECT_EQ(d.action, Action::kEscalate);
  EXPECT_NE(d.reason.find("max_excluded=1"), std::string::npos) << d.reason;

  ExclusionLedger unknown;  // nobody knows where the blamed rank runs
  Blame nowhere = blameOn(BlameKind::kSdc, "x", 3, 0);
  nowhere.hosts.clear();
  EXPECT_EQ(decideExclusion(policy, unknown, nowhere, 3).action, Action::kEscalate);

  // The loop guard: the same rollback for the same culprit max_identical times escalates.
  RecoveryPolicy patient;
  patient.sdc_exclude_after = 10;
  ExclusionLedger loop;
  EXPECT_EQ(decideExclusion(patient, loop, blameOn(BlameKind::kSdc, "node-b", 12, 0), 3).action, Action::kRollback);
  EXPECT_EQ(decideExclusion(patient, loop, blameOn(BlameKind::kSdc, "node-b", 12, 1), 3).action, Action::kRollback);
  d = decideExclusion(patient, loop, blameOn(BlameKind::kSdc, "node-b", 12, 2), 3);
  EXPECT_EQ(d.action, Action::kEscalate);
  EXPECT_NE(d.reason.find("3 times in a row"), std::string::npos) << d.reason;
}

TEST(Exclusion, PolicyAndLedgerAreStrictJsonThatRoundTrips) {
  RecoveryPolicy p = parsePolicy(R"({"sdc_exclude_after": 1, "straggler_exclude": true, "min_nodes": 2})");
  EXPECT_EQ(p.sdc_exclude_after, 1);
  EXPECT_TRUE(p.straggler_exclude);
  EXPECT_EQ(p.min_nodes, 2);
  EXPECT_EQ(p.max_excluded, RecoveryPolicy{}.max_excluded);
  EXPECT_EQ(parsePolicy(toJson(p)), p);
  EXPECT_NE(failureOf([] { parsePolicy(R"({"exclude_after": 1})"); }).find("exclude_after"), std::string::npos);
  EXPECT_NE(failureOf([] { parsePolicy(R"({"min_nodes": 0})"); }).find("policy.min_nodes must be >= 1"),
            std::string::npos);
  EXPECT_NE(failureOf([] { parsePolicy(R"({"straggler_exclude": "yes"})"); }).find("straggler_exclude"),
            std::string::npos);

  ExclusionLedger ledger;
  decideExclusion(RecoveryPolicy{}, ledger, blameOn(BlameKind::kSdc, "node-b", 12, 0), 3);
  decideExclusion(RecoveryPolicy{}, ledger, blameOn(BlameKind::kSdc, "node-b", 12, 1), 3);
  EXPECT_EQ(parseLedger(toJson(ledger)), ledger);
  std::string text = toJson(ledger, -1);
  std::string twice = text;
  const std::string entry = "\"excluded\":[";
  const auto at = twice.find(entry) + entry.size();
  const auto end = twice.find(']', twice.find("\"reason\"", at));
  twice.insert(end, "," + twice.substr(at, end - at));
  EXPECT_NE(failureOf([&] { parseLedger(twice); }).find("excluded[1].host: host \"node-b\" is listed twice"),
            std::string::npos)
      << failureOf([&] { parseLedger(twice); });
  std::string unknown = text;
  unknown.replace(unknown.find("\"kind\":\"sdc\"", unknown.find("\"history\"")), 12, "\"kind\":\"gpu\"");
  EXPECT_NE(failureOf([&] { parseLedger(unknown); }).find("history[0].kind: unknown value \"gpu\""), std::string::npos)
      << failureOf([&] { parseLedger(unknown); });
  EXPECT_NE(failureOf([&] { parseLedger(text.substr(0, text.size() / 2)); }), "");  // torn

  const auto dir = std::filesystem::temp_directory_path() / ("lmr-exclusion-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  EXPECT_EQ(readLedger(dir.string()), ExclusionLedger{});  // none yet: empty
  writeLedger(dir.string(), ledger);
  EXPECT_EQ(readLedger(dir.string()), ledger);
  EXPECT_EQ(ledgerPath(dir.string()), dir.string() + "/lmr-exclusions.json");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(name(Action::kExcludeAndRollback), "exclude_and_rollback");
  EXPECT_EQ(parseBlameKind("comm_straggler"), BlameKind::kCommStraggler);
  EXPECT_THROW(parseBlameKind("SDC"), InvalidArgument);
}

// The escalation reaches the recovery decision and the manifest, and every relaunch stops at
// once instead of rolling back again.
TEST(Exclusion, AnEscalationStopsEveryRelaunch) {
  Manifest m;
  m.topology = "t";
  m.checkpoints = {{"durable-4", 4, Tier::kDurable, TrustState::kRecoveryVerified, "/ck/4", "t", "", 4}};
  RecoveryDecision d = selectRecovery(m, Failure::kSdc, 12);
  ASSERT_TRUE(d.available && d.restart);
  EXPECT_EQ(d.action, "rollback");
  ExclusionLedger ledger;
  const Blame b = blameOn(BlameKind::kSdc, "solo", 12, 1);
  decideExclusion(RecoveryPolicy{}, ledger, blameOn(BlameKind::kSdc, "solo", 12, 0), 1);
  const ExclusionDecision e = decideExclusion(RecoveryPolicy{}, ledger, b, 1);
  ASSERT_EQ(e.action, Action::kEscalate);
  applyExclusion(d, e, b, m);
  EXPECT_EQ(d.action, "escalate");
  EXPECT_FALSE(d.restart);
  EXPECT_EQ(d.blamed_ranks, std::vector<std::int64_t>{2});
  EXPECT_EQ(d.blamed_hosts, std::vector<std::string>{"solo"});
  EXPECT_NE(d.reason.find("min_nodes"), std::string::npos) << d.reason;
  EXPECT_EQ(parseDecision(toJson(d)), d);
  m.decision = d;
  auto plan = planResume(m, "t", 1.0);
  ASSERT_TRUE(plan.has_value());
  EXPECT_TRUE(plan->stop);
  EXPECT_EQ(plan->decision.action, "escalate");
  Manifest released = m;  // the operator repaired the node: the next start rolls back as it would have
  ASSERT_TRUE(releaseEscalation(released));
  EXPECT_FALSE(releaseEscalation(released));
  plan = planResume(released, "t", 2.0);
  ASSERT_TRUE(plan.has_value());
  EXPECT_FALSE(plan->stop);
  EXPECT_EQ(plan->decision.checkpoint_id, "durable-4");
  EXPECT_EQ(plan->decision.action, "rollback");
  // A decision written before the field reads as a rollback; an unknown action is refused.
  std::string old = toJson(selectRecovery(m, Failure::kSdc, 12), -1);
  for (const char* field : {"\"action\":\"rollback\",", "\"blamed_hosts\":[],", "\"blamed_ranks\":[],"}) {
    ASSERT_NE(old.find(field), std::string::npos) << field;
    old.erase(old.find(field), std::string(field).size());
  }
  EXPECT_EQ(parseDecision(old).action, "rollback");
  std::string bad = toJson(d, -1);
  bad.replace(bad.find("\"escalate\""), 10, "\"exclude\"");
  EXPECT_NE(failureOf([&] { parseDecision(bad); }).find("action: unknown action \"exclude\""), std::string::npos)
      << failureOf([&] { parseDecision(bad); });
  // A warning changes nothing.
  RecoveryDecision untouched = selectRecovery(m, Failure::kStraggler, 12);
  const RecoveryDecision before = untouched;
  applyExclusion(untouched, ExclusionDecision{Action::kWarn, BlameKind::kComputeStraggler, {"solo"}, {}, 1, "warn"},
                 blameOn(BlameKind::kComputeStraggler, "solo", 12, 1), m);
  EXPECT_EQ(untouched, before);
}

// An exclusion resumes on other nodes: a fast-tier checkpoint (node-local per-rank files) gives
// way to the newest durable one, and with none the job escalates instead of failing its load.
TEST(Exclusion, AnExclusionResumesFromTheDurableTier) {
  Manifest m;
  m.topology = "t";
  m.checkpoints = {{"durable-4", 4, Tier::kDurable, TrustState::kRecoveryVerified, "/ck/4", "t", "", 4},
                   {"latest-9", 9, Tier::kLatest, TrustState::kRecoveryVerified, "", "t", "", 9}};
  ExclusionLedger ledger;
  RecoveryPolicy policy;
  policy.sdc_exclude_after = 1;
  const Blame b = blameOn(BlameKind::kSdc, "node-b", 12, 0);
  const ExclusionDecision e = decideExclusion(policy, ledger, b, 3);
  ASSERT_EQ(e.action, Action::kExcludeAndRollback);
  RecoveryDecision d = selectRecovery(m, Failure::kSdc, 12, EmergencyReplay::kNotRun, 5.0);
  ASSERT_EQ(d.checkpoint_id, "latest-9");
  applyExclusion(d, e, b, m);
  EXPECT_EQ(d.action, "exclude_and_rollback");
  EXPECT_EQ(d.checkpoint_id, "durable-4");
  EXPECT_EQ(d.tier, "durable");
  EXPECT_TRUE(d.restart);
  EXPECT_EQ(d.decided_time, 5.0);
  EXPECT_EQ(d.blamed_hosts, std::vector<std::string>{"node-b"});
  // The in-memory tier keeps the excluded node's snapshots on other nodes: the fast tier stays.
  RecoveryDecision replicated = selectRecovery(m, Failure::kSdc, 12, EmergencyReplay::kNotRun, 5.0);
  applyExclusion(replicated, e, b, m, true);
  EXPECT_EQ(replicated.action, "exclude_and_rollback");
  EXPECT_EQ(replicated.checkpoint_id, "latest-9");
  EXPECT_TRUE(replicated.restart);
  m.checkpoints.erase(m.checkpoints.begin());
  RecoveryDecision only_latest = selectRecovery(m, Failure::kSdc, 12);
  applyExclusion(only_latest, e, b, m);
  EXPECT_EQ(only_latest.action, "escalate");
  // A straggler's decision sends nobody away, unless it excludes.
  RecoveryPolicy slow;
  slow.straggler_exclude = true;
  slow.straggler_exclude_after = 1;
  ExclusionLedger slow_ledger;
  const Blame late = blameOn(BlameKind::kComputeStraggler, "node-c", 12, 0);
  const ExclusionDecision out = decideExclusion(slow, slow_ledger, late, 3);
  ASSERT_EQ(out.action, Action::kExcludeAndRollback);
  Manifest durable_only;
  durable_only.topology = "t";
  durable_only.checkpoints = {{"durable-4", 4, Tier::kDurable, TrustState::kRecoveryVerified, "/ck/4", "t", "", 4}};
  RecoveryDecision straggler = selectRecovery(durable_only, Failure::kStraggler, 12);
  ASSERT_FALSE(straggler.restart);
  applyExclusion(straggler, out, late, durable_only);
  EXPECT_TRUE(straggler.restart);
  EXPECT_EQ(straggler.action, "exclude_and_rollback");
  // What each culprit leads to: the failure of its decision, and whether the ranks leave now.
  const auto response = respondTo(out, false);
  EXPECT_EQ(response.failure, Failure::kStraggler);
  EXPECT_TRUE(response.leave);
  ExclusionDecision d2 = out;
  d2.action = Action::kEscalate;
  EXPECT_FALSE(respondTo(d2, false).leave);  // a slow node that cannot go keeps training
  d2.kind = BlameKind::kHealth;
  EXPECT_TRUE(respondTo(d2, true).leave);  // a dead device cannot go on
  EXPECT_EQ(respondTo(d2, true).failure, Failure::kInaccessible);
  d2.kind = BlameKind::kHang;
  d2.action = Action::kExcludeAndRollback;
  EXPECT_FALSE(respondTo(d2, false).leave);  // the hang's relaunch is not ours to start
  // Repaired and readmitted: it may join again, and blamed again it goes straight out.
  ASSERT_TRUE(readmit(ledger, "node-b"));
  EXPECT_FALSE(readmit(ledger, "node-b"));
  EXPECT_FALSE(ledger.isExcluded("node-b"));
  RecoveryPolicy twice;  // the default: the second blame excludes
  EXPECT_EQ(decideExclusion(twice, ledger, blameOn(BlameKind::kSdc, "node-b", 20, 2), 3).action,
            Action::kExcludeAndRollback);
  EXPECT_FALSE(only_latest.restart);
  EXPECT_NE(only_latest.reason.find("no durable RECOVERY_VERIFIED checkpoint"), std::string::npos)
      << only_latest.reason;
}

// Only a plain rollback after an SDC, with every process and communicator still sound and no
// node leaving, is carried out in the running processes; everything else relaunches.
TEST(Exclusion, OnlyAPlainSdcRollbackStaysInProcess) {
  Manifest m;
  m.topology = "t";
  m.checkpoints = {{"durable-4", 4, Tier::kDurable, TrustState::kRecoveryVerified, "/ck/4", "t", "", 4}};
  const RecoveryPolicy policy;
  EXPECT_TRUE(policy.in_process);
  RecoveryDecision sdc = selectRecovery(m, Failure::kSdc, 12);
  EXPECT_TRUE(rollsBackInProcess(sdc, policy));
  RecoveryPolicy off;
  off.in_process = false;
  EXPECT_FALSE(rollsBackInProcess(sdc, off));
  EXPECT_EQ(parsePolicy(R"({"in_process": false})").in_process, false);
  EXPECT_NE(failureOf([] { parsePolicy(R"({"in_process": 1})"); }).find("in_process"), std::string::npos);
  for (Failure f : {Failure::kInaccessible, Failure::kStraggler, Failure::kHang, Failure::kUncertain})
    EXPECT_FALSE(rollsBackInProcess(selectRecovery(m, f, 12), policy)) << name(f);
  EXPECT_FALSE(rollsBackInProcess(selectRecovery(Manifest{}, Failure::kSdc, 12), policy));  // nothing to load
  ExclusionLedger ledger;
  RecoveryPolicy once;
  once.sdc_exclude_after = 1;
  const Blame b = blameOn(BlameKind::kSdc, "node-b", 12, 0);
  RecoveryDecision excluded = selectRecovery(m, Failure::kSdc, 12);
  applyExclusion(excluded, decideExclusion(once, ledger, b, 3), b, m);
  ASSERT_EQ(excluded.action, "exclude_and_rollback");
  EXPECT_FALSE(rollsBackInProcess(excluded, policy));  // the node leaves: a relaunch
  RecoveryDecision escalated = selectRecovery(m, Failure::kSdc, 12);
  ExclusionLedger one_node;
  applyExclusion(escalated, decideExclusion(once, one_node, b, 1), b, m);
  ASSERT_EQ(escalated.action, "escalate");
  EXPECT_FALSE(rollsBackInProcess(escalated, policy));
}

TEST(EndsHang, StallsThatCannotResolveEndTheJobUnlessThePolicySaysWait) {
  const RecoveryPolicy policy;
  EXPECT_TRUE(policy.hang_relaunch);
  for (const char* kind :
       {"process_stall", "collective_desync", "unresponsive_rank", "group_stall", "inconclusive_stall"})
    EXPECT_TRUE(endsHang(kind, policy)) << kind;
  for (const char* kind : {"dataloader_stall", "checkpoint_io_stall", "oob_daemon_failure", "", "process"})
    EXPECT_FALSE(endsHang(kind, policy)) << kind;
  const RecoveryPolicy wait = parsePolicy(R"({"hang_relaunch": false})");
  EXPECT_FALSE(wait.hang_relaunch);
  EXPECT_FALSE(endsHang("process_stall", wait));
  EXPECT_EQ(parsePolicy(toJson(wait)), wait);
  EXPECT_NE(failureOf([] { parsePolicy(R"({"hang_relaunch": "no"})"); }).find("hang_relaunch"), std::string::npos);
}

}  // namespace
}  // namespace lmr::ckpt
