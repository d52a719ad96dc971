#include "serve/server.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <memory>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "serve/admission.h"
#include "serve/completion.h"
#include "serve/responses.h"
#ifdef MT_HAVE_HTTPLIB
#include <httplib.h>
#endif

namespace mt::serve {

#ifdef MT_HAVE_HTTPLIB
bool http_server_available() { return true; }

namespace {

using Clock = std::chrono::steady_clock;

struct State {
  State(Backend& b, const ServerOptions& o) : backend(b), opt(o), admission(o.max_concurrent) {}
  Backend& backend;
  const ServerOptions& opt;
  Admission admission;
  std::atomic<bool> cancel_all{false};  // generations in flight stop at their next token
  std::atomic<uint64_t> next_seed{std::random_device{}()};
  std::atomic<uint64_t> next_id{0};
};

void send_error(httplib::Response& res, int status, const std::string& msg) {
  res.status = status;
  if (status == 503) res.set_header("Retry-After", "1");
  res.set_content(error_body(status, msg), "application/json");
}

// A cancelled generation: the server is draining (503) or the request ran out of time (504).
RequestError cancelled(const State& s) {
  if (s.cancel_all) return RequestError(503, "the server shut down before the generation finished");
  return RequestError(504, fmt::format("the generation took longer than the server's --request-timeout of {} s",
                                       s.opt.request_timeout_s));
}

void stream_completion(State& s, httplib::Response& res, std::shared_ptr<void> slot, const ParsedRequest& r,
                       const PreparedPrompt& p, uint64_t seed, const CompletionMeta& meta, Clock::time_point deadline) {
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [&s, slot, r, p, seed, meta, deadline](size_t, httplib::DataSink& sink) {
        bool ok = true;
        auto send = [&](const std::string& e) { return ok = ok && sink.write(e.data(), e.size()); };
        try {
          if (r.echo) send(openai_chunk_event(meta, p.text, ""));
          const Completion c = run_completion(
              s.backend, r, p, seed, [&] { return !ok || s.cancel_all || Clock::now() > deadline; },
              [&](const std::string& piece) { return send(openai_chunk_event(meta, piece, "")); });
          if (c.finish == Finish::Cancelled) {
            const RequestError e = cancelled(s);
            send("data: " + error_body(e.status, e.what()) + "\n\n");
          } else {
            send(openai_chunk_event(meta, "", finish_reason(c)));
          }
          if (r.include_usage)
            send(openai_usage_event(meta, static_cast<int64_t>(p.ids.size()), static_cast<int64_t>(c.tokens.size())));
          send(kDoneEvent);
        } catch (const std::exception& e) {
          send("data: " + error_body(500, e.what()) + "\n\n");
        }
        if (ok) sink.done();
        return ok;
      });
}

void handle_generate(State& s, const httplib::Request& req, httplib::Response& res, Api api) {
  const auto t0 = Clock::now();
  int64_t n_gen = 0;
  try {
    std::shared_ptr<void> slot = s.admission.enter();
    const ParsedRequest r = api == Api::Megatron ? parse_megatron_request(req.body, s.opt.limits)
                                                 : parse_openai_request(req.body, s.opt.limits);
    const std::vector<PreparedPrompt> prompts = prepare(r, s.backend, s.opt.limits);
    const uint64_t seed = r.seed ? *r.seed : s.next_seed.fetch_add(0x9E3779B97F4A7C15ULL);
    const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s.opt.request_timeout_s));
    const CompletionMeta meta{fmt::format("cmpl-{}", s.next_id.fetch_add(1)),
                              static_cast<int64_t>(std::time(nullptr)), s.opt.model_name};
    if (r.stream) {
      stream_completion(s, res, std::move(slot), r, prompts[0], seed, meta, deadline);
      std::fprintf(stderr, "%s %s: streaming\n", req.method.c_str(), req.path.c_str());
      return;
    }
    std::vector<Completion> done;
    for (const PreparedPrompt& p : prompts) {
      done.push_back(run_completion(
          s.backend, r, p, seed, [&] { return s.cancel_all || Clock::now() > deadline; },
          [](const std::string&) { return true; }));
      if (done.back().finish == Finish::Cancelled) throw cancelled(s);
      n_gen += static_cast<int64_t>(done.back().tokens.size());
    }
    const nlohmann::json body = api == Api::Megatron ? megatron_response(r, prompts, done, s.backend.tokenizer())
                                                     : openai_response(meta, r, prompts, done);
    res.status = 200;
    res.set_content(dump_json(body), "application/json");
  } catch (const RequestError& e) {
    send_error(res, e.status, e.what());
  } catch (const std::exception& e) {
    send_error(res, 500, fmt::format("internal error: {}", e.what()));
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::fprintf(stderr, "%s %s: %d, %lld tokens generated in %.2f s\n", req.method.c_str(), req.path.c_str(), res.status,
               static_cast<long long>(n_gen), secs);
}

void add_routes(httplib::Server& svr, State& s) {
  svr.Put("/api", [&s](const httplib::Request& q, httplib::Response& r) { handle_generate(s, q, r, Api::Megatron); });
  svr.Post("/v1/completions",
           [&s](const httplib::Request& q, httplib::Response& r) { handle_generate(s, q, r, Api::OpenAI); });
  svr.Get("/health", [&s](const httplib::Request&, httplib::Response& r) {
    if (s.admission.draining()) return send_error(r, 503, "the server is shutting down");
    r.set_content(R"({"status":"ok"})", "application/json");
  });
  svr.Get("/v1/models", [&s](const httplib::Request&, httplib::Response& r) {
    r.set_content(dump_json({{"object", "list"},
                             {"data", nlohmann::json::array({{{"id", s.opt.model_name},
                                                              {"object", "model"},
                                                              {"created", 0},
                                                              {"owned_by", "megatron.cpp"}}})}}),
                  "application/json");
  });
  // Responses the library makes itself (no route, body too large, unreadable request) get a
  // JSON message too; a handler's own error body is left alone.
  svr.set_error_handler(httplib::Server::HandlerWithResponse([&s](const httplib::Request& q, httplib::Response& r) {
    if (!r.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string msg = fmt::format("HTTP {}", r.status);
    if (r.status == 404)
      msg = fmt::format("no endpoint {} {}: this server offers PUT /api, POST /v1/completions, GET /health and "
                        "GET /v1/models",
                        q.method, q.path.substr(0, 200));
    else if (r.status == 413)
      msg = fmt::format("the request body is over the server's --max-body-bytes of {}", s.opt.max_body_bytes);
    r.set_content(error_body(r.status, msg), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& r, std::exception_ptr) {
    send_error(r, 500, "internal error");
  });
}

// The signal that asked the server to stop (0: none yet). Set from a handler, which may run on
// any thread: a lock-free atomic store is all it does.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);
void on_stop_signal(int sig) { g_stop_signal.store(sig); }

}  // namespace

int stop_signal() { return g_stop_signal.load(); }

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // the HTTP library retries interrupted waits itself
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that hangs up is a failed write, not a dead server
}

void run_server(Backend& backend, const ServerOptions& opt) {
  State s(backend, opt);
  httplib::Server svr;
  // Threads for every admitted request plus a few to answer health checks and refusals.
  const size_t threads = static_cast<size_t>(opt.max_concurrent) + 4;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_read_timeout(30, 0);
  svr.set_write_timeout(30, 0);
  svr.set_idle_interval(0, 100000);
  svr.set_keep_alive_max_count(100);
  svr.set_keep_alive_timeout(5);
  svr.set_payload_max_length(static_cast<size_t>(opt.max_body_bytes));
  // The library's default adds SO_REUSEPORT, with which a second server on the same port binds
  // too and takes a share of the connections; a port in use must be an error instead.
  svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  add_routes(svr, s);
  const int port = opt.port == 0 ? svr.bind_to_any_port(opt.host) : (svr.bind_to_port(opt.host, opt.port) ? opt.port : -1);
  if (port <= 0 && opt.port == 0)
    fail("--host {}: cannot listen on it (not an address of this machine; 127.0.0.1 is this machine only)", opt.host);
  if (port <= 0)
    fail("--port {}: cannot listen on {}:{} (in use, or --host is not an address of this machine)", opt.port, opt.host,
         opt.port);
  std::printf("megatron serve: listening on http://%s:%d (PUT /api, POST /v1/completions)\n", opt.host.c_str(), port);
  std::fflush(stdout);
  install_stop_handlers();
  std::thread listener([&svr] { svr.listen_after_bind(); });
  // stop() only acts on a running server: a signal at once must not find it still starting.
  for (int i = 0; i < 500 && !svr.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));

  std::string fatal;
  while (g_stop_signal.load() == 0 && (fatal = backend.fatal_error()).empty())
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (fatal.empty())
    std::fprintf(stderr, "megatron serve: signal %d, draining (at most %.0f s)\n", g_stop_signal.load(),
                 opt.shutdown_timeout_s);
  s.admission.drain();
  svr.stop();  // closes the listener; requests in flight go on
  if (!s.admission.wait_idle(std::chrono::duration<double>(opt.shutdown_timeout_s))) {
    s.cancel_all = true;  // generations stop at their next token
    s.admission.wait_idle(std::chrono::seconds(30));
  }
  listener.join();
  if (!fatal.empty()) fail("serve: the generation engine stopped: {}", fatal);
  std::fprintf(stderr, "megatron serve: stopped\n");
}

#else
bool http_server_available() { return false; }
int stop_signal() { return 0; }
void install_stop_handlers() {}
void run_server(Backend&, const ServerOptions&) {
  fail("serve: this build has no HTTP server library; install libcpp-httplib-dev (scripts/install_deps.sh) and rebuild");
}
#endif

}  // namespace mt::serve
