// SafetensorsFile: round trips of every dtype and every malformed-file error (src/io/safetensors.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "deepinfer/dtype.h"
#include "deepinfer/error.h"
#include "io/safetensors.h"
#include "st_writer.h"

using namespace deepinfer;
using namespace st_test;

namespace {

template <typename T>
std::vector<T> read_back(const Tensor& t) {
  std::vector<T> v(static_cast<size_t>(t.numel()));
  if (!v.empty()) std::memcpy(v.data(), t.raw(), v.size() * sizeof(T));
  return v;
}

std::vector<uint8_t> all_bytes() {
  std::vector<uint8_t> v(256);
  for (int i = 0; i < 256; ++i) v[i] = static_cast<uint8_t>(i);
  return v;
}

}  // namespace

TEST(Safetensors, RoundTripEveryDtype) {
  TempDir dir;
  const std::vector<float> f32 = {1.5f, -2.25f, 3e-8f, std::numeric_limits<float>::infinity(), 0.0f, -0.0f};
  std::vector<uint16_t> bf16;
  const std::vector<float> bf16_vals = {1.0f, -0.5f, 3.140625f, 65280.0f};
  for (float f : bf16_vals) bf16.push_back(f32_to_bf16(f));
  const std::vector<uint16_t> f16 = {0x3C00, 0xC000, 0x7BFF, 0x0001};  // 1, -2, 65504, min subnormal
  const std::vector<uint8_t> e4m3 = all_bytes();
  const std::vector<uint8_t> e8m0 = all_bytes();
  std::vector<int8_t> i8(256);
  for (int i = 0; i < 256; ++i) i8[i] = static_cast<int8_t>(i - 128);
  const std::vector<uint8_t> u8 = {0, 1, 127, 128, 255, 42};
  const std::vector<int32_t> i32 = {0, -1, 2147483647, -2147483647 - 1};
  const std::vector<int64_t> i64 = {0, -1, int64_t{1} << 40, std::numeric_limits<int64_t>::min(), 255, 7};

  StWriter w;
  w.add("f32", "F32", {2, 3}, bytes_of(f32))
      .add("bf16", "BF16", {4}, bytes_of(bf16))
      .add("f16", "F16", {2, 2}, bytes_of(f16))
      .add("e4m3", "F8_E4M3", {16, 16}, bytes_of(e4m3))
      .add("e8m0", "F8_E8M0", {256}, bytes_of(e8m0))
      .add("i8", "I8", {4, 64}, bytes_of(i8))
      .add("u8", "U8", {6}, bytes_of(u8))
      .add("i32", "I32", {4}, bytes_of(i32))
      .add("i64", "I64", {3, 2}, bytes_of(i64))
      .add("scalar", "F32", {}, bytes_of(std::vector<float>{7.0f}))
      .add("empty", "BF16", {0, 5}, "")
      .meta("format", "pt");
  w.write(dir / "m.safetensors");

  auto f = SafetensorsFile::open((dir / "m.safetensors").string());
  EXPECT_EQ(f->tensors().size(), 11u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_TRUE(f->has("i64"));
  EXPECT_FALSE(f->has("nope"));

  Tensor t = f->get("f32");
  EXPECT_EQ(t.dtype(), DType::kF32);
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_TRUE(t.is_contiguous());
  auto got_f32 = read_back<float>(t);
  for (size_t i = 0; i < f32.size(); ++i) {
    EXPECT_EQ(got_f32[i], f32[i]) << i;
    EXPECT_EQ(std::signbit(got_f32[i]), std::signbit(f32[i])) << i;
  }

  t = f->get("bf16");
  EXPECT_EQ(t.dtype(), DType::kBF16);
  EXPECT_EQ(t.shape(), (Shape{4}));
  auto got_bf16 = read_back<uint16_t>(t);
  for (size_t i = 0; i < bf16_vals.size(); ++i) EXPECT_EQ(bf16_to_f32(got_bf16[i]), bf16_vals[i]) << i;

  t = f->get("f16");
  EXPECT_EQ(t.dtype(), DType::kF16);
  EXPECT_EQ(read_back<uint16_t>(t), f16);

  t = f->get("e4m3");
  EXPECT_EQ(t.dtype(), DType::kE4M3);
  EXPECT_EQ(t.shape(), (Shape{16, 16}));
  EXPECT_EQ(read_back<uint8_t>(t), e4m3);
  EXPECT_EQ(e4m3_to_f32(t.data<uint8_t>()[0x7E]), 448.0f);

  t = f->get("e8m0");
  EXPECT_EQ(t.dtype(), DType::kE8M0);
  EXPECT_EQ(read_back<uint8_t>(t), e8m0);
  EXPECT_EQ(e8m0_to_f32(t.data<uint8_t>()[127]), 1.0f);

  t = f->get("i8");
  EXPECT_EQ(t.dtype(), DType::kI8);
  EXPECT_EQ(t.nbytes(), 256u);  // I8 is one byte per element
  EXPECT_EQ(read_back<int8_t>(t), i8);

  t = f->get("u8");
  EXPECT_EQ(t.dtype(), DType::kU8);
  EXPECT_EQ(read_back<uint8_t>(t), u8);

  t = f->get("i32");
  EXPECT_EQ(t.dtype(), DType::kI32);
  EXPECT_EQ(read_back<int32_t>(t), i32);

  t = f->get("i64");
  EXPECT_EQ(t.dtype(), DType::kI64);
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_EQ(read_back<int64_t>(t), i64);

  t = f->get("scalar");
  EXPECT_EQ(t.dim(), 0);
  EXPECT_EQ(t.numel(), 1);
  EXPECT_EQ(t.data<float>()[0], 7.0f);

  t = f->get("empty");
  EXPECT_EQ(t.shape(), (Shape{0, 5}));
  EXPECT_EQ(t.numel(), 0);

  const TensorInfo& info = f->tensors().at("bf16");
  EXPECT_EQ(info.name, "bf16");
  EXPECT_EQ(info.end - info.begin, 8u);
}

TEST(Safetensors, TensorKeepsMappingAlive) {
  TempDir dir;
  StWriter w;
  w.add("w", "F32", {3}, bytes_of(std::vector<float>{1, 2, 3}));
  w.write(dir / "a.safetensors");
  Tensor t;
  {
    auto f = SafetensorsFile::open((dir / "a.safetensors").string());
    t = f->get("w");
  }
  fs::remove(dir / "a.safetensors");
  EXPECT_EQ(read_back<float>(t), (std::vector<float>{1, 2, 3}));
}

TEST(Safetensors, BorrowsAlignedDataAndCopiesMisaligned) {
  TempDir dir;
  StWriter w;
  // u8[3] first leaves "f" at data offset 3, misaligned for float.
  w.add("u", "U8", {3}, bytes_of(std::vector<uint8_t>{9, 8, 7}))
      .add("f", "F32", {2}, bytes_of(std::vector<float>{0.25f, -4.0f}));
  w.write(dir / "a.safetensors");
  auto f = SafetensorsFile::open((dir / "a.safetensors").string());
  Tensor a = f->get("f");
  Tensor b = f->get("f");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.raw()) % alignof(float), 0u);
  EXPECT_EQ(read_back<float>(a), (std::vector<float>{0.25f, -4.0f}));
  EXPECT_NE(a.raw(), b.raw());  // two private copies
  Tensor u1 = f->get("u"), u2 = f->get("u");
  EXPECT_EQ(u1.raw(), u2.raw());  // borrowed from the one mapping
  EXPECT_EQ(read_back<uint8_t>(u1), (std::vector<uint8_t>{9, 8, 7}));
}

TEST(Safetensors, MissingFile) {
  TempDir dir;
  const std::string p = (dir / "nope.safetensors").string();
  EXPECT_TRUE(has_all(error_of([&] { SafetensorsFile::open(p); }), {p, "cannot open"}));
}

TEST(Safetensors, GetMissingTensor) {
  TempDir dir;
  StWriter w;
  w.add("w", "F32", {1}, bytes_of(std::vector<float>{1}));
  w.write(dir / "a.safetensors");
  auto f = SafetensorsFile::open((dir / "a.safetensors").string());
  EXPECT_TRUE(has_all(error_of([&] { f->get("layers.0.x"); }), {"a.safetensors", "layers.0.x"}));
}

TEST(Safetensors, TruncatedFile) {
  TempDir dir;
  StWriter w;
  w.add("first", "F32", {4}, bytes_of(std::vector<float>{1, 2, 3, 4}))
      .add("layers.3.attn.wq_a.weight", "BF16", {8}, std::string(16, '\1'));
  const auto p = dir / "trunc.safetensors";
  w.write(p);
  fs::resize_file(p, fs::file_size(p) - 10);
  auto msg = error_of([&] { SafetensorsFile::open(p.string()); });
  EXPECT_TRUE(has_all(msg, {"trunc.safetensors", "truncated", "layers.3.attn.wq_a.weight", "10 bytes missing"}));
}

TEST(Safetensors, TooShortForHeaderLength) {
  TempDir dir;
  const auto p = dir / "short.safetensors";
  write_text(p, "abc");
  EXPECT_TRUE(has_all(error_of([&] { SafetensorsFile::open(p.string()); }), {"short.safetensors", "truncated"}));
}

TEST(Safetensors, CorruptHeaderLength) {
  TempDir dir;
  StWriter w;
  w.add("w", "F32", {1}, bytes_of(std::vector<float>{1}));
  const std::string h = w.header_json();
  const auto p = dir / "bad.safetensors";

  const uint64_t absurd = uint64_t{1} << 40;
  StWriter::write_raw(p, h, w.data(), &absurd);
  EXPECT_TRUE(has_all(error_of([&] { SafetensorsFile::open(p.string()); }),
                      {"bad.safetensors", "corrupt header length 1099511627776"}));

  const uint64_t past_end = h.size() + w.data().size() + 1;
  StWriter::write_raw(p, h, w.data(), &past_end);
  EXPECT_TRUE(has_all(error_of([&] { SafetensorsFile::open(p.string()); }),
                      {"bad.safetensors", "corrupt header length", "truncated"}));
}

TEST(Safetensors, InvalidHeaderJson) {
  TempDir dir;
  const auto p = dir / "json.safetensors";
  StWriter::write_raw(p, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)", std::string(4, '\0'));
  auto msg = error_of([&] { SafetensorsFile::open(p.string()); });
  EXPECT_TRUE(has_all(msg, {"json.safetensors", "not valid JSON", "parse error"}));

  StWriter::write_raw(p, "[1, 2]", "");
  EXPECT_TRUE(has_all(error_of([&] { SafetensorsFile::open(p.string()); }), {"json.safetensors", "object"}));
}

TEST(Safetensors, MalformedEntries) {
  TempDir dir;
  const auto p = dir / "entry.safetensors";
  auto open_with = [&](const std::string& header, size_t data_bytes) {
    StWriter::write_raw(p, header, std::string(data_bytes, '\0'));
    return error_of([&] { SafetensorsFile::open(p.string()); });
  };
  EXPECT_TRUE(has_all(open_with(R"({"blk.w": 5})", 0), {"entry.safetensors", "blk.w", "not an object"}));
  EXPECT_TRUE(has_all(open_with(R"({"blk.w": {"shape": [1], "data_offsets": [0, 4]}})", 4),
                      {"entry.safetensors", "blk.w", "no dtype"}));
  EXPECT_TRUE(has_all(open_with(R"({"blk.w": {"dtype": "F32", "shape": 4, "data_offsets": [0, 16]}})", 16),
                      {"entry.safetensors", "blk.w", "not a list"}));
  EXPECT_TRUE(has_all(open_with(R"({"blk.w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4),
                      {"entry.safetensors", "blk.w", "non-negative"}));
  EXPECT_TRUE(has_all(open_with(R"({"blk.w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4),
                      {"entry.safetensors", "blk.w", "non-negative integer"}));
  EXPECT_TRUE(has_all(open_with(R"({"blk.w": {"dtype": "F32", "shape": [1]}})", 4),
                      {"entry.safetensors", "blk.w", "no data_offsets"}));
  EXPECT_TRUE(has_all(open_with(R"({"blk.w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}})", 8),
                      {"entry.safetensors", "blk.w", "[begin, end]"}));
  EXPECT_TRUE(has_all(open_with(R"({"blk.w": {"dtype": "F32", "shape": [0], "data_offsets": [4, 0]}})", 4),
                      {"entry.safetensors", "blk.w", "begin after end"}));
  EXPECT_TRUE(has_all(open_with(R"({"blk.w": {"dtype": 3, "shape": [1], "data_offsets": [0, 4]}})", 4),
                      {"entry.safetensors", "blk.w", "dtype"}));
  EXPECT_TRUE(
      has_all(open_with(R"({"__metadata__": {"format": 1}})", 0), {"entry.safetensors", "__metadata__", "format"}));
  EXPECT_TRUE(has_all(open_with(R"({"__metadata__": [1]})", 0), {"entry.safetensors", "__metadata__"}));
  EXPECT_TRUE(
      has_all(open_with(R"({"huge": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})", 4),
              {"entry.safetensors", "huge", "absurd"}));
}

TEST(Safetensors, UnknownDtype) {
  TempDir dir;
  StWriter w;
  w.add("experts.0.w1", "F4_E2M1", {2}, std::string(1, '\0'));
  const auto p = dir / "dt.safetensors";
  w.write(p);
  EXPECT_TRUE(has_all(error_of([&] { SafetensorsFile::open(p.string()); }),
                      {"dt.safetensors", "experts.0.w1", "unknown dtype 'F4_E2M1'"}));
}

TEST(Safetensors, ByteCountMustMatchShape) {
  TempDir dir;
  StWriter w;
  w.add("w", "F32", {3}, std::string(8, '\0'));  // 3 floats need 12 bytes
  const auto p = dir / "size.safetensors";
  w.write(p);
  EXPECT_TRUE(has_all(error_of([&] { SafetensorsFile::open(p.string()); }),
                      {"size.safetensors", "tensor w ", "spans 8 bytes", "needs 12 bytes"}));
}

TEST(Safetensors, OverlappingOffsets) {
  TempDir dir;
  StWriter w;
  w.add("a.weight", "F32", {2}, std::string(8, '\0')).add("b.weight", "F32", {2}, std::string(8, '\0'));
  w.entries()[1].explicit_offsets = true;
  w.entries()[1].begin = 4;
  w.entries()[1].end = 12;
  const auto p = dir / "ovl.safetensors";
  w.write(p);
  EXPECT_TRUE(has_all(error_of([&] { SafetensorsFile::open(p.string()); }),
                      {"ovl.safetensors", "a.weight", "b.weight", "overlaps"}));

  // Same range twice is an overlap too; zero-sized tensors never overlap.
  w.entries()[1].begin = 0;
  w.entries()[1].end = 8;
  w.write(p);
  EXPECT_TRUE(has_all(error_of([&] { SafetensorsFile::open(p.string()); }), {"a.weight", "b.weight", "overlaps"}));
  StWriter z;
  z.add("a", "F32", {2}, std::string(8, '\0')).add("e", "F32", {0}, "");
  z.entries()[1].explicit_offsets = true;
  z.entries()[1].begin = z.entries()[1].end = 4;
  z.write(p);
  EXPECT_NO_THROW(SafetensorsFile::open(p.string()));
}
