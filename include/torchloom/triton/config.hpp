#pragma once
#include <torchloom/triton/config_schema.hpp>
#include <torchloom/triton/pbtxt.hpp>
#include <torchloom/triton/triton_config.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace torchloom {
namespace detail {

//! The torch dtype of a Triton data type (a name or its enum number). Throws: unsupported
//! for Triton types PyTorch has no tensor type for (TYPE_UINT16/32/64), invalid_option for
//! TYPE_INVALID. TYPE_STRING gives nothing (a list of strings).
inline std::optional<c10::ScalarType> triton_dtype(const pb_field& f, const std::string& source,
                                                   std::string_view what) {
  static const std::map<std::string_view, c10::ScalarType> table = {
      {"TYPE_BOOL", c10::ScalarType::Bool},   {"TYPE_UINT8", c10::ScalarType::Byte},
      {"TYPE_INT8", c10::ScalarType::Char},   {"TYPE_INT16", c10::ScalarType::Short},
      {"TYPE_INT32", c10::ScalarType::Int},   {"TYPE_INT64", c10::ScalarType::Long},
      {"TYPE_FP16", c10::ScalarType::Half},   {"TYPE_FP32", c10::ScalarType::Float},
      {"TYPE_FP64", c10::ScalarType::Double}, {"TYPE_BF16", c10::ScalarType::BFloat16},
  };
  const std::string t = pb_enum_name("DataType", f.scalar);
  if (auto it = table.find(t); it != table.end()) return it->second;
  if (t == "TYPE_STRING") return std::nullopt;
  if (t == "TYPE_UINT16" || t == "TYPE_UINT32" || t == "TYPE_UINT64") {
    throw error(errc::unsupported, {},
                concat(config_at(source, f.line), ": ", what, ": data_type ", t,
                       " is a valid Triton type, but PyTorch has no tensor type for it (its "
                       "unsigned types stop at TYPE_UINT8)"));
  }
  throw error(errc::invalid_option, {},
              concat(config_at(source, f.line), ": ", what, ": data_type ", t, " is not a type"));
}

inline std::int64_t pb_int(const pb_field& f, const std::string& source) {
  if (auto v = pb_parse_int(f.scalar, false); v && !f.quoted && !f.is_message) return *v;
  throw error(errc::invalid_option, {},
              concat(config_at(source, f.line), ": '", f.name, "' must be an integer, not '",
                     printable(f.scalar, 64), "'"));
}

//! dims: -1 (variable) or at least 1; the product of the fixed ones (with the batch) fits in
//! int64.
inline std::vector<std::int64_t> pb_dims(const pb_field& parent, std::string_view field,
                                         const std::string& source, std::string_view what,
                                         std::int64_t batch) {
  std::vector<std::int64_t> dims;
  std::int64_t product = batch > 0 ? batch : 1;
  for (const pb_field* dim : parent.all(field)) {
    const std::int64_t d = pb_int(*dim, source);
    if (d < 1 && d != -1) {
      throw error(errc::invalid_option, {},
                  concat(config_at(source, dim->line), ": ", what, ": dimension ", d,
                         " is not valid: a dimension is at least 1, or -1 for a variable size"));
    }
    if (d > 0) {
      if (product > std::numeric_limits<std::int64_t>::max() / d) {
        throw error(errc::invalid_option, {},
                    concat(config_at(source, dim->line), ": ", what,
                           ": the dimensions' product overflows 64 bits"));
      }
      product *= d;
    }
    dims.push_back(d);
  }
  return dims;
}

inline std::vector<tensor_decl> tensor_decls(const pb_field& root, std::string_view which,
                                             const std::string& source, std::int64_t batch) {
  std::vector<tensor_decl> out;
  for (const pb_field* io : root.all(which)) {
    tensor_decl d;
    if (const auto* n = io->find("name")) d.name = n->scalar;
    const std::string what = concat(which, " '", d.name, "'");
    if (const auto* t = io->find("data_type")) {
      d.dtype = triton_dtype(*t, source, what);
      d.is_string = !d.dtype;
    }
    d.dims = pb_dims(*io, "dims", source, what, batch);
    out.push_back(std::move(d));
  }
  return out;
}

//! Whether `platform` is one of Triton's PyTorch platforms: `pytorch_libtorch` (alias
//! `libtorch`, TorchScript) or `torch_aoti` (AOTInductor packages).
inline bool is_pytorch_platform(std::string_view platform) {
  return platform == "pytorch_libtorch" || platform == "libtorch" || platform == "torch_aoti";
}

//! The backend a config is written for, when it is not PyTorch's: Triton's platform names and
//! backend names. Empty for PyTorch (platform `pytorch_libtorch`, `libtorch` or `torch_aoti`,
//! backend `pytorch` or `torchloom`) and for a config that names neither.
inline std::string foreign_backend(const pb_field& root, std::size_t& line) {
  static const std::map<std::string_view, std::string_view> platforms = {
      {"tensorrt_plan", "tensorrt"},         {"tensorflow_graphdef", "tensorflow"},
      {"tensorflow_savedmodel", "tensorflow"}, {"onnxruntime_onnx", "onnxruntime"},
      {"caffe2_netdef", "caffe2"},           {"ensemble", "ensemble"}};
  if (const auto* p = root.find("platform");
      p && !p->is_message && !is_pytorch_platform(p->scalar)) {
    line = p->line;
    auto it = platforms.find(p->scalar);
    return concat(it != platforms.end() ? std::string(it->second) : printable(p->scalar, 64),
                  " (platform '", printable(p->scalar, 64), "')");
  }
  if (const auto* b = root.find("backend");
      b && !b->is_message && b->scalar != "pytorch" && b->scalar != "torchloom") {
    line = b->line;
    return concat(printable(b->scalar, 64), " (backend '", printable(b->scalar, 64), "')");
  }
  if (const auto* e = root.find("ensemble_scheduling")) {
    line = e->line;
    return "ensemble (ensemble_scheduling)";
  }
  return {};
}

triton_config checked_triton_config(const pb_field& root, const std::filesystem::path& source);

}  // namespace detail

//! Parses the text of a config.pbtxt. `source` names the file in errors. Checks, in order:
//! the text format; that the config is for PyTorch (platform `pytorch_libtorch`, `libtorch` or
//! `torch_aoti`, backend `pytorch` or `torchloom`, or neither given); every field against
//! Triton's ModelConfig;
//! then the values torchloom reads (max_batch_size >= 0, dims -1 or >= 1, instance counts
//! and gpus >= 0, data types PyTorch can take, default_model_filename inside the version
//! directory). Throws torchloom::error with the file, the line and what is wrong:
//! invalid_option, or unsupported (another backend's config; a Triton type PyTorch lacks).
inline triton_config parse_triton_config(std::string_view text,
                                         const std::filesystem::path& source = "config.pbtxt") {
  detail::pb_field root;
  try {
    root = detail::pb_parser(text).parse();
  } catch (const detail::pb_syntax_error& e) {
    throw error(errc::invalid_option, {},
                detail::concat(detail::config_at(source.string(), e.line), ": ", e.reason));
  }
  return detail::checked_triton_config(root, source);
}

//! The checks and the reading of parse_triton_config, on a parsed configuration: one set of
//! both for config.pbtxt and for a configuration given as JSON (read_triton_config_json,
//! whose fields have no line: their errors name `source` alone).
inline triton_config detail::checked_triton_config(const pb_field& root,
                                                   const std::filesystem::path& source) {
  const std::string src = source.string();
  const auto at = [&](std::size_t where) { return detail::config_at(src, where); };
  std::size_t line = 0;
  if (const std::string other = detail::foreign_backend(root, line); !other.empty()) {
    throw error(errc::unsupported, {},
                detail::concat(at(line), ": this config is for Triton's ", other,
                               " backend; torchloom runs PyTorch models (platform "
                               "'pytorch_libtorch', 'libtorch' or 'torch_aoti', backend "
                               "'pytorch' or 'torchloom')"));
  }
  detail::model_config_checker(source).check(root);

  triton_config c;
  auto text_of = [&](std::string_view n) {
    const auto* f = root.find(n);
    return f ? f->scalar : std::string();
  };
  auto line_of = [&](std::string_view n) {
    const auto* f = root.find(n);
    return f ? f->line : std::size_t{0};
  };
  c.name = text_of("name");
  c.platform = text_of("platform");
  c.backend = text_of("backend");
  c.platform_line = line_of("platform");
  c.backend_line = line_of("backend");
  c.default_model_filename_line = line_of("default_model_filename");
  if (const auto* f = root.find("default_model_filename")) {
    const std::filesystem::path p(f->scalar);
    bool inside = !f->scalar.empty() && p.is_relative() && !p.has_root_name();
    for (const auto& part : p) inside = inside && part != "..";
    if (!inside) {
      throw error(errc::invalid_option, {},
                  detail::concat(at(f->line), ": default_model_filename '",
                                 detail::printable(f->scalar, 200),
                                 "' must name a file inside the version directory (no '..', "
                                 "not absolute)"));
    }
    c.default_model_filename = f->scalar;
  }
  if (const auto* f = root.find("max_batch_size")) {
    c.max_batch_size = detail::pb_int(*f, src);
    if (c.max_batch_size < 0) {
      throw error(errc::invalid_option, {},
                  detail::concat(at(f->line), ": max_batch_size must be 0 or more, not ",
                                 c.max_batch_size));
    }
  }
  for (const auto* g : root.all("instance_group")) {
    instance_group ig;
    if (const auto* k = g->find("kind")) ig.kind = detail::pb_enum_name("InstanceKind", k->scalar);
    if (const auto* n = g->find("count")) {
      ig.count = detail::pb_int(*n, src);
      if (ig.count < 0) {
        throw error(errc::invalid_option, {},
                    detail::concat(at(n->line), ": instance_group count must be 1 or "
                                                      "more (0: the default, 1), not ",
                                   ig.count));
      }
      if (ig.count == 0) ig.count = 1;
    }
    for (const auto* gpu : g->all("gpus")) {
      const std::int64_t id = detail::pb_int(*gpu, src);
      // torch's device index is 8 bits wide: a larger one would wrap round to another GPU.
      constexpr std::int64_t max_gpu = std::numeric_limits<c10::DeviceIndex>::max();
      if (id < 0 || id > max_gpu) {
        throw error(errc::invalid_option, {},
                    detail::concat(at(gpu->line), ": instance_group gpus: ", id,
                                   " is not a GPU index (0 to ", max_gpu, ")"));
      }
      if (ig.kind == "KIND_CPU" || ig.kind == "KIND_MODEL") {
        throw error(errc::invalid_option, {},
                    detail::concat(at(gpu->line), ": instance_group of ", ig.kind,
                                   " cannot list gpus (only KIND_GPU can)"));
      }
      ig.gpus.push_back(id);
    }
    c.instance_groups.push_back(std::move(ig));
  }
  c.inputs = detail::tensor_decls(root, "input", src, c.max_batch_size);
  c.outputs = detail::tensor_decls(root, "output", src, c.max_batch_size);
  // Triton writes a map entry as `parameters { key: "K" value { string_value: "V" } }`.
  for (const auto* p : root.all("parameters")) {
    const auto* key = p->find("key");
    const auto* value = p->find("value");
    const auto* str = value ? value->find("string_value") : nullptr;
    if (!key) {
      throw error(errc::invalid_option, {},
                  detail::concat(at(p->line), ": a parameters entry needs a key"));
    }
    if (auto it = c.parameter_lines.find(key->scalar); it != c.parameter_lines.end()) {
      throw error(errc::invalid_option, {},
                  detail::concat(at(p->line), ": parameter '",
                                 detail::printable(key->scalar, 64),
                                 "' is given twice (first on line ", it->second, ")"));
    }
    c.parameters[key->scalar] = str ? str->scalar : std::string();
    c.parameter_lines[key->scalar] = key->line;
  }
  for (const auto* w : root.all("model_warmup")) {
    warmup_decl d;
    d.line = w->line;
    if (const auto* n = w->find("name")) d.name = n->scalar;
    if (const auto* b = w->find("batch_size")) d.batch_size = detail::pb_int(*b, src);
    if (const auto* n = w->find("count")) d.count = detail::pb_int(*n, src);
    if (d.count == 0) d.count = 1;
    const std::string what = detail::concat("model_warmup '", d.name, "'");
    for (const auto* entry : w->all("inputs")) {
      warmup_input_decl in;
      if (const auto* k = entry->find("key")) in.name = k->scalar;
      const auto* v = entry->find("value");
      if (v == nullptr) {
        throw error(errc::invalid_option, {},
                    detail::concat(at(entry->line), ": ", what, " input '", in.name,
                                   "' has no value { data_type dims ... }"));
      }
      const std::string in_what = detail::concat(what, " input '", in.name, "'");
      if (const auto* t = v->find("data_type")) in.dtype = detail::triton_dtype(*t, src, in_what);
      in.dims = detail::pb_dims(*v, "dims", src, in_what, d.batch_size);
      for (const std::int64_t dim : in.dims) {
        if (dim < 0) {
          throw error(errc::invalid_option, {},
                      detail::concat(at(v->line), ": ", in_what,
                                     ": warm-up dims must be fixed sizes, not -1"));
        }
      }
      const auto true_ = [](const detail::pb_field* f) {
        return f && (f->scalar == "true" || f->scalar == "True" || f->scalar == "t" ||
                     f->scalar == "1");
      };
      if (const auto* file = v->find("input_data_file")) {
        in.source = warmup_input_decl::data::file;
        in.file = file->scalar;
        const std::filesystem::path p(in.file);
        bool inside = !in.file.empty() && p.is_relative();
        for (const auto& part : p) inside = inside && part != "..";
        if (!inside) {
          throw error(errc::invalid_option, {},
                      detail::concat(at(file->line), ": ", in_what, ": input_data_file '",
                                     detail::printable(in.file, 200),
                                     "' must name a file inside the model's warmup/ directory"));
        }
      } else if (true_(v->find("random_data"))) {
        in.source = warmup_input_decl::data::random;
      } else if (!true_(v->find("zero_data"))) {
        throw error(errc::invalid_option, {},
                    detail::concat(at(v->line), ": ", in_what,
                                   " needs zero_data: true, random_data: true or "
                                   "input_data_file"));
      }
      d.inputs.push_back(std::move(in));
    }
    c.warmups.push_back(std::move(d));
  }
  return c;
}

//! Reads and parses a config.pbtxt file. Throws model_not_found when it does not exist,
//! invalid_option when it cannot be read (the system's reason: "Permission denied"), is not
//! a regular file (a directory, a pipe, a device) or is larger than max_config_bytes, and
//! what parse_triton_config throws.
inline triton_config read_triton_config(const std::filesystem::path& file) {
  const std::string path = file.string();
  // O_NONBLOCK: opening a named pipe must not wait for a writer; the type is checked next.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    throw error(err == ENOENT ? errc::model_not_found : errc::invalid_option, {},
                detail::concat("cannot read '", path, "': ", std::strerror(err)));
  }
  struct fd_closer {
    int fd;
    ~fd_closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    throw error(errc::invalid_option, {},
                detail::concat("'", path, "' is not a regular file",
                               S_ISDIR(st.st_mode)    ? " (a directory)"
                               : S_ISFIFO(st.st_mode) ? " (a named pipe)"
                               : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? " (a device)"
                                                                           : ""));
  }
  if (static_cast<std::uint64_t>(st.st_size) > max_config_bytes) {
    throw error(errc::invalid_option, {},
                detail::concat("'", path, "' is larger than ", max_config_bytes, " bytes (",
                               st.st_size, " bytes); no Triton config is that large"));
  }
  std::string text;
  char buffer[65536];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw error(errc::invalid_option, {},
                  detail::concat("cannot read '", path, "': ", std::strerror(errno)));
    }
    if (n == 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
    if (text.size() > max_config_bytes) {  // it grew while being read
      throw error(errc::invalid_option, {},
                  detail::concat("'", path, "' is larger than ", max_config_bytes, " bytes"));
    }
  }
  return parse_triton_config(text, file);
}

}  // namespace torchloom
