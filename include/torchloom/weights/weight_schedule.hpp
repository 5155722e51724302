#pragma once
//! The arithmetic of streamed_weights, apart from torch and CUDA: where each fetch of a weight
//! sits in the device arena, what its copy must wait for, the smallest arena that works, and
//! which weights a budget larger than that keeps on the device instead of streaming them.
//!
//! A *position* is one fetch of one weight, in the order the forward pass runs them; the
//! positions are the schedule. Position p's weight is in use until the host reaches the
//! fetch `release[p]` (or the run's end, `release[p] == size`): by then every kernel that
//! reads it has been enqueued, so an event recorded on the compute stream at that fetch
//! tells the copy stream when the bytes may be overwritten.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

namespace torchloom::detail {

//! Weights sit in the arena (and in pinned host memory) at multiples of this.
inline constexpr std::int64_t weight_alignment = 256;

constexpr std::int64_t align_up(std::int64_t n, std::int64_t a) noexcept {
  return (n + a - 1) / a * a;
}

//! The schedule: per position, its weight's size in the arena and its release point.
struct weight_schedule {
  std::vector<std::int64_t> bytes;    //!< aligned, > 0
  std::vector<std::size_t> release;   //!< > p; == size(): released at the end of the run

  std::size_t size() const noexcept { return bytes.size(); }
};

//! Where each position is placed in an arena of `arena_bytes`, placed one after another and
//! wrapping to the start when the next one does not fit before the end (a ring).
struct arena_plan {
  std::int64_t arena_bytes = 0;
  std::vector<std::int64_t> offset;  //!< per position
  //! Per position: the latest release point among the earlier positions of the same run
  //! whose bytes it overwrites (its copy waits for the event recorded there), or -1.
  std::vector<std::ptrdiff_t> wait_for;
  //! Per position: the same for the previous run's positions whose bytes it overwrites (the
  //! schedule repeats run after run; size() stands for the previous run's end), or -1.
  std::vector<std::ptrdiff_t> cross_wait;
  //! Every position can be copied by the time it is fetched: its size fits the arena and
  //! wait_for[p] <= p.
  bool feasible = false;
};

//! Places the schedule in an arena of `arena_bytes`: a ring at the bottom, where positions go
//! one after another and wrap to the start when the next does not fit before the ring's end;
//! and, at the top, bytes of their own for the long-lived positions, those in use while more
//! is fetched after them than the ring can hold besides them (a weight, or a view of one,
//! used again near the end). In the ring those would be lapped and block every later
//! position that lands on them.
inline arena_plan plan_arena(const weight_schedule& s, std::int64_t arena_bytes) {
  arena_plan plan;
  plan.arena_bytes = arena_bytes;
  const std::size_t n = s.size();
  plan.offset.resize(n);
  plan.wait_for.assign(n, -1);
  plan.cross_wait.assign(n, -1);
  plan.feasible = true;
  std::vector<std::int64_t> prefix(n + 1, 0);
  for (std::size_t p = 0; p < n; ++p) prefix[p + 1] = prefix[p] + s.bytes[p];
  std::vector<bool> own(n, false);
  std::int64_t own_bytes = 0;
  for (bool changed = true; changed;) {  // a smaller ring makes more positions long-lived
    changed = false;
    const std::int64_t ring = arena_bytes - own_bytes;
    for (std::size_t p = 0; p < n; ++p) {
      const std::int64_t fetched_while_live = prefix[std::min(s.release[p], n)] - prefix[p + 1];
      if (own[p] || fetched_while_live + s.bytes[p] <= ring) continue;
      own[p] = true;
      own_bytes += s.bytes[p];
      changed = true;
    }
  }
  if (own_bytes > arena_bytes) {
    plan.feasible = false;
    return plan;
  }
  const std::int64_t ring = arena_bytes - own_bytes;
  std::int64_t cursor = 0;
  std::int64_t top = ring;
  for (std::size_t x = 0; x < n; ++x) {
    const std::int64_t size = s.bytes[x];
    if (own[x]) {
      plan.offset[x] = top;
      top += size;
      continue;
    }
    if (size > ring) {
      plan.feasible = false;
      return plan;
    }
    if (cursor + size > ring) cursor = 0;
    plan.offset[x] = cursor;
    cursor += size;
  }
  if (top > arena_bytes) {
    plan.feasible = false;
    return plan;
  }
  using interval = std::pair<std::int64_t, std::int64_t>;
  std::vector<interval> open;
  std::vector<interval> still_open;
  for (std::size_t x = 0; x < n; ++x) {
    // The positions whose bytes x overwrites: for each byte, its latest occupant (an older
    // one was released before that occupant's copy). Walk back through this run and then the
    // previous one until every byte of x has been found occupied or the walk is back at x.
    open.assign(1, {plan.offset[x], plan.offset[x] + s.bytes[x]});
    for (std::size_t k = 1; k <= n && !open.empty(); ++k) {
      const bool same_run = k <= x;
      const std::size_t q = same_run ? x - k : n + x - k;
      const std::int64_t qlo = plan.offset[q];
      const std::int64_t qhi = qlo + s.bytes[q];
      bool occupies = false;
      still_open.clear();
      for (const auto& [lo, hi] : open) {
        if (qhi <= lo || hi <= qlo) {
          still_open.emplace_back(lo, hi);
          continue;
        }
        occupies = true;
        if (lo < qlo) still_open.emplace_back(lo, qlo);
        if (qhi < hi) still_open.emplace_back(qhi, hi);
      }
      open.swap(still_open);
      if (!occupies) continue;
      auto& wait = same_run ? plan.wait_for[x] : plan.cross_wait[x];
      wait = std::max(wait, static_cast<std::ptrdiff_t>(s.release[q]));
    }
    if (plan.wait_for[x] > static_cast<std::ptrdiff_t>(x)) plan.feasible = false;
  }
  return plan;
}

//! The most bytes the schedule holds at once: at each fetch, the positions fetched before it
//! and not yet released, and its own.
inline std::int64_t live_bytes_bound(const weight_schedule& s) {
  std::int64_t most = 0;
  const std::size_t n = s.size();
  // Difference array over fetch points: position q is live from q until release[q] - 1.
  std::vector<std::int64_t> delta(n + 1, 0);
  for (std::size_t q = 0; q < n; ++q) {
    delta[q] += s.bytes[q];
    delta[std::min(s.release[q], n)] -= s.bytes[q];
  }
  std::int64_t live = 0;
  for (std::size_t p = 0; p < n; ++p) {
    live += delta[p];
    most = std::max(most, live);
  }
  return most;
}

//! The smallest arena (a multiple of `granularity`) in which the schedule is feasible; 0 for
//! an empty schedule. Whether the ring fits is not monotonic in its size (a larger ring can
//! put a long-lived weight where a later one needs to go), so the sizes from the live bound
//! up are tried one by one, `scan` of them; past that, a bisection finds a size that fits,
//! which may then be above the true minimum.
inline std::int64_t minimum_arena(const weight_schedule& s,
                                  std::int64_t granularity = weight_alignment, int scan = 1024) {
  if (s.size() == 0) return 0;
  const std::int64_t total = std::accumulate(s.bytes.begin(), s.bytes.end(), std::int64_t{0});
  // Below the live bound nothing fits; at the total no two positions of a run share bytes.
  std::int64_t lo = align_up(live_bytes_bound(s), granularity);
  const std::int64_t hi_total = align_up(total, granularity);
  for (int i = 0; i < scan && lo <= hi_total; ++i, lo += granularity) {
    if (plan_arena(s, lo).feasible) return lo;
  }
  std::int64_t hi = hi_total;
  lo -= granularity;
  // Invariant: hi is feasible, lo is not.
  while (hi - lo > granularity) {
    const std::int64_t mid = lo + (hi - lo) / granularity / 2 * granularity;
    if (plan_arena(s, mid).feasible) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return hi;
}

//! The positions that still stream when some weights stay on the device: their schedule,
//! renumbered in order, and where each came from.
struct streamed_subset {
  weight_schedule schedule;
  std::vector<std::size_t> position;  //!< per streamed index: its position in the full schedule
};

//! The schedule of the positions p with `resident[p]` false (`resident` has one flag per
//! position), renumbered in order. A position's release point becomes the first streamed
//! position at or after it (the end, when there is none): never earlier than the original,
//! and the events a copy waits for are recorded at streamed fetches only.
inline streamed_subset streamed_positions(const weight_schedule& s,
                                          const std::vector<bool>& resident) {
  const std::size_t n = s.size();
  streamed_subset out;
  // first[p]: the streamed index of the first streamed position at or after p.
  std::vector<std::size_t> first(n + 1, 0);
  for (std::size_t p = 0; p < n; ++p) {
    if (!resident[p]) out.position.push_back(p);
  }
  const std::size_t m = out.position.size();
  first[n] = m;
  for (std::size_t p = n, i = m; p-- > 0;) {
    if (!resident[p]) --i;
    first[p] = resident[p] ? first[p + 1] : i;
  }
  out.schedule.bytes.reserve(m);
  out.schedule.release.reserve(m);
  for (const std::size_t p : out.position) {
    out.schedule.bytes.push_back(s.bytes[p]);
    out.schedule.release.push_back(first[std::min(s.release[p], n)]);
  }
  return out;
}

//! The schedule as copies started ahead see it: a copy starts `depth` fetches before its own
//! fetch, or, where `ahead_bytes` > 0, as soon as it is among the positions after the current
//! one that come to less than `ahead_bytes` (weight_stream's granule), whichever is earlier.
//! Each release point moves to the last position whose copy starts there (the end at most).
//! An arena in which the result fits lets every copy start that early.
inline weight_schedule released_later(weight_schedule s, std::size_t depth,
                                      std::int64_t ahead_bytes = 0) {
  const std::size_t n = s.size();
  std::vector<std::int64_t> prefix(n + 1, 0);
  for (std::size_t p = 0; p < n; ++p) prefix[p + 1] = prefix[p] + s.bytes[p];
  // window[h]: the last position a copy started at the fetch of h reaches by bytes.
  std::vector<std::size_t> window(n, 0);
  for (std::size_t h = 0, e = 0; h < n && ahead_bytes > 0; ++h) {
    e = std::max(e, h);
    while (e + 1 < n && prefix[e + 1] - prefix[h + 1] < ahead_bytes) ++e;
    window[h] = e;
  }
  for (auto& r : s.release) {
    if (r >= n) continue;
    r = std::min(std::max(r + depth, window[r]), n);
  }
  return s;
}

//! Which weights stay on the device for the runner's life, and the ring for the rest.
struct resident_split {
  std::vector<bool> resident;       //!< per weight
  std::int64_t resident_bytes = 0;  //!< their sizes in the schedule, summed
  streamed_subset streamed;         //!< the positions of the other weights
  arena_plan plan;                  //!< the ring for them; resident_bytes + its arena <= budget
};

//! Splits a budget of device bytes between weights kept on the device and a ring for the
//! others; a budget that holds every weight keeps them all. `weight_of[p]` is position p's
//! weight (of `weights`); every position of a weight has its size. `minimum` is a feasible
//! arena for the whole schedule, at most `budget`.
//!
//! A weight read k times a run saves k copies of its bytes a run when it stays: weights are
//! taken by reads (descending), then size (descending), each one that fits, while the
//! weights taken so far plus a lower bound of the ring the others need stay within the
//! budget. That bound is the live bytes of their schedule with each release as late as the
//! copies started ahead (`depth` fetches, `ahead_bytes`: released_later) need: a ring that
//! holds what the engine copies ahead (with depth 0 and no bytes ahead, only what the
//! schedule needs at once). Then the ring, the budget less the resident bytes (at
//! most all the streamed bytes), is planned; where it does not fit, the last weight taken
//! goes back to streaming, until it does, or until none is left and the ring is the
//! whole schedule's `minimum`'s. O(weights x positions) for the choice, one plan per check.
inline resident_split split_budget(const weight_schedule& s,
                                   const std::vector<std::size_t>& weight_of, std::size_t weights,
                                   std::int64_t budget, std::int64_t minimum, std::size_t depth,
                                   std::int64_t ahead_bytes = 0) {
  const std::size_t n = s.size();
  std::vector<std::size_t> reads(weights, 0);
  std::vector<std::int64_t> size(weights, 0);
  for (std::size_t p = 0; p < n; ++p) {
    ++reads[weight_of[p]];
    size[weight_of[p]] = s.bytes[p];
  }
  std::vector<std::size_t> by_value;
  for (std::size_t w = 0; w < weights; ++w) {
    if (reads[w] > 0) by_value.push_back(w);
  }
  std::stable_sort(by_value.begin(), by_value.end(), [&](std::size_t a, std::size_t b) {
    return reads[a] != reads[b] ? reads[a] > reads[b] : size[a] > size[b];
  });
  resident_split out;
  out.resident.assign(weights, false);
  std::vector<bool> resident_position(n, false);
  const auto mark = [&](std::size_t w, bool on) {
    out.resident[w] = on;
    for (std::size_t p = 0; p < n; ++p) {
      if (weight_of[p] == w) resident_position[p] = on;
    }
  };
  std::int64_t all = 0;
  for (const std::size_t w : by_value) all += size[w];
  std::vector<std::size_t> taken;
  for (const std::size_t w : by_value) {
    if (all <= budget) {  // every weight fits: none streams, whatever the bound says
      mark(w, true);
      out.resident_bytes += size[w];
      continue;
    }
    if (out.resident_bytes + size[w] > budget) continue;
    mark(w, true);
    const auto rest = streamed_positions(s, resident_position);
    const std::int64_t ring = align_up(
        live_bytes_bound(released_later(rest.schedule, depth, ahead_bytes)), weight_alignment);
    if (out.resident_bytes + size[w] + ring <= budget) {
      out.resident_bytes += size[w];
      taken.push_back(w);
    } else {
      mark(w, false);
    }
  }
  for (;;) {
    out.streamed = streamed_positions(s, resident_position);
    const weight_schedule& rest = out.streamed.schedule;
    if (rest.size() == 0) {
      out.plan = arena_plan{};
      out.plan.feasible = true;
      return out;
    }
    const std::int64_t total =
        std::accumulate(rest.bytes.begin(), rest.bytes.end(), std::int64_t{0});
    out.plan = plan_arena(rest, std::min(budget - out.resident_bytes, total));
    if (out.plan.feasible) return out;
    if (taken.empty()) {
      out.plan = plan_arena(rest, minimum);  // the whole schedule: feasible by its minimum
      return out;
    }
    mark(taken.back(), false);
    out.resident_bytes -= size[taken.back()];
    taken.pop_back();
  }
}

}  // namespace torchloom::detail
