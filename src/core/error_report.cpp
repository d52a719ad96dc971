#include "core/error_report.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <stdexcept>
#include <utility>

#include "core/error.h"

namespace mt {
namespace {
thread_local std::string g_failed;  // innermost activity the current exception left
std::string g_terminate_prefix = "megatron";

[[noreturn]] void on_terminate() {
  const std::exception_ptr e = std::current_exception();
  print_error_line(g_terminate_prefix, e ? describe_exception(e)
                                         : std::string("terminated unexpectedly (a bug in megatron.cpp; please report it)"));
  std::_Exit(1);
}
}  // namespace

Activity::Activity(std::string what) : what_(std::move(what)), exceptions_(std::uncaught_exceptions()) {
  g_failed.clear();  // an earlier, handled exception's activity is stale now
}

Activity::~Activity() {
  if (std::uncaught_exceptions() > exceptions_ && g_failed.empty()) g_failed = what_;
}

std::string failed_activity() { return g_failed; }

std::string describe_exception(std::exception_ptr e) {
  if (!e) return "unknown error (a bug in megatron.cpp; please report it)";
  std::string msg;
  const std::string act = failed_activity();
  g_failed.clear();  // consumed: a later exception must not be blamed on this activity
  const std::string during = act.empty() ? "" : " while " + act;
  try {
    std::rethrow_exception(e);
  } catch (const Error& e) {
    msg = e.what();
  } catch (const std::bad_alloc&) {
    msg = "out of memory" + during + "; use a smaller model, batch or input, or a machine with more memory";
  } catch (const std::length_error& e) {
    msg = "a size is too large" + during + " (" + e.what() + "); use a smaller model, batch or input";
  } catch (const std::exception& e) {
    msg = std::string(e.what()) + (act.empty() ? "" : " (" + during.substr(1) + ")");
  } catch (...) {
    msg = "unknown exception" + during + " (a bug in megatron.cpp; please report it)";
  }
  for (char& c : msg)
    if (c == '\n' || c == '\r') c = ' ';
  return msg;
}

void print_error_line(const std::string& prefix, const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "%s: error: %s\n", prefix.c_str(), message.c_str());
  std::fflush(stderr);
}

void report_terminate_as_error(const std::string& prefix) {
  g_terminate_prefix = prefix;
  std::set_terminate(on_terminate);
}

}  // namespace mt
