// Choosing policies at run time: names parse and print, availability follows the build, and
// with_runner_type hands over exactly the runner type a choice names (or says why not).
#include "../../support/fixtures.hpp"

#include <torchloom/policy_choice.hpp>
#include <torchloom/torchloom.hpp>

#include <boost/describe/enumerators.hpp>
#include <boost/mp11/algorithm.hpp>

#include <string>
#include <type_traits>

using torchloom::errc;
using torchloom::hook_kind;
using torchloom::loader_kind;
using torchloom::policy_choice;
using torchloom::residency_kind;
using torchloom::stream_kind;

namespace {

// The choice a runner type stands for, read from its template arguments alone (no member of
// the runner is instantiated), so that the test does not trust the library's own mapping.
template <class L, class H, class S, class R>
policy_choice choice_of(std::type_identity<torchloom::model_runner<L, H, S, R>>) {
  policy_choice c;
  c.loader = std::is_same_v<L, torchloom::torchscript_loader> ? loader_kind::torchscript
                                                              : loader_kind::aoti;
  c.hook = std::is_same_v<H, torchloom::no_hook> ? hook_kind::none : hook_kind::dlopen;
  static_assert(std::is_same_v<H, torchloom::no_hook> || std::is_same_v<H, torchloom::dlopen_hook>);
  if constexpr (std::is_same_v<S, torchloom::caller_stream>) c.stream = stream_kind::caller;
  if constexpr (std::is_same_v<S, torchloom::pool_stream>) c.stream = stream_kind::pool;
  if constexpr (std::is_same_v<S, torchloom::adaptive_stream>) c.stream = stream_kind::adaptive;
  if constexpr (std::is_same_v<S, torchloom::green_context_stream>) c.stream = stream_kind::green;
  if constexpr (std::is_same_v<S, torchloom::green_context_complement_stream>) {
    c.stream = stream_kind::green_complement;
  }
  if constexpr (std::is_same_v<S, torchloom::graphed<torchloom::caller_stream>>) {
    c.stream = stream_kind::graphed_caller;
  }
  if constexpr (std::is_same_v<R, torchloom::resident_weights>) c.residency = residency_kind::resident;
  if constexpr (std::is_same_v<R, torchloom::shared_weights>) c.residency = residency_kind::shared;
  if constexpr (std::is_same_v<R, torchloom::streamed_weights>) c.residency = residency_kind::streamed;
  if constexpr (std::is_same_v<R, torchloom::mapped_weights>) c.residency = residency_kind::mapped;
  return c;
}

template <class E, class F>
void for_each_kind(F&& f) {
  boost::mp11::mp_for_each<boost::describe::describe_enumerators<E>>([&](auto e) { f(e.value); });
}

}  // namespace

TEST_CASE("policy names parse, print and list every policy of a role", "[choice]") {
  CHECK(torchloom::parse_policy<stream_kind>("pool") == stream_kind::pool);
  CHECK(torchloom::parse_policy<residency_kind>("mapped") == residency_kind::mapped);
  CHECK(torchloom::parse_policy<hook_kind>("dlopen") == hook_kind::dlopen);
  CHECK(torchloom::parse_policy<loader_kind>("aoti") == loader_kind::aoti);
  CHECK(torchloom::to_string(stream_kind::green) == "green");
  CHECK(torchloom::to_string(residency_kind::streamed) == "streamed");
  CHECK(torchloom::policy_names<stream_kind>() ==
        std::vector<std::string>{"caller", "pool", "adaptive", "green", "green_complement",
                                 "graphed_caller"});
  CHECK(torchloom::policy_names<residency_kind>() ==
        std::vector<std::string>{"resident", "shared", "streamed", "mapped"});
  for_each_kind<residency_kind>([](residency_kind k) {
    CHECK(torchloom::parse_policy<residency_kind>(torchloom::to_string(k)) == k);
  });
  CHECK(torchloom::to_string(policy_choice{}) ==
        "loader=torchscript hook=none stream=caller residency=resident");
}

TEST_CASE("an unknown policy name is invalid_option naming it, its role and the valid names",
          "[choice]") {
  CHECK_TORCHLOOM_ERROR(torchloom::parse_policy<stream_kind>("polo", "ranker"),
                        errc::invalid_option, "model 'ranker'", "'polo'", "stream policy",
                        "'caller', 'pool', 'adaptive', 'green', 'green_complement' or "
                        "'graphed_caller'");
  CHECK_TORCHLOOM_ERROR(torchloom::parse_policy<residency_kind>("Shared"), errc::invalid_option,
                        "'Shared'", "residency policy", "'resident', 'shared', 'streamed' or 'mapped'");
}

TEST_CASE("an unknown policy name close to a valid one suggests it, as option keys do",
          "[choice]") {
  CHECK_TORCHLOOM_ERROR(torchloom::parse_policy<stream_kind>("polo"), errc::invalid_option,
                        "'polo' is not a stream policy; did you mean 'pool'?",
                        "'caller', 'pool', 'adaptive', 'green', 'green_complement' or "
                        "'graphed_caller'");
  CHECK_TORCHLOOM_ERROR(torchloom::parse_policy<residency_kind>("Shared"), errc::invalid_option,
                        "did you mean 'shared'?");
  CHECK_TORCHLOOM_ERROR(torchloom::parse_policy<hook_kind>("dlopn"), errc::invalid_option,
                        "did you mean 'dlopen'?");
  // Nothing close: the valid names alone, no guess.
  const auto far = torchloom_test::capture_error(
      [] { (void)torchloom::parse_policy<stream_kind>("tensorrt"); });
  CHECK_FALSE(torchloom_test::contains(far.what(), "did you mean"));
  CHECK(torchloom_test::contains(far.what(), "use 'caller', 'pool', 'adaptive', 'green', 'green_complement' or 'graphed_caller'"));
}

TEST_CASE("the loader follows the file type", "[choice]") {
  CHECK(torchloom::loader_for_file("models/x/1/model.pt2") == loader_kind::aoti);
  CHECK(torchloom::loader_for_file("models/x/1/model.pt") == loader_kind::torchscript);
  CHECK(torchloom::loader_for_file("model") == loader_kind::torchscript);
}

TEST_CASE("availability follows the build and the policies' own limits", "[choice]") {
  const bool aoti = TORCHLOOM_TORCH_VERSION >= 20600;
  const bool cuda = TORCHLOOM_HAS_CUDA != 0;
  CHECK(torchloom::is_available({}));
  CHECK(torchloom::is_available({loader_kind::torchscript, hook_kind::dlopen, stream_kind::pool,
                                 residency_kind::streamed}));
  CHECK(torchloom::is_available({loader_kind::aoti, hook_kind::none, stream_kind::caller,
                                 residency_kind::mapped}) == aoti);
  CHECK(torchloom::is_available({loader_kind::torchscript, hook_kind::none, stream_kind::green,
                                 residency_kind::resident}) == cuda);
  CHECK(torchloom::is_available({loader_kind::torchscript, hook_kind::none,
                                 stream_kind::green_complement, residency_kind::shared}) == cuda);
  // graphed<caller_stream> is a no-op on the CPU, so it exists in every build, but never with
  // streamed_weights (model_runner refuses that pair at compile time).
  CHECK(torchloom::is_available({loader_kind::torchscript, hook_kind::dlopen,
                                 stream_kind::graphed_caller, residency_kind::mapped}));
  CHECK_FALSE(torchloom::is_available({loader_kind::torchscript, hook_kind::none,
                                       stream_kind::graphed_caller, residency_kind::streamed}));
  // streamed_weights streams packages exported for streaming: the runner exists with aoti.
  CHECK(torchloom::is_available({loader_kind::aoti, hook_kind::none, stream_kind::caller,
                                 residency_kind::streamed}) == aoti);
  // The list of runner types holds exactly the available combinations.
  const std::size_t loaders = aoti ? 2 : 1;
  // caller, pool, adaptive, graphed_caller; green and green_complement with CUDA.
  const std::size_t streams = cuda ? 6 : 4;
  // Less graphed_caller with streamed, per loader and hook.
  const std::size_t expected = loaders * 2 * streams * 4 - loaders * 2;
  CHECK(boost::mp11::mp_size<torchloom::available_choices>::value == expected);
}

TEST_CASE("with_runner_type hands over the runner type of every available choice, and refuses "
          "the others naming the combination and why",
          "[choice]") {
  int available = 0;
  for_each_kind<loader_kind>([&](loader_kind l) {
    for_each_kind<hook_kind>([&](hook_kind h) {
      for_each_kind<stream_kind>([&](stream_kind s) {
        for_each_kind<residency_kind>([&](residency_kind r) {
          const policy_choice c{l, h, s, r};
          INFO(torchloom::to_string(c));
          if (torchloom::is_available(c)) {
            ++available;
            const policy_choice got =
                torchloom::with_runner_type(c, [](auto t) { return choice_of(t); });
            CHECK(got == c);
          } else {
            CHECK_TORCHLOOM_ERROR(
                torchloom::with_runner_type(
                    c, [](auto t) { return choice_of(t); }, "ranker"),
                errc::unsupported, "model 'ranker'", torchloom::to_string(c),
                std::string(torchloom::why_unavailable(c)));
          }
        });
      });
    });
  });
  CHECK(available == static_cast<int>(boost::mp11::mp_size<torchloom::available_choices>::value));
}

TEST_CASE("a runner made through with_runner_type runs the model", "[choice][runner]") {
  torchloom_test::temp_dir dir;
  auto module = torchloom_test::make_linear(8, 4);
  torchloom_test::write_triton_model(dir / "linear", module, {});
  const at::Tensor x = torch::rand({2, 8});
  const at::Tensor expected = module.forward({x}).toTensor();
  const policy_choice c{loader_kind::torchscript, hook_kind::none, stream_kind::pool,
                        residency_kind::shared};
  // Only this one type is constructed: the callable is generic, but the test needs one runner.
  const at::Tensor out = torchloom::with_runner_type(c, [&](auto t) -> at::Tensor {
    using runner = typename decltype(t)::type;
    if constexpr (std::is_same_v<runner,
                                 torchloom::model_runner<torchloom::torchscript_loader,
                                                         torchloom::no_hook, torchloom::pool_stream,
                                                         torchloom::shared_weights>>) {
      runner r(torchloom::model_spec::from_directory(dir / "linear"));
      return r.run({x}).at(0);
    } else {
      FAIL("with_runner_type chose another runner type");
      return {};
    }
  });
  CHECK(torch::equal(out, expected));
}
