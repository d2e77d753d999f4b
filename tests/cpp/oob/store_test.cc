#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>
#include <vector>

#include "lmr/common/error.h"
#include "lmr/oob/store.h"
#include "lmr/oob/wire.h"

namespace lmr::oob {
namespace {

using Clock = std::chrono::steady_clock;
const std::string kToken = "job-token-0123456789";

std::string tempDir(const char* tag) {
  const auto p =
      std::filesystem::temp_directory_path() / ("lmr-store-" + std::string(tag) + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  return p.string();
}

// A client of `server` with the job's token.
TcpStoreOptions clientOf(const TcpStoreServer& server) {
  TcpStoreOptions o;
  o.token = kToken;
  o.port = server.port();
  return o;
}

void exercise(Store& s) {
  EXPECT_FALSE(s.tryGet("a/b"));
  s.set("a/b", std::string("x\0y", 3));
  EXPECT_EQ(*s.tryGet("a/b"), std::string("x\0y", 3));
  EXPECT_TRUE(s.claim("lead", "1"));
  EXPECT_FALSE(s.claim("lead", "2"));
  EXPECT_EQ(*s.tryGet("lead"), "1");
  const auto soon = Clock::now() + std::chrono::milliseconds(50);
  EXPECT_THROW(s.get("never", soon), TimeoutError);
  EXPECT_EQ(s.waitAll({"a/b", "never"}, soon), (std::vector<bool>{true, false}));
  // A decision made elsewhere ends the wait at once.
  const auto start = Clock::now();
  EXPECT_EQ(s.waitAll({"a/b", "never"}, start + std::chrono::seconds(30), "lead"), (std::vector<bool>{false, false}));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
}

TEST(Store, FileStoreSetGetClaim) {
  FileStore s(tempDir("file"));
  exercise(s);
}

TEST(Store, FileStoreKeysAndTheDirectoryCanBeRemoved) {
  const std::string dir = tempDir("remove");
  FileStore s(dir);
  s.set("oob-1/ready/0", "h");
  s.set("oob-1/latest", "2");
  s.erase("oob-1/ready/0");
  s.erase("oob-1/never-set");  // absent: nothing to do
  EXPECT_FALSE(s.tryGet("oob-1/ready/0"));
  EXPECT_EQ(*s.tryGet("oob-1/latest"), "2");
  EXPECT_EQ(std::filesystem::status(dir).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_all);
  s.removeAll();
  EXPECT_FALSE(std::filesystem::exists(dir));
}

TEST(Store, TcpStoreSetGetClaim) {
  TcpStoreServer server(0, "127.0.0.1", kToken);
  TcpStore s(clientOf(server));
  exercise(s);
  EXPECT_GT(server.requests(), 5u);
}

// A value over the store's bound (a host table or a report of thousands of ranks) travels in
// chunks over the TCP store, which refuses it whole.
TEST(Store, ChunkedValuesPassTheValueBound) {
  TcpStoreServer server(0, "127.0.0.1", kToken);
  TcpStore s(clientOf(server));
  std::string big(kMaxStoreValue + kMaxStoreValue / 2 + 7, 'r');
  for (std::size_t i = 0; i < big.size(); i += 4099) big[i] = static_cast<char>('a' + i % 26);
  EXPECT_THROW(s.set("whole", big), Error);
  const auto later = Clock::now() + std::chrono::seconds(5);
  EXPECT_FALSE(tryGetChunked(s, "report/1", later));
  setChunked(s, "report/1", big);
  EXPECT_EQ(*s.tryGet("report/1"), "4");  // chunks of half the bound
  EXPECT_EQ(*tryGetChunked(s, "report/1", later), big);
  setChunked(s, "empty", "");
  EXPECT_EQ(*tryGetChunked(s, "empty", later), "");
  s.set("bad", "three");
  EXPECT_THROW(tryGetChunked(s, "bad", later), PeerFailure);
}

// Claims from many threads: exactly one wins, on both stores.
TEST(Store, ExactlyOneClaimWins) {
  TcpStoreServer server(0, "127.0.0.1", kToken);
  TcpStore tcp(clientOf(server));
  FileStore file(tempDir("claim"));
  for (Store* s : {static_cast<Store*>(&tcp), static_cast<Store*>(&file)}) {
    std::atomic<int> wins{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i) threads.emplace_back([&, i] { wins += s->claim("k", std::to_string(i)) ? 1 : 0; });
    for (auto& t : threads) t.join();
    EXPECT_EQ(wins.load(), 1);
  }
}

TEST(Store, UnreachableAndBadArgumentsAreClearErrors) {
  int port = 0;
  {
    TcpStoreServer server(0, "127.0.0.1", kToken);
    port = server.port();
  }
  TcpStoreOptions o;
  o.token = kToken;
  o.port = port;
  TcpStore gone(o);
  EXPECT_THROW(gone.set("k", "v"), IoError);
  o.port = 0;
  EXPECT_THROW(TcpStore{o}, InvalidArgument);
  EXPECT_THROW(TcpStoreServer(70000, "127.0.0.1", kToken), InvalidArgument);
  EXPECT_THROW(TcpStoreServer(0, "not-an-address", kToken), InvalidArgument);
  EXPECT_THROW(TcpStoreServer(0, "127.0.0.1", ""), InvalidArgument);
  TcpStoreServer first(0, "127.0.0.1", kToken);
  EXPECT_THROW(TcpStoreServer(first.port(), "127.0.0.1", kToken), IoError);  // port taken
}

}  // namespace
}  // namespace lmr::oob
