// graphkeep/runtime/host_stream.h
//
// The host runtime: a CPU stand-in for a CUDA stream with graph capture, so
// that the burn-in semantics of CUDA graphs can be tested on machines without
// a GPU (CI).
//
// A CPU kernel "launches" a closure that holds *raw pointers*, exactly like a
// CUDA kernel's arguments. Outside a capture the closure runs at once. Inside
// a capture it is recorded, not run; replaying the recording runs every
// closure again with the same pointers, whatever the tensors that owned them
// have become since. A reload that moves a tensor therefore breaks a host
// replay the same way it breaks a CUDA graph replay: stale values or freed
// memory, never a silent fix.
//
//   // in a kernel's CPU path
//   const float* a = x.data_ptr<float>();
//   float* c = out.data_ptr<float>();
//   gk::hostrt::launch("scale_rows", {gk::hostrt::reads(a, x.nbytes()), gk::hostrt::writes(c, out.nbytes())},
//                      [=] { scale_rows_cpu(a, c, m, n); });
//
//   // in a runner
//   gk::hostrt::Recording rec = gk::hostrt::capture([&] { out = model.forward(in); });
//   rec.replay();
//
// Tensors allocated with gk::hostrt::empty during a capture come from the
// recording's private pool and live as long as the recording, like the
// private memory pool of a CUDA graph.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace gk::hostrt {

// A memory range a launch touches: what the capture manifest records.
struct Access {
  const void* ptr = nullptr;
  std::size_t bytes = 0;
  bool write = false;
};
inline Access reads(const void* p, std::size_t bytes) { return {p, bytes, false}; }
inline Access writes(const void* p, std::size_t bytes) { return {p, bytes, true}; }
inline Access reads(const at::Tensor& t) { return {t.data_ptr(), t.nbytes(), false}; }
inline Access writes(const at::Tensor& t) { return {t.data_ptr(), t.nbytes(), true}; }

struct Launch {
  std::string name;
  std::vector<Access> accesses;
  std::function<void()> fn;
};

// What a capture recorded: the launches in order and the private pool.
class Recording {
 public:
  // Runs every recorded launch in order, with the pointers burned in at capture.
  void replay() const;
  const std::vector<Launch>& launches() const noexcept { return launches_; }
  const std::vector<at::Tensor>& pool() const noexcept { return pool_; }
  bool empty() const noexcept { return launches_.empty(); }

 private:
  friend class CaptureScope;
  std::vector<Launch> launches_;
  std::vector<at::Tensor> pool_;
};

// Runs `fn` now, or records it when a capture is active on this thread.
void launch(std::string_view name, std::initializer_list<Access> accesses, std::function<void()> fn);
void launch(std::string_view name, std::vector<Access> accesses, std::function<void()> fn);

// True while a capture is active on this thread.
bool capturing() noexcept;

// An uninitialized tensor: from the active capture's pool, else a plain one.
at::Tensor empty(at::IntArrayRef sizes, at::TensorOptions options);

// Begins a capture on this thread; `finish()` ends it and returns the
// recording. Captures do not nest. Destroying an unfinished scope abandons
// the capture.
class CaptureScope {
 public:
  CaptureScope();
  ~CaptureScope();
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;
  Recording finish();

 private:
  Recording rec_;
  bool active_ = true;
};

// Captures everything `body` launches on this thread.
Recording capture(const std::function<void()>& body);

// Launches an ATen computation with host-graph semantics: the tensors'
// pointers, sizes and strides are burned in, and at replay the closure gets
// fresh views over the same memory.
//
//   gk::hostrt::launch_aten("aten::mm", {a, b}, {c}, [](auto& in, auto& out) {
//     at::mm_out(out[0], in[0], in[1]);
//   });
using AtenBody = std::function<void(std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs)>;
void launch_aten(std::string_view name, const std::vector<at::Tensor>& inputs,
                 const std::vector<at::Tensor>& outputs, AtenBody body);

}  // namespace gk::hostrt
