// graphkeep._C: weight patches (graphkeep/delta, docs/delta.md) and content
// hashes, for graphkeep/patch.py. Tensors cross without a copy (Note
// [pybind11 headers: torch's copy] in python/CMakeLists.txt); every call
// releases the GIL once its arguments are C++ values.
#include "bindings.h"

#include <graphkeep/core/check.h>
#include <graphkeep/delta/make_patch.h>
#include <graphkeep/delta/patch.h>
#include <graphkeep/delta/patch_file.h>
#include <graphkeep/hashing/content_hash.h>
#include <graphkeep/reload/served_weights.h>

#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gkpy {
namespace {

}  // namespace

std::vector<gk::NamedTensor> named_tensors(const py::dict& d, const char* arg) {
  std::vector<gk::NamedTensor> out;
  out.reserve(d.size());
  for (const auto& item : d) {
    if (!py::isinstance<py::str>(item.first))
      throw py::type_error(std::string(arg) + ": names must be str, not " +
                           std::string(py::str(py::type::of(item.first).attr("__name__"))));
    const std::string name = item.first.cast<std::string>();
    if (!THPVariable_Check(item.second.ptr()))
      throw py::type_error(std::string(arg) + "['" + name + "'] is a " +
                           std::string(py::str(py::type::of(item.second).attr("__name__"))) + ", not a torch.Tensor");
    out.push_back({name, item.second.cast<at::Tensor>(), 0});
  }
  return out;
}

namespace {

gk::MakePatchOptions::Encoding encoding_of(const std::string& e) {
  if (e == "auto") return gk::MakePatchOptions::Encoding::automatic;
  if (e == "sparse") return gk::MakePatchOptions::Encoding::sparse;
  if (e == "dense") return gk::MakePatchOptions::Encoding::dense;
  throw py::value_error("encoding must be 'auto', 'sparse' or 'dense', not '" + e + "'");
}

}  // namespace

void bind_patch(py::module_& m) {
  using gk::Patch;
  using gk::PatchEntry;
  py::class_<PatchEntry>(m, "PatchEntry", "One tensor's changes in a weight patch (gk::PatchEntry).")
      .def_readonly("name", &PatchEntry::name)
      .def_readonly("shape", &PatchEntry::shape)
      .def_property_readonly("encoding",
                             [](const PatchEntry& e) { return e.encoding == gk::PatchEncoding::dense ? "dense" : "sparse"; })
      .def_readonly("base_hash", &PatchEntry::base_hash)
      .def_readonly("target_hash", &PatchEntry::target_hash)
      .def_property_readonly("indices", [](const PatchEntry& e) -> std::optional<at::Tensor> {
        return e.indices.defined() ? std::optional<at::Tensor>(e.indices) : std::nullopt;
      })
      .def_readonly("values", &PatchEntry::values)
      .def_property_readonly("count", &PatchEntry::count)
      .def_property_readonly("payload_bytes", &PatchEntry::payload_bytes)
      .def("__repr__", [](const PatchEntry& e) {
        return "<PatchEntry '" + e.name + "' " + (e.encoding == gk::PatchEncoding::dense ? "dense" : "sparse") + ", " +
               std::to_string(e.count()) + " of " + std::to_string(e.numel()) + " elements>";
      });
  py::class_<Patch>(m, "Patch", "A weight patch: the changed elements of checkpoint tensors, with content hashes.")
      .def_readonly("base_version", &Patch::base_version)
      .def_readonly("target_version", &Patch::target_version)
      .def_readonly("label", &Patch::label)
      .def_readonly("format_version", &Patch::version)
      .def_readonly("entries", &Patch::entries)
      .def_property_readonly("payload_bytes", &Patch::payload_bytes)
      .def("find", [](const Patch& p, const std::string& name) -> std::optional<PatchEntry> {
        const PatchEntry* e = p.find(name);
        return e ? std::optional<PatchEntry>(*e) : std::nullopt;
      }, py::arg("name"))
      .def("to", [](const Patch& p, const c10::Device& d) {
        py::gil_scoped_release nogil;
        return p.to(d);
      }, py::arg("device"))
      .def("to", [](const Patch& p, const std::string& name) {
        std::optional<c10::Device> d;
        try {
          d.emplace(name);
        } catch (const c10::Error&) {
          throw py::value_error("device: '" + name + "' is not a device (\"cpu\", \"cuda\", \"cuda:1\")");
        }
        py::gil_scoped_release nogil;
        return p.to(*d);
      }, py::arg("device"))
      .def("save", [](const Patch& p, const std::string& path) {
        py::gil_scoped_release nogil;
        gk::write_patch(path, p);
      }, py::arg("path"))
      .def("validate", [](const Patch& p) {
        py::gil_scoped_release nogil;
        gk::validate_patch(p);
      })
      .def("__len__", [](const Patch& p) { return p.entries.size(); });
  m.def("make_patch",
        [](const py::dict& before, const py::dict& after, const std::string& base_version,
           const std::string& target_version, const std::string& encoding, bool record_unchanged) {
          gk::MakePatchOptions o;
          o.base_version = base_version;
          o.target_version = target_version;
          o.encoding = encoding_of(encoding);
          o.record_unchanged = record_unchanged;
          const std::vector<gk::NamedTensor> b = named_tensors(before, "before"), a = named_tensors(after, "after");
          py::gil_scoped_release nogil;
          return gk::make_patch(b, a, o);
        },
        py::arg("before"), py::arg("after"), py::arg("base_version"), py::arg("target_version"),
        py::arg("encoding"), py::arg("record_unchanged"));
  m.def("read_patch", [](const std::string& path) {
    py::gil_scoped_release nogil;
    return gk::read_patch(path);
  }, py::arg("path"));
  m.def("content_hash", [](const at::Tensor& t) {
    py::gil_scoped_release nogil;
    return gk::content_hash(t);
  }, py::arg("tensor"));
  m.def("format_content_hash", &gk::format_content_hash, py::arg("hash"));

  using gk::ServedWeights;
  py::class_<ServedWeights, std::shared_ptr<ServedWeights>>(
      m, "ServedWeights", "What an engine serves: each checkpoint tensor's content hash, a version and its label.")
      .def_property_readonly("label", &ServedWeights::label)
      .def_property_readonly("content_version", &ServedWeights::content_version)
      .def_property_readonly("hashes", [](const ServedWeights& s) {
        py::dict d;
        for (const auto& [name, h] : s.hashes()) d[py::str(name)] = h;
        return d;
      })
      .def("hash", &ServedWeights::hash, py::arg("name"))
      .def_property_readonly("kept_base_tensors", &ServedWeights::kept_base_tensors)
      .def_property_readonly("kept_base_bytes", &ServedWeights::kept_base_bytes)
      .def("describe", &ServedWeights::describe)
      .def("__repr__", [](const ServedWeights& s) { return "<ServedWeights " + s.describe() + ">"; });
}

}  // namespace gkpy
