// The communicator (collective.h): c10d broadcast and allgather.
#include <graphkeep/distributed/collective.h>

#include <graphkeep/core/check.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <utility>
#include <vector>

namespace gk {

Collective::Collective(c10::intrusive_ptr<c10d::ProcessGroup> group) : group_(std::move(group)) {
  GK_CHECK(StateError, group_.defined(), "gk::Collective needs a process group, got a null one");
}
Collective::Collective(c10::intrusive_ptr<c10d::Backend> backend) : backend_(std::move(backend)) {
  GK_CHECK(StateError, backend_.defined(), "gk::Collective needs a c10d backend, got a null one");
}
Collective::Collective(const Collective&) = default;
Collective& Collective::operator=(const Collective&) = default;
Collective::~Collective() = default;

int Collective::rank() const { return group_ ? group_->getRank() : backend_->getRank(); }
int Collective::size() const { return group_ ? group_->getSize() : backend_->getSize(); }

void Collective::broadcast(at::Tensor& t, int root) const {
  std::vector<at::Tensor> v{t};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  auto work = group_ ? group_->broadcast(v, o) : backend_->broadcast(v, o);
  work->wait();
}

std::vector<at::Tensor> Collective::allgather(const at::Tensor& t) const {
  std::vector<at::Tensor> in{t};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < size(); ++r) out[0].push_back(at::empty_like(t));
  auto work = group_ ? group_->allgather(out, in) : backend_->allgather(out, in);
  work->wait();
  return out[0];
}

}  // namespace gk
