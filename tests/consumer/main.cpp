// A kernel author's first use of an installed graphkeep: declare a class,
// list its slots, and check that the generated visitor finds its workspace
// and its aliased stride array. Prints "consumer ok" and exits 0 on success.
#include <graphkeep/registry.h>

#include <ATen/ops/zeros.h>

#include <cstdio>

namespace consumer {

class GroupedGemm {
 public:
  GroupedGemm() : workspace_(at::zeros({8}, at::kInt)), ab_strides_(at::zeros({4}, at::kLong)), c_strides_(ab_strides_) {}

 private:
  at::Tensor workspace_;
  at::Tensor ab_strides_;
  at::Tensor c_strides_;  // the same storage as ab_strides_
  int num_experts_ = 4;

  GRAPHKEEP_DESCRIBE(GroupedGemm, (workspace_, gk::workspace(gk::Init::zero)), (ab_strides_, gk::metadata),
                     (c_strides_, gk::metadata), num_experts_)
};

}  // namespace consumer

int main() {
  using R = gk::Registry<gk::TypeList<consumer::GroupedGemm>>;
  constexpr auto table = R::table();
  static_assert(table.size() == 3, "three declared tensor members");

  consumer::GroupedGemm gemm;
  int slots = 0, aliased = 0;
  gk::for_each_slot(gemm, [&](const gk::Slot& s) {
    ++slots;
    if (s.paths.size() == 2) ++aliased;
    std::printf("slot %s (%zu path(s))\n", s.path().c_str(), s.paths.size());
  });
  if (slots != 2 || aliased != 1) {
    std::fprintf(stderr, "consumer: expected 2 slots, 1 aliased; got %d, %d\n", slots, aliased);
    return 1;
  }
  std::printf("consumer ok\n");
  return 0;
}
