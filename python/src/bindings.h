// python/src/bindings.h
//
// What the extension's sources share: pybind11 with torch's casters for
// at::Tensor, c10::Device and friends (torch/csrc/utils/pybind.h; Note
// [pybind11 headers: torch's copy] in python/CMakeLists.txt), and the
// binding functions each source defines for module.cpp.
#pragma once

#include <torch/csrc/utils/pybind.h>

#include <pybind11/stl.h>

#include <graphkeep/sources/weight_source.h>

#include <vector>

namespace gkpy {

namespace py = pybind11;

// A dict of name -> tensor, unwrapped (no copy) while the GIL is held; a
// TypeError names `arg` and the entry at fault.
std::vector<gk::NamedTensor> named_tensors(const py::dict& d, const char* arg);

// engine.cpp: graphkeep._C._LlmEngine, _StagedReload, ReloadReport.
void bind_engine(py::module_& m);
// patch.cpp: Patch, PatchEntry, make_patch, read_patch, content hashes, ServedWeights.
void bind_patch(py::module_& m);

}  // namespace gkpy
