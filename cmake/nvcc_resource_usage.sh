#!/bin/sh
# CUDA compiler launcher of the CUDA module (CMakeLists.txt): runs the compile command given as
# arguments (ccache nvcc ... --resource-usage ... -o OBJ ...) and keeps the ptxas resource-usage
# report in OBJ.resource-usage.txt, which cmake/TesseraCudaResources.cmake turns into the module's
# resources JSON after linking. The "ptxas info" lines are kept out of the build log; everything
# else (warnings, errors) is passed through, and the compiler's exit status is returned.
obj=""
prev=""
for a in "$@"; do
  if [ "$prev" = "-o" ]; then obj="$a"; fi
  prev="$a"
done
if [ -z "$obj" ]; then exec "$@"; fi
log="$obj.resource-usage.txt"
"$@" >"$log.tmp" 2>&1
rc=$?
grep -v -e '^ptxas info' -e '^    [0-9]* bytes stack frame' "$log.tmp" >&2
if [ $rc -eq 0 ]; then mv -f "$log.tmp" "$log"; else rm -f "$log.tmp"; fi
exit $rc
