// python/src/bindings.h
//
// What the extension's sources share: pybind11 with torch's casters for
// at::Tensor, c10::Device and friends (torch/csrc/utils/pybind.h; Note
// [pybind11 headers: torch's copy] in python/CMakeLists.txt), and the
// binding functions each source defines for module.cpp.
#pragma once

#include <torch/csrc/utils/pybind.h>

#include <pybind11/stl.h>

namespace gkpy {

namespace py = pybind11;

// engine.cpp: graphkeep._C._LlmEngine, _StagedReload, ReloadReport.
void bind_engine(py::module_& m);
// patch.cpp: Patch, PatchEntry, make_patch, read_patch, content hashes, ServedWeights.
void bind_patch(py::module_& m);

}  // namespace gkpy
