#pragma once
// An AOTInductor package's call spec as names: the serialised pytrees of its inputs and
// outputs (torch.utils._pytree's JSON) flattened into Triton 26.05's forward-based names, and
// the inputs aligned with the compiled model's own. Plain string and JSON parsing, no AOTI
// headers, so it builds (and is tested) with every LibTorch.
#include <torchloom/detail/json.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/io_names.hpp>

#include <cctype>
#include <cstddef>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace torchloom::detail {

//! A call spec that cannot be named: a sentence saying why.
struct call_spec_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

//! One leaf of a flattened call spec.
struct call_spec_leaf {
  std::string name;               //!< forward-based: "ARGS[2][keyA]", "RESULT[logits]"
  std::vector<std::string> keys;  //!< the keys below the argument (ARGS) or from the name on
  bool keyword = false;           //!< under KWARGS
};

//! The keys of a dict-like node: its context, a JSON list (or a JSON text of one) of strings
//! or numbers.
inline std::vector<std::string> call_spec_keys(const json_value& context, std::string_view type) {
  json_value list;
  if (context.is_string()) {
    try {
      list = parse_json(context.text);
    } catch (const json_error& e) {
      throw call_spec_error(concat("the context of a '", type, "' node is not JSON: ", e.what()));
    }
  } else {
    list = context;
  }
  if (!list.is_array()) {
    throw call_spec_error(concat("the context of a '", type, "' node is not a list of keys"));
  }
  std::vector<std::string> keys;
  for (const auto& k : list.items) {
    if (k.type != json_value::kind::string && k.type != json_value::kind::number) {
      throw call_spec_error(
          concat("a '", type, "' node has a key that is neither a string nor a number"));
    }
    keys.push_back(k.text);
  }
  return keys;
}

//! Flattens the treespec `node`, naming each leaf `name` followed by `[key]` or `[i]` per
//! level: dicts (builtins.dict, collections.OrderedDict, torch.fx's immutable_dict, and a
//! Hugging Face ModelOutput, `transformers.*`, whose context lists its keys), in the
//! context's order (insertion order, not sorted), and tuples and lists (builtins.tuple,
//! builtins.list, torch.fx's immutable_list), in order; a leaf is a node whose type is null,
//! and None (builtins.NoneType) has no leaves. Throws call_spec_error naming a node type
//! outside these.
inline void flatten_call_spec(const json_value& node, const std::string& name,
                              std::vector<std::string> keys, bool keyword,
                              std::vector<call_spec_leaf>& out, int depth = 0) {
  if (depth > 64) throw call_spec_error("the call spec nests deeper than 64 levels");
  if (!node.is_object()) throw call_spec_error("a node of the call spec is not an object");
  const json_value* type = node.find("type");
  if (type == nullptr || type->is_null()) {
    out.push_back({name, std::move(keys), keyword});
    return;
  }
  if (!type->is_string()) throw call_spec_error("a node's type is neither null nor a name");
  const std::string& t = type->text;
  if (t == "builtins.NoneType") return;  // None: a node without leaves (`past=None`)
  const json_value* children = node.find("children_spec");
  if (children == nullptr || !children->is_array()) {
    throw call_spec_error(concat("a '", t, "' node has no children_spec list"));
  }
  const bool sequence = t == "builtins.tuple" || t == "builtins.list" ||
                        t == "torch.fx.immutable_collections.immutable_list";
  const bool mapping = t == "builtins.dict" || t == "collections.OrderedDict" ||
                       t == "torch.fx.immutable_collections.immutable_dict" ||
                       t.rfind("transformers.", 0) == 0;
  if (!sequence && !mapping) {
    throw call_spec_error(concat("it holds a '", t,
                                 "' node, which forward-based names do not cover (dict, "
                                 "tuple, list and Tensor only)"));
  }
  std::vector<std::string> child_keys;
  if (mapping) {
    const json_value* context = node.find("context");
    child_keys = call_spec_keys(context ? *context : json_value{}, t);
    if (child_keys.size() != children->items.size()) {
      throw call_spec_error(concat("a '", t, "' node has ", child_keys.size(), " keys but ",
                                   children->items.size(), " children"));
    }
  } else {
    for (std::size_t i = 0; i < children->items.size(); ++i) {
      child_keys.push_back(std::to_string(i));
    }
  }
  for (std::size_t i = 0; i < children->items.size(); ++i) {
    std::vector<std::string> k = keys;
    k.push_back(child_keys[i]);
    flatten_call_spec(children->items[i], concat(name, "[", child_keys[i], "]"), std::move(k),
                      keyword, out, depth + 1);
  }
}

//! The tree of a serialised treespec: `[version, tree]`.
inline json_value call_spec_tree(std::string_view text, std::string_view what) {
  json_value root;
  try {
    root = parse_json(text);
  } catch (const json_error& e) {
    throw call_spec_error(concat("its ", what, " spec is not JSON: ", e.what()));
  }
  if (!root.is_array() || root.items.size() != 2 || !root.items[1].is_object()) {
    throw call_spec_error(concat("its ", what, " spec is not a [version, tree] pair"));
  }
  return std::move(root.items[1]);
}

//! The call spec's input leaves: `ARGS[i]...` for the positional arguments, then
//! `KWARGS[name]...` for the keyword arguments, in the order torch flattens them.
inline std::vector<call_spec_leaf> call_spec_inputs(std::string_view in_spec) {
  const json_value tree = call_spec_tree(in_spec, "input");
  const json_value* type = tree.find("type");
  const json_value* children = tree.find("children_spec");
  if (type == nullptr || !type->is_string() || type->text != "builtins.tuple" ||
      children == nullptr || children->items.size() != 2) {
    throw call_spec_error("its input spec is not an (args, kwargs) pair");
  }
  const json_value& args = children->items[0];
  const json_value& kwargs = children->items[1];
  const json_value* args_type = args.find("type");
  const json_value* kwargs_type = kwargs.find("type");
  if (args_type == nullptr || !args_type->is_string() || args_type->text != "builtins.tuple" ||
      kwargs_type == nullptr || !kwargs_type->is_string() ||
      kwargs_type->text != "builtins.dict") {
    throw call_spec_error("its input spec is not a (tuple, dict) pair");
  }
  std::vector<call_spec_leaf> leaves;
  const json_value* arg_children = args.find("children_spec");
  for (std::size_t i = 0; arg_children && i < arg_children->items.size(); ++i) {
    flatten_call_spec(arg_children->items[i], concat("ARGS[", i, "]"), {}, false, leaves);
  }
  // The keyword arguments: a dict whose keys are the names.
  std::vector<call_spec_leaf> keyword;
  flatten_call_spec(kwargs, "KWARGS", {}, true, keyword);
  leaves.insert(leaves.end(), keyword.begin(), keyword.end());
  return leaves;
}

//! The call spec's output leaves: `RESULT` for one tensor, else `RESULT[...]` per leaf.
inline std::vector<std::string> call_spec_outputs(std::string_view out_spec) {
  std::vector<call_spec_leaf> leaves;
  flatten_call_spec(call_spec_tree(out_spec, "output"), "RESULT", {}, false, leaves);
  std::vector<std::string> names;
  for (auto& l : leaves) names.push_back(std::move(l.name));
  return names;
}

//! The name torch.export gives the graph input of a leaf: the path's keys, lower case, each
//! character outside [a-zA-Z0-9] made '_', joined by '_'. For a positional argument the
//! argument's own name (which the call spec does not hold) comes first: this is what follows
//! it, with its '_' ("" for the argument itself).
inline std::string placeholder_tail(const call_spec_leaf& leaf) {
  std::string out;
  for (const auto& key : leaf.keys) {
    if (!out.empty() || !leaf.keyword) out += '_';
    for (const char c : key) {
      const auto u = static_cast<unsigned char>(c);
      out += std::isalnum(u) ? static_cast<char>(std::tolower(u)) : '_';
    }
  }
  return out;
}

//! Whether the graph input called `input` can be the leaf: its name is the leaf's (for a
//! positional argument, ends with the leaf's tail after a non-empty argument name), possibly
//! with the `_<n>` torch adds to a name already taken.
inline bool placeholder_matches(const call_spec_leaf& leaf, std::string_view input) {
  const std::string tail = placeholder_tail(leaf);
  const auto fits = [&](std::string_view n) {
    if (leaf.keyword) return n == tail;
    return n.size() > tail.size() && n.substr(n.size() - tail.size()) == tail;
  };
  if (fits(input)) return true;
  const auto underscore = input.rfind('_');
  if (underscore == std::string_view::npos || underscore + 1 == input.size()) return false;
  for (const char c : input.substr(underscore + 1)) {
    if (c < '0' || c > '9') return false;
  }
  return fits(input.substr(0, underscore));
}

//! Names an AOTInductor package's inputs and outputs from its call spec (`call_spec`: the
//! input and output treespecs torch's loader returns). `inputs`: the compiled model's input
//! names, in order (nullopt where they cannot be read); `output_count`: how many outputs it
//! returns, if known. The call spec's leaves are the flattened inputs, but values that are
//! not tensors (`use_cache=False`) are fixed at export and are not inputs of the package:
//! when there are fewer inputs than leaves, the leaves are matched to the inputs' names
//! (which torch.export derives from the argument names and keys) in order, and the match
//! must be the only one possible; otherwise the inputs get no forward-based names and
//! `inputs_unknown` says why. Likewise for outputs whose count differs. Never throws.
inline io_names name_call_spec(const std::vector<std::string>& call_spec,
                               const std::optional<std::vector<std::string>>& inputs,
                               std::optional<std::size_t> output_count) {
  io_names names;
  names.forward_based = true;
  names.output_count = output_count;
  if (call_spec.size() != 2) {
    names.inputs_unknown = names.outputs_unknown =
        concat("the package's call spec has ", call_spec.size(), " parts, not 2");
    return names;
  }
  try {
    names.outputs = call_spec_outputs(call_spec[1]);
    if (output_count && names.outputs.size() != *output_count) {
      names.outputs_unknown =
          concat("the call spec's output has ", names.outputs.size(),
                 " leaves but the package returns ", *output_count, " outputs");
      names.outputs.clear();
    } else if (!output_count) {
      names.output_count = names.outputs.size();
    }
  } catch (const std::exception& e) {
    names.outputs_unknown = concat("its call spec cannot be read: ", e.what());
  }
  std::vector<call_spec_leaf> leaves;
  try {
    leaves = call_spec_inputs(call_spec[0]);
  } catch (const std::exception& e) {
    names.inputs_unknown = concat("its call spec cannot be read: ", e.what());
    return names;
  }
  const auto leaf_names = [&] {
    std::vector<std::string> n;
    for (const auto& l : leaves) n.push_back(l.name);
    return n;
  };
  if (!inputs || inputs->size() == leaves.size()) {
    names.inputs = leaf_names();
    return names;
  }
  const std::vector<std::string>& graph = *inputs;
  const std::string counts =
      concat("the call spec has ", leaves.size(), " input leaves (",
             quoted_list(leaf_names(), " and "), ") but the package takes ", graph.size(),
             " inputs (", quoted_list(graph, " and "), ")");
  if (graph.size() > leaves.size()) {
    names.inputs_unknown = counts;
    return names;
  }
  // Kept for a config.pbtxt that says which leaves are the inputs (io_names::resolve_inputs)
  // where the names below cannot.
  names.leaves = leaf_names();
  // Each graph input's earliest and latest possible leaf: the match is the only one when
  // they agree for every input.
  std::vector<std::size_t> first(graph.size());
  std::vector<std::size_t> last(graph.size());
  std::size_t at = 0;
  for (std::size_t j = 0; j < graph.size(); ++j, ++at) {
    while (at < leaves.size() && !placeholder_matches(leaves[at], graph[j])) ++at;
    if (at == leaves.size()) {
      names.inputs_unknown = concat(counts, ", and no leaf matches input '", graph[j], "'");
      return names;
    }
    first[j] = at;
  }
  std::size_t end = leaves.size();
  for (std::size_t j = graph.size(); j-- > 0;) {
    do {
      --end;
    } while (!placeholder_matches(leaves[end], graph[j]));
    last[j] = end;
  }
  for (std::size_t j = 0; j < graph.size(); ++j) {
    if (first[j] != last[j]) {
      std::vector<std::string> could;
      for (std::size_t i = first[j]; i <= last[j]; ++i) {
        if (placeholder_matches(leaves[i], graph[j])) could.push_back(leaves[i].name);
      }
      names.inputs_unknown =
          concat(counts, ": torch leaves values that are not tensors out of the compiled "
                         "package, and whether input '",
                 graph[j], "' is ", quoted_list(could, " or "),
                 " cannot be told from the names (pass such values as keyword arguments "
                 "when exporting)");
      return names;
    }
  }
  names.inputs.assign(graph.size(), {});
  std::vector<bool> taken(leaves.size(), false);
  for (std::size_t j = 0; j < graph.size(); ++j) {
    names.inputs[j] = leaves[first[j]].name;
    taken[first[j]] = true;
  }
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    if (!taken[i]) names.fixed_inputs.push_back(leaves[i].name);
  }
  return names;
}

}  // namespace torchloom::detail
