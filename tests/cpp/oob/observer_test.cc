// Daemons as threads: each thread owns a progress record and an Observer; they share a
// store, as lmr-oobd processes do.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "lmr/common/error.h"
#include "lmr/common/files.h"
#include "lmr/oob/progress.h"
#include "lmr/oob/store.h"
#include "lmr/oob/wire.h"
#include "observer.h"

namespace lmr::oobd {
namespace {

using namespace std::chrono_literals;

// A store that remembers which thread read which key (the daemons are threads here).
class ReadRecordingStore : public oob::Store {
 public:
  explicit ReadRecordingStore(std::unique_ptr<oob::Store> inner) : inner_(std::move(inner)) {}
  void set(const std::string& key, const std::string& value) override { inner_->set(key, value); }
  bool claim(const std::string& key, const std::string& value) override { return inner_->claim(key, value); }
  std::optional<std::string> tryGet(const std::string& key) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      reads_.emplace_back(std::this_thread::get_id(), key);
    }
    return inner_->tryGet(key);
  }
  // The threads that read a key containing `part`.
  std::set<std::thread::id> readers(const std::string& part) {
    std::lock_guard<std::mutex> lock(mu_);
    std::set<std::thread::id> out;
    for (const auto& [thread, key] : reads_)
      if (key.find(part) != std::string::npos) out.insert(thread);
    return out;
  }
  // The most distinct keys containing `part` that any one thread read.
  std::size_t mostKeysReadByOne(const std::string& part) {
    std::lock_guard<std::mutex> lock(mu_);
    std::map<std::thread::id, std::set<std::string>> keys;
    for (const auto& [thread, key] : reads_)
      if (key.find(part) != std::string::npos) keys[thread].insert(key);
    std::size_t most = 0;
    for (const auto& [thread, read] : keys) most = std::max(most, read.size());
    return most;
  }

 private:
  std::unique_ptr<oob::Store> inner_;
  std::mutex mu_;
  std::vector<std::pair<std::thread::id, std::string>> reads_;
};

struct Group {
  // `per_host` daemons share each host name (hosts take consecutive members); `record`
  // wraps the store in a ReadRecordingStore (`recorder`).
  explicit Group(int n, const std::string& tag, bool tcp = false,
                 std::chrono::milliseconds warmup = std::chrono::milliseconds(300), int per_host = 1,
                 bool record = false, std::chrono::milliseconds join = std::chrono::milliseconds(500)) {
    dir =
        (std::filesystem::temp_directory_path() / ("lmr-observer-" + tag + "-" + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(dir);
    if (tcp) {
      server = std::make_unique<oob::TcpStoreServer>(0, "127.0.0.1", "job-token-0123456789");
      oob::TcpStoreOptions o;
      o.port = server->port();
      o.token = "job-token-0123456789";
      store = std::make_unique<oob::TcpStore>(o);
    } else {
      store = std::make_unique<oob::FileStore>(dir + "/rendezvous");
    }
    if (record) {
      auto wrapped = std::make_unique<ReadRecordingStore>(std::move(store));
      recorder = wrapped.get();
      store = std::move(wrapped);
    }
    for (int r = 0; r < n; ++r) {
      const std::string name = oob::segmentName(tag, 0, ::getpid(), "world", r);
      writers.push_back(std::make_unique<oob::ProgressWriter>(name, std::string(16, 'w')));
      ObserverOptions o;
      o.run_id = tag;
      o.token = "job-token-0123456789";
      o.group_ranks.resize(static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) o.group_ranks[static_cast<std::size_t>(i)] = 10 + i;  // global ranks
      o.index = r;
      o.host = "host-" + std::to_string(r / per_host);
      o.threshold = 300ms;
      o.warmup_threshold = warmup;
      o.join = join;
      o.gather = 2000ms;
      o.state_dir = dir;
      o.diagnosis.io_absolute_ns = 200'000'000;
      o.diagnosis.io_persistence_ns = 100'000'000;
      observers.push_back(std::make_unique<Observer>(o, *store, name));
    }
  }
  ~Group() { std::filesystem::remove_all(dir); }

  // Runs the given daemons' poll loops until each wrote a report (or `limit` passed).
  std::vector<std::optional<std::string>> run(const std::vector<int>& daemons, std::chrono::milliseconds limit = 10s) {
    std::vector<std::optional<std::string>> out(observers.size());
    std::vector<std::thread> threads;
    for (int d : daemons) {
      threads.emplace_back([&, d] {
        const auto end = std::chrono::steady_clock::now() + limit;
        while (!out[static_cast<std::size_t>(d)] && std::chrono::steady_clock::now() < end) {
          out[static_cast<std::size_t>(d)] = observers[static_cast<std::size_t>(d)]->poll();
          std::this_thread::sleep_for(20ms);
        }
      });
    }
    for (auto& t : threads) t.join();
    return out;
  }

  void setUpAll() {
    std::vector<std::thread> threads;
    for (auto& o : observers) threads.emplace_back([&] { o->setUp(std::chrono::steady_clock::now() + 5s); });
    for (auto& t : threads) t.join();
  }

  std::string dir;
  std::unique_ptr<oob::TcpStoreServer> server;
  std::unique_ptr<oob::Store> store;
  ReadRecordingStore* recorder = nullptr;
  std::vector<std::unique_ptr<oob::ProgressWriter>> writers;
  std::vector<std::unique_ptr<Observer>> observers;
};

nlohmann::json load(const std::optional<std::string>& path) {
  EXPECT_TRUE(path.has_value());
  return nlohmann::json::parse(files::readFile(*path).value());
}

// The keys of `store_dir` (a FileStore names each file by its key's hex) under `prefix`.
std::vector<std::string> keysUnder(const std::string& store_dir, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(store_dir)) {
    const std::string hex = entry.path().filename().string();
    std::string k;
    for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
      k += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
    if (k.rfind(prefix, 0) == 0) out.push_back(k);
  }
  return out;
}

void everyoneWaitsInAllReduce(Group& g, std::uint64_t sequence = 7) {
  for (auto& w : g.writers) {
    w->stepCompleted(12);
    w->collectiveEntered({1, 0, 99, 5, sequence});
  }
}

TEST(Observer, SkippedCollectiveIsReportedByEveryDaemon) {
  Group g(4, "desync");
  g.setUpAll();
  everyoneWaitsInAllReduce(g);
  g.writers[2]->collectiveEntered({1, 0, 99, 6, 8});  // rank 12 skipped one
  const auto paths = g.run({0, 1, 2, 3});
  for (const auto& p : paths) {
    const auto r = load(p);
    EXPECT_EQ(r["kind"], "collective_desync");
    EXPECT_EQ(r["ranks"], nlohmann::json::array({12}));
    EXPECT_EQ(r["hosts"], nlohmann::json::array({"host-2"}));
    EXPECT_EQ(r["scope"], "rank");
    EXPECT_EQ(r["round"], 1);
    EXPECT_EQ(r["step"], 12);
    EXPECT_GE(r["detection_latency_s"].get<double>(), 0.3);
  }
  // One report per stall: without progress, polling again writes nothing new.
  for (auto& o : g.observers) EXPECT_FALSE(o->poll());
}

TEST(Observer, ProcessStallOverTcpRendezvous) {
  Group g(4, "process", /*tcp=*/true);
  g.setUpAll();
  everyoneWaitsInAllReduce(g);
  g.writers[1]->stepCompleted(12);  // rank 11 stopped outside any collective
  const auto paths = g.run({0, 1, 2, 3});
  const auto r = load(paths[0]);
  EXPECT_EQ(r["kind"], "process_stall");
  EXPECT_EQ(r["ranks"], nlohmann::json::array({11}));
  EXPECT_GT(g.server->requests(), 0u);
}

TEST(Observer, DataLoaderStallNeedsAllThresholds) {
  Group g(4, "loader");
  g.setUpAll();
  for (auto& w : g.writers) {  // everyone's loader answers quickly...
    w->dataloaderBegin();
    w->dataloaderEnd();
  }
  everyoneWaitsInAllReduce(g);
  g.writers[3]->stepCompleted(12);
  g.writers[3]->dataloaderBegin();  // ...except rank 13's, which hangs
  const auto r = load(g.run({0, 1, 2, 3})[0]);
  EXPECT_EQ(r["kind"], "dataloader_stall");
  EXPECT_EQ(r["ranks"], nlohmann::json::array({13}));
}

TEST(Observer, MissingDaemonIsNamedNotWaitedOn) {
  Group g(4, "missing");
  g.setUpAll();
  everyoneWaitsInAllReduce(g);
  const auto start = std::chrono::steady_clock::now();
  const auto paths = g.run({0, 1, 2});  // the daemon of rank 13 never answers
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4s);
  const auto r = load(paths[1]);
  EXPECT_EQ(r["kind"], "unresponsive_rank");
  EXPECT_EQ(r["missing_ranks"], nlohmann::json::array({13}));
  EXPECT_EQ(r["hosts"], nlohmann::json::array({"host-3"}));
  // It turns up late: it adopts the round's report instead of starting a lone round.
  const auto late = g.run({3});
  EXPECT_EQ(load(late[3])["report_id"], r["report_id"]);
}

// What a broken or hostile token holder can put in the store: a membership, a round
// number, a stored report. Each is dropped with a log line; no daemon dies (they used to:
// std::stoll's exceptions escaped), and nothing is attributed from it.
TEST(Observer, AMalformedMembershipFailsTheRoundAndTheNextOneReports) {
  Group g(3, "bad-members");
  g.setUpAll();
  g.store->set(g.observers[0]->keyPrefix() + "members/1", "0,0,junk");
  everyoneWaitsInAllReduce(g);
  g.writers[1]->stepCompleted(12);
  const auto paths = g.run({0, 1, 2});
  for (const auto& p : paths) {
    const auto r = load(p);
    EXPECT_EQ(r["round"], 2);  // round 1 was dropped
    EXPECT_EQ(r["kind"], "process_stall");
    EXPECT_EQ(r["ranks"], nlohmann::json::array({11}));
  }
}

TEST(Observer, AMalformedRoundNumberIsNeverAReport) {
  Group g(2, "bad-latest");
  g.setUpAll();
  g.store->set(g.observers[0]->keyPrefix() + "latest", "round-1; rm -rf /");  // std::stoll threw here
  everyoneWaitsInAllReduce(g);
  const auto paths = g.run({0, 1}, 1500ms);
  EXPECT_FALSE(paths[0]);
  EXPECT_FALSE(paths[1]);
}

TEST(Observer, AStoredReportOfAnotherGroupIsNotAdopted) {
  Group g(3, "foreign");
  g.setUpAll();
  everyoneWaitsInAllReduce(g);
  const auto first = g.run({0, 1});  // rank 12's daemon is late
  auto forged = load(first[0]);
  forged["report_id"] = "scout-fault-000000000000-g0-r1";
  forged["ranks"] = nlohmann::json::array({10});
  std::filesystem::remove(*first[0]);  // rank 12's daemon keeps its reports elsewhere
  oob::setChunked(*g.store, g.observers[0]->keyPrefix() + "report/1", forged.dump());
  EXPECT_FALSE(g.run({2}, 1500ms)[2]);
  oob::setChunked(*g.store, g.observers[0]->keyPrefix() + "report/1", "{not json");
  EXPECT_FALSE(g.run({2}, 1500ms)[2]);
}

// The rendezvous store goes away mid-run (its host died): rounds fail with a log line and
// the daemons keep polling; once a store answers at that address again they report again
// (each alone, possibly: their round numbers moved apart while failing, so the report may
// be inconclusive, but it never blames a rank that was not stalled).
TEST(Observer, ARendezvousThatVanishesFailsRoundsUntilItIsBack) {
  Group g(2, "vanish", /*tcp=*/true);
  g.setUpAll();
  const int port = g.server->port();
  g.server.reset();
  everyoneWaitsInAllReduce(g);
  g.writers[1]->stepCompleted(12);
  const auto lost = g.run({0, 1}, 1500ms);
  EXPECT_FALSE(lost[0]);
  EXPECT_FALSE(lost[1]);
  g.server = std::make_unique<oob::TcpStoreServer>(port, "127.0.0.1", "job-token-0123456789");
  const auto back = g.run({0, 1});
  for (const auto& path : back) {
    const auto r = load(path);
    EXPECT_TRUE(r["ranks"] == nlohmann::json::array({11}) || r["ranks"].empty()) << r.dump();
  }
}

TEST(Observer, ASilentFirstStepIsJudgedAgainstTheWarmupThreshold) {
  // Every rank compiles in its first step: quiet past the threshold, not past the warm-up.
  Group g(3, "warmup", /*tcp=*/false, 1500ms);
  g.setUpAll();
  for (auto& w : g.writers) w->layerEntered(0);
  std::this_thread::sleep_for(500ms);
  for (auto& o : g.observers) EXPECT_FALSE(o->poll());
  EXPECT_EQ(g.observers[0]->roundsRun(), 0);
  // Past the warm-up threshold it is a stall like any other, and says which threshold.
  auto r = load(g.run({0, 1, 2})[0]);
  EXPECT_EQ(r["kind"], "inconclusive_stall");
  EXPECT_EQ(r["threshold_s"], 1.5);
  EXPECT_GE(r["detection_latency_s"].get<double>(), 1.5);
  // After a completed step the ordinary threshold applies again.
  for (auto& w : g.writers) w->stepCompleted(1);
  g.writers[1]->collectiveEntered({1, 0, 99, 5, 3});
  g.writers[2]->collectiveEntered({1, 0, 99, 5, 3});
  const auto start = std::chrono::steady_clock::now();
  r = load(g.run({0, 1, 2})[0]);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1200ms);
  EXPECT_EQ(r["kind"], "process_stall");
  EXPECT_EQ(r["ranks"], nlohmann::json::array({10}));
  EXPECT_EQ(r["threshold_s"], 0.3);
}

TEST(Observer, ARankStillInItsFirstStepIsNamedUnresponsiveByPeersPastTheirs) {
  Group g(3, "warmup-mixed", /*tcp=*/false, 1500ms);
  g.setUpAll();
  for (int r : {1, 2}) {
    g.writers[static_cast<std::size_t>(r)]->stepCompleted(1);
    g.writers[static_cast<std::size_t>(r)]->collectiveEntered({1, 0, 99, 5, 3});
  }
  g.writers[0]->layerEntered(1);  // rank 10 is still in its first step
  const auto paths = g.run({0, 1, 2});
  for (const auto& p : paths) {
    const auto r = load(p);
    EXPECT_EQ(r["kind"], "unresponsive_rank");
    EXPECT_EQ(r["ranks"], nlohmann::json::array({10}));
    EXPECT_EQ(r["round"], 1);
  }
}

TEST(Observer, HealthyProgressStartsNoRound) {
  Group g(2, "healthy", /*tcp=*/true);
  g.setUpAll();
  const auto before = g.server->requests();
  for (int i = 0; i < 30; ++i) {
    for (auto& w : g.writers) w->layerEntered(i % 4);
    for (auto& o : g.observers) EXPECT_FALSE(o->poll());
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(g.server->requests(), before);  // no store traffic at all
}

// Set-up used to have every daemon read every other's host (N² requests at one store);
// now the first daemon reads them and publishes the table, which the others read.
TEST(Observer, SetUpReadsEveryHostOnceAndPublishesTheTable) {
  Group g(12, "host-table", /*tcp=*/false, 300ms, /*per_host=*/4, /*record=*/true);
  std::vector<std::thread::id> ids(12);
  std::vector<std::thread> threads;
  for (int d = 0; d < 12; ++d)
    threads.emplace_back([&, d] {
      ids[static_cast<std::size_t>(d)] = std::this_thread::get_id();
      g.observers[static_cast<std::size_t>(d)]->setUp(std::chrono::steady_clock::now() + 5s);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(g.recorder->readers("/ready/"), std::set<std::thread::id>{ids[0]});
  EXPECT_EQ(g.recorder->readers("/hosts").size(), 11u);
  // The table is what the rounds group by: host-1's daemons meet through one leader.
  everyoneWaitsInAllReduce(g);
  g.writers[6]->stepCompleted(12);
  const auto paths = g.run({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  EXPECT_EQ(load(paths[5])["ranks"], nlohmann::json::array({16}));
  EXPECT_EQ(keysUnder(g.dir + "/rendezvous", g.observers[0]->keyPrefix() + "mesh/1/").size(), 3u);
}

TEST(Observer, TheGatherConnectsEachDaemonToItsTwoNeighboursOnly) {
  // A ring: each member stores one entry (its two pairs' addresses) and reads its two
  // neighbours' entries. Gloo's full mesh stored two keys a member and had each read all the
  // others' (quadratic in the members at the one store, and a socket to every member).
  Group g(6, "ring", /*tcp=*/false, 300ms, /*per_host=*/1, /*record=*/true);
  g.setUpAll();
  everyoneWaitsInAllReduce(g);
  g.writers[3]->stepCompleted(12);
  const auto paths = g.run({0, 1, 2, 3, 4, 5});
  for (const auto& p : paths) EXPECT_EQ(load(p)["ranks"], nlohmann::json::array({13}));
  const std::string mesh = g.observers[0]->keyPrefix() + "mesh/1/";
  EXPECT_EQ(keysUnder(g.dir + "/rendezvous", mesh).size(), 6u);
  EXPECT_EQ(g.recorder->mostKeysReadByOne(mesh), 2u);
}

TEST(Observer, ALargeGroupWaitsLongerForItsStore) {
  // 17 store requests a daemon at about 20 thousand a second: 1 ms a daemon to join, 1.25 to
  // gather. A small group keeps the options' waits.
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("lmr-observer-large-" + std::to_string(::getpid()))).string();
  oob::FileStore store(dir + "/rendezvous");
  const std::string name = oob::segmentName("large", 0, ::getpid(), "world", 0);
  oob::ProgressWriter writer(name, std::string(16, 'w'));
  const auto make = [&](int n) {
    ObserverOptions o;
    o.run_id = "large";
    o.token = "job-token-0123456789";
    for (int i = 0; i < n; ++i) o.group_ranks.push_back(i);
    o.host = "host-0";
    o.state_dir = dir;
    return std::make_unique<Observer>(o, store, name);
  };
  const auto large = make(4000), small = make(12);
  EXPECT_EQ(large->join(), 4000ms);
  EXPECT_EQ(large->gather(), 5000ms);
  EXPECT_EQ(small->join(), 1000ms);
  EXPECT_EQ(small->gather(), 2000ms);
  std::filesystem::remove_all(dir);
}

TEST(Observer, SetUpNamesTheDaemonThatNeverRegistered) {
  Group g(3, "setup");
  std::thread a([&] { EXPECT_THROW(g.observers[0]->setUp(std::chrono::steady_clock::now() + 300ms), TimeoutError); });
  try {
    g.observers[1]->setUp(std::chrono::steady_clock::now() + 300ms);
    ADD_FAILURE() << "set-up should time out";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 12"), std::string::npos) << e.what();
  }
  a.join();
}

// ---- two-level rounds: several daemons per host ----------------------------------------------

TEST(Observer, OnHostsOfSeveralDaemonsOnlyTheirLeadersMeet) {
  Group g(12, "two-level", /*tcp=*/false, 300ms, /*per_host=*/4, /*record=*/false, /*join=*/1000ms);  // 3 hosts of 4
  g.setUpAll();
  everyoneWaitsInAllReduce(g);
  g.writers[6]->stepCompleted(12);  // rank 16 (host-1, not its leader) stopped outside a collective
  const auto paths = g.run({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  const auto first = load(paths[0]);
  EXPECT_EQ(first["kind"], "process_stall");
  EXPECT_EQ(first["ranks"], nlohmann::json::array({16}));
  EXPECT_EQ(first["hosts"], nlohmann::json::array({"host-1"}));
  EXPECT_TRUE(first["missing_ranks"].empty());
  for (const auto& p : paths) {
    const auto r = load(p);
    EXPECT_EQ(r["report_id"], first["report_id"]);
    EXPECT_EQ(r["ranks"], first["ranks"]);
  }
  // Three daemons built the Gloo ring (one address key each), not twelve; each host's
  // membership was claimed once.
  const std::string prefix = g.observers[0]->keyPrefix();
  EXPECT_EQ(keysUnder(g.dir + "/rendezvous", prefix + "mesh/1/").size(), 3u);
  EXPECT_EQ(keysUnder(g.dir + "/rendezvous", prefix + "node/1/").size(), 3u);
  EXPECT_EQ(keysUnder(g.dir + "/rendezvous", prefix + "lead/1/").size(), 3u);
  // The next stall is round 2 for every daemon, the ones that waited for their leader too.
  for (auto& w : g.writers) {
    w->stepCompleted(13);
    w->collectiveEntered({1, 0, 99, 5, 9});
  }
  g.writers[9]->stepCompleted(13);
  for (const auto& p : g.run({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})) {
    const auto r = load(p);
    EXPECT_EQ(r["round"], 2);
    EXPECT_EQ(r["ranks"], nlohmann::json::array({19}));
    EXPECT_TRUE(r["missing_ranks"].empty()) << r.dump();
  }
}

TEST(Observer, AHostWhoseFirstDaemonNeverCameIsLedByTheNext) {
  Group g(8, "leader-gone", /*tcp=*/true, 300ms, /*per_host=*/4, /*record=*/false, /*join=*/1000ms);
  g.setUpAll();
  everyoneWaitsInAllReduce(g);
  const auto paths = g.run({0, 1, 2, 3, 5, 6, 7});  // the daemon of rank 14 (host-1's first) never answers
  for (int d : {0, 1, 2, 3, 5, 6, 7}) {
    const auto r = load(paths[static_cast<std::size_t>(d)]);
    EXPECT_EQ(r["kind"], "unresponsive_rank");
    EXPECT_EQ(r["missing_ranks"], nlohmann::json::array({14}));
    EXPECT_EQ(r["hosts"], nlohmann::json::array({"host-1"}));
    EXPECT_EQ(r["round"], 1);
  }
  // It turns up late: it adopts the round's report.
  EXPECT_EQ(load(g.run({4})[4])["report_id"], load(paths[0])["report_id"]);
}

TEST(Observer, AHostWhoseDaemonsNeverCameIsNamedWhole) {
  Group g(9, "host-gone", /*tcp=*/false, 300ms, /*per_host=*/3, /*record=*/false, /*join=*/1000ms);
  g.setUpAll();
  everyoneWaitsInAllReduce(g);
  const auto start = std::chrono::steady_clock::now();
  const auto paths = g.run({0, 1, 2, 6, 7, 8});  // host-1 (ranks 13 to 15) is gone
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4s);
  for (int d : {0, 1, 2, 6, 7, 8}) {
    const auto r = load(paths[static_cast<std::size_t>(d)]);
    EXPECT_EQ(r["missing_ranks"], nlohmann::json::array({13, 14, 15}));
    EXPECT_EQ(r["hosts"], nlohmann::json::array({"host-1", "host-1", "host-1"}));
  }
}

// A host's first daemon stored its view and was named to lead, then died: the next daemon of
// the host takes the lead after a grace period, and the round goes on with every view.
TEST(Observer, ALeaderThatDiedAfterItsViewIsReplacedByTheNextOnItsHost) {
  Group g(4, "leader-died", /*tcp=*/false, 300ms, /*per_host=*/2, /*record=*/false, /*join=*/1000ms);
  g.setUpAll();
  everyoneWaitsInAllReduce(g);
  g.writers[3]->stepCompleted(12);  // rank 13 stalls outside a collective
  const std::string prefix = g.observers[0]->keyPrefix();
  oob::ViewRecord dead;  // what daemon 0 stored before it died: its rank waits in the all-reduce
  dead.rank = 10;
  dead.layer = -1;
  dead.stalled_ns = 400'000'000;
  dead.step = 12;
  dead.op = 1;
  dead.group = 99;
  dead.meta = 5;
  dead.sequence = 7;
  dead.in_collective = 1;
  std::strcpy(dead.host, "host-0");
  g.store->set(prefix + "view/1/0", oob::encodeView("job-token-0123456789", prefix + "view/1/0", dead));
  g.store->set(prefix + "node/1/0", "0,1");
  const auto paths = g.run({1, 2, 3});
  for (int d : {1, 2, 3}) {
    const auto r = load(paths[static_cast<std::size_t>(d)]);
    EXPECT_EQ(r["round"], 1);
    EXPECT_EQ(r["ranks"], nlohmann::json::array({13}));
    EXPECT_TRUE(r["missing_ranks"].empty()) << r.dump();
  }
}

// The leaders' round fails (a malformed membership): each leader marks its host's round
// aborted, so its other daemons stop waiting and the next round has everyone again.
TEST(Observer, AFailedLeadersRoundBringsTheirWholeHostsIntoTheNext) {
  Group g(4, "leaders-failed", /*tcp=*/false, 300ms, /*per_host=*/2, /*record=*/false, /*join=*/1000ms);
  g.setUpAll();
  g.store->set(g.observers[0]->keyPrefix() + "members/1", "junk");
  everyoneWaitsInAllReduce(g);
  g.writers[3]->stepCompleted(12);
  const auto paths = g.run({0, 1, 2, 3});
  for (const auto& p : paths) {
    const auto r = load(p);
    EXPECT_EQ(r["round"], 2);
    EXPECT_EQ(r["ranks"], nlohmann::json::array({13}));
    EXPECT_TRUE(r["missing_ranks"].empty()) << r.dump();
  }
}

// A host that waited its whole first `join` for a missing daemon, and began its round later
// than another host (within `join`), still joins the leaders in time: only the missing
// daemon's rank is named, never its host's others.
TEST(Observer, AHostMissingADaemonStillMeetsTheOtherLeaders) {
  Group g(8, "late-host", /*tcp=*/true, 300ms, /*per_host=*/4, /*record=*/false, /*join=*/800ms);
  g.setUpAll();
  const auto waitFrom = [&](int first) {  // this host's ranks enter the all-reduce now
    for (int d = first; d < first + 4; ++d) {
      g.writers[static_cast<std::size_t>(d)]->stepCompleted(12);
      g.writers[static_cast<std::size_t>(d)]->collectiveEntered({1, 0, 99, 5, 7});
    }
  };
  waitFrom(0);
  std::vector<std::optional<std::string>> early;
  std::thread host0([&] { early = g.run({0, 1, 2, 3}); });
  std::this_thread::sleep_for(250ms);
  waitFrom(4);  // host-1 stops 250 ms later
  const auto late = g.run({4, 6, 7});  // rank 15's daemon never answers
  host0.join();
  for (int d : {0, 1, 2, 3, 4, 6, 7}) {
    const auto r = load((d < 4 ? early : late)[static_cast<std::size_t>(d)]);
    EXPECT_EQ(r["missing_ranks"], nlohmann::json::array({15})) << d;
    EXPECT_EQ(r["kind"], "unresponsive_rank");
  }
}

TEST(Observer, OnlyTheFirstTwoNodesLeadersWaitOnEveryNodesMark) {
  // The leaders' list is decided by the first two nodes' leaders; the others wait for the
  // list alone, so no more than two daemons read the nodes' marks (before, every leader did:
  // nodes^2 requests at the store).
  Group g(8, "deciders", /*tcp=*/false, 300ms, /*per_host=*/2, /*record=*/true, /*join=*/1000ms);  // 4 hosts
  g.setUpAll();
  everyoneWaitsInAllReduce(g);
  g.writers[5]->stepCompleted(12);  // rank 15 (host-2)
  for (const auto& p : g.run({0, 1, 2, 3, 4, 5, 6, 7})) {
    const auto r = load(p);
    EXPECT_EQ(r["ranks"], nlohmann::json::array({15}));
    EXPECT_TRUE(r["missing_ranks"].empty()) << r.dump();
  }
  EXPECT_EQ(g.recorder->readers("/lead/1/").size(), 2u);
}

TEST(Observer, WithoutTheDecidingNodesTheOtherLeadersDecideTheirList) {
  Group g(10, "no-deciders", /*tcp=*/false, 300ms, /*per_host=*/2, /*record=*/false, /*join=*/500ms);  // 5 hosts
  g.setUpAll();
  everyoneWaitsInAllReduce(g);
  g.writers[5]->stepCompleted(12);  // rank 15 (host-2)
  const auto paths = g.run({4, 5, 6, 7, 8, 9});  // hosts 0 and 1, the deciding nodes, never come
  for (int d : {4, 5, 6, 7, 8, 9}) {
    const auto r = load(paths[static_cast<std::size_t>(d)]);
    EXPECT_EQ(r["round"], 1);
    EXPECT_EQ(r["ranks"], nlohmann::json::array({15}));
    EXPECT_EQ(r["missing_ranks"], nlohmann::json::array({10, 11, 12, 13}));
  }
}

TEST(Observer, ANodeListNamingAnotherHostsDaemonIsNeverUsed) {
  Group g(6, "node-forged", /*tcp=*/false, 300ms, /*per_host=*/2, /*record=*/false, /*join=*/1000ms);
  g.setUpAll();
  everyoneWaitsInAllReduce(g);
  g.writers[3]->stepCompleted(12);  // rank 13 (host-1) stalls outside a collective
  g.store->set(g.observers[0]->keyPrefix() + "node/1/0", "0,2");  // daemon 2 is host-1's
  const auto paths = g.run({0, 1, 2, 3, 4, 5});
  // host-0 drops round 1 (then reports alone in round 2, inconclusive); hosts 1 and 2, a
  // strict majority, name rank 13 in round 1. Nobody is blamed from the forged list.
  for (int d : {2, 3, 4, 5}) {
    const auto r = load(paths[static_cast<std::size_t>(d)]);
    EXPECT_EQ(r["round"], 1);
    EXPECT_EQ(r["ranks"], nlohmann::json::array({13}));
    EXPECT_EQ(r["missing_ranks"], nlohmann::json::array({10, 11}));
  }
  for (int d : {0, 1}) {
    const auto r = load(paths[static_cast<std::size_t>(d)]);
    EXPECT_EQ(r["round"], 2);
    EXPECT_TRUE(r["ranks"].empty()) << r.dump();
  }
  // host-0's lone round 2 moved the numbers apart; at the next stall nobody takes that old
  // report: everyone meets in round 3 and names the new culprit.
  for (auto& w : g.writers) {
    w->stepCompleted(13);
    w->collectiveEntered({1, 0, 99, 5, 9});
  }
  g.writers[4]->stepCompleted(13);
  for (const auto& p : g.run({0, 1, 2, 3, 4, 5})) {
    const auto r = load(p);
    EXPECT_EQ(r["round"], 3);
    EXPECT_EQ(r["ranks"], nlohmann::json::array({14}));
    EXPECT_TRUE(r["missing_ranks"].empty()) << r.dump();
  }
}

}  // namespace
}  // namespace lmr::oobd
