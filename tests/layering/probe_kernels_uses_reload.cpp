// A kernel class must not call the reload engine: kernels sit below reload.
#include <graphkeep/reload/reload_engine.h>
