#include <graphkeep/core/check.h>
#include <graphkeep/runtime/host_stream.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

namespace gk::hostrt {
namespace {

struct ThreadCapture {
  std::vector<Launch>* launches = nullptr;
  std::vector<at::Tensor>* pool = nullptr;
};
thread_local ThreadCapture t_capture;

struct View {
  void* ptr;
  std::vector<int64_t> sizes, strides;
  at::TensorOptions options;
};

View view_of(const at::Tensor& t) {
  return {t.data_ptr(), t.sizes().vec(), t.strides().vec(), t.options()};
}

}  // namespace

void Recording::replay() const {
  for (const Launch& l : launches_) l.fn();
}

void launch(std::string_view name, std::vector<Access> accesses, std::function<void()> fn) {
  if (t_capture.launches == nullptr) {
    fn();
    return;
  }
  t_capture.launches->push_back(Launch{std::string(name), std::move(accesses), std::move(fn)});
}

void launch(std::string_view name, std::initializer_list<Access> accesses, std::function<void()> fn) {
  launch(name, std::vector<Access>(accesses), std::move(fn));
}

bool capturing() noexcept { return t_capture.launches != nullptr; }

at::Tensor empty(at::IntArrayRef sizes, at::TensorOptions options) {
  at::Tensor t = at::empty(sizes, options);
  if (t_capture.pool != nullptr) t_capture.pool->push_back(t);
  return t;
}

CaptureScope::CaptureScope() {
  GK_CHECK(StateError, t_capture.launches == nullptr,
           "a host capture is already active on this thread; captures do not nest");
  t_capture = {&rec_.launches_, &rec_.pool_};
}

CaptureScope::~CaptureScope() {
  if (active_) t_capture = {};
}

Recording CaptureScope::finish() {
  GK_CHECK(StateError, active_, "this host capture has already finished");
  t_capture = {};
  active_ = false;
  return std::move(rec_);
}

Recording capture(const std::function<void()>& body) {
  CaptureScope scope;
  body();
  return scope.finish();
}

void launch_aten(std::string_view name, const std::vector<at::Tensor>& inputs,
                 const std::vector<at::Tensor>& outputs, AtenBody body) {
  std::vector<Access> accesses;
  std::vector<View> in_views, out_views;
  for (const at::Tensor& t : inputs) {
    accesses.push_back(reads(t));
    in_views.push_back(view_of(t));
  }
  for (const at::Tensor& t : outputs) {
    accesses.push_back(writes(t));
    out_views.push_back(view_of(t));
  }
  launch(name, std::move(accesses), [in_views, out_views, body = std::move(body)] {
    auto materialize = [](const std::vector<View>& vs) {
      std::vector<at::Tensor> ts;
      ts.reserve(vs.size());
      for (const View& v : vs) ts.push_back(at::from_blob(v.ptr, v.sizes, v.strides, v.options));
      return ts;
    };
    std::vector<at::Tensor> in = materialize(in_views);
    std::vector<at::Tensor> out = materialize(out_views);
    body(in, out);
  });
}

}  // namespace gk::hostrt
