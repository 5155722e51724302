#!/usr/bin/env python3
"""Exports a PyTorch module as an AOTInductor package that torchloom's aoti_loader runs.

    python3 scripts/torchloom_export.py MODULE:FUNCTION OUT_DIR [--name NAME] [--device DEV]
        [--max-batch N] [--no-batch] [--no-offload] [--keep-small-tensors]
        [--output-names A,B,...]

FUNCTION (in MODULE, a dotted module name or a .py file) takes no arguments and returns
(model, example_inputs) or (model, example_inputs, example_kwargs): the positional and the
keyword arguments of one call of the model. From Python:
export_model(model, example_inputs, out_dir, example_kwargs=..., ...). Needs PyTorch >= 2.6
and a C++ compiler (and a GPU for device "cuda").

Keyword arguments that are not tensors (use_cache=False, return_dict=False for a Hugging Face
model) are fixed at export: the package takes only the tensors. Outputs are the tensors the
model returns, flattened (a tuple, a list, a dict or a Hugging Face ModelOutput alike).

It writes a model directory in Triton's layout:
  OUT_DIR/config.pbtxt   name, backend "torchloom", max_batch_size (when the batch dimension
                         is dynamic; the dims then leave it out, as Triton's do), and each
                         input and output with its name, data_type and dims (-1: dynamic);
  OUT_DIR/1/model.pt2    the package; its metadata carries "torchloom.inputs"
                         ("x:float32[-1,64];ids:int64[-1,4]"), the tensor inputs' names, dtypes
                         and shapes, which aoti_loader checks run() against;
  OUT_DIR/1/weights.pt   with offload (the default): the package's weights on the host, a
                         TorchScript module whose buffers w0, w1, ... are the weights by fetch
                         index (CPU, dtypes and strides kept).

With offload, the helper streams exactly the constants the compiled package keeps:
  - a weight is a tensor the model reads that is not an input: a parameter, a buffer
    (persistent or not) or a tensor constant torch.export lifted (a tensor made in forward);
  - tensors that share their memory (tied parameters, such as an embedding and the output
    projection of a language model) are one weight with all their names; inductor keeps one
    constant for them under one of those names;
  - tensors inductor turns into code are not weights: those of 0 or 1 dimensions with at
    most 8 elements (keep_small_tensors=True, --keep-small-tensors: inductor keeps them as
    constants too, and they are streamed like the rest);
  - tensors the graph never reads are dropped from it before compiling.
Every read of a weight goes through the operator torchloom::stream_weight(weight, after,
index) before the graph is compiled. Run in Python it returns a copy of the weight; in the
runner (streamed_weights) it returns the weight copied into the runner's device arena. `index`
is the weight's fetch index (one per weight, in the order the graph first reads it; every read
of a weight, under any of its names, is fetched with the same index). `after` is an activation
the reading op also reads (the first user input when it reads only weights): it keeps inductor
from folding the fetch into a constant and places it after that activation's producer, so
fetches interleave with compute.

After compiling, the helper reads the package's own list of constants back from the wrapper
source inside the .pt2 archive (constants_info_[i].original_fqn, dtype, shape, stride; the
package is never loaded in Python) and checks that it is exactly the streamed weights, one
constant per weight, same dtype, shape and strides. A package without that source (a torch
that does not put it in the archive) is not checked, and the helper says so.

The package's metadata entry "torchloom.stream_weights" lists the weights by fetch index,
separated by ';'; the names of one weight (the tensors that share it) are separated by ','
("lm_head.weight,transformer.wte.weight;transformer.wpe.weight;..."). The runner installs
each weight under the one of its names the package keeps.

What cannot be streamed fails here, naming the tensor: a weight the model writes (a buffer
updated in forward: export in eval mode), a weight the model returns (or a view of it), a
weight on another device than the model's (a tensor made in forward without device=), a
weight whose elements do not fill its memory densely (an expanded or strided view), a name
with ',' or ';', and a package whose constants are not the streamed weights.

The inductor settings with offload:
  aot_inductor.package_constants_in_so=False
      the package carries no copy of its constants and allocates no device copy of them at
      load: the runner installs them from weights.pt;
  allow_buffer_reuse=False, inplace_buffers=False
      otherwise inductor could hand a fetched weight's buffer (in the runner, a view of its
      weight arena) to a later intermediate result and overwrite a weight;
  reorder_for_peak_memory=False
      keeps each fetch next to the op that reads it;
  always_keep_tensor_constants=keep_small_tensors, freezing=False,
  aot_inductor.use_runtime_constant_folding=False, joint_graph_constant_folding=False
      the constants the package keeps are the ones the helper decided on: no constant folded
      into another (or made by folding, as a _tensor_constant<N> of inductor's) at compile
      time or at load.
Without offload the package is compiled as usual (its constants inside), with no weights.pt
and no "torchloom.stream_weights" entry.

The batch dimension (dimension 0 of every tensor input, shared) is dynamic unless
batch_dynamic is False (--no-batch); the example inputs' batch must then be at least 2
(torch.export fixes a size of 1), and every output must have the batch as its first dimension
too.
"""

import argparse
import importlib
import importlib.util
import inspect
import os
import re
import sys
import zipfile

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

# What the metadata entry separates: weights, and the names of one weight.
_WEIGHT_SEPARATOR = ";"
_NAME_SEPARATOR = ","


class StreamingError(ValueError):
    """A model or package the helper cannot export for streaming; the message names the
    tensor and why."""


class TensorBuffers(nn.Module):
    """Holds tensors as buffers, so that TorchScript saves them for C++ to read
    (torch::jit::load and named_buffers(), without Python)."""

    def __init__(self, tensors):
        super().__init__()
        for name, t in tensors.items():
            self.register_buffer(name, t)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class StreamedWeight:
    """One weight of a package exported for streaming: every name it goes by (tensors that
    share its memory), the tensor, and what it is (parameter, buffer, tensor constant)."""

    def __init__(self, names, tensor, kind):
        self.names = names
        self.tensor = tensor
        self.kind = kind

    @property
    def label(self):
        """Its names for a message: 'a' or 'a' (also 'b', 'c')."""
        text = f"'{self.names[0]}'"
        if len(self.names) > 1:
            text += " (also " + ", ".join(f"'{n}'" for n in self.names[1:]) + ")"
        return text


class StreamPlan:
    """What stream_weights decided: the weights by fetch index, the tensors left to inductor
    as code (names), and the tensors the graph never read, dropped (names)."""

    def __init__(self, weights, inlined, unread, keep_small_tensors):
        self.weights = weights
        self.inlined = inlined
        self.unread = unread
        self.keep_small_tensors = keep_small_tensors

    def metadata(self):
        """The value of the "torchloom.stream_weights" metadata entry."""
        return _WEIGHT_SEPARATOR.join(_NAME_SEPARATOR.join(w.names) for w in self.weights)

    def summary(self):
        """One line on what is streamed and what is not."""
        total = sum(w.tensor.numel() * w.tensor.element_size() for w in self.weights)
        tied = sum(1 for w in self.weights if len(w.names) > 1)
        text = (f"{len(self.weights)} weights streamed ({total / (1 << 20):.2f} MiB"
                + (f"; {tied} of them shared by several names" if tied else "") + ")")
        if self.inlined:
            text += (f"; {len(self.inlined)} small tensors left as code ("
                     + ", ".join(self.inlined[:4]) + (", ..." if len(self.inlined) > 4 else "")
                     + ")")
        if self.unread:
            text += (f"; {len(self.unread)} tensors never read, dropped ("
                     + ", ".join(self.unread[:4]) + (", ..." if len(self.unread) > 4 else "")
                     + ")")
        return text


def _tensor_user_inputs(ep):
    """The names of the exported program's tensor inputs, in order. Inputs fixed at export
    (non-tensor arguments: use_cache=False) are not inputs of the package; any other
    non-tensor input is refused."""
    from torch.export.graph_signature import ConstantArgument, InputKind, TensorArgument

    names = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind != InputKind.USER_INPUT:
            continue
        if isinstance(spec.arg, TensorArgument):
            names.append(spec.arg.name)
        elif not isinstance(spec.arg, ConstantArgument):
            name = getattr(spec.arg, "name", repr(spec.arg))
            raise StreamingError(f"input '{name}' is a {type(spec.arg).__name__}, not a tensor: "
                                 "the runner passes tensors only (fix it at export: pass a "
                                 "Python value, not a symbolic one)")
    return names


def _tensor_user_outputs(ep):
    """The names of the exported program's outputs, which must all be tensors."""
    from torch.export.graph_signature import OutputKind, TensorArgument

    names = []
    for i, spec in enumerate(s for s in ep.graph_signature.output_specs
                             if s.kind == OutputKind.USER_OUTPUT):
        if not isinstance(spec.arg, TensorArgument):
            value = getattr(spec.arg, "value", spec.arg)
            raise StreamingError(f"output {i} is {value!r}, not a tensor: a package returns "
                                 "tensors only (return only tensors; for a Hugging Face model, "
                                 "use_cache=False)")
        names.append(spec.arg.name)
    return names


def declared_inputs(ep):
    """The "torchloom.inputs" metadata value for an exported program: each tensor input's
    name, dtype and shape, -1 where the dimension is dynamic."""
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    entries = []
    for name in _tensor_user_inputs(ep):
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


def inductor_inlines(t):
    """Whether inductor compiles the constant `t` into code instead of keeping it as a
    package constant (unless always_keep_tensor_constants): a tensor of no dimension, or of
    one dimension with at most 8 elements, that inductor can write as code."""
    try:
        from torch._inductor.lowering import unsupported_output_tensor
        if unsupported_output_tensor(t):
            return False  # kept as a constant (a complex tensor, say)
    except (ImportError, TypeError):
        pass
    if t.dim() == 0:
        return True
    try:
        from torch._inductor.graph import GraphLowering
        return bool(GraphLowering.can_inline_constant(t))
    except (ImportError, AttributeError):
        return t.dim() == 1 and t.shape[0] <= 8


def _same_memory_key(t):
    """Tensors inductor takes for one constant: same storage, offset, sizes, strides, dtype
    and device (torch._inductor.utils.is_same_tensor)."""
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()),
            t.dtype, t.device)


def _aliased_source(node):
    """The node whose memory `node`'s value is (through view ops that return an alias of
    their input), or `node` itself."""
    seen = 0
    while (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
           and seen < 10000):
        seen += 1
        schema = node.target._schema
        if not schema.returns or schema.returns[0].alias_info is None:
            return node
        source = None
        for arg, value in zip(schema.arguments, node.args):
            if arg.alias_info is not None and isinstance(value, torch.fx.Node):
                source = value
                break
        if source is None:
            return node
        node = source
    return node


def _is_dense(t):
    try:
        from torch._prims_common import is_non_overlapping_and_dense
        return bool(is_non_overlapping_and_dense(t))
    except ImportError:
        return t.is_contiguous()


def stream_weights(ep, device=None, keep_small_tensors=False):
    """Rewrites `ep` in place so that every read of a weight goes through
    torchloom::stream_weight (see the module's description): drops the weights the graph
    never reads, leaves those inductor turns into code, and fetches each weight (all its
    names) with one index. `device`: the model's device type ("cuda", "cpu"), which every
    streamed weight must be on. Returns a StreamPlan; raises StreamingError naming what
    cannot be streamed."""
    from torch._guards import detect_fake_mode
    from torch.export.graph_signature import InputKind, TensorArgument

    define_stream_weight()
    op = torch.ops.torchloom.stream_weight.default
    sig = ep.graph_signature
    written = dict(sig.buffers_to_mutate)
    written.update(getattr(sig, "parameters_to_mutate", None) or {})
    if written:
        names = ", ".join(f"'{n}'" for n in sorted(written.values()))
        raise StreamingError(f"the model writes into its weights ({names}) in forward: a "
                             "streamed weight is read-only; export it in eval mode, or "
                             "without offload")
    kinds = {InputKind.PARAMETER: "parameter", InputKind.BUFFER: "buffer",
             InputKind.CONSTANT_TENSOR: "tensor constant"}
    graph = ep.graph_module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    by_name = {n.name: n for n in placeholders}
    fqn_of, kind_of, tensor_of = {}, {}, {}
    for spec in sig.input_specs:
        if spec.kind not in kinds or not isinstance(spec.arg, TensorArgument):
            continue
        fqn = spec.target
        value = ep.state_dict.get(fqn) if fqn in ep.state_dict else ep.constants.get(fqn)
        if not isinstance(value, torch.Tensor):
            raise StreamingError(f"{kinds[spec.kind]} '{fqn}' has no tensor in the exported "
                                 "program (its state_dict and constants)")
        kind = kinds[spec.kind]
        if spec.kind == InputKind.BUFFER and spec.persistent is False:
            kind = "non-persistent buffer"
        fqn_of[spec.arg.name] = fqn
        kind_of[spec.arg.name] = kind
        tensor_of[spec.arg.name] = value.detach()
    for name, fqn in fqn_of.items():
        if _WEIGHT_SEPARATOR in fqn or _NAME_SEPARATOR in fqn:
            raise StreamingError(f"{kind_of[name]} '{fqn}': a weight's name cannot contain "
                                 f"'{_WEIGHT_SEPARATOR}' or '{_NAME_SEPARATOR}' (the metadata "
                                 "separates names with them); rename its module")

    # Weights the graph never reads: no constant in the package; dropped from the program.
    unread = [n for n in placeholders if n.name in fqn_of and not n.users]
    if unread:
        gone = {n.name for n in unread}
        for n in unread:
            graph.erase_node(n)
        sig.input_specs[:] = [s for s in sig.input_specs
                              if not (isinstance(s.arg, TensorArgument) and s.arg.name in gone)]
    unread_names = [fqn_of[n.name] for n in unread]
    read = [n for n in placeholders if n.name in fqn_of and n.users]

    # One weight per memory (tied tensors share it); those inductor writes as code stay so.
    group_of, members, inlined = {}, {}, []
    for n in read:
        key = _same_memory_key(tensor_of[n.name])
        group_of[n.name] = key
        members.setdefault(key, []).append(n.name)
    streamed = set()
    for key, names in members.items():
        t = tensor_of[names[0]]
        label = "'" + "', '".join(fqn_of[m] for m in names) + "'"
        if not keep_small_tensors and inductor_inlines(t):
            inlined.extend(fqn_of[m] for m in names)
            continue
        if device is not None and t.device.type != torch.device(device).type:
            raise StreamingError(f"{kind_of[names[0]]} {label} is on {t.device} but the model "
                                 f"runs on {device}: the package would keep a {t.device.type} "
                                 "constant beside its device ones, which cannot be streamed; "
                                 "make it on the model's device (a tensor made in forward: "
                                 "device=x.device; else register it as a buffer, which "
                                 "model.to() moves)")
        if not _is_dense(t):
            raise StreamingError(f"{kind_of[names[0]]} {label} (sizes {list(t.shape)}, strides "
                                 f"{list(t.stride())}) does not fill its memory densely (an "
                                 "expanded or strided view): make it a tensor of its own in the "
                                 "model (.contiguous())")
        streamed.add(key)

    # A streamed tensor constant goes to inductor as a non-persistent buffer (kept in
    # ep.constants, as such buffers are): as a constant, inductor's tracing would see a plain
    # tensor attribute and keep it under a name of its own (_tensor_constant<N>), while the
    # runner installs each weight under the names the metadata gives it.
    from torch.export.graph_signature import InputSpec
    streamed_names = {n for n in fqn_of if group_of.get(n) in streamed}
    for k, spec in enumerate(sig.input_specs):
        if (spec.kind == InputKind.CONSTANT_TENSOR and isinstance(spec.arg, TensorArgument)
                and spec.arg.name in streamed_names):
            sig.input_specs[k] = InputSpec(InputKind.BUFFER, spec.arg, spec.target,
                                           persistent=False)

    # A weight returned as an output (or a view of it) would hand the caller the runner's
    # own memory, which streaming reuses.
    output = next(n for n in graph.nodes if n.op == "output")
    for value in output.all_input_nodes:
        source = _aliased_source(value)
        if group_of.get(source.name) in streamed:
            raise StreamingError(f"the model returns {kind_of[source.name]} "
                                 f"'{fqn_of[source.name]}' (or a view of it) as an output: a "
                                 "streamed weight cannot be an output; return a copy "
                                 "(.clone()), or export without offload")

    user_inputs = [by_name[n] for n in _tensor_user_inputs(ep) if n in by_name]
    user_inputs = [n for n in user_inputs if _is_tensor(n)]
    fake_mode = detect_fake_mode([n.meta["val"] for n in placeholders if "val" in n.meta])
    index = {}  # group key -> fetch index, in the order of first reads
    first_name = {}  # group key -> placeholder names in the order they are first read
    for consumer in list(graph.nodes):
        if consumer.op in ("placeholder", "get_attr", "output"):
            continue
        reads = [a for a in consumer.all_input_nodes
                 if a.op == "placeholder" and group_of.get(a.name) in streamed]
        if not reads:
            continue
        if not user_inputs:
            raise StreamingError("the model has no tensor input to order its weight fetches "
                                 "after")
        acts = [a for a in consumer.all_input_nodes
                if a.name not in fqn_of and a.op != "get_attr" and _is_tensor(a)]
        after = acts[0] if acts else user_inputs[0]
        for w in reads:
            key = group_of[w.name]
            i = index.setdefault(key, len(index))
            order = first_name.setdefault(key, [])
            if w.name not in order:
                order.append(w.name)
            with graph.inserting_before(consumer):
                fetch = graph.call_function(op, (w, after, i))
            with fake_mode:
                fetch.meta["val"] = op(w.meta["val"], after.meta["val"], i)
            consumer.replace_input_with(w, fetch)
    graph.lint()
    ep.graph_module.recompile()

    weights = []
    for key in sorted(index, key=index.get):
        # Every name of the memory, the ones read first first.
        names = first_name[key] + [m for m in members[key] if m not in first_name[key]]
        weights.append(StreamedWeight([fqn_of[m] for m in names], tensor_of[names[0]],
                                      kind_of[names[0]]))
    return StreamPlan(weights, inlined, unread_names, keep_small_tensors)


_CONSTANT_FIELD = re.compile(r"constants_info_\[(\d+)\]\.(\w+)\s*=\s*(.*?);\s*$")


def _parse_constant_field(field, text):
    if field in ("name", "original_fqn"):
        m = re.match(r'^"(.*)"$', text)
        return m.group(1) if m else text
    if field == "dtype":
        m = re.search(r"dtype_(\w+)", text)
        return m.group(1) if m else None
    if field in ("shape", "stride"):
        return [int(v) for v in re.findall(r"-?\d+", text)]
    if field in ("data_size", "offset"):
        m = re.search(r"\d+", text)
        return int(m.group(0)) if m else None
    return text


def package_constants(package_path, model_name="model"):
    """The constants the compiled package keeps, read from the wrapper source inside the .pt2
    archive (the package is not loaded): a list, by constant index, of dicts with name,
    original_fqn, dtype (torch's name: "float32"), shape, stride, data_size where the
    source states them; and the source's path in the archive. (None, None) when the archive
    has no such source."""
    with zipfile.ZipFile(package_path) as archive:
        prefix = f"/data/aotinductor/{model_name}/"
        sources = sorted(n for n in archive.namelist()
                         if n.endswith(".cpp") and prefix in "/" + n)
        for source in sources:
            text = archive.read(source).decode("utf-8", "replace")
            if "constants_info_[" not in text:
                continue
            constants = {}
            for line in text.splitlines():
                m = _CONSTANT_FIELD.search(line)
                if m:
                    fields = constants.setdefault(int(m.group(1)), {})
                    fields[m.group(2)] = _parse_constant_field(m.group(2), m.group(3))
            if constants:
                return [constants.get(i, {}) for i in range(max(constants) + 1)], source
            return [], source
    return None, None


def _same_strides(t, strides):
    """Whether `strides` are t's, on the dimensions of more than one element (the others'
    strides are never used)."""
    if len(strides) != t.dim():
        return False
    return all(a == b for size, a, b in zip(t.shape, t.stride(), strides) if size > 1)


def check_package(plan, constants):
    """Raises StreamingError unless the package's constants (package_constants) are exactly
    the plan's streamed weights: one constant per weight, under one of its names, with the
    weight's dtype, shape and strides."""
    weight_of = {}
    for i, w in enumerate(plan.weights):
        for n in w.names:
            weight_of[n] = i
    found = {}
    problems = []
    for c, info in enumerate(constants):
        fqn = info.get("original_fqn") or info.get("name") or f"#{c}"
        i = weight_of.get(fqn)
        if i is None:
            why = ("the helper expected inductor to write it as code (a tensor of at most 8 "
                   "elements)" if fqn in plan.inlined else
                   "the helper found no weight of that name (inductor may have made it, a "
                   "copy of a constant for another device say)")
            problems.append(f"the package keeps constant '{fqn}' (dtype {info.get('dtype')}, "
                            f"shape {info.get('shape')}), which is not streamed: {why}")
            continue
        if i in found:
            problems.append(f"weight {plan.weights[i].label} is two constants of the package, "
                            f"'{found[i]}' and '{fqn}'")
            continue
        found[i] = fqn
        t = plan.weights[i].tensor
        dtype = str(t.dtype).removeprefix("torch.")
        if info.get("dtype") is not None and info["dtype"] != dtype:
            problems.append(f"weight {plan.weights[i].label} is {dtype} but the package's "
                            f"constant '{fqn}' is {info['dtype']}")
        if info.get("shape") is not None and info["shape"] != list(t.shape):
            problems.append(f"weight {plan.weights[i].label} has shape {list(t.shape)} but "
                            f"the package's constant '{fqn}' has {info['shape']}")
        elif info.get("stride") is not None and not _same_strides(t, info["stride"]):
            problems.append(f"weight {plan.weights[i].label} has strides {list(t.stride())} "
                            f"but the package's constant '{fqn}' has {info['stride']}")
    for i, w in enumerate(plan.weights):
        if i not in found:
            problems.append(f"{w.kind} {w.label} (fetch index {i}) is not a constant of the "
                            "package: inductor made it code or dropped it")
    if problems:
        shown = "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more"
                                           if len(problems) > 6 else "")
        raise StreamingError(f"the compiled package's constants are not the streamed weights "
                             f"({len(constants)} constants, {len(plan.weights)} weights): "
                             f"{shown}. The runner would refuse this package; export it with "
                             "keep_small_tensors=True (--keep-small-tensors) or without "
                             "offload, and report the model")


def _dims(val, batch_dynamic):
    dims = [d if isinstance(d, int) else -1 for d in val.shape]
    return dims[1:] if batch_dynamic else dims


def _config(name, ep, batch_dynamic, max_batch, output_names):
    """The text of config.pbtxt for `ep` (inputs from its tensor user inputs, outputs from its
    user outputs)."""
    nodes = {n.name: n for n in ep.graph.nodes}
    output_node = next(n for n in ep.graph.nodes if n.op == "output")
    returned = {n.name: n for n in output_node.args[0] if isinstance(n, torch.fx.Node)}

    def vals(names, what):
        out = []
        for n in names:
            node = returned.get(n) if what == "output" else nodes.get(n)
            val = node.meta.get("val") if node is not None else None
            if not isinstance(val, torch.Tensor):
                raise StreamingError(f"{what} '{n}' is not a tensor: a config.pbtxt cannot "
                                     "declare it")
            if val.dtype not in _TRITON_TYPES:
                raise StreamingError(f"{what} '{n}' has dtype {val.dtype}, which Triton lacks")
            out.append(val)
        return out

    input_names = _tensor_user_inputs(ep)
    inputs = vals(input_names, "input")
    outputs = vals(_tensor_user_outputs(ep), "output")
    if not inputs:
        raise StreamingError("the model has no tensor input")
    if output_names is None:
        output_names = [f"output{i}" for i in range(len(outputs))]
    if len(output_names) != len(outputs):
        raise StreamingError(f"{len(output_names)} output names for {len(outputs)} outputs")
    if batch_dynamic:
        batch = str(inputs[0].shape[0])
        for n, val in zip(output_names, outputs):
            if val.dim() == 0 or str(val.shape[0]) != batch:
                raise StreamingError(f"output '{n}' does not have the batch as its first "
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
    lines.append("input [\n" + entries(input_names, inputs) + "\n]")
    lines.append("output [\n" + entries(output_names, outputs) + "\n]")
    return "\n".join(lines) + "\n"


def _dynamic_shapes(model, args, kwargs, batch):
    """torch.export's dynamic_shapes for a dynamic batch: dimension 0 of every tensor among
    the arguments, by the names of forward's parameters."""
    from torch.utils._pytree import tree_map

    def leaf(v):
        return {0: batch} if isinstance(v, torch.Tensor) else None

    signature = inspect.signature(model.forward)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as e:
        raise StreamingError(f"the example arguments do not fit {type(model).__name__}."
                             f"forward: {e}") from e
    shapes = {}
    for pname, value in bound.arguments.items():
        kind = signature.parameters[pname].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            shapes[pname] = {k: tree_map(leaf, v) for k, v in value.items()}
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            shapes[pname] = tuple(tree_map(leaf, v) for v in value)
        else:
            shapes[pname] = tree_map(leaf, value)
    return shapes


def export_model(model, example_inputs, out_dir, *, example_kwargs=None, name=None,
                 device="cuda", batch_dynamic=True, max_batch=4096, offload=True,
                 output_names=None, keep_small_tensors=False, on_plan=None):
    """Exports `model` on `example_inputs` (a tuple of positional arguments) and
    `example_kwargs` (a dict of keyword arguments; non-tensors among them are fixed), compiles
    it with AOTInductor for `device` and writes the model directory `out_dir` (see the
    module's description). `model` is moved to `device` and put in eval mode (nn.Module.to
    moves it in place); the tensors among the example arguments are moved there too. `name`
    defaults to the directory's name. With offload, checks the compiled package's constants
    against the streamed weights (the package is removed when they differ), and calls
    `on_plan` (if given) with the StreamPlan once the package is written. Returns `out_dir`,
    as an absolute path. Raises StreamingError naming what cannot be exported."""
    from torch.utils._pytree import tree_map

    out_dir = os.path.abspath(out_dir)
    name = name or os.path.basename(out_dir)
    model = model.to(device).eval()

    def to_device(v):
        return v.to(device) if isinstance(v, torch.Tensor) else v

    example_inputs = tuple(tree_map(to_device, t) for t in example_inputs)
    example_kwargs = {k: tree_map(to_device, v) for k, v in (example_kwargs or {}).items()}
    dynamic_shapes = None
    if batch_dynamic:
        batch = torch.export.Dim("batch", min=1, max=max_batch)
        dynamic_shapes = _dynamic_shapes(model, example_inputs, example_kwargs, batch)
    ep = torch.export.export(model, example_inputs, kwargs=example_kwargs or None,
                             dynamic_shapes=dynamic_shapes)
    config = _config(name, ep, batch_dynamic, max_batch, output_names)

    # A fresh metadata dict per package: some torch versions write into the one they get.
    metadata = {"torchloom.inputs": declared_inputs(ep)}
    inductor_configs = {}
    plan = None
    if offload:
        plan = stream_weights(ep, device=device, keep_small_tensors=keep_small_tensors)
        metadata["torchloom.stream_weights"] = plan.metadata()
        inductor_configs.update({
            "aot_inductor.package_constants_in_so": False,
            "aot_inductor.use_runtime_constant_folding": False,
            "allow_buffer_reuse": False,
            "inplace_buffers": False,
            "reorder_for_peak_memory": False,
            "always_keep_tensor_constants": bool(keep_small_tensors),
            "freezing": False,
            "joint_graph_constant_folding": False,
        })
        print(f"torchloom_export: {name}: {plan.summary()}", flush=True)
    inductor_configs["aot_inductor.metadata"] = metadata

    version_dir = os.path.join(out_dir, "1")
    os.makedirs(version_dir, exist_ok=True)
    package = os.path.join(version_dir, "model.pt2")
    weights_file = os.path.join(version_dir, "weights.pt")
    if os.path.exists(weights_file):
        os.remove(weights_file)  # a stale one would be read as this package's weights
    torch._inductor.aoti_compile_and_package(ep, package_path=package,
                                             inductor_configs=inductor_configs)
    if plan is not None:
        constants, source = package_constants(package)
        if constants is None:
            print(f"torchloom_export: {name}: the package carries no wrapper source: its "
                  "constants were not checked against the streamed weights", flush=True)
        else:
            try:
                check_package(plan, constants)
            except StreamingError:
                os.remove(package)
                raise
        # Dense tensors keep their strides (the package reads them with those).
        tensors = {f"w{i}": w.tensor.to("cpu", copy=True) for i, w in enumerate(plan.weights)}
        torch.jit.script(TensorBuffers(tensors)).save(weights_file)
        del tensors
        if on_plan is not None:
            on_plan(plan)
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
                        help="returns (model, example_inputs) or (model, example_inputs, "
                             "example_kwargs); MODULE: dotted name or .py file")
    parser.add_argument("out_dir", metavar="OUT_DIR")
    parser.add_argument("--name", help="the model's name (default: OUT_DIR's name)")
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--max-batch", type=int, default=4096,
                        help="the largest batch (default 4096)")
    parser.add_argument("--no-batch", action="store_true",
                        help="no dynamic batch dimension: the shapes are the examples'")
    parser.add_argument("--no-offload", action="store_true",
                        help="constants inside the package, no weights.pt")
    parser.add_argument("--keep-small-tensors", action="store_true",
                        help="keep tensors of at most 8 elements as streamed constants instead "
                             "of code")
    parser.add_argument("--output-names", help="comma-separated (default output0, ...)")
    args = parser.parse_args(argv)
    if tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 6):
        print(f"torchloom_export: torch {torch.__version__} is too old (needs 2.6)",
              file=sys.stderr)
        return 1
    sys.path.insert(0, os.getcwd())
    made = _load_function(args.spec)()
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        print(f"torchloom_export: {args.spec} must return (model, example_inputs) or (model, "
              "example_inputs, example_kwargs)", file=sys.stderr)
        return 2
    model, example_inputs = made[0], made[1]
    example_kwargs = made[2] if len(made) == 3 else None
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    try:
        out = export_model(model, tuple(example_inputs), args.out_dir,
                           example_kwargs=example_kwargs, name=args.name, device=args.device,
                           batch_dynamic=not args.no_batch, max_batch=args.max_batch,
                           offload=not args.no_offload,
                           output_names=args.output_names.split(",") if args.output_names
                           else None,
                           keep_small_tensors=args.keep_small_tensors)
    except StreamingError as e:
        print(f"torchloom_export: cannot export {args.spec}: {e}", file=sys.stderr)
        return 1
    print(f"torchloom_export: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
