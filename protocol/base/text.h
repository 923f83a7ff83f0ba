#pragma once
// Strings that came from a peer (engine names, model ids, routable ids) on their way into
// logs, kvctl's tables and event topics: a control character there could forge a log line
// or drive an operator's terminal (a screen clear, an OSC 52 clipboard write).

#include <string>
#include <string_view>

namespace kvtier {

// Whether `text` holds a C0 control (below 0x20), DEL, or a C1 control (U+0080..U+009F,
// 0xC2 0x80..0x9F in UTF-8).
bool HasControlCharacters(std::string_view text);
// `text` with each such character written as \xNN (a C1 control as its two bytes) and a
// backslash as \\, so what is shown cannot be mistaken for what was escaped.
std::string EscapeControlCharacters(std::string_view text);

}  // namespace kvtier
