// reload/patch_stage.h: what stage(const Patch&) hands to commit()
// (internal to the reload layer; Note [Applying a patch] in patch_stage.cpp).
#pragma once

#include "patch_scatter.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gk {

struct StagedPatch {
  // Per layer of the plan: the patch touches it; its PWAL ran again, and its
  // staged tensors are in the staged reload's runs (the others are written
  // by `writes` alone).
  std::vector<char> touched, rerun;
  // The changed elements of the tensors that land unchanged in captured
  // storage, and the elements they overwrite (the commit's undo).
  std::vector<ScatterItem> writes, undo;
  // gk::testing::EngineHooks::verify_served: the captured tensors the commit writes,
  // with their names and target hashes.
  std::vector<at::Tensor> verify;
  std::vector<std::string> verify_names;
  std::vector<std::uint64_t> verify_hashes;
  // The commit wrote `undo` back after a failure: captured storage is as before.
  bool undone = false;

  bool any_rerun() const {
    for (char r : rerun)
      if (r) return true;
    return false;
  }
};

}  // namespace gk
