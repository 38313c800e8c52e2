// graphkeep/registry.h
//
// Everything a kernel or quantization author needs to declare a class's
// tensor members: roles, the two descriptor macros, the generated visitors
// and the static registry. See docs/registry.md for a migration walk-through.
//
//   #include <graphkeep/registry.h>
//
//   class MyKernel {
//     at::Tensor workspace_;
//     int64_t sms_;
//     GRAPHKEEP_DESCRIBE(MyKernel, (workspace_, gk::workspace(gk::Init::zero)), sms_)
//   };
#pragma once

#include <graphkeep/core/check.h>
#include <graphkeep/registry/aggregate.h>
#include <graphkeep/registry/describe.h>
#include <graphkeep/registry/for_each_slot.h>
#include <graphkeep/registry/reflect.h>
#include <graphkeep/registry/type_registry.h>
#include <graphkeep/registry/role.h>
#include <graphkeep/registry/slot_table.h>
#include <graphkeep/registry/walk.h>
