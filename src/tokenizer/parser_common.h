// Internals shared by the output parsers (not part of the public API).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::parsers::detail {

enum class ScanKind { kNone, kMatch, kPartial };

struct ScanResult {
  ScanKind kind = ScanKind::kNone;
  std::size_t pos = 0;     // where the match or the possible (partial) match starts
  std::size_t marker = 0;  // index into the marker list
};

// Scans `text` from `from` for the first position where a marker matches in full, or (unless
// `at_end`) where the text's tail is a proper prefix of a marker, i.e. more bytes are needed to
// decide. At one position the first marker in list order that matches or may match wins, so list
// longer markers before shorter ones that share a start. The decision at each position depends only
// on the bytes from there on, which is what makes the parsers chunk-boundary-proof.
ScanResult scan_markers(std::string_view text, std::size_t from, const std::vector<std::string_view>& markers,
                        bool at_end);

inline bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

inline bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '\f' || c == '\v'; }

// Length of the valid UTF-8 sequence at s[i], or 0 if the byte there does not start one.
std::size_t utf8_seq_len(std::string_view s, std::size_t i);

}  // namespace deepinfer::parsers::detail
