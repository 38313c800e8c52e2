# `cmake --install` writes the headers, the library and a CMake package, so a
# consumer writes `find_package(graphkeep)` and links `graphkeep::graphkeep`.
include_guard(GLOBAL)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS graphkeep EXPORT graphkeepTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/graphkeep DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET gk-slots)
  install(TARGETS gk-slots RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(_gk_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/graphkeep)
install(EXPORT graphkeepTargets NAMESPACE graphkeep:: DESTINATION ${_gk_cmake_dir})
configure_package_config_file(cmake/graphkeepConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/graphkeepConfig.cmake INSTALL_DESTINATION ${_gk_cmake_dir})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/graphkeepConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/graphkeepConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/graphkeepConfigVersion.cmake
        DESTINATION ${_gk_cmake_dir})
