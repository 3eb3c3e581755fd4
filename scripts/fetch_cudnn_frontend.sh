#!/usr/bin/env bash
# Fetches the header-only cuDNN frontend (NVIDIA's C++ graph API over cuDNN's backend) that the
# attention `cudnn` implementation is written against, into third_party/cudnn_frontend/
# (gitignored): the include/ tree of the pinned nvidia-cudnn-frontend wheel from PyPI, nothing
# else. CMake runs it at configure time when TESSERA_CUDNN is not OFF and the headers are missing;
# run it by hand before a build on a machine without network (the GPU machine: carry
# third_party/cudnn_frontend with the work tree).
#   scripts/fetch_cudnn_frontend.sh [DEST]     (default: third_party/cudnn_frontend)
set -euo pipefail
cd "$(dirname "$0")/.."
version=1.32.0
dest=${1:-third_party/cudnn_frontend}
if [[ -f $dest/include/cudnn_frontend.h && "$(cat "$dest/VERSION" 2>/dev/null)" == "$version" ]]; then
  echo "fetch_cudnn_frontend: $dest has $version"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: --timeout 20 --retries 2 \
  -d "$tmp" "nvidia-cudnn-frontend==$version"
wheel=$(ls "$tmp"/nvidia_cudnn_frontend-*.whl)
python3 - "$wheel" "$tmp/x" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])
PY
[[ -f $tmp/x/include/cudnn_frontend.h ]] || { echo "fetch_cudnn_frontend: no include/cudnn_frontend.h in $wheel" >&2; exit 1; }
rm -rf "$dest"
mkdir -p "$dest"
mv "$tmp/x/include" "$dest/include"
echo "$version" > "$dest/VERSION"
echo "fetch_cudnn_frontend: cuDNN frontend $version headers in $dest/include"
