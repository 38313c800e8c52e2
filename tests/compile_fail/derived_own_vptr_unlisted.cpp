// A polymorphic class whose registered base is not polymorphic: its own vptr
// comes first, then the base, then its members. Without GK_BREAK this checks
// that the layout check accounts for that vptr; with it, that an unlisted
// tensor after the base is still caught.
#include <graphkeep/registry.h>

#include <cstdint>

namespace mla {

class MlaWeights {  // not polymorphic
 protected:
  at::Tensor w_kc_;
  at::Tensor w_vc_;
  GRAPHKEEP_DESCRIBE(MlaWeights, (w_kc_, gk::derived_weight), (w_vc_, gk::derived_weight))
};

class FlashMlaAttention : public MlaWeights {
 public:
  virtual ~FlashMlaAttention() = default;
  virtual int64_t heads() const { return num_heads_; }

 private:
  at::Tensor tile_scheduler_metadata_;
#ifdef GK_BREAK
  at::Tensor num_splits_;  // not in the descriptor
#endif
  int64_t num_heads_ = 128;

  GRAPHKEEP_DESCRIBE_DERIVED(FlashMlaAttention, (MlaWeights), (tile_scheduler_metadata_, gk::metadata),
                             num_heads_)
};

}  // namespace mla
