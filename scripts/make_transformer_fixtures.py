#!/usr/bin/env python3
"""Builds the AOTInductor packages of real architectures that streamed_weights is tested and
measured on: Hugging Face transformers and a torchvision model, random-init, exported for
streaming by torchloom_export.export_model.

    python3 scripts/make_transformer_fixtures.py OUTDIR [matrix|llm]

Needs PyTorch >= 2.6 with a GPU, transformers (the Hugging Face models) and torchvision (the
vision model). Each fixture is exported in a process of its own, all of a set at once (about a
minute of inductor compile each); the script waits for them and says how each went.

The sets:
  matrix (default), for the [cuda] tests of tests/unit/aoti/test_aoti_streamed.cpp, each a
  model directory OUTDIR/NAME (config.pbtxt, 1/model.pt2, 1/weights.pt) with reference.pt
  (the inputs in0, in1, ... in the package's input order and the eager model's outputs out0,
  out1, ... on them, flattened like the package's):
    hf_gpt2       GPT2LMHeadModel, 2 layers, fp32: the output projection is tied to the token
                  embedding (one weight, two names);
    hf_bert       BertModel with two tensors made in forward (a [256] gain: a lifted constant,
                  streamed; a [4] shift: inductor writes it as code), fp32: int64
                  non-persistent buffers (position_ids, token_type_ids), two inputs
                  (input_ids, attention_mask), two outputs;
    hf_llama      LlamaForCausalLM, 2 layers, bf16: the rotary embedding's inv_freq buffer
                  (non-persistent), grouped-query attention; original_inv_freq is never read;
    hf_t5         T5ForConditionalGeneration, 2 + 2 layers, fp32: one embedding shared by the
                  encoder, the decoder and the output projection (one weight, four names),
                  keyword inputs input_ids and decoder_input_ids, two outputs;
    tv_mobilenet  torchvision mobilenet_v3_small, fp16: batch-norm buffers, biases of 8
                  elements that inductor writes as code, num_batches_tracked never read.
  llm, for bm_offload's T14 rows (PERF.md): Llama-2-7B's layer shapes (hidden 4096, MLP 11008,
  32 heads, vocabulary 32000, untied), bf16, prefill of batch 1 and 128 tokens (input_ids
  [1, 128], static):
    llama_offload        6 layers: 2.75 GiB of weights;
    llama_offload_small  the same architecture with 1 layer (0.87 GiB), for the bitwise check
                         against resident_weights.

The shapes are static (no dynamic batch). A fixture whose premise does not hold (GPT-2 without
a tied weight, say) is still written, and the script fails saying so.

Cached: each OUTDIR/NAME/.stamp holds a hash of this file and torchloom_export.py and the
versions of torch, transformers and torchvision; a fixture whose stamp matches is not rebuilt.
"""

import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixture_stamp  # noqa: E402

MATRIX = ("hf_gpt2", "hf_bert", "hf_llama", "hf_t5", "tv_mobilenet")
LLM = ("llama_offload", "llama_offload_small")
SETS = {"matrix": MATRIX, "llm": LLM}
SEED = 0
TIMEOUT_S = 400  # for all of a set's processes together

# T14's model (scripts/offload_peer.py builds the same one for accelerate).
LLM_CONFIG = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                  num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=2048,
                  tie_word_embeddings=False)
LLM_LAYERS = {"llama_offload": 6, "llama_offload_small": 1}
LLM_TOKENS = 128


def llm_model(layers, device="cuda"):
    """T14's decoder with `layers` layers, random-init, bf16, on `device`, in eval mode."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=layers, **LLM_CONFIG)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(torch.bfloat16).eval()


def llm_input(device="cuda"):
    """T14's input: input_ids [1, 128] drawn from a fixed seed."""
    import torch

    gen = torch.Generator().manual_seed(SEED + 1)
    return torch.randint(0, LLM_CONFIG["vocab_size"], (1, LLM_TOKENS), generator=gen).to(device)


# ---------------------------------------------------------------------------------------
# The models: each returns (model, kwargs in forward's parameter order, premise), premise a
# function of the StreamPlan that returns what is wrong with it (or None).

def _one_weight(plan, tied):
    """What is wrong with a plan in which the tensors named `tied` (which share their memory)
    should be one streamed weight."""
    holding = [w.names for w in plan.weights if tied & set(w.names)]
    if len(holding) != 1:
        return (f"the tied tensors {sorted(tied)} are {len(holding)} streamed weights "
                f"({holding}), not one")
    return None


def _ids(vocab, *shape):
    import torch
    return torch.randint(1, vocab, shape)


def make_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=4096, n_positions=256, n_embd=256, n_layer=2, n_head=4,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)

    def premise(plan):
        return _one_weight(plan, {"lm_head.weight", "transformer.wte.weight"})

    return model, {"input_ids": _ids(4096, 2, 64), "use_cache": False}, premise


def make_bert():
    import torch
    from torch import nn
    from transformers import BertConfig, BertModel

    class BertWithConstants(nn.Module):
        """BertModel, then tensors made in forward (lifted by torch.export as constants):
        a gain of 256 elements and a shift of 4."""

        def __init__(self, config):
            super().__init__()
            self.bert = BertModel(config)

        def forward(self, input_ids, attention_mask):
            hidden, pooled = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                                       return_dict=False)[:2]
            width = pooled.shape[-1]
            gain = torch.tensor([1.0 + i / 512 for i in range(width)], device=pooled.device)
            shift = torch.tensor([0.5, -0.25, 0.125, 0.0], device=pooled.device)
            return hidden, pooled * gain + shift.repeat(width // 4)

    config = BertConfig(vocab_size=4096, hidden_size=256, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=1024,
                        max_position_embeddings=256)
    model = BertWithConstants(config)
    ids = _ids(4096, 2, 64)
    mask = torch.ones(2, 64, dtype=torch.int64)
    mask[1, 48:] = 0  # the second sequence is padded

    def premise(plan):
        wrong = []
        if not any(w.kind == "tensor constant" for w in plan.weights):
            wrong.append("no lifted tensor constant streamed")
        if not any("lifted_tensor" in n for n in plan.inlined):
            wrong.append("no lifted tensor constant left as code")
        if not any(w.tensor.dtype == torch.int64 for w in plan.weights):
            wrong.append("no int64 buffer streamed")
        return "; ".join(wrong) or None

    return model, {"input_ids": ids, "attention_mask": mask}, premise


def make_llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=688,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(torch.bfloat16)

    def premise(plan):
        wrong = []
        if not any(n.endswith("rotary_emb.inv_freq") for w in plan.weights for n in w.names):
            wrong.append("the rotary embedding's inv_freq is not streamed")
        if not any(w.tensor.dtype == torch.bfloat16 for w in plan.weights):
            wrong.append("no bf16 weight")
        return "; ".join(wrong) or None

    return model, {"input_ids": _ids(4096, 2, 64), "use_cache": False}, premise


def make_t5():
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=4096, d_model=256, d_kv=64, d_ff=1024, num_layers=2,
                      num_decoder_layers=2, num_heads=4, decoder_start_token_id=0,
                      pad_token_id=0)
    model = T5ForConditionalGeneration(config)

    def premise(plan):
        return _one_weight(plan, {"shared.weight", "encoder.embed_tokens.weight",
                                  "decoder.embed_tokens.weight", "lm_head.weight"})

    return model, {"input_ids": _ids(4096, 2, 32), "decoder_input_ids": _ids(4096, 2, 16),
                   "use_cache": False}, premise


def make_mobilenet():
    import torch
    import torchvision

    model = torchvision.models.mobilenet_v3_small(weights=None).to(torch.float16)

    def premise(plan):
        wrong = []
        if not plan.inlined:
            wrong.append("no tensor of at most 8 elements left as code")
        if not any(w.tensor.dtype == torch.float16 for w in plan.weights):
            wrong.append("no fp16 weight")
        return "; ".join(wrong) or None

    gen = torch.Generator().manual_seed(SEED + 2)
    x = torch.randn(2, 3, 160, 160, generator=gen).to(torch.float16)
    return model, {"x": x}, premise


MAKERS = {"hf_gpt2": make_gpt2, "hf_bert": make_bert, "hf_llama": make_llama, "hf_t5": make_t5,
          "tv_mobilenet": make_mobilenet}


# ---------------------------------------------------------------------------------------

def versions():
    """The versions the fixtures depend on, as text."""
    import torch
    parts = [f"torch {torch.__version__} cuda {torch.version.cuda}"]
    for module in ("transformers", "torchvision"):
        try:
            parts.append(f"{module} {__import__(module).__version__}")
        except ImportError:
            parts.append(f"{module} missing")
    return " ".join(parts)


def stamp(name, extra):
    return fixture_stamp.digest(("make_transformer_fixtures.py", "torchloom_export.py"),
                                f"{name} {extra}")


def input_order(directory):
    """The input names of config.pbtxt, in order (what export_model wrote)."""
    with open(os.path.join(directory, "config.pbtxt"), encoding="utf-8") as f:
        text = f.read()
    block = text[text.index("input ["):text.index("output [")]
    return re.findall(r'name: "([^"]+)"', block)


def save_reference(directory, model, kwargs):
    """Runs `model` in eager PyTorch on the kwargs and saves reference.pt: the tensor inputs in
    the package's order (in0, ...) and the flattened outputs (out0, ...)."""
    import torch
    from torch.utils._pytree import tree_leaves
    from torchloom_export import TensorBuffers

    with torch.no_grad():
        outputs = [t for t in tree_leaves(model(**kwargs)) if isinstance(t, torch.Tensor)]
    tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    order = input_order(directory)
    if order != list(tensors):
        raise RuntimeError(f"the package's inputs are {order}, the fixture's {list(tensors)}")
    saved = {f"in{i}": tensors[n].detach().cpu() for i, n in enumerate(order)}
    saved.update({f"out{i}": t.detach().cpu() for i, t in enumerate(outputs)})
    torch.jit.script(TensorBuffers(saved)).save(os.path.join(directory, "reference.pt"))


def build_one(outdir, name):
    """Exports fixture `name` into OUTDIR/NAME (this process). Returns the exit status: 0, or
    3 when the fixture was written but its premise does not hold."""
    import torch
    from torchloom_export import export_model

    started = time.time()
    torch.manual_seed(SEED)
    directory = os.path.join(outdir, name)
    plans = []
    if name in LLM_LAYERS:
        model = llm_model(LLM_LAYERS[name])
        kwargs = {"input_ids": llm_input(), "use_cache": False}
        premise = None
    else:
        model, kwargs, premise = MAKERS[name]()
    export_model(model, (), directory, example_kwargs=kwargs, name=name, device="cuda",
                 batch_dynamic=False, offload=True, on_plan=plans.append)
    built = time.time() - started
    kwargs = {k: v.to("cuda") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    if name not in LLM_LAYERS:
        save_reference(directory, model, kwargs)
    wrong = premise(plans[0]) if premise and plans else None
    print(f"make_transformer_fixtures: {name} in {built:.0f}s: {plans[0].summary()}",
          flush=True)
    if wrong:
        print(f"make_transformer_fixtures: {name}: PREMISE NOT MET: {wrong}", flush=True)
        return 3
    return 0


def main(argv):
    if len(argv) == 3 and argv[0] == "--one":
        outdir, name = os.path.abspath(argv[1]), argv[2]
        extra = versions()
        # Only this fixture's directory: OUTDIR's own stamp, if any, is another script's.
        shutil.rmtree(os.path.join(outdir, name), ignore_errors=True)
        status = build_one(outdir, name)
        if status == 0:
            fixture_stamp.mark(os.path.join(outdir, name), stamp(name, extra))
        return status
    if len(argv) not in (1, 2) or (len(argv) == 2 and argv[1] not in SETS):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    outdir = os.path.abspath(argv[0])
    names = SETS[argv[1] if len(argv) == 2 else "matrix"]
    try:
        import torch
    except ImportError as e:
        print(f"make_transformer_fixtures: torch is not installed ({e})", file=sys.stderr)
        return 1
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    if version < (2, 6) or not torch.cuda.is_available():
        print(f"make_transformer_fixtures: needs torch >= 2.6 with CUDA (torch "
              f"{torch.__version__}, CUDA available: {torch.cuda.is_available()})",
              file=sys.stderr)
        return 1
    extra = versions()
    todo = [n for n in names
            if not fixture_stamp.up_to_date(os.path.join(outdir, n), stamp(n, extra))]
    for n in names:
        if n not in todo:
            print(f"make_transformer_fixtures: {n} is up to date")
    if not todo:
        return 0
    os.makedirs(outdir, exist_ok=True)
    started = time.time()
    jobs = {}
    for n in todo:
        log = open(os.path.join(outdir, f".{n}.log"), "w", encoding="utf-8")
        jobs[n] = (subprocess.Popen([sys.executable, os.path.abspath(__file__), "--one", outdir,
                                     n], stdout=log, stderr=subprocess.STDOUT), log)
    status = 0
    for n, (proc, log) in jobs.items():
        try:
            rc = proc.wait(timeout=max(1.0, TIMEOUT_S - (time.time() - started)))
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
            print(f"make_transformer_fixtures: {n}: stopped after {TIMEOUT_S}s")
        log.close()
        with open(log.name, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        mine = [l for l in lines if l.startswith(("make_transformer_fixtures:",
                                                  "torchloom_export:"))]
        for line in mine:
            print(line)
        if rc != 0:
            status = 1
            print(f"make_transformer_fixtures: {n}: FAILED (status {rc}); last lines of "
                  f"{log.name}:")
            for line in lines[-25:]:
                print("    " + line[:300])
    print(f"make_transformer_fixtures: {len(todo)} fixtures in {time.time() - started:.0f}s"
          + ("" if status == 0 else " (some FAILED)"), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
