#pragma once
// Client load for the serving benchmarks: rounds of N client threads each sending requests
// back to back, the latency of every request, and the counters a side of a comparison
// reports (p50, p99, requests/s).
#include "common.hpp"

namespace torchloom_bench {

//! What one side of a comparison has measured so far: every request's latency (µs), and the
//! wall time and request count of its rounds.
struct client_samples {
  std::vector<double> us;
  double seconds = 0.0;
  std::int64_t requests = 0;
  std::string error;  //!< the first request that failed, if one did
};

//! One round: `threads` client threads, each calling `request(thread, i)` for i < `per_thread`
//! back to back; adds every call's latency, the round's wall time and its requests to `into`.
//! A call that throws ends its thread's round and is recorded in `into.error`.
template <class Request>
void client_round(int threads, int per_thread, Request&& request, client_samples& into) {
  std::mutex mutex;
  std::vector<std::thread> clients;
  std::vector<double> all;
  all.reserve(static_cast<std::size_t>(threads) * static_cast<std::size_t>(per_thread));
  std::string error;
  const auto start = steady::now();
  for (int t = 0; t < threads; ++t) {
    clients.emplace_back([&, t] {
      std::vector<double> mine;
      mine.reserve(static_cast<std::size_t>(per_thread));
      std::string failed;
      for (int i = 0; i < per_thread; ++i) {
        const auto t0 = steady::now();
        try {
          request(t, i);
        } catch (const std::exception& e) {
          failed = e.what();
          break;
        }
        mine.push_back(us_since(t0));
      }
      std::lock_guard lock(mutex);
      all.insert(all.end(), mine.begin(), mine.end());
      if (error.empty()) error = failed;
    });
  }
  for (auto& c : clients) c.join();
  into.seconds += us_since(start) * 1e-6;
  into.requests += static_cast<std::int64_t>(all.size());
  into.us.insert(into.us.end(), all.begin(), all.end());
  if (into.error.empty()) into.error = error;
}

//! Sets the counters of one side: `<label>_p50_us`, `<label>_p99_us` (nearest rank over every
//! request) and `<label>_rps` (requests per second of its rounds' wall time). Plain values.
inline void set_client_counters(benchmark::State& state, const std::string& label,
                                const client_samples& s) {
  state.counters[label + "_p50_us"] = percentile(s.us, 0.50);
  state.counters[label + "_p99_us"] = percentile(s.us, 0.99);
  state.counters[label + "_rps"] =
      s.seconds > 0.0 ? static_cast<double>(s.requests) / s.seconds : 0.0;
}

}  // namespace torchloom_bench
