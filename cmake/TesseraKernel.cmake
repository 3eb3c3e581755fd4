# tessera_add_kernel: everything the build needs to know about one kernel, in one place.
#
#   tessera_add_kernel(<name>
#     SOURCES         ...   the kernel in libtessera: api, reference, registry, block sizes,
#                           tuning, tuned table (and, from the framework, its spec)
#     CPU_SOURCES     ...   optimized CPU backend (libtessera, when TESSERA_CPU_BACKEND is on)
#     CUDA_SOURCES    ...   CUDA backend(s) (.cu): the CUDA module libtessera_cuda.so, loaded on
#                           first use of a CUDA device; each registers itself with
#                           TESSERA_CUDA_MODULE_REGISTRATION (src/core/cuda_module.h)
#     TOOLS_SOURCES   ...   bench / baseline / cost code used by the CLI and tests, never shipped
#                           in libtessera (tessera_kernels_tools)
#     TESTING_SOURCES ...   test support shared by the tests and `tessera check` (tessera_testing)
#     TESTS           ...   GoogleTest files, in tessera_tests
#     CPU_TESTS       ...   GoogleTest files that need the CPU backend
#     CUDA_TESTS      ...   GoogleTest files of the CUDA backend, in tessera_cuda_tests (built with
#                           CUDA only; they skip without a device)
#     CUDA_MAY_SPILL  ...   regexes of CUDA kernel (mangled) names allowed to spill registers; any
#                           other kernel that spills is flagged in the build, `tessera list
#                           --verbose` and the report (lib/libtessera_cuda.resources.json)
#   )
#
# Sources are relative to src/kernels/<name>/, tests to tests/ (absolute paths work too).
# The targets it fills are made by the top-level CMakeLists.txt before the kernels are added:
# tessera_lib, tessera_kernels_tools, tessera_testing and (with CUDA) tessera_cuda; the test
# executables read the TESSERA_*TEST_SOURCES global properties in tests/CMakeLists.txt.

function(_tessera_abs_paths out base)
  set(result)
  foreach(f IN LISTS ARGN)
    if(IS_ABSOLUTE "${f}")
      list(APPEND result "${f}")
    else()
      list(APPEND result "${base}/${f}")
    endif()
  endforeach()
  set(${out} "${result}" PARENT_SCOPE)
endfunction()

function(tessera_add_kernel name)
  cmake_parse_arguments(PARSE_ARGV 1 K ""
    ""
    "SOURCES;CPU_SOURCES;CUDA_SOURCES;TOOLS_SOURCES;TESTING_SOURCES;TESTS;CPU_TESTS;CUDA_TESTS;CUDA_MAY_SPILL")
  if(K_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "tessera_add_kernel(${name}): unknown arguments ${K_UNPARSED_ARGUMENTS}")
  endif()
  set(src "${PROJECT_SOURCE_DIR}/src/kernels/${name}")
  set(tests "${PROJECT_SOURCE_DIR}/tests")
  foreach(kind SOURCES CPU_SOURCES CUDA_SOURCES TOOLS_SOURCES TESTING_SOURCES)
    _tessera_abs_paths(K_${kind} "${src}" ${K_${kind}})
  endforeach()
  foreach(kind TESTS CPU_TESTS CUDA_TESTS)
    _tessera_abs_paths(K_${kind} "${tests}" ${K_${kind}})
  endforeach()

  target_sources(tessera_lib PRIVATE ${K_SOURCES})
  if(TESSERA_CPU_BACKEND)
    target_sources(tessera_lib PRIVATE ${K_CPU_SOURCES})
    set_property(GLOBAL APPEND PROPERTY TESSERA_TEST_SOURCES ${K_CPU_TESTS})
  endif()
  if(K_CUDA_SOURCES AND TESSERA_HAVE_CUDA)
    target_sources(tessera_cuda PRIVATE ${K_CUDA_SOURCES})
    set_property(GLOBAL APPEND PROPERTY TESSERA_CUDA_TEST_SOURCES ${K_CUDA_TESTS})
    set_property(TARGET tessera_cuda APPEND PROPERTY TESSERA_CUDA_MAY_SPILL ${K_CUDA_MAY_SPILL})
  endif()
  if(K_TOOLS_SOURCES)
    target_sources(tessera_kernels_tools PRIVATE ${K_TOOLS_SOURCES})
  endif()
  if(K_TESTING_SOURCES)
    target_sources(tessera_testing PRIVATE ${K_TESTING_SOURCES})
  endif()
  set_property(GLOBAL APPEND PROPERTY TESSERA_TEST_SOURCES ${K_TESTS})
  set_property(GLOBAL APPEND PROPERTY TESSERA_KERNELS ${name})
endfunction()
