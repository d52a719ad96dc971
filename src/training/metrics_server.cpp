#include "training/metrics_server.h"

#include <cmath>
#include <thread>

#include "core/error.h"
#ifdef MT_HAVE_HTTPLIB
#include <httplib.h>
#endif

namespace mt {

std::string prometheus_text(const std::map<std::string, MetricSample>& metrics) {
  std::string out;
  for (const auto& [name, m] : metrics) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, m.help, name, m.type);
    // The format spells non-finite values NaN, +Inf and -Inf.
    if (std::isnan(m.value)) out += name + " NaN\n";
    else if (std::isinf(m.value)) out += name + (m.value > 0 ? " +Inf\n" : " -Inf\n");
    else out += fmt::format("{} {}\n", name, m.value);
  }
  return out;
}

void MetricsServer::set(const std::string& name, double value, const std::string& help, const char* type) {
  std::lock_guard<std::mutex> lock(mu_);
  MetricSample& m = metrics_[name];
  m.value = value;
  m.help = help;
  m.type = type;
}

std::string MetricsServer::text() const {
  std::lock_guard<std::mutex> lock(mu_);
  return prometheus_text(metrics_);
}

#ifdef MT_HAVE_HTTPLIB
bool metrics_server_available() { return true; }

struct MetricsServer::Http {
  httplib::Server server;
  std::thread thread;
};

MetricsServer::MetricsServer(const std::string& address, int port) : http_(std::make_unique<Http>()) {
  httplib::Server& s = http_->server;
  // A scrape is one small GET: two worker threads, short timeouts and a small request cap keep
  // a slow or hostile client from holding the rank's resources.
  s.new_task_queue = [] { return new httplib::ThreadPool(2); };
  s.set_read_timeout(5, 0);
  s.set_write_timeout(5, 0);
  s.set_idle_interval(0, 100000);
  s.set_keep_alive_max_count(10);
  s.set_keep_alive_timeout(5);
  s.set_payload_max_length(64 * 1024);
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(text(), "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("megatron.cpp metrics: GET /metrics\n", "text/plain");
  });
  if (!s.bind_to_port(address, port))
    fail("--metrics-port {}: cannot listen on {}:{} (in use, or not an address of this machine: see "
         "--metrics-bind-address)",
         port, address, port);
  http_->thread = std::thread([this] { http_->server.listen_after_bind(); });
}

MetricsServer::~MetricsServer() {
  http_->server.stop();
  if (http_->thread.joinable()) http_->thread.join();
}
#else
bool metrics_server_available() { return false; }
struct MetricsServer::Http {};
MetricsServer::MetricsServer(const std::string&, int port) {
  fail("--metrics-port {}: this build has no HTTP server library; install libcpp-httplib-dev "
       "(scripts/install_deps.sh) and rebuild",
       port);
}
MetricsServer::~MetricsServer() = default;
#endif

}  // namespace mt
