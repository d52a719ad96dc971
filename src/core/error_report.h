#pragma once
// Turning any exception into one line for the user; the command entry points use this.
//
// Activity: what the program is doing right now, for errors that carry no context of their own.
// A std::bad_alloc says nothing about what was being allocated, so the entry point asks which
// activity it unwound ("out of memory while building the model (...)").
//
//   { Activity act("building the model"); ... }   // the scope is the activity
//
// When an exception leaves an Activity's scope, its description is kept (the innermost one
// wins) until describe_exception() reports it at the top, or a new Activity starts.
#include <exception>
#include <string>

namespace mt {

class Activity {
 public:
  explicit Activity(std::string what);
  ~Activity();
  Activity(const Activity&) = delete;
  Activity& operator=(const Activity&) = delete;

 private:
  std::string what_;
  int exceptions_;  // std::uncaught_exceptions() on entry: more on exit means unwinding
};

// The innermost activity an exception unwound through on this thread ("" if none).
std::string failed_activity();

// One line describing an exception (e.g. std::current_exception() in a catch block or a
// terminate handler): mt::Error's message as is, bad_alloc as "out of memory while <activity>",
// other exceptions with their message and the activity (which it consumes). Newlines are folded into spaces so the
// result is always a single line.
std::string describe_exception(std::exception_ptr e);

// Prints "<prefix>: error: <message>" on stderr as one line (stdout flushed first).
void print_error_line(const std::string& prefix, const std::string& message);

// Makes std::terminate (an exception escaping a thread or a noexcept function) print
// describe_exception's line with `prefix` and exit with status 1 instead of dumping core.
void report_terminate_as_error(const std::string& prefix);

}  // namespace mt
