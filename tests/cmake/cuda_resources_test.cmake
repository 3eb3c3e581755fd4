# ctest cmake.cuda_resources: cmake/TesseraCudaResources.cmake on a fake ptxas report: figures
# per kernel, a spill flagged unless CUDA_MAY_SPILL allows it.
#   cmake -DSOURCE_DIR=<repo> -DWORK_DIR=<scratch> -P cuda_resources_test.cmake
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}/obj/src/kernels/k")
file(WRITE "${WORK_DIR}/obj/src/kernels/k/cuda.cu.o.resource-usage.txt"
"ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z4goodPf' for 'sm_90a'
ptxas info    : Function properties for _Z4goodPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 324 bytes smem, 380 bytes cmem[0]
ptxas info    : Compiling entry function '_Z5spillPf' for 'sm_90a'
ptxas info    : Function properties for _Z5spillPf
    96 bytes stack frame, 64 bytes spill stores, 48 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 96 bytes cumulative stack size
ptxas info    : Compiling entry function '_Z7allowedPf' for 'sm_90a'
ptxas info    : Function properties for _Z7allowedPf
    8 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers
")
execute_process(COMMAND ${CMAKE_COMMAND} -DOBJ_DIR=${WORK_DIR}/obj -DOUT=${WORK_DIR}/r.json -DMAY_SPILL=allowed,other
  -DCOMPILER=13.0 -DARCHS=90a-real -P ${SOURCE_DIR}/cmake/TesseraCudaResources.cmake
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "TesseraCudaResources.cmake failed: ${err}")
endif()
string(REGEX REPLACE "[ \n]+" " " err "${err}")  # CMake wraps warnings
if(NOT err MATCHES "_Z5spillPf [^)]*sm_90a[)] spills: 64 bytes stores, 48 bytes loads" OR err MATCHES "_Z7allowedPf")
  message(FATAL_ERROR "expected a warning for the spilling kernel only, got: ${err}")
endif()
file(READ "${WORK_DIR}/r.json" j)
string(JSON n LENGTH "${j}" kernels)
if(NOT n EQUAL 3)
  message(FATAL_ERROR "expected 3 kernels, got ${n}: ${j}")
endif()
foreach(check
    "0;function;_Z4goodPf" "0;source;src/kernels/k/cuda.cu" "0;arch;sm_90a" "0;registers;40" "0;barriers;1"
    "0;shared_bytes;324" "0;constant_bytes;380" "0;spill_flagged;OFF"
    "1;registers;255" "1;spill_store_bytes;64" "1;spill_load_bytes;48" "1;stack_frame_bytes;96" "1;spill_flagged;ON"
    "2;may_spill;ON" "2;spill_flagged;OFF")
  list(GET check 0 i)
  list(GET check 1 key)
  list(GET check 2 want)
  string(JSON got GET "${j}" kernels ${i} ${key})
  if(NOT got STREQUAL want)
    message(FATAL_ERROR "kernels[${i}].${key}: got '${got}', want '${want}'")
  endif()
endforeach()
