#pragma once
// The test plug-ins of tests/plugins (op libraries, hook libraries) and the files they read:
// copying a plug-in where a model expects it, the embedding tables the hook loads from
// weights/*.bin, and the model that calls the op library's tl_test::lookup on them. Shared by
// the hook and library tests and the Triton backend's tests.
#include "catch.hpp"
#include "fixtures.hpp"

#include <torch/script.h>

#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace torchloom_test {

//! A plug-in's file name: lib<name>.so.
inline std::string so(const std::string& name) { return "lib" + name + ".so"; }

//! Copies `from` to `to` with `mode` (std::filesystem::copy_file is avoided for the reason
//! temp_dir gives).
inline void copy_file_with_mode(const fs::path& from, const fs::path& to, mode_t mode = 0755) {
  fs::create_directories(to.parent_path());
  {
    std::ifstream in(from, std::ios::binary);
    REQUIRE(in);
    std::ofstream out(to, std::ios::binary | std::ios::trunc);
    out << in.rdbuf();
  }
  REQUIRE(::chmod(to.c_str(), mode) == 0);
}

//! Copies the plug-in `name` built in tests/plugins into `dir`; returns the copy's path.
inline fs::path install_plugin(const std::string& name, const fs::path& dir, mode_t mode = 0755) {
  copy_file_with_mode(fs::path(TL_TEST_PLUGIN_DIR) / so(name), dir / so(name), mode);
  return dir / so(name);
}

//! Writes `t` (2-D float) as the embedding table of `layer` in the hook's file format.
inline void write_table(const fs::path& file, std::int32_t layer, const at::Tensor& t) {
  fs::create_directories(file.parent_path());
  std::ofstream out(file, std::ios::binary);
  const std::int64_t rows = t.size(0);
  const std::int64_t cols = t.size(1);
  out.write("TLTB", 4);
  out.write(reinterpret_cast<const char*>(&layer), sizeof layer);
  out.write(reinterpret_cast<const char*>(&rows), sizeof rows);
  out.write(reinterpret_cast<const char*>(&cols), sizeof cols);
  out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
}

//! The embedding model: tl_test::lookup(keys, 0) * 2 + tl_test::lookup(keys, 1), on the
//! tables the hook registers. Defining it needs the op library loaded in this process.
inline torch::jit::Module make_embed_module() {
  torch::jit::Module m("embed");
  m.register_parameter("scale", torch::tensor({2.0F}), false);
  define_with_ops(m, R"(
def forward(self, keys):
    return tl_test.lookup(keys, 0) * self.scale + tl_test.lookup(keys, 1)
)",
                  {"tl_test"});
  return m;
}

//! What the embedding model computes for `keys` on the tables `table0` and `table1`.
inline at::Tensor embed_reference(const at::Tensor& table0, const at::Tensor& table1,
                                  const at::Tensor& keys) {
  return table0.index_select(0, keys) * 2.0 + table1.index_select(0, keys);
}

}  // namespace torchloom_test
