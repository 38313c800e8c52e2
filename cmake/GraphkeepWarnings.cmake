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

