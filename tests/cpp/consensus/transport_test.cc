// C3 over a transport: peers run as threads over an in-process all-gather; every peer must
// reach the same decision whatever the order in which the evidence arrives.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "lmr/consensus/consensus.h"

namespace lmr::consensus {
namespace {

// All-gather among N threads: one round at a time, contributions stored by position.
class Rendezvous {
 public:
  explicit Rendezvous(int n) : n_(n), slots_(n) {}

  std::vector<std::string> exchange(int position, std::string_view mine) {
    std::unique_lock<std::mutex> lock(mu_);
    const long round = round_;
    slots_[position] = std::string(mine);
    if (++arrived_ == n_) {
      result_ = slots_;
      arrived_ = 0;
      ++round_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return round_ != round; });
    }
    return result_;
  }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> slots_;
  std::vector<std::string> result_;
  int arrived_ = 0;
  long round_ = 0;
};

class ThreadTransport : public Transport {
 public:
  ThreadTransport(Rendezvous& r, int position, std::vector<std::int64_t> ranks, unsigned seed)
      : rendezvous_(r), position_(position), ranks_(std::move(ranks)), rng_(seed) {}
  int position() const override { return position_; }
  std::vector<std::int64_t> peerRanks() const override { return ranks_; }
  std::vector<std::string> allGather(std::string_view mine) override {
    // Arrive in a random order.
    std::this_thread::sleep_for(std::chrono::microseconds(rng_() % 500));
    return rendezvous_.exchange(position_, mine);
  }

 private:
  Rendezvous& rendezvous_;
  int position_;
  std::vector<std::int64_t> ranks_;
  std::mt19937 rng_;
};

class C3OverThreads : public ::testing::TestWithParam<int> {};

TEST_P(C3OverThreads, EveryPeerReachesTheSameDecision) {
  const int n = GetParam();
  Rendezvous rendezvous(n);
  std::vector<std::int64_t> ranks;
  for (int i = 0; i < n; ++i) ranks.push_back(8 * i + 3);  // e.g. one dp_replicate column
  const int bad = n / 2;                                    // one corrupt peer, one slow peer
  const int slow = n - 1;
  std::vector<ExactResult> exact_results(n);
  std::vector<TimingResult> timing_results(n);
  std::vector<std::thread> threads;
  for (int p = 0; p < n; ++p) {
    threads.emplace_back([&, p] {
      ThreadTransport transport(rendezvous, p, ranks, 1000u + p);
      std::string digest(16, '\x5a');
      if (p == bad) digest[7] ^= 0x01;
      exact_results[p] = c3Exact(transport, digest);
      timing_results[p] = c3Timing(transport, p == slow ? 0.5 : 0.1);
    });
  }
  for (auto& t : threads) t.join();
  for (int p = 0; p < n; ++p) {
    EXPECT_EQ(exact_results[p].bitmap, exact_results[0].bitmap);
    EXPECT_EQ(exact_results[p].evidence, exact_results[0].evidence);
    EXPECT_EQ(timing_results[p].bitmap, timing_results[0].bitmap);
  }
  if (n >= 3) {
    EXPECT_EQ(exact_results[0].status, Status::kAttributed);
    EXPECT_EQ(exact_results[0].attributedRanks(), (std::vector<std::int64_t>{8 * bad + 3}));
    EXPECT_EQ(timing_results[0].status, Status::kAttributed);
    EXPECT_EQ(timing_results[0].attributedRanks(), (std::vector<std::int64_t>{8 * slow + 3}));
  } else {
    EXPECT_EQ(exact_results[0].status, Status::kInconclusive);
    EXPECT_EQ(timing_results[0].status, Status::kInconclusive);
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, C3OverThreads, ::testing::Values(2, 3, 4, 5, 8, 13, 16));

}  // namespace
}  // namespace lmr::consensus
