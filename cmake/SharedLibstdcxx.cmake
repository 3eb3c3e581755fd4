# Every target links the shared libstdc++ (see the comment where CMakeLists.txt includes this).
# --no-as-needed: the option comes before the objects on the link line, where --as-needed would
# drop a library that nothing has referenced yet. Checked first: a toolchain without
# libstdc++.so.6 on its linker's path keeps its own choice (with a note).
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_SYSTEM_NAME STREQUAL "Linux")
  include(CheckLinkerFlag)
  set(_tessera_libstdcxx "LINKER:--push-state,--no-as-needed,-l:libstdc++.so.6,--pop-state")
  check_linker_flag(CXX "${_tessera_libstdcxx}" TESSERA_LINKS_SHARED_LIBSTDCXX)
  if(TESSERA_LINKS_SHARED_LIBSTDCXX)
    add_link_options("${_tessera_libstdcxx}")  # (no CUDA device-link step here: no separable compilation)
  else()
    message(WARNING "tessera: cannot link libstdc++.so.6 explicitly; if this GCC links libstdc++ statically, "
                    "the Python extension may crash (two partial copies in one process)")
  endif()
endif()
