#!/usr/bin/env python3
"""The Python peer of bench/bm_offload (PERF.md T5): HuggingFace accelerate's cpu_offload.

    scripts/offload_peer.py --out bm_offload_peer.json [--layers 16] [--dim 8192]
                            [--batch 16] [--reps 30]
    scripts/offload_peer.py --model llama --out bm_offload_peer_llama.json [--reps 30]

The model is bm_offload's model:large: a torch.nn.Sequential of LAYERS bias-free
nn.Linear(DIM, DIM) in bf16 applied in sequence (y = x @ W^T, no activation), weights drawn
on the GPU with std 1/sqrt(DIM) from a fixed seed. accelerate.cpu_offload(model,
execution_device=cuda:0) keeps the weights in host memory and copies each layer's weight to
the GPU when that layer runs. The input is a BATCH x DIM bf16 tensor on the GPU, drawn from
the same seed (never zeros).

Timing: 3 warm-up forwards, then REPS forwards, all under torch.inference_mode(). Each forward
is timed with a pair of CUDA events recorded on the current stream around the call, after a
torch.cuda.synchronize(), so each starts on an idle GPU; the events also take in the time the
GPU waits for the host between the copies and kernels it issues. The median and the p99
(nearest rank) are in milliseconds; gbps = weight bytes / median seconds / 1e9.

The limit: pinned host-to-device bandwidth measured in this process with one 1 GiB copy (a
pinned host tensor copied with non_blocking=True into a device tensor allocated beforehand,
timed with CUDA events), median of 10 after 2 warm-ups: counter limit_gbps, and
pct_of_limit = gbps / limit_gbps * 100.

The check: the last timed forward's output against the same model with every weight resident
on the GPU, same input: matches_resident is 1 when torch.equal holds, else 0; max_abs_diff
gives the largest difference.

With --model llama (PERF.md T14) the model is bm_offload's model:llama_aoti instead: the
Llama-architecture decoder of scripts/make_transformer_fixtures.py (llm_model: Llama-2-7B's
layer shapes, 6 layers, bf16, random-init from the same seed, on the GPU), run as a prefill of
its 128-token input at batch 1 (llm_input; use_cache=False); the output compared is the
logits. Its entry is BM_offload/model:llama_aoti/batch:1/variant:accelerate, with the same
counters. It needs transformers besides.

Writes Google Benchmark-shaped JSON with one entry,
BM_offload/model:large/batch:BATCH/variant:accelerate (model:LAYERSxDIM instead of large when
--layers or --dim differ from bm_offload's large model), a single run whose real_time is the
median in ms and whose user counters are ms_median, ms_p99, reps, weight_bytes, gbps,
limit_gbps, pct_of_limit, matches_resident and max_abs_diff. Exit status 0 also when torch,
CUDA or accelerate is missing: the entry then has error_occurred and error_message, which the
report shows as skipped. A failure while measuring writes such an entry too and exits 1.
Standard library besides torch and accelerate.
"""

import argparse
import datetime
import json
import math
import os
import platform
import socket
import statistics
import sys
import traceback

SEED = 20240607
WARMUP = 3
LIMIT_BYTES = 1 << 30
LIMIT_REPS = 10
LIMIT_WARMUP = 2
LLAMA_NAME = "BM_offload/model:llama_aoti/batch:1/variant:accelerate"


def bench_name(layers, dim, batch):
    """The entry's name, as bm_offload names its rows."""
    model = "large" if (layers, dim) == (16, 8192) else f"{layers}x{dim}"
    return f"BM_offload/model:{model}/batch:{batch}/variant:accelerate"


def median_p99(samples):
    """(median, p99 by nearest rank) of a list of numbers."""
    s = sorted(samples)
    return statistics.median(s), s[max(0, math.ceil(0.99 * len(s)) - 1)]


def entry(name, counters):
    """A Google Benchmark entry for one run, its time the median in ms."""
    ms = counters["ms_median"]
    e = {"name": name, "family_index": 0, "per_family_instance_index": 0, "run_name": name,
         "run_type": "iteration", "repetitions": 1, "repetition_index": 0, "threads": 1,
         "iterations": 1, "real_time": ms, "cpu_time": ms, "time_unit": "ms"}
    e.update(counters)
    return e


def error_entry(name, message):
    """A Google Benchmark entry for a run that did not happen, with the reason."""
    return {"name": name, "family_index": 0, "per_family_instance_index": 0, "run_name": name,
            "run_type": "iteration", "repetitions": 1, "repetition_index": 0, "threads": 1,
            "iterations": 0, "real_time": 0, "cpu_time": 0, "time_unit": "ms",
            "error_occurred": True, "error_message": message}


def base_context():
    """The context fields that need no torch."""
    return {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "host_name": socket.gethostname(), "executable": "scripts/offload_peer.py",
            "num_cpus": os.cpu_count(), "python_version": platform.python_version()}


def write(path, context, entries):
    """Writes the JSON file the report reads."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"context": context, "benchmarks": entries}, f, indent=2)
        f.write("\n")


def missing_requirements(context, transformers=False):
    """Imports torch and accelerate (and transformers, when asked): (torch, accelerate, what
    is missing, in words). Fills the context with the versions found."""
    missing = []
    accelerate = None
    try:
        import torch
    except ImportError as e:
        return None, None, [f"torch is not installed ({e})"]
    context["torch_version"] = torch.__version__
    context["cuda_version"] = torch.version.cuda
    if not torch.cuda.is_available():
        missing.append(f"CUDA is not available to torch {torch.__version__}")
    else:
        context["device_name"] = torch.cuda.get_device_name(0)
    try:
        import accelerate
        context["accelerate_version"] = accelerate.__version__
    except ImportError as e:
        missing.append(f"accelerate is not installed ({e})")
    if transformers:
        try:
            import transformers as hf
            context["transformers_version"] = hf.__version__
        except ImportError as e:
            missing.append(f"transformers is not installed ({e})")
    return torch, accelerate, missing


def time_ms(torch, fn):
    """Runs fn once on an idle GPU; its time in ms between CUDA events around it."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    out = fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end), out


def pinned_h2d_gbps(torch, nbytes=LIMIT_BYTES):
    """Median bandwidth in GB/s of one pinned host-to-device copy of nbytes."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    src.fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    samples = []
    for i in range(LIMIT_WARMUP + LIMIT_REPS):
        ms, _ = time_ms(torch, lambda: dst.copy_(src, non_blocking=True))
        if i >= LIMIT_WARMUP:
            samples.append(nbytes / (ms / 1e3) / 1e9)
    del src, dst
    torch.cuda.empty_cache()
    return statistics.median(samples)


def make_model(torch, layers, dim, batch):
    """The layers on the GPU with seeded weights, and a seeded input: (model, x)."""
    nn = torch.nn
    torch.manual_seed(SEED)
    model = nn.Sequential(*[nn.Linear(dim, dim, bias=False, dtype=torch.bfloat16,
                                      device="cuda") for _ in range(layers)])
    with torch.no_grad():
        for layer in model:
            nn.init.normal_(layer.weight, std=1.0 / math.sqrt(dim))
    model.requires_grad_(False)
    gen = torch.Generator(device="cuda").manual_seed(SEED + 1)
    x = torch.randn(batch, dim, dtype=torch.bfloat16, device="cuda", generator=gen)
    return model, x


def measure_llama(torch, accelerate, args):
    """The counters of the accelerate row of T14's decoder (see the module's docstring)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_transformer_fixtures as fixtures  # needs transformers

    limit = pinned_h2d_gbps(torch)
    torch.manual_seed(fixtures.SEED)
    model = fixtures.llm_model(fixtures.LLM_LAYERS["llama_offload"], device="cuda")
    model.requires_grad_(False)
    x = fixtures.llm_input(device="cuda")
    weight_bytes = sum(t.numel() * t.element_size()
                       for t in list(model.parameters()) + list(model.buffers()))
    with torch.inference_mode():
        reference = model(input_ids=x, use_cache=False).logits
        torch.cuda.synchronize()
    model.to("cpu")
    torch.cuda.empty_cache()
    accelerate.cpu_offload(model, execution_device=torch.device("cuda:0"))
    samples = []
    with torch.inference_mode():
        for _ in range(WARMUP):
            model(input_ids=x, use_cache=False)
        for _ in range(args.reps):
            ms, y = time_ms(torch, lambda: model(input_ids=x, use_cache=False).logits)
            samples.append(ms)
        equal = torch.equal(y, reference)
        diff = (y.float() - reference.float()).abs().max().item()
    med, p99 = median_p99(samples)
    gbps = weight_bytes / (med / 1e3) / 1e9
    return {"ms_median": med, "ms_p99": p99, "reps": len(samples), "tokens": x.shape[1],
            "weight_bytes": weight_bytes, "gbps": gbps, "limit_gbps": limit,
            "pct_of_limit": 100.0 * gbps / limit, "matches_resident": 1 if equal else 0,
            "max_abs_diff": diff}


def measure(torch, accelerate, args):
    """The counters of the accelerate row (see the module's docstring)."""
    limit = pinned_h2d_gbps(torch)
    model, x = make_model(torch, args.layers, args.dim, args.batch)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    with torch.inference_mode():
        reference = model(x)
        torch.cuda.synchronize()
    model.to("cpu")
    torch.cuda.empty_cache()
    accelerate.cpu_offload(model, execution_device=torch.device("cuda:0"))
    samples = []
    with torch.inference_mode():
        for _ in range(WARMUP):
            model(x)
        for _ in range(args.reps):
            ms, y = time_ms(torch, lambda: model(x))
            samples.append(ms)
        equal = torch.equal(y, reference)
        diff = (y.float() - reference.float()).abs().max().item()
    med, p99 = median_p99(samples)
    gbps = weight_bytes / (med / 1e3) / 1e9
    return {"ms_median": med, "ms_p99": p99, "reps": len(samples),
            "weight_bytes": weight_bytes, "gbps": gbps, "limit_gbps": limit,
            "pct_of_limit": 100.0 * gbps / limit, "matches_resident": 1 if equal else 0,
            "max_abs_diff": diff}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--model", choices=("large", "llama"), default="large",
                    help="bm_offload's large layers (default) or T14's Llama decoder")
    ap.add_argument("--layers", type=int, default=16, help="number of linear layers")
    ap.add_argument("--dim", type=int, default=8192, help="in and out features of each")
    ap.add_argument("--batch", type=int, default=16, help="rows of the input")
    ap.add_argument("--reps", type=int, default=30, help="timed forwards (after 3 warm-ups)")
    args = ap.parse_args(argv)
    if min(args.layers, args.dim, args.batch, args.reps) < 1:
        ap.error("--layers, --dim, --batch and --reps must be positive")
    return args


def main(argv):
    args = parse_args(argv)
    llama = args.model == "llama"
    name = (LLAMA_NAME if llama else bench_name(args.layers, args.dim, args.batch))
    context = base_context()
    status = 0
    try:
        torch, accelerate, missing = missing_requirements(context, transformers=llama)
        if missing:
            result = error_entry(name, "; ".join(missing))
            print(f"not measured: {result['error_message']}")
        else:
            result = entry(name, (measure_llama if llama else measure)(torch, accelerate,
                                                                      args))
    except Exception as e:  # a real failure: reported in the JSON and the exit status
        traceback.print_exc()
        result = error_entry(name, f"failed: {type(e).__name__}: {e}")
        status = 1
    write(args.out, context, [result])
    if not result.get("error_occurred"):
        print(f"{name}: {result['ms_median']:.1f} ms median, {result['ms_p99']:.1f} ms p99, "
              f"{result['gbps']:.1f} GB/s = {result['pct_of_limit']:.1f}% of "
              f"{result['limit_gbps']:.1f} GB/s pinned H2D; output "
              f"{'equal to' if result['matches_resident'] else 'DIFFERS from'} the resident "
              f"run's (max |diff| {result['max_abs_diff']:g})")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
