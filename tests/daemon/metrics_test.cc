#include "daemon/metrics.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

TEST(Metrics, RendersTheTextExpositionFormat) {
  MetricsRegistry r;
  Counter* a = r.AddCounter("kvtier_test_total", "A test counter.", {{"tier", "host"}});
  Counter* b = r.AddCounter("kvtier_test_total", "A test counter.", {{"tier", "gpu"}});
  a->Increment(3);
  b->Increment();
  uint64_t external = 41;
  r.AddCounterFn("kvtier_fn_total", "Read at render.", {}, [&] { return external + 1; });
  r.AddGaugeFn("kvtier_ratio", "Quote \" and \\ in help.", {{"k", "a\"b"}}, [] { return 0.5; });
  Histogram* h = r.AddHistogram("kvtier_op_seconds", "Latency.", {0.001, 0.01});
  h->Observe(0.0005);
  h->Observe(0.005);
  h->Observe(5);
  const std::string text = r.Render();
  EXPECT_NE(text.find("# HELP kvtier_test_total A test counter.\n# TYPE kvtier_test_total counter\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("kvtier_test_total{tier=\"host\"} 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("kvtier_test_total{tier=\"gpu\"} 1\n"), std::string::npos) << text;
  EXPECT_EQ(a->Value(), 3);
  EXPECT_NE(text.find("kvtier_fn_total 42\n"), std::string::npos) << text;
  external = 99;  // read again at the next render
  EXPECT_NE(r.Render().find("kvtier_fn_total 100\n"), std::string::npos);
  EXPECT_NE(text.find("kvtier_ratio{k=\"a\\\"b\"} 0.5\n"), std::string::npos) << text;
  EXPECT_NE(text.find("kvtier_op_seconds_bucket{le=\"0.001\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("kvtier_op_seconds_bucket{le=\"0.01\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("kvtier_op_seconds_bucket{le=\"+Inf\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("kvtier_op_seconds_count 3\n"), std::string::npos);
  // One HELP/TYPE per family.
  size_t n = 0;
  for (size_t p = 0; (p = text.find("# TYPE kvtier_test_total", p)) != std::string::npos; ++p) ++n;
  EXPECT_EQ(n, 1u);
}

}  // namespace
}  // namespace kvtier
