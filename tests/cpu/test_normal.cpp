// testkit::ZigguratNormal (testing/normal.h), the N(0, 1) source of the benches' synthetic layers:
// moments, tail masses and the CDF of 2^22 samples against the normal's, each within a few standard
// errors (fixed seeds, so the test is deterministic), and reproducibility by seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "testing/normal.h"

namespace fp4moe::testkit {
namespace {

TEST(ZigguratNormal, MatchesTheStandardNormal) {
  for (const uint64_t seed : {1ull, 77ull}) {
    ZigguratNormal z(seed);
    const int n = 1 << 22;
    std::vector<double> v(n);
    double sum = 0, sq = 0, quad = 0;
    for (double& x : v) {
      x = z();
      sum += x, sq += x * x, quad += x * x * x * x;
    }
    const double mean = sum / n, var = sq / n - mean * mean;
    EXPECT_NEAR(mean, 0.0, 5.0 / std::sqrt(n)) << "seed " << seed;
    EXPECT_NEAR(var, 1.0, 5.0 * std::sqrt(2.0 / n)) << "seed " << seed;
    EXPECT_NEAR(quad / n, 3.0, 5.0 * std::sqrt(96.0 / n)) << "seed " << seed;  // E x^4 = 3, Var x^4 = 96
    // Two-sided tail masses, including beyond the ziggurat's last layer (R = 3.44: its tail method).
    for (const double t : {1.0, 2.0, 2.5, 3.0, 3.5, 4.0}) {
      const double p = std::erfc(t / std::sqrt(2.0));
      const double got = static_cast<double>(std::count_if(v.begin(), v.end(), [t](double x) { return std::fabs(x) > t; }));
      EXPECT_NEAR(got, p * n, 5.0 * std::sqrt(p * (1 - p) * n)) << "seed " << seed << " P(|x| > " << t << ")";
    }
    // Kolmogorov–Smirnov: D below 1.95 / sqrt(n) (the 0.1 % critical value).
    std::sort(v.begin(), v.end());
    double d = 0;
    for (int i = 0; i < n; ++i) {
      const double cdf = 0.5 * std::erfc(-v[i] / std::sqrt(2.0));
      d = std::max({d, std::fabs(cdf - static_cast<double>(i) / n), std::fabs(cdf - static_cast<double>(i + 1) / n)});
    }
    EXPECT_LT(d, 1.95 / std::sqrt(n)) << "seed " << seed;
    EXPECT_TRUE(std::isfinite(v.front()) && std::isfinite(v.back()));
  }
}

TEST(ZigguratNormal, SameSeedSameStreamOtherSeedOther) {
  ZigguratNormal a(5), b(5), c(6);
  int differ = 0;
  for (int i = 0; i < 1000; ++i) {
    const float x = a(), y = b(), w = c();
    EXPECT_EQ(x, y) << i;
    differ += x != w;
  }
  EXPECT_GT(differ, 990);
}

}  // namespace
}  // namespace fp4moe::testkit
