// Soak (hidden tag [soak], run by CTest as its own entry): construct/destroy cycles of plain,
// hooked and failing runners leave the process's memory, descriptors and libraries as they
// were.
#include "support/catch.hpp"
#include "support/fixtures.hpp"
#include "support/hook_fixtures.hpp"

#include <torchloom/torchloom.hpp>

#include <cstddef>
#include <fstream>
#include <set>
#include <string>

using namespace torchloom_test;  // the fixtures of support/hook_fixtures.hpp

namespace {

// What the process holds: resident memory, open descriptors, mapped shared objects.
struct process_usage {
  long rss_kib = 0;
  std::size_t fds = 0;
  std::set<std::string> libraries;
  std::size_t mappings = 0;
};

process_usage current_usage() {
  process_usage u;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) u.rss_kib = std::stol(line.substr(6));
  }
  for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
    (void)entry;
    ++u.fds;
  }
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    ++u.mappings;
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    if (path.find(".so") != std::string::npos) u.libraries.insert(path);
  }
  return u;
}

}  // namespace

TEST_CASE("Soak: 1,000 construct/destroy cycles leave memory, descriptors and libraries as "
          "they were",
          "[.][soak]") {
  temp_dir linear_dir;
  auto linear = torchloom_test::make_linear(8, 4);
  torchloom_test::write_triton_model(linear_dir / "linear", linear);
  e2e_model hooked;  // op library, hook, weights
  e2e_options no_weights;
  no_weights.weights = false;
  e2e_model failing_hook(no_weights);  // the hook's init fails
  e2e_model failing_load;              // the hook runs, then the model fails to load
  torchloom_test::write_file(failing_load.path() / "1" / "model.pt", "not a TorchScript file");
  const auto x = torch::randn({2, 8});

  const auto cycle = [&](int i) {
    switch (i % 4) {
      case 0: {
        torchloom::model_runner<torchloom::torchscript_loader> r(
            torchloom::model_spec::from_directory(linear_dir / "linear"));
        REQUIRE(r.run({x})[0].size(1) == 4);
        break;
      }
      case 1: {
        hooked_runner r(torchloom::model_spec::from_directory(hooked.path()));
        REQUIRE(torch::equal(r.run({hooked.keys})[0], hooked.expected()));
        break;
      }
      case 2:
        REQUIRE_THROWS_AS(hooked_runner(torchloom::model_spec::from_directory(failing_hook.path())),
                          torchloom::error);
        break;
      default:
        REQUIRE_THROWS_AS(hooked_runner(torchloom::model_spec::from_directory(failing_load.path())),
                          torchloom::error);
        break;
    }
  };
  for (int i = 0; i < 100; ++i) cycle(i);  // allocator pools and torch's caches settle
  const auto before = current_usage();
  for (int i = 0; i < 500; ++i) cycle(i);
  const auto halfway = current_usage();
  for (int i = 500; i < 1000; ++i) cycle(i);
  const auto after = current_usage();
  WARN("RSS KiB: " << before.rss_kib << " -> " << halfway.rss_kib << " -> " << after.rss_kib
                   << "; fds " << before.fds << " -> " << after.fds << "; mappings "
                   << before.mappings << " -> " << after.mappings << "; libraries "
                   << before.libraries.size() << " -> " << after.libraries.size());
  CHECK(after.fds == before.fds);
  CHECK(after.libraries == before.libraries);
  CHECK_FALSE(is_loaded(hooked.path() / so("tl_test_hook")));
  // A leak of 8 KiB per cycle would add 8 MiB; allocator noise is far below that, and the
  // second half of the cycles must add no more than the first settles.
  CHECK(after.rss_kib - before.rss_kib < 8 * 1024);
  CHECK(after.rss_kib - halfway.rss_kib < 4 * 1024);
  CHECK(table_count() == 0);
}
