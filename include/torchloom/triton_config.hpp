#pragma once
#include <torchloom/detail/pbtxt.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace torchloom {

//! An input or output as a Triton config declares it.
struct tensor_decl {
  std::string name;
  std::optional<c10::ScalarType> dtype;  //!< unset for TYPE_STRING and unknown types
  std::vector<std::int64_t> dims;        //!< -1 for a variable dimension; no batch dimension
};

//! One `instance_group` entry.
struct instance_group {
  std::string kind = "KIND_AUTO";  //!< KIND_GPU, KIND_CPU, KIND_MODEL or KIND_AUTO
  std::int64_t count = 1;
  std::vector<std::int64_t> gpus;
};

//! What torchloom reads from a Triton `config.pbtxt`. Other fields (dynamic batching,
//! ensembles, ...) are accepted and ignored; the syntax of the whole file is checked.
struct triton_config {
  std::string name;
  std::string platform;
  std::string backend;
  std::int64_t max_batch_size = 0;  //!< > 0: every input has an implicit batch dimension
  std::string default_model_filename;
  std::vector<instance_group> instance_groups;
  std::vector<tensor_decl> inputs;
  std::vector<tensor_decl> outputs;
  std::map<std::string, std::string> parameters;  //!< the `parameters` block, as text
};

namespace detail {

inline std::optional<c10::ScalarType> triton_dtype(std::string_view t) {
  static const std::map<std::string_view, c10::ScalarType> table = {
      {"TYPE_BOOL", c10::ScalarType::Bool},   {"TYPE_UINT8", c10::ScalarType::Byte},
      {"TYPE_INT8", c10::ScalarType::Char},   {"TYPE_INT16", c10::ScalarType::Short},
      {"TYPE_INT32", c10::ScalarType::Int},   {"TYPE_INT64", c10::ScalarType::Long},
      {"TYPE_FP16", c10::ScalarType::Half},   {"TYPE_FP32", c10::ScalarType::Float},
      {"TYPE_FP64", c10::ScalarType::Double}, {"TYPE_BF16", c10::ScalarType::BFloat16},
  };
  auto it = table.find(t);
  if (it == table.end()) return std::nullopt;
  return it->second;
}

inline std::int64_t pb_int(const pb_field& f, const std::filesystem::path& source) {
  try {
    std::size_t used = 0;
    std::int64_t v = std::stoll(f.scalar, &used);
    if (used == f.scalar.size()) return v;
  } catch (const std::exception&) {
  }
  throw error(errc::invalid_option, {},
              concat(source.string(), ":", f.line, ": '", f.name, "' must be an integer, not '",
                     f.scalar, "'"));
}

inline std::vector<tensor_decl> tensor_decls(const pb_field& root, std::string_view which,
                                             const std::filesystem::path& source) {
  std::vector<tensor_decl> out;
  for (const pb_field* io : root.all(which)) {
    tensor_decl d;
    if (const auto* n = io->find("name")) d.name = n->scalar;
    if (const auto* t = io->find("data_type")) {
      d.dtype = triton_dtype(t->scalar);
      if (!d.dtype && t->scalar != "TYPE_STRING") {
        throw error(errc::invalid_option, {},
                    concat(source.string(), ":", t->line, ": unknown data_type '", t->scalar,
                           "' for ", which, " '", d.name, "'"));
      }
    }
    for (const pb_field* dim : io->all("dims")) d.dims.push_back(pb_int(*dim, source));
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace detail

//! Parses the text of a config.pbtxt. `source` names the file in errors.
//! Throws torchloom::error (invalid_option) with the file, line and what is wrong.
inline triton_config parse_triton_config(std::string_view text,
                                         const std::filesystem::path& source = "config.pbtxt") {
  detail::pb_field root;
  try {
    root = detail::pb_parser(text).parse();
  } catch (const detail::pb_syntax_error& e) {
    throw error(errc::invalid_option, {},
                detail::concat(source.string(), ":", e.line, ": ", e.what));
  }
  triton_config c;
  auto text_of = [&](std::string_view n) {
    const auto* f = root.find(n);
    return f ? f->scalar : std::string();
  };
  c.name = text_of("name");
  c.platform = text_of("platform");
  c.backend = text_of("backend");
  c.default_model_filename = text_of("default_model_filename");
  if (const auto* f = root.find("max_batch_size")) c.max_batch_size = detail::pb_int(*f, source);
  for (const auto* g : root.all("instance_group")) {
    instance_group ig;
    if (const auto* k = g->find("kind")) ig.kind = k->scalar;
    if (const auto* n = g->find("count")) ig.count = detail::pb_int(*n, source);
    for (const auto* gpu : g->all("gpus")) ig.gpus.push_back(detail::pb_int(*gpu, source));
    c.instance_groups.push_back(std::move(ig));
  }
  c.inputs = detail::tensor_decls(root, "input", source);
  c.outputs = detail::tensor_decls(root, "output", source);
  // Triton writes a map entry as `parameters { key: "K" value { string_value: "V" } }`.
  for (const auto* p : root.all("parameters")) {
    const auto* key = p->find("key");
    const auto* value = p->find("value");
    const auto* str = value ? value->find("string_value") : nullptr;
    if (!key || !str) {
      throw error(errc::invalid_option, {},
                  detail::concat(source.string(), ":", p->line,
                                 ": a parameters entry needs key and value { string_value }"));
    }
    c.parameters[key->scalar] = str->scalar;
  }
  return c;
}

//! Reads and parses a config.pbtxt file; throws model_not_found if it cannot be read.
inline triton_config read_triton_config(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) {
    throw error(errc::model_not_found, {},
                detail::concat("cannot read '", file.string(), "'"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return parse_triton_config(text.str(), file);
}

}  // namespace torchloom
