// Real stall rounds of lmr-oobd (tools/lmr-oobd/observer.h): N observers as threads, each
// with its own progress record, over one TcpStoreServer and Gloo on loopback, as the
// daemons of one host would run them. A process stall is planted on rank 5 each round.
// BM_OobRound/<N>/<daemons per host>: 1 per host is the one-level round (every daemon
// meets every other); 8 per host is the two-level round (only hosts' leaders meet).
// BM_OobStoreRate/<clients>: the store's request rate, what a round's requests take at most.
// Reported: wall time from the first daemon's look at a stalled record to the last report,
// the store's requests per round (counted by the server) and per daemon. With
// LMR_BENCH_DEBUG=1 the first report that does not name the stalled rank is printed.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "lmr/common/files.h"
#include "lmr/oob/progress.h"
#include "lmr/oob/store.h"
#include "lmr/oob/wire.h"
#include "observer.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
constexpr const char* kToken = "bench-token-0123456789";
constexpr int kCulprit = 5;

struct Daemons {
  Daemons(int n, int per_host) : server(0, "127.0.0.1", kToken) {
    dir = (std::filesystem::temp_directory_path() /
           ("lmr-oob-round-" + std::to_string(::getpid()) + "-" + std::to_string(n) + "-" + std::to_string(per_host)))
              .string();
    std::filesystem::remove_all(dir);
    lmr::oob::TcpStoreOptions t;
    t.port = server.port();
    t.token = kToken;
    t.io_timeout = 10s;
    store = std::make_unique<lmr::oob::TcpStore>(t);
    for (int r = 0; r < n; ++r) {
      const std::string name = lmr::oob::segmentName("round", n * 100 + per_host, ::getpid(), "world", r);
      writers.push_back(std::make_unique<lmr::oob::ProgressWriter>(name, std::string(16, 'w')));
      lmr::oobd::ObserverOptions o;
      o.run_id = "bench";
      o.token = kToken;
      for (int i = 0; i < n; ++i) o.group_ranks.push_back(i);
      o.index = r;
      o.host = "host-" + std::to_string(r / per_host);
      o.threshold = 50ms;
      o.join = 5000ms;
      o.gather = 20000ms;
      o.state_dir = dir;
      observers.push_back(std::make_unique<lmr::oobd::Observer>(o, *store, name));
    }
    std::vector<std::thread> threads;
    for (auto& o : observers) threads.emplace_back([&] { o->setUp(Clock::now() + 60s); });
    for (auto& t : threads) t.join();
  }
  ~Daemons() { std::filesystem::remove_all(dir); }

  // One stall: every rank waits in an all-reduce of step `step` but the culprit. Returns
  // the seconds from the first poll to the last report, and whether every report names it.
  std::pair<double, bool> round(std::uint64_t step) {
    for (auto& w : writers) {
      w->stepCompleted(step);
      w->collectiveEntered({1, 0, 99, 5, step});
    }
    writers[kCulprit]->stepCompleted(step);
    std::this_thread::sleep_for(60ms);  // past the threshold
    std::vector<std::optional<std::string>> out(observers.size());
    const auto start = Clock::now();
    std::vector<std::thread> threads;
    for (std::size_t d = 0; d < observers.size(); ++d)
      threads.emplace_back([&, d] {
        const auto end = Clock::now() + 60s;
        while (!out[d] && Clock::now() < end) {
          out[d] = observers[d]->poll();
          if (!out[d]) std::this_thread::sleep_for(1ms);
        }
      });
    for (auto& t : threads) t.join();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    bool named = true;
    const std::string culprit = "\"ranks\": [\n    " + std::to_string(kCulprit) + "\n  ]";
    for (const auto& p : out) {
      named = named && p && lmr::files::readFile(*p).value_or("").find(culprit) != std::string::npos;
      if (!named && std::getenv("LMR_BENCH_DEBUG")) {
        std::fprintf(stderr, "%s\n", p ? lmr::files::readFile(*p).value_or("?").c_str() : "(no report)");
        break;
      }
    }
    return {seconds, named};
  }

  std::string dir;
  lmr::oob::TcpStoreServer server;
  std::unique_ptr<lmr::oob::Store> store;
  std::vector<std::unique_ptr<lmr::oob::ProgressWriter>> writers;
  std::vector<std::unique_ptr<lmr::oobd::Observer>> observers;
};

void BM_OobRound(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int per_host = static_cast<int>(state.range(1));
  Daemons daemons(n, per_host);
  std::uint64_t step = 1;
  double requests = 0;
  int rounds = 0;
  for (auto _ : state) {
    const auto before = daemons.server.requests();
    const auto [seconds, named] = daemons.round(step++);
    requests += static_cast<double>(daemons.server.requests() - before);
    ++rounds;
    state.SetIterationTime(seconds);
    if (!named) {
      state.SkipWithError("a report did not name the stalled rank");
      break;
    }
  }
  state.counters["store_requests"] = requests / rounds;
  state.counters["requests_per_daemon"] = requests / rounds / n;
  state.counters["meshed_daemons"] = n / per_host;
}

// The store's request rate: `clients` threads asking for one stored key over and over for
// half a second (a connection per request, as the daemons make them). Reported: requests
// answered per second, and requests that failed.
void BM_OobStoreRate(benchmark::State& state) {
  const int clients = static_cast<int>(state.range(0));
  lmr::oob::TcpStoreServer server(0, "127.0.0.1", kToken);
  lmr::oob::TcpStoreOptions t;
  t.port = server.port();
  t.token = kToken;
  lmr::oob::TcpStore store(t);
  store.set("view/1/0", std::string(lmr::oob::kViewBytes, 'v'));
  double answered = 0, seconds = 0;
  std::atomic<std::int64_t> failed{0};
  for (auto _ : state) {
    const auto before = server.requests();
    std::atomic<bool> stop{false};
    const auto start = Clock::now();
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c)
      threads.emplace_back([&] {
        while (!stop.load()) {
          try {
            benchmark::DoNotOptimize(store.tryGet("view/1/0"));
          } catch (const std::exception&) {
            failed.fetch_add(1);
          }
        }
      });
    std::this_thread::sleep_for(500ms);
    stop = true;
    for (auto& th : threads) th.join();
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    state.SetIterationTime(s);
    seconds += s;
    answered += static_cast<double>(server.requests() - before);
  }
  state.counters["requests_per_s"] = answered / seconds;
  state.counters["failed"] = static_cast<double>(failed.load());
}

}  // namespace

BENCHMARK(BM_OobRound)
    ->ArgsProduct({{16, 32, 64, 128, 256}, {1}})
    ->ArgsProduct({{16, 32, 64, 128, 256}, {8}})
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_OobStoreRate)->Arg(8)->Arg(64)->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);
