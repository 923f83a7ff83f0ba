#include "daemon/metrics.h"

#include <cmath>
#include <cstdio>

#include "protocol/base/logging.h"

namespace kvtier {
namespace {

void AppendEscaped(std::string* out, const std::string& v, bool help) {
  for (char c : v) {
    if (c == '\\')
      out->append("\\\\");
    else if (c == '\n')
      out->append("\\n");
    else if (c == '"' && !help)
      out->append("\\\"");
    else
      out->push_back(c);
  }
}

void AppendLabels(std::string* out, const Labels& labels, const char* extra_key = nullptr,
                  const std::string& extra_value = "") {
  if (labels.empty() && extra_key == nullptr) return;
  out->push_back('{');
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out->push_back(',');
    first = false;
    out->append(k);
    out->append("=\"");
    AppendEscaped(out, v, false);
    out->push_back('"');
  }
  if (extra_key) {
    if (!first) out->push_back(',');
    out->append(extra_key);
    out->append("=\"");
    out->append(extra_value);
    out->push_back('"');
  }
  out->push_back('}');
}

std::string FormatDouble(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.0f", v);
    return buf;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  ++count_;
  sum_ += v;
}

std::vector<double> RpcLatencyBuckets() {
  return {5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3,
          5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0};
}

MetricsRegistry::Family& MetricsRegistry::GetFamily(const std::string& name, const std::string& help, Type type) {
  auto it = by_name_.find(name);
  if (it != by_name_.end()) {
    KVTIER_CHECK(it->second->type == type) << "metric " << name << " registered with two types";
    return *it->second;
  }
  families_.push_back(std::make_unique<Family>(Family{name, help, type, {}}));
  by_name_[name] = families_.back().get();
  return *families_.back();
}

Counter* MetricsRegistry::AddCounter(const std::string& name, const std::string& help, Labels labels) {
  Family& f = GetFamily(name, help, Type::kCounter);
  f.series.push_back(Series{std::move(labels), std::make_unique<Counter>(), nullptr, nullptr, {}});
  return f.series.back().counter.get();
}

Gauge* MetricsRegistry::AddGauge(const std::string& name, const std::string& help, Labels labels) {
  Family& f = GetFamily(name, help, Type::kGauge);
  f.series.push_back(Series{std::move(labels), nullptr, std::make_unique<Gauge>(), nullptr, {}});
  return f.series.back().gauge.get();
}

Histogram* MetricsRegistry::AddHistogram(const std::string& name, const std::string& help, std::vector<double> bounds,
                                         Labels labels) {
  Family& f = GetFamily(name, help, Type::kHistogram);
  f.series.push_back(Series{std::move(labels), nullptr, nullptr, std::make_unique<Histogram>(std::move(bounds)), {}});
  return f.series.back().histogram.get();
}

void MetricsRegistry::AddCounterFn(const std::string& name, const std::string& help, Labels labels,
                                   std::function<double()> fn) {
  Family& f = GetFamily(name, help, Type::kCounter);
  f.series.push_back(Series{std::move(labels), nullptr, nullptr, nullptr, std::move(fn)});
}

void MetricsRegistry::AddGaugeFn(const std::string& name, const std::string& help, Labels labels,
                                 std::function<double()> fn) {
  Family& f = GetFamily(name, help, Type::kGauge);
  f.series.push_back(Series{std::move(labels), nullptr, nullptr, nullptr, std::move(fn)});
}

std::string MetricsRegistry::Render() {
  std::string out;
  out.reserve(16 * 1024);
  for (const auto& f : families_) {
    out += "# HELP " + f->name + " ";
    AppendEscaped(&out, f->help, true);
    out += "\n# TYPE " + f->name + " ";
    out += f->type == Type::kCounter ? "counter" : f->type == Type::kGauge ? "gauge" : "histogram";
    out += "\n";
    for (const Series& s : f->series) {
      if (f->type == Type::kCounter) {
        out += f->name;
        AppendLabels(&out, s.labels);
        out += " " + (s.fn ? FormatDouble(s.fn()) : std::to_string(s.counter->value())) + "\n";
      } else if (f->type == Type::kGauge) {
        out += f->name;
        AppendLabels(&out, s.labels);
        out += " " + FormatDouble(s.fn ? s.fn() : s.gauge->value()) + "\n";
      } else {
        const Histogram& h = *s.histogram;
        uint64_t cumulative = 0;
        for (size_t i = 0; i <= h.bounds().size(); ++i) {
          cumulative += h.bucket_counts()[i];
          out += f->name + "_bucket";
          AppendLabels(&out, s.labels, "le", i < h.bounds().size() ? FormatDouble(h.bounds()[i]) : "+Inf");
          out += " " + std::to_string(cumulative) + "\n";
        }
        out += f->name + "_sum";
        AppendLabels(&out, s.labels);
        out += " " + FormatDouble(h.sum()) + "\n";
        out += f->name + "_count";
        AppendLabels(&out, s.labels);
        out += " " + std::to_string(h.count()) + "\n";
      }
    }
  }
  return out;
}

}  // namespace kvtier
