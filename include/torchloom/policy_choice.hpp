#pragma once
//! Choosing a runner's policies at run time: four described enums name the policies of each
//! role, `policy_choice` holds one of each, and `with_runner_type` turns a choice into the
//! matching `model_runner<...>` type for a generic callable. A program that picks its runner
//! from a flag or a configuration file (the example CLI, a serving backend) dispatches with
//! it instead of writing its own table of types.
#include <torchloom/detail/config.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>
#include <torchloom/hook/dlopen_hook.hpp>
#include <torchloom/hook/no_hook.hpp>
#include <torchloom/loader/aoti.hpp>
#include <torchloom/loader/torchscript.hpp>
#include <torchloom/model_runner.hpp>
#include <torchloom/model_spec.hpp>
#include <torchloom/platform.hpp>
#include <torchloom/residency/mapped.hpp>
#include <torchloom/residency/resident.hpp>
#include <torchloom/residency/shared.hpp>
#include <torchloom/residency/streamed.hpp>
#include <torchloom/stream/adaptive.hpp>
#include <torchloom/stream/caller.hpp>
#include <torchloom/stream/graphed.hpp>
#include <torchloom/stream/green_context.hpp>
#include <torchloom/stream/pool.hpp>

#include <boost/describe/enum.hpp>
#include <boost/describe/enum_from_string.hpp>
#include <boost/describe/enum_to_string.hpp>
#include <boost/describe/enumerators.hpp>
#include <boost/mp11/algorithm.hpp>
#include <boost/mp11/list.hpp>

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchloom {

//! The loaders: torchscript_loader, aoti_loader.
enum class loader_kind { torchscript, aoti };
BOOST_DESCRIBE_ENUM(loader_kind, torchscript, aoti)

//! The model-init hooks a run-time choice can name: no_hook, dlopen_hook. (static_hook<T>
//! needs a type, so it is chosen at compile time only.)
enum class hook_kind { none, dlopen };
BOOST_DESCRIBE_ENUM(hook_kind, none, dlopen)

//! The stream policies: caller_stream, pool_stream, adaptive_stream, green_context_stream,
//! green_context_complement_stream (green_complement: the SMs a green runner with the same
//! GREEN_CONTEXT_SM_COUNT leaves) and graphed<caller_stream> (graphed_caller: CUDA graph
//! replays on the caller's stream).
enum class stream_kind { caller, pool, adaptive, green, green_complement, graphed_caller };
BOOST_DESCRIBE_ENUM(stream_kind, caller, pool, adaptive, green, green_complement, graphed_caller)

//! The residency policies: resident_weights, shared_weights, streamed_weights, mapped_weights.
enum class residency_kind { resident, shared, streamed, mapped };
BOOST_DESCRIBE_ENUM(residency_kind, resident, shared, streamed, mapped)

//! One of the four enums above.
template <class E>
concept policy_kind = std::is_same_v<E, loader_kind> || std::is_same_v<E, hook_kind> ||
                      std::is_same_v<E, stream_kind> || std::is_same_v<E, residency_kind>;

//! The role an enum names, for messages: "loader", "hook", "stream", "residency".
template <policy_kind E>
constexpr std::string_view role_name() noexcept {
  if constexpr (std::is_same_v<E, loader_kind>) return "loader";
  if constexpr (std::is_same_v<E, hook_kind>) return "hook";
  if constexpr (std::is_same_v<E, stream_kind>) return "stream";
  if constexpr (std::is_same_v<E, residency_kind>) return "residency";
}

//! The name of a policy, e.g. "pool" for stream_kind::pool.
template <policy_kind E>
std::string_view to_string(E kind) noexcept {
  return boost::describe::enum_to_string(kind, "unknown");
}

//! Every name of a role, in declaration order, e.g. {"resident", "shared", "streamed", "mapped"}.
template <policy_kind E>
std::vector<std::string> policy_names() {
  std::vector<std::string> names;
  boost::mp11::mp_for_each<boost::describe::describe_enumerators<E>>(
      [&](auto e) { names.emplace_back(e.name); });
  return names;
}

//! Parses a policy's name (exact, lower case). Throws invalid_option naming the text, the
//! role, the close names ("did you mean 'pool'?") and the valid names; `model` is the model
//! the choice is for (may be empty).
template <policy_kind E>
E parse_policy(std::string_view text, std::string_view model = {}) {
  E out{};
  if (!boost::describe::enum_from_string(std::string(text).c_str(), out)) {
    const std::vector<std::string> names = policy_names<E>();
    const std::string valid = detail::quoted_list(names, " or ");
    const std::string near = detail::did_you_mean(text, names);
    throw error(errc::invalid_option, std::string(model),
                near.empty()
                    ? detail::concat("'", detail::printable(text, 64), "' is not a ",
                                     role_name<E>(), " policy; use ", valid)
                    : detail::concat("'", detail::printable(text, 64), "' is not a ",
                                     role_name<E>(), " policy", near, " (use ", valid, ")"));
  }
  return out;
}

//! The loader a model file's name calls for: aoti for a `.pt2` package, torchscript
//! otherwise. loader_for(model_spec) is the rule for a model: its platform, else the file's
//! content.
inline loader_kind loader_for_file(const std::filesystem::path& file) {
  return file.extension() == ".pt2" ? loader_kind::aoti : loader_kind::torchscript;
}

//! The loader a model calls for, as Triton chooses its PyTorch backend's path: the model's
//! platform (`torch_aoti`: aoti; `pytorch_libtorch`, `libtorch`: torchscript), resolved by
//! model_spec::from_directory and from_file (see resolve_platform). A spec whose platform is
//! not set (built by hand) is resolved here from its config and version directory, else from
//! its file's content or name; torchscript when nothing decides (its loader then reports the
//! missing model.pt). A program that picks its runner at run time (a CLI, a serving backend)
//! passes this to with_runner_type; a runner of the other loader refuses the spec.
inline loader_kind loader_for(const model_spec& spec) {
  model_platform p = spec.platform;
  if (p.name.empty() && (spec.config || !spec.version_directory.empty())) {
    p = resolve_platform(spec.config ? &*spec.config : nullptr, spec.version_directory);
  }
  if (p.name.empty() && !spec.file.empty()) p = detail::platform_of_file(spec.file, "");
  return p.name == aoti_platform ? loader_kind::aoti : loader_kind::torchscript;
}

//! A runner's four policies, chosen at run time. The defaults are model_runner's.
struct policy_choice {
  loader_kind loader = loader_kind::torchscript;
  hook_kind hook = hook_kind::none;
  stream_kind stream = stream_kind::caller;
  residency_kind residency = residency_kind::resident;

  friend constexpr bool operator==(const policy_choice&, const policy_choice&) = default;
};

//! "loader=torchscript hook=none stream=pool residency=shared".
inline std::string to_string(const policy_choice& c) {
  return detail::concat("loader=", to_string(c.loader), " hook=", to_string(c.hook),
                        " stream=", to_string(c.stream), " residency=", to_string(c.residency));
}

//! Why `c` has no runner type in this build (a sentence), or an empty view when it has one.
//! Unavailable: aoti without LibTorch >= 2.6, green and green_complement without
//! torchloom::cuda, and graphed_caller with streamed (a captured graph would replay one run's
//! weight copies).
constexpr std::string_view why_unavailable(const policy_choice& c) noexcept {
  if (c.loader == loader_kind::aoti && TORCHLOOM_TORCH_VERSION < 20600) {
    return "the aoti loader needs LibTorch >= 2.6, and this build has an older one";
  }
  if ((c.stream == stream_kind::green || c.stream == stream_kind::green_complement) &&
      !TORCHLOOM_HAS_CUDA) {
    return "the green stream policies need CUDA (torchloom::cuda), and this build has none";
  }
  if (c.stream == stream_kind::graphed_caller && c.residency == residency_kind::streamed) {
    return "graphed_caller cannot stream weights: a captured CUDA graph replays the first "
           "run's weight copies; use streamed with a plain stream policy, or graphed_caller "
           "with resident, shared or mapped";
  }
  return {};
}

//! Whether this build has a runner type for `c` (see why_unavailable).
constexpr bool is_available(const policy_choice& c) noexcept {
  return why_unavailable(c).empty();
}

//! The loader type a loader_kind names (for aoti below LibTorch 2.6, the stand-in whose use
//! is a static_assert saying why).
template <loader_kind K>
struct loader_type_of;
template <>
struct loader_type_of<loader_kind::torchscript> {
  using type = torchscript_loader;
};
template <>
struct loader_type_of<loader_kind::aoti> {
  using type = aoti_loader;
};

//! The hook type a hook_kind names.
template <hook_kind K>
struct hook_type_of;
template <>
struct hook_type_of<hook_kind::none> {
  using type = no_hook;
};
template <>
struct hook_type_of<hook_kind::dlopen> {
  using type = dlopen_hook;
};

//! The stream policy type a stream_kind names.
template <stream_kind K>
struct stream_type_of;
template <>
struct stream_type_of<stream_kind::caller> {
  using type = caller_stream;
};
template <>
struct stream_type_of<stream_kind::pool> {
  using type = pool_stream;
};
template <>
struct stream_type_of<stream_kind::adaptive> {
  using type = adaptive_stream;
};
template <>
struct stream_type_of<stream_kind::green> {
  using type = green_context_stream;
};
template <>
struct stream_type_of<stream_kind::green_complement> {
  using type = green_context_complement_stream;
};
template <>
struct stream_type_of<stream_kind::graphed_caller> {
  using type = graphed<caller_stream>;
};

//! The residency policy type a residency_kind names.
template <residency_kind K>
struct residency_type_of;
template <>
struct residency_type_of<residency_kind::resident> {
  using type = resident_weights;
};
template <>
struct residency_type_of<residency_kind::shared> {
  using type = shared_weights;
};
template <>
struct residency_type_of<residency_kind::streamed> {
  using type = streamed_weights;
};
template <>
struct residency_type_of<residency_kind::mapped> {
  using type = mapped_weights;
};

namespace detail {
namespace mp = boost::mp11;

template <class D>
using enumerator_value = std::integral_constant<decltype(D::value), D::value>;
template <class E>
using kind_values =
    mp::mp_rename<mp::mp_transform<enumerator_value, boost::describe::describe_enumerators<E>>,
                  mp::mp_list>;

//! A choice as a type: mp_list of four integral_constants.
template <class L, class H, class S, class R>
using choice_t = mp::mp_list<L, H, S, R>;
template <class C>
constexpr policy_choice choice_value() {
  return {mp::mp_at_c<C, 0>::value, mp::mp_at_c<C, 1>::value, mp::mp_at_c<C, 2>::value,
          mp::mp_at_c<C, 3>::value};
}
template <class C>
using choice_available = std::bool_constant<is_available(choice_value<C>())>;

template <class C>
using runner_for_choice =
    model_runner<typename loader_type_of<mp::mp_at_c<C, 0>::value>::type,
                 typename hook_type_of<mp::mp_at_c<C, 1>::value>::type,
                 typename stream_type_of<mp::mp_at_c<C, 2>::value>::type,
                 typename residency_type_of<mp::mp_at_c<C, 3>::value>::type>;
}  // namespace detail

//! The policy_choice an element of available_choices stands for.
template <class Choice>
constexpr policy_choice policy_choice_of() {
  return detail::choice_value<Choice>();
}

//! Every combination of the four enums that this build has a runner type for, as an mp_list
//! of mp_list<loader, hook, stream, residency> integral constants (in enum order).
using available_choices = boost::mp11::mp_filter<
    detail::choice_available,
    boost::mp11::mp_product<detail::choice_t, detail::kind_values<loader_kind>,
                            detail::kind_values<hook_kind>, detail::kind_values<stream_kind>,
                            detail::kind_values<residency_kind>>>;

//! The runner type of an element of available_choices.
template <class Choice>
using runner_type_of = detail::runner_for_choice<Choice>;

//! Calls `f(std::type_identity<model_runner<L, H, S, R>>{})` with the runner type that `c`
//! names and returns what it returns; `f` is instantiated once per available combination
//! (see available_choices), so it must return the same type for all of them. Throws
//! unsupported, naming the combination and why, when this build has no such runner type.
template <class F>
decltype(auto) with_runner_type(const policy_choice& c, F&& f, std::string_view model = {}) {
  if (!is_available(c)) {
    throw error(errc::unsupported, std::string(model),
                detail::concat("no runner for ", to_string(c), " in this build: ",
                               why_unavailable(c)));
  }
  std::size_t index = 0;
  std::size_t i = 0;
  boost::mp11::mp_for_each<available_choices>([&](auto choice) {
    if (detail::choice_value<decltype(choice)>() == c) index = i;
    ++i;
  });
  return boost::mp11::mp_with_index<boost::mp11::mp_size<available_choices>::value>(
      index, [&](auto I) -> decltype(auto) {
        using choice = boost::mp11::mp_at_c<available_choices, decltype(I)::value>;
        return std::forward<F>(f)(std::type_identity<runner_type_of<choice>>{});
      });
}

}  // namespace torchloom
