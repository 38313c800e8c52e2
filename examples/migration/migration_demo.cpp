// gk-migration-demo: the migrated kernel (step 2 of router_kernel.h) under a
// reload: graphkeep lists its slots, and after PWAL rebuilds the kernel object
// its tensors are back at the captured addresses, with the new values.
#include "router_layer.h"

#include <graphkeep/reload/reload_engine.h>

#include <cstdio>

int main() {
  using migration::RouterLayer;
  at::NoGradGuard no_grad;
  auto layer = std::make_shared<RouterLayer>(/*experts=*/4, /*dim=*/8);
  gk::InMemorySource first({{"weight", at::arange(32, at::kFloat).reshape({4, 8})}});
  gk::load_weights(*layer, first);

  std::puts("slots of TopKRouterKernel (gk::slot_table, compile time):");
  for (const gk::TableEntry& e : gk::slot_table<migration::TopKRouterKernel>())
    std::printf("  %-16s %-16s init %s\n", e.path().c_str(), std::string(gk::to_string(e.role.role)).c_str(),
                std::string(gk::to_string(e.role.effective_init())).c_str());

  gk::ReloadEngine engine(*layer);
  engine.prepare();
  const void* bias_before = layer->kernel().expert_bias().data_ptr();
  const void* counts_before = layer->kernel().expert_counts().data_ptr();
  gk::InMemorySource update({{"weight", at::ones({4, 8})}});
  const gk::ReloadReport r = engine.reload(update);
  std::printf("%s\n", r.summary().c_str());
  const bool same = layer->kernel().expert_bias().data_ptr() == bias_before &&
                    layer->kernel().expert_counts().data_ptr() == counts_before;
  const bool values = at::equal(layer->kernel().expert_bias(), at::full({4}, -1.0f));
  std::printf("expert_bias_ and expert_counts_ kept their captured addresses: %s; new values: %s\n",
              same ? "yes" : "NO", values ? "yes" : "NO");
  return same && values ? 0 : 1;
}
