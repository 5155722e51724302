#pragma once
#include <torchloom/libraries/op_libraries.hpp>
#include <torchloom/model_spec.hpp>

namespace torchloom::detail {

//! A runner's construction step: loads the model's OP_LIBRARIES, before the hook and the
//! model, which may need the operators they register. Throws as load_op_libraries. The
//! libraries stay loaded for the process (see libraries/op_libraries.hpp): there is nothing
//! to undo.
struct model_op_libraries {
  explicit model_op_libraries(const model_spec& spec) {
    load_op_libraries(spec.name, spec.directory, spec.options.op_libraries);
  }
};

}  // namespace torchloom::detail
