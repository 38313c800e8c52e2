# `cmake --install` writes the headers, the layer libraries and a CMake
# package, so a consumer writes `find_package(graphkeep)` and links
# `graphkeep::graphkeep` (every layer), or one layer (`graphkeep::registry`
# for a kernel library that only declares its members).
include_guard(GLOBAL)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

get_property(_gk_layers GLOBAL PROPERTY GRAPHKEEP_LAYERS)
list(TRANSFORM _gk_layers PREPEND graphkeep_)
install(TARGETS graphkeep graphkeep_torch ${_gk_layers} EXPORT graphkeepTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/graphkeep DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
foreach(_gk_tool gk-slots gk-patch)
  if(TARGET ${_gk_tool})
    install(TARGETS ${_gk_tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()

set(_gk_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/graphkeep)
install(EXPORT graphkeepTargets NAMESPACE graphkeep:: DESTINATION ${_gk_cmake_dir})
configure_package_config_file(cmake/graphkeepConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/graphkeepConfig.cmake INSTALL_DESTINATION ${_gk_cmake_dir})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/graphkeepConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/graphkeepConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/graphkeepConfigVersion.cmake
        DESTINATION ${_gk_cmake_dir})
