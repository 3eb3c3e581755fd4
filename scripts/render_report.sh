#!/usr/bin/env bash
# Renders a `tessera report` HTML page to PNG in a real browser (headless Chromium), at a desktop
# and a laptop width, to check what people will see:
#
#   scripts/render_report.sh REPORT.html [OUT_PREFIX]   -> OUT_PREFIX-1440.png, OUT_PREFIX-1024.png
#
# OUT_PREFIX defaults to the report's path without .html. Needs the `chromium` Debian package
# (apt-get install -y chromium); CHROMIUM=/path/to/binary picks another. The page height is
# taken generously (HEIGHT, default 6000 px) and the screenshot cropped to the page's content
# and stored with a palette when a python3 with PIL (Debian: python3-pil) is there; otherwise it
# is kept as rendered.
set -euo pipefail
if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 REPORT.html [OUT_PREFIX]" >&2
  exit 2
fi
report=$(realpath "$1")
prefix=${2:-${1%.html}}
chromium=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
if [[ -z $chromium ]]; then
  echo "render_report: no chromium found: apt-get install -y chromium (or set CHROMIUM)" >&2
  exit 1
fi
height=${HEIGHT:-6000}
for width in 1440 1024; do
  out="$prefix-$width.png"
  "$chromium" --headless --no-sandbox --disable-gpu --hide-scrollbars --force-device-scale-factor=1 \
    --screenshot="$(realpath -m "$out")" --window-size="$width,$height" "file://$report" >/dev/null 2>&1
  [[ -s $out ]] || { echo "render_report: chromium wrote no $out" >&2; exit 1; }
  # Crop the blank bottom of the tall window (keeps a 24 px margin).
  for py in python3 /usr/bin/python3; do "$py" - "$out" 2>/dev/null <<'PY' && break
import sys
from PIL import Image, ImageChops
p = sys.argv[1]
im = Image.open(p).convert("RGB")
box = ImageChops.difference(im, Image.new("RGB", im.size, (255, 255, 255))).getbbox()
if box:
    im = im.crop((0, 0, im.width, min(im.height, box[3] + 24)))
im.quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(p, optimize=True)  # palette: ~1/4 the size
PY
  done
  echo "wrote $out"
done
