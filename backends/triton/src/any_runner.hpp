#pragma once
// A runner of any policy type behind one interface, and the factories that pick the type from
// a run-time choice: the plain runners (torchloom_backend.cpp) and, in a translation unit of
// their own so that the two compile side by side, the graphed ones (graphed_runners.cpp).
#include <torchloom/io_names.hpp>
#include <torchloom/model_spec.hpp>
#include <torchloom/policy_choice.hpp>
#include <torchloom/signature.hpp>

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace torchloom::triton_backend {

//! A runner of any policy type, behind one interface.
class any_runner {
 public:
  virtual ~any_runner() = default;
  //! The model's outputs, flattened, for tensor inputs (the fast path: no boxing).
  virtual std::vector<at::Tensor> run_tensors(const std::vector<at::Tensor>& inputs) = 0;
  //! The model's output as torch returned it.
  virtual c10::IValue run_values(std::vector<c10::IValue> inputs) = 0;
  virtual const input_signature& inputs() const = 0;
  virtual c10::Device device() const = 0;
  //! The model's forward-based names (an AOTInductor package's call spec; else empty).
  virtual const io_names& names() const = 0;
  //! The input and output a request's name stands for, by model_runner's rules.
  virtual std::optional<std::size_t> input_index(std::string_view name) const = 0;
  virtual std::optional<std::size_t> output_index(std::string_view name) const = 0;
};

//! model_runner `Runner` as an any_runner; with no device, the runner takes it from the spec
//! (KIND_MODEL: where the model was saved).
template <class Runner>
class runner_box final : public any_runner {
 public:
  runner_box(model_spec spec, std::optional<c10::Device> device)
      : runner_(device ? Runner(std::move(spec), *device) : Runner(std::move(spec))) {}
  std::vector<at::Tensor> run_tensors(const std::vector<at::Tensor>& inputs) override {
    return runner_.run_tensors(inputs);
  }
  c10::IValue run_values(std::vector<c10::IValue> inputs) override {
    return runner_.run_ivalue(std::move(inputs));
  }
  const input_signature& inputs() const override { return runner_.inputs(); }
  c10::Device device() const override { return runner_.device(); }
  const io_names& names() const override { return runner_.names(); }
  std::optional<std::size_t> input_index(std::string_view name) const override {
    return runner_.input_index(name);
  }
  std::optional<std::size_t> output_index(std::string_view name) const override {
    return runner_.output_index(name);
  }

 private:
  Runner runner_;
};

//! The runner `choice` names (see torchloom::with_runner_type). Throws what its constructor
//! throws, and unsupported for a choice this build has no runner for.
std::unique_ptr<any_runner> make_runner(const policy_choice& choice, const model_spec& spec,
                                        std::optional<c10::Device> device);

//! The runner `choice` names with its stream policy S replaced by graphed<S> (TORCHLOOM_GRAPHS
//! with a stream other than caller and graphed_caller); in a build without CUDA, where
//! graphed<S> is a no-op, the plain runner. Throws invalid_option for a choice that cannot be
//! graphed (the backend refuses streamed weights first), and what the runner's constructor
//! throws.
std::unique_ptr<any_runner> make_graphed_runner(const policy_choice& choice,
                                                const model_spec& spec,
                                                std::optional<c10::Device> device);

}  // namespace torchloom::triton_backend
