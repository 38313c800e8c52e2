// A member of a class type that is neither registered, an aggregate, empty nor
// whitelisted as tensor-free: graphkeep cannot tell what it holds.
#include <graphkeep/registry.h>

#include <cstdint>

namespace cublaslt {

class CublasLtHandle {  // owns a handle and a device workspace pointer
 public:
  CublasLtHandle() = default;
  ~CublasLtHandle() = default;

 private:
  void* handle_ = nullptr;
  void* workspace_ = nullptr;
};

class CublasLtFp8Gemm {
 public:
  CublasLtFp8Gemm() = default;

 private:
  at::Tensor scale_a_;
  CublasLtHandle handle_;
  int64_t algo_ = 0;

#ifdef GK_BREAK
  GRAPHKEEP_DESCRIBE(CublasLtFp8Gemm, (scale_a_, gk::scale), handle_, algo_)
#else
  GRAPHKEEP_DESCRIBE(CublasLtFp8Gemm, (scale_a_, gk::scale),
                     (handle_, gk::opaque("a per-process cuBLASLt handle; its workspace never moves")),
                     algo_)
#endif
};

}  // namespace cublaslt
