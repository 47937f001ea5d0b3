// Shared pieces of the output parsers: marker scanning, DSML dialects, JSON quoting, UTF-8 carry.
#include "tokenizer/parser_common.h"

#include <array>
#include <cstdio>

#include "tokenizer/json_escape.h"
#include "tokenizer/parsers.h"

namespace deepinfer::parsers {
namespace detail {

ScanResult scan_markers(std::string_view text, std::size_t from, const std::vector<std::string_view>& markers,
                        bool at_end) {
  std::array<bool, 256> first{};
  for (auto m : markers)
    if (!m.empty()) first[static_cast<unsigned char>(m[0])] = true;
  for (std::size_t i = from; i < text.size(); ++i) {
    if (!first[static_cast<unsigned char>(text[i])]) continue;
    std::string_view rest = text.substr(i);
    for (std::size_t k = 0; k < markers.size(); ++k) {
      std::string_view m = markers[k];
      if (m.empty()) continue;
      if (starts_with(rest, m)) return {ScanKind::kMatch, i, k};
      if (!at_end && rest.size() < m.size() && starts_with(m, rest)) return {ScanKind::kPartial, i, k};
    }
  }
  return {ScanKind::kNone, text.size(), 0};
}

std::size_t utf8_seq_len(std::string_view s, std::size_t i) {
  auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  if (c < 0x80) return 1;
  std::size_t n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  return n;
}

}  // namespace detail

DsmlDialect DsmlDialect::for_family(Family f) {
  const std::string d(kDsml);
  const std::string sp = f == Family::kV41 ? " " : "";
  const std::string block = f == Family::kV41 ? " calls" : "tool_calls";
  DsmlDialect x;
  x.block_open = "<" + d + block + ">";
  x.block_close = "</" + d + block + ">";
  x.invoke_open = "<" + d + sp + "invoke";
  x.invoke_close = "</" + d + sp + "invoke>";
  x.param_open = "<" + d + sp + "parameter";
  x.param_close = "</" + d + sp + "parameter>";
  return x;
}

std::string json_quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  for (std::size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      std::size_t n = detail::utf8_seq_len(s, i);
      if (n == 0) {
        out += "\xEF\xBF\xBD";  // U+FFFD
        ++i;
      } else {
        out.append(s.substr(i, n));
        i += n;
      }
      continue;
    }
    append_json_escaped(out, c);
    ++i;
  }
  out.push_back('"');
  return out;
}

std::string Utf8Carry::push(std::string_view s) {
  pending_.append(s);
  // Find the start of a possibly incomplete final sequence (a lead byte in the last 3 bytes whose
  // sequence runs past the end, followed only by continuation bytes).
  std::size_t n = pending_.size();
  std::size_t keep_from = n;
  for (std::size_t back = 1; back <= 3 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(pending_[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    std::size_t need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 1;
    if (need > back) keep_from = n - back;
    break;
  }
  std::string out = pending_.substr(0, keep_from);
  pending_.erase(0, keep_from);
  return out;
}

std::string Utf8Carry::finish() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace deepinfer::parsers
