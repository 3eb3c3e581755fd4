// Tessera harness: a self-contained report of a bench JSON document (generic over kernels).
//
// The document is what `tessera bench --json` writes (schema "tessera-bench/2"; "tessera-bench/1"
// files are read too, see normalize_bench_doc): "dims" (the kernel's named dims), "rows" (each
// with kind, implementation, mode, shape, the dims, dtype, median/min/max ms, rates, ratios) and
// "roofline" (measured ceilings, roofline.h). The HTML page shows, in order:
//   - the header: kernel, dims, machine, BLAS (said once), peers merged, and a warning with the
//     way to re-measure when some rows beat the stored ceilings (they are stale);
//   - per shape (its dims), dtype and pass, a bar chart of every implementation, baseline and
//     peer timed: median with its min–max spread, fastest first, with the ratio to the GEMM
//     floor (useful GEMMs × one BLAS GEMM of the shape) and to the materialized baseline written
//     on each bar;
//   - the roofline: log-log arithmetic intensity vs attained GFLOP/s, ceilings per device and
//     dtype, one marker per row (circle kernel, square baseline, diamond peer; hollow and red
//     when stale), labelled with row numbers placed so labels never overlap;
//   - the ceilings, the rows table (fits the page; long notes become numbered footnotes) and
//     the bench's messages.
// No network, no scripts: one file that any browser renders.
//
// Peer results (another framework's timings of the same kernel, written by the scripts in
// bench/, e.g. bench/torch_lce_baseline.py --peers-out) use schema "tessera-peers/1":
//   {"schema": "tessera-peers/1", "kernel": "linear_cross_entropy",   (optional; checked)
//    "source": "PyTorch 2.4 eager: x @ w.T, F.cross_entropy",          (optional, shown)
//    "device": "NVIDIA H100 80GB HBM3",                               (optional, per row too)
//    "dims": ["B", "H", "V"],                                         (optional: the bench's)
//    "rows": [{"implementation": "torch-eager", "mode": "forward|backward|fused", "B": 8192,
//              "H": 4096, "V": 128256, "dtype": "bf16", "median_ms": 12.3,
//              "min_ms": 12.1, "max_ms": 12.9, "note": "..."}]}      (min/max/note optional)
// A peer row joins the bar chart of the bench rows with the same dims, dtype and pass; its
// rates and ratios come from the bench's cost model for that shape when the run has it.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tessera::harness {

// The document in the current schema: "dims" from the rows' B/H/V when absent (old files),
// mode fwd→forward and bwd→backward. Idempotent; the renderers call it themselves.
nlohmann::json normalize_bench_doc(const nlohmann::json& doc);
// Appends the peer rows of `peers` (schema "tessera-peers/1") to doc["rows"] as kind "peer",
// and records the source in doc["peers"]. `origin` names the file in messages. Throws
// Error(kInvalidArgument) naming the first malformed field; `doc` is untouched then.
void merge_peer_results(nlohmann::json& doc, const nlohmann::json& peers, const std::string& origin);

std::string render_roofline_svg(const nlohmann::json& doc);
std::string render_report_html(const nlohmann::json& doc);
// Several bench documents (one per kernel, as the main job writes them) on one page: a list of
// contents, then each document's report as a section. One document: render_report_html.
std::string render_reports_html(const std::vector<nlohmann::json>& docs);
// Writes HTML or, for a path ending in .svg, the roofline chart alone (one document only).
// Throws Error(kIo), or Error(kInvalidArgument) for several documents into an .svg.
void write_report(const nlohmann::json& doc, const std::string& path);
void write_reports(const std::vector<nlohmann::json>& docs, const std::string& path);

}  // namespace tessera::harness
