// The registry knows tensors and reflection, nothing of model layers.
#include <graphkeep/model/layer.h>
