#pragma once
//! The copy engine behind streamed_weights: the device arena, the copy stream and the events,
//! and the fetch operator's implementation. On a CPU device the same schedule runs with plain
//! memory copies.
#include <torchloom/weights/weight_stream_copy.hpp>
#include <torchloom/weights/weight_stream_decl.hpp>
#include <torchloom/weights/weight_stream_prepare.hpp>
