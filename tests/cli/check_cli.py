#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Checks torchloom-run as a user meets it. Usage: check_cli.py CHECK PATH-TO-torchloom-run

help     --help lists every policy of every role, the combinations of this build and the
         exit statuses, in the same words as README.md and the CLI's README.md
version  --version names torchloom, torch and CUDA
json     --stream pool --residency shared --threads 4 --json runs the bundled model and
         prints JSON that parses, with the context and the statistics
errors   a model error is one line with exit status 1; a usage error is one line and a
         pointer to --help with exit status 2, with "did you mean" for flags and policy
         names; an option for a policy the runner lacks names the flag that adds it; bytes
         that are not UTF-8 come out escaped; --name=value works like --name value
json_errors  with --json, every kind of error is also one JSON object on stdout
platform the model's platform picks the loader: Triton's alias `libtorch` runs, a
         `torch_aoti` config beside a TorchScript file is one line naming both, and so is
         --loader aoti on a TorchScript model
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(binary, *args):
    p = subprocess.run([binary, *args], capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


def run_bytes(binary, *args):
    """Runs with arguments as bytes; the output must decode as strict UTF-8."""
    p = subprocess.run([binary, *args], capture_output=True, timeout=600)
    try:
        return p.returncode, p.stdout.decode("utf-8"), p.stderr.decode("utf-8")
    except UnicodeDecodeError as e:
        expect(False, f"the output is not valid UTF-8: {e}", p.stdout, p.stderr)


def nonblank(text):
    return [line for line in text.splitlines() if line.strip()]


def words(text):
    """Text with Markdown's backticks and every run of white space made one space."""
    return " ".join(text.replace("`", "").split())


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
    # The exit statuses are written once, in the same words, in --help and both READMEs.
    m = re.search(r"Exit status: .*?\}\}\.", out, re.S)
    expect(m is not None, "--help states the exit statuses", out)
    statuses = words(m.group(0))
    for s in ["0 the model ran", "1 torchloom, torch or this program refused", "2 the command line is wrong"]:
        expect(s in statuses, f"--help: '{s}'", statuses)
    for readme in ["README.md", os.path.join("examples", "torchloom-run", "README.md")]:
        with open(os.path.join(ROOT, readme), encoding="utf-8") as f:
            text = words(f.read())
        expect(statuses in text, f"{readme} states the exit statuses as --help does", statuses)


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


def expect_usage_error(binary, args, *parts):
    rc, out, err = run(binary, *args)
    lines = nonblank(err)
    expect(rc == 2, f"{args}: a usage error exits 2", out, err)
    expect(len(lines) == 2 and lines[0].startswith("torchloom-run: ")
           and lines[1] == "see 'torchloom-run --help'",
           f"{args}: one line, then a pointer to --help (not the usage text)", err)
    for p in parts:
        expect(p in lines[0], f"{args}: the message says {p!r}", err)
    expect(out == "", f"{args}: nothing on stdout without --json", out)


def expect_model_error(binary, args, code, *parts):
    rc, out, err = run(binary, *args)
    lines = nonblank(err)
    expect(rc == 1, f"{args}: a model error exits 1", out, err)
    expect(len(lines) == 1 and lines[0].endswith(f"[{code}]") and "--help" not in err,
           f"{args}: one line, torchloom's message with code {code}", err)
    for p in parts:
        expect(p in lines[0], f"{args}: the message says {p!r}", err)


def check_errors(binary):
    expect_model_error(binary, ["/nonexistent/model/dir"], "model_not_found",
                       "/nonexistent/model/dir")
    # No WEIGHT_OFFLOAD_BUDGET_MB: the runner's own check, naming the key.
    expect_model_error(binary, ["--residency", "streamed"], "invalid_option",
                       "WEIGHT_OFFLOAD_BUDGET_MB")
    # A value or key torchloom refuses exits 1 from --set as from config.pbtxt.
    expect_model_error(binary, ["--set", "INTRA_OP_THREAD_COUNT=many"], "invalid_option",
                       "INTRA_OP_THREAD_COUNT='many'")
    expect_model_error(binary, ["--set", "INFERENCE_MODES=true"], "invalid_option",
                       "did you mean 'INFERENCE_MODE'?")
    # An option for a policy the runner lacks names the flag that adds the policy.
    expect_model_error(binary, ["--set", "MODEL_INIT_LIBRARY=libinit.so"], "invalid_option",
                       "MODEL_INIT_LIBRARY", "add --hook dlopen")
    expect_model_error(binary, ["--set", "WEIGHT_OFFLOAD_BUDGET_MB=64"], "invalid_option",
                       "add --residency streamed or --residency mapped")
    # graphed<Stream>'s keys: the stream kind that wraps the caller's stream in it.
    expect_model_error(binary, ["--set", "CUDA_GRAPH_MAX_SHAPES=3"], "invalid_option",
                       "graphed<Stream>", "add --stream graphed_caller")

    expect_usage_error(binary, ["--stream=polo"], "'polo' is not a stream policy",
                       "did you mean 'pool'?",
                       "'caller', 'pool', 'adaptive', 'green', 'green_complement' or "
                       "'graphed_caller'")
    expect_usage_error(binary, ["--stream", "bogus"], "'bogus' is not a stream policy")
    expect_usage_error(binary, ["--residency", "shard"], "did you mean 'shared'?")
    expect_usage_error(binary, ["--threads", "0"], "--threads must be an integer >= 1, not '0'")
    expect_usage_error(binary, ["--bogus"], "unknown option '--bogus'")
    expect_usage_error(binary, ["--stram", "pool"], "unknown option '--stram'",
                       "did you mean '--stream'?")
    expect_usage_error(binary, ["--iterations"], "--iterations needs a value")
    expect_usage_error(binary, ["--set", "NOEQUALS"], "--set needs KEY=VALUE")

    # Bytes that are not UTF-8 (a Latin-1 path) come out escaped, and the output is UTF-8.
    rc, out, err = run_bytes(binary, b"/nonexistent/caf\xe9")
    expect(rc == 1 and "caf\\xe9" in err and len(nonblank(err)) == 1,
           "a Latin-1 path is escaped in the message", err)
    rc, out, err = run_bytes(binary, b"--stream=p\xf6\x0a")
    expect(rc == 2 and "'p\\xf6\\n'" in err and len(nonblank(err)) == 2,
           "a usage error escapes what it quotes", err)

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


def expect_json_error(binary, args, status, code, model, *parts):
    rc, out, err = run_bytes(binary, *args, b"--json")
    expect(rc == status, f"{args} --json exits {status}", out, err)
    doc = json.loads(out)  # raises (and fails the test) if it does not parse
    expect(list(doc) == ["error"], f"{args}: stdout is one error object", out)
    e = doc["error"]
    expect(e["code"] == code and e["model"] == model and e["exit_status"] == status,
           f"{args}: code {code}, model {model}, exit_status {status}", e)
    for p in parts:
        expect(p in e["message"], f"{args}: the message says {p!r}", e)
    expect(e["message"] in err, f"{args}: stderr still has the message", err)


def check_json_errors(binary):
    expect_json_error(binary, [b"--threads", b"0"], 2, "usage", None, "--threads")
    expect_json_error(binary, [b"--stream", b"polo"], 2, "usage", None, "did you mean 'pool'?")
    expect_json_error(binary, [b"/nonexistent/model"], 1, "model_not_found", "model",
                      "/nonexistent/model")
    expect_json_error(binary, [b"--set", b"MODEL_INIT_LIBRARY=libinit.so"], 1, "invalid_option",
                      "tiny_mlp", "add --hook dlopen")
    expect_json_error(binary, [b"/nonexistent/caf\xe9"], 1, "model_not_found", "caf\\xe9",
                      "caf\\xe9")
    # --json given before the error is found, and after it.
    rc, out, err = run(binary, "--json", "--bogus")
    expect(rc == 2 and json.loads(out)["error"]["code"] == "usage", "--json first", out, err)


CHECKS = {"help": check_help, "version": check_version, "json": check_json,
          "errors": check_errors, "json_errors": check_json_errors, "platform": check_platform}

if __name__ == "__main__":
    CHECKS[sys.argv[1]](sys.argv[2])
    print("cli:", sys.argv[1], "ok")
