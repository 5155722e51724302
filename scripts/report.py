#!/usr/bin/env python3
"""Turns Google Benchmark JSON files into torchloom's performance report.

    scripts/report.py [--out DIR] bm_overhead.json [bm_streams.json ...]

Every benchmark comes from the JSON files given: no list of names here. The thresholds of
PERF.md's targets are in TARGETS, below; rows are in the order the benchmarks were registered
(the files' order, then Google Benchmark's family_index) where no parameter orders them.

Benchmarks named BM_raw_<x>/<params> and BM_runner_<x>/<params> (same <x>, same params) are
paired: the table gives both medians, their ratio, both p99s and the PERF.md target the ratio
is held to. Everything else is listed on its own with its median and p99. Times are the
real-time median and p99 aggregates of the repetitions, in microseconds; a benchmark run
without repetitions shows its single value as the median and no p99.

Benchmarks named BM_paired_<x>/<params> time raw and runner calls alternately in one loop and
report per-call figures as user counters (raw_median_us, runner_median_us, ratio, raw_p99_us,
runner_p99_us, calls) per repetition. They get their own table: the median of each counter
over the repetitions, the ratio's min-max across them, and the verdict on the median ratio.
Where such a table holds a target, the summary line counts that target from it, not from
the separately run pairs (whose ratio drifts between runs by more than T1's margin).

bm_offload's benchmarks (BM_offload_limit, BM_offload/model:<m>/batch:<b>/variant:<v>,
BM_offload_shared/runners:<n>) and the accelerate row of scripts/offload_peer.py report their
figures as counters of a single run. They get the weight offload table, rows ordered by model,
batch and variant, each row held to its targets: T4 (streamed at the smallest batch of T4's
model, a share of the pinned H2D limit), T5 (accelerate / streamed, same model and batch), T6
(streamed / resident at the largest batch of T6's model), T7 (every streamed row: no budget
violations, high water <= budget), T8 (streamed at the smallest batch of T8's model, a share
of the limit), T11 (streamed rows with a resident share, BM_offload/.../share:<all|half>:
share:all / resident, share:half / its streamed bytes at the pinned limit; T7 too, and not
T4 or T6), T14 (the rows of model llama_aoti, an LLM larger than the free memory: the
streamed row's share of the limit, exceeds_free and small_bitwise_equal; accelerate /
streamed; instead of T4 and T5); and the T9 table (device bytes of N runners sharing one
model <= W + N*A). A
streamed or mapped row whose output is not bitwise equal to resident's fails on its
own line (counted as "bitwise"). A target with no row to judge is "not measured" (skipped).

bm_graphs' BM_graphs/model:<m>/loader:<l>/batch:<b> (T12) report a paired raw/runner loop as
counters of a single run (the BM_paired_* counters plus speedup, bitwise, replayed). They get
the T12 table: every row at most T12's ratio to raw, and PERF.md's speed-up floors per model,
loader and batch.

Prints the Markdown tables (last thing on stdout), writes DIR/report.md and, when matplotlib
is installed, DIR/latency.png (runner ÷ raw ratios against their target line; loads on
their own panel) and (with offload rows) DIR/offload.png (GB/s per row against the pinned
limit); their titles name the GPU and torch's version (--gpu, --torch, else the results'
context). Standard library only otherwise.
"""

import argparse
import json
import os
import re
import sys

# PERF.md's targets: every threshold the report judges against, in one place. Each entry says
# what it is held to and, where it judges some rows and not others, which rows.
TARGETS = {
    # The runner against the raw LibTorch call, per call (bm_overhead, bm_aoti): runner / raw.
    "T1": {"max_ratio": 1.02},
    # Stream policies over caller_stream (bm_streams): delta per call, CPU and GPU time.
    "T2": {"max_cpu_us": 3.0, "max_gpu_us": 1.0, "max_replay_over_launch_us": 2.0},
    # Victim p99 under a co-tenant against alone (bm_isolation), the row where both sides are
    # in green contexts.
    "T3": {"max_ratio": 1.15, "benchmark": "BM_cotenant_green_contexts"},
    # bm_offload. T4, T8: streamed at the model's smallest batch (transfer-bound), % of the
    # pinned H2D limit; T5: accelerate / streamed, same model and batch; T6: streamed /
    # resident at the model's largest batch (compute-bound); T7: every streamed row, no budget
    # violation and high water within the budget; T9: N shared runners' device bytes <= W + N*A.
    # T4 and T6 hold the large model and its AOTInductor package twin (large_aoti) alike.
    "T4": {"min_pct_of_limit": 95, "models": ("large", "large_aoti")},
    "T5": {"min_ratio": 5, "variant": "accelerate", "over": "streamed"},
    "T6": {"max_ratio": 1.05, "models": ("large", "large_aoti"), "variant": "streamed",
           "over": "resident"},
    "T7": {"max_violations": 0, "variant": "streamed"},
    "T8": {"min_pct_of_limit": 90, "model": "small_tensors"},
    "T9": {"bound": "W + N·A"},
    # T11: streamed rows with a resident share of the budget (a `share` parameter): share:all
    # (budget >= every weight) at most max_ratio x resident, same model and batch (the
    # resident median timed alternately with it where there is one); share:half (budget W/2)
    # at most max_over_transfer x transfer_ms, its bytes streamed per run at the pinned limit.
    "T11": {"max_ratio": 1.02, "max_over_transfer": 1.05, "variant": "streamed",
            "over": "resident"},
    # T14: the LLM larger than the device's free memory (bm_offload's model llama_aoti): its
    # streamed row at least min_pct_of_limit of the pinned limit, its weights above the free
    # memory at load (exceeds_free) and its fewer-layer twin bitwise equal to resident
    # (small_bitwise_equal); the accelerate row (offload_peer.py --model llama) at least
    # min_ratio x the streamed row's time. Instead of T4 and T5 on that model.
    "T14": {"min_pct_of_limit": 95, "min_ratio": 5, "model": "llama_aoti",
            "variant": "streamed", "peer": "accelerate"},
    # The runner's construction against the raw loader's (BM_raw_<x>_load, bm_aoti).
    "T10": {"max_ratio": 1.05},
    # graphed<caller_stream> against the raw call (bm_graphs): every row at most max_ratio, and
    # speed-up floors (raw / runner) per (model, loader, batch).
    "T12": {"max_ratio": 1.02,
            "min_speedup": {("mlp", "torchscript", "1"): 3.0, ("mlp", "aoti", "1"): 2.0,
                            ("resnet18", "torchscript", "1"): 3.0}},
    # bm_triton, served through the in-process Triton core from 8 client threads at batch 1.
    # T13: the torchloom backend's p50 at most the runner called directly + Triton's minimal
    # backend + max_overhead_us, and dynamic batching raising its requests/s (each device).
    "T13": {"max_overhead_us": 10.0},
    # T15: torchloom (graphed_caller) over Triton's PyTorch backend, requests/s, on the GPU.
    "T15": {"min_ratio": 2.0, "device": "cuda"},
    # T16: the victim's p99 beside a saturating co-tenant over its p99 alone, both models in
    # green contexts, at the alone SM clock where NVML gave the clocks (else the raw ratio).
    "T16": {"max_ratio": 1.15, "benchmark": "BM_serving_t16", "partition": "green"},
}

# Targets for raw/runner pairs, first match on <x> wins: (pattern, target name). Add a row
# here when a later benchmark pairs raw and runner under a different target.
PAIR_TARGETS = [
    (re.compile(r".*_only"), None),  # diagnostics: one layer of the runner alone
    (re.compile(r".*_load"), "T10"),
    (re.compile(r".*"), "T1"),
]

# Name components Google Benchmark appends from the registration's settings, not from
# the benchmark's own parameters.
SETTING_PARTS = re.compile(
    r"^(min_time:.*|min_warmup_time:.*|repeats:\d+|iterations:\d+|threads:\d+|"
    r"real_time|manual_time|process_time)$")

TO_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}

# The fields of a Google Benchmark entry that are not user counters: every other number in an
# entry is one of the benchmark's counters.
GBENCH_FIELDS = {"family_index", "per_family_instance_index", "repetitions", "repetition_index",
                 "threads", "iterations", "real_time", "cpu_time", "bytes_per_second",
                 "items_per_second", "error_occurred", "skipped"}
# bm_streams (T2): BM_<policy> per stream policy, BM_<policy>_<variant> for a variant of one,
# the deltas taken against BASELINE_STREAM.
STREAM_BENCHMARK = re.compile(r"^BM_(\w+_stream)(_[a-z]+)?$")
BASELINE_STREAM = "BM_caller_stream"
# bm_isolation (T3): BM_alone_<victim> (no co-tenant) and BM_cotenant_<how>. What each
# scenario is, for the table (a scenario not named here is shown by its name).
ISOLATION_BENCHMARK = re.compile(r"^BM_(alone|cotenant)_\w+$")
ISOLATION_LABELS = {
    "BM_alone_plain": "victim alone, whole GPU",
    "BM_alone_green": "victim alone, green context",
    "BM_cotenant_plain_streams": "co-tenant GEMMs, plain streams",
    "BM_cotenant_green_contexts": "co-tenant GEMMs, both in green contexts",
    "BM_cotenant_green_victim_only": "co-tenant on a plain stream, victim green",
}
# bm_triton (T13, T15): BM_serving_t13 and BM_serving_t15 per device, each side reporting
# <side>_p50_us, <side>_p99_us and <side>_rps; the sides are read from the counters.
SERVING_BENCHMARKS = ("BM_serving_t13", "BM_serving_t15")
SERVING_SIDE = re.compile(r"^(\w+)_rps$")
SERVING_LABELS = {
    "runner": "runner called directly",
    "torchloom": "torchloom backend",
    "torchloom_batched": "torchloom backend, dynamic batching",
    "minimal": "Triton's minimal backend",
    "minimal_batched": "Triton's minimal backend, dynamic batching",
    "pytorch": "Triton's PyTorch backend",
    "pytorch_batched": "Triton's PyTorch backend, dynamic batching",
}
MIB = float(1 << 20)


class result:
    """One benchmark's figures: median and p99 real time in microseconds, or an error."""

    def __init__(self, base, params):
        self.base = base
        self.params = params  # list of (key, value), in name order
        self.median = None
        self.p99 = None
        self.single = None  # the only run, when there were no repetitions
        self.error = None
        # User counters by statistic: "median", "min", "max" aggregates, or "single".
        self.counters = {}
        self.repetitions = 1
        # Where the benchmark was registered: (file, family_index, instance) in the order the
        # files were given. Tables list their rows in this order where no parameter orders them.
        self.order = None

    def param(self, key):
        for k, v in self.params:
            if k == key:
                return v
        return None

    def extra_params(self):
        return [f"{k}:{v}" if not k.startswith("arg") else v
                for k, v in self.params if k not in ("device", "batch")]

    def value(self):
        return self.median if self.median is not None else self.single


def split_name(run_name):
    """'BM_x/device:cpu/batch:1/min_time:0.1/repeats:30/real_time' ->
    ('BM_x', [('device', 'cpu'), ('batch', '1')])."""
    parts = run_name.split("/")
    params = []
    for i, p in enumerate(p for p in parts[1:] if not SETTING_PARTS.match(p)):
        if ":" in p:
            k, v = p.split(":", 1)
            params.append((k, v))
        else:
            params.append((f"arg{i}", p))
    return parts[0], params


def user_counters(entry):
    """The user counters of a Google Benchmark entry: every number that is not one of
    Google Benchmark's own fields."""
    return {k: v for k, v in entry.items() if k not in GBENCH_FIELDS
            and isinstance(v, (int, float)) and not isinstance(v, bool)}


def load(files, unreadable=None):
    """The results of `files`. A file that is not whole JSON (a benchmark stopped while it
    wrote) is left out and named in `unreadable`, a list of (path, why), when one is given."""
    results = {}  # run name without settings -> result
    order = []
    contexts = []
    for file_index, path in enumerate(files):
        with open(path, encoding="utf-8") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                if unreadable is None:
                    raise
                unreadable.append((path, str(e)))
                continue
        contexts.append((path, data.get("context", {})))
        for position, b in enumerate(data.get("benchmarks", [])):
            run_name = b.get("run_name") or b["name"]
            base, params = split_name(run_name)
            key = "/".join([base] + [f"{k}:{v}" for k, v in params])
            r = results.get(key)
            if r is None:
                r = results[key] = result(base, params)
                r.order = (file_index, b.get("family_index", position),
                           b.get("per_family_instance_index", 0))
                order.append(key)
            if b.get("error_occurred") or b.get("skipped"):
                r.error = b.get("error_message") or b.get("skip_message") or "skipped"
                continue
            counters = user_counters(b)
            if counters and b.get("aggregate_unit", "time") == "time":
                if b.get("run_type") == "aggregate":
                    r.counters[b.get("aggregate_name")] = counters
                    r.repetitions = b.get("repetitions", 1)
                elif b.get("repetitions", 1) <= 1:
                    r.counters["single"] = counters
            scale = TO_US.get(b.get("time_unit", "ns"), 1e-3)
            t = b.get("real_time")
            if t is None:
                continue
            if b.get("run_type") == "aggregate":
                if b.get("aggregate_unit", "time") != "time":
                    continue
                if b.get("aggregate_name") == "median":
                    r.median = t * scale
                elif b.get("aggregate_name") == "p99":
                    r.p99 = t * scale
            elif b.get("repetitions", 1) <= 1:
                r.single = t * scale
    return [results[k] for k in order], contexts


def fmt_us(v):
    if v is None:
        return "-"
    if v < 10:
        return f"{v:.2f}"
    if v < 1000:
        return f"{v:.1f}"
    return f"{v:.0f}"


def pair_up(results):
    """-> (raw/runner pairs, BM_paired_* results, everything else)."""
    raw, runner, paired, other = {}, {}, [], []
    for r in results:
        if r.base.startswith("BM_paired_"):
            paired.append(r)
            continue
        m = re.match(r"^BM_(raw|runner)_(.+)$", r.base)
        if not m:
            other.append(r)
            continue
        key = (m.group(2), tuple(r.params))
        (raw if m.group(1) == "raw" else runner)[key] = r
    pairs = []
    for key, rw in raw.items():
        if key in runner:
            pairs.append((key[0], rw, runner.pop(key)))
        else:
            other.append(rw)
    other.extend(runner.values())
    pairs.sort(key=lambda p: (p[0], sort_key(p[1])))
    other.sort(key=lambda r: (r.base, sort_key(r)))
    paired.sort(key=lambda r: (r.base, sort_key(r)))
    return pairs, paired, other


def sort_key(r):
    """Orders rows by their parameters, numbers as numbers (batch 1 before batch 32)."""
    out = []
    for k, v in r.params:
        try:
            out.append((k, 0, float(v), ""))
        except ValueError:
            out.append((k, 1, 0.0, v))
    return out


def target_for(feature):
    """The target a raw/runner pair of benchmark <x> is held to, and its largest ratio."""
    for pattern, name in PAIR_TARGETS:
        if pattern.fullmatch(feature):
            return name, None if name is None else TARGETS[name]["max_ratio"]
    return None, None


def first_seen(values):
    """The distinct values of `values`, in the order they first appear."""
    return list(dict.fromkeys(values))


def judge(tname, limit, ratio, verdicts, at_least=False, unit="×"):
    """The verdict cell for `ratio` against target `tname` (none: "-"): at most `limit`, or
    with at_least at least `limit`, `unit` after it; records the verdict."""
    if tname is None:
        return "-"
    if at_least:
        return check(tname, ratio >= limit, f"≥{limit:g}{unit}", verdicts)
    return check(tname, ratio <= limit, f"≤{limit:g}{unit}", verdicts)


def check(tname, ok, what, verdicts):
    """The verdict cell "<tname> <what>: pass" (or FAIL); records the verdict."""
    verdicts.append((tname, "pass" if ok else "fail"))
    return f"{tname} {what}: {'pass' if ok else 'FAIL'}"


def not_measured(tname, why, verdicts):
    """The cell for a target without the figures to judge it; counted as skipped."""
    verdicts.append((tname, "skipped"))
    return f"{tname} not measured: {why}"


def pair_rows(pairs):
    rows, verdicts = [], []
    for feature, rw, rn in pairs:
        name = " ".join([feature] + rw.extra_params())
        tname, limit = target_for(feature)
        ratio = None
        if rw.error or rn.error:
            verdict = f"skipped: {rw.error or rn.error}"
            verdicts.append((tname, "skipped"))
        elif rw.value() and rn.value() is not None:
            ratio = rn.value() / rw.value()
            verdict = judge(tname, limit, ratio, verdicts)
        else:
            verdict = "no data"
            verdicts.append((tname, "skipped"))
        rows.append([name, rw.param("device") or "-", rw.param("batch") or "-",
                     fmt_us(rw.value()), fmt_us(rn.value()),
                     "-" if ratio is None else f"{ratio:.3f}",
                     fmt_us(rw.p99), fmt_us(rn.p99), verdict])
    return rows, verdicts


def paired_rows(paired):
    rows, verdicts = [], []
    for r in paired:
        feature = r.base[len("BM_paired_"):]
        name = " ".join([feature] + r.extra_params())
        tname, limit = target_for(feature)
        med = r.counters.get("median") or r.counters.get("single")
        lo = r.counters.get("min") or med
        hi = r.counters.get("max") or med
        missing = (f"skipped: {r.error}" if r.error
                   else "no data" if not med or "ratio" not in med else None)
        if missing:
            rows.append([name, r.param("device") or "-", r.param("batch") or "-",
                         "-", "-", "-", "-", "-", missing])
            verdicts.append((tname, "skipped"))
            continue
        ratio = med["ratio"]
        verdict = judge(tname, limit, ratio, verdicts)
        spread = f"{ratio:.3f} ({lo['ratio']:.3f}–{hi['ratio']:.3f})"
        calls = med.get("calls")
        rows.append([name, r.param("device") or "-", r.param("batch") or "-",
                     "-" if calls is None else f"{calls:.0f}×{r.repetitions}",
                     fmt_us(med.get("raw_median_us")), fmt_us(med.get("runner_median_us")),
                     f"{fmt_us(med.get('raw_p99_us'))} / {fmt_us(med.get('runner_p99_us'))}",
                     spread, verdict])
    return rows, verdicts


def merge_verdicts(separate, paired):
    """The paired verdicts replace the separate ones for every target they cover."""
    covered = {t for t, _ in paired if t}
    return [v for v in separate if v[0] not in covered] + paired


def counter_note(counters):
    """A diagnostic's counters as one line: "name µs" for each `<name>_us`, "name value" for
    the rest, in the benchmark's order."""
    parts = []
    for k, v in counters.items():
        if k.endswith("_us"):
            parts.append(f"{k[:-3]} {fmt_us(v)} µs")
        else:
            parts.append(f"{k} {v:g}")
    return "; ".join(parts)


def other_rows(other):
    """The results no table above took. A diagnostic that reports its findings as counters
    (host time of a call's parts, each stream's hop) shows them, not its own loop's time."""
    rows = []
    for r in other:
        params = ", ".join(f"{k}:{v}" if not k.startswith("arg") else v for k, v in r.params)
        counters = counter_set(r)
        if r.error:
            rows.append([r.base, params or "-", "-", "-", f"skipped: {r.error}"])
        elif counters:
            rows.append([r.base, params or "-", "-", "-", counter_note(counters)])
        else:
            rows.append([r.base, params or "-", fmt_us(r.value()), fmt_us(r.p99), ""])
    return rows


def counter_set(r):
    """The counters of a result: the median aggregate, else the single run."""
    return r.counters.get("median") or r.counters.get("single") or {}


def stream_rows(other):
    """T2: per-call cost of each stream policy over the baseline policy, same repetition. Rows:
    the baseline, then the policies, then their variants, each in registration order."""
    rows, verdicts, used = [], [], set()
    t2 = TARGETS["T2"]
    runs = [r for r in other if STREAM_BENCHMARK.match(r.base)]
    runs.sort(key=lambda r: (r.base != BASELINE_STREAM,
                             STREAM_BENCHMARK.match(r.base).group(2) is not None, r.order))
    for r in runs:
        name = r.base
        used.add(name)
        label = name[3:]
        if r.error:
            rows.append([label, "-", "-", "-", "-", "-", "-", f"skipped: {r.error}"])
            continue
        c = counter_set(r)
        target = ""
        if name == BASELINE_STREAM:
            target = "baseline"
        elif "cpu_us_delta" in c and "gpu_us_delta" in c:
            if STREAM_BENCHMARK.match(name).group(2) is not None:
                target = "≈ caller (no fence)"
            else:
                ok = c["cpu_us_delta"] <= t2["max_cpu_us"] and c["gpu_us_delta"] <= t2["max_gpu_us"]
                target = (f"T2 ≤{t2['max_cpu_us']:g} µs CPU, ≤{t2['max_gpu_us']:g} µs GPU: "
                          f"{'pass' if ok else 'FAIL'}")
                verdicts.append(("T2", "pass" if ok else "fail"))
        rows.append([label, fmt_us(c.get("cpu_us_median")), fmt_us(c.get("cpu_us_p99")),
                     fmt_us(c.get("gpu_us_median")), fmt_us(c.get("gpu_us_p99")),
                     fmt_us(c.get("cpu_us_delta")), fmt_us(c.get("gpu_us_delta")), target])
    # The graphed replay's host time over a bare graph launch (BM_graphs_host_parts, which
    # stays in the table of other results as well, with all its parts).
    for r in other:
        c = counter_set(r)
        if r.base != "BM_graphs_host_parts" or r.error:
            continue
        if "runner_run_us" not in c or "graph_launch_us" not in c:
            continue
        over = c["runner_run_us"] - c["graph_launch_us"]
        ok = over <= t2["max_replay_over_launch_us"]
        rows.append(["graphed<caller_stream> replay (host)", fmt_us(c["runner_run_us"]), "-",
                     "-", "-", fmt_us(over), "-",
                     f"T2 replay ≤ launch ({fmt_us(c['graph_launch_us'])} µs) + "
                     f"{t2['max_replay_over_launch_us']:g} µs: {'pass' if ok else 'FAIL'}"])
        verdicts.append(("T2", "pass" if ok else "fail"))
    return rows, verdicts, used


def isolation_rows(other):
    """T3: victim latency under a saturating co-tenant, against the same victim alone."""
    rows, verdicts, used = [], [], set()
    t3 = TARGETS["T3"]
    # The victim alone first, then under a co-tenant, each in registration order.
    runs = [r for r in other if ISOLATION_BENCHMARK.match(r.base)]
    runs.sort(key=lambda r: (ISOLATION_BENCHMARK.match(r.base).group(1) != "alone", r.order))
    # SM clock and power columns only where the benchmark sampled them (NVML).
    clocks = any("sm_mhz" in counter_set(r) for r in runs)
    for r in runs:
        name = r.base
        what = ISOLATION_LABELS.get(name, name[3:])
        # Co-tenant scenarios that no target judges are the controls.
        role = ("T3" if name == t3["benchmark"]
                else "" if ISOLATION_BENCHMARK.match(name).group(1) == "alone" else "control")
        used.add(name)
        if r.error:
            rows.append([what, "-", "-", "-", "-", "-", "-", f"skipped: {r.error}"])
            continue
        c = counter_set(r)
        ratio = c.get("ratio_vs_alone")
        note = role
        if role == "T3" and ratio is not None:
            ok = ratio <= t3["max_ratio"]
            note = f"T3 ≤{t3['max_ratio']:g}×: {'pass' if ok else 'FAIL'}"
            verdicts.append(("T3", "pass" if ok else "fail"))
        sms = f"{c.get('victim_sms', 0):.0f} / {c.get('cotenant_sms', 0):.0f}"
        row = [what, sms, fmt_us(c.get("p50_us")), fmt_us(c.get("p99_us")),
               fmt_us(c.get("alone_p99_us")), f"{ratio:.2f}×" if ratio is not None else "-",
               f"{c.get('calls', 0):.0f}", note]
        if clocks:
            mhz = (f"{c['alone_sm_mhz']:.0f} / {c['sm_mhz']:.0f}"
                   if "sm_mhz" in c and "alone_sm_mhz" in c else "-")
            power = (f"{c['power_w']:.0f} ({100 * c['power_capped']:.0f}%)"
                     if "power_w" in c and "power_capped" in c else "-")
            scaled = (f"{c['ratio_at_alone_clock']:.2f}×" if "ratio_at_alone_clock" in c
                      else "-")
            row[7:7] = [mhz, power, scaled]
        rows.append(row)
    return rows, verdicts, used


def serving_rows(other):
    """T13 and T15: one row per side of each BM_serving_t13/t15 benchmark (device by device),
    with its p50 alone (one client), its p50, p99 and requests/s under 8 clients, and the
    verdicts on the rows they concern. T13's latency is judged one client at a time: with 8
    clients every request also waits for the 7 before it, which multiplies each side's cost."""
    rows, verdicts, used = [], [], set()
    t13, t15 = TARGETS["T13"], TARGETS["T15"]
    runs = sorted((r for r in other if r.base in SERVING_BENCHMARKS), key=lambda r: r.order)
    for r in runs:
        used.add(r.base)
        device = r.param("device") or "-"
        what = "T13" if r.base.endswith("t13") else "T15"
        c = counter_set(r)
        sides = [m.group(1) for m in map(SERVING_SIDE.match, c)
                 if m and not m.group(1).endswith("_one")]
        known = list(SERVING_LABELS)
        sides.sort(key=lambda x: (known.index(x) if x in known else len(known), x))
        if r.error or not sides:
            rows.append([what, device, "-", "-", "-", "-", "-",
                         f"skipped: {r.error}" if r.error else "no data"])
            verdicts.append((what, "skipped"))
            continue
        notes = {}
        if what == "T13":
            need = ("runner_one_p50_us", "torchloom_one_p50_us", "minimal_one_p50_us")
            if all(k in c for k in need):
                bound = c["runner_one_p50_us"] + c["minimal_one_p50_us"] + t13["max_overhead_us"]
                notes["torchloom"] = check(
                    "T13", c["torchloom_one_p50_us"] <= bound,
                    f"p50 alone ≤ runner + minimal + {t13['max_overhead_us']:g} µs "
                    f"= {fmt_us(bound)}", verdicts)
            else:
                notes["torchloom"] = not_measured(
                    "T13", "no " + " / ".join(k for k in need if k not in c), verdicts)
            if "torchloom_batched_rps" in c and "torchloom_rps" in c:
                gain = c["torchloom_batched_rps"] / c["torchloom_rps"] if c["torchloom_rps"] else 0
                notes["torchloom_batched"] = check(
                    "T13", gain > 1.0, f"requests/s over unbatched > 1× ({gain:.2f}×)", verdicts)
        else:
            for ours, peer in (("torchloom", "pytorch"), ("torchloom_batched", "pytorch_batched")):
                if f"{ours}_rps" not in c or not c.get(f"{peer}_rps"):
                    continue
                ratio = c[f"{ours}_rps"] / c[f"{peer}_rps"]
                if ours == "torchloom" and device == t15["device"]:
                    notes[ours] = check("T15", ratio >= t15["min_ratio"],
                                        f"≥{t15['min_ratio']:g}× requests/s of the PyTorch "
                                        f"backend ({ratio:.2f}×)", verdicts)
                else:
                    notes[ours] = f"{ratio:.2f}× the PyTorch backend's requests/s"
            if "identical" in c:
                same = c["identical"] >= 1.0
                notes["pytorch"] = "outputs identical" if same else "outputs DIFFER"
                if device == t15["device"]:
                    verdicts.append(("T15", "pass" if same else "fail"))
        for side in sides:
            rows.append([what, device, SERVING_LABELS.get(side, side),
                         fmt_us(c.get(f"{side}_one_p50_us")),
                         fmt_us(c.get(f"{side}_p50_us")), fmt_us(c.get(f"{side}_p99_us")),
                         f"{c[side + '_rps']:.0f}", notes.get(side, "")])
    return rows, verdicts, used


SERVING_SPLIT = ("queue", "compute_input", "compute_infer", "compute_output")


def serving_split_rows(other):
    """T13 and T15: where each served side's requests spent their time, by Triton's own
    statistics (µs per request over all the side's rounds), device by device."""
    rows = []
    runs = sorted((r for r in other if r.base in SERVING_BENCHMARKS), key=lambda r: r.order)
    for r in runs:
        if r.error:
            continue
        c = counter_set(r)
        known = list(SERVING_LABELS)
        sides = sorted({k[: -len("_queue_us")] for k in c if k.endswith("_queue_us")},
                       key=lambda x: (known.index(x) if x in known else len(known), x))
        for side in sides:
            parts = [c.get(f"{side}_{p}_us") for p in SERVING_SPLIT]
            backend = sum(v for v in parts[1:] if v is not None)
            rows.append(["T13" if r.base.endswith("t13") else "T15", r.param("device") or "-",
                         SERVING_LABELS.get(side, side)] + [fmt_us(v) for v in parts]
                        + [fmt_us(backend)])
    return rows


def serving_isolation_rows(other):
    """T16: the victim model's latency beside a saturating co-tenant model in one Triton core,
    against the same victim alone (BM_serving_t16/partition:<green|plain>)."""
    rows, verdicts, used = [], [], set()
    t16 = TARGETS["T16"]
    runs = sorted((r for r in other if r.base == t16["benchmark"]), key=lambda r: r.order)
    for r in runs:
        used.add(r.base)
        partition = r.param("partition") or "-"
        what = ("both in green contexts" if partition == "green"
                else "plain streams (control)" if partition == "plain" else partition)
        if r.error:
            rows.append([what] + ["-"] * 8 + [f"skipped: {r.error}"])
            if partition == t16["partition"]:
                verdicts.append(("T16", "skipped"))
            continue
        c = counter_set(r)
        raw = c.get("ratio_vs_alone")
        scaled = c.get("ratio_at_alone_clock")
        note = "control"
        if partition == t16["partition"]:
            judged = scaled if scaled is not None else raw
            if judged is None:
                note = not_measured("T16", "no ratio", verdicts)
            else:
                how = "at the alone clock" if scaled is not None else "raw (no SM clocks)"
                note = check("T16", judged <= t16["max_ratio"],
                             f"≤{t16['max_ratio']:g}× {how}", verdicts)
        mhz = (f"{c['alone_sm_mhz']:.0f} / {c['sm_mhz']:.0f}"
               if "sm_mhz" in c and "alone_sm_mhz" in c else "-")
        rows.append([what, f"{c.get('victim_sms', 0):.0f} / {c.get('cotenant_sms', 0):.0f}",
                     fmt_us(c.get("alone_p99_us")), fmt_us(c.get("p50_us")),
                     fmt_us(c.get("p99_us")), f"{raw:.2f}×" if raw is not None else "-",
                     mhz, f"{scaled:.2f}×" if scaled is not None else "-",
                     f"{c.get('cotenant_tflops', 0):.0f}", note])
    return rows, verdicts, used


def batch_of(r):
    """A row's batch as a number, None when it has none."""
    try:
        return float(r.param("batch"))
    except (TypeError, ValueError):
        return None


def offload_results(other):
    """The bm_offload results among `other`: (BM_offload rows in table order, by model,
    batch and variant; BM_offload_limit or None; BM_offload_shared rows)."""
    runs = sorted((r for r in other if r.base == "BM_offload"), key=lambda r: r.order)
    # Models and variants in the order they were first registered; batches by size.
    models = first_seen(r.param("model") for r in runs)
    variants = first_seen(r.param("variant") for r in runs)
    runs.sort(key=lambda r: (models.index(r.param("model")), batch_of(r) is None,
                             batch_of(r) or 0, variants.index(r.param("variant"))))
    limit = next((r for r in other if r.base == "BM_offload_limit"), None)
    shared = [r for r in other if r.base == "BM_offload_shared"]
    return runs, limit, shared


def ms_of(r):
    """A BM_offload row's median forward time in ms: its counter, else its real time."""
    c = counter_set(r)
    if "ms_median" in c:
        return c["ms_median"]
    return None if r.value() is None else r.value() / 1e3


def fmt_mib(v):
    """Bytes in MiB: whole MiB from 10 on, two decimals below."""
    if v is None:
        return "-"
    return f"{v / MIB:.0f}" if v >= 10 * MIB else f"{v / MIB:.2f}"


def offload_targets(r, runs):
    """The targets a BM_offload row is held to. T4 and T8: streamed at the model's smallest
    batch (transfer-bound); T6: streamed at the largest batch of model large (or its package
    twin, large_aoti), when larger than the smallest (compute-bound); T7: every streamed row;
    T5: the accelerate row; T11 (instead of T4 and T6): a streamed row with a resident share."""
    model, variant = r.param("model"), r.param("variant")
    if model == TARGETS["T14"]["model"]:
        return {TARGETS["T14"]["peer"]: ["T14"],
                TARGETS["T14"]["variant"]: ["T14", "T7"]}.get(variant, [])
    if variant == TARGETS["T5"]["variant"]:
        return ["T5"]
    if variant != TARGETS["T7"]["variant"]:
        return []
    if r.param("share"):
        return ["T11", "T7"]
    batches = sorted({batch_of(x) for x in runs if x.param("model") == model
                      and batch_of(x) is not None and not x.param("share")})
    targets = []
    smallest = batches and batch_of(r) == batches[0]
    if model in TARGETS["T4"]["models"] and smallest:
        targets.append("T4")
    if model in TARGETS["T6"]["models"] and len(batches) > 1 and batch_of(r) == batches[-1]:
        targets.append("T6")
    targets.append("T7")
    if model == TARGETS["T8"]["model"] and smallest:
        targets.append("T8")
    return targets


def offload_verdict(tname, r, runs, verdicts):
    """The verdict cell of target tname on BM_offload row r; records the verdict."""
    c = counter_set(r)
    if tname in ("T4", "T8"):
        if "pct_of_limit" not in c:
            return not_measured(tname, "no pct_of_limit counter", verdicts)
        cell = judge(tname, TARGETS[tname]["min_pct_of_limit"], c["pct_of_limit"], verdicts,
                     at_least=True, unit="% of limit")
        budget, weights = c.get("budget_bytes"), c.get("weight_bytes")
        if tname == "T4" and budget and weights is not None and weights < 4 * budget:
            cell += " (weights < 4× budget: not T4's setting)"
        return cell
    if tname == "T7":
        need = ("violations", "high_water_bytes", "budget_bytes")
        if any(k not in c for k in need):
            return not_measured(tname, "no " + " / ".join(k for k in need if k not in c),
                                verdicts)
        most = TARGETS["T7"]["max_violations"]
        ok = c["violations"] <= most and c["high_water_bytes"] <= c["budget_bytes"]
        cell = check(tname, ok, f"{most} violations, high water ≤ budget", verdicts)
        if not ok:
            cell += (f" ({c['violations']:.0f} violations, high water "
                     f"{fmt_mib(c['high_water_bytes'])} of {fmt_mib(c['budget_bytes'])} MiB)")
        return cell
    if tname == "T11":
        return share_verdict(r, runs, verdicts)
    if tname == "T14":
        return llm_verdict(r, runs, verdicts)
    # T5: accelerate over streamed; T6: streamed over resident; same model and batch.
    t = TARGETS[tname]
    base_variant = t["over"]
    at_least = "min_ratio" in t
    limit = t["min_ratio"] if at_least else t["max_ratio"]
    where = f"model {r.param('model')} batch {r.param('batch')}"
    base = next((x for x in runs if x.param("variant") == base_variant and not x.param("share")
                 and x.param("model") == r.param("model") and batch_of(x) == batch_of(r)),
                None)
    if base is None:
        return not_measured(tname, f"no {base_variant} row at {where}", verdicts)
    if base.error or not ms_of(base) or ms_of(r) is None:
        return not_measured(tname, f"the {base_variant} row at {where} has no time", verdicts)
    ratio = ms_of(r) / ms_of(base)
    # bm_offload times T6's pair in alternating blocks: the resident median from that loop,
    # where there is one, shares the streamed one's clocks.
    paired = counter_set(r).get("resident_ms_paired") if tname == "T6" else None
    if paired:
        ratio = ms_of(r) / paired
    cell = judge(tname, limit, ratio, verdicts, at_least=at_least)
    if tname == "T5":
        return cell + f" (accelerate {ratio:.2f}× streamed)"
    return cell + (f" (streamed {ratio:.3f}× resident"
                   + (", timed alternately)" if paired else ")"))


def share_verdict(r, runs, verdicts):
    """T11 on a streamed row with a resident share: share:all against resident (the paired
    median where there is one), share:half against its streamed bytes at the pinned limit."""
    t, c = TARGETS["T11"], counter_set(r)
    if ms_of(r) is None:
        return not_measured("T11", "the row has no time", verdicts)
    if r.param("share") == "all":
        base = c.get("resident_ms_paired")
        if not base:
            row = next((x for x in runs if x.param("variant") == t["over"]
                        and x.param("model") == r.param("model") and batch_of(x) == batch_of(r)),
                       None)
            base = None if row is None or row.error else ms_of(row)
        if not base:
            return not_measured("T11", f"no {t['over']} time at model {r.param('model')} "
                                f"batch {r.param('batch')}", verdicts)
        ratio = ms_of(r) / base
        return (judge("T11", t["max_ratio"], ratio, verdicts)
                + f" (budget ≥ weights: {ratio:.3f}× resident, "
                + f"{fmt_mib(c.get('streamed_bytes'))} MiB streamed per run)")
    if not c.get("transfer_ms"):
        return not_measured("T11", "no transfer_ms counter", verdicts)
    ratio = ms_of(r) / c["transfer_ms"]
    return (judge("T11", t["max_over_transfer"], ratio, verdicts)
            + f" (budget W/2: {ratio:.3f}× {fmt_mib(c.get('streamed_bytes'))} MiB streamed "
            + f"÷ limit, {fmt_mib(c.get('resident_bytes'))} MiB resident)")


def llm_verdict(r, runs, verdicts):
    """T14 on a row of its model: the accelerate row against the streamed one (same batch);
    the streamed row's share of the pinned limit, its weights against the free memory at
    load, and its fewer-layer twin's bitwise check."""
    t, c = TARGETS["T14"], counter_set(r)
    if r.param("variant") == t["peer"]:
        base = next((x for x in runs if x.param("model") == r.param("model")
                     and x.param("variant") == t["variant"] and batch_of(x) == batch_of(r)),
                    None)
        if base is None or base.error or not ms_of(base) or ms_of(r) is None:
            return not_measured("T14", f"no {t['variant']} time at model {r.param('model')} "
                                f"batch {r.param('batch')}", verdicts)
        ratio = ms_of(r) / ms_of(base)
        return (judge("T14", t["min_ratio"], ratio, verdicts, at_least=True)
                + f" (accelerate {ratio:.2f}× streamed)")
    cells = []
    if "pct_of_limit" in c:
        cells.append(judge("T14", t["min_pct_of_limit"], c["pct_of_limit"], verdicts,
                           at_least=True, unit="% of limit"))
    else:
        cells.append(not_measured("T14", "no pct_of_limit counter", verdicts))
    if "exceeds_free" in c:
        cells.append(check("T14", c["exceeds_free"] == 1,
                           f"weights {fmt_mib(c.get('weight_bytes'))} MiB > "
                           f"{fmt_mib(c.get('free_bytes'))} MiB free at load", verdicts))
    else:
        cells.append(not_measured("T14", "no exceeds_free counter", verdicts))
    if "small_bitwise_equal" in c:
        cells.append(check("T14", c["small_bitwise_equal"] == 1,
                           "fewer-layer twin bitwise equal to resident", verdicts))
    else:
        cells.append(not_measured("T14", "no small_bitwise_equal counter", verdicts))
    return "; ".join(cells)


def offload_missing():
    """Targets of the offload table, and what is missing when no row is held to them."""
    streamed = TARGETS["T7"]["variant"]
    return (
        ("T4", f"no {streamed} row of model {TARGETS['T4']['models'][0]} at its smallest batch"),
        ("T5", f"no {TARGETS['T5']['variant']} row (scripts/offload_peer.py wrote none)"),
        ("T6", f"no {streamed} row of model {TARGETS['T6']['models'][0]} at a batch larger than "
               "the smallest"),
        ("T7", f"no {streamed} row"),
        ("T8", f"no {streamed} row of model {TARGETS['T8']['model']}"),
        ("T11", f"no {streamed} row with a resident share (share:all, share:half)"),
        ("T14", f"no {streamed} row of model {TARGETS['T14']['model']}"),
    )


def offload_rows(runs):
    """T4-T8, T11: a row per BM_offload run (the accelerate peer's included), the verdicts, and the
    lines under the table: targets no row is held to, outputs that differ from resident."""
    rows, verdicts, notes, held = [], [], [], set()
    for r in runs:
        model, batch, variant = (r.param("model") or "-", r.param("batch") or "-",
                                 r.param("variant") or "-")
        # A streamed row with a resident share of the budget says which.
        label = variant + (f" (share {r.param('share')})" if r.param("share") else "")
        targets = offload_targets(r, runs)
        held.update(targets)
        checked = variant in ("streamed", "mapped")  # bitwise against resident, on its own
        if r.error:
            verdicts += [(t, "skipped") for t in targets + (["bitwise"] if checked else [])]
            rows.append([model, batch, label] + ["-"] * 6 + [f"skipped: {r.error}"])
            continue
        c = counter_set(r)
        equal = c.get("matches_resident" if variant == "accelerate" else "bitwise_equal")
        if checked:
            what = f"{label}, model {model}, batch {batch}"
            if equal is None:
                notes.append("- " + not_measured("bitwise", f"{what}: no bitwise_equal counter",
                                                 verdicts))
            else:
                verdicts.append(("bitwise", "pass" if equal == 1 else "fail"))
                if equal != 1:
                    notes.append(f"- bitwise: **FAIL** {what}: outputs differ from resident")
        cells = [offload_verdict(t, r, runs, verdicts) for t in targets]
        budget = ("-" if "budget_bytes" not in c else
                  f"{fmt_mib(c['budget_bytes'])} / {fmt_mib(c.get('high_water_bytes'))}")
        rows.append([model, batch, label, fmt_us(ms_of(r)), fmt_us(c.get("ms_p99")),
                     "-" if "gbps" not in c else f"{c['gbps']:.1f}",
                     "-" if "pct_of_limit" not in c else f"{c['pct_of_limit']:.1f}",
                     budget, "-" if equal is None else "yes" if equal == 1 else "no",
                     "; ".join(cells) or ("baseline" if variant == "resident" else "-")])
    for tname, why in offload_missing():
        if tname not in held:
            notes.append("- " + not_measured(tname, why, verdicts))
    return rows, verdicts, notes


def limit_line(limit, runs):
    """What the offload table's % of limit is against."""
    if limit is None:
        line = "Pinned H2D limit: not measured (no BM_offload_limit row)."
    elif limit.error:
        line = f"Pinned H2D limit (BM_offload_limit): skipped: {limit.error}."
    else:
        c = counter_set(limit)
        line = f"Pinned H2D limit (BM_offload_limit): {c.get('gbps', 0):.1f} GB/s"
        if "bytes" in c and "reps" in c:
            line += f", median of {c['reps']:.0f} copies of {fmt_mib(c['bytes'])} MiB"
        line += "."
    peer = [counter_set(r)["limit_gbps"] for r in runs
            if not r.error and "limit_gbps" in counter_set(r)]
    if peer:
        line += (" The accelerate row's % is against the limit measured in its own process: "
                 + ", ".join(f"{g:.1f}" for g in peer) + " GB/s.")
    return line


def shared_rows(shared):
    """T9: device memory of N runners sharing one model against W + N·A."""
    rows, verdicts = [], []
    for r in shared:
        n = r.param("runners") or "-"
        if r.error:
            rows.append([n] + ["-"] * 5 + [f"skipped: {r.error}"])
            verdicts.append(("T9", "skipped"))
            continue
        c = counter_set(r)
        need = ("weight_bytes", "activation_bytes", "device_bytes", "bound_bytes")
        if any(k not in c for k in need):
            target = not_measured("T9", "no " + " / ".join(k for k in need if k not in c),
                                  verdicts)
        else:
            bound = TARGETS["T9"]["bound"].replace("N", n)
            target = check("T9", c["device_bytes"] <= c["bound_bytes"], f"≤ {bound}", verdicts)
        rows.append([n, fmt_mib(c.get("weight_bytes")), fmt_mib(c.get("activation_bytes")),
                     fmt_mib(c.get("device_bytes")), fmt_mib(c.get("bound_bytes")),
                     "-" if "use_count" not in c else f"{c['use_count']:.0f}", target])
    return rows, verdicts


def offload_section(runs, limit, shared):
    """The Markdown of the offload tables (T4-T9, T11, T14) and their verdicts."""
    rows, verdicts, notes = offload_rows(runs)
    srows, shared_verdicts = shared_rows(shared)
    if not srows:
        notes.append("- " + not_measured("T9", "no BM_offload_shared row", verdicts))
    text = ("### Weight offload (bm_offload, PERF.md T4-T9, T11, T14)\n"
            + limit_line(limit, runs)
            + " GB/s = weight bytes a forward reads (streamed: bytes it copies) / median time; "
            "budget / high water: "
            "device memory for weights under streamed_weights; bitwise equal: the output "
            "against the resident run's on the same input.\n\n"
            + markdown(["model", "batch", "variant", "ms median", "ms p99", "GB/s",
                        "% of limit", "budget / high water MiB", "bitwise equal", "target"],
                       rows))
    if srows:
        text += ("\n\n### T9: runners sharing one model (BM_offload_shared; A per runner)\n"
                 + markdown(["runners", "W MiB", "A MiB", "device MiB measured",
                             "bound W + N·A MiB", "use_count", "target"], srows))
    if notes:
        text += "\n\n" + "\n".join(notes)
    return text, verdicts + shared_verdicts


def graph_rows(other):
    """T12: the graphed<caller_stream> runner against the raw call (bm_graphs)."""
    rows, verdicts, used = [], [], set()
    t12 = TARGETS["T12"]
    runs = sorted((r for r in other if r.base == "BM_graphs"), key=lambda r: r.order)
    # Models and loaders in the order they were first registered; batches by size.
    models = first_seen(r.param("model") for r in runs)
    loaders = first_seen(r.param("loader") for r in runs)
    runs.sort(key=lambda r: (models.index(r.param("model")), loaders.index(r.param("loader")),
                             float(r.param("batch") or 0)))
    for r in runs:
        used.add(r.base)
        key = (r.param("model"), r.param("loader"), r.param("batch"))
        floor = t12["min_speedup"].get(key)
        c = counter_set(r)
        if r.error or "ratio" not in c:
            why = f"skipped: {r.error}" if r.error else "no data"
            rows.append(list(key) + ["-"] * 6 + [why])
            verdicts.append(("T12", "skipped"))
            if floor:
                verdicts.append(("T12", "skipped"))
            continue
        cells = [check("T12", c["ratio"] <= t12["max_ratio"], f"≤{t12['max_ratio']:g}× raw",
                       verdicts)]
        if floor:
            cells.append(check("T12", c.get("speedup", 0.0) >= floor, f"≥{floor:g}× faster",
                               verdicts))
        if c.get("replayed", 1.0) < 1.0:
            cells.append("not replayed (capture refused: eager)")
        rows.append(list(key) + [
            f"{c['calls']:.0f}" if "calls" in c else "-",
            fmt_us(c.get("raw_median_us")), fmt_us(c.get("runner_median_us")),
            f"{fmt_us(c.get('raw_p99_us'))} / {fmt_us(c.get('runner_p99_us'))}",
            f"{c.get('speedup', 0.0):.2f}×",
            "yes" if c.get("bitwise", 0.0) >= 1.0 else "no (within 1e-4)",
            "; ".join(cells)])
    return rows, verdicts, used


def graph_floor_note(other):
    """The line under the T12 table from BM_graphs_floor_fused (a hand-made one-launch replay
    of the MLP, paired with the raw call): the most any replay can gain here."""
    runs = [r for r in other if r.base == "BM_graphs_floor_fused"]
    if not runs:
        return "", set()
    c = counter_set(runs[0])
    if runs[0].error or "ceiling" not in c:
        why = runs[0].error or "no data"
        return f"\n\nFloor (BM_graphs_floor_fused): not measured ({why}).", {runs[0].base}
    return (f"\n\nFloor (BM_graphs_floor_fused, MLP batch {runs[0].param('batch') or '1'}, "
            f"paired with the raw TorchScript call): the captured MLP between a memcpy node for "
            f"the input and one for the output, launched once per call on fixed tensors, with "
            f"no runner around it, took {fmt_us(c.get('runner_median_us'))} µs against "
            f"{fmt_us(c.get('raw_median_us'))} µs for the raw call, {c['ceiling']:.2f}× faster: "
            f"what a replay that copies in and out reaches here with nothing else to do.",
            {runs[0].base})


def markdown(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def summary(verdicts):
    out = []
    for tname in sorted({t for t, _ in verdicts if t}):
        counts = {"pass": 0, "fail": 0, "skipped": 0}
        for t, v in verdicts:
            if t == tname:
                counts[v] += 1
        out.append(f"{tname}: {counts['pass']} pass, {counts['fail']} fail, "
                   f"{counts['skipped']} skipped")
    return "; ".join(out)


def pyplot():
    """matplotlib's pyplot with a file backend, or None where matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_figure(plt, fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def machine_title(contexts, gpu=None, torch=None):
    """"NVIDIA H100 80GB HBM3, torch 2.11.0": the GPU and torch version, from the command
    line or from the results' contexts (scripts/offload_peer.py writes device_name and
    torch_version; a benchmark may add gpu and torch with AddCustomContext)."""
    for _, ctx in contexts:
        gpu = gpu or ctx.get("gpu") or ctx.get("device_name")
        torch = torch or ctx.get("torch") or ctx.get("torch_version")
    return f"{gpu or 'GPU not recorded'}, torch {torch or 'version not recorded'}"


def point_label(feature, r):
    """"overhead cpu batch:1": the benchmark and every parameter, to tell the rows apart."""
    return " ".join([feature] + [v if k in ("device", "model") or k.startswith("arg")
                                 else f"{k}:{v}" for k, v in r.params])


def ratio_points(pairs, paired):
    """Every runner ÷ raw comparison as (label, ratio, low, high, target, limit): the paired
    benchmarks' median ratio with its min-max over the repetitions, else the separately run
    pair's ratio of medians (no spread). Targets the paired benchmarks cover take theirs
    only, as the verdicts do."""
    points = []
    for r in paired:
        feature = r.base[len("BM_paired_"):]
        tname, limit = target_for(feature)
        med = r.counters.get("median") or r.counters.get("single")
        if tname is None or r.error or not med or "ratio" not in med:
            continue
        lo = (r.counters.get("min") or med)["ratio"]
        hi = (r.counters.get("max") or med)["ratio"]
        points.append((point_label(feature, r), med["ratio"], lo, hi, tname, limit))
    covered = {p[4] for p in points}
    for feature, rw, rn in pairs:
        tname, limit = target_for(feature)
        if tname is None or tname in covered or rw.error or rn.error:
            continue
        if not rw.value() or rn.value() is None:
            continue
        ratio = rn.value() / rw.value()
        points.append((point_label(feature, rw), ratio, ratio, ratio, tname, limit))
    return points


def plot(pairs, paired, path, title):
    """runner ÷ raw per benchmark against its target line (T1 1.02 for calls, T10 1.05 for
    loads, on their own panel): a ratio, not µs bars, so that 2% shows."""
    plt = pyplot()
    if plt is None:
        return False
    points = ratio_points(pairs, paired)
    panels = [(t, [p for p in points if p[4] == t]) for t in sorted({p[4] for p in points})]
    panels.sort(key=lambda tp: tp[0] == "T10")  # calls first, loads last
    if not panels:
        return False
    rows = max(len(ps) for _, ps in panels)
    fig, axes = plt.subplots(1, len(panels), squeeze=False,
                             figsize=(6.5 * len(panels), max(3.0, 0.42 * rows + 1.6)))
    for ax, (tname, ps) in zip(axes[0], panels):
        limit = ps[0][5]
        y = list(range(len(ps)))[::-1]
        ratios = [p[1] for p in ps]
        colors = ["tab:green" if v <= limit else "tab:red" for v in ratios]
        ax.errorbar(ratios, y, xerr=[[v - p[2] for v, p in zip(ratios, ps)],
                                     [p[3] - v for v, p in zip(ratios, ps)]],
                    fmt="none", ecolor="grey", capsize=3, lw=1)
        ax.scatter(ratios, y, c=colors, zorder=3)
        for v, yy in zip(ratios, y):
            ax.annotate(f"{v:.3f}×", (v, yy), textcoords="offset points", xytext=(6, 4),
                        fontsize=8)
        ax.axvline(1.0, color="black", lw=0.8)
        ax.axvline(limit, color="red", ls="--", label=f"target ≤ {limit:.2f}× ({tname})")
        lo = min([p[2] for p in ps] + [1.0])
        hi = max([p[3] for p in ps] + [limit])
        pad = max(0.01, 0.15 * (hi - lo))
        ax.set_xlim(lo - pad, hi + 2 * pad)
        ax.set_ylim(-0.7, len(ps) - 0.3)
        ax.set_yticks(y)
        ax.set_yticklabels([p[0] for p in ps], fontsize=7)
        what = "runner construction ÷ raw load" if tname == "T10" else "runner call ÷ raw call"
        ax.set_xlabel(f"{what} (median; whisker: min–max over repetitions)")
        ax.set_title(f"{what}\n{title}", fontsize=9)
        ax.legend(fontsize=8, loc="lower right")
    return save_figure(plt, fig, path)


def plot_offload(runs, limit, path, title):
    """A bar per measured offload row (resident reads no host memory: left out), its GB/s
    written on it with its share of the limit, and the pinned H2D limit as a line."""
    plt = pyplot()
    if plt is None:
        return False
    bars = [r for r in runs if not r.error and "gbps" in counter_set(r)
            and r.param("variant") != "resident"]
    if not bars:
        return False
    limit_gbps = None
    if limit is not None and not limit.error and "gbps" in counter_set(limit):
        limit_gbps = counter_set(limit)["gbps"]
    values = [counter_set(r)["gbps"] for r in bars]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(bars) + 2), 4.8))
    drawn = ax.bar(range(len(bars)), values, 0.6)
    labels = [f"{v:.1f} GB/s" + (f"\n{100 * v / limit_gbps:.0f}%" if limit_gbps else "")
              for v in values]
    # Inside the bars: above them the labels would cross the limit line.
    ax.bar_label(drawn, labels=labels, fontsize=7, label_type="center", color="white",
                 fontweight="bold")
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels(["\n".join(r.param(k) or "-" for k in ("model", "batch", "variant"))
                        for r in bars], fontsize=7)
    top = max(values + ([limit_gbps] if limit_gbps else []))
    if limit_gbps:
        ax.axhline(limit_gbps, color="red", linestyle="--",
                   label=f"pinned H2D limit {limit_gbps:.1f} GB/s (same run)")
        ax.legend(fontsize=8, loc="upper right")
    ax.set_ylim(0, top * 1.22)
    ax.set_ylabel("GB/s of weights moved (median forward)")
    ax.set_title(f"weight offload: streamed and mapped weights\n{title}", fontsize=9)
    return save_figure(plt, fig, path)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="Google Benchmark JSON output files")
    ap.add_argument("--out", default=".",
                    help="directory for report.md, latency.png and offload.png")
    ap.add_argument("--gpu", help="the GPU's name for the plots' titles (default: from the "
                    "results' context)")
    ap.add_argument("--torch", help="torch's version for the plots' titles (default: from "
                    "the results' context)")
    args = ap.parse_args(argv)

    try:
        unreadable = []
        results, contexts = load(args.files, unreadable)
    except (OSError, ValueError, KeyError) as e:
        print(f"report.py: cannot read the benchmark results: {e}", file=sys.stderr)
        return 2
    unread = "\n".join(f"- {os.path.basename(path)} not read (not whole JSON: was the benchmark "
                        f"stopped while it wrote?): {why}" for path, why in unreadable)
    pairs, paired, other = pair_up(results)
    prows, separate_verdicts = pair_rows(pairs)
    qrows, paired_verdicts = paired_rows(paired)
    verdicts = merge_verdicts(separate_verdicts, paired_verdicts)
    tables = []
    if prows:
        targets = sorted({t for t, _ in separate_verdicts if t})
        title = " ".join(targets) + " (separate runs)" if targets else "Raw vs runner"
        tables.append(f"### {title}\n" + markdown(
            ["benchmark", "device", "batch", "raw median µs", "runner median µs", "ratio",
             "raw p99", "runner p99", "target"], prows))
    if qrows:
        targets = sorted({t for t, _ in paired_verdicts if t})
        title = " ".join(targets) + " paired" if targets else "Paired raw vs runner"
        tables.append(
            f"### {title}: raw and runner calls alternate in one loop, each call timed\n"
            + markdown(["benchmark", "device", "batch", "calls×reps", "raw median µs",
                        "runner median µs", "per-call p99 raw / runner µs",
                        "ratio median (min–max)", "target"], qrows))
    srows, stream_verdicts, used_s = stream_rows(other)
    irows, isolation_verdicts, used_i = isolation_rows(other)
    grows, graph_verdicts, used_g = graph_rows(other)
    vrows, serving_verdicts, used_v = serving_rows(other)
    v16rows, serving_isolation_verdicts, used_v16 = serving_isolation_rows(other)
    split_rows = serving_split_rows(other)
    used_g |= used_v | used_v16
    floor_note, used_f = graph_floor_note(other)
    used_g |= used_f
    runs, limit, shared = offload_results(other)
    used_o = {r.base for r in runs + shared + ([limit] if limit else [])}
    verdicts = (verdicts + stream_verdicts + isolation_verdicts + graph_verdicts
                + serving_verdicts + serving_isolation_verdicts)
    other = [r for r in other if r.base not in used_s | used_i | used_o | used_g]
    if srows:
        tables.append("### T2: stream policies, per call (bm_streams; delta = policy − "
                      "caller_stream in the same repetition)\n" + markdown(
                          ["policy", "CPU median µs", "CPU p99", "GPU median µs", "GPU p99",
                           "CPU delta µs", "GPU delta µs", "target"], srows))
    if irows:
        header = ["scenario", "SMs victim / co-tenant", "p50 µs", "p99 µs", "alone p99 µs",
                  "p99 / alone", "calls", "target"]
        note = ""
        if len(irows[0]) > len(header):  # the benchmark sampled SM clock and power
            header[7:7] = ["SM MHz alone / here", "board W (power-capped)",
                           "p99 / alone at the alone clock"]
            note = ("\nSM MHz: mean SM clock while the victim alone, and then the scenario, "
                    "ran; board W: mean power, with the share of samples the driver held the "
                    "clock down for the power limit. The last ratio scales the victim's p99 "
                    "to the alone clock: what remains of the slowdown once the lower clock "
                    "is taken out (the victim is compute-bound on its SMs).\n\n")
        tables.append("### T3: victim latency under a saturating co-tenant (bm_isolation)\n"
                      + note + markdown(header, irows))
    if grows:
        tables.append(
            "### T12: CUDA graph replay, graphed<caller_stream> runner vs the raw call "
            "(bm_graphs; paired, each call timed with its device synchronisation)\n"
            + markdown(["model", "loader", "batch", "calls", "raw median µs",
                        "runner median µs", "p99 raw / runner µs", "speed-up",
                        "bitwise", "target"], grows) + floor_note)
    if vrows:
        tables.append(
            "### T13, T15: served by the in-process Triton core, batch 1, one client and 8 "
            "client threads (bm_triton; the sides of a row group measured in one loop, "
            "shuffled rounds; p50, p99 and requests/s with 8 clients)\n"
            + markdown(["target", "device", "side", "p50 µs, 1 client", "p50 µs", "p99 µs",
                        "requests/s", "verdict"], vrows))
    if split_rows:
        tables.append(
            "### T13, T15: where a request's time goes, by Triton's own statistics (µs per "
            "request over all of a side's rounds, one client and 8; compute input, infer and "
            "output are the backend's execution; a batched request is charged its whole "
            "batch's time)\n"
            + markdown(["target", "device", "side", "queue", "compute input", "compute infer",
                        "compute output", "backend total"], split_rows))
    if v16rows:
        tables.append(
            "### T16: two models in one Triton core, the victim beside a co-tenant saturating "
            "the GPU (bm_triton)\n"
            + markdown(["scenario", "SMs victim / co-tenant", "alone p99 µs", "p50 µs",
                        "p99 µs", "p99 / alone", "SM MHz alone / beside",
                        "p99 / alone at the alone clock", "co-tenant TFLOP/s", "target"],
                       v16rows))
    if used_o:
        text, offload_verdicts = offload_section(runs, limit, shared)
        tables.append(text)
        verdicts = verdicts + offload_verdicts
    orows = other_rows(other)
    if orows:
        tables.append("### Other results and diagnostics (no target)\n"
                      + markdown(["benchmark", "params", "median µs", "p99 µs", "note"], orows))

    ctx = contexts[0][1] if contexts else {}
    machine = (f"{ctx.get('host_name', '?')}, {ctx.get('num_cpus', '?')} CPUs, "
               f"benchmark library {ctx.get('library_build_type', '?')} build, "
               f"{ctx.get('date', '?')}")
    head = "Medians and p99 over the repetitions; ratio = runner median / raw median."
    if qrows:
        head += (" Paired: per-call medians and p99 within a repetition, then the median "
                 "over the repetitions.")
    verdict_line = summary(verdicts)

    os.makedirs(args.out, exist_ok=True)
    png = os.path.join(args.out, "latency.png")
    title = machine_title(contexts, args.gpu, args.torch)
    plotted = plot(pairs, paired, png, title)
    plotted_offload = plot_offload(runs, limit, os.path.join(args.out, "offload.png"), title)
    with open(os.path.join(args.out, "report.md"), "w", encoding="utf-8") as f:
        f.write("# torchloom benchmark report\n\n")
        f.write(f"Machine: {machine}.  \nFiles: "
                + ", ".join(os.path.basename(p) for p, _ in contexts) + ".\n\n")
        f.write(head + "\n\n")
        if verdict_line:
            f.write(f"**{verdict_line}**\n\n")
        f.write("\n\n".join(tables) + "\n")
        if unread:
            f.write("\n" + unread + "\n")
        if plotted:
            f.write("\n![latency](latency.png)\n")
        if plotted_offload:
            f.write("\n![offload GB/s](offload.png)\n")

    print(f"## torchloom benchmarks ({machine})")
    print(head)
    if verdict_line:
        print(verdict_line)
    print()
    print("\n\n".join(tables) if tables else "(no benchmark results)")
    if unread:
        print(unread)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
