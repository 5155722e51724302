#pragma once
#include <cstdint>

namespace torchloom {

//! Eager runs graphed<Stream> makes of a new input signature before capturing it: TorchScript's
//! profiling executor settles its plan, and libraries create their handles, outside the
//! capture.
inline constexpr int graph_eager_runs_before_capture = 2;

//! What graphed<Stream> has done since the runner was built (all zero on a CPU device).
struct graph_stats {
  std::int64_t captures = 0;       //!< capture attempts, failed ones included
  std::int64_t replays = 0;        //!< runs served by replaying a graph
  std::int64_t eager_runs = 0;     //!< runs that ran the model directly
  std::int64_t evictions = 0;      //!< graphs dropped to keep CUDA_GRAPH_MAX_SHAPES
  std::int64_t uncapturable = 0;   //!< signatures whose capture failed (they run eagerly)
  std::int64_t cached_graphs = 0;  //!< graphs held now
};

}  // namespace torchloom
