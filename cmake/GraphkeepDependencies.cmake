# Finds graphkeep's dependencies and decides GRAPHKEEP_CUDA.
#
# Torch: PyTorch 2.11.0's libtorch from the PyPI wheel. Its CMake config is
# found through `python3 -c "import torch; print(torch.utils.cmake_prefix_path)"`
# unless Torch_DIR or CMAKE_PREFIX_PATH already point at one.
include_guard(GLOBAL)

find_package(Python3 COMPONENTS Interpreter)
if(NOT Torch_DIR AND Python3_Interpreter_FOUND)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c "import torch; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _gk_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
    ERROR_QUIET RESULT_VARIABLE _gk_torch_rc)
  # Inside pip's isolated build environment (`pip install .`) torch is not
  # importable: the extension must link the torch the user has installed
  # (its libtorch ABI), never one pip would install for the build, so ask
  # the same interpreter outside the isolation (python/CMakeLists.txt).
  if(NOT _gk_torch_rc EQUAL 0 AND SKBUILD)
    execute_process(
      COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH --unset=PYTHONNOUSERSITE
              ${Python3_EXECUTABLE} -c "import torch; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE _gk_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
      ERROR_QUIET RESULT_VARIABLE _gk_torch_rc)
  endif()
  if(_gk_torch_rc EQUAL 0 AND _gk_torch_prefix)
    list(APPEND CMAKE_PREFIX_PATH "${_gk_torch_prefix}")
  endif()
endif()

# Torch's CUDA config ignores CMAKE_CUDA_ARCHITECTURES and, without a GPU,
# would build for many architectures. H200 is sm_90.
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST} AND NOT TORCH_CUDA_ARCH_LIST)
  set(TORCH_CUDA_ARCH_LIST "9.0")
endif()
set(GRAPHKEEP_CUDA_ARCHITECTURES "90" CACHE STRING "CUDA architectures of graphkeep's own kernels")
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)   # share torch's libcudart, never a static copy

# Torch enables the CUDA language itself when its build has CUDA; that needs nvcc.
include(CheckLanguage)
check_language(CUDA)
find_package(Torch 2.0 REQUIRED)

set(_gk_cuda_default OFF)
if(TARGET torch_cuda AND CMAKE_CUDA_COMPILER)
  set(_gk_cuda_default ON)
endif()
option(GRAPHKEEP_CUDA "Build graphkeep's CUDA sources (needs a CUDA build of Torch and nvcc)" ${_gk_cuda_default})
if(GRAPHKEEP_CUDA)
  if(NOT TARGET torch_cuda)
    message(FATAL_ERROR "GRAPHKEEP_CUDA=ON but the Torch found (${Torch_DIR}) has no CUDA")
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # CMake 3.25 does not know nvcc 13's C++20 flag; graphkeep's cxx_std_20
  # requirement propagates to CUDA sources that link the library.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
endif()

find_package(Boost 1.81 CONFIG REQUIRED)       # header-only: PFR, Hana, Describe, mp11, PP
find_package(nlohmann_json 3.10 CONFIG REQUIRED)
if(GRAPHKEEP_BUILD_TESTS)
  find_package(doctest CONFIG REQUIRED)
endif()
if(GRAPHKEEP_BUILD_BENCH)
  find_package(benchmark CONFIG QUIET)
  if(NOT benchmark_FOUND)
    message(STATUS "graphkeep: Google Benchmark not found; the benches built on it are not built")
  endif()
endif()
