# ctest driver for the install test (label install), run with cmake -P:
#   -DBUILD_DIR=<graphkeep build> -DWORK_DIR=<scratch> -DCONSUMER_DIR=<tests/consumer>
#   -DGENERATOR=<generator> -DCXX=<compiler> -DPYTHON=<python3> [-DCUDA_COMPILER=<nvcc>]
# 1. cmake --install BUILD_DIR into WORK_DIR/prefix;
# 2. configure tests/consumer with find_package(graphkeep) against that prefix
#    only (the source tree is not on any path it sees);
# 3. build it and run it: it must print "consumer ok".
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

file(REMOVE_RECURSE ${WORK_DIR})
_gk_run("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
if(NOT EXISTS ${WORK_DIR}/prefix/lib/cmake/graphkeep/graphkeepConfig.cmake)
  message(FATAL_ERROR "install test: no graphkeepConfig.cmake under ${WORK_DIR}/prefix/lib/cmake/graphkeep")
endif()
set(_extra)
if(DEFINED CUDA_COMPILER AND CUDA_COMPILER)
  list(APPEND _extra -DCMAKE_CUDA_COMPILER=${CUDA_COMPILER})
endif()
_gk_run("configuring the consumer" ${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
        -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix
        -DPython3_EXECUTABLE=${PYTHON} ${_extra})
_gk_run("building the consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
_gk_run("running the consumer" ${WORK_DIR}/build/consumer)
if(NOT _gk_last_output MATCHES "consumer ok")
  message(FATAL_ERROR "install test: the consumer did not report success:\n${_gk_last_output}")
endif()
message(STATUS "install test: ${_gk_last_output}")
