# ctest downstream.find_package: install the build tree into a prefix inside the build directory,
# check that the install holds only the public headers, then configure, build and run
# tests/downstream against it. Variables: TESSERA_BUILD_DIR TESSERA_SOURCE_DIR WORK_DIR GENERATOR
# CXX FLAGS CUDA_MODULE.
set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})

function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "downstream: failed (${rc}): ${ARGN}")
  endif()
endfunction()

step(${CMAKE_COMMAND} --install ${TESSERA_BUILD_DIR} --prefix ${prefix})

# The install tree's headers are exactly include/tessera/*.h of the source tree.
file(GLOB_RECURSE installed RELATIVE ${prefix}/include ${prefix}/include/*)
file(GLOB public RELATIVE ${TESSERA_SOURCE_DIR}/include ${TESSERA_SOURCE_DIR}/include/tessera/*.h)
list(SORT installed)
list(SORT public)
if(NOT installed STREQUAL public)
  message(FATAL_ERROR "downstream: installed headers\n  ${installed}\nare not the public ones\n  ${public}")
endif()
file(GLOB_RECURSE libs RELATIVE ${prefix} ${prefix}/lib*/libtessera*)
message(STATUS "downstream: installed ${libs}")
if(CUDA_MODULE AND NOT libs MATCHES "libtessera_cuda.so")
  message(FATAL_ERROR "downstream: the CUDA module was built but not installed")
endif()
if(NOT EXISTS ${prefix}/lib/cmake/tessera/tesseraConfigVersion.cmake AND
   NOT EXISTS ${prefix}/lib64/cmake/tessera/tesseraConfigVersion.cmake)
  file(GLOB_RECURSE cfg ${prefix}/*tesseraConfigVersion.cmake)
  if(NOT cfg)
    message(FATAL_ERROR "downstream: no tesseraConfigVersion.cmake installed")
  endif()
endif()

step(${CMAKE_COMMAND} -S ${TESSERA_SOURCE_DIR}/tests/downstream -B ${WORK_DIR}/build -G ${GENERATOR}
     -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${prefix}
     "-DCMAKE_CXX_FLAGS=${FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${FLAGS}")
step(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
step(${WORK_DIR}/build/downstream)
