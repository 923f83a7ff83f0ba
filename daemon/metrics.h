#pragma once
// MetricsRegistry: the daemon's metric catalogue on prometheus-cpp (Debian's
// prometheus-cpp-dev, the core library only).
//
// Series the daemon updates itself (op latencies, rejected frames) are prometheus-cpp's
// own Counter, Gauge and Histogram, in families of a prometheus::Registry. Series whose
// value another component already counts (CacheManager's counters, tier occupancy, the
// NVMe and remote tiers' stats) are read from a function at each Render(): they live in
// a prometheus::Collectable of this registry's that builds their families at collect
// time, so no count is kept twice. Render() serializes both with prometheus-cpp's text
// serializer (exposition format 0.0.4); the HTTP listener (metrics_http.h) serves it.
//
// Naming follows Prometheus conventions (checked by `promtool check metrics`): base units
// in the name (_bytes, _seconds), counters end in _total. A name belongs to one type and
// one help text. Add* and Render() run on the daemon's control thread (the functions
// read its state); prometheus-cpp's series may be updated from any thread.

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace prometheus {
class Registry;
}

namespace kvtier {

using Labels = std::vector<std::pair<std::string, std::string>>;
using Counter = prometheus::Counter;
using Gauge = prometheus::Gauge;
using Histogram = prometheus::Histogram;

// Buckets for RPC latencies: 5 us .. 1 s.
std::vector<double> RpcLatencyBuckets();

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Returns the series `name{labels}`, creating its family on first use. Pointers stay
  // valid for the registry's life.
  Counter* AddCounter(const std::string& name, const std::string& help, Labels labels = {});
  Gauge* AddGauge(const std::string& name, const std::string& help, Labels labels = {});
  // `bounds`: increasing bucket upper bounds; +Inf is implicit.
  Histogram* AddHistogram(const std::string& name, const std::string& help, std::vector<double> bounds,
                          Labels labels = {});

  // Series whose value is read from `fn` at each Render(). `fn` must stay callable for
  // the registry's life.
  void AddCounterFn(const std::string& name, const std::string& help, Labels labels, std::function<double()> fn);
  void AddGaugeFn(const std::string& name, const std::string& help, Labels labels, std::function<double()> fn);

  // The text exposition format.
  std::string Render();
  // Render() calls so far.
  uint64_t renders() const { return renders_; }

 private:
  enum class Type { kCounter, kGauge, kHistogram, kCounterFn, kGaugeFn };
  class Readings;  // the Collectable of the function-read series
  // CHECKs that `name` keeps one type.
  void Claim(const std::string& name, Type type);

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<Readings> readings_;
  std::map<std::string, Type> types_;
  uint64_t renders_ = 0;
};

}  // namespace kvtier
