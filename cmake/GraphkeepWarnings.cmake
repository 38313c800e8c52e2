# -Wall -Wextra on the project's own code; third-party headers (Torch, Boost)
# come in as SYSTEM includes so their warnings stay out.
include_guard(GLOBAL)

function(graphkeep_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${GRAPHKEEP_WERROR}>>:-Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>)
endfunction()

# Sanitizers apply to every target of the build (library, tests, tools), so a
# static graphkeep links into sanitized executables.
if(GRAPHKEEP_SANITIZE)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${GRAPHKEEP_SANITIZE}>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=all>)
  add_link_options(-fsanitize=${GRAPHKEEP_SANITIZE})
endif()

# graphkeep_cuda_objects(<target> <dir>)
# Compiles every .cu in <dir> into an object library linked into graphkeep.
# The .cu files hold device kernels and plain launchers only (no Torch or
# Boost headers), built as C++17 for GRAPHKEEP_CUDA_ARCHITECTURES: nvcc
# stays fast, and Torch's C++20 flags stay away from it.
function(graphkeep_cuda_objects target dir)
  if(NOT GRAPHKEEP_CUDA)
    return()
  endif()
  file(GLOB _cu CONFIGURE_DEPENDS ${dir}/*.cu)
  if(NOT _cu)
    return()
  endif()
  add_library(${target} OBJECT ${_cu})
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${GRAPHKEEP_CUDA_ARCHITECTURES}"
                        CUDA_STANDARD 17 POSITION_INDEPENDENT_CODE ON CUDA_RUNTIME_LIBRARY Shared)
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_options(${target} PRIVATE -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter)
  target_sources(graphkeep PRIVATE $<TARGET_OBJECTS:${target}>)
endfunction()
