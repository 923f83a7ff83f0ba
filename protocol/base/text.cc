#include "protocol/base/text.h"

#include <cstdio>

namespace kvtier {
namespace {

// Bytes of the control character starting at text[i]: 1 for C0 and DEL, 2 for C1 in UTF-8,
// 0 for none.
size_t ControlAt(std::string_view text, size_t i) {
  const auto c = static_cast<unsigned char>(text[i]);
  if (c < 0x20 || c == 0x7f) return 1;
  if (c == 0xc2 && i + 1 < text.size()) {
    const auto n = static_cast<unsigned char>(text[i + 1]);
    if (n >= 0x80 && n <= 0x9f) return 2;
  }
  return 0;
}

}  // namespace

bool HasControlCharacters(std::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (ControlAt(text, i) != 0) return true;
  }
  return false;
}

std::string EscapeControlCharacters(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const size_t n = ControlAt(text, i);
    if (n == 0) {
      if (text[i] == '\\') out += '\\';
      out += text[i];
      continue;
    }
    for (size_t k = 0; k < n; ++k) {
      char hex[5];
      std::snprintf(hex, sizeof(hex), "\\x%02x", static_cast<unsigned char>(text[i + k]));
      out += hex;
    }
    i += n - 1;
  }
  return out;
}

}  // namespace kvtier
