#!/usr/bin/env python3
"""Builds the AOTInductor packages that torchloom's C++ tests and benchmarks load.

    python3 scripts/make_aoti_fixtures.py OUTDIR [--op-library PATH]

Needs PyTorch >= 2.6 (torch.export and torch._inductor.aoti_compile_and_package) and a C++
compiler; the CUDA packages need a GPU and are left out without one (the C++ cases that need
them skip). Each package is built in a process of its own, several at a time (compiling one
takes about a minute, most of it in the C++ compiler).

For each fixture NAME it writes, in Triton's model-repository layout:
  OUTDIR/NAME/1/model.pt2      the package;
  OUTDIR/NAME/config.pbtxt     where the fixture declares its inputs there (mlp_cpu), and for
                               the *_aoti fixtures: Triton's config of a `platform:
                               "torch_aoti"` repository, as a Triton user writes it;
  OUTDIR/NAME/reference.pt     the inputs the model was run on and its outputs in eager
                               PyTorch: a TorchScript module whose buffers are in0, in1, ...
                               and out0, out1, ... (CPU tensors; flattened in the call spec's
                               order), so C++ reads them with torch::jit::load and
                               named_buffers(), without Python.

With --op-library (the tests' tl_test op library, built in tests/plugins), it also makes
lookup_cpu and lookup_cuda: a model that calls the custom operator tl_test::lookup(keys,
layer), the op the hook tests' TorchScript model calls, so the same end-to-end test runs on a
package (on the CPU, and on the GPU as a torch_aoti repository). Its outputs depend on tables
the test registers, so it has no reference.pt.

The mlp/two_inputs fixtures declare their inputs inside the package: the metadata entry
"torchloom.inputs" ("x:float32[-1,64];ids:int64[-1,4]"; -1 is a dynamic dimension), set at
compile time through inductor_configs={"aot_inductor.metadata": {...}}. torchloom's
aoti_loader reads it back; declared_inputs() in torchloom_export.py is how to make it for any
exported program.

slow_cuda (CUDA) is a chain of 30 products of a [2048, 2048] input with one [2048, 2048]
weight, each followed by tanh: milliseconds of GPU work per call, for the tests of what the
host does while a call still runs.

The *_aoti fixtures (CUDA) are packaged with plain torch._inductor.aoti_compile_and_package,
as Triton's documentation does, and named by Triton 26.05's rules in their config.pbtxt:
  resnet_aoti   torchvision's resnet18 (10 classes), x float32 [batch, 3, 64, 64] with a
                dynamic batch (torch.export.Dim, 1 to 8); max_batch_size 8, ordinal names
                INPUT__0 / OUTPUT__0; the reference is a batch of 8;
  bert_aoti     a Hugging Face BertModel (random weights, hidden size 32, 2 layers) called with
                keyword arguments input_ids and attention_mask, int64 [2, 16], and
                return_dict=True (fixed at export: not an input of the package); it returns a
                ModelOutput (last_hidden_state, pooler_output), named RESULT[...];
  dict_io_aoti  the dict-in/dict-out model of Triton's PyTorch backend README (float16
                [1, 16]; ARGS[0], ARGS[1], ARGS[2][keyA], ARGS[2][key2], KWARGS[kwarg1],
                KWARGS[kw_arg2] in, a dict of tensors, a tuple and dicts out), its outputs
                listed alphabetically in config.pbtxt as in that README.

The stream_* fixtures (CUDA) are made by torchloom_export.export_model with offload on: a
config.pbtxt, the package (no constants inside, every weight read through
torchloom::stream_weight) and 1/weights.pt, for streamed_weights:
  stream_mlp_cuda    8 x Linear(2048, 2048) with ReLU between: 128 MiB of fp32 weights
                     (and 64 KiB of biases), so a 32 MiB budget is 4x below them; x float32
                     [-1, 2048];
  stream_fused_cuda  Linear(512, 512), then h * a + b * c with a, b, c parameters of shape
                     [512]: inductor fuses that pointwise tail into one kernel, which reads
                     three fetched weights.

Cached: OUTDIR/.stamp holds a hash of this file and torchloom_export.py, the torch version
and whether CUDA is available; when it matches, nothing is rebuilt. A fixture that fails is
reported and the others are kept; the status is then 1 and no stamp is written.
"""

import concurrent.futures
import ctypes
import multiprocessing
import os
import sys
import time
import traceback

import torch
import torch.utils._pytree as pytree
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixture_stamp  # noqa: E402
from torchloom_export import TensorBuffers, declared_inputs, export_model  # noqa: E402

FIXTURES = ("mlp_cpu", "mlp_cuda", "two_inputs_cuda", "lookup_cpu", "lookup_cuda",
            "stream_mlp_cuda", "stream_fused_cuda", "resnet_aoti", "bert_aoti", "dict_io_aoti",
            "slow_cuda")
CPU_FIXTURES = ("mlp_cpu",)
CUDA_FIXTURES = ("stream_mlp_cuda", "mlp_cuda", "two_inputs_cuda", "stream_fused_cuda",
                 "resnet_aoti", "bert_aoti", "dict_io_aoti", "slow_cuda")
LOOKUP_WIDTH = 4  # the width of the hook tests' embedding tables
FEATURES = 64  # the MLPs' input width (the C++ tests use it)
STREAM_WIDTH = 512  # stream_fused_cuda's width
STREAM_MLP_WIDTH = 2048  # stream_mlp_cuda's width


class Mlp(nn.Module):
    """Two layers: [batch, 64] -> [batch, 16]."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, 128)
        self.fc2 = nn.Linear(128, 16)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class SlowChain(nn.Module):
    """30 products of a [2048, 2048] input with one [2048, 2048] weight, each followed by tanh:
    milliseconds of GPU work, so the host can act while a call still runs."""

    def __init__(self, width=2048, steps=30):
        super().__init__()
        self.w = nn.Parameter(torch.randn(width, width) / width ** 0.5)
        self.steps = steps

    def forward(self, x):
        y = x
        for _ in range(self.steps):
            y = torch.tanh(y @ self.w)
        return y


class TwoInputs(nn.Module):
    """Inputs of two dtypes: x float32 [batch, 16], ids int64 [batch, 4] -> [batch, 16]."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.table = nn.Embedding(100, 16)

    def forward(self, x, ids):
        return self.proj(x) + self.table(ids).sum(1)


class StreamMlp(nn.Module):
    """8 x Linear(2048, 2048) with ReLU between: [batch, 2048] -> [batch, 2048]; 128 MiB of
    fp32 weights in all (each layer 16 MiB and its 8 KiB bias)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(STREAM_MLP_WIDTH, STREAM_MLP_WIDTH) for _ in range(8))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = torch.relu(x)
        return x


class StreamFused(nn.Module):
    """lin(x) * a + b * c: the pointwise tail is one fused kernel reading a, b and c."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(STREAM_WIDTH, STREAM_WIDTH)
        self.a = nn.Parameter(torch.randn(STREAM_WIDTH))
        self.b = nn.Parameter(torch.randn(STREAM_WIDTH))
        self.c = nn.Parameter(torch.randn(STREAM_WIDTH))

    def forward(self, x):
        h = self.lin(x)
        return h * self.a + self.b * self.c


class Lookup(nn.Module):
    """Calls the op library's operator: lookup(keys, 0) * 2 + lookup(keys, 1)."""

    def forward(self, keys):
        return torch.ops.tl_test.lookup(keys, 0) * 2.0 + torch.ops.tl_test.lookup(keys, 1)


class TritonExample(nn.Module):
    """The model of the AOT Inductor example in Triton's PyTorch backend README: tensors, a
    dict of tensors and keyword arguments in; a dict of a tensor, a tuple and dicts out, in
    this insertion order (AAA, ZZZ, BBB, CCC, DDD)."""

    def forward(self, hdata, vdata, options, *, kwarg1, kw_arg2):
        return {
            "AAA": hdata + vdata,
            "ZZZ": hdata - vdata,
            "BBB": (hdata * 2, vdata * 3),
            "CCC": {"keyA": options["keyA"] + 1, "key2": options["key2"] * 2},
            "DDD": {"KA": kwarg1 + hdata, "KB": kw_arg2 - vdata},
        }


DICT_IO_CONFIG = """name: "dict_io_aoti"
backend: "pytorch"
platform: "torch_aoti"
max_batch_size: 0
input: [
  { name: "ARGS[0]" data_type: TYPE_FP16 dims: [ 1, 16 ] },
  { name: "ARGS[1]" data_type: TYPE_FP16 dims: [ 1, 16 ] },
  { name: "ARGS[2][keyA]" data_type: TYPE_FP16 dims: [ 1, 16 ] },
  { name: "ARGS[2][key2]" data_type: TYPE_FP16 dims: [ 1, 16 ] },
  { name: "KWARGS[kwarg1]" data_type: TYPE_FP16 dims: [ 1, 16 ] },
  { name: "KWARGS[kw_arg2]" data_type: TYPE_FP16 dims: [ 1, 16 ] }
]
output: [
  { name: "RESULT[AAA]" data_type: TYPE_FP16 dims: [ 1, 16 ] },
  { name: "RESULT[BBB][0]" data_type: TYPE_FP16 dims: [ 1, 16 ] },
  { name: "RESULT[BBB][1]" data_type: TYPE_FP16 dims: [ 1, 16 ] },
  { name: "RESULT[CCC][keyA]" data_type: TYPE_FP16 dims: [ 1, 16 ] },
  { name: "RESULT[CCC][key2]" data_type: TYPE_FP16 dims: [ 1, 16 ] },
  { name: "RESULT[DDD][KA]" data_type: TYPE_FP16 dims: [ 1, 16 ] },
  { name: "RESULT[DDD][KB]" data_type: TYPE_FP16 dims: [ 1, 16 ] },
  { name: "RESULT[ZZZ]" data_type: TYPE_FP16 dims: [ 1, 16 ] }
]
instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]
"""

RESNET_CONFIG = """name: "resnet_aoti"
platform: "torch_aoti"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 64, 64 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 10 ] } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]
"""

BERT_CONFIG = """name: "bert_aoti"
backend: "pytorch"
platform: "torch_aoti"
max_batch_size: 0
input [
  { name: "KWARGS[input_ids]" data_type: TYPE_INT64 dims: [ 2, 16 ] },
  { name: "KWARGS[attention_mask]" data_type: TYPE_INT64 dims: [ 2, 16 ] }
]
output [
  { name: "RESULT[pooler_output]" data_type: TYPE_FP32 dims: [ 2, 32 ] },
  { name: "RESULT[last_hidden_state]" data_type: TYPE_FP32 dims: [ 2, 16, 32 ] }
]
instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]
"""


def load_op_library(path):
    """Loads the tl_test op library and gives its operator a fake kernel (the output's shape
    for torch.export); registers small tables in case compiling runs the operator."""
    torch.ops.load_library(path)

    @torch.library.register_fake("tl_test::lookup")
    def _(keys, layer):
        return keys.new_empty((*keys.shape, LOOKUP_WIDTH), dtype=torch.float32)

    lib = ctypes.CDLL(path)
    error = ctypes.create_string_buffer(256)
    for layer in (0, 1):
        table = torch.randn(16, LOOKUP_WIDTH)
        lib.tl_test_register_table(ctypes.c_int32(layer), ctypes.c_void_p(table.data_ptr()),
                                   ctypes.c_int64(16), ctypes.c_int64(LOOKUP_WIDTH),
                                   ctypes.c_int(-1), error, ctypes.c_size_t(len(error)))


def save_reference(directory, model, reference_inputs, device, kwargs=None):
    """Runs `model` (on `device`, in eval mode) on reference_inputs (and `kwargs`) in eager
    PyTorch and saves the inputs and outputs, each flattened as torch.export flattens them,
    as DIRECTORY/reference.pt."""
    move = lambda t: t.to(device) if isinstance(t, torch.Tensor) else t  # noqa: E731
    reference_inputs = pytree.tree_map(move, tuple(reference_inputs))
    kwargs = pytree.tree_map(move, dict(kwargs or {}))
    with torch.no_grad():
        outputs = model(*reference_inputs, **kwargs)
    # The package's inputs and outputs: the tensor leaves, in the call spec's order.
    flat_in = [t for t in pytree.tree_leaves((reference_inputs, kwargs))
               if isinstance(t, torch.Tensor)]
    flat_out = pytree.tree_leaves(outputs)
    tensors = {f"in{i}": t.detach().cpu() for i, t in enumerate(flat_in)}
    tensors.update({f"out{i}": t.detach().cpu() for i, t in enumerate(flat_out)})
    torch.jit.script(TensorBuffers(tensors)).save(os.path.join(directory, "reference.pt"))


def build(outdir, name, model, sample, reference_inputs, dynamic_shapes, device,
          declare_in_metadata, config=None):
    """Exports `model` on `sample`, compiles and packages it as OUTDIR/NAME/1/model.pt2, and
    saves the reference next to it (unless reference_inputs is None)."""
    started = time.time()
    model = model.to(device).eval()
    sample = tuple(t.to(device) for t in sample)
    ep = torch.export.export(model, sample, dynamic_shapes=dynamic_shapes)
    # A fresh dict per package: some torch versions write the device key into the metadata
    # dict they are given.
    metadata = {"torchloom.inputs": declared_inputs(ep)} if declare_in_metadata else {}
    directory = os.path.join(outdir, name)
    os.makedirs(os.path.join(directory, "1"), exist_ok=True)
    package = os.path.join(directory, "1", "model.pt2")
    torch._inductor.aoti_compile_and_package(
        ep, package_path=package, inductor_configs={"aot_inductor.metadata": metadata})
    if reference_inputs is not None:
        save_reference(directory, model, reference_inputs, device)
    if config:
        with open(os.path.join(directory, "config.pbtxt"), "w", encoding="utf-8") as f:
            f.write(config)
    print(f"make_aoti_fixtures: {name} ({device}) in {time.time() - started:.0f}s"
          + (f"; torchloom.inputs = {metadata['torchloom.inputs']}" if metadata else ""),
          flush=True)


def build_streamed(outdir, name, model, sample, reference_inputs):
    """Makes OUTDIR/NAME with torchloom_export.export_model (offload on, CUDA, the batch
    dynamic) and saves the reference next to it."""
    started = time.time()
    directory = export_model(model, sample, os.path.join(outdir, name), name=name,
                             device="cuda", offload=True)
    save_reference(directory, model, reference_inputs, "cuda")
    print(f"make_aoti_fixtures: {name} (cuda, weights streamed) in "
          f"{time.time() - started:.0f}s", flush=True)


def build_plain(outdir, name, model, args, kwargs, dynamic_shapes, config,
                reference_args=None):
    """Exports `model` on CUDA with torch.export and packages it with plain
    torch._inductor.aoti_compile_and_package (no metadata, nothing torchloom adds), as
    OUTDIR/NAME/1/model.pt2 beside Triton's `config`, and saves the reference (on
    reference_args, else the sample)."""
    started = time.time()
    model = model.to("cuda").eval()
    move = lambda t: t.to("cuda") if isinstance(t, torch.Tensor) else t  # noqa: E731
    args = pytree.tree_map(move, tuple(args))
    kwargs = pytree.tree_map(move, dict(kwargs))
    ep = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes)
    directory = os.path.join(outdir, name)
    os.makedirs(os.path.join(directory, "1"), exist_ok=True)
    torch._inductor.aoti_compile_and_package(
        ep, package_path=os.path.join(directory, "1", "model.pt2"))
    with open(os.path.join(directory, "config.pbtxt"), "w", encoding="utf-8") as f:
        f.write(config)
    save_reference(directory, model, reference_args or args, "cuda", kwargs)
    print(f"make_aoti_fixtures: {name} (cuda, plain aoti_compile_and_package) in "
          f"{time.time() - started:.0f}s", flush=True)


def make(outdir, name, op_library):
    """Builds fixture `name` (run in a process of its own)."""
    torch.manual_seed(0)
    # Eager references without TF32, as the C++ tests compare them.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    batch = torch.export.Dim("batch", min=1, max=4096)
    if name == "mlp_cpu":
        build(outdir, "mlp_cpu", Mlp(), (torch.randn(8, FEATURES),), (torch.randn(5, FEATURES),),
              {"x": {0: batch}}, "cpu", declare_in_metadata=False,
              config='name: "mlp_cpu"\nmax_batch_size: 4096\n'
                     f'input [ {{ name: "x" data_type: TYPE_FP32 dims: [ {FEATURES} ] }} ]\n')
    elif name == "mlp_cuda":
        build(outdir, "mlp_cuda", Mlp(), (torch.randn(8, FEATURES),),
              (torch.randn(5, FEATURES),), {"x": {0: batch}}, "cuda", declare_in_metadata=True)
    elif name == "two_inputs_cuda":
        build(outdir, "two_inputs_cuda", TwoInputs(),
              (torch.randn(8, 16), torch.randint(0, 100, (8, 4))),
              (torch.randn(5, 16), torch.randint(0, 100, (5, 4))),
              {"x": {0: batch}, "ids": {0: batch}}, "cuda", declare_in_metadata=True)
    elif name == "slow_cuda":
        build(outdir, "slow_cuda", SlowChain(), (torch.rand(2048, 2048),), None, None, "cuda",
              declare_in_metadata=True)
    elif name == "stream_mlp_cuda":
        build_streamed(outdir, "stream_mlp_cuda", StreamMlp(),
                       (torch.randn(8, STREAM_MLP_WIDTH),), (torch.randn(5, STREAM_MLP_WIDTH),))
    elif name == "stream_fused_cuda":
        build_streamed(outdir, "stream_fused_cuda", StreamFused(),
                       (torch.randn(8, STREAM_WIDTH),), (torch.randn(5, STREAM_WIDTH),))
    elif name == "resnet_aoti":
        import torchvision  # noqa: PLC0415 (only this fixture needs it)

        small_batch = torch.export.Dim("batch", min=1, max=8)
        build_plain(outdir, name, torchvision.models.resnet18(num_classes=10),
                    (torch.randn(4, 3, 64, 64),), {}, ({0: small_batch},), RESNET_CONFIG,
                    reference_args=(torch.randn(8, 3, 64, 64),))
    elif name == "bert_aoti":
        from transformers import BertConfig, BertModel  # noqa: PLC0415

        config = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=37,
                            max_position_embeddings=64)
        ids = torch.randint(0, 128, (2, 16))
        mask = torch.ones(2, 16, dtype=torch.int64)
        mask[1, 11:] = 0
        build_plain(outdir, name, BertModel(config), (),
                    {"input_ids": ids, "attention_mask": mask, "return_dict": True}, None,
                    BERT_CONFIG)
    elif name == "dict_io_aoti":
        def half():
            return torch.randn(1, 16, dtype=torch.float16)
        build_plain(outdir, name, TritonExample(),
                    (half(), half(), {"keyA": half(), "key2": half()}),
                    {"kwarg1": half(), "kw_arg2": half()}, None, DICT_IO_CONFIG)
    elif name in ("lookup_cpu", "lookup_cuda"):
        load_op_library(op_library)
        device = "cpu" if name == "lookup_cpu" else "cuda"
        build(outdir, name, Lookup(), (torch.randint(0, 10, (8,)),), None,
              {"keys": {0: batch}}, device, declare_in_metadata=name == "lookup_cpu")
    else:
        raise ValueError(f"no fixture called {name}")
    return name


def stamp(op_library):
    return fixture_stamp.digest(
        ("make_aoti_fixtures.py", "torchloom_export.py"),
        f"torch {torch.__version__} cuda {torch.version.cuda} "
        f"available {torch.cuda.is_available()} op library {bool(op_library)}")


def main(argv):
    op_library = None
    if len(argv) == 3 and argv[1] == "--op-library":
        op_library = os.path.abspath(argv[2])
    elif len(argv) != 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    outdir = os.path.abspath(argv[0])
    want = stamp(op_library)
    if fixture_stamp.up_to_date(outdir, want):
        print(f"make_aoti_fixtures: {outdir} is up to date")
        return 0
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    if version < (2, 6):
        print(f"make_aoti_fixtures: torch {torch.__version__} is too old (needs 2.6)",
              file=sys.stderr)
        return 1
    fixture_stamp.clear(outdir, FIXTURES)

    names = list(CPU_FIXTURES)
    if torch.cuda.is_available():
        names = list(CUDA_FIXTURES) + names  # the longest first
    else:
        print("make_aoti_fixtures: no CUDA device: the CUDA packages are left out")
    if op_library:
        names.append("lookup_cpu")
        if torch.cuda.is_available():
            names.append("lookup_cuda")
    started = time.time()
    failed = []
    # A process per package ("spawn": no CUDA state is inherited), several at once: compiling
    # is mostly the C++ compiler, one core each.
    workers = max(1, min(len(names), (os.cpu_count() or 2) // 2, 10))
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        jobs = {pool.submit(make, outdir, n, op_library): n for n in names}
        for job in concurrent.futures.as_completed(jobs):
            try:
                job.result()
            except Exception:  # noqa: BLE001 (reported, and the status says it)
                failed.append(jobs[job])
                print(f"make_aoti_fixtures: {jobs[job]} FAILED:\n{traceback.format_exc()}",
                      file=sys.stderr, flush=True)
    print(f"make_aoti_fixtures: {len(names) - len(failed)} of {len(names)} packages in "
          f"{time.time() - started:.0f}s ({workers} at a time)", flush=True)
    if failed:
        print(f"make_aoti_fixtures: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    fixture_stamp.mark(outdir, want)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
