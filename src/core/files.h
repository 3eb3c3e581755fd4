// Tessera internal: writing a file so that no reader ever sees it half written.
#pragma once

#include <string>

namespace tessera::files {

// A name beside `final_name`, unique across threads and processes: final_name + ".tmp.<pid>.<n>.<r>"
// (a process-wide counter and a random word), so two writers of one path never share a temp file.
std::string unique_temp_name(const std::string& final_name);

// Writes `text` to a unique temp file beside `path` (creating parent directories) and renames it
// over `path`: readers see the old file or the whole new one, and an interrupted write leaves at
// most a *.tmp.* file. Throws Error(kIo) naming `path` on failure (the temp file is removed).
void write_atomically(const std::string& path, const std::string& text);

}  // namespace tessera::files
