// The positive control: what a kernel class may include compiles.
#include <graphkeep/core/check.h>
#include <graphkeep/model/layer.h>
#include <graphkeep/numerics/exact_math.h>
#include <graphkeep/registry.h>
#include <graphkeep/runtime/device.h>
#include <graphkeep/runtime/host_stream.h>
