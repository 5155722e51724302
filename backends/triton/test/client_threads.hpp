#pragma once
// Requests from several client threads at once, for the serving tests: each thread sends its
// requests one after another, and a request that goes wrong says why.
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace torchloom_triton_test {

//! Runs `request(thread, index)` for `per_thread` indices on each of `threads` threads; it
//! returns "" for a right answer, else what was wrong. Returns how many went wrong and the
//! first reason, prefixed with its thread.
template <class Request>
std::pair<int, std::string> from_clients(int threads, int per_thread, Request&& request) {
  std::atomic<int> bad{0};
  std::mutex mutex;
  std::string first;
  std::vector<std::thread> clients;
  for (int t = 0; t < threads; ++t) {
    clients.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) {
        const std::string why = request(t, i);
        if (why.empty()) continue;
        ++bad;
        const std::lock_guard lock(mutex);
        if (first.empty()) first = "thread " + std::to_string(t) + ": " + why;
      }
    });
  }
  for (auto& c : clients) c.join();
  return {bad.load(), first};
}

}  // namespace torchloom_triton_test
