// graphkeep/registry/aggregate.h
//
// GRAPHKEEP_AGGREGATE: how a plain struct of tensors and configuration
// declares itself. Boost.PFR reflects the fields (their exact number and
// types, so an unlisted field is always caught); the macro gives the names,
// which Boost 1.81's PFR cannot, and optionally roles.
//
//   struct CutlassMoeStrides {
//     gk::Metadata ab_strides1;   // role in the type ...
//     at::Tensor c_strides1;      // ... or in the descriptor, below
//     int64_t num_experts = 0;
//   };
//   GRAPHKEEP_AGGREGATE(CutlassMoeStrides, ab_strides1, (c_strides1, gk::metadata), num_experts)
//
// Place the macro at namespace scope, in the struct's namespace, after the
// struct. List every field in declaration order. The macro checks the names
// against the fields: a name that is no field of the struct (one error, at
// the name), a field at the wrong position or listed twice.
//
// Known limit: a `std::array<at::Tensor, N>` or `at::Tensor[N]` field crashes
// g++ 12 inside PFR (an internal compiler error); use std::vector or named
// fields, or GRAPHKEEP_DESCRIBE.
#pragma once

#include <graphkeep/registry/describe.h>
#include <graphkeep/registry/detail/describe_pp.h>

// Registers aggregate T: every field, in declaration order. See above.
#define GRAPHKEEP_AGGREGATE(T, ...) GK_DETAIL_AGGREGATE(T, __VA_ARGS__)
