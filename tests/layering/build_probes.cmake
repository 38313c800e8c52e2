# Builds each layering probe; the three that cross a layer the wrong way must
# fail on the forbidden header, the allowed one must build.
set(_ok 0)
foreach(_spec "kernels_uses_reload|graphkeep/reload/reload_engine.h"
              "registry_uses_model|graphkeep/model/layer.h"
              "quant_uses_kernels|graphkeep/kernels/moe_experts.h"
              "allowed|-")
  string(REPLACE "|" ";" _spec "${_spec}")
  list(GET _spec 0 _probe)
  list(GET _spec 1 _header)
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target gk_layering_probe_${_probe}
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  if(_header STREQUAL "-")
    if(_rc EQUAL 0)
      math(EXPR _ok "${_ok} + 1")
      message("layering: probe ${_probe} builds, as it must")
    else()
      message("layering: probe ${_probe} should build but failed:\n${_out}")
    endif()
  elseif(NOT _rc EQUAL 0 AND _out MATCHES "${_header}: No such file or directory")
    math(EXPR _ok "${_ok} + 1")
    message("layering: probe ${_probe} is rejected by the build: ${_header}: No such file or directory")
  else()
    message("layering: probe ${_probe} should fail on ${_header} but did not (exit ${_rc}):\n${_out}")
  endif()
endforeach()
message("layering: ${_ok} of 4 probes as expected")
