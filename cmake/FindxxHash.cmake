# Finds xxHash (the reference XXH64 library; Debian: libxxhash-dev) and
# defines the imported target xxHash::xxhash, the name xxHash's own CMake
# package exports. That package is used when installed; Debian ships only the
# header, the library and a pkg-config file, so otherwise the header and the
# library are found directly. Installed with graphkeep's package, whose
# config finds xxHash through this module too (graphkeep's static hashing
# library links it).
#   xxHash_FOUND, xxHash_INCLUDE_DIR, xxHash_LIBRARY
if(TARGET xxHash::xxhash)
  set(xxHash_FOUND TRUE)
  return()
endif()
find_package(xxHash CONFIG QUIET)
if(xxHash_FOUND AND TARGET xxHash::xxhash)
  return()
endif()
find_path(xxHash_INCLUDE_DIR xxhash.h)
find_library(xxHash_LIBRARY NAMES xxhash)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(xxHash REQUIRED_VARS xxHash_LIBRARY xxHash_INCLUDE_DIR)
if(xxHash_FOUND)
  add_library(xxHash::xxhash UNKNOWN IMPORTED)
  set_target_properties(xxHash::xxhash PROPERTIES IMPORTED_LOCATION "${xxHash_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${xxHash_INCLUDE_DIR}")
endif()
mark_as_advanced(xxHash_INCLUDE_DIR xxHash_LIBRARY)
