// The daemons' messages: authentication before anything is looked at, and a strict reader
// for each class of malformed input (every one a PeerFailure or InvalidArgument, never
// another exception, never accepted).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "lmr/common/error.h"
#include "lmr/common/hex.h"
#include "lmr/oob/store.h"
#include "lmr/oob/wire.h"

namespace lmr::oob {
namespace {

const std::string kWireToken = "job-token-0123456789";

std::string hexOf(const Tag& t) { return toHex(std::string_view(reinterpret_cast<const char*>(t.data()), 32)); }

TEST(Wire, HmacSha256MatchesRfc4231) {
  EXPECT_EQ(hexOf(hmacSha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hexOf(hmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hexOf(hmacSha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_TRUE(sameBytes("abc", "abc"));
  EXPECT_FALSE(sameBytes("abc", "abd"));
  EXPECT_FALSE(sameBytes("abc", "ab"));
}

TEST(Wire, RequestsRoundTripAndAnyDamageIsRefused) {
  const std::string f = encodeRequest(kWireToken, kStoreSet, "oob-1/ready/0", std::string("h\0st", 4));
  const StoreRequest r = decodeRequest(kWireToken, f);
  EXPECT_EQ(r.op, kStoreSet);
  EXPECT_EQ(r.key, "oob-1/ready/0");
  EXPECT_EQ(r.value, std::string("h\0st", 4));
  EXPECT_THROW(decodeRequest("another-job-token", f), PeerFailure);  // no token, no request
  for (std::size_t n = 0; n < f.size(); ++n) EXPECT_THROW(decodeRequest(kWireToken, f.substr(0, n)), PeerFailure) << n;
  EXPECT_THROW(decodeRequest(kWireToken, f + "x"), PeerFailure);
  for (std::size_t i = 0; i < f.size(); ++i) {
    std::string bad = f;
    bad[i] = static_cast<char>(bad[i] ^ 0x40);
    EXPECT_THROW(decodeRequest(kWireToken, bad), PeerFailure) << "byte " << i;
  }
}

// A correctly tagged request (a token holder) is still checked: op and key.
TEST(Wire, AuthenticatedButMalformedRequestsAreRefused) {
  std::string unknown_op = encodeRequest(kWireToken, 9, "k", "");
  EXPECT_THROW(decodeRequest(kWireToken, unknown_op), PeerFailure);
  EXPECT_THROW(encodeRequest(kWireToken, kStoreSet, "bad key", ""), InvalidArgument);
  EXPECT_THROW(encodeRequest(kWireToken, kStoreSet, "", ""), InvalidArgument);
  EXPECT_THROW(encodeRequest(kWireToken, kStoreSet, std::string(kMaxStoreKey + 1, 'k'), ""), InvalidArgument);
  EXPECT_THROW(encodeRequest(kWireToken, kStoreSet, "k", std::string(kMaxStoreValue + 1, 'v')), InvalidArgument);
  EXPECT_NO_THROW(checkStoreKey("oob-ab12/mesh/3/rank_0:x.y-z"));
  for (const char* bad : {"a b", "a\nb", "a\\b", "\xff"}) EXPECT_THROW(checkStoreKey(bad), InvalidArgument) << bad;
  // A length field that claims more than the frame holds, or more than the limit.
  std::string frame(1, static_cast<char>(kStoreGet));
  frame += std::string("\xff\xff\xff\xff", 4);
  EXPECT_THROW(decodeRequest(kWireToken, frame), PeerFailure);
}

TEST(Wire, RepliesAreBoundToTheirRequest) {
  const StoreRequest a = decodeRequest(kWireToken, encodeRequest(kWireToken, kStoreGet, "a", ""));
  const StoreRequest b = decodeRequest(kWireToken, encodeRequest(kWireToken, kStoreGet, "b", ""));
  const std::string reply = encodeReply(kWireToken, a.tag, kStatusYes, "value-of-a");
  EXPECT_EQ(decodeReply(kWireToken, a.tag, reply), (std::pair<std::uint8_t, std::string>{kStatusYes, "value-of-a"}));
  EXPECT_THROW(decodeReply(kWireToken, b.tag, reply), PeerFailure);  // played back to another request
  EXPECT_THROW(decodeReply("another-job-token", a.tag, reply), PeerFailure);
  for (std::size_t n = 0; n < reply.size(); ++n)
    EXPECT_THROW(decodeReply(kWireToken, a.tag, reply.substr(0, n)), PeerFailure);
  EXPECT_THROW(decodeReply(kWireToken, a.tag, encodeReply(kWireToken, a.tag, 7, "")), PeerFailure);
}

TEST(Wire, StoreStateIsBoundedAndAFullStoreChangesNothing) {
  StoreState s(/*max_keys=*/2, /*max_bytes=*/20);
  auto req = [](std::uint8_t op, std::string k, std::string v) {
    StoreRequest r;
    r.op = op;
    r.key = std::move(k);
    r.value = std::move(v);
    return r;
  };
  EXPECT_EQ(s.apply(req(kStoreSet, "a", "1234")).first, kStatusYes);
  EXPECT_EQ(s.apply(req(kStoreClaim, "a", "x")).first, kStatusNo);
  EXPECT_EQ(s.apply(req(kStoreClaim, "b", "5")).first, kStatusYes);
  EXPECT_EQ(s.apply(req(kStoreSet, "c", "6")).first, kStatusFull);  // a third key
  EXPECT_EQ(s.apply(req(kStoreSet, "a", std::string(40, 'z'))).first, kStatusFull);  // too many bytes
  EXPECT_EQ(s.apply(req(kStoreGet, "a", "")), (std::pair<std::uint8_t, std::string>{kStatusYes, "1234"}));
  EXPECT_EQ(s.apply(req(kStoreGet, "c", "")).first, kStatusNo);
  EXPECT_EQ(s.keys(), 2u);
  EXPECT_EQ(s.bytes(), 7u);
  // By default a store takes a large group's rounds: 16,384 daemons write about 16,000 keys
  // at set-up and 25,000 a round (65,536 keys, the old bound, held one round).
  StoreState big;
  for (int i = 0; i < 100'000; ++i)
    ASSERT_EQ(big.apply(req(kStoreSet, "oob-1/view/" + std::to_string(i), "v")).first, kStatusYes) << i;
}

TEST(Wire, MembershipRoundsAndHostsAreParsedStrictly) {
  EXPECT_EQ(parseMembers("0,2,3", 4), (std::vector<std::int64_t>{0, 2, 3}));
  EXPECT_EQ(parseMembers("1", 2), (std::vector<std::int64_t>{1}));
  EXPECT_EQ(formatMembers({0, 2, 3}), "0,2,3");
  for (const char* bad : {"", ",", "0,", ",0", "0,,1", "1,0", "0,0", "4", "-1", "01", " 1", "1 ", "x", "0x1",
                          "99999999999999999999", "0,1,2,3,4"})
    EXPECT_THROW(parseMembers(bad, 4), PeerFailure) << bad;
  EXPECT_EQ(parseRound("17"), 17);
  for (const char* bad : {"", "0", "-3", "3.0", "1e3", "007", "9999999999999", "12abc"})
    EXPECT_THROW(parseRound(bad), PeerFailure) << bad;
  EXPECT_EQ(parseHost("node-a.cluster"), "node-a.cluster");
  for (const std::string& bad :
       {std::string(), std::string("a b"), std::string("a\0b", 3), std::string(64, 'h'), std::string("\x7f")})
    EXPECT_THROW(parseHost(bad), PeerFailure);
}

TEST(Wire, TheHostTableStatesEachNameOnce) {
  const std::vector<std::string> hosts{"node-a", "node-a", "node-b", "node-a"};
  EXPECT_EQ(formatHosts(hosts), "2\nnode-a\nnode-b\n0,0,1,0");
  EXPECT_EQ(parseHosts(formatHosts(hosts), 4), hosts);
  for (const char* bad :
       {"", "1\nnode-a\n0,0,0", "2\nnode-a\nnode-a\n0,1,0,0", "2\nnode-a\nnode-b\n0,0,0,0", "1\nnode-a\n0,0,1,0",
        "1\nnode a\n0,0,0,0", "0\n\n", "1\nnode-a\n0,0,,0", "5\nnode-a\n0,0,0,0", "1\nnode-a\n0,0,0,0\n"})
    EXPECT_THROW(parseHosts(bad, 4), PeerFailure) << bad;
}

TEST(Wire, ViewsCarryTheTokenAndTheirRound) {
  ViewRecord v;
  v.rank = 12;
  v.layer = -1;
  v.stalled_ns = 5;
  v.in_collective = 1;
  std::strcpy(v.host, "host-2");
  const std::string bytes = encodeView(kWireToken, "oob-1/mesh/3/", v);
  ASSERT_EQ(bytes.size(), kViewBytes);
  const ViewRecord back = decodeView(kWireToken, "oob-1/mesh/3/", bytes, 12);
  EXPECT_EQ(back.stalled_ns, 5);
  EXPECT_STREQ(back.host, "host-2");
  EXPECT_THROW(decodeView(kWireToken, "oob-1/mesh/4/", bytes, 12), PeerFailure);  // replayed into another round
  EXPECT_THROW(decodeView("another-job-token", "oob-1/mesh/3/", bytes, 12), PeerFailure);
  EXPECT_THROW(decodeView(kWireToken, "oob-1/mesh/3/", bytes, 11), PeerFailure);  // claims another rank
  EXPECT_THROW(decodeView(kWireToken, "oob-1/mesh/3/", bytes.substr(1), 12), PeerFailure);
  const auto rejects = [&](auto&& damage) {
    ViewRecord w = v;
    damage(w);
    EXPECT_THROW(decodeView(kWireToken, "c", encodeView(kWireToken, "c", w), 12), PeerFailure);
  };
  rejects([](ViewRecord& w) { w.stalled_ns = -1; });
  rejects([](ViewRecord& w) { w.checkpoint_ns = -7; });
  rejects([](ViewRecord& w) { w.layer = -2; });
  rejects([](ViewRecord& w) { w.in_collective = 2; });
  rejects([](ViewRecord& w) { w.pad = 1; });
  rejects([](ViewRecord& w) { std::memset(w.host, 'h', sizeof(w.host)); });  // no terminator
  rejects([](ViewRecord& w) { std::strcpy(w.host, "a b"); });
}

TEST(Wire, ANodesShareOfViewsKeepsItsSlotsStrict) {
  ViewRecord v;
  v.rank = 12;
  const std::string view = encodeView(kWireToken, "c", v);
  const std::string share = encodeNodeViews({{2, view}, {5, view}}, 3);
  ASSERT_EQ(share.size(), 3 * kNodeSlotBytes);
  const auto back = decodeNodeViews(share, 3, 8);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].index, 5);
  EXPECT_EQ(back[1].view, view);
  EXPECT_THROW(encodeNodeViews({{1, view}, {2, view}}, 1), InvalidArgument);  // more views than slots
  EXPECT_THROW(decodeNodeViews(share, 2, 8), PeerFailure);                     // another size
  EXPECT_THROW(decodeNodeViews(share, 3, 5), PeerFailure);                     // index 5 of a group of 5
  EXPECT_THROW(decodeNodeViews(encodeNodeViews({{5, view}, {2, view}}, 3), 3, 8), PeerFailure);  // not ascending
  std::string damaged = share;
  damaged[2 * kNodeSlotBytes + 20] = 'x';  // data in the unused slot
  EXPECT_THROW(decodeNodeViews(damaged, 3, 8), PeerFailure);
  std::string gap = encodeNodeViews({{2, view}}, 3);
  std::memcpy(gap.data() + 2 * kNodeSlotBytes, share.data(), kNodeSlotBytes);  // a used slot after an unused one
  EXPECT_THROW(decodeNodeViews(gap, 3, 8), PeerFailure);
}

// A raw client on the server's port: garbage, a request without the token, an oversized
// length; each is dropped (counted, logged), nothing is stored, and the server still
// answers the job's own clients.
TEST(Wire, TheServerDropsWhatItCannotAuthenticate) {
  TcpStoreServer server(0, "127.0.0.1", kWireToken);
  const auto send = [&](const std::string& bytes) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(server.port()));
    ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
    ::shutdown(fd, SHUT_WR);
    char c;
    EXPECT_LE(::recv(fd, &c, 1, 0), 0);  // closed (or reset, data unread) without an answer
    ::close(fd);
  };
  send("GET / HTTP/1.1\r\n\r\n");
  send(encodeRequest("another-job-token", kStoreSet, "oob-1/latest", "99"));
  send(std::string("\x01\x00\x00\x00\x01k\xff\xff\xff\xff", 10));
  EXPECT_EQ(server.refused(), 3u);
  EXPECT_EQ(server.requests(), 0u);
  TcpStoreOptions o;
  o.port = server.port();
  o.token = kWireToken;
  TcpStore job(o);
  EXPECT_FALSE(job.tryGet("oob-1/latest"));
  job.set("oob-1/latest", "3");
  EXPECT_EQ(*job.tryGet("oob-1/latest"), "3");
  o.token = "another-job-token";
  TcpStore stranger(o);
  EXPECT_THROW(stranger.tryGet("oob-1/latest"), IoError);  // refused: no answer to a stranger
}

}  // namespace
}  // namespace lmr::oob
