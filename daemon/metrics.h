#pragma once
// MetricsRegistry: counters, gauges and histograms rendered in the Prometheus text
// exposition format (version 0.0.4).
//
// prometheus-cpp is not packaged by Debian 12, so kvtier keeps this small registry (see
// docs/architecture.md). Metrics are plain integers and doubles: the registry, every
// metric and Render() belong to the daemon's control thread, which is also the thread
// that serves scrapes, so nothing needs atomics. Not thread-safe.
//
// Naming follows Prometheus conventions (checked by `promtool check metrics`): base units
// in the name (_bytes, _seconds), counters end in _total.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kvtier {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Inc(uint64_t n = 1) { value_ += n; }
  uint64_t value() const { return value_; }

 private:
  uint64_t value_ = 0;
};

class Gauge {
 public:
  void Set(double v) { value_ = v; }
  void Add(double v) { value_ += v; }
  double value() const { return value_; }

 private:
  double value_ = 0;
};

class Histogram {
 public:
  // `bounds`: increasing bucket upper bounds; +Inf is implicit.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }
  const std::vector<double>& bounds() const { return bounds_; }
  const std::vector<uint64_t>& bucket_counts() const { return counts_; }  // not cumulative

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  uint64_t count_ = 0;
  double sum_ = 0;
};

// Buckets for RPC latencies: 5 us .. 1 s.
std::vector<double> RpcLatencyBuckets();

class MetricsRegistry {
 public:
  // Returns the series `name{labels}`, creating its family on first use. All series of a
  // family must share a type and help text. Pointers stay valid for the registry's life.
  Counter* AddCounter(const std::string& name, const std::string& help, Labels labels = {});
  Gauge* AddGauge(const std::string& name, const std::string& help, Labels labels = {});
  Histogram* AddHistogram(const std::string& name, const std::string& help, std::vector<double> bounds,
                          Labels labels = {});

  // Series whose value is read from `fn` at each Render(): the way to export state that
  // another component already counts (CacheManager's counters, tier occupancy). `fn` must
  // stay callable for the registry's life.
  void AddCounterFn(const std::string& name, const std::string& help, Labels labels, std::function<double()> fn);
  void AddGaugeFn(const std::string& name, const std::string& help, Labels labels, std::function<double()> fn);

  // The text exposition format, families in registration order.
  std::string Render();

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Series {
    Labels labels;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
    std::function<double()> fn;  // counters and gauges read at Render()
  };
  struct Family {
    std::string name;
    std::string help;
    Type type;
    std::vector<Series> series;
  };
  Family& GetFamily(const std::string& name, const std::string& help, Type type);

  std::vector<std::unique_ptr<Family>> families_;
  std::map<std::string, Family*> by_name_;
};

}  // namespace kvtier
