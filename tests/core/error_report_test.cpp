// describe_exception: every exception becomes one line, a bad_alloc names what was being done;
// report_terminate_as_error: an exception escaping a thread exits with that line, not a core dump.
#include <gtest/gtest.h>

#include <new>
#include <stdexcept>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/error_report.h"

namespace mt {
namespace {

template <typename F>
std::string line_of(F&& throwing) {
  try {
    throwing();
  } catch (...) {
    return describe_exception(std::current_exception());
  }
  return "(nothing thrown)";
}

TEST(ErrorReport, ProjectErrorsAsTheyAre) {
  EXPECT_EQ(line_of([] { fail("--lr must be positive (got {})", 0); }), "--lr must be positive (got 0)");
}

TEST(ErrorReport, BadAllocNamesTheInnermostActivity) {
  const std::string line = line_of([] {
    Activity outer("training");
    Activity inner("building the model (30080 parameters)");
    throw std::bad_alloc();
  });
  EXPECT_NE(line.find("out of memory while building the model (30080 parameters)"), std::string::npos) << line;
  EXPECT_EQ(line.find("training"), std::string::npos) << line;
}

TEST(ErrorReport, BadAllocWithoutActivity) {
  const std::string line = line_of([] { throw std::bad_alloc(); });
  EXPECT_EQ(line.rfind("out of memory;", 0), 0u) << line;
}

TEST(ErrorReport, AHandledExceptionDoesNotNameALaterFailure) {
  const std::string line = line_of([] {
    Activity outer("generating");
    try {
      Activity inner("reading the prompt");
      throw std::runtime_error("handled");
    } catch (const std::runtime_error&) {
    }
    Activity next("sampling");  // a new activity forgets the handled one
    throw std::bad_alloc();
  });
  EXPECT_NE(line.find("while sampling"), std::string::npos) << line;
}

TEST(ErrorReport, ForeignExceptionsKeepTheirMessageAndActivity) {
  const std::string line = line_of([] {
    Activity act("reading --config");
    throw std::out_of_range("map::at");
  });
  EXPECT_EQ(line, "map::at (while reading --config)");
  EXPECT_NE(line_of([] { throw std::length_error("vector::reserve"); }).find("too large"), std::string::npos);
}

TEST(ErrorReport, NonStandardExceptions) {
  EXPECT_NE(line_of([] { throw 42; }).find("unknown exception"), std::string::npos);
  EXPECT_NE(describe_exception(nullptr).find("unknown error"), std::string::npos);
}

TEST(ErrorReport, AlwaysOneLine) {
  EXPECT_EQ(line_of([] { throw std::runtime_error("line one\nline two\r\n"); }), "line one line two  ");
}

TEST(ErrorReportDeathTest, ExceptionEscapingAThreadIsOneLine) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        report_terminate_as_error("megatron test");
        std::thread([] { throw std::runtime_error("boom in a worker"); }).join();
      },
      testing::ExitedWithCode(1), "^megatron test: error: boom in a worker\n$");
}

}  // namespace
}  // namespace mt
