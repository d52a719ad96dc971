#pragma once
// `megatron serve`'s HTTP server (cpp-httplib, Debian's libcpp-httplib-dev):
//   PUT  /api             Megatron's text generation server
//   POST /v1/completions  OpenAI-style completions, "stream": true as server-sent events
//   GET  /health, GET /v1/models
// Admission is bounded (--max-concurrent-requests; 503 beyond), every request has a deadline
// (--request-timeout; 504), and SIGTERM/SIGINT drain it: the listener closes, new requests get
// 503, in-flight ones may finish within --shutdown-timeout and are then cancelled.
#include <cstdint>
#include <string>

#include "serve/backend.h"
#include "serve/request.h"

namespace mt::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 5000;  // 0: any free port (printed)
  int64_t max_body_bytes = int64_t{1} << 20;
  int64_t max_concurrent = 8;
  double request_timeout_s = 600;
  double shutdown_timeout_s = 10;
  std::string model_name;
  Limits limits;
};

bool http_server_available();

// SIGTERM and SIGINT, from here on, only record the signal (stop_signal(): 0 until one came);
// SIGPIPE is ignored. run_server installs them itself; the other ranks of a tensor-parallel
// server, which keep stepping until rank 0 tells them to stop, install them too.
void install_stop_handlers();
int stop_signal();

// Binds (failing naming --host/--port), prints "listening on http://HOST:PORT" on stdout, and
// serves until SIGTERM or SIGINT (handled from here on; before, they end the process as usual,
// so a model that is still loading is interrupted at once). Returns after a clean drain.
void run_server(Backend& backend, const ServerOptions& opt);

}  // namespace mt::serve
