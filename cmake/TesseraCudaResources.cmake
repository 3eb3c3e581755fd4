# Writes the CUDA module's compiler report: for every kernel (entry function) of every CUDA
# source, per real architecture, the registers per thread, spill stores / loads, the stack frame
# (local memory per thread), static shared memory, constant bank 0, barriers. Read from the ptxas
# verbose output that cmake/nvcc_resource_usage.sh keeps beside each object (--resource-usage).
# `tessera list --verbose` and the HTML report show it; a kernel that spills is flagged unless
# its name matches one of MAY_SPILL (tessera_add_kernel(... CUDA_MAY_SPILL ...)).
#
#   cmake -DOBJ_DIR=<tessera_cuda object dir> -DOUT=<json> -DMAY_SPILL=a,b -DCOMPILER=<nvcc version>
#         -DARCHS=<CUDA_ARCHITECTURES> -P TesseraCudaResources.cmake
file(GLOB_RECURSE logs "${OBJ_DIR}/*.resource-usage.txt")
list(SORT logs)
string(REPLACE "," ";" may_spill "${MAY_SPILL}")
set(entries "")
set(nspill 0)

function(_num out line regex)
  if(line MATCHES "${regex}")
    set(${out} "${CMAKE_MATCH_1}" PARENT_SCOPE)
  else()
    set(${out} 0 PARENT_SCOPE)
  endif()
endfunction()

foreach(log IN LISTS logs)
  file(RELATIVE_PATH src "${OBJ_DIR}" "${log}")
  string(REGEX REPLACE "\\.o\\.resource-usage\\.txt$" "" src "${src}")
  string(REGEX REPLACE "^.*/src/" "src/" src "${src}")
  file(STRINGS "${log}" lines)
  set(fn "")
  set(entry "")
  foreach(line IN LISTS lines)
    if(line MATCHES "Compiling entry function '([^']+)' for '([^']+)'")
      set(fn "${CMAKE_MATCH_1}")
      set(arch "${CMAKE_MATCH_2}")
      set(stack 0)
      set(sst 0)
      set(sld 0)
    elseif(fn AND line MATCHES "^ *([0-9]+) bytes stack frame, ([0-9]+) bytes spill stores, ([0-9]+) bytes spill loads")
      set(stack "${CMAKE_MATCH_1}")
      set(sst "${CMAKE_MATCH_2}")
      set(sld "${CMAKE_MATCH_3}")
    elseif(fn AND line MATCHES "Used ([0-9]+) registers")
      set(regs "${CMAKE_MATCH_1}")
      _num(bars "${line}" "used ([0-9]+) barriers")
      _num(smem "${line}" "([0-9]+) bytes smem")
      _num(cmem "${line}" "([0-9]+) bytes cmem\\[0\\]")
      set(allowed false)
      foreach(pat IN LISTS may_spill)
        if(pat AND fn MATCHES "${pat}")
          set(allowed true)
        endif()
      endforeach()
      set(flag false)
      if((sst GREATER 0 OR sld GREATER 0) AND NOT allowed)
        set(flag true)
        math(EXPR nspill "${nspill} + 1")
        message(WARNING "tessera: CUDA kernel ${fn} (${src}, ${arch}) spills: ${sst} bytes stores, ${sld} bytes loads "
                        "(allow it with tessera_add_kernel(... CUDA_MAY_SPILL <name>) if intended)")
      endif()
      string(APPEND entries "${sep}\n    {\"function\": \"${fn}\", \"source\": \"${src}\", \"arch\": \"${arch}\", "
             "\"registers\": ${regs}, \"barriers\": ${bars}, \"spill_store_bytes\": ${sst}, \"spill_load_bytes\": ${sld}, "
             "\"stack_frame_bytes\": ${stack}, \"shared_bytes\": ${smem}, \"constant_bytes\": ${cmem}, "
             "\"may_spill\": ${allowed}, \"spill_flagged\": ${flag}}")
      set(sep ",")
      set(fn "")
    endif()
  endforeach()
endforeach()

string(TIMESTAMP now "%Y-%m-%dT%H:%M:%SZ" UTC)
file(WRITE "${OUT}.tmp" "{\n  \"schema\": \"tessera-cuda-resources/1\",\n  \"generated_at\": \"${now}\",\n"
     "  \"compiler\": \"nvcc ${COMPILER}\",\n  \"architectures\": \"${ARCHS}\",\n"
     "  \"source\": \"ptxas --verbose (nvcc --resource-usage) of each CUDA source of the module\",\n"
     "  \"kernels\": [${entries}\n  ]\n}\n")
file(RENAME "${OUT}.tmp" "${OUT}")
