// Tessera harness: NumPy .npy files (format versions 1.0, 2.0 and 3.0), little endian; a
// Fortran-order file (np.save of a transposed or column-major array) is reordered into C order on
// load, and every saved file is C order.
//
// dtypes: '<f4' f32, '<f2' f16, '<i4' i32, '<i8' i64, one-byte masks ('|b1' bool, '|u1', '|i1')
// widened to i32 on load, and bf16 stored as 2-byte void ('<V2' or
// '|V2', as ml_dtypes' bfloat16 arrays are saved) or with the descr 'bfloat16'. At most 64
// dimensions (NumPy's own limit). Anything else (float64, big endian, object arrays) is rejected
// with a one-line reason, never silently converted.
#pragma once

#include <istream>
#include <string>
#include <utility>
#include <vector>

#include "tessera/tensor.h"

namespace tessera::npy {

// Throws Error(kIo) when the file cannot be read, Error(kInvalidArgument) for a malformed or
// unsupported file; messages start with the path.
// The declared size is checked against the bytes left in the file before anything is
// allocated, so a header that declares a huge shape fails with its size, never with an
// allocation (or an overflow of the element count).
Tensor load(const std::string& path);
// The same reader over an open stream (positioned at the magic); `name` starts the messages.
// Throws Error(kInvalidArgument) only (plus Error(kOutOfMemory) when a file that is really
// that large does not fit in memory).
Tensor read(std::istream& in, const std::string& name);
// Writes a contiguous host tensor (bf16 is written with descr '<V2'). Throws Error(kIo).
void save(const std::string& path, const TensorView& t);
// Several files as one: each is written to a temporary name beside it and checked (a full disk
// is an error, not a short file), then all are renamed into place; an error in writing leaves
// every destination as it was, and a destination that is a directory is refused before any write.
// The renames themselves are one by one (no directory-level atomicity): one failing after another
// succeeded (a file vanishing from a shared directory mid-call) leaves the earlier ones replaced.
void save_all(const std::vector<std::pair<std::string, TensorView>>& files);

}  // namespace tessera::npy
