// One byte of a JSON string body as Python's json.dumps(ensure_ascii=False) writes it: the short
// escapes for " \ \n \r \t \b \f, \u00XX for the other control characters, every other byte as is.
// Shared by the prompt encoders (which must match the reference's json.dumps byte for byte) and
// the tool-call parsers (which build argument JSON the same way).
#pragma once

#include <cstdio>
#include <string>

namespace deepinfer {

inline void append_json_escaped(std::string& out, unsigned char c) {
  switch (c) {
    case '"':
      out += "\\\"";
      return;
    case '\\':
      out += "\\\\";
      return;
    case '\n':
      out += "\\n";
      return;
    case '\r':
      out += "\\r";
      return;
    case '\t':
      out += "\\t";
      return;
    case '\b':
      out += "\\b";
      return;
    case '\f':
      out += "\\f";
      return;
    default:
      if (c < 0x20) {
        char tmp[8];
        std::snprintf(tmp, sizeof tmp, "\\u%04x", c);
        out += tmp;
      } else {
        out.push_back(static_cast<char>(c));
      }
  }
}

}  // namespace deepinfer
