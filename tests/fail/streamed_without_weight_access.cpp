// Must not compile: streamed_weights with a loader that gives no weight access (no
// torchloom::weight_access specialisation for it).
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

auto n = sizeof(torchloom::model_runner<plain_loader, torchloom::no_hook, torchloom::caller_stream,
                                        torchloom::streamed_weights>);
