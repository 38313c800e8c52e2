// quant/cuda/marlin_launch.h: the plain CUDA launchers of the Marlin family
// (sites 5 and 6). The argument structs live in marlin_splitk.h, shared with
// the CPU twins in quant/marlin.cpp.
#pragma once

#include "marlin_splitk.h"

#include <cstdint>

namespace gk::quant::cuda {

// Split-K GEMMs under the lock protocol of marlin_splitk.h: a grid of
// (groups * tiles) x slices blocks on `stream` (an opaque cudaStream_t).
void launch_marlin_w4a16(const marlin::W4A16Args& a, const marlin::SplitK& c, void* stream);
void launch_marlin_fp8(const marlin::Fp8Args& a, const marlin::SplitK& c, void* stream);
void launch_marlin_fp4(const marlin::Fp4Args& a, const marlin::SplitK& c, void* stream);
void launch_marlin_moe(const marlin::MoeArgs& a, const marlin::SplitK& c, void* stream);

// expert_ids[row] = marlin::route_row(x, gate, row, experts, k) for row < m.
void launch_marlin_moe_route(const float* x, const float* gate, std::int32_t* expert_ids, std::int64_t m,
                             std::int64_t experts, std::int64_t k, void* stream);

}  // namespace gk::quant::cuda
