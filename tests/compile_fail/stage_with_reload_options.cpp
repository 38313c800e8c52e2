// A stage given a reload's options: a stage is transactional and never
// accepts a mismatch, so ReloadOptions::mode and on_mismatch would be
// silently ignored (Note [Options per call, protections per engine] in
// reload/run_options.h). The call is refused at compile time.
#include <graphkeep/reload/reload_engine.h>

gk::StagedReload stage_next(gk::ReloadEngine& engine, gk::WeightSource& source) {
  gk::ReloadOptions options;
  options.mode = gk::ReloadMode::streaming;
  options.adopt_source_tensors = true;
#ifdef GK_BREAK
  return engine.stage(source, options);
#else
  return engine.stage(source, options.stage());
#endif
}
