// Byte-level BPE tokenizer (Hugging Face tokenizer.json) and incremental detokenizer.
#include "tokenizer/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <deepinfer/error.h>
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

namespace deepinfer {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// UTF-8
// ---------------------------------------------------------------------------------------------
namespace utf8 {
namespace {

struct Step {
  size_t len;      // bytes consumed (valid sequence length, or maximal ill-formed subpart length)
  bool ok;         // a well-formed sequence
  bool truncated;  // ill-formed only because the input ended (a valid prefix)
};

inline Step step(const unsigned char* p, size_t n) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) return {1, true, false};
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {1, false, false};
  }
  size_t k = 1;
  for (; k < need; ++k) {
    if (k >= n) return {k, false, true};
    const unsigned char c = p[k];
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) return {k, false, false};
  }
  return {need, true, false};
}

}  // namespace

size_t find_invalid(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const Step st = step(p + i, n - i);
    if (!st.ok) return i;
    i += st.len;
  }
  return std::string_view::npos;
}

std::string lossy(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  std::string out;
  out.reserve(n);
  size_t i = 0, run = 0;  // [run, i) is valid and not yet copied
  while (i < n) {
    const Step st = step(p + i, n - i);
    if (st.ok) {
      i += st.len;
      continue;
    }
    out.append(s.data() + run, i - run);
    out.append("\xEF\xBF\xBD");
    i += st.len;
    run = i;
  }
  out.append(s.data() + run, n - run);
  return out;
}

size_t incomplete_tail(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t start = n > 3 ? n - 3 : 0; start < n; ++start) {
    if (p[start] < 0xC0) continue;
    const Step st = step(p + start, n - start);
    if (st.truncated) return n - start;
  }
  return 0;
}

}  // namespace utf8

namespace {

// Decodes one code point of valid UTF-8 at p (returns its length through len).
inline uint32_t decode_cp(const unsigned char* p, size_t& len) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) {
    len = 1;
    return b0;
  }
  if (b0 < 0xE0) {
    len = 2;
    return (uint32_t(b0 & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (b0 < 0xF0) {
    len = 3;
    return (uint32_t(b0 & 0x0F) << 12) | (uint32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  len = 4;
  return (uint32_t(b0 & 0x07) << 18) | (uint32_t(p[1] & 0x3F) << 12) | (uint32_t(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

void append_cp(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

// Unicode White_Space (what Oniguruma's \s matches in Unicode mode).
bool is_unicode_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// The GPT-2 byte <-> unicode table: printable Latin-1 bytes map to themselves, the other 68 bytes
// to U+0100.. in byte order.
std::array<uint32_t, 256> byte_to_cp_table() {
  std::array<uint32_t, 256> t{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    t[b] = printable ? b : next++;
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// Regex (PCRE2 + JIT)
// ---------------------------------------------------------------------------------------------

// Onig-compatible classes for the shorthand escapes whose PCRE2 meaning differs.
constexpr const char* kSpaceClassBody =
    "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";
constexpr const char* kWordClassBody = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";

// Translates a Hugging Face (Oniguruma / Rust regex) pattern to PCRE2 syntax.
std::string translate_regex(const std::string& pat) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pat.size(); ++i) {
    const char c = pat[i];
    if (c == '\\' && i + 1 < pat.size()) {
      const char e = pat[i + 1];
      if (e == 's' || e == 'w') {
        const char* body = e == 's' ? kSpaceClassBody : kWordClassBody;
        if (in_class) {
          out += body;
        } else {
          out += '[';
          out += body;
          out += ']';
        }
        ++i;
        continue;
      }
      if (e == 'S' || e == 'W') {
        if (in_class)
          fail("tokenizer.json: regex {:?} uses \\{} inside a character class, which is not supported", pat, e);
        out += "[^";
        out += e == 'S' ? kSpaceClassBody : kWordClassBody;
        out += ']';
        ++i;
        continue;
      }
      out += c;
      out += e;
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < pat.size() && pat[i + 1] == '^') {
        out += '^';
        ++i;
      }
      if (i + 1 < pat.size() && pat[i + 1] == ']') {
        out += "\\]";
        ++i;
      }
      continue;
    }
    if (c == '[' && in_class) {
      // Nested '[' inside a class (POSIX [:alpha:] or a literal): PCRE2 needs it escaped unless
      // it opens a POSIX class.
      if (i + 1 < pat.size() && pat[i + 1] == ':') {
        out += c;
      } else {
        out += "\\[";
      }
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

class Regex {
 public:
  Regex(const std::string& pattern, bool literal) : source_(pattern) {
    int err = 0;
    PCRE2_SIZE off = 0;
    std::string pat;
    if (literal) {
      for (char c : pattern) {  // escape ASCII punctuation; everything else is literal already
        if (static_cast<unsigned char>(c) < 0x80 && !std::isalnum(static_cast<unsigned char>(c))) pat += '\\';
        pat += c;
      }
    } else {
      pat = translate_regex(pattern);
    }
    const uint32_t opts = PCRE2_UTF | PCRE2_UCP;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(), opts, &err, &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof(buf));
      fail("tokenizer.json: cannot compile the pre-tokenizer regex {:?} (as PCRE2 {:?}) at offset {}: {}", pattern, pat,
           size_t(off), reinterpret_cast<const char*>(buf));
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() { pcre2_code_free(code_); }

  // Calls f(start, end) for each non-overlapping match in s (an empty match advances one char).
  template <typename F>
  void for_each_match(std::string_view s, F&& f) const {
    thread_local struct Ctx {
      pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
      pcre2_match_context* mc = pcre2_match_context_create(nullptr);
      pcre2_jit_stack* js = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
      Ctx() { pcre2_jit_stack_assign(mc, nullptr, js); }
      ~Ctx() {
        pcre2_match_data_free(md);
        pcre2_match_context_free(mc);
        pcre2_jit_stack_free(js);
      }
    } ctx;
    const auto* subj = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t pos = 0;
    while (pos <= s.size()) {
      const int rc = jit_ ? pcre2_jit_match(code_, subj, s.size(), pos, PCRE2_NO_UTF_CHECK, ctx.md, ctx.mc)
                          : pcre2_match(code_, subj, s.size(), pos, PCRE2_NO_UTF_CHECK, ctx.md, ctx.mc);
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0) {
        PCRE2_UCHAR buf[256];
        pcre2_get_error_message(rc, buf, sizeof(buf));
        fail("tokenizer: regex {:?} failed on a {}-byte piece: {}", source_, s.size(),
             reinterpret_cast<const char*>(buf));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ctx.md);
      const size_t a = ov[0], b = ov[1];
      f(a, b);
      if (b > a) {
        pos = b;
      } else {
        if (b >= s.size()) return;
        size_t l = 1;
        decode_cp(subj + b, l);
        pos = b + l;
      }
    }
  }

 private:
  std::string source_;
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// The GPT-2 regex ByteLevel uses when use_regex is true.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct PreTokStep {
  enum Kind { Split, ByteLevel } kind;
  std::unique_ptr<Regex> regex;
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  bool add_prefix_space = false;
};

struct AddedToken {
  int32_t id;
  std::string content;
  bool special, lstrip, rstrip, normalized, single_word;
};

// A byte trie over added-token contents, for leftmost-longest matching.
class Trie {
 public:
  Trie() { nodes_.emplace_back(); }
  void insert(std::string_view s, int32_t value) {
    int32_t n = 0;
    for (unsigned char c : s) {
      int32_t child = find(n, c);
      if (child < 0) {
        child = int32_t(nodes_.size());
        nodes_.emplace_back();
        nodes_[n].children.emplace_back(c, child);
      }
      n = child;
    }
    nodes_[n].value = value;
    if (!s.empty()) first_[static_cast<unsigned char>(s[0])] = true;
  }
  bool empty() const { return nodes_.size() == 1; }
  // Longest entry starting at s[0]: returns (value, length) or (-1, 0).
  std::pair<int32_t, size_t> longest(std::string_view s) const {
    if (s.empty() || !first_[static_cast<unsigned char>(s[0])]) return {-1, 0};
    int32_t n = 0, best = -1;
    size_t best_len = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      n = find(n, static_cast<unsigned char>(s[i]));
      if (n < 0) break;
      if (nodes_[n].value >= 0) {
        best = nodes_[n].value;
        best_len = i + 1;
      }
    }
    return {best, best_len};
  }
  bool first_byte(unsigned char c) const { return first_[c]; }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int32_t value = -1;
  };
  int32_t find(int32_t n, unsigned char c) const {
    for (const auto& [k, v] : nodes_[n].children)
      if (k == c) return v;
    return -1;
  }
  std::vector<Node> nodes_;
  std::array<bool, 256> first_{};
};

// Merge table: (left id, right id) -> (rank, merged id), open addressing.
class MergeTable {
 public:
  void build(const std::vector<std::tuple<int32_t, int32_t, int32_t>>& merges) {  // (a, b, new)
    size_t cap = 16;
    while (cap < merges.size() * 2 + 1) cap <<= 1;
    mask_ = cap - 1;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, {0, 0});
    for (size_t r = 0; r < merges.size(); ++r) {
      const auto [a, b, n] = merges[r];
      const uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
      size_t h = hash(key);
      while (keys_[h] != kEmpty && keys_[h] != key) h = (h + 1) & mask_;
      keys_[h] = key;
      vals_[h] = {int32_t(r), n};  // a later duplicate overwrites (as HF's map does)
    }
  }
  // Returns false when (a, b) has no merge.
  inline bool get(int32_t a, int32_t b, int32_t& rank, int32_t& merged) const {
    if (keys_.empty()) return false;
    const uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
    size_t h = hash(key);
    while (true) {
      const uint64_t k = keys_[h];
      if (k == key) {
        rank = vals_[h].first;
        merged = vals_[h].second;
        return true;
      }
      if (k == kEmpty) return false;
      h = (h + 1) & mask_;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  size_t hash(uint64_t k) const { return size_t((k * 0x9E3779B97F4A7C15ULL) >> 17) & mask_; }
  std::vector<uint64_t> keys_;
  std::vector<std::pair<int32_t, int32_t>> vals_;
  size_t mask_ = 0;
};

struct StringViewHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open {}: check the path (a Hugging Face tokenizer.json is expected)", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Tokenizer::Impl
// ---------------------------------------------------------------------------------------------
struct Tokenizer::Impl {
  // Model (BPE).
  std::unordered_map<std::string, int32_t, StringViewHash, std::equal_to<>> vocab;
  MergeTable merges;
  bool ignore_merges = false;
  bool byte_fallback = false;
  int32_t unk_id = -1;
  bool fuse_unk = false;

  // Added tokens.
  std::vector<AddedToken> added;
  std::unordered_map<std::string, int32_t, StringViewHash, std::equal_to<>> added_by_content;
  Trie trie_raw;         // normalized == false: matched first, over the whole text
  Trie trie_normalized;  // normalized == true: matched in the gaps

  // Pipeline.
  std::vector<PreTokStep> pretok;
  bool byte_level = false;  // a ByteLevel pre-tokenizer maps bytes to the GPT-2 alphabet

  // Id space.
  int32_t n_ids = 0;
  std::vector<std::string> id_token;  // token strings ("" for holes)
  std::vector<std::string> id_bytes;  // decoder output per id
  std::vector<uint8_t> id_present;
  std::vector<uint8_t> id_special;
  std::array<int32_t, 256> byte_id{};  // id of the byte-level char of each byte (-1 if absent)

  int32_t bos = -1, eos = -1;
  bool add_bos = false, add_eos = false;

  // Word cache (pieces up to kCacheMaxLen bytes).
  static constexpr size_t kCacheMaxLen = 64;
  static constexpr size_t kCacheMaxEntries = 1 << 18;
  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringViewHash, std::equal_to<>> cache;

  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
  void bpe_uncached(std::string_view piece, std::vector<int32_t>& out) const;
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
  void split_added(std::string_view text, const Trie& trie, bool normalized_pass,
                   std::vector<std::pair<std::string_view, int32_t>>& out) const;
};

namespace {

bool is_word_char_at(std::string_view s, size_t pos, bool before) {
  // Character just before `pos` (before=true) or at `pos`: alphanumeric or '_' counts as a word char.
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  if (before) {
    if (pos == 0) return false;
    size_t i = pos - 1;
    while (i > 0 && (p[i] & 0xC0) == 0x80) --i;
    size_t l;
    const uint32_t c = decode_cp(p + i, l);
    return c >= 0x80 ? !is_unicode_space(c) : (std::isalnum(int(c)) || c == '_');
  }
  if (pos >= s.size()) return false;
  size_t l;
  const uint32_t c = decode_cp(p + pos, l);
  return c >= 0x80 ? !is_unicode_space(c) : (std::isalnum(int(c)) || c == '_');
}

}  // namespace

// Splits `text` at the added tokens of `trie` (leftmost-longest); gaps get id -1.
void Tokenizer::Impl::split_added(std::string_view text, const Trie& trie, bool normalized_pass,
                                  std::vector<std::pair<std::string_view, int32_t>>& out) const {
  (void)normalized_pass;
  if (trie.empty()) {
    if (!text.empty()) out.emplace_back(text, -1);
    return;
  }
  size_t gap = 0, i = 0;
  const size_t n = text.size();
  while (i < n) {
    if (!trie.first_byte(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    const auto [idx, len] = trie.longest(text.substr(i));
    if (idx < 0) {
      ++i;
      continue;
    }
    const AddedToken& t = added[size_t(idx)];
    size_t s = i, e = i + len;
    if (t.single_word && (is_word_char_at(text, s, true) || is_word_char_at(text, e, false))) {
      ++i;
      continue;
    }
    if (t.lstrip) {
      while (s > gap) {
        size_t j = s - 1;
        while (j > gap && (static_cast<unsigned char>(text[j]) & 0xC0) == 0x80) --j;
        size_t l;
        if (!is_unicode_space(decode_cp(reinterpret_cast<const unsigned char*>(text.data()) + j, l))) break;
        s = j;
      }
    }
    if (t.rstrip) {
      while (e < n) {
        size_t l;
        if (!is_unicode_space(decode_cp(reinterpret_cast<const unsigned char*>(text.data()) + e, l))) break;
        e += l;
      }
    }
    if (s > gap) out.emplace_back(text.substr(gap, s - gap), -1);
    out.emplace_back(text.substr(s, e - s), t.id);
    gap = i = e;
  }
  if (gap < n) out.emplace_back(text.substr(gap), -1);
}

void Tokenizer::Impl::bpe_uncached(std::string_view piece, std::vector<int32_t>& out) const {
  struct Sym {
    int32_t id;
    int32_t prev, next;
    int32_t len;  // 0: merged away
  };
  thread_local std::vector<Sym> syms;
  syms.clear();
  const auto* p = reinterpret_cast<const unsigned char*>(piece.data());
  auto push_sym = [&](int32_t id, int32_t len) {
    const int32_t idx = int32_t(syms.size());
    syms.push_back({id, idx - 1, -1, len});
  };
  if (byte_level) {
    if (ignore_merges) {
      std::string word;
      static const std::array<uint32_t, 256> b2c = byte_to_cp_table();
      for (size_t i = 0; i < piece.size(); ++i) append_cp(word, b2c[p[i]]);
      auto it = vocab.find(word);
      if (it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    for (size_t i = 0; i < piece.size(); ++i) {
      const int32_t id = byte_id[p[i]];
      if (id >= 0) {
        push_sym(id, 1);
      } else if (unk_id >= 0) {
        push_sym(unk_id, 1);
      }
    }
  } else {
    if (ignore_merges) {
      auto it = vocab.find(piece);
      if (it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    size_t i = 0;
    while (i < piece.size()) {
      size_t l;
      decode_cp(p + i, l);
      auto it = vocab.find(piece.substr(i, l));
      if (it != vocab.end()) {
        push_sym(it->second, int32_t(l));
      } else if (byte_fallback) {
        bool all = true;
        std::vector<int32_t> bs;
        for (size_t k = 0; k < l; ++k) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "<0x%02X>", unsigned(p[i + k]));
          auto bt = vocab.find(std::string_view(buf));
          if (bt == vocab.end()) {
            all = false;
            break;
          }
          bs.push_back(bt->second);
        }
        if (all) {
          for (int32_t b : bs) push_sym(b, 1);
        } else if (unk_id >= 0) {
          push_sym(unk_id, int32_t(l));
        }
      } else if (unk_id >= 0) {
        if (!(fuse_unk && !syms.empty() && syms.back().id == unk_id)) push_sym(unk_id, int32_t(l));
      }
      i += l;
    }
  }
  const int32_t n = int32_t(syms.size());
  for (int32_t k = 0; k < n; ++k) syms[size_t(k)].next = k + 1 < n ? k + 1 : -1;

  struct Cand {
    int32_t rank, pos, merged;
    bool operator<(const Cand& o) const {  // max-heap inverted: lowest rank, then leftmost
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  thread_local std::vector<Cand> heap;
  heap.clear();
  int32_t rank, merged;
  for (int32_t k = 0; k + 1 < n; ++k)
    if (merges.get(syms[size_t(k)].id, syms[size_t(k + 1)].id, rank, merged)) heap.push_back({rank, k, merged});
  std::make_heap(heap.begin(), heap.end());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Cand top = heap.back();
    heap.pop_back();
    Sym& left = syms[size_t(top.pos)];
    if (left.len == 0 || left.next < 0) continue;
    Sym& right = syms[size_t(left.next)];
    if (!merges.get(left.id, right.id, rank, merged) || merged != top.merged) continue;
    left.id = top.merged;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (left.next >= 0) syms[size_t(left.next)].prev = top.pos;
    if (left.prev >= 0 && merges.get(syms[size_t(left.prev)].id, left.id, rank, merged)) {
      heap.push_back({rank, left.prev, merged});
      std::push_heap(heap.begin(), heap.end());
    }
    if (left.next >= 0 && merges.get(left.id, syms[size_t(left.next)].id, rank, merged)) {
      heap.push_back({rank, top.pos, merged});
      std::push_heap(heap.begin(), heap.end());
    }
  }
  for (int32_t k = n > 0 ? 0 : -1; k >= 0; k = syms[size_t(k)].next) out.push_back(syms[size_t(k)].id);
}

void Tokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() > kCacheMaxLen) {
    bpe_uncached(piece, out);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(cache_mu);
    auto it = cache.find(piece);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t before = out.size();
  bpe_uncached(piece, out);
  std::vector<int32_t> ids(out.begin() + std::ptrdiff_t(before), out.end());
  std::lock_guard<std::mutex> lk(cache_mu);
  if (cache.size() >= kCacheMaxEntries) cache.clear();
  cache.emplace(std::string(piece), std::move(ids));
}

// Normalizer (identity) + pre-tokenizer + BPE over text without added tokens.
void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  thread_local std::vector<std::string_view> cur, nxt;
  std::deque<std::string> arena;  // pieces that got a prefix space
  cur.clear();
  cur.push_back(text);
  struct Span {
    size_t a, b;
    bool match;
  };
  std::vector<Span> spans;
  for (const PreTokStep& st : pretok) {
    nxt.clear();
    for (std::string_view piece : cur) {
      if (st.kind == PreTokStep::ByteLevel) {
        if (st.add_prefix_space && piece.front() != ' ') {
          std::string& spaced = arena.emplace_back(piece.size() + 1, ' ');
          std::copy(piece.begin(), piece.end(), spaced.begin() + 1);
          piece = spaced;
        }
        if (!st.regex) {
          nxt.push_back(piece);
          continue;
        }
      }
      spans.clear();
      size_t prev = 0;
      st.regex->for_each_match(piece, [&](size_t a, size_t b) {
        if (a > prev) spans.push_back({prev, a, st.invert});
        spans.push_back({a, b, !st.invert});
        prev = b;
      });
      if (prev < piece.size()) spans.push_back({prev, piece.size(), st.invert});
      const SplitBehavior beh = st.kind == PreTokStep::ByteLevel ? SplitBehavior::Isolated : st.behavior;
      const size_t first = nxt.size();
      auto emit = [&](size_t a, size_t b) { nxt.push_back(piece.substr(a, b - a)); };
      switch (beh) {
        case SplitBehavior::Isolated:
          for (const Span& s : spans) emit(s.a, s.b);
          break;
        case SplitBehavior::Removed:
          for (const Span& s : spans)
            if (!s.match) emit(s.a, s.b);
          break;
        case SplitBehavior::MergedWithPrevious: {
          bool prev_match = false;
          for (const Span& s : spans) {
            if (s.match && !prev_match && nxt.size() > first) {
              std::string_view& last = nxt.back();
              last = std::string_view(last.data(), size_t(piece.data() + s.b - last.data()));
            } else {
              emit(s.a, s.b);
            }
            prev_match = s.match;
          }
          break;
        }
        case SplitBehavior::MergedWithNext: {
          std::vector<std::string_view> rev;
          bool prev_match = false;
          for (size_t k = spans.size(); k-- > 0;) {
            const Span& s = spans[k];
            if (s.match && !prev_match && !rev.empty()) {
              std::string_view& last = rev.back();
              last = std::string_view(piece.data() + s.a, size_t(last.data() + last.size() - (piece.data() + s.a)));
            } else {
              rev.push_back(piece.substr(s.a, s.b - s.a));
            }
            prev_match = s.match;
          }
          nxt.insert(nxt.end(), rev.rbegin(), rev.rend());
          break;
        }
        case SplitBehavior::Contiguous: {
          bool prev_match = false;
          for (const Span& s : spans) {
            if (s.match == prev_match && nxt.size() > first) {
              std::string_view& last = nxt.back();
              last = std::string_view(last.data(), size_t(piece.data() + s.b - last.data()));
            } else {
              emit(s.a, s.b);
            }
            prev_match = s.match;
          }
          break;
        }
      }
      // Drop empty pieces.
      nxt.erase(
          std::remove_if(nxt.begin() + std::ptrdiff_t(first), nxt.end(), [](std::string_view v) { return v.empty(); }),
          nxt.end());
    }
    std::swap(cur, nxt);
  }
  for (std::string_view piece : cur) bpe(piece, out);
}

// ---------------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------------
namespace {

void load_pretokenizer(const json& j, std::vector<PreTokStep>& steps, bool& byte_level) {
  if (j.is_null()) return;
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const json& s : j.at("pretokenizers")) load_pretokenizer(s, steps, byte_level);
    return;
  }
  if (type == "Split") {
    PreTokStep st{PreTokStep::Split, nullptr};
    const json& pat = j.at("pattern");
    if (pat.contains("Regex")) {
      st.regex = std::make_unique<Regex>(pat.at("Regex").get<std::string>(), false);
    } else if (pat.contains("String")) {
      st.regex = std::make_unique<Regex>(pat.at("String").get<std::string>(), true);
    } else {
      fail("tokenizer.json: Split pattern must be {{\"Regex\": ...}} or {{\"String\": ...}}, got {}", pat.dump());
    }
    const std::string beh = j.value("behavior", "Isolated");
    if (beh == "Isolated")
      st.behavior = SplitBehavior::Isolated;
    else if (beh == "Removed")
      st.behavior = SplitBehavior::Removed;
    else if (beh == "MergedWithPrevious")
      st.behavior = SplitBehavior::MergedWithPrevious;
    else if (beh == "MergedWithNext")
      st.behavior = SplitBehavior::MergedWithNext;
    else if (beh == "Contiguous")
      st.behavior = SplitBehavior::Contiguous;
    else
      fail("tokenizer.json: unknown Split behavior {:?}", beh);
    st.invert = j.value("invert", false);
    steps.push_back(std::move(st));
    return;
  }
  if (type == "ByteLevel") {
    PreTokStep st{PreTokStep::ByteLevel, nullptr};
    st.add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) st.regex = std::make_unique<Regex>(kGpt2Pattern, false);
    steps.push_back(std::move(st));
    byte_level = true;
    return;
  }
  fail("tokenizer.json: unsupported pre_tokenizer type {:?} (supported: Sequence, Split, ByteLevel)", type);
}

void check_normalizer(const json& j) {
  if (j.is_null()) return;
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const json& s : j.at("normalizers")) check_normalizer(s);
    return;
  }
  fail("tokenizer.json: unsupported normalizer {:?}; only an empty Sequence (or null) is supported", type);
}

void check_decoder(const json& j) {
  if (j.is_null()) fail("tokenizer.json: a ByteLevel decoder is required (decoder is null)");
  const std::string type = j.value("type", "");
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const json& ds = j.at("decoders");
    if (ds.size() == 1) return check_decoder(ds[0]);
  }
  fail("tokenizer.json: unsupported decoder {:?}; only ByteLevel is supported", type);
}

std::optional<std::string> token_content(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_json_string(std::string_view text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("tokenizer.json: not valid JSON: {}", e.what());
  }
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  try {
    // Model.
    const json& model = j.at("model");
    const std::string mtype = model.value("type", "BPE");
    if (mtype != "BPE") fail("tokenizer.json: unsupported model type {:?}; only BPE is supported", mtype);
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(key) && !model[key].is_null() && model[key] != "")
        fail("tokenizer.json: BPE option {} is not supported", key);
    if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() != 0.0)
      fail("tokenizer.json: BPE dropout is not supported");
    m.ignore_merges = model.value("ignore_merges", false);
    m.byte_fallback = model.value("byte_fallback", false);
    m.fuse_unk = model.value("fuse_unk", false);
    int32_t max_id = -1;
    for (const auto& [tok, id] : model.at("vocab").items()) {
      const int32_t v = id.get<int32_t>();
      if (v < 0) fail("tokenizer.json: negative id {} for token {:?}", v, tok);
      m.vocab.emplace(tok, v);
      max_id = std::max(max_id, v);
    }
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      auto it = m.vocab.find(model["unk_token"].get<std::string>());
      if (it != m.vocab.end()) m.unk_id = it->second;
    }
    std::vector<std::tuple<int32_t, int32_t, int32_t>> merges;
    if (model.contains("merges")) {
      const json& ms = model["merges"];
      merges.reserve(ms.size());
      for (size_t r = 0; r < ms.size(); ++r) {
        std::string a, b;
        if (ms[r].is_string()) {
          const std::string s = ms[r].get<std::string>();
          const size_t sp = s.find(' ');
          if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
            fail("tokenizer.json: merge {} ({:?}) is not of the form \"a b\"", r, s);
          a = s.substr(0, sp);
          b = s.substr(sp + 1);
        } else if (ms[r].is_array() && ms[r].size() == 2) {
          a = ms[r][0].get<std::string>();
          b = ms[r][1].get<std::string>();
        } else {
          fail("tokenizer.json: merge {} is neither \"a b\" nor [a, b]: {}", r, ms[r].dump());
        }
        auto ia = m.vocab.find(a), ib = m.vocab.find(b), in = m.vocab.find(a + b);
        if (ia == m.vocab.end() || ib == m.vocab.end() || in == m.vocab.end())
          fail("tokenizer.json: merge {} ({:?} + {:?}) uses a token missing from the vocabulary", r, a, b);
        merges.emplace_back(ia->second, ib->second, in->second);
      }
    }
    m.merges.build(merges);

    // Added tokens.
    if (j.contains("added_tokens")) {
      for (const json& t : j["added_tokens"]) {
        AddedToken at{t.at("id").get<int32_t>(),    t.at("content").get<std::string>(), t.value("special", false),
                      t.value("lstrip", false),     t.value("rstrip", false),           t.value("normalized", true),
                      t.value("single_word", false)};
        if (at.id < 0) fail("tokenizer.json: added token {:?} has a negative id", at.content);
        if (at.content.empty()) fail("tokenizer.json: added token {} has empty content", at.id);
        max_id = std::max(max_id, at.id);
        m.added_by_content[at.content] = at.id;
        m.added.push_back(std::move(at));
      }
      for (size_t k = 0; k < m.added.size(); ++k)
        (m.added[k].normalized ? m.trie_normalized : m.trie_raw).insert(m.added[k].content, int32_t(k));
    }

    check_normalizer(j.value("normalizer", json()));
    load_pretokenizer(j.value("pre_tokenizer", json()), m.pretok, m.byte_level);
    check_decoder(j.value("decoder", json()));
    if (!m.byte_level) fail("tokenizer.json: a ByteLevel pre-tokenizer is required (byte-level BPE only)");

    // Id tables.
    m.n_ids = max_id + 1;
    m.id_token.assign(size_t(m.n_ids), std::string());
    m.id_present.assign(size_t(m.n_ids), 0);
    m.id_special.assign(size_t(m.n_ids), 0);
    for (const auto& [tok, id] : m.vocab) {
      m.id_token[size_t(id)] = tok;
      m.id_present[size_t(id)] = 1;
    }
    for (const AddedToken& at : m.added) {
      m.id_token[size_t(at.id)] = at.content;
      m.id_present[size_t(at.id)] = 1;
      m.id_special[size_t(at.id)] = at.special;
    }
    // Decoder bytes: each char of the token through the byte table; a token with a char outside
    // the table passes through as its UTF-8 bytes (HF's ByteLevel decoder).
    const auto b2c = byte_to_cp_table();
    std::unordered_map<uint32_t, unsigned char> c2b;
    for (int b = 0; b < 256; ++b) c2b[b2c[size_t(b)]] = static_cast<unsigned char>(b);
    m.id_bytes.assign(size_t(m.n_ids), std::string());
    for (int32_t id = 0; id < m.n_ids; ++id) {
      const std::string& t = m.id_token[size_t(id)];
      std::string bytes;
      bool all = true;
      const auto* p = reinterpret_cast<const unsigned char*>(t.data());
      for (size_t i = 0; i < t.size();) {
        size_t l;
        const uint32_t cp = decode_cp(p + i, l);
        auto it = c2b.find(cp);
        if (it == c2b.end()) {
          all = false;
          break;
        }
        bytes.push_back(char(it->second));
        i += l;
      }
      m.id_bytes[size_t(id)] = all ? bytes : t;
    }
    for (int b = 0; b < 256; ++b) {
      std::string c;
      append_cp(c, b2c[size_t(b)]);
      auto it = m.vocab.find(c);
      m.byte_id[size_t(b)] = it == m.vocab.end() ? -1 : it->second;
    }
    // Default BOS/EOS: the DeepSeek spellings when present (tokenizer_config overrides).
    if (auto it = m.added_by_content.find("<｜begin▁of▁sentence｜>"); it != m.added_by_content.end())
      m.bos = it->second;
    if (auto it = m.added_by_content.find("<｜end▁of▁sentence｜>"); it != m.added_by_content.end()) m.eos = it->second;
  } catch (const json::exception& e) {
    fail("tokenizer.json: unexpected structure: {}", e.what());
  }
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_file(const std::string& path) { return from_json_string(read_file(path)); }

Tokenizer Tokenizer::from_pretrained(const std::string& dir) {
  Tokenizer tok = from_file(dir + "/tokenizer.json");
  std::ifstream f(dir + "/tokenizer_config.json", std::ios::binary);
  if (!f) return tok;
  json cfg;
  try {
    cfg = json::parse(f);
  } catch (const json::exception& e) {
    fail("{}/tokenizer_config.json: not valid JSON: {}", dir, e.what());
  }
  Impl& m = *tok.impl_;
  auto resolve = [&](const char* key, int32_t& dst) {
    if (!cfg.contains(key)) return;
    auto content = token_content(cfg[key]);
    if (!content) {
      if (cfg[key].is_null()) dst = -1;
      return;
    }
    auto id = tok.token_to_id(*content);
    if (!id) fail("{}/tokenizer_config.json: {} {:?} is not in the vocabulary", dir, key, *content);
    dst = *id;
  };
  resolve("bos_token", m.bos);
  resolve("eos_token", m.eos);
  if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) m.add_bos = cfg["add_bos_token"].get<bool>();
  if (cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean()) m.add_eos = cfg["add_eos_token"].get<bool>();
  return tok;
}

// ---------------------------------------------------------------------------------------------
// Encode / decode
// ---------------------------------------------------------------------------------------------
std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& m = *impl_;
  if (const size_t bad = utf8::find_invalid(text); bad != std::string_view::npos) {
    const auto b0 = static_cast<unsigned char>(text[bad]);
    const bool surrogate = b0 == 0xED && bad + 1 < text.size() && static_cast<unsigned char>(text[bad + 1]) >= 0xA0;
    fail("tokenizer: input is not valid UTF-8 at byte offset {} (byte 0x{:02X}{}); pass UTF-8 text", bad, b0,
         surrogate ? ", an encoded surrogate" : "");
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special_tokens && m.add_bos && m.bos >= 0) out.push_back(m.bos);
  std::vector<std::pair<std::string_view, int32_t>> pass1, pass2;
  m.split_added(text, m.trie_raw, false, pass1);
  for (const auto& [seg, id] : pass1) {
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    pass2.clear();
    m.split_added(seg, m.trie_normalized, true, pass2);
    for (const auto& [seg2, id2] : pass2) {
      if (id2 >= 0)
        out.push_back(id2);
      else
        m.encode_plain(seg2, out);
    }
  }
  if (add_special_tokens && m.add_eos && m.eos >= 0) out.push_back(m.eos);
  return out;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  const Impl& m = *impl_;
  if (id < 0 || id >= m.n_ids) fail("tokenizer: token id {} is out of range [0, {})", id, m.n_ids);
  return m.id_bytes[size_t(id)];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= m.n_ids) fail("tokenizer: cannot decode token id {}: out of range [0, {})", id, m.n_ids);
    if (skip_special_tokens && m.id_special[size_t(id)]) continue;
    bytes += m.id_bytes[size_t(id)];
  }
  return utf8::lossy(bytes);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const Impl& m = *impl_;
  if (auto it = m.added_by_content.find(token); it != m.added_by_content.end()) return it->second;
  if (auto it = m.vocab.find(token); it != m.vocab.end()) return it->second;
  return std::nullopt;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  const Impl& m = *impl_;
  if (id < 0 || id >= m.n_ids || !m.id_present[size_t(id)])
    fail("tokenizer: no token with id {} (vocab_size {})", id, m.n_ids);
  return m.id_token[size_t(id)];
}

int32_t Tokenizer::vocab_size() const { return impl_->n_ids; }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
bool Tokenizer::add_bos_token() const { return impl_->add_bos; }
bool Tokenizer::is_special(int32_t id) const { return id >= 0 && id < impl_->n_ids && impl_->id_special[size_t(id)]; }

// ---------------------------------------------------------------------------------------------
// IncrementalDetokenizer
// ---------------------------------------------------------------------------------------------
IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tok_(&tokenizer), skip_special_(skip_special_tokens) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  const std::string& b = tok_->token_bytes(id);  // throws when out of range
  if (skip_special_ && tok_->is_special(id)) return {};
  pending_ += b;
  const size_t tail = utf8::incomplete_tail(pending_);
  const size_t ready = pending_.size() - tail;
  if (ready == 0) return {};
  std::string out = utf8::lossy(std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out = utf8::lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace deepinfer
