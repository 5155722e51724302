// The weight schedule behind streamed_weights: the ring arena's arithmetic (offsets, the waits
// between copies and the kernels that read the bytes they overwrite, the minimum arena),
// checked against hand-worked schedules and, on random ones, against brute force.
#include "support/catch.hpp"

#include <torchloom/weights/weight_schedule.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace {

namespace tld = torchloom::detail;

// A random schedule: sizes of 1-16 alignment units, each released 1-4 fetches later, or, one
// in six, at the end of the run (a weight used again at the end, a long-lived view).
tld::weight_schedule random_schedule(std::mt19937& rng, std::size_t n) {
  tld::weight_schedule s;
  std::uniform_int_distribution<int> size(1, 16);
  std::uniform_int_distribution<std::size_t> after(1, 4);
  std::uniform_int_distribution<int> long_lived(0, 5);
  for (std::size_t p = 0; p < n; ++p) {
    s.bytes.push_back(size(rng) * tld::weight_alignment);
    s.release.push_back(long_lived(rng) == 0 ? n : std::min(n, p + after(rng)));
  }
  return s;
}

// The smallest feasible arena, by trying every size.
std::int64_t brute_force_minimum(const tld::weight_schedule& s) {
  std::int64_t total = 0;
  for (const auto b : s.bytes) total += b;
  for (std::int64_t a = tld::weight_alignment; a < total; a += tld::weight_alignment) {
    if (tld::plan_arena(s, a).feasible) return a;
  }
  return total;
}

// The property the arena must have, checked independently of plan_arena's own bookkeeping: at
// each fetch x, x's bytes do not overlap those of any earlier position still in use (fetched
// and not yet released by the time x is fetched), and x fits the arena.
bool no_live_overlap(const tld::weight_schedule& s, const tld::arena_plan& plan) {
  for (std::size_t x = 0; x < s.size(); ++x) {
    if (plan.offset[x] < 0 || plan.offset[x] + s.bytes[x] > plan.arena_bytes) return false;
    for (std::size_t q = 0; q < x; ++q) {
      const bool live = s.release[q] > x;
      const bool overlap = plan.offset[q] < plan.offset[x] + s.bytes[x] &&
                           plan.offset[x] < plan.offset[q] + s.bytes[q];
      if (live && overlap) return false;
    }
  }
  return true;
}

// An independent check of wait_for and cross_wait: replays three runs of the schedule over the
// arena's bytes (in units of weight_alignment), remembering each unit's latest occupant; a
// position's copy must wait for the release of every occupant it overwrites, of its own run
// (wait_for) or of the previous one (cross_wait; size() stands for that run's end).
bool waits_cover_occupants(const tld::weight_schedule& s, const tld::arena_plan& plan) {
  const auto u = tld::weight_alignment;
  std::vector<std::pair<int, std::size_t>> owner(
      static_cast<std::size_t>(plan.arena_bytes / u), {-1, 0});
  for (int run = 0; run < 3; ++run) {
    for (std::size_t x = 0; x < s.size(); ++x) {
      const auto first = static_cast<std::size_t>(plan.offset[x] / u);
      const auto last = static_cast<std::size_t>((plan.offset[x] + s.bytes[x]) / u);
      for (std::size_t unit = first; unit < last; ++unit) {
        const auto [r, q] = owner[unit];
        owner[unit] = {run, x};
        if (r < 0) continue;  // never written yet
        const auto release = static_cast<std::ptrdiff_t>(s.release[q]);
        if (r == run && plan.wait_for[x] < release) return false;
        if (r == run - 1 && plan.cross_wait[x] < release) return false;
        if (r < run - 1) return false;  // every run rewrites the same bytes
      }
    }
  }
  return true;
}

}  // namespace

TEST_CASE("weight schedule: the ring keeps live weights apart and finds the minimum arena",
          "[residency][streamed]") {
  SECTION("a hand-worked schedule") {
    // Two layers of (W: 4 units, b: 1 unit): W and b of a layer are released at the next
    // layer's first fetch.
    const auto u = tld::weight_alignment;
    tld::weight_schedule s{{4 * u, u, 4 * u, u}, {2, 2, 4, 4}};
    CHECK(tld::live_bytes_bound(s) == 5 * u);
    CHECK(tld::minimum_arena(s) == 5 * u);
    const auto plan = tld::plan_arena(s, 5 * u);
    REQUIRE(plan.feasible);
    CHECK(plan.offset == std::vector<std::int64_t>{0, 4 * u, 0, 4 * u});
    // The second layer's copies reuse the first layer's bytes once they are released.
    CHECK(plan.wait_for == std::vector<std::ptrdiff_t>{-1, -1, 2, 2});
    // The next run's first layer overwrites the last layer's bytes, in use to the end (4);
    // its second layer overwrites its own first layer's, not the previous run's.
    CHECK(plan.cross_wait == std::vector<std::ptrdiff_t>{4, 4, -1, -1});
    CHECK_FALSE(tld::plan_arena(s, 4 * u).feasible);
    // With room for both layers nothing waits.
    const auto roomy = tld::plan_arena(s, 10 * u);
    CHECK(roomy.wait_for == std::vector<std::ptrdiff_t>{-1, -1, -1, -1});
  }
  SECTION("a weight held to the end of the run blocks the bytes it sits in, laps later") {
    // 8 units released at 2; 2 units held to the end; eight of 4 units, each released at the
    // next fetch; 2 units. In a ring of 10 the last one lands on the one held to the end.
    const auto u = tld::weight_alignment;
    tld::weight_schedule s{{8 * u, 2 * u}, {2, 11}};
    for (std::size_t k = 0; k < 8; ++k) {
      s.bytes.push_back(4 * u);
      s.release.push_back(k + 3);
    }
    s.bytes.push_back(2 * u);
    s.release.push_back(11);
    CHECK(tld::live_bytes_bound(s) == 10 * u);
    CHECK_FALSE(tld::plan_arena(s, 10 * u).feasible);
    CHECK(tld::minimum_arena(s) == brute_force_minimum(s));
  }
  SECTION("random schedules") {
    std::mt19937 rng(7);
    for (int trial = 0; trial < 300; ++trial) {
      const auto s = random_schedule(rng, 1 + trial % 40);
      const auto minimum = tld::minimum_arena(s);
      const auto plan = tld::plan_arena(s, minimum);
      INFO("trial " << trial << ", minimum " << minimum);
      REQUIRE(plan.feasible);
      CHECK(no_live_overlap(s, plan));
      CHECK(waits_cover_occupants(s, plan));
      CHECK(minimum >= tld::live_bytes_bound(s));
      CHECK(minimum == brute_force_minimum(s));
      CHECK_FALSE(tld::plan_arena(s, tld::live_bytes_bound(s) - tld::weight_alignment)
                      .feasible);
      // Every arena the planner calls feasible keeps live weights apart.
      for (auto arena = minimum; arena <= 2 * minimum; arena += tld::weight_alignment) {
        const auto p = tld::plan_arena(s, arena);
        if (p.feasible) CHECK((no_live_overlap(s, p) && waits_cover_occupants(s, p)));
      }
    }
  }
}
