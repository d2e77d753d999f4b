// The comma-list parser both CLIs use (lmr --ranks, lmr-oobd --group-ranks): the inputs each
// accepted before it existed stay accepted, and the ones they rejected stay errors.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "lmr/common/error.h"
#include "lmr/common/list.h"

namespace lmr {
namespace {

using Items = std::vector<std::string>;
using Ints = std::vector<std::int64_t>;

TEST(SplitCommaList, KeepsEveryItemUntrimmedEmptyOnesIncluded) {
  EXPECT_EQ(splitCommaList(""), Items({""}));
  EXPECT_EQ(splitCommaList("a"), Items({"a"}));
  EXPECT_EQ(splitCommaList("a,b,c"), Items({"a", "b", "c"}));
  EXPECT_EQ(splitCommaList("a,,b"), Items({"a", "", "b"}));
  EXPECT_EQ(splitCommaList("a,"), Items({"a", ""}));
  EXPECT_EQ(splitCommaList(",a"), Items({"", "a"}));
  EXPECT_EQ(splitCommaList(","), Items({"", ""}));
  EXPECT_EQ(splitCommaList(" a , b "), Items({" a ", " b "}));
}

TEST(ParseIntegerList, ReadsIntegersAsStrtollDoes) {
  EXPECT_EQ(parseIntegerList("7", "--ranks"), Ints({7}));
  EXPECT_EQ(parseIntegerList("10,11,12", "--ranks"), Ints({10, 11, 12}));
  EXPECT_EQ(parseIntegerList("-3,+4,0", "--ranks"), Ints({-3, 4, 0}));
  EXPECT_EQ(parseIntegerList(" 1,\t2", "--ranks"), Ints({1, 2}));  // leading whitespace
  EXPECT_EQ(parseIntegerList("007", "--ranks"), Ints({7}));        // base 10, not octal
  EXPECT_EQ(parseIntegerList("99999999999999999999", "--ranks"), Ints({std::numeric_limits<std::int64_t>::max()}));
  EXPECT_EQ(parseIntegerList("0,1,-0", "--group-ranks", 0), Ints({0, 1, 0}));
}

std::string errorOf(const std::string& text, std::int64_t min = std::numeric_limits<std::int64_t>::min()) {
  try {
    parseIntegerList(text, "--ranks", min);
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "(accepted)";
}

class ParseIntegerListRejects : public ::testing::TestWithParam<const char*> {};

TEST_P(ParseIntegerListRejects, AnItemThatIsNotAnInteger) {
  const std::string text = GetParam();
  const std::string message = errorOf(text);
  EXPECT_EQ(message.rfind("--ranks: not an integer: '", 0), 0u) << text << " -> " << message;
}

INSTANTIATE_TEST_SUITE_P(EdgeCases, ParseIntegerListRejects,
                         ::testing::Values("", ",", "1,,2", "1,", ",1", "1 ", "1 ,2", " ", "1x", "x", "1.5", "0x10",
                                           "+", "-", "1;2"));

TEST(ParseIntegerList, NamesTheOptionAndTheBadItem) {
  EXPECT_EQ(errorOf("1,x,3"), "--ranks: not an integer: 'x'");
  EXPECT_EQ(errorOf("1,"), "--ranks: not an integer: ''");
  EXPECT_EQ(errorOf("2,-1", 0), "--ranks: must be at least 0: '-1'");
  EXPECT_EQ(errorOf("-1"), "(accepted)");
}

}  // namespace
}  // namespace lmr
