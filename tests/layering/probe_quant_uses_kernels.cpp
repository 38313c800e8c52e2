// kernels and quant are siblings: neither includes the other.
#include <graphkeep/kernels/moe_experts.h>
