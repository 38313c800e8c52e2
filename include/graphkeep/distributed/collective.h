// graphkeep/distributed/collective.h
//
// The communicator of a distributed reload: broadcast and allgather over a
// c10d::ProcessGroup (Gloo on CPUs, NCCL on GPUs) or one c10d::Backend.
//
//   gk::Collective group(process_group);
//   group.broadcast(t, /*root=*/0);                        // t: root's values everywhere
//   std::vector<at::Tensor> all = group.allgather(mine);   // by rank
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <vector>

namespace c10d {
class ProcessGroup;
class Backend;
}  // namespace c10d

namespace gk {

// The communicator: a c10d::ProcessGroup (which picks its backend by the
// device of the tensors: Gloo for CPU, NCCL for CUDA) or a single
// c10d::Backend. Every operation is a collective over the whole group.
class Collective {
 public:
  Collective(c10::intrusive_ptr<c10d::ProcessGroup> group);  // NOLINT: implicit on purpose
  Collective(c10::intrusive_ptr<c10d::Backend> backend);     // NOLINT
  Collective(const Collective&);
  Collective& operator=(const Collective&);
  ~Collective();

  int rank() const;
  int size() const;
  // In place: `t` (contiguous) holds root's values on every rank afterwards.
  void broadcast(at::Tensor& t, int root) const;
  // Every rank's `t` (same shape, dtype and device on every rank), by rank.
  std::vector<at::Tensor> allgather(const at::Tensor& t) const;

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  c10::intrusive_ptr<c10d::Backend> backend_;
};

}  // namespace gk
