#pragma once
#include <torchloom/detail/strings.hpp>
#include <torchloom/option_types.hpp>

#include <boost/describe/class.hpp>

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace torchloom {

//! CUDA_GRAPH_BATCH_SIZES: the batch sizes graphed<Stream> captures, strictly increasing,
//! each 1 to 65536, written "1,2,4,8" (',' or ';' between them). Empty (the default) means
//! no buckets: every batch size is a signature of its own.
struct graph_batch_sizes {
  std::vector<std::int64_t> sizes;

  //! The smallest bucket that holds `batch`; empty when there are no buckets or `batch` is
  //! larger than the largest.
  std::optional<std::int64_t> bucket_for(std::int64_t batch) const noexcept {
    for (const std::int64_t s : sizes) {
      if (s >= batch) return s;
    }
    return std::nullopt;
  }

  static std::optional<graph_batch_sizes> parse(std::string_view text) {
    graph_batch_sizes out;
    std::string list(detail::trim(text));
    for (char& c : list) {
      if (c == ';') c = ',';
    }
    if (list.empty()) return out;
    for (const std::string& item : detail::split(list, ',')) {
      const std::string_view s = detail::trim(item);
      std::int64_t v = 0;
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (s.empty() || ec != std::errc{} || end != s.data() + s.size() || v < 1 || v > 65536) {
        return std::nullopt;
      }
      if (!out.sizes.empty() && v <= out.sizes.back()) return std::nullopt;
      out.sizes.push_back(v);
    }
    return out;
  }

  std::string format() const {
    std::string out;
    for (const std::int64_t s : sizes) {
      if (!out.empty()) out += ',';
      out += std::to_string(s);
    }
    return out;
  }

  static std::string accepted() {
    return "a list of strictly increasing batch sizes from 1 to 65536, e.g. 1,2,4,8";
  }

  friend bool operator==(const graph_batch_sizes&, const graph_batch_sizes&) = default;
};

static_assert(custom_option_value<graph_batch_sizes>);

//! The settings of graphed<Stream> (torchloom/stream/graphed.hpp), one described block that
//! runner_options takes in as a base: parsed, printed and listed with every other key.
struct graph_options {
  static constexpr std::string_view read_by = "the stream adaptor graphed<Stream>";
  //! CUDA_GRAPH_MAX_SHAPES: how many input signatures keep a captured graph; beyond that the
  //! least recently replayed one is dropped.
  bounded<int, 1, 1024> cuda_graph_max_shapes = 8;
  //! CUDA_GRAPH_BATCH_SIZES: opt-in batch buckets, for models whose rows are independent:
  //! a batch is padded to the next bucket and the outputs sliced back.
  graph_batch_sizes cuda_graph_batch_sizes;

  friend bool operator==(const graph_options&, const graph_options&) = default;
};
BOOST_DESCRIBE_STRUCT(graph_options, (), (cuda_graph_max_shapes, cuda_graph_batch_sizes))

}  // namespace torchloom
