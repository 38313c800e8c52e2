# ctest driver for the install test (label install), run with cmake -P:
#   -DBUILD_DIR=<graphkeep build> -DWORK_DIR=<scratch> -DCONSUMER_DIR=<tests/consumer>
#   -DGENERATOR=<generator> -DCXX=<compiler> -DPYTHON=<python3> [-DCUDA_COMPILER=<nvcc>]
# The installed package must be relocatable: it may name no absolute path, of
# the install prefix or of the build machine's libtorch and CUDA.
# 1. cmake --install BUILD_DIR into WORK_DIR/first/prefix;
# 2. the package's CMake files hold no absolute path (the check is shown to
#    catch one in a line like the one the package used to export);
# 3. move the prefix to WORK_DIR/moved/prefix (the first place is gone);
# 4. configure tests/consumer with find_package(graphkeep) against the moved
#    prefix only (the source tree is not on any path it sees);
# 5. build it and run it: it must print "consumer ok".
foreach(_v BUILD_DIR WORK_DIR CONSUMER_DIR GENERATOR CXX PYTHON)
  if(NOT DEFINED ${_v})
    message(FATAL_ERROR "install_test.cmake: ${_v} is not set")
  endif()
endforeach()

function(_gk_run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "install test: ${what} failed (${_rc}):\n${_out}")
  endif()
  set(_gk_last_output "${_out}" PARENT_SCOPE)
endfunction()

# _gk_absolute_paths(<out> <text>): the absolute paths in a CMake file's text
# (a quoted or ;-listed item starting with /; "/" alone, in CMake's own
# prefix computation, is none).
function(_gk_absolute_paths out text)
  string(REPLACE ";" "\"" text "${text}")  # a list separator delimits an item as a quote does
  string(REGEX MATCHALL "\"/[^\"/\n][^\"\n]*" _found "${text}")
  set(_paths)
  foreach(_p IN LISTS _found)
    string(SUBSTRING "${_p}" 1 -1 _p)
    list(APPEND _paths "${_p}")
  endforeach()
  set(${out} "${_paths}" PARENT_SCOPE)
endfunction()

# The check catches what the package used to export.
_gk_absolute_paths(_probe "INTERFACE_LINK_LIBRARIES \"torch;/opt/py/torch/lib/libc10.so;CUDA::cudart\"\nif(_IMPORT_PREFIX STREQUAL \"/\")")
list(LENGTH _probe _n)
if(NOT _n EQUAL 1)
  message(FATAL_ERROR "install test: the absolute-path check found ${_n} paths in a line with one: '${_probe}'")
endif()

set(_first ${WORK_DIR}/first/prefix)
set(_moved ${WORK_DIR}/moved/prefix)
file(REMOVE_RECURSE ${WORK_DIR})
_gk_run("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${_first})
if(NOT EXISTS ${_first}/lib/cmake/graphkeep/graphkeepConfig.cmake)
  message(FATAL_ERROR "install test: no graphkeepConfig.cmake under ${_first}/lib/cmake/graphkeep")
endif()
file(GLOB _package_files ${_first}/lib/cmake/graphkeep/*.cmake)
set(_absolute)
foreach(_f IN LISTS _package_files)
  file(READ ${_f} _text)
  _gk_absolute_paths(_found "${_text}")
  foreach(_p IN LISTS _found)
    get_filename_component(_name ${_f} NAME)
    list(APPEND _absolute "${_name}: ${_p}")
  endforeach()
endforeach()
if(_absolute)
  list(JOIN _absolute "\n  " _absolute)
  message(FATAL_ERROR "install test: the installed package names absolute paths (it would work only on "
                      "this machine, at this prefix):\n  ${_absolute}")
endif()
file(MAKE_DIRECTORY ${WORK_DIR}/moved)
file(RENAME ${_first} ${_moved})
if(EXISTS ${_first})
  message(FATAL_ERROR "install test: ${_first} still exists after the move")
endif()
set(_extra)
if(DEFINED CUDA_COMPILER AND CUDA_COMPILER)
  list(APPEND _extra -DCMAKE_CUDA_COMPILER=${CUDA_COMPILER})
endif()
_gk_run("configuring the consumer" ${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
        -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${_moved}
        -DPython3_EXECUTABLE=${PYTHON} ${_extra})
_gk_run("building the consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
_gk_run("running the consumer" ${WORK_DIR}/build/consumer)
if(NOT _gk_last_output MATCHES "consumer ok")
  message(FATAL_ERROR "install test: the consumer did not report success:\n${_gk_last_output}")
endif()
message(STATUS "install test: ${_gk_last_output}")
