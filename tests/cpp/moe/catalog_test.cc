#include "lmr/moe/catalog.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "lmr/common/error.h"

namespace lmr::moe {
namespace {

std::vector<Shape> randomShapes(std::uint64_t seed, std::size_t n) {
  std::mt19937_64 rng(seed);
  std::vector<Shape> out;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t fp = rng() % 3;
    const std::size_t k = 1 + fp;  // each fingerprint has its own path count
    Shape s;
    s.fingerprint = "L";
    s.fingerprint += std::to_string(fp);
    for (std::size_t j = 0; j < k; ++j) s.paths.push_back(static_cast<std::int64_t>(rng() % 12));
    out.push_back(s);
  }
  return out;
}

TEST(MoeCatalog, CoverRules) {
  const Shape a{"L1", {4, 3}};
  EXPECT_TRUE(covers(a, a));
  EXPECT_TRUE(covers(a, Shape{"L1", {4, 0}}));
  EXPECT_FALSE(covers(a, Shape{"L1", {5, 0}}));
  EXPECT_FALSE(covers(a, Shape{"L2", {1, 1}}));
  EXPECT_FALSE(covers(a, Shape{"L1", {1}}));
}

TEST(MoeCatalog, SkylineIsTheExactNonDominatedSet) {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    std::vector<Shape> shapes = randomShapes(seed, 300);
    const std::vector<Shape> fast = skyline(shapes);
    EXPECT_EQ(fast, skylineNaive(shapes)) << "seed " << seed;
    for (const Shape& s : shapes)
      EXPECT_TRUE(std::any_of(fast.begin(), fast.end(), [&](const Shape& r) { return covers(r, s); }));
    for (const Shape& a : fast)
      for (const Shape& b : fast)
        if (!(a == b)) {
          EXPECT_FALSE(covers(a, b));
        }
    std::shuffle(shapes.begin(), shapes.end(), std::mt19937_64(seed * 7));
    EXPECT_EQ(skyline(shapes), fast);
  }
}

TEST(MoeCatalog, IncrementalRepresentativesMatchTheSkyline) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const std::vector<Shape> shapes = randomShapes(seed, 500);
    Catalog c;
    std::size_t fresh = 0;
    for (const Shape& s : shapes) fresh += c.admit(s) ? 1 : 0;
    EXPECT_EQ(fresh, c.admitted());
    EXPECT_EQ(c.representatives(), skyline(shapes));
    EXPECT_FALSE(c.uncovered().has_value());
    EXPECT_DOUBLE_EQ(c.compression(), 1.0 - double(c.representativeCount()) / double(c.admitted()));
    EXPECT_GT(c.memoryBytes(), 0u);
  }
}

TEST(MoeCatalog, AdmitCountsNewShapesOnly) {
  Catalog c;
  EXPECT_DOUBLE_EQ(c.compression(), 0.0);
  EXPECT_TRUE(c.admit({"L0", {2, 2}}));
  EXPECT_FALSE(c.admit({"L0", {2, 2}}));
  EXPECT_TRUE(c.admit({"L0", {1, 2}}));
  EXPECT_TRUE(c.admit({"L0", {3, 0}}));
  EXPECT_EQ(c.admitted(), 3u);
  EXPECT_EQ(c.representatives(), (std::vector<Shape>{{"L0", {2, 2}}, {"L0", {3, 0}}}));
  EXPECT_TRUE(c.admit({"L0", {3, 3}}));  // covers both: the only representative left
  EXPECT_EQ(c.representatives(), (std::vector<Shape>{{"L0", {3, 3}}}));
  EXPECT_DOUBLE_EQ(c.compression(), 0.75);
}

TEST(MoeCatalog, ABoundedMemoryKeepsTheRepresentativesExact) {
  // Keeps 2 shapes; the representatives are those of an unbounded catalog all the same.
  Catalog bounded(2), full;
  const std::vector<Shape> shapes = randomShapes(7, 400);
  for (const Shape& s : shapes) {
    bounded.admit(s);
    full.admit(s);
  }
  EXPECT_EQ(bounded.remembered(), 2u);
  EXPECT_EQ(bounded.representatives(), full.representatives());
  EXPECT_GE(bounded.admitted(), full.admitted());  // repeats of shapes not kept count again
  EXPECT_FALSE(bounded.uncovered());
  // A repeat of a representative never counts again, kept or not.
  const std::size_t before = bounded.admitted();
  EXPECT_FALSE(bounded.admit(full.representatives().front()));
  EXPECT_EQ(bounded.admitted(), before);
}

TEST(MoeCatalog, ACycleEndsWhenEveryCurrentRepresentativeWasReplayed) {
  Catalog c;
  for (const Shape& s : {Shape{"A", {4, 0}}, Shape{"A", {0, 4}}, Shape{"A", {2, 2}}, Shape{"B", {1}}}) c.admit(s);
  EXPECT_FALSE(c.cycleComplete());
  // Two per check: A's three representatives rotate, B's one is in every window.
  EXPECT_EQ(c.window(0, 2), (std::vector<Shape>{{"A", {0, 4}}, {"A", {2, 2}}, {"B", {1}}}));
  EXPECT_EQ(c.window(1, 2), (std::vector<Shape>{{"A", {0, 4}}, {"A", {4, 0}}, {"B", {1}}}));
  EXPECT_EQ(c.window(5, 0).size(), 4u);
  c.replayed(c.window(0, 2));
  EXPECT_FALSE(c.cycleComplete());
  c.replayed(c.window(1, 2));
  EXPECT_TRUE(c.cycleComplete());
  // A new shape evicts one representative: its own replay is still missing.
  c.admit({"A", {5, 1}});
  EXPECT_FALSE(c.cycleComplete());
  c.replayed({{"A", {5, 1}}});
  EXPECT_TRUE(c.cycleComplete());
  c.startCycle();
  EXPECT_FALSE(c.cycleComplete());
  EXPECT_FALSE(Catalog().cycleComplete());
}

TEST(MoeCatalog, RegimeTokensRoundUpByAtMostAQuarter) {
  EXPECT_EQ(regimeTokens(0, 16), 0);
  EXPECT_EQ(regimeTokens(1, 16), 16);
  EXPECT_EQ(regimeTokens(33, 16), 48);
  EXPECT_EQ(regimeTokens(64, 16), 64);
  EXPECT_EQ(regimeTokens(65, 16), 80);
  EXPECT_EQ(regimeTokens(2048, 16), 2048);
  EXPECT_EQ(regimeTokens(2049, 16), 2560);
  EXPECT_EQ(regimeTokens(1500, 1), 1536);
  EXPECT_EQ(regimeTokens(5, 1), 5);
  for (std::int64_t n = 1; n < 5000; ++n) {
    const std::int64_t r = regimeTokens(n, 1);
    EXPECT_GE(r, n);
    EXPECT_LE(4 * r, 5 * n + 3 * 4) << n;  // at most a quarter more (plus rounding below 8)
    EXPECT_EQ(regimeTokens(r, 1), r) << n;  // a regime count is its own regime
  }
  EXPECT_THROW(regimeTokens(-1, 1), InvalidArgument);
  EXPECT_THROW(regimeTokens(5, 0), InvalidArgument);
}

TEST(MoeCatalog, BadShapesAreRefusedAndChangeNothing) {
  Catalog c;
  c.admit({"L0", {1}});
  try {
    c.admit({"L0", {1, -2}});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("negative count -2 on path 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(c.admit({"", {1}}), InvalidArgument);
  EXPECT_EQ(c.admitted(), 1u);
  try {
    skyline({{"L0", {1}}, {"L0", {-1}}});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("shape 1"), std::string::npos) << e.what();
  }
}

TEST(MoeCatalog, RotationVisitsEveryRepresentative) {
  EXPECT_EQ(rotation(0, 5, 2), (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(rotation(1, 5, 2), (std::vector<std::size_t>{2, 3}));
  EXPECT_EQ(rotation(2, 5, 2), (std::vector<std::size_t>{4, 0}));
  EXPECT_EQ(rotation(7, 3, 0), (std::vector<std::size_t>{0, 1, 2}));
  EXPECT_EQ(rotation(7, 3, 5), (std::vector<std::size_t>{0, 1, 2}));
  EXPECT_TRUE(rotation(3, 0, 2).empty());
}

}  // namespace
}  // namespace lmr::moe
