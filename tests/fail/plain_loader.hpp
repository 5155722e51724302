// A loader with the least the loader concept asks and no torchloom::weight_access
// specialisation: what the residency policies that need weight access must refuse.
#pragma once
#include <torchloom/torchloom.hpp>

#include <string_view>
#include <vector>

struct plain_loader {
  struct model_type {};
  static constexpr std::string_view default_filename = "model";
  model_type load(const torchloom::load_context&) const { return {}; }
  torchloom::input_signature signature(const model_type&) const { return {}; }
  c10::IValue run(model_type&, std::vector<c10::IValue>&&, const torchloom::run_context&) const {
    return {};
  }
};
