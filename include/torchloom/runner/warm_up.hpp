#pragma once
#include <torchloom/detail/strings.hpp>
#include <torchloom/detail/torch_error.hpp>
#include <torchloom/dtype.hpp>
#include <torchloom/error.hpp>
#include <torchloom/model_spec.hpp>
#include <torchloom/runner/inputs.hpp>
#include <torchloom/runner/runner_core.hpp>
#include <torchloom/signature.hpp>
#include <torchloom/triton/config.hpp>

#include <ATen/Functions.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

// A runner's last construction step: runs the loaded model on synthesised and declared
// inputs, so that the first real run does not pay for torch's first-run work.

namespace torchloom::detail {

//! One input of a config.pbtxt `model_warmup` sample, on the runner's device.
inline at::Tensor warmup_tensor(const runner_core& core, const warmup_decl& w,
                                const warmup_input_decl& in) {
  const model_spec& spec = core.spec();
  const c10::Device device = core.device();
  const std::string what = concat("model_warmup '", w.name, "' input '", in.name, "'");
  if (!in.dtype) {
    throw error(errc::invalid_option, spec.name,
                concat(what, ": a tensor input needs a data_type other than TYPE_STRING"));
  }
  std::vector<std::int64_t> shape;
  if (w.batch_size > 0) shape.push_back(w.batch_size);
  shape.insert(shape.end(), in.dims.begin(), in.dims.end());
  const auto opts = at::TensorOptions().dtype(*in.dtype);
  at::Tensor t;
  switch (in.source) {
    case warmup_input_decl::data::zero: t = at::zeros(shape, opts); break;
    case warmup_input_decl::data::random:
      t = c10::isFloatingType(*in.dtype)
              ? at::rand(shape, opts)
              : at::randint(0, 2, shape, at::TensorOptions().dtype(at::kLong)).to(*in.dtype);
      break;
    case warmup_input_decl::data::file: {
      const auto file = spec.directory / "warmup" / in.file;
      spec.require_inside(file, concat(what, ": input_data_file"), errc::invalid_option);
      t = at::empty(shape, opts);
      const auto bytes = static_cast<std::size_t>(t.numel()) * t.element_size();
      std::ifstream f(file, std::ios::binary);
      std::error_code ec;
      if (!f || !std::filesystem::is_regular_file(file, ec)) {
        throw error(errc::invalid_option, spec.name,
                    concat(what, ": cannot read input_data_file '", file.string(), "'"));
      }
      const auto size = std::filesystem::file_size(file, ec);
      if (ec || size != bytes) {
        throw error(errc::invalid_option, spec.name,
                    concat(what, ": input_data_file '", file.string(), "' holds ", size,
                           " bytes; shape ", c10::IntArrayRef(shape), " of ",
                           dtype_name(*in.dtype), " needs ", bytes));
      }
      f.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(bytes));
      break;
    }
  }
  return t.to(device);
}

//! Warm-up at load: WARMUP_ITERATIONS runs with inputs synthesised from the declared dtypes
//! and shapes (free dimensions become 1), then every config.pbtxt `model_warmup` sample,
//! `count` times, with its zero, random or file data (files under `<model dir>/warmup/`,
//! raw bytes as Triton reads them). Throws invalid_option when an input is not declared
//! enough or a sample does not fit the model.
template <class Run>
void warm_up(const runner_core& core, Run&& run) {
  const model_spec& spec = core.spec();
  const input_signature& sig = core.signature();
  const c10::Device device = core.device();
  const int n = spec.options.warmup_iterations;
  if (n > 0) {
    std::vector<c10::IValue> inputs;
    for (const auto& s : sig) {
      if (s.has_default) break;
      if (!s.is_tensor || !s.dtype || !s.shape) {
        throw error(errc::invalid_option, spec.name,
                    concat("WARMUP_ITERATIONS=", n, " needs the dtype and shape of every "
                           "input (config.pbtxt input { data_type dims }); input '", s.name,
                           "' has none"));
      }
      std::vector<std::int64_t> shape = *s.shape;
      for (auto& d : shape) d = d < 0 ? 1 : d;
      auto opts = at::TensorOptions().dtype(*s.dtype).device(device);
      try {
        inputs.emplace_back(c10::isFloatingType(*s.dtype) ? at::rand(shape, opts)
                                                          : at::zeros(shape, opts));
      } catch (const std::exception& e) {  // c10::Error, std::bad_alloc: dims too large
        throw error(errc::invalid_option, spec.name,
                    concat("WARMUP_ITERATIONS=", n, ": cannot make input '", s.name,
                           "' of the declared shape ", c10::IntArrayRef(shape), ": ",
                           torch_message(e)));
      }
    }
    for (int i = 0; i < n; ++i) run(inputs);
  }
  if (!spec.config) return;
  for (const auto& w : spec.config->warmups) {
    std::vector<c10::IValue> inputs(sig.size());
    std::vector<bool> given(sig.size(), false);
    for (const auto& in : w.inputs) {
      const auto pos = core.input_position(in.name);
      if (!pos) {
        throw error(errc::invalid_option, spec.name,
                    concat("model_warmup '", w.name, "' (line ", w.line, ") names input '",
                           in.name, "', which the model does not have"));
      }
      inputs[*pos] = warmup_tensor(core, w, in);
      given[*pos] = true;
    }
    std::size_t count = sig.size();
    while (count > 0 && !given[count - 1] && sig[count - 1].has_default) --count;
    for (std::size_t i = 0; i < count; ++i) {
      if (!given[i]) {
        throw error(errc::invalid_option, spec.name,
                    concat("model_warmup '", w.name, "' (line ", w.line,
                           ") gives no data for ", input_label(sig, i)));
      }
    }
    inputs.resize(count);
    for (std::int64_t i = 0; i < w.count; ++i) run(inputs);
  }
}

}  // namespace torchloom::detail
