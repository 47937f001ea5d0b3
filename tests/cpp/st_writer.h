// Minimal safetensors writer for tests, plus a self-deleting temporary directory.
//
//   StWriter w;
//   w.add("a", "F32", {2, 3}, bytes_of(std::vector<float>{...}));
//   w.write(dir / "model.safetensors");
//
// Corrupt files are made with `raw_header` / `write_raw`, or by editing the entries before write.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "deepinfer/error.h"

namespace st_test {

namespace fs = std::filesystem;

template <typename T>
std::string bytes_of(const std::vector<T>& v) {
  std::string s(v.size() * sizeof(T), '\0');
  if (!v.empty()) std::memcpy(s.data(), v.data(), s.size());
  return s;
}

// A directory under the system temp dir, removed (recursively) on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "deepinfer_test_XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

struct StEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
  // When set, written instead of the computed [begin, end).
  bool explicit_offsets = false;
  uint64_t begin = 0, end = 0;
};

class StWriter {
 public:
  StWriter& add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, std::string bytes) {
    entries_.push_back({name, dtype, std::move(shape), std::move(bytes)});
    return *this;
  }
  StWriter& meta(const std::string& key, const std::string& value) {
    metadata_[key] = value;
    return *this;
  }
  std::vector<StEntry>& entries() { return entries_; }

  // Header JSON and data section as the format lays them out: tensors back to back in order.
  std::string header_json() const {
    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    if (!metadata_.empty()) h["__metadata__"] = metadata_;
    uint64_t off = 0;
    for (const auto& e : entries_) {
      uint64_t b = e.explicit_offsets ? e.begin : off;
      uint64_t en = e.explicit_offsets ? e.end : off + e.bytes.size();
      h[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {b, en}}};
      off += e.bytes.size();
    }
    return h.dump();
  }
  std::string data() const {
    std::string d;
    for (const auto& e : entries_) d += e.bytes;
    return d;
  }

  // Writes the file; the header is space-padded to a multiple of 8 as the reference writer does.
  void write(const fs::path& path) const {
    std::string h = header_json();
    while (h.size() % 8) h += ' ';
    write_raw(path, h, data());
  }

  // 8-byte LE length (of `header`, or `length_override`), header bytes, data bytes.
  static void write_raw(const fs::path& path, const std::string& header, const std::string& data,
                        const uint64_t* length_override = nullptr) {
    uint64_t n = length_override ? *length_override : header.size();
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error("cannot write " + path.string());
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
  }

 private:
  std::vector<StEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

inline void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error("cannot write " + path.string());
  out << text;
}

// Runs `f`, expecting a deepinfer::Error; returns its message ("" with a test failure otherwise).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const deepinfer::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected deepinfer::Error, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected deepinfer::Error, nothing was thrown";
  return "";
}

// Every part must occur in the message.
inline ::testing::AssertionResult has_all(const std::string& msg, std::initializer_list<std::string> parts) {
  for (const auto& p : parts) {
    if (msg.find(p) == std::string::npos) {
      return ::testing::AssertionFailure() << "message lacks '" << p << "': " << msg;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace st_test
