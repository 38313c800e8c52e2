# Helpers to register graphkeep's tests with ctest.
include_guard(GLOBAL)

# gk_add_doctest(<name> LABELS <labels...> SOURCES <files...> [LIBS <libs...>])
# A doctest binary, run as one ctest test. It fails when doctest's summary
# counts no assertion (see Note [doctest vs glog CHECK] in gk_test.h) and is
# "skipped" when it exits with 77 (a gpu binary on a machine without a GPU).
#
# GPU_SUITES: the binary also holds doctest suites named gpu*; they are left
# out of the test above and registered as <name>_gpu (label gpu), run with
# --gk-gpu so they skip without a CUDA device.
function(gk_add_doctest name)
  cmake_parse_arguments(T "GPU_SUITES" "" "LABELS;SOURCES;LIBS;ARGS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE gk_test_main ${T_LIBS})
  target_precompile_headers(${name} REUSE_FROM gk_test_main)
  graphkeep_warnings(${name})
  set(_args ${T_ARGS})
  if(T_GPU_SUITES)
    list(APPEND _args "-tse=gpu*")
    add_test(NAME ${name}_gpu COMMAND ${name} --gk-gpu "-ts=gpu*")
    set_tests_properties(${name}_gpu PROPERTIES LABELS gpu
      FAIL_REGULAR_EXPRESSION "assertions: +0 +\\|" SKIP_RETURN_CODE 77)
  endif()
  add_test(NAME ${name} COMMAND ${name} ${_args})
  set_tests_properties(${name} PROPERTIES
    LABELS "${T_LABELS}"
    FAIL_REGULAR_EXPRESSION "assertions: +0 +\\|"
    SKIP_RETURN_CODE 77)
endfunction()

# The flags that compile a test source against graphkeep's headers directly
# (for tests that run the compiler). Boost's CONFIG package reports
# /usr/include; passed as -isystem it would reorder the compiler's own search
# path and break libstdc++'s #include_next <stdlib.h>, so implicit
# directories are left out.
function(_gk_compiler_flags out)
  set(_flags -std=c++20 -fsyntax-only -I${PROJECT_SOURCE_DIR}/include)
  set(_dirs ${TORCH_INCLUDE_DIRS} ${Boost_INCLUDE_DIRS})
  if(CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)
    list(REMOVE_ITEM _dirs ${CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES})
  endif()
  foreach(_dir ${_dirs})
    list(APPEND _flags -isystem ${_dir})
  endforeach()
  set(${out} ${_flags} PARENT_SCOPE)
endfunction()

# gk_add_output_test(<name> REGEX <regex> [EXIT <status>|NONZERO] [LABELS <labels...>]
#                    COMMAND <command> [args...])
# A test that passes only if <command> exits with <status> (default 0; NONZERO:
# any failure status) AND its output matches <regex> (CMake regex syntax, as
# PASS_REGULAR_EXPRESSION takes it; no semicolons). ctest ignores the exit
# status of a test with PASS_REGULAR_EXPRESSION, so output-matched tests run
# through tests/support/expect_output.cmake instead (Note [Output-matched
# tests check the exit status] there). A <command> that names a target runs
# that target's file.
function(gk_add_output_test name)
  cmake_parse_arguments(PARSE_ARGV 1 T "" "REGEX;EXIT" "LABELS;COMMAND")
  if(NOT T_COMMAND OR "${T_REGEX}" STREQUAL "")
    message(FATAL_ERROR "gk_add_output_test(${name}): REGEX and COMMAND are required")
  endif()
  if(T_REGEX MATCHES ";")
    message(FATAL_ERROR "gk_add_output_test(${name}): the regex has a semicolon (a CMake list separator), use . instead")
  endif()
  if(NOT DEFINED T_EXIT)
    set(T_EXIT 0)
  endif()
  list(GET T_COMMAND 0 _exe)
  if(TARGET ${_exe})
    list(REMOVE_AT T_COMMAND 0)
    list(INSERT T_COMMAND 0 $<TARGET_FILE:${_exe}>)
  endif()
  add_test(NAME ${name} COMMAND ${CMAKE_COMMAND} -DEXPECT_EXIT=${T_EXIT} "-DEXPECT_REGEX=${T_REGEX}"
                                -P ${PROJECT_SOURCE_DIR}/tests/support/expect_output.cmake -- ${T_COMMAND})
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()

# gk_add_compile_check(<test name> <source path> <regex> [compiler flags...])
# A test that compiles <source path> with the extra flags and passes only if
# the compiler fails and its output matches <regex> (label compile-fail).
function(gk_add_compile_check name source regex)
  _gk_compiler_flags(_flags)
  gk_add_output_test(${name} REGEX "${regex}" EXIT NONZERO LABELS compile-fail
                     COMMAND ${CMAKE_CXX_COMPILER} ${_flags} ${ARGN} ${source})
endfunction()

# gk_add_compile_fail(<name> <source> <regex>)
# Two tests: compile_fail.<name> compiles <source> with -DGK_BREAK and passes
# only if the diagnostic matches <regex>; compile_ok.<name> compiles it
# without GK_BREAK and must succeed, so the failure is the intended one.
function(gk_add_compile_fail name source regex)
  set(_src ${CMAKE_CURRENT_SOURCE_DIR}/${source})
  gk_add_compile_check(compile_fail.${name} ${_src} "${regex}" -DGK_BREAK)
  _gk_compiler_flags(_flags)
  add_test(NAME compile_ok.${name} COMMAND ${CMAKE_CXX_COMPILER} ${_flags} ${_src})
  set_tests_properties(compile_ok.${name} PROPERTIES LABELS compile-fail)
endfunction()
