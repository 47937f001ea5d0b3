// Byte-level BPE tokenizer loaded from a Hugging Face `tokenizer.json` (the DeepSeek-V4 family
// format), and an incremental detokenizer for streaming output.
//
// Pipeline of encode(), as Hugging Face `tokenizers` does it:
//   1. validate UTF-8 (bad input -> deepinfer::Error naming the byte offset);
//   2. added tokens are matched in the raw text first: the non-normalized ones over the whole text,
//      then the normalized ones over the gaps (leftmost-longest at each step); the text between
//      them goes through steps 3-5;
//   3. normalizer (only an empty `Sequence` / none is accepted);
//   4. pre-tokenizer: `Split` (regex, PCRE2 + JIT; behavior Isolated/Removed/...) and `ByteLevel`,
//      possibly inside a `Sequence`;
//   5. BPE on each piece (merges by rank, leftmost first on ties; per-piece cache).
// decode() maps ids back to bytes with the ByteLevel decoder and decodes UTF-8 lossily (U+FFFD for
// each maximal ill-formed subsequence, as Rust's from_utf8_lossy).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer {

class Tokenizer {
 public:
  // Loads a `tokenizer.json`. Throws deepinfer::Error on unreadable or unsupported files.
  static Tokenizer from_file(const std::string& tokenizer_json);
  // dir/tokenizer.json plus, when present, dir/tokenizer_config.json (bos/eos tokens, add_bos_token,
  // add_eos_token).
  static Tokenizer from_pretrained(const std::string& dir);
  // Parses the JSON text of a `tokenizer.json`.
  static Tokenizer from_json_string(std::string_view json_text);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of `text` (UTF-8). add_special_tokens prepends BOS / appends EOS when the
  // tokenizer_config asks for it (add_bos_token / add_eos_token; both false for DeepSeek-V4).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Text of `ids` (out-of-range ids throw). skip_special_tokens drops added tokens marked special.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token string (vocabulary form, i.e. byte-level characters for BPE tokens); throws when out
  // of range or when the id has no token.
  std::string id_to_token(int32_t id) const;
  // The bytes the decoder produces for `id` (empty for holes in the id space).
  const std::string& token_bytes(int32_t id) const;

  // max id + 1 over the vocabulary and the added tokens.
  int32_t vocab_size() const;
  // -1 when unknown.
  int32_t bos_id() const;
  int32_t eos_id() const;
  // True for added tokens marked "special" (what decode(skip_special_tokens=true) drops).
  bool is_special(int32_t id) const;
  bool add_bos_token() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streams text as ids arrive. push() returns only text that is final: it holds back an incomplete
// UTF-8 sequence at the end, and emits U+FFFD as soon as bytes are known to be ill-formed.
// Concatenating every push() and the final flush() equals tokenizer.decode(all ids, skip).
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = false);

  std::string push(int32_t id);
  // Emits what remains (an incomplete trailing sequence becomes U+FFFD) and resets the state.
  std::string flush();
  // Bytes held back, waiting for the rest of a UTF-8 character.
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

namespace utf8 {
// Offset of the first byte of the first ill-formed sequence, or npos when `s` is valid UTF-8
// (surrogates U+D800..DFFF, overlongs and code points above U+10FFFF are ill-formed).
size_t find_invalid(std::string_view s);
// Lossy decoding: each maximal ill-formed subpart becomes U+FFFD (Unicode §3.9 / WHATWG; what Rust's
// String::from_utf8_lossy does).
std::string lossy(std::string_view s);
// Length of the trailing bytes of `s` that form an incomplete but so-far-valid UTF-8 sequence
// (0..3): the bytes a streaming decoder must hold back.
size_t incomplete_tail(std::string_view s);
}  // namespace utf8

}  // namespace deepinfer
