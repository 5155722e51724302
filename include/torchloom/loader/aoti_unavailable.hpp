#pragma once
// What stands for aoti_loader (torchloom/loader/aoti.hpp) below LibTorch 2.6, which it needs:
// a use of it stops with the reason. Empty from LibTorch 2.6 on.
#include <torchloom/context.hpp>
#include <torchloom/detail/config.hpp>
#include <torchloom/signature.hpp>

#include <ATen/core/ivalue.h>

#include <string_view>
#include <vector>

#if TORCHLOOM_TORCH_VERSION < 20600

namespace torchloom {

namespace detail {
#define TORCHLOOM_AOTI_STR_(x) #x
#define TORCHLOOM_AOTI_STR(x) TORCHLOOM_AOTI_STR_(x)
//! Stands for aoti_loader below LibTorch 2.6: any use that needs the type complete (a
//! model_runner of it, constructing one) stops with the reason; the header itself compiles.
template <class T = void>
struct aoti_loader_unavailable {
  static_assert(dependent_false<T>,
                "torchloom: aoti_loader needs LibTorch >= 2.6 (this build has "
                TORCHLOOM_AOTI_STR(TORCH_VERSION_MAJOR) "." TORCHLOOM_AOTI_STR(TORCH_VERSION_MINOR)
                "); use torchscript_loader or build against a newer LibTorch");
  // The loader's shape, so that this assertion is the only error a runner of it reports.
  struct model_type {};
  static constexpr std::string_view default_filename = "model.pt2";
  static constexpr std::string_view platform = "torch_aoti";
  model_type load(const load_context&) const;
  input_signature signature(const model_type&) const;
  c10::IValue run(model_type&, std::vector<c10::IValue>&&, const run_context&) const;
};
#undef TORCHLOOM_AOTI_STR
#undef TORCHLOOM_AOTI_STR_
}  // namespace detail

//! The AOTInductor loader; this build's LibTorch is older than 2.6, which it needs.
using aoti_loader = detail::aoti_loader_unavailable<>;

}  // namespace torchloom

#endif
