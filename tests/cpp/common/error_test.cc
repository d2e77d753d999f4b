#include <gtest/gtest.h>

#include <string>

#include "lmr/common/error.h"
#include "lmr/common/hex.h"
#include "lmr/common/log.h"

namespace lmr {
namespace {

TEST(Error, CarriesKindMessageAndLocation) {
  try {
    throw InvalidArgument("bad field");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_EQ(e.message(), "bad field");
    EXPECT_NE(std::string(e.what()).find("error_test.cc:"), std::string::npos) << e.what();
    EXPECT_GT(e.line(), 0u);
  }
}

TEST(Error, ThrowErrorRaisesTheMatchingType) {
  EXPECT_THROW(throwError(ErrorKind::kInvalidArgument, "x"), InvalidArgument);
  EXPECT_THROW(throwError(ErrorKind::kIo, "x"), IoError);
  EXPECT_THROW(throwError(ErrorKind::kTimeout, "x"), TimeoutError);
  EXPECT_THROW(throwError(ErrorKind::kPeerFailure, "x"), PeerFailure);
  EXPECT_THROW(throwError(ErrorKind::kUnsupported, "x"), Unsupported);
}

TEST(Error, KindNames) {
  EXPECT_EQ(errorKindName(ErrorKind::kInvalidArgument), "InvalidArgument");
  EXPECT_EQ(errorKindName(ErrorKind::kPeerFailure), "PeerFailure");
}

TEST(Log, ParsesLevels) {
  log::Level level = log::Level::kError;
  EXPECT_TRUE(log::parseLevel("DEBUG", &level));
  EXPECT_EQ(level, log::Level::kDebug);
  EXPECT_TRUE(log::parseLevel("warning", &level));
  EXPECT_EQ(level, log::Level::kWarn);
  EXPECT_FALSE(log::parseLevel("loud", &level));
  EXPECT_EQ(level, log::Level::kWarn);
}

TEST(Log, FormatsStringsAndNumbersWithoutStreams) {
  testing::internal::CaptureStderr();
  log::logf(log::Level::kError, "test", "round ", std::int64_t{-7}, " of ", 3u, ": ", 0.25, ' ', true, " ",
            std::string("done"));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("round -7 of 3: 0.25 true done"), std::string::npos) << err;
}

TEST(Hex, RoundTripsAndRejectsBadText) {
  const std::string bytes("\x00\x7f\x80\xff", 4);
  EXPECT_EQ(toHex(bytes), "007f80ff");
  EXPECT_EQ(fromHex("007F80ff"), bytes);
  EXPECT_EQ(fromHex(""), "");
  EXPECT_THROW(fromHex("abc"), InvalidArgument);
  EXPECT_THROW(fromHex("zz"), InvalidArgument);
}

}  // namespace
}  // namespace lmr
