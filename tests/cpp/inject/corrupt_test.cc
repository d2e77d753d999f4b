#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "inject/float_bits.h"
#include "lmr/common/error.h"
#include "lmr/inject/corrupt.h"

namespace lmr::inject {
namespace {

using detail::bitsToDouble;
using detail::doubleToBits;
using detail::loadBits;

constexpr Dtype kDtypes[] = {Dtype::kFloat16, Dtype::kBFloat16, Dtype::kFloat32, Dtype::kFloat64};
constexpr Scope kScopes[] = {Scope::kSingle, Scope::kRow, Scope::kOnePercent, Scope::kTenPercent, Scope::kAll};

std::vector<unsigned char> randomBuffer(Dtype d, std::int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<unsigned char> buf(n * dtypeSize(d));
  for (std::int64_t i = 0; i < n; ++i) detail::storeBits(buf.data(), d, i, doubleToBits(normal(rng), d));
  return buf;
}

TEST(Float16, RoundTripsEveryPattern) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const double v = detail::halfToDouble(static_cast<std::uint16_t>(b));
    if (std::isnan(v)) continue;
    ASSERT_EQ(detail::doubleToHalf(v), b) << std::hex << b;
    ASSERT_EQ(detail::doubleToBf16(detail::bf16ToDouble(static_cast<std::uint16_t>(b))), b) << std::hex << b;
  }
  EXPECT_EQ(detail::doubleToHalf(65519.0), 0x7BFF);  // rounds down to 65504
  EXPECT_EQ(detail::doubleToHalf(65520.0), 0x7C00);  // ties to even: infinity
  EXPECT_EQ(detail::doubleToHalf(1.0 + std::ldexp(1.0, -11)), 0x3C00);  // half-way, even stays
}

TEST(BitFlips, PositionsPerMagnitude) {
  EXPECT_EQ(flippedBits(Dtype::kFloat32, Operation::kSingleBitflip, Magnitude::kCatastrophic), std::vector<int>{30});
  EXPECT_EQ(flippedBits(Dtype::kFloat32, Operation::kSingleBitflip, Magnitude::kLarge), std::vector<int>{23});
  EXPECT_EQ(flippedBits(Dtype::kFloat32, Operation::kSingleBitflip, Magnitude::kMedium), std::vector<int>{22});
  EXPECT_EQ(flippedBits(Dtype::kFloat32, Operation::kSingleBitflip, Magnitude::kSubtle), std::vector<int>{11});
  EXPECT_EQ(flippedBits(Dtype::kFloat32, Operation::kSingleBitflip, Magnitude::kNearInvisible), std::vector<int>{0});
  EXPECT_EQ(flippedBits(Dtype::kBFloat16, Operation::kSingleBitflip, Magnitude::kLarge), std::vector<int>{7});
  EXPECT_EQ(flippedBits(Dtype::kFloat16, Operation::kSingleBitflip, Magnitude::kMedium), std::vector<int>{9});
  EXPECT_EQ(flippedBits(Dtype::kFloat64, Operation::kSingleBitflip, Magnitude::kCatastrophic), std::vector<int>{62});
  EXPECT_EQ(flippedBits(Dtype::kFloat32, Operation::kMultiBitflip, Magnitude::kCatastrophic),
            (std::vector<int>{30, 29, 28}));
  EXPECT_EQ(flippedBits(Dtype::kFloat32, Operation::kMultiBitflip, Magnitude::kLarge), (std::vector<int>{25, 24, 23}));
  EXPECT_EQ(flippedBits(Dtype::kFloat16, Operation::kMultiBitflip, Magnitude::kNearInvisible),
            (std::vector<int>{2, 1, 0}));
  // Large doubles or halves the value: the exponent's lowest bit.
  float one = 1.5f;
  std::uint32_t u;
  std::memcpy(&u, &one, 4);
  u ^= 1u << 23;
  float changed;
  std::memcpy(&changed, &u, 4);
  EXPECT_EQ(changed, 0.75f);
}

TEST(Selection, DeterministicAndShaped) {
  for (Scope s : kScopes) {
    const Selection a(17, "sdc@5/f", s, 1000, 10);
    const Selection b(17, "sdc@5/f", s, 1000, 10);
    EXPECT_EQ(a.indices(), b.indices());
    EXPECT_FALSE(a.indices().empty());
    for (std::int64_t i : a.indices()) EXPECT_TRUE(a.contains(i));
  }
  EXPECT_EQ(Selection(17, "x", Scope::kSingle, 1000, 10).indices().size(), 1u);
  const auto row = Selection(17, "x", Scope::kRow, 1000, 10).indices();
  ASSERT_EQ(row.size(), 100u);
  EXPECT_EQ(row.front() % 100, 0);
  EXPECT_EQ(row.back(), row.front() + 99);
  EXPECT_EQ(Selection(17, "x", Scope::kAll, 1000, 10).indices().size(), 1000u);
  const auto pct = Selection(17, "x", Scope::kTenPercent, 100000, 1).indices().size();
  EXPECT_NEAR(static_cast<double>(pct), 10000.0, 500.0);
  const auto one = Selection(17, "x", Scope::kOnePercent, 100000, 1).indices().size();
  EXPECT_NEAR(static_cast<double>(one), 1000.0, 160.0);
  EXPECT_EQ(Selection(17, "x", Scope::kOnePercent, 3, 1).indices().size() >= 1, true);  // anchor
  EXPECT_NE(Selection(17, "x", Scope::kTenPercent, 1000, 1).indices(),
            Selection(17, "y", Scope::kTenPercent, 1000, 1).indices());
  EXPECT_NE(Selection(17, "x", Scope::kTenPercent, 1000, 1).indices(),
            Selection(18, "x", Scope::kTenPercent, 1000, 1).indices());
  EXPECT_THROW(Selection(1, "x", Scope::kRow, 10, 3), InvalidArgument);
  EXPECT_THROW(Selection(1, "x", Scope::kAll, 0, 1), InvalidArgument);
}

// Every operation x scope x dtype: exactly the selected elements change, as specified.
TEST(Corrupt, EveryOperationScopeAndDtype) {
  const Operation ops[] = {Operation::kSingleBitflip, Operation::kMultiBitflip, Operation::kSetValue,
                           Operation::kScale,         Operation::kNoise,        Operation::kSignFlip};
  for (Dtype d : kDtypes) {
    for (Scope s : kScopes) {
      for (Operation op : ops) {
        const std::int64_t n = 600, rows = 20;
        auto buf = randomBuffer(d, n, 3);
        const auto before = buf;
        Spec spec;
        spec.operation = op;
        spec.magnitude = Magnitude::kLarge;
        if (op == Operation::kSetValue) spec.value = 7.0;
        const Selection sel(99, "inc@3/f", s, n, rows);
        const Applied a = corrupt(buf.data(), d, n, sel, spec);
        std::uint64_t mask = 0;
        if (op == Operation::kSingleBitflip || op == Operation::kMultiBitflip)
          for (int b : flippedBits(d, op, Magnitude::kLarge)) mask |= std::uint64_t{1} << b;
        const int sign_bit = static_cast<int>(dtypeSize(d) * 8 - 1);
        for (std::int64_t i = 0; i < n; ++i) {
          const std::uint64_t was = loadBits(before.data(), d, i), now = loadBits(buf.data(), d, i);
          if (!sel.contains(i)) {
            ASSERT_EQ(was, now) << "unselected element " << i << " changed";
            continue;
          }
          switch (op) {
            case Operation::kSingleBitflip:
            case Operation::kMultiBitflip: ASSERT_EQ(now, was ^ mask); break;
            case Operation::kSignFlip: ASSERT_EQ(now, was ^ (std::uint64_t{1} << sign_bit)); break;
            case Operation::kSetValue: ASSERT_EQ(bitsToDouble(now, d), 7.0); break;
            case Operation::kScale: ASSERT_EQ(now, doubleToBits(bitsToDouble(was, d) * 100.0, d)); break;
            case Operation::kNoise: ASSERT_NEAR(bitsToDouble(now, d), bitsToDouble(was, d), 8.0); break;
          }
        }
        EXPECT_EQ(a.indices, sel.indices());
        EXPECT_GT(a.changed, 0);
        // The same injection again gives the same result (noise included).
        auto again = before;
        corrupt(again.data(), d, n, sel, spec);
        EXPECT_EQ(again, buf);
      }
    }
  }
}

TEST(Corrupt, SetValueMustFitTheDtype) {
  auto buf = randomBuffer(Dtype::kFloat16, 10, 1);
  const auto before = buf;
  Spec spec;
  spec.operation = Operation::kSetValue;
  spec.value = 1e5;
  EXPECT_THROW(corrupt(buf.data(), Dtype::kFloat16, 10, Selection(1, "x", Scope::kAll, 10, 1), spec), InvalidArgument);
  EXPECT_EQ(buf, before);
  spec.value = std::nan("");
  corrupt(buf.data(), Dtype::kFloat16, 10, Selection(1, "x", Scope::kAll, 10, 1), spec);
  EXPECT_TRUE(std::isnan(loadAsDouble(buf.data(), Dtype::kFloat16, 3)));
  spec.value = -INFINITY;
  const Selection one(1, "y", Scope::kSingle, 10, 1);
  corrupt(buf.data(), Dtype::kFloat16, 10, one, spec);
  EXPECT_EQ(loadAsDouble(buf.data(), Dtype::kFloat16, one.anchor()), -INFINITY);
}

TEST(Retire, ExactRestoreOrDeltaSubtraction) {
  for (Dtype d : kDtypes) {
    const std::int64_t n = 200;
    auto buf = randomBuffer(d, n, 5);
    const auto before = buf;
    Spec spec;
    spec.operation = Operation::kScale;
    spec.factor = 3.0;
    const Applied a = corrupt(buf.data(), d, n, Selection(4, "w@9/f", Scope::kTenPercent, n, 1), spec);
    auto untouched = buf;
    EXPECT_EQ(retire(untouched.data(), d, n, a), static_cast<std::int64_t>(a.indices.size()));
    EXPECT_EQ(untouched, before);  // bit-exact
    // Training moved every element by +0.5 meanwhile: that update survives retirement.
    for (std::int64_t i = 0; i < n; ++i)
      detail::storeBits(buf.data(), d, i, doubleToBits(loadAsDouble(buf.data(), d, i) + 0.5, d));
    EXPECT_EQ(retire(buf.data(), d, n, a), 0);
    const double tol = d == Dtype::kFloat64 ? 1e-12 : (d == Dtype::kFloat32 ? 1e-5 : 0.1);
    for (std::int64_t i = 0; i < n; ++i) {
      EXPECT_NEAR(loadAsDouble(buf.data(), d, i), loadAsDouble(before.data(), d, i) + 0.5, tol) << i;
    }
  }
}

TEST(Overwrite, WritesAndRetires) {
  auto buf = randomBuffer(Dtype::kBFloat16, 50, 8);
  const auto before = buf;
  const auto snapshot = randomBuffer(Dtype::kBFloat16, 3, 9);
  const std::vector<std::int64_t> idx = {4, 17, 49};
  const Applied a = overwrite(buf.data(), Dtype::kBFloat16, 50, idx, snapshot.data());
  for (std::size_t k = 0; k < idx.size(); ++k)
    EXPECT_EQ(loadBits(buf.data(), Dtype::kBFloat16, idx[k]), loadBits(snapshot.data(), Dtype::kBFloat16, k));
  EXPECT_EQ(retire(buf.data(), Dtype::kBFloat16, 50, a), 3);
  EXPECT_EQ(buf, before);
  EXPECT_THROW(overwrite(buf.data(), Dtype::kBFloat16, 50, {50}, snapshot.data()), InvalidArgument);
}

TEST(Retire, NonFiniteDeltaIsRefusedUntouched) {
  auto buf = randomBuffer(Dtype::kFloat32, 16, 2);
  Spec spec;
  spec.operation = Operation::kSetValue;
  spec.value = INFINITY;
  const Applied a = corrupt(buf.data(), Dtype::kFloat32, 16, Selection(1, "x", Scope::kAll, 16, 1), spec);
  EXPECT_EQ(retire(buf.data(), Dtype::kFloat32, 16, a), 16);  // unchanged since: exact restore works
  // A NaN whose payload or sign arithmetic changed still counts as the injected NaN.
  spec.value = std::nan("");
  const Applied n = corrupt(buf.data(), Dtype::kFloat32, 16, Selection(1, "x", Scope::kSingle, 16, 1), spec);
  detail::storeBits(buf.data(), Dtype::kFloat32, n.indices[0], 0xFFC00000u);  // -NaN
  EXPECT_EQ(retire(buf.data(), Dtype::kFloat32, 16, n), 1);
  EXPECT_EQ(loadBits(buf.data(), Dtype::kFloat32, n.indices[0]), n.original[0]);
  const Applied b = corrupt(buf.data(), Dtype::kFloat32, 16, Selection(1, "x", Scope::kAll, 16, 1), spec);
  detail::storeBits(buf.data(), Dtype::kFloat32, 0, doubleToBits(5.0, Dtype::kFloat32));  // training overwrote one
  const auto held = buf;
  EXPECT_THROW(retire(buf.data(), Dtype::kFloat32, 16, b), InvalidArgument);
  EXPECT_EQ(buf, held);
}

TEST(Retire, ARecordThatDoesNotFitTheBufferIsRefusedUntouched) {
  auto big = randomBuffer(Dtype::kFloat32, 64, 3);
  Spec spec;
  spec.operation = Operation::kScale;
  spec.factor = 2.0;
  const Applied a = corrupt(big.data(), Dtype::kFloat32, 64, Selection(7, "w", Scope::kAll, 64, 1), spec);
  // The same record against a smaller tensor (another shard, a replaced parameter): refused
  // before a byte is read or written past its end.
  auto small = randomBuffer(Dtype::kFloat32, 16, 4);
  const auto held = small;
  try {
    retire(small.data(), Dtype::kFloat32, 16, a);
    FAIL() << "retire wrote past a 16-element buffer";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("index 16 outside the tensor's 16 elements"), std::string::npos) << e.what();
  }
  EXPECT_EQ(small, held);
  Applied torn = a;
  torn.injected.pop_back();
  EXPECT_THROW(retire(big.data(), Dtype::kFloat32, 64, torn), InvalidArgument);
  EXPECT_EQ(retire(big.data(), Dtype::kFloat32, 64, a), 64);
}

TEST(Reorder, RotatesRowsByOneAndCountsChangedRows) {
  // Four rows of three int32 values (reorder takes any dtype); rows 1 and 2 are equal.
  std::vector<std::int32_t> buf = {1, 1, 1, 2, 2, 2, 2, 2, 2, 3, 3, 3};
  EXPECT_EQ(reorderRows(buf.data(), 4, 3 * sizeof(std::int32_t)), 3);  // row 2 got an equal row
  EXPECT_EQ(buf, (std::vector<std::int32_t>{3, 3, 3, 1, 1, 1, 2, 2, 2, 2, 2, 2}));
  std::vector<float> same(6, 0.5f);
  EXPECT_EQ(reorderRows(same.data(), 3, 2 * sizeof(float)), 0);
  EXPECT_THROW(reorderRows(same.data(), 1, 6 * sizeof(float)), InvalidArgument);
}

}  // namespace
}  // namespace lmr::inject
