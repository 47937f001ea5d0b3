// Checkpoint: single file, sharded index, glob, and every loader error (src/io/checkpoint.h).
#include <gtest/gtest.h>

#include <cstring>

#include "deepinfer/error.h"
#include "io/checkpoint.h"
#include "st_writer.h"

using namespace deepinfer;
using namespace st_test;

namespace {

std::string f32_bytes(std::vector<float> v) { return bytes_of(v); }

// Two shards and their index, as a sharded HF checkpoint lays them out.
void write_sharded(const TempDir& dir) {
  StWriter a;
  a.add("embed.weight", "BF16", {4, 2}, std::string(16, '\2'))
      .add("layers.0.attn.wq_a.weight", "F8_E4M3", {4, 8}, std::string(32, '\x38'))
      .add("layers.0.attn.wq_a.scale", "F8_E8M0", {1, 1}, std::string(1, '\x7f'));
  a.write(dir / "model-00001-of-00002.safetensors");
  StWriter b;
  b.add("layers.0.ffn.gate.tid2eid", "I64", {3, 2}, bytes_of(std::vector<int64_t>{0, 1, 2, 3, 4, 5}))
      .add("norm.weight", "F32", {2}, f32_bytes({1.0f, 2.0f}));
  b.write(dir / "model-00002-of-00002.safetensors");
  write_text(dir / "model.safetensors.index.json", R"({
    "metadata": {"total_size": 123},
    "weight_map": {
      "embed.weight": "model-00001-of-00002.safetensors",
      "layers.0.attn.wq_a.weight": "model-00001-of-00002.safetensors",
      "layers.0.attn.wq_a.scale": "model-00001-of-00002.safetensors",
      "layers.0.ffn.gate.tid2eid": "model-00002-of-00002.safetensors",
      "norm.weight": "model-00002-of-00002.safetensors"
    }
  })");
}

}  // namespace

TEST(Checkpoint, SingleFile) {
  TempDir dir;
  StWriter w;
  w.add("norm.weight", "F32", {2}, f32_bytes({3.0f, 4.0f})).add("head.weight", "BF16", {2, 2}, std::string(8, '\0'));
  w.write(dir / "model.safetensors");
  // Files beside model.safetensors are not read when it exists.
  StWriter other;
  other.add("norm.weight", "F32", {1}, f32_bytes({9.0f}));
  other.write(dir / "zzz-extra.safetensors");

  Checkpoint ck = Checkpoint::open(dir.str());
  EXPECT_EQ(ck.dir(), dir.str());
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"head.weight", "norm.weight"}));
  EXPECT_TRUE(ck.has("norm.weight"));
  EXPECT_FALSE(ck.has("missing"));
  EXPECT_EQ(ck.file_of("norm.weight"), (dir / "model.safetensors").string());
  EXPECT_EQ(ck.info("head.weight").dtype, DType::kBF16);
  EXPECT_EQ(ck.info("head.weight").shape, (Shape{2, 2}));
  Tensor t = ck.take("norm.weight", {2}, {DType::kF32});
  EXPECT_EQ(t.data<float>()[1], 4.0f);
  EXPECT_EQ(ck.unused(), (std::vector<std::string>{"head.weight"}));
  ck.take("head.weight");
  EXPECT_TRUE(ck.unused().empty());
}

TEST(Checkpoint, ShardedIndex) {
  TempDir dir;
  write_sharded(dir);
  // A stray file the index does not name is ignored.
  StWriter stray;
  stray.add("stray", "F32", {1}, f32_bytes({0.0f}));
  stray.write(dir / "consolidated.safetensors");

  Checkpoint ck = Checkpoint::open(dir.str());
  EXPECT_EQ(ck.names().size(), 5u);
  EXPECT_FALSE(ck.has("stray"));
  EXPECT_EQ(ck.file_of("norm.weight"), (dir / "model-00002-of-00002.safetensors").string());
  EXPECT_EQ(ck.file_of("embed.weight"), (dir / "model-00001-of-00002.safetensors").string());
  Tensor tid = ck.take("layers.0.ffn.gate.tid2eid", {3, 2}, {DType::kI64, DType::kI32});
  EXPECT_EQ(tid.data<int64_t>()[5], 5);
  Tensor wq = ck.take("layers.0.attn.wq_a.weight", {4, 8}, {DType::kE4M3, DType::kBF16});
  EXPECT_EQ(wq.data<uint8_t>()[0], 0x38);
  EXPECT_EQ(ck.unused(), (std::vector<std::string>{"embed.weight", "layers.0.attn.wq_a.scale", "norm.weight"}));
}

TEST(Checkpoint, GlobsAllFilesSorted) {
  TempDir dir;
  StWriter b;
  b.add("b", "F32", {1}, f32_bytes({2.0f}));
  b.write(dir / "b.safetensors");
  StWriter a;
  a.add("a", "F32", {1}, f32_bytes({1.0f}));
  a.write(dir / "a.safetensors");
  write_text(dir / "notes.txt", "not a tensor file");
  Checkpoint ck = Checkpoint::open(dir.str());
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(ck.file_of("b"), (dir / "b.safetensors").string());
  EXPECT_EQ(ck.take("a").data<float>()[0], 1.0f);
}

TEST(Checkpoint, NoSafetensorsFiles) {
  TempDir dir;
  write_text(dir / "config.json", "{}");
  EXPECT_TRUE(has_all(error_of([&] { Checkpoint::open(dir.str()); }), {"no safetensors files in", dir.str()}));
  const std::string gone = (dir / "gone").string();
  EXPECT_TRUE(has_all(error_of([&] { Checkpoint::open(gone); }), {gone, "does not exist"}));
}

TEST(Checkpoint, MissingTensor) {
  TempDir dir;
  write_sharded(dir);
  Checkpoint ck = Checkpoint::open(dir.str());
  EXPECT_TRUE(has_all(error_of([&] { ck.take("layers.1.attn.wq_a.weight"); }),
                      {"missing tensor layers.1.attn.wq_a.weight", dir.str()}));
  EXPECT_TRUE(has_all(error_of([&] { ck.take("layers.1.attn.wq_b.weight", {1}, {DType::kBF16}); }),
                      {"missing tensor layers.1.attn.wq_b.weight", dir.str()}));
  EXPECT_TRUE(has_all(error_of([&] { ck.info("x.y"); }), {"x.y", dir.str()}));
  EXPECT_TRUE(has_all(error_of([&] { ck.file_of("x.z"); }), {"x.z", dir.str()}));
}

TEST(Checkpoint, WrongShapeMessage) {
  TempDir dir;
  StWriter w;
  w.add("layers.3.attn.wq_a.weight", "F8_E4M3", {1024, 2048}, std::string(1024 * 2048, '\0'));
  w.write(dir / "model.safetensors");
  Checkpoint ck = Checkpoint::open(dir.str());
  auto msg = error_of([&] { ck.take("layers.3.attn.wq_a.weight", {1024, 4096}, {DType::kE4M3, DType::kBF16}); });
  EXPECT_EQ(msg, "checkpoint " + dir.str() +
                     ", file model.safetensors: tensor layers.3.attn.wq_a.weight has shape [1024, 2048] "
                     "(float8_e4m3), expected [1024, 4096] (float8_e4m3 or bfloat16)");
  // A failed take does not count as use.
  EXPECT_EQ(ck.unused(), (std::vector<std::string>{"layers.3.attn.wq_a.weight"}));
}

TEST(Checkpoint, WrongDtype) {
  TempDir dir;
  write_sharded(dir);
  Checkpoint ck = Checkpoint::open(dir.str());
  auto msg = error_of([&] { ck.take("norm.weight", {2}, {DType::kBF16}); });
  EXPECT_TRUE(has_all(
      msg, {dir.str(), "model-00002-of-00002.safetensors", "norm.weight", "[2] (float32)", "expected [2] (bfloat16)"}));
  msg = error_of([&] { ck.take("embed.weight", {4, 2}, {DType::kF32, DType::kF16, DType::kE4M3}); });
  EXPECT_TRUE(has_all(msg, {"model-00001-of-00002.safetensors", "embed.weight",
                            "(bfloat16), expected [4, 2] (float32, float16 or float8_e4m3)"}));
}

TEST(Checkpoint, UnusedListsExtraTensors) {
  TempDir dir;
  write_sharded(dir);
  Checkpoint ck = Checkpoint::open(dir.str());
  for (const char* n : {"embed.weight", "layers.0.attn.wq_a.weight", "layers.0.attn.wq_a.scale", "norm.weight"}) {
    ck.take(n);
  }
  EXPECT_EQ(ck.unused(), (std::vector<std::string>{"layers.0.ffn.gate.tid2eid"}));
}

TEST(Checkpoint, PackedFp4ViewedAsE2M1) {
  TempDir dir;
  StWriter w;
  w.add("experts.0.w1.weight", "I8", {2, 4}, bytes_of(std::vector<uint8_t>{0x21, 0x43, 0x65, 0x87, 0, 0, 0, 0xFF}));
  w.write(dir / "model.safetensors");
  Checkpoint ck = Checkpoint::open(dir.str());
  Tensor t = ck.take("experts.0.w1.weight", {2, 8}, {DType::kE2M1x2});
  EXPECT_EQ(t.dtype(), DType::kE2M1x2);
  EXPECT_EQ(t.shape(), (Shape{2, 8}));
  EXPECT_EQ(t.nbytes(), 8u);
  EXPECT_EQ(t.data<uint8_t>()[0] & 0xF, 1);  // low nibble = even K index
  EXPECT_TRUE(ck.unused().empty());
  // The stored I8 shape is still accepted as I8, and a wrong logical shape still fails.
  Checkpoint ck2 = Checkpoint::open(dir.str());
  EXPECT_EQ(ck2.take("experts.0.w1.weight", {2, 4}, {DType::kI8}).dtype(), DType::kI8);
  EXPECT_TRUE(has_all(error_of([&] {
                        ck2.take("experts.0.w1.weight", {2, 16}, {DType::kE2M1x2});
                      }),
                      {"experts.0.w1.weight", "[2, 4] (int8)", "expected [2, 16]"}));
}

TEST(Checkpoint, ShardMissing) {
  TempDir dir;
  write_sharded(dir);
  fs::remove(dir / "model-00002-of-00002.safetensors");
  EXPECT_TRUE(has_all(error_of([&] { Checkpoint::open(dir.str()); }),
                      {dir.str(), "model-00002-of-00002.safetensors", "does not exist"}));
}

TEST(Checkpoint, IndexListsTensorNotInShard) {
  TempDir dir;
  write_sharded(dir);
  write_text(dir / "model.safetensors.index.json", R"({"weight_map": {
      "embed.weight": "model-00001-of-00002.safetensors",
      "layers.0.attn.wq_a.weight": "model-00001-of-00002.safetensors",
      "layers.0.attn.wq_a.scale": "model-00001-of-00002.safetensors",
      "layers.0.attn.wq_b.weight": "model-00001-of-00002.safetensors",
      "layers.0.ffn.gate.tid2eid": "model-00002-of-00002.safetensors",
      "norm.weight": "model-00002-of-00002.safetensors"}})");
  EXPECT_TRUE(
      has_all(error_of([&] { Checkpoint::open(dir.str()); }),
              {dir.str(), "layers.0.attn.wq_b.weight", "model-00001-of-00002.safetensors", "does not contain it"}));
}

TEST(Checkpoint, ShardHoldsUnlistedTensor) {
  TempDir dir;
  write_sharded(dir);
  write_text(dir / "model.safetensors.index.json", R"({"weight_map": {
      "embed.weight": "model-00001-of-00002.safetensors",
      "layers.0.attn.wq_a.weight": "model-00001-of-00002.safetensors",
      "layers.0.attn.wq_a.scale": "model-00001-of-00002.safetensors",
      "norm.weight": "model-00002-of-00002.safetensors"}})");
  EXPECT_TRUE(has_all(error_of([&] { Checkpoint::open(dir.str()); }),
                      {dir.str(), "model-00002-of-00002.safetensors", "layers.0.ffn.gate.tid2eid",
                       "not listed in model.safetensors.index.json"}));
}

TEST(Checkpoint, IndexMapsTensorToOtherShard) {
  TempDir dir;
  write_sharded(dir);
  write_text(dir / "model.safetensors.index.json", R"({"weight_map": {
      "embed.weight": "model-00001-of-00002.safetensors",
      "layers.0.attn.wq_a.weight": "model-00001-of-00002.safetensors",
      "layers.0.attn.wq_a.scale": "model-00001-of-00002.safetensors",
      "layers.0.ffn.gate.tid2eid": "model-00002-of-00002.safetensors",
      "norm.weight": "model-00001-of-00002.safetensors"}})");
  EXPECT_TRUE(has_all(error_of([&] { Checkpoint::open(dir.str()); }),
                      {"norm.weight", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}));
}

TEST(Checkpoint, InvalidIndex) {
  TempDir dir;
  write_sharded(dir);
  write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"a": "x.safetensors",}})");
  EXPECT_TRUE(has_all(error_of([&] { Checkpoint::open(dir.str()); }),
                      {dir.str(), "model.safetensors.index.json", "not valid JSON"}));
  write_text(dir / "model.safetensors.index.json", R"({"metadata": {}})");
  EXPECT_TRUE(has_all(error_of([&] { Checkpoint::open(dir.str()); }), {"weight_map"}));
  write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"a": 3}})");
  EXPECT_TRUE(has_all(error_of([&] { Checkpoint::open(dir.str()); }), {"tensor a", "file name"}));
  write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"a": "../x.safetensors"}})");
  EXPECT_TRUE(has_all(error_of([&] { Checkpoint::open(dir.str()); }), {"tensor a", "../x.safetensors"}));
}

TEST(Checkpoint, DuplicateTensor) {
  TempDir dir;
  StWriter a;
  a.add("layers.0.attn_norm.weight", "F32", {1}, f32_bytes({1.0f}));
  a.write(dir / "part-a.safetensors");
  StWriter b;
  b.add("layers.0.attn_norm.weight", "F32", {1}, f32_bytes({2.0f}));
  b.write(dir / "part-b.safetensors");
  EXPECT_TRUE(has_all(error_of([&] { Checkpoint::open(dir.str()); }),
                      {dir.str(), "layers.0.attn_norm.weight", "part-a.safetensors", "part-b.safetensors"}));
}

TEST(Checkpoint, CorruptShardNamesFile) {
  TempDir dir;
  write_sharded(dir);
  const auto p = dir / "model-00002-of-00002.safetensors";
  fs::resize_file(p, fs::file_size(p) - 3);
  EXPECT_TRUE(has_all(error_of([&] { Checkpoint::open(dir.str()); }),
                      {"model-00002-of-00002.safetensors", "truncated", "norm.weight", "3 bytes missing"}));
}
