// A polymorphic class (vptr in its registered base) described with
// GRAPHKEEP_DESCRIBE_DERIVED, with an at::Tensor member the descriptor does
// not list. The base's footprint (vptr included) is accounted for; the
// unlisted member is not.
#include <graphkeep/registry.h>

#include <cstdint>

namespace moe {

class MoeExperts {
 public:
  virtual ~MoeExperts() = default;
  virtual int64_t num_experts() const = 0;

 protected:
  at::Tensor w13_;
  at::Tensor w2_;
  GRAPHKEEP_DESCRIBE(MoeExperts, (w13_, gk::derived_weight), (w2_, gk::derived_weight))
};

class CutlassExperts final : public MoeExperts {
 public:
  explicit CutlassExperts(int64_t e) : num_experts_(e) {}
  int64_t num_experts() const override { return num_experts_; }

 private:
  at::Tensor ab_strides1_;
#ifdef GK_BREAK
  at::Tensor problem_sizes1_;  // not in the descriptor
#endif
  int64_t num_experts_ = 0;

  GRAPHKEEP_DESCRIBE_DERIVED(CutlassExperts, (MoeExperts), (ab_strides1_, gk::metadata),
                             num_experts_)
};

}  // namespace moe
