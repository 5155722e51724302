#pragma once
//! Everything in torchloom that needs no CUDA headers.
#include <torchloom/concepts/hook_policy.hpp>
#include <torchloom/concepts/loader.hpp>
#include <torchloom/concepts/residency_policy.hpp>
#include <torchloom/concepts/stream_policy.hpp>
#include <torchloom/error.hpp>
#include <torchloom/hook/no_hook.hpp>
#include <torchloom/loader/torchscript.hpp>
#include <torchloom/model_runner.hpp>
#include <torchloom/model_spec.hpp>
#include <torchloom/options.hpp>
#include <torchloom/residency/resident.hpp>
#include <torchloom/signature.hpp>
#include <torchloom/stream/caller.hpp>
#include <torchloom/triton_config.hpp>
#include <torchloom/version.hpp>
