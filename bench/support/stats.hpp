#pragma once
// Statistics of timed samples (PERF.md's method: medians and p99s, nearest rank).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace torchloom_bench {

//! Nearest-rank percentile q (0 < q <= 1) of an ascending sample; 0 for an empty one.
inline double nearest_rank(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0.0;
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[rank == 0 ? 0 : rank - 1];
}

//! Nearest-rank percentile q of a sample in any order.
inline double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return nearest_rank(v, q);
}

//! The median of an ascending sample (the mean of the middle two for an even count).
inline double median_of_sorted(const std::vector<double>& sorted) {
  if (sorted.empty()) return 0.0;
  const std::size_t mid = sorted.size() / 2;
  return sorted.size() % 2 == 1 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2.0;
}

//! The median of a sample in any order.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return median_of_sorted(v);
}

//! The 99th percentile (nearest rank); also a Google Benchmark statistic over repetitions.
inline double p99(const std::vector<double>& v) { return percentile(v, 0.99); }

//! The smallest and largest value (0 for an empty sample): the spread over repetitions.
inline double min_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end());
}
inline double max_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
}

}  // namespace torchloom_bench
