#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "lmr/common/error.h"
#include "lmr/signature/signature.h"
#include "signature/lanes.h"

namespace lmr::signature {
namespace {

using detail::Quad;

std::vector<unsigned char> randomBytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

// The definition, one block at a time, in the order given.
Quad scalarSums(const unsigned char* p, std::size_t n, const std::vector<std::uint64_t>& order) {
  Quad acc{0, 0, 0, 0};
  for (std::uint64_t b : order) {
    unsigned char block[16] = {};
    std::memcpy(block, p + 16 * b, std::min<std::size_t>(16, n - 16 * b));
    Quad w;
    std::memcpy(&w, block, 16);
    detail::addInto(acc, detail::mixBlock(w, b));
  }
  return acc;
}

std::vector<std::uint64_t> inOrder(std::size_t n) {
  std::vector<std::uint64_t> order((n + 15) / 16);
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  return order;
}

bool sameQuad(const Quad& a, const Quad& b) { return a.x0 == b.x0 && a.x1 == b.x1 && a.x2 == b.x2 && a.x3 == b.x3; }

TEST(Signature, VectorLoopMatchesScalarDefinition) {
  auto data = randomBytes(9000, 1);
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n <= 130; ++n) lengths.push_back(n);
  for (std::size_t n : {1023u, 4096u, 4111u, 8191u}) lengths.push_back(n);
  for (std::size_t offset = 0; offset < 4; ++offset) {
    for (std::size_t n : lengths) {
      const unsigned char* p = data.data() + offset;
      const Quad expected = scalarSums(p, n, inOrder(n));
      const Quad got = n == 0 ? Quad{0, 0, 0, 0} : detail::laneSumsCpu(p, n);
      ASSERT_TRUE(sameQuad(got, expected)) << "n=" << n << " offset=" << offset;
    }
  }
}

TEST(Signature, ReductionOrderDoesNotMatter) {
  auto data = randomBytes(16 * 257 + 5, 2);
  auto order = inOrder(data.size());
  const Quad forward = scalarSums(data.data(), data.size(), order);
  std::mt19937 rng(3);
  for (int trial = 0; trial < 5; ++trial) {
    std::shuffle(order.begin(), order.end(), rng);
    EXPECT_TRUE(sameQuad(scalarSums(data.data(), data.size(), order), forward));
  }
  EXPECT_TRUE(sameQuad(detail::laneSumsCpu(data.data(), data.size()), forward));
}

// Frozen values: a change here changes every signature ever recorded (and must be made in
// the CUDA kernel and bench/torch_signature.py too).
TEST(Signature, GoldenValues) {
  std::vector<unsigned char> bytes(67);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(contentCpu(bytes.data(), bytes.size()).hex(), "d349088c1d2302523a7d3ad567e92b2f");
  EXPECT_EQ(contentCpu(nullptr, 0).hex(), "8164ab265cf4762149eaae9239fad3b2");
  TensorMeta meta{"torch.float32", {2, 3}, {3, 1}};
  EXPECT_EQ(metaDigest(meta, 24).hex(), "b39d3d111799f0155da6ec0da6e889f2");
}

struct DtypeCase {
  const char* name;
  std::size_t element_size;
};
const DtypeCase kDtypes[] = {{"torch.uint8", 1},   {"torch.float8_e4m3fn", 1}, {"torch.bfloat16", 2},
                             {"torch.float16", 2}, {"torch.float32", 4},       {"torch.int32", 4},
                             {"torch.float64", 8}, {"torch.int64", 8},         {"torch.complex128", 16}};

Signature signHost(const std::vector<unsigned char>& bytes, const TensorMeta& meta) {
  TensorView view;
  view.data = bytes.data();
  view.nbytes = bytes.size();
  view.meta = meta;
  return sign(view);
}

TEST(Signature, EverySingleBitFlipChangesTheDigest) {
  for (const DtypeCase& dt : kDtypes) {
    const std::int64_t n = 9;  // odd element counts leave a padded tail for small dtypes
    TensorMeta meta{dt.name, {n}, {1}};
    auto bytes = randomBytes(n * dt.element_size, 4);
    const Signature base = signHost(bytes, meta);
    std::set<std::string> seen = {base.digest.bytes()};
    for (std::size_t bit = 0; bit < bytes.size() * 8; ++bit) {
      auto flipped = bytes;
      flipped[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
      const Signature s = signHost(flipped, meta);
      ASSERT_NE(s.content, base.content) << dt.name << " bit " << bit;
      EXPECT_EQ(s.meta, base.meta);
      EXPECT_TRUE(seen.insert(s.digest.bytes()).second) << dt.name << " bit " << bit << " collides";
    }
  }
}

TEST(Signature, PermutingElementsChangesTheDigest) {
  for (const DtypeCase& dt : kDtypes) {
    const std::size_t n = 12;
    const std::size_t es = dt.element_size;
    TensorMeta meta{dt.name, {static_cast<std::int64_t>(n)}, {1}};
    std::vector<unsigned char> bytes(n * es);
    for (std::size_t e = 0; e < n; ++e)  // distinct elements
      for (std::size_t b = 0; b < es; ++b) bytes[e * es + b] = static_cast<unsigned char>(e * 17 + b + 1);
    const Signature base = signHost(bytes, meta);
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = i + 1; j < n; ++j) {
        auto swapped = bytes;
        std::swap_ranges(swapped.begin() + i * es, swapped.begin() + (i + 1) * es, swapped.begin() + j * es);
        EXPECT_NE(signHost(swapped, meta).digest, base.digest) << dt.name << " swap " << i << "," << j;
      }
    }
    auto rotated = bytes;
    std::rotate(rotated.begin(), rotated.begin() + es, rotated.end());
    EXPECT_NE(signHost(rotated, meta).digest, base.digest) << dt.name;
  }
}

TEST(Signature, MetadataChangesTheDigest) {
  auto bytes = randomBytes(24, 5);
  const TensorMeta base{"torch.float32", {2, 3}, {3, 1}};
  const Signature s = signHost(bytes, base);
  const TensorMeta variants[] = {{"torch.int32", {2, 3}, {3, 1}},
                                 {"torch.float32", {3, 2}, {2, 1}},
                                 {"torch.float32", {6}, {1}},
                                 {"torch.float32", {2, 3}, {1, 2}},
                                 {"torch.float32", {1, 2, 3}, {6, 3, 1}}};
  for (const TensorMeta& m : variants) {
    const Signature v = signHost(bytes, m);
    EXPECT_EQ(v.content, s.content);
    EXPECT_NE(v.meta, s.meta);
    EXPECT_NE(v.digest, s.digest);
  }
  // Trailing zero bytes change the byte count, so the content digest too.
  auto longer = bytes;
  longer.push_back(0);
  EXPECT_NE(contentCpu(longer.data(), longer.size()), s.content);
}

TEST(Signature, SingleBitFlipsAvalanche) {
  auto bytes = randomBytes(4096, 6);
  const Digest base = contentCpu(bytes.data(), bytes.size());
  std::mt19937 rng(8);
  double total = 0;
  const int trials = 400;
  for (int t = 0; t < trials; ++t) {
    auto flipped = bytes;
    const std::size_t bit = rng() % (bytes.size() * 8);
    flipped[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    const Digest d = contentCpu(flipped.data(), flipped.size());
    total += std::popcount(d.lo ^ base.lo) + std::popcount(d.hi ^ base.hi);
  }
  const double mean = total / trials;
  EXPECT_GT(mean, 60.0);
  EXPECT_LT(mean, 68.0);
}

TEST(Signature, DigestBytesRoundTrip) {
  const Digest d{0x0123456789abcdefull, 0xfedcba9876543210ull};
  EXPECT_EQ(d.hex(), "efcdab89674523011032547698badcfe");
  EXPECT_EQ(Digest::fromBytes(d.bytes()), d);
  EXPECT_THROW(Digest::fromBytes("short"), InvalidArgument);
}

TEST(Signature, RejectsBadInput) {
  EXPECT_THROW(contentCpu(nullptr, 4), InvalidArgument);
  EXPECT_THROW(metaDigest(TensorMeta{"", {1}, {1}}, 4), InvalidArgument);
  EXPECT_THROW(metaDigest(TensorMeta{"torch.float32", {1, 2}, {1}}, 8), InvalidArgument);
}

TensorView hostView(const std::vector<unsigned char>& bytes, std::size_t offset, std::size_t n) {
  TensorView v;
  v.data = bytes.data() + offset;
  v.nbytes = n;
  v.meta = TensorMeta{"torch.uint8", {static_cast<std::int64_t>(n)}, {1}};
  return v;
}

TEST(Signature, ManyAtOnceEqualOneByOne) {
  const auto bytes = randomBytes(70000, 9);
  std::vector<TensorView> views;
  for (std::size_t n : {0, 1, 15, 16, 17, 4096, 65537})
    for (std::size_t offset : {0, 3})
      if (offset + n <= bytes.size()) views.push_back(hostView(bytes, offset, n));
  const auto many = signMany(views);
  ASSERT_EQ(many.size(), views.size());
  for (std::size_t i = 0; i < views.size(); ++i) {
    const Signature one = sign(views[i]);
    EXPECT_EQ(many[i].digest, one.digest) << i;
    EXPECT_EQ(many[i].content, one.content) << i;
  }
  EXPECT_TRUE(signMany({}).empty());
  std::vector<TensorView> mixed = {views[2], views[2]};
  mixed[1].device = DeviceType::kCuda;
  EXPECT_THROW(signMany(mixed), InvalidArgument);
  std::vector<TensorView> null_data = {views[2]};
  null_data[0].data = nullptr;
  EXPECT_THROW(signMany(null_data), InvalidArgument);
}

TEST(Signature, TensorSetSignsAgainAndAgain) {
  auto bytes = randomBytes(70000, 11);
  std::vector<TensorView> views;
  for (std::size_t n : {0, 1, 17, 4096, 65537}) views.push_back(hostView(bytes, 2, n));
  const TensorSet set(views);
  EXPECT_EQ(set.size(), views.size());
  EXPECT_FALSE(set.onCuda());
  const TensorSet::Pending first = set.launch();
  EXPECT_TRUE(first.ready());
  const auto before = first.wait();
  const auto reference = signMany(views);
  for (std::size_t i = 0; i < views.size(); ++i) EXPECT_EQ(before[i].digest, reference[i].digest) << i;
  bytes[2 + 4000] ^= 1;  // inside every view of at least 4001 bytes
  const auto after = set.launch().wait();
  for (std::size_t i = 0; i < views.size(); ++i)
    EXPECT_EQ(after[i].digest == before[i].digest, views[i].nbytes <= 4000) << i;
  EXPECT_EQ(first.wait()[3].digest, before[3].digest);  // an earlier launch keeps its values
  EXPECT_EQ(TensorSet({}).launch().wait().size(), 0u);
  std::vector<TensorView> mixed = {views[1], views[1]};
  mixed[1].device = DeviceType::kCuda;
  EXPECT_THROW(TensorSet{mixed}, InvalidArgument);
}

TEST(Signature, CudaWithoutDeviceIsUnsupported) {
  if (cudaAvailable()) GTEST_SKIP() << "a CUDA device is visible; covered by the GPU tests";
  int x = 0;
  EXPECT_THROW(contentCuda(&x, sizeof(x), 0, nullptr), Unsupported);
  TensorView v;
  v.data = &x;
  v.nbytes = sizeof(x);
  v.device = DeviceType::kCuda;
  v.meta = TensorMeta{"torch.int32", {1}, {1}};
  EXPECT_THROW(signMany({v}), Unsupported);
  EXPECT_THROW(TensorSet({v}), Unsupported);
}

}  // namespace
}  // namespace lmr::signature
