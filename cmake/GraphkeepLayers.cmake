# One CMake library per layer, and the build as the judge of the arrows.
#
# Note [Layers enforced by include roots]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Public headers live together under include/graphkeep/<layer>/ (what an
# installed package ships), so one include path would let any file include
# any header. Inside the build, each layer library instead gets an include
# root of its own, <build>/gk_layers/<layer>/, holding symbolic links to that
# layer's headers only. A library sees its own root and, through its PUBLIC
# links, the roots of the layers it depends on, and nothing else: an include
# that crosses a layer the wrong way is "No such file or directory" at build
# time. There is no source-root include path; a layer's private headers
# (kernels/cuda/*_launch.h, reload/reload_internal.h) are included with
# quotes, relative to the including file. The installed package has one
# include root, include/, and one umbrella target, graphkeep::graphkeep.
#
#   graphkeep_layer(<name> [INTERFACE] HEADERS <paths under include/>...
#                   [SOURCES <files>...] [DEPS <layers>...] [TORCH])
#
# HEADERS names folders (graphkeep/reload: every .h in it) or single files
# (graphkeep/registry.h). DEPS are layer names; only they are linked. TORCH
# links Torch, Boost and the project's compile options. The layer table
# (name and DEPS) is recorded for tests/layering (README's sketch is checked
# against it).
include_guard(GLOBAL)

# Torch, Boost and the definitions every Torch-using layer shares.
#
# Only imported targets, never ${TORCH_LIBRARIES} / ${TORCH_INCLUDE_DIRS}:
# those hold absolute paths of this machine's libtorch and CUDA (libc10.so,
# libnvrtc.so, site-packages/torch/include), which install(EXPORT) would
# write into graphkeepTargets.cmake, so the installed package would work only
# where it was built. Target names are resolved by the consumer's own
# find_dependency(Torch) / find_dependency(CUDAToolkit) in graphkeepConfig.cmake.
# `torch` carries Torch's include directories (system headers, as every
# imported target's) and compile options; torch_library links the whole of
# libtorch as Torch's own examples do; c10 (and c10_cuda) are used directly.
add_library(graphkeep_torch INTERFACE)
set_target_properties(graphkeep_torch PROPERTIES EXPORT_NAME torch_deps)
target_compile_features(graphkeep_torch INTERFACE cxx_std_20)
target_link_libraries(graphkeep_torch INTERFACE Boost::headers torch torch_library c10)
if(GRAPHKEEP_CUDA)
  target_compile_definitions(graphkeep_torch INTERFACE GRAPHKEEP_WITH_CUDA=1)
  target_link_libraries(graphkeep_torch INTERFACE c10_cuda CUDA::cudart)
endif()

# Torch headers cost ~10 s per file: the Torch-using layers share one
# precompiled header (GRAPHKEEP_PCH=OFF checks that every source includes what
# it uses).
option(GRAPHKEEP_PCH "Precompile Torch and Boost headers for the library's sources" ON)
if(GRAPHKEEP_PCH)
  file(WRITE ${PROJECT_BINARY_DIR}/gk_pch.cpp "// the precompiled header's own translation unit\n")
  add_library(graphkeep_pch OBJECT ${PROJECT_BINARY_DIR}/gk_pch.cpp)
  target_link_libraries(graphkeep_pch PRIVATE graphkeep_torch)
  set_target_properties(graphkeep_pch PROPERTIES POSITION_INDEPENDENT_CODE ON)
  target_precompile_headers(graphkeep_pch PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:<ATen/ATen.h$<ANGLE-R>>
    $<$<COMPILE_LANGUAGE:CXX>:<torch/nn/module.h$<ANGLE-R>>
    $<$<COMPILE_LANGUAGE:CXX>:<boost/describe.hpp$<ANGLE-R>>
    $<$<COMPILE_LANGUAGE:CXX>:<boost/pfr.hpp$<ANGLE-R>>)
endif()

set_property(GLOBAL PROPERTY GRAPHKEEP_LAYERS "")

function(graphkeep_layer name)
  cmake_parse_arguments(L "INTERFACE;TORCH" "" "SOURCES;HEADERS;DEPS" ${ARGN})
  set(target graphkeep_${name})
  set(root ${PROJECT_BINARY_DIR}/gk_layers/${name})
  file(REMOVE_RECURSE ${root})
  foreach(h IN LISTS L_HEADERS)
    if(IS_DIRECTORY ${PROJECT_SOURCE_DIR}/include/${h})
      file(GLOB_RECURSE _files CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/include/${h}/*.h)
    elseif(EXISTS ${PROJECT_SOURCE_DIR}/include/${h})
      set(_files ${h})
    else()
      message(FATAL_ERROR "graphkeep_layer(${name}): no header or folder include/${h}")
    endif()
    foreach(f IN LISTS _files)
      get_filename_component(_dir ${root}/${f} DIRECTORY)
      file(MAKE_DIRECTORY ${_dir})
      file(CREATE_LINK ${PROJECT_SOURCE_DIR}/include/${f} ${root}/${f} SYMBOLIC)
    endforeach()
  endforeach()

  if(L_INTERFACE)
    add_library(${target} INTERFACE)
    set(_vis INTERFACE)
  else()
    add_library(${target} STATIC ${L_SOURCES})
    set(_vis PUBLIC)
    set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON EXPORT_NAME ${name})
    target_compile_features(${target} PUBLIC cxx_std_20)
    graphkeep_warnings(${target})
    if(L_TORCH AND GRAPHKEEP_PCH)
      target_precompile_headers(${target} REUSE_FROM graphkeep_pch)
    endif()
  endif()
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
  add_library(graphkeep::${name} ALIAS ${target})
  target_include_directories(${target} ${_vis} $<BUILD_INTERFACE:${root}>
                                               $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  if(L_TORCH)
    target_link_libraries(${target} ${_vis} graphkeep_torch)
  endif()
  foreach(d IN LISTS L_DEPS)
    if(NOT TARGET graphkeep_${d})
      message(FATAL_ERROR "graphkeep_layer(${name}): layer '${d}' is not defined yet (layers are added lowest first)")
    endif()
    target_link_libraries(${target} ${_vis} graphkeep_${d})
  endforeach()
  set_property(GLOBAL APPEND PROPERTY GRAPHKEEP_LAYERS ${name})
  set_property(GLOBAL PROPERTY GRAPHKEEP_LAYER_DEPS_${name} "${L_DEPS}")
endfunction()

# graphkeep_private_json(<target>): nlohmann-json's include directory,
# privately. It is header-only; linking its target would put it into the
# installed package's link interface, which consumers would then have to find.
function(graphkeep_private_json target)
  get_target_property(_dirs nlohmann_json::nlohmann_json INTERFACE_INCLUDE_DIRECTORIES)
  target_include_directories(${target} SYSTEM PRIVATE ${_dirs})
endfunction()

# graphkeep_cuda_objects(<layer target> <dir>)
# Compiles every .cu in <dir> into an object library linked into the layer.
# The .cu files hold device kernels and plain launchers only (no Torch or
# Boost headers), built as C++17 for GRAPHKEEP_CUDA_ARCHITECTURES: nvcc
# stays fast, and Torch's C++20 flags stay away from it. They see the
# numerics layer (exact float math, number formats) and their own folder.
function(graphkeep_cuda_objects layer dir)
  if(NOT GRAPHKEEP_CUDA)
    return()
  endif()
  file(GLOB _cu CONFIGURE_DEPENDS ${dir}/*.cu)
  if(NOT _cu)
    return()
  endif()
  set(target ${layer}_cuda)
  add_library(${target} OBJECT ${_cu})
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${GRAPHKEEP_CUDA_ARCHITECTURES}"
                        CUDA_STANDARD 17 POSITION_INDEPENDENT_CODE ON CUDA_RUNTIME_LIBRARY Shared)
  target_include_directories(${target} PRIVATE ${PROJECT_BINARY_DIR}/gk_layers/numerics)
  target_compile_options(${target} PRIVATE -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter)
  target_sources(${layer} PRIVATE $<TARGET_OBJECTS:${target}>)
endfunction()
