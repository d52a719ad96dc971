#pragma once
// Live metrics in Prometheus' text exposition format (version 0.0.4) over HTTP, GET /metrics,
// served by a background thread of the logging rank (--metrics-port). The HTTP side is
// cpp-httplib (Debian's libcpp-httplib-dev) with bounded timeouts, request size and threads;
// where the build lacks it, metrics_server_available() is false and --metrics-port is refused.
// The values are set by the training loop (run_metrics.h) and read under a mutex.
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace mt {

bool metrics_server_available();

// The exposition text of a set of samples: # HELP / # TYPE lines and one sample per metric.
struct MetricSample {
  double value = 0;
  std::string help;
  std::string type = "gauge";  // or "counter"
};
std::string prometheus_text(const std::map<std::string, MetricSample>& metrics);

class MetricsServer {
 public:
  // Listens on address:port at once; fails naming --metrics-port when it cannot.
  MetricsServer(const std::string& address, int port);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  void set(const std::string& name, double value, const std::string& help, const char* type = "gauge");
  std::string text() const;

 private:
  struct Http;
  mutable std::mutex mu_;
  std::map<std::string, MetricSample> metrics_;
  std::unique_ptr<Http> http_;
};

}  // namespace mt
