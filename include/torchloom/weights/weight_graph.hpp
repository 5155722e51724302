#pragma once
//! The graph pass behind streamed_weights and mapped_weights for TorchScript: every read of a
//! weight in the forward graph becomes a call to the fetch operator, in execution order.
//!
//! A *weight* is a tensor the forward reads from a module attribute (a parameter or a buffer,
//! of the model or of a submodule) or from a tensor constant in its code. After the pass, the
//! forward graph is inlined and each top-level node that reads weights (itself or inside its
//! blocks: the branches of an `if`, the body of a loop) is preceded by one
//! `torchloom::fetch_weight(source, position)` call per weight it reads. The positions number
//! those calls in graph order: they are the schedule. A weight read by several nodes is
//! fetched once per node. Nothing reads the module's tensor attributes any more.
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/runtime/operator.h>
#include <torch/script.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchloom::detail {

//! What the fetch operator calls: the residency policy's provider of weights on the device.
class weight_source {
 public:
  //! The weight of schedule position `position`, on the device and ready for the kernels
  //! enqueued next on the current stream.
  virtual at::Tensor fetch(std::size_t position) = 0;

 protected:
  weight_source() = default;
  weight_source(const weight_source&) = default;
  weight_source& operator=(const weight_source&) = default;
  ~weight_source() = default;
};

inline constexpr const char* fetch_op_schema =
    "torchloom::fetch_weight(int source, int position) -> Tensor";

//! Registers `torchloom::fetch_weight` with TorchScript's operator registry, once per
//! process. `source` is the address of the weight_source that owns the rewritten graph.
inline void register_fetch_op() {
  static const bool registered = [] {
    torch::jit::registerOperator(torch::jit::Operator(
        fetch_op_schema,
        [](torch::jit::Stack& stack) {
          const auto position = static_cast<std::size_t>(stack.back().toInt());
          stack.pop_back();
          // NOLINTNEXTLINE(performance-no-int-to-ptr): the graph holds its owner's address
          auto* source = reinterpret_cast<weight_source*>(stack.back().toInt());
          stack.pop_back();
          stack.emplace_back(source->fetch(position));
        },
        c10::AliasAnalysisKind::FROM_SCHEMA));
    return true;
  }();
  (void)registered;
}

//! One weight the forward reads.
struct weight_read {
  at::Tensor tensor;
  std::string name;  //!< its attribute path ("layers.0.weight") or "tensor constant N"
  //! The module attributes that hold it (empty for a constant), to repoint after packing.
  std::vector<std::pair<c10::intrusive_ptr<c10::ivalue::Object>, std::string>> owners;
};

//! What the pass found and did.
struct weight_rewrite {
  std::vector<weight_read> weights;          //!< distinct weights, in the order first seen
  std::vector<std::size_t> position_weight;  //!< per position: index into `weights`
  //! Per position: the first position whose fetch comes after every node that uses the
  //! fetched tensor or anything that may alias it; position_weight.size() for the run's end.
  std::vector<std::size_t> release;
};

namespace weight_graph {

using torch::jit::Block;
using torch::jit::Node;
using torch::jit::Value;

// Calls f(node) for `n` and every node in its blocks, blocks' return nodes included.
template <class F>
void for_each_in_subtree(Node* n, F&& f) {
  f(n);
  for (Block* b : n->blocks()) {
    for (Node* m : b->nodes()) for_each_in_subtree(m, f);
    f(b->return_node());
  }
}

// Whether `m`'s result may alias an input although its schema does not declare it: custom
// operators (outside aten and prim), and the aten ops known to return an input or a view of
// it unannotated.
inline bool may_alias_undeclared(const Node* m) {
  const c10::Symbol kind = m->kind();
  if (!kind.is_aten() && !kind.is_prim()) return true;
  static const std::array<c10::Symbol, 6> known{
      c10::Symbol::fromQualString("aten::type_as"),
      c10::Symbol::fromQualString("aten::atleast_1d"),
      c10::Symbol::fromQualString("aten::atleast_2d"),
      c10::Symbol::fromQualString("aten::atleast_3d"),
      c10::Symbol::fromQualString("aten::broadcast_tensors"),
      c10::Symbol::fromQualString("aten::meshgrid")};
  return std::find(known.begin(), known.end(), kind) != known.end();
}

// Whether `v` (a list, dict or tuple) holds a tensor, at any depth.
inline bool holds_tensor(const c10::IValue& v) {
  if (v.isTensor()) return true;
  if (v.isList()) {
    for (const auto& e : v.toListRef()) {
      if (holds_tensor(e)) return true;
    }
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) {
      if (holds_tensor(e)) return true;
    }
  } else if (v.isGenericDict()) {
    for (const auto& kv : v.toGenericDict()) {
      if (holds_tensor(kv.value())) return true;
    }
  }
  return false;
}

inline std::string join_path(const std::string& parent, const std::string& name) {
  return parent.empty() ? name : concat(parent, '.', name);
}

// The weights of `g` (inlined, input 0 is `module`): each value that yields one, by index.
struct found_weights {
  std::vector<weight_read> weights;
  std::unordered_map<const Value*, std::size_t> of_value;
};

inline found_weights find_weights(torch::jit::Graph& g, const torch::jit::Module& module,
                                  const std::string& model) {
  using object_ptr = c10::intrusive_ptr<c10::ivalue::Object>;
  found_weights found;
  std::unordered_map<const Value*, std::pair<object_ptr, std::string>> objects;
  std::unordered_map<const c10::TensorImpl*, std::size_t> index_of;
  std::size_t constants = 0;
  const auto add = [&](const Value* v, const at::Tensor& t, const std::string& name) {
    auto [it, added] = index_of.emplace(t.unsafeGetTensorImpl(), found.weights.size());
    if (added) found.weights.push_back(weight_read{t, name, {}});
    found.of_value[v] = it->second;
    return it->second;
  };
  objects[g.inputs().at(0)] = {module._ivalue(), ""};
  const auto visit = [&](Node* n) {
    const auto kind = n->kind();
    if (kind == c10::prim::GetAttr) {
      const auto it = objects.find(n->input());
      if (it == objects.end()) return;
      const auto& [object, path] = it->second;
      const std::string name = n->s(c10::attr::name);
      const auto slot = object->type()->findAttributeSlot(name);
      if (!slot) return;
      const c10::IValue& v = object->getSlot(*slot);
      if (v.isObject()) {
        objects[n->output()] = {v.toObject(), join_path(path, name)};
      } else if ((v.isList() || v.isGenericDict() || v.isTuple()) && holds_tensor(v)) {
        throw error(errc::unsupported, model,
                    concat("forward reads '", join_path(path, name),
                           "', a container of tensors: only tensor attributes and tensor "
                           "constants can be moved off the device"));
      } else if (v.isTensor() && v.toTensor().defined()) {
        const auto i = add(n->output(), v.toTensor(), join_path(path, name));
        auto& owners = found.weights[i].owners;
        bool known = false;
        for (const auto& [o, attr] : owners) known = known || (o == object && attr == name);
        if (!known) owners.emplace_back(object, name);
      }
    } else if (kind == c10::prim::SetAttr) {
      const auto it = objects.find(n->inputs().at(0));
      if (it == objects.end()) return;
      const std::string name = n->s(c10::attr::name);
      const auto slot = it->second.first->type()->findAttributeSlot(name);
      if (slot && it->second.first->getSlot(*slot).isTensor()) {
        throw error(errc::unsupported, model,
                    concat("forward assigns the tensor attribute '",
                           join_path(it->second.second, name),
                           "': weights that change while the model runs cannot be moved "
                           "off the device"));
      }
    } else if (kind == c10::prim::Constant) {
      if (n->output()->type()->kind() != c10::TypeKind::TensorType) return;
      const auto v = torch::jit::toIValue(n->output());
      if (v && v->isTensor() && v->toTensor().defined()) {
        add(n->output(), v->toTensor(), concat("tensor constant ", constants++));
      }
    } else if (kind == c10::prim::fork) {
      throw error(errc::unsupported, model,
                  "forward forks a task (torch.jit.fork): the weight reads of a forked "
                  "subgraph cannot be scheduled");
    } else if (kind == c10::prim::CallMethod || kind == c10::prim::CallFunction) {
      for (const Value* in : n->inputs()) {
        const auto it = objects.find(in);
        if (it == objects.end()) continue;
        throw error(errc::unsupported, model,
                    concat("forward calls into '",
                           it->second.second.empty() ? "self" : it->second.second,
                           "' through a call that cannot be inlined (an interface): its "
                           "weight reads cannot be scheduled"));
      }
    }
  };
  for (Node* n : g.nodes()) for_each_in_subtree(n, visit);
  return found;
}

}  // namespace weight_graph

//! Rewrites `module`'s forward in place (before it first runs) so that every weight read is a
//! fetch from `source`. Throws unsupported (naming the weight or attribute) for a forward
//! that assigns a tensor attribute, writes into a weight, returns a weight (or a view of
//! one), or calls a submodule through an interface.
inline weight_rewrite rewrite_weight_reads(torch::jit::Module& module,
                                           const weight_source& source,
                                           const std::string& model) {
  using namespace weight_graph;
  register_fetch_op();
  const std::shared_ptr<torch::jit::Graph> g =
      torch::jit::toGraphFunction(module.get_method("forward").function()).graph();
  torch::jit::Inline(*g);
  // Dead reads first, so that every fetch inserted below runs.
  torch::jit::EliminateDeadCode(g);
  found_weights found = find_weights(*g, module, model);

  for (const Value* out : g->outputs()) {
    if (const auto it = found.of_value.find(out); it != found.of_value.end()) {
      throw error(errc::unsupported, model,
                  concat("forward returns the weight '", found.weights[it->second].name,
                         "' itself: a streamed or mapped weight cannot be an output"));
    }
  }

  weight_rewrite out;
  std::vector<Node*> fetches;
  const auto source_id = static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(&source));
  const auto fetch_symbol = c10::Symbol::fromQualString("torchloom::fetch_weight");
  const std::vector<Node*> top(g->nodes().begin(), g->nodes().end());
  for (Node* n : top) {
    std::vector<std::pair<Node*, std::size_t>> uses;
    for_each_in_subtree(n, [&](Node* m) {
      for (std::size_t i = 0; i < m->inputs().size(); ++i) {
        if (found.of_value.count(m->input(i)) != 0) uses.emplace_back(m, i);
      }
    });
    if (uses.empty()) continue;
    torch::jit::WithInsertPoint insert(n);
    std::vector<std::pair<std::size_t, Value*>> fetched;  // weight -> fetch output, for n
    for (const auto& [m, i] : uses) {
      const std::size_t w = found.of_value.at(m->input(i));
      Value* f = nullptr;
      for (const auto& [fw, fv] : fetched) f = fw == w ? fv : f;
      if (f == nullptr) {
        Value* src = g->insertConstant(source_id);
        Value* pos = g->insertConstant(static_cast<std::int64_t>(out.position_weight.size()));
        Node* fetch = g->insertNode(g->create(fetch_symbol, {src, pos}, 1));
        fetch->output()->setType(c10::TensorType::get());
        f = fetch->output();
        fetched.emplace_back(w, f);
        fetches.push_back(fetch);
        out.position_weight.push_back(w);
      }
      m->replaceInput(i, f);
    }
  }
  {
    // Before the reads that are now unused go: a write into a fetched tensor would be dead
    // code to the pass below, and would silently stop changing the weight.
    const torch::jit::AliasDb writes(g);
    for (std::size_t p = 0; p < fetches.size(); ++p) {
      if (writes.hasWriters(fetches[p]->output())) {
        throw error(errc::unsupported, model,
                    concat("forward writes into the weight '",
                           found.weights[out.position_weight[p]].name,
                           "': weights that change while the model runs cannot be moved off "
                           "the device"));
      }
    }
  }
  torch::jit::EliminateDeadCode(g);  // the attribute reads and constants replaced above
  // Every fetch is still there (their users were live before the rewrite and write nothing).
  std::size_t kept = 0;
  for (const Node* n : g->nodes()) kept += n->kind() == fetch_symbol ? 1 : 0;
  if (kept != fetches.size()) {
    throw error(errc::unsupported, model,
                concat("the forward graph kept ", kept, " of its ", fetches.size(),
                       " weight fetches after dead-code elimination; its reads cannot be "
                       "scheduled"));
  }

  // Release points, from alias analysis: a fetched tensor is in use until the last node that
  // uses it or anything that may alias or contain it (a transposed view, a list). Some ops
  // return an input (or a view of it) without their schema saying so: for them, and for
  // custom operators, every output counts as an alias of their inputs.
  torch::jit::AliasDb aliases(g);
  const std::vector<Node*> order(g->nodes().begin(), g->nodes().end());
  std::unordered_map<const Node*, std::size_t> index;
  std::vector<std::vector<Value*>> used(order.size());
  std::vector<std::vector<Node*>> undeclared(order.size());
  for (std::size_t j = 0; j < order.size(); ++j) {
    index[order[j]] = j;
    for_each_in_subtree(order[j], [&](Node* m) {
      for (Value* v : m->inputs()) used[j].push_back(v);
      if (m->kind() != fetch_symbol && may_alias_undeclared(m)) undeclared[j].push_back(m);
    });
  }
  std::vector<std::size_t> fetch_index;
  for (const Node* f : fetches) fetch_index.push_back(index.at(f));
  const std::size_t positions = fetches.size();
  out.release.resize(positions);
  for (std::size_t p = 0; p < positions; ++p) {
    std::vector<Value*> aliased{fetches[p]->output()};
    const std::string& name = found.weights[out.position_weight[p]].name;
    std::size_t last = fetch_index[p];
    for (std::size_t j = last + 1; j < order.size(); ++j) {
      if (used[j].empty() || !aliases.mayContainAlias(used[j], aliased)) continue;
      last = j;
      for (Node* m : undeclared[j]) {
        if (!aliases.mayContainAlias(m->inputs(), aliased)) continue;
        for (Value* o : m->outputs()) aliased.push_back(o);
        for (Value* o : order[j]->outputs()) aliased.push_back(o);  // out of its blocks
      }
    }
    if (aliases.mayContainAlias(g->outputs(), aliased)) {
      throw error(errc::unsupported, model,
                  concat("forward's output may alias the weight '", name,
                         "': a streamed or mapped weight cannot be an output"));
    }
    std::size_t r = p + 1;
    while (r < positions && fetch_index[r] <= last) ++r;
    out.release[p] = r;
  }
  out.weights = std::move(found.weights);
  return out;
}

}  // namespace torchloom::detail
