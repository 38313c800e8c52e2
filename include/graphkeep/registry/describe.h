// graphkeep/registry/describe.h
//
// GRAPHKEEP_DESCRIBE: how a class with private members and constructors (a
// kernel, a quantization method, a layer) declares its members to the
// registry. Built on Boost.Describe (see docs/registry.md for the measured
// compile cost against Boost.Hana).
//
// List *every* data member, in declaration order, inside the class. Tensor
// members get a role; other members are listed bare:
//
//   class MarlinKernel {
//    public:
//     MarlinKernel(int64_t n, int64_t k, at::Device d);
//     ...
//    private:
//     at::Tensor workspace_;           // split-K lock counters
//     at::Tensor g_idx_sort_indices_;
//     int64_t size_n_, size_k_;
//
//     GRAPHKEEP_DESCRIBE(MarlinKernel,
//                        (workspace_, gk::workspace(gk::Init::zero)),
//                        (g_idx_sort_indices_, gk::permutation),
//                        size_n_, size_k_)
//   };
//
// With base classes, name them first:
//
//   GRAPHKEEP_DESCRIBE_DERIVED(CutlassExperts, (MoeExperts), (ab_strides1_, gk::metadata), ...)
//
// The macro checks the class when it is defined (see Note [Fail-closed
// descriptors]) and reports, with the class and member named:
//   - a tensor member without a role, or a role on a non-tensor member;
//   - a member missing from the list (a layout check: every 8-byte-aligned
//     region of the object must belong to a listed member or a base, so an
//     unlisted at::Tensor is always caught);
//   - a member listed twice;
//   - a member whose type holds tensors but is not registered, a callable, a
//     raw pointer or a class graphkeep cannot look into, unless declared
//     gk::opaque("reason");
//   - a base (GRAPHKEEP_DESCRIBE_DERIVED) that is not registered;
//   - a listed name that is not a member of the class (exactly one error,
//     graphkeep's, naming the class and the name; nothing that uses the
//     name is instantiated, not even in a walk or slot table of the class).
// Each error points at the user's descriptor line: at the member's name, or
// at the class's name for whole-class checks. For an unlisted member, a
// second error names the listed members on either side of the unlisted bytes
// (see docs/registry.md, "The layout check and its limits").
//
// The machinery (GK_DETAIL_* macros, gk::detail helpers) is private, in
// detail/describe_pp.h and detail/descriptor.h.
#pragma once

#include <graphkeep/registry/detail/describe_pp.h>

// Describes a class without bases. Place it inside the class, after the
// members; see the header comment for the entry syntax.
#define GRAPHKEEP_DESCRIBE(C, ...) GK_DETAIL_DESCRIBE(C, (), __VA_ARGS__)

// Describes a class with bases: BASES is a parenthesized list, e.g. (Base).
// Each base must be registered itself, a torch::nn::Module, an empty class or
// a pure interface.
#define GRAPHKEEP_DESCRIBE_DERIVED(C, BASES, ...) GK_DETAIL_DESCRIBE_DERIVED(C, BASES, __VA_ARGS__)
