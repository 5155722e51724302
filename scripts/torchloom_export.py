#!/usr/bin/env python3
"""Exports a PyTorch module as an AOTInductor package that torchloom's aoti_loader runs.

    python3 scripts/torchloom_export.py MODULE:FUNCTION OUT_DIR [--name NAME] [--device DEV]
        [--max-batch N] [--no-batch] [--no-offload] [--output-names A,B,...]

FUNCTION (in MODULE, a dotted module name or a .py file) takes no arguments and returns
(model, example_inputs). From Python: export_model(model, example_inputs, out_dir, ...).
Needs PyTorch >= 2.6 and a C++ compiler (and a GPU for device "cuda").

It writes a model directory in Triton's layout:
  OUT_DIR/config.pbtxt   name, backend "torchloom", max_batch_size (when the batch dimension
                         is dynamic; the dims then leave it out, as Triton's do), and each
                         input and output with its name, data_type and dims (-1: dynamic);
  OUT_DIR/1/model.pt2    the package; its metadata carries "torchloom.inputs"
                         ("x:float32[-1,64];ids:int64[-1,4]"), the inputs' names, dtypes and
                         shapes, which aoti_loader checks run() against;
  OUT_DIR/1/weights.pt   with offload (the default): the package's weights on the host, a
                         TorchScript module whose buffers w0, w1, ... are the weights by fetch
                         index (CPU, contiguous, dtypes kept).

With offload, every read of a weight (parameter, buffer, tensor constant) in the exported
graph goes through the operator torchloom::stream_weight(weight, after, index) before it is
compiled. Run in Python it returns a copy of the weight; in the runner (streamed_weights) it
returns the weight copied into the runner's device arena. `index` is the weight's fetch index
(one per weight, in the order the graph first reads them; a weight read by several ops is
fetched once per op with the same index). `after` is an activation the reading op also reads
(the first user input when it reads only weights): it keeps inductor from folding the fetch
into a constant and places it after that activation's producer, so fetches interleave with
compute. The package's metadata entry "torchloom.stream_weights" lists the weights' names by
fetch index, separated by ';'. The inductor settings:
  aot_inductor.package_constants_in_so=False
      the package carries no copy of its constants and allocates no device copy of them at
      load: the runner installs them from weights.pt;
  allow_buffer_reuse=False, inplace_buffers=False
      otherwise inductor could hand a fetched weight's buffer (in the runner, a view of its
      weight arena) to a later intermediate result and overwrite a weight;
  reorder_for_peak_memory=False
      keeps each fetch next to the op that reads it.
Without offload the package is compiled as usual (its constants inside), with no weights.pt
and no "torchloom.stream_weights" entry.

The batch dimension (dimension 0 of every input, shared) is dynamic unless batch_dynamic is
False; the example inputs' batch must then be at least 2 (torch.export fixes a size of 1),
and every output must have the batch as its first dimension too.
"""

import argparse
import importlib
import importlib.util
import os
import sys

import torch
from torch import nn

_LIBRARY = None  # the torch.library.Library defining torchloom::stream_weight (kept alive)

# Triton's data types by torch dtype.
_TRITON_TYPES = {
    torch.bool: "TYPE_BOOL", torch.uint8: "TYPE_UINT8", torch.int8: "TYPE_INT8",
    torch.int16: "TYPE_INT16", torch.int32: "TYPE_INT32", torch.int64: "TYPE_INT64",
    torch.float16: "TYPE_FP16", torch.bfloat16: "TYPE_BF16", torch.float32: "TYPE_FP32",
    torch.float64: "TYPE_FP64",
}


class TensorBuffers(nn.Module):
    """Holds tensors as buffers, so that TorchScript saves them for C++ to read
    (torch::jit::load and named_buffers(), without Python)."""

    def __init__(self, tensors):
        super().__init__()
        for name, t in tensors.items():
            self.register_buffer(name, t)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def declared_inputs(ep):
    """The "torchloom.inputs" metadata value for an exported program: each user input's
    name, dtype and shape, -1 where the dimension is dynamic."""
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    entries = []
    for name in ep.graph_signature.user_inputs:
        val = placeholders[name].meta["val"]
        dims = ",".join(str(d) if isinstance(d, int) else "-1" for d in val.shape)
        dtype = str(val.dtype).removeprefix("torch.")
        entries.append(f"{name}:{dtype}[{dims}]")
    return ";".join(entries)


def define_stream_weight():
    """Defines the operator torchloom::stream_weight once per process."""
    global _LIBRARY
    if _LIBRARY is not None:
        return
    try:
        torch.ops.torchloom.stream_weight.default  # defined already (another import)
        return
    except (AttributeError, RuntimeError):
        pass
    lib = torch.library.Library("torchloom", "FRAGMENT")
    lib.define("stream_weight(Tensor weight, Tensor after, int index) -> Tensor",
               tags=(torch.Tag.nondeterministic_seeded,))
    lib.impl("stream_weight", lambda weight, after, index: weight.clone(),
             "CompositeExplicitAutograd")

    @torch.library.register_fake("torchloom::stream_weight")
    def _(weight, after, index):
        return torch.empty_like(weight)

    _LIBRARY = lib


def _is_tensor(node):
    return isinstance(node.meta.get("val"), torch.Tensor)


def stream_weights(ep):
    """Rewrites `ep` in place: every read of a weight goes through torchloom::stream_weight.
    Returns the weights by fetch index: a list of (name, tensor)."""
    from torch._guards import detect_fake_mode

    define_stream_weight()
    op = torch.ops.torchloom.stream_weight.default
    sig = ep.graph_signature
    written = dict(sig.buffers_to_mutate)
    written.update(getattr(sig, "parameters_to_mutate", {}))
    if written:
        names = ", ".join(sorted(written.values()))
        raise ValueError(f"the model writes into its weights ({names}): export it in eval "
                         "mode, or without offload")
    weights = dict(sig.inputs_to_parameters)
    weights.update(sig.inputs_to_buffers)
    weights.update(getattr(sig, "inputs_to_lifted_tensor_constants", {}))
    graph = ep.graph_module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    weights = {n.name: weights[n.name] for n in placeholders
               if n.name in weights and _is_tensor(n)}
    user_inputs = [n for n in placeholders if n.name in set(sig.user_inputs) and _is_tensor(n)]
    if not user_inputs:
        raise ValueError("the model has no tensor input to order its weight fetches after")
    fake_mode = detect_fake_mode([n.meta["val"] for n in placeholders if "val" in n.meta])

    index = {}  # weight placeholder name -> fetch index, in the order of first reads
    for consumer in list(graph.nodes):
        if consumer.op in ("placeholder", "get_attr"):
            continue
        read = [a for a in consumer.all_input_nodes if a.name in weights]
        if not read:
            continue
        if consumer.op == "output":
            raise ValueError(f"the model returns a weight ({weights[read[0].name]}); "
                             "export it without offload")
        acts = [a for a in consumer.all_input_nodes
                if a.name not in weights and a.op != "get_attr" and _is_tensor(a)]
        after = acts[0] if acts else user_inputs[0]
        for w in read:
            i = index.setdefault(w.name, len(index))
            with graph.inserting_before(consumer):
                fetch = graph.call_function(op, (w, after, i))
            with fake_mode:
                fetch.meta["val"] = op(w.meta["val"], after.meta["val"], i)
            consumer.replace_input_with(w, fetch)
    graph.lint()
    ep.graph_module.recompile()

    out = []
    for name in sorted(index, key=index.get):
        fqn = weights[name]
        tensor = ep.state_dict[fqn] if fqn in ep.state_dict else ep.constants[fqn]
        out.append((fqn, tensor))
    return out


def _dims(val, batch_dynamic):
    dims = [d if isinstance(d, int) else -1 for d in val.shape]
    return dims[1:] if batch_dynamic else dims


def _config(name, ep, batch_dynamic, max_batch, output_names):
    """The text of config.pbtxt for `ep` (inputs from its user inputs, outputs from its
    user outputs)."""
    sig = ep.graph_signature
    nodes = {n.name: n for n in ep.graph.nodes}
    output_node = next(n for n in ep.graph.nodes if n.op == "output")
    returned = {n.name: n for n in output_node.args[0] if isinstance(n, torch.fx.Node)}

    def vals(names, what):
        out = []
        for n in names:
            node = returned.get(n) if what == "output" else nodes.get(n)
            val = node.meta.get("val") if node is not None else None
            if not isinstance(val, torch.Tensor):
                raise ValueError(f"{what} '{n}' is not a tensor: a config.pbtxt cannot "
                                 "declare it")
            if val.dtype not in _TRITON_TYPES:
                raise ValueError(f"{what} '{n}' has dtype {val.dtype}, which Triton lacks")
            out.append(val)
        return out

    inputs = vals(sig.user_inputs, "input")
    outputs = vals(sig.user_outputs, "output")
    if output_names is None:
        output_names = [f"output{i}" for i in range(len(outputs))]
    if len(output_names) != len(outputs):
        raise ValueError(f"{len(output_names)} output names for {len(outputs)} outputs")
    if batch_dynamic:
        batch = str(inputs[0].shape[0])
        for n, val in zip(output_names, outputs):
            if val.dim() == 0 or str(val.shape[0]) != batch:
                raise ValueError(f"output '{n}' does not have the batch as its first "
                                 "dimension: export it with batch_dynamic=False")

    def entry(n, v):
        dims = _dims(v, batch_dynamic)  # none: a scalar (per batch element); no dims field
        shape = f' dims: [ {", ".join(str(d) for d in dims)} ]' if dims else ""
        return f'  {{ name: "{n}" data_type: {_TRITON_TYPES[v.dtype]}{shape} }}'

    def entries(names, values):
        return ",\n".join(entry(n, v) for n, v in zip(names, values))

    lines = [f'name: "{name}"', 'backend: "torchloom"']
    if batch_dynamic:
        lines.append(f"max_batch_size: {max_batch}")
    lines.append("input [\n" + entries(sig.user_inputs, inputs) + "\n]")
    lines.append("output [\n" + entries(output_names, outputs) + "\n]")
    return "\n".join(lines) + "\n"


def export_model(model, example_inputs, out_dir, *, name=None, device="cuda",
                 batch_dynamic=True, max_batch=4096, offload=True, output_names=None):
    """Exports `model` on `example_inputs` (a tuple of positional arguments), compiles it
    with AOTInductor for `device` and writes the model directory `out_dir` (see the module's
    description). `model` is moved to `device` and put in eval mode (nn.Module.to moves it in
    place); the tensors among `example_inputs` are moved there too. `name` defaults to the
    directory's name. Returns `out_dir`, as an absolute path."""
    out_dir = os.path.abspath(out_dir)
    name = name or os.path.basename(out_dir)
    model = model.to(device).eval()
    example_inputs = tuple(t.to(device) if isinstance(t, torch.Tensor) else t
                           for t in example_inputs)
    dynamic_shapes = None
    if batch_dynamic:
        batch = torch.export.Dim("batch", min=1, max=max_batch)
        dynamic_shapes = tuple({0: batch} if isinstance(t, torch.Tensor) else None
                               for t in example_inputs)
    ep = torch.export.export(model, example_inputs, dynamic_shapes=dynamic_shapes)
    config = _config(name, ep, batch_dynamic, max_batch, output_names)

    # A fresh metadata dict per package: some torch versions write into the one they get.
    metadata = {"torchloom.inputs": declared_inputs(ep)}
    inductor_configs = {}
    weights = None
    if offload:
        weights = stream_weights(ep)
        metadata["torchloom.stream_weights"] = ";".join(fqn for fqn, _ in weights)
        inductor_configs.update({
            "aot_inductor.package_constants_in_so": False,
            "allow_buffer_reuse": False,
            "inplace_buffers": False,
            "reorder_for_peak_memory": False,
        })
    inductor_configs["aot_inductor.metadata"] = metadata

    version_dir = os.path.join(out_dir, "1")
    os.makedirs(version_dir, exist_ok=True)
    torch._inductor.aoti_compile_and_package(
        ep, package_path=os.path.join(version_dir, "model.pt2"),
        inductor_configs=inductor_configs)
    weights_file = os.path.join(version_dir, "weights.pt")
    if weights is not None:
        tensors = {f"w{i}": t.detach().cpu().contiguous() for i, (_, t) in enumerate(weights)}
        torch.jit.script(TensorBuffers(tensors)).save(weights_file)
    elif os.path.exists(weights_file):
        os.remove(weights_file)  # a stale one would be read as this package's weights
    with open(os.path.join(out_dir, "config.pbtxt"), "w", encoding="utf-8") as f:
        f.write(config)
    return out_dir


def _load_function(spec):
    """The function MODULE:FUNCTION names (MODULE a dotted name or a .py file)."""
    module_name, _, function = spec.rpartition(":")
    if not module_name or not function:
        raise SystemExit(f"torchloom_export: expected MODULE:FUNCTION, not '{spec}'")
    if module_name.endswith(".py") or os.sep in module_name:
        loader_spec = importlib.util.spec_from_file_location("_torchloom_export_model",
                                                             module_name)
        if loader_spec is None:
            raise SystemExit(f"torchloom_export: cannot import '{module_name}'")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[loader_spec.name] = module
        loader_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    return getattr(module, function)


def main(argv):
    parser = argparse.ArgumentParser(
        prog="torchloom_export.py",
        description="Exports a model as an AOTInductor package in a Triton-layout directory.")
    parser.add_argument("spec", metavar="MODULE:FUNCTION",
                        help="returns (model, example_inputs); MODULE: dotted name or .py file")
    parser.add_argument("out_dir", metavar="OUT_DIR")
    parser.add_argument("--name", help="the model's name (default: OUT_DIR's name)")
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--max-batch", type=int, default=4096,
                        help="the largest batch (default 4096)")
    parser.add_argument("--no-batch", action="store_true",
                        help="no dynamic batch dimension: the shapes are the examples'")
    parser.add_argument("--no-offload", action="store_true",
                        help="constants inside the package, no weights.pt")
    parser.add_argument("--output-names", help="comma-separated (default output0, ...)")
    args = parser.parse_args(argv)
    if tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 6):
        print(f"torchloom_export: torch {torch.__version__} is too old (needs 2.6)",
              file=sys.stderr)
        return 1
    sys.path.insert(0, os.getcwd())
    model, example_inputs = _load_function(args.spec)()
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    out = export_model(model, tuple(example_inputs), args.out_dir, name=args.name,
                       device=args.device, batch_dynamic=not args.no_batch,
                       max_batch=args.max_batch, offload=not args.no_offload,
                       output_names=args.output_names.split(",") if args.output_names
                       else None)
    print(f"torchloom_export: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
