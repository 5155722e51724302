#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Checks torchloom-run as a user meets it. Usage: check_cli.py CHECK PATH-TO-torchloom-run

help     --help lists every policy of every role, and the combinations of this build
version  --version names torchloom, torch and CUDA
json     --stream pool --residency shared --threads 4 --json runs the bundled model and
         prints JSON that parses, with the context and the statistics
errors   a model error is printed alone (no usage text) with exit status 1; bad usage
         exits 2 with the usage text; --name=value works like --name value
platform the model's platform picks the loader: Triton's alias `libtorch` runs, a
         `torch_aoti` config beside a TorchScript file is one line naming both, and so is
         --loader aoti on a TorchScript model
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile


def run(binary, *args):
    p = subprocess.run([binary, *args], capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


def expect(cond, what, *context):
    if not cond:
        print("FAIL:", what)
        for c in context:
            print(c)
        sys.exit(1)


ROLES = {
    "--loader": ["torchscript", "aoti"],
    "--hook": ["none", "dlopen"],
    "--stream": ["caller", "pool", "adaptive", "green", "green_complement", "graphed_caller"],
    "--residency": ["resident", "shared", "streamed", "mapped"],
}


def check_help(binary):
    rc, out, err = run(binary, "--help")
    expect(rc == 0, "--help exits 0", out, err)
    for flag, names in ROLES.items():
        line = next((l for l in out.splitlines() if l.strip().startswith(flag + " ")), None)
        expect(line is not None, f"--help has a line for {flag}", out)
        for name in names:
            expect(f"'{name}'" in line, f"--help lists {flag} {name}", line)
    expect("torchscript/none/pool/shared" in out, "--help lists the combinations", out)
    for flag in ["--threads", "--json", "--version", "--set", "--iterations"]:
        expect(flag in out, f"--help mentions {flag}", out)


def check_version(binary):
    rc, out, err = run(binary, "--version")
    expect(rc == 0, "--version exits 0", out, err)
    lines = out.splitlines()
    expect(len(lines) == 3, "--version prints three lines", out)
    expect(lines[0].startswith("torchloom ") and lines[0].split()[1][0].isdigit(),
           "first line: torchloom VERSION", out)
    expect(lines[1].startswith("torch ") and lines[1].split()[1][0].isdigit(),
           "second line: torch VERSION", out)
    expect(lines[2].startswith("CUDA "), "third line: CUDA ...", out)


def check_json(binary):
    iterations = 25
    rc, out, err = run(binary, "--stream", "pool", "--residency", "shared", "--threads", "4",
                       f"--iterations={iterations}", "--json")
    expect(rc == 0, "the JSON run exits 0", out, err)
    doc = json.loads(out)  # raises (and fails the test) if it does not parse
    ctx = doc["context"]
    expect(ctx["policies"] == {"loader": "torchscript", "hook": "none", "stream": "pool",
                               "residency": "shared"}, "the policies asked for", ctx)
    expect(ctx["threads"] == 4 and ctx["iterations_per_thread"] == iterations,
           "threads and iterations", ctx)
    expect(ctx["device"] == "cpu" and ctx["model"] == "tiny_mlp", "device and model", ctx)
    expect(ctx["torchloom"] and ctx["torch"] and ctx["cuda"], "versions", ctx)
    expect(ctx["options"].get("INFERENCE_MODE") == "true", "options from config.pbtxt", ctx)
    expect(ctx["outputs"] == ["[8, 16] float32"], "the model's output", ctx)
    st = doc["statistics"]
    expect(st["runs"] == 4 * iterations, "every thread's runs are counted", st)
    order = [st[k] for k in ["min", "p50", "p90", "p99", "p99.9", "max"]]
    expect(all(a <= b for a, b in zip(order, order[1:])) and order[0] > 0,
           "min <= p50 <= p90 <= p99 <= p99.9 <= max", st)
    expect(st["min"] <= st["mean"] <= st["max"] and st["throughput_per_s"] > 0, "mean", st)
    # 100 runs: p99 is just defined, p99.9 is the maximum and says so.
    expect(len(st["notes"]) == 1 and "p99.9" in st["notes"][0], "a note on p99.9", st)
    mem = doc["memory"]
    expect(mem["device_bytes"] > 0 and mem["budget_violations"] == 0, "memory()", mem)


def check_errors(binary):
    rc, out, err = run(binary, "/nonexistent/model/dir")
    expect(rc == 1, "a missing model exits 1", out, err)
    lines = [l for l in err.splitlines() if l.strip()]
    expect(len(lines) == 1 and "/nonexistent/model/dir" in lines[0] and "usage" not in err,
           "a model error is one line naming the path, without the usage text", err)

    rc, out, err = run(binary, "--residency", "streamed")  # no WEIGHT_OFFLOAD_BUDGET_MB
    expect(rc == 1 and "WEIGHT_OFFLOAD_BUDGET_MB" in err and "usage" not in err,
           "streamed without a budget is a model error naming the key", err)

    rc, out, err = run(binary, "--stream=polo")
    expect(rc == 2 and "'polo'" in err
           and "'caller', 'pool', 'adaptive', 'green', 'green_complement' or 'graphed_caller'"
           in err
           and "usage:" in err, "a bad policy name is a usage error listing the names", err)

    rc, out, err = run(binary, "--iterations=3", "--warmup=0", "--residency=resident",
                       "--set=INTRA_OP_THREAD_COUNT=1")
    expect(rc == 0 and "latency:   3 runs" in out, "--name=value syntax", out, err)
    expect("INTRA_OP_THREAD_COUNT=1" in out, "--set=KEY=VALUE takes effect", out)
    expect("memory:" in out, "memory() is printed", out)
    expect("p99 needs at least 100 runs" in out, "a note when p99 is the maximum", out)


def bundled_model(binary):
    """The bundled model's directory, as --help names it."""
    _, out, _ = run(binary, "--help")
    path = next((w for w in out.split() if w.rstrip("/").endswith("tiny_mlp")), None)
    expect(path is not None and os.path.isdir(path), "--help names the bundled model", out)
    return path


def check_platform(binary):
    bundled = bundled_model(binary)
    with open(os.path.join(bundled, "config.pbtxt"), encoding="utf-8") as f:
        config = f.read()
    expect('platform: "pytorch_libtorch"' in config, "the bundled config names its platform",
           config)
    with tempfile.TemporaryDirectory() as tmp:
        def repository(name, platform, model_file):
            d = os.path.join(tmp, name)
            os.makedirs(os.path.join(d, "1"))
            shutil.copy(os.path.join(bundled, "1", "model.pt"), os.path.join(d, "1", model_file))
            with open(os.path.join(d, "config.pbtxt"), "w", encoding="utf-8") as f:
                f.write(config.replace('platform: "pytorch_libtorch"', f'platform: "{platform}"'))
            return d

        alias = repository("alias", "libtorch", "model.pt")
        rc, out, err = run(binary, alias, "--iterations=2", "--warmup=0", "--json")
        expect(rc == 0, "platform libtorch runs", out, err)
        expect(json.loads(out)["context"]["policies"]["loader"] == "torchscript",
               "platform libtorch picks the TorchScript loader", out)

        mislabelled = repository("mislabelled", "torch_aoti", "model.pt2")
        rc, out, err = run(binary, mislabelled)
        lines = [l for l in err.splitlines() if l.strip()]
        expect(rc == 1 and len(lines) == 1 and "usage" not in err,
               "a torch_aoti config beside a TorchScript file is one line, exit 1", out, err)
        for part in ["config.pbtxt:", "platform 'torch_aoti'", "is a TorchScript archive",
                     'set platform: "pytorch_libtorch"']:
            expect(part in lines[0], f"the contradiction names {part}", err)

        rc, out, err = run(binary, alias, "--loader", "aoti")
        lines = [l for l in err.splitlines() if l.strip()]
        expect(rc == 1 and len(lines) == 1 and "usage" not in err,
               "--loader aoti on a TorchScript model is one line, exit 1", out, err)
        expect("platform 'libtorch' calls for a TorchScript archive" in lines[0]
               or "no runner for loader=aoti" in lines[0],
               "--loader aoti on a TorchScript model says why", err)


CHECKS = {"help": check_help, "version": check_version, "json": check_json,
          "errors": check_errors, "platform": check_platform}

if __name__ == "__main__":
    CHECKS[sys.argv[1]](sys.argv[2])
    print("cli:", sys.argv[1], "ok")
