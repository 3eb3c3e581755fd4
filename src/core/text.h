// Tessera internal: quoting untrusted bytes in messages.
//
// A corrupt file's header or a JSON parser's "last read" excerpt may hold any bytes. Messages
// that quote them go to terminals, logs and tools that read the CLI's output as UTF-8 text, so
// they pass through printable() first: printable ASCII and valid UTF-8 stay as they are (a "×"
// in a path survives), while control bytes (C0, DEL, and C1 encoded as UTF-8) and bytes that do
// not form valid UTF-8 become C-style escapes: \n, \t, \r, and \xNN for the rest. The result is
// always valid UTF-8 with no control characters. Backslashes are not doubled: this is for
// people reading a message, not a reversible encoding.
#pragma once

#include <string>
#include <string_view>

namespace tessera::text {

std::string printable(std::string_view bytes);

}  // namespace tessera::text
