# expect_output.cmake: runs a command and passes only if it exits with the
# expected status AND its output (stdout and stderr together) matches a
# regular expression.
#
#   cmake -DEXPECT_EXIT=0 "-DEXPECT_REGEX=HF-CHECK PASS" -P expect_output.cmake -- <command> [args...]
#
# EXPECT_EXIT: the exit status required, a number (default 0) or NONZERO
# (any failure status; compilers differ in which). EXPECT_REGEX: CMake regex
# syntax, as PASS_REGULAR_EXPRESSION takes it (`.` matches newlines too).
#
# Note [Output-matched tests check the exit status]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A ctest test with PASS_REGULAR_EXPRESSION ignores the exit status: a
# program that prints the expected text and then fails (a later step
# throws, a check after the summary fails, a sanitizer aborts at exit)
# still passes. gk_add_output_test (cmake/GraphkeepTesting.cmake) runs every
# output-matched test through this script instead, which requires both.
# tests/CMakeLists.txt has a negative test of it: a command that prints
# the expected text and exits 3 fails here.

set(_cmd "")
set(_seen_separator FALSE)
math(EXPR _last "${CMAKE_ARGC} - 1")
foreach(_i RANGE 0 ${_last})
  if(_seen_separator)
    list(APPEND _cmd "${CMAKE_ARGV${_i}}")
  elseif(CMAKE_ARGV${_i} STREQUAL "--")
    set(_seen_separator TRUE)
  endif()
endforeach()
if(NOT _cmd)
  message(FATAL_ERROR "expect_output: no command (pass it after --)")
endif()
if(NOT DEFINED EXPECT_EXIT)
  set(EXPECT_EXIT 0)
endif()
if(NOT DEFINED EXPECT_REGEX OR EXPECT_REGEX STREQUAL "")
  message(FATAL_ERROR "expect_output: EXPECT_REGEX is not set")
endif()

execute_process(COMMAND ${_cmd} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
message(NOTICE "${_out}")  # for ctest's log

# A failure: the reason on one line (message(FATAL_ERROR) would wrap it; a
# test's regex may match it, so it has no semicolon), then the exit status 1.
function(_fail why)
  string(REPLACE ";" " " _shown "${_cmd}")
  message(NOTICE "expect_output: ${why}, from: ${_shown}")
  message(FATAL_ERROR "expect_output: failed")
endfunction()
if(EXPECT_EXIT STREQUAL "NONZERO")
  # A signal (RESULT_VARIABLE holds its name) is no expected failure.
  if(NOT _rc MATCHES "^[0-9]+$" OR _rc EQUAL 0)
    _fail("exit status ${_rc}, expected a failure status")
  endif()
elseif(NOT _rc STREQUAL EXPECT_EXIT)
  _fail("exit status ${_rc}, expected ${EXPECT_EXIT}")
endif()
if(NOT _out MATCHES "${EXPECT_REGEX}")
  _fail("the output does not match the expected regex ${EXPECT_REGEX} (exit status ${_rc})")
endif()
