#include "daemon/metrics.h"

#include <prometheus/client_metric.h>
#include <prometheus/collectable.h>
#include <prometheus/family.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "protocol/base/logging.h"

namespace kvtier {
namespace {

std::map<std::string, std::string> LabelMap(const Labels& labels) { return {labels.begin(), labels.end()}; }

}  // namespace

// Families of series read from functions, built at each Collect().
class MetricsRegistry::Readings : public prometheus::Collectable {
 public:
  struct Series {
    Labels labels;
    std::function<double()> fn;
  };
  struct Family {
    std::string name, help;
    prometheus::MetricType type;
    std::vector<Series> series;
  };

  void Add(const std::string& name, const std::string& help, prometheus::MetricType type, Labels labels,
           std::function<double()> fn) {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) {
      families_.push_back(Family{name, help, type, {}});
      it = by_name_.emplace(name, families_.size() - 1).first;
    }
    families_[it->second].series.push_back(Series{std::move(labels), std::move(fn)});
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    out.reserve(families_.size());
    for (const Family& f : families_) {
      prometheus::MetricFamily mf{f.name, f.help, f.type, {}};
      mf.metric.reserve(f.series.size());
      for (const Series& s : f.series) {
        prometheus::ClientMetric m;
        for (const auto& [k, v] : s.labels) m.label.push_back({k, v});
        if (f.type == prometheus::MetricType::Counter)
          m.counter.value = s.fn();
        else
          m.gauge.value = s.fn();
        mf.metric.push_back(std::move(m));
      }
      out.push_back(std::move(mf));
    }
    return out;
  }

 private:
  std::vector<Family> families_;  // in registration order
  std::map<std::string, size_t> by_name_;
};

std::vector<double> RpcLatencyBuckets() {
  return {5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3,
          5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0};
}

MetricsRegistry::MetricsRegistry()
    : registry_(std::make_shared<prometheus::Registry>()), readings_(std::make_shared<Readings>()) {}

MetricsRegistry::~MetricsRegistry() = default;

void MetricsRegistry::Claim(const std::string& name, Type type) {
  auto [it, added] = types_.emplace(name, type);
  KVTIER_CHECK(added || it->second == type) << "metric " << name << " registered with two types";
}

Counter* MetricsRegistry::AddCounter(const std::string& name, const std::string& help, Labels labels) {
  Claim(name, Type::kCounter);
  return &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_).Add(LabelMap(labels));
}

Gauge* MetricsRegistry::AddGauge(const std::string& name, const std::string& help, Labels labels) {
  Claim(name, Type::kGauge);
  return &prometheus::BuildGauge().Name(name).Help(help).Register(*registry_).Add(LabelMap(labels));
}

Histogram* MetricsRegistry::AddHistogram(const std::string& name, const std::string& help, std::vector<double> bounds,
                                         Labels labels) {
  Claim(name, Type::kHistogram);
  return &prometheus::BuildHistogram()
              .Name(name)
              .Help(help)
              .Register(*registry_)
              .Add(LabelMap(labels), std::move(bounds));
}

void MetricsRegistry::AddCounterFn(const std::string& name, const std::string& help, Labels labels,
                                   std::function<double()> fn) {
  Claim(name, Type::kCounterFn);
  readings_->Add(name, help, prometheus::MetricType::Counter, std::move(labels), std::move(fn));
}

void MetricsRegistry::AddGaugeFn(const std::string& name, const std::string& help, Labels labels,
                                 std::function<double()> fn) {
  Claim(name, Type::kGaugeFn);
  readings_->Add(name, help, prometheus::MetricType::Gauge, std::move(labels), std::move(fn));
}

std::string MetricsRegistry::Render() {
  ++renders_;
  std::vector<prometheus::MetricFamily> families = readings_->Collect();
  std::vector<prometheus::MetricFamily> own = registry_->Collect();
  families.insert(families.end(), std::make_move_iterator(own.begin()), std::make_move_iterator(own.end()));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace kvtier
