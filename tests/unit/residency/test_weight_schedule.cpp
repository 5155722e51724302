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

TEST_CASE("weight schedule: the streamed positions of a schedule with resident weights",
          "[residency][streamed]") {
  const auto u = tld::weight_alignment;
  SECTION("a hand-worked schedule") {
    const tld::weight_schedule s{{1 * u, 2 * u, 3 * u, 4 * u, 5 * u}, {2, 2, 4, 5, 5}};
    const auto sub = tld::streamed_positions(s, {false, true, false, true, false});
    CHECK(sub.position == std::vector<std::size_t>{0, 2, 4});
    CHECK(sub.schedule.bytes == std::vector<std::int64_t>{1 * u, 3 * u, 5 * u});
    // 0 is released at 2, streamed index 1; 2 at 4 (index 2); 4 at the end (3).
    CHECK(sub.schedule.release == std::vector<std::size_t>{1, 2, 3});
    // A release point on a resident position moves to the next streamed one.
    const auto later = tld::streamed_positions(s, {false, false, true, false, false});
    CHECK(later.schedule.release == std::vector<std::size_t>{2, 2, 4, 4});
    CHECK(tld::streamed_positions(s, std::vector<bool>(5, true)).schedule.size() == 0);
    const auto all = tld::streamed_positions(s, std::vector<bool>(5, false));
    CHECK(all.schedule.bytes == s.bytes);
    CHECK(all.schedule.release == s.release);
  }
  SECTION("random schedules: each release is the first streamed position at or after it") {
    std::mt19937 rng(11);
    std::bernoulli_distribution coin(0.4);
    for (int trial = 0; trial < 200; ++trial) {
      const auto s = random_schedule(rng, 1 + trial % 30);
      std::vector<bool> resident(s.size());
      for (std::size_t p = 0; p < s.size(); ++p) resident[p] = coin(rng);
      const auto sub = tld::streamed_positions(s, resident);
      for (std::size_t i = 0; i < sub.schedule.size(); ++i) {
        const std::size_t p = sub.position[i];
        REQUIRE_FALSE(resident[p]);
        CHECK(sub.schedule.bytes[i] == s.bytes[p]);
        CHECK(sub.schedule.release[i] > i);
        std::size_t want = 0;
        while (want < sub.schedule.size() && sub.position[want] < s.release[p]) ++want;
        CHECK(sub.schedule.release[i] == want);
      }
      CHECK(sub.schedule.size() ==
            static_cast<std::size_t>(std::count(resident.begin(), resident.end(), false)));
    }
  }
  SECTION("releasing later, for the prefetch depth") {
    const tld::weight_schedule s{{u, u, u, u}, {1, 2, 4, 4}};
    CHECK(tld::released_later(s, 2).release == std::vector<std::size_t>{3, 4, 4, 4});
    CHECK(tld::released_later(s, 0).release == s.release);
    // Copies that reach 2 units ahead: at the fetch of 1, those of 2 and 3 start.
    CHECK(tld::released_later(s, 0, 2 * u).release == std::vector<std::size_t>{3, 3, 4, 4});
    CHECK(tld::released_later(s, 2, 2 * u).release == std::vector<std::size_t>{3, 4, 4, 4});
  }
}

namespace {

// A random schedule over `weights` weights (sizes of 1-16 alignment units), each position a
// random one of them, released 1-4 fetches later or, one in six, at the end of the run.
std::pair<tld::weight_schedule, std::vector<std::size_t>> random_weighted(std::mt19937& rng,
                                                                           std::size_t n,
                                                                           std::size_t weights) {
  std::uniform_int_distribution<int> size(1, 16);
  std::uniform_int_distribution<std::size_t> which(0, weights - 1);
  std::vector<std::int64_t> sizes(weights);
  for (auto& b : sizes) b = size(rng) * tld::weight_alignment;
  auto s = random_schedule(rng, n);
  std::vector<std::size_t> weight_of(n);
  for (std::size_t p = 0; p < n; ++p) {
    weight_of[p] = which(rng);
    s.bytes[p] = sizes[weight_of[p]];
  }
  return {s, weight_of};
}

}  // namespace

TEST_CASE("weight schedule: a budget split between resident weights and the ring",
          "[residency][streamed]") {
  const auto u = tld::weight_alignment;
  SECTION("a weight read twice is kept before a larger one read once") {
    // A (4 units) at 0 and 3, B and C (6 units each) at 1 and 2; each released at the next
    // fetch. A saves 8 units a run in 4 of budget; B 6 in 6. A budget of 12 units holds A and
    // a ring for B and C (6), not A and B and a ring for C.
    const tld::weight_schedule s{{4 * u, 6 * u, 6 * u, 4 * u}, {1, 2, 3, 4}};
    const std::vector<std::size_t> weight_of{0, 1, 2, 0};
    const auto minimum = tld::minimum_arena(s);
    CHECK(minimum == 6 * u);
    const auto split = tld::split_budget(s, weight_of, 3, 12 * u, minimum, 0);
    CHECK(split.resident == std::vector<bool>{true, false, false});
    CHECK(split.resident_bytes == 4 * u);
    CHECK(split.streamed.position == std::vector<std::size_t>{1, 2});
    REQUIRE(split.plan.feasible);
    CHECK(split.plan.arena_bytes == 8 * u);  // the rest of the budget, below B and C's 12
    // At the minimum nothing stays; with room for every weight, every one does.
    const auto least = tld::split_budget(s, weight_of, 3, minimum, minimum, 0);
    CHECK(least.resident_bytes == 0);
    CHECK(least.streamed.schedule.size() == 4);
    CHECK(least.plan.arena_bytes == minimum);
    const auto all = tld::split_budget(s, weight_of, 3, 16 * u, minimum, 0);
    CHECK(all.resident == std::vector<bool>{true, true, true});
    CHECK(all.streamed.schedule.size() == 0);
    CHECK(all.plan.arena_bytes == 0);
    // A prefetch depth of 1 keeps room for the next weight's copy: B's and C's at once, so
    // that 12 units keep nothing resident.
    const auto ahead = tld::split_budget(s, weight_of, 3, 12 * u, minimum, 1);
    CHECK(ahead.resident_bytes == 0);
    CHECK(ahead.plan.arena_bytes == 12 * u);
  }
  SECTION("random schedules: the split stays within the budget and the ring is sound") {
    std::mt19937 rng(5);
    for (int trial = 0; trial < 150; ++trial) {
      const std::size_t weights = 1 + static_cast<std::size_t>(trial % 12);
      const auto [s, weight_of] = random_weighted(rng, 1 + trial % 30, weights);
      const auto minimum = tld::minimum_arena(s);
      std::vector<std::int64_t> size(weights, 0);
      for (std::size_t p = 0; p < s.size(); ++p) size[weight_of[p]] = s.bytes[p];
      std::int64_t all = 0;
      for (const auto b : size) all += b;
      for (const std::size_t depth : {std::size_t{0}, std::size_t{2}}) {
        for (std::int64_t budget = minimum; budget <= all + u; budget += 3 * u) {
          INFO("trial " << trial << ", budget " << budget << ", depth " << depth);
          const auto split =
              tld::split_budget(s, weight_of, weights, budget, minimum, depth, depth * 8 * u);
          REQUIRE(split.plan.feasible);
          CHECK(split.resident_bytes + split.plan.arena_bytes <= budget);
          std::int64_t resident = 0;
          for (std::size_t w = 0; w < weights; ++w) resident += split.resident[w] ? size[w] : 0;
          CHECK(resident == split.resident_bytes);
          for (std::size_t i = 0; i < split.streamed.schedule.size(); ++i) {
            CHECK_FALSE(split.resident[weight_of[split.streamed.position[i]]]);
          }
          std::size_t streamed = 0;
          for (std::size_t p = 0; p < s.size(); ++p) {
            streamed += split.resident[weight_of[p]] ? 0 : 1;
          }
          CHECK(streamed == split.streamed.schedule.size());
          if (split.streamed.schedule.size() > 0) {
            CHECK(no_live_overlap(split.streamed.schedule, split.plan));
            CHECK(waits_cover_occupants(split.streamed.schedule, split.plan));
          }
          if (budget >= all) {
            CHECK(split.streamed.schedule.size() == 0);
          }
        }
      }
    }
  }
}
