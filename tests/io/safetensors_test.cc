// The safetensors reader and writer: round trips for every dtype, exact conversions, the layout
// the writer promises, header validation beyond the shared malformed table, sharded checkpoints.
#include "core/config.h"
#include "core/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tests/io/io_test_util.h"

namespace dflash {
namespace {

using testing::TempDir;

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A safetensors file written by hand: 8-byte length, header text as given, data bytes.
void write_raw(const std::string& path, const std::string& header, const std::vector<uint8_t>& data) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

TensorToWrite raw_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
  return TensorToWrite{name, dtype, std::move(shape), std::move(bytes)};
}

template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

TEST(Safetensors, RoundTripEveryDtypeInGivenOrder) {
  TempDir dir;
  const std::string path = dir / "all.safetensors";
  // Odd byte counts (3 BF16, 1 F8) so the tensors after them are not naturally aligned.
  const std::vector<TensorToWrite> tensors = {
      raw_tensor("z.bf16", DType::kBF16, {3}, bytes_of<uint16_t>({0x3f80, 0xc040, 0x0001})),
      raw_tensor("a.f8", DType::kF8E4M3, {1}, {0x38}),
      raw_tensor("m.f16", DType::kF16, {2, 2}, bytes_of<uint16_t>({0x3c00, 0xc000, 0x0001, 0x7bff})),
      raw_tensor("b.f32", DType::kF32, {2}, bytes_of<float>({1.5f, -0.25f})),
      raw_tensor("c.f64", DType::kF64, {1}, bytes_of<double>({0.1})),
      raw_tensor("d.i32", DType::kI32, {2}, bytes_of<int32_t>({-7, 2147483647})),
      raw_tensor("e.i64", DType::kI64, {1, 1}, bytes_of<int64_t>({-5000000000LL})),
      raw_tensor("f.empty", DType::kF32, {0, 4}, {}),
  };
  write_safetensors(path, tensors, {{"format", "pt"}, {"producer", "test"}});

  // Layout: header length a multiple of 8, padded with spaces, tensors back to back in order.
  const std::vector<uint8_t> raw = read_bytes(path);
  uint64_t header_length = 0;
  std::memcpy(&header_length, raw.data(), 8);
  EXPECT_EQ(header_length % 8, 0u);
  const std::string header(raw.begin() + 8, raw.begin() + 8 + static_cast<long>(header_length));
  EXPECT_EQ(header.find_last_not_of(' '), header.find_last_of('}'));
  size_t previous = 0;
  for (const TensorToWrite& t : tensors) {
    const size_t at = header.find("\"" + t.name + "\"");
    ASSERT_NE(at, std::string::npos) << t.name;
    EXPECT_GT(at, previous) << t.name << " is out of the given order in the header";
    previous = at;
  }

  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->metadata().at("producer"), "test");
  const std::vector<std::string> expected_order = {"z.bf16", "a.f8",  "m.f16", "b.f32",
                                                   "c.f64",  "d.i32", "e.i64", "f.empty"};
  std::vector<std::string> names = file->names();
  // f.empty occupies no bytes; its offset equals the end of the data area, after e.i64.
  EXPECT_EQ(names, expected_order);
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    const TensorInfo& info = file->info(t.name);
    EXPECT_EQ(info.dtype, t.dtype) << t.name;
    EXPECT_EQ(info.shape, t.shape) << t.name;
    EXPECT_EQ(info.begin, offset) << t.name;
    EXPECT_EQ(info.end - info.begin, t.bytes.size()) << t.name;
    if (!t.bytes.empty()) EXPECT_EQ(std::memcmp(file->data(t.name), t.bytes.data(), t.bytes.size()), 0) << t.name;
    offset += t.bytes.size();
  }
  EXPECT_EQ(raw.size(), 8 + header_length + offset);
}

TEST(Safetensors, FloatConversionsAreExact) {
  TempDir dir;
  const std::string path = dir / "values.safetensors";
  write_safetensors(path,
                    {raw_tensor("bf16", DType::kBF16, {4}, bytes_of<uint16_t>({0x3f80, 0xc040, 0x0001, 0x7f80})),
                     raw_tensor("f16", DType::kF16, {5}, bytes_of<uint16_t>({0x3c00, 0xc000, 0x0001, 0x7bff, 0x0400})),
                     raw_tensor("f32", DType::kF32, {2}, bytes_of<float>({1.0f / 3.0f, -0.0f})),
                     raw_tensor("f64", DType::kF64, {2}, bytes_of<double>({0.1, 1e300})),
                     raw_tensor("i32", DType::kI32, {3}, bytes_of<int32_t>({-1, 0, 123456789})),
                     raw_tensor("i64", DType::kI64, {2}, bytes_of<int64_t>({-5000000000LL, 7})),
                     raw_tensor("f8", DType::kF8E4M3, {1}, {0x38})});
  const auto file = SafetensorsFile::open(path);
  // bf16: 1, -3, the smallest subnormal 2^-133, +Inf.
  EXPECT_EQ(file->read_float("bf16").values, (std::vector<float>{1.0f, -3.0f, std::ldexp(1.0f, -133), INFINITY}));
  // f16: 1, -2, the smallest subnormal 2^-24, the largest finite 65504, the smallest normal 2^-14.
  EXPECT_EQ(file->read_float("f16").values,
            (std::vector<float>{1.0f, -2.0f, std::ldexp(1.0f, -24), 65504.0f, std::ldexp(1.0f, -14)}));
  const Tensor f32 = file->read_float("f32");
  EXPECT_EQ(f32.values[0], 1.0f / 3.0f);
  EXPECT_TRUE(std::signbit(f32.values[1]));
  // f64 rounds to nearest float: 0.1 -> 0x3dcccccd; 1e300 overflows to +Inf.
  const Tensor f64 = file->read_float("f64");
  uint32_t bits;
  std::memcpy(&bits, &f64.values[0], 4);
  EXPECT_EQ(bits, 0x3dcccccdu);
  EXPECT_EQ(f64.values[1], INFINITY);
  EXPECT_EQ(file->read_int("i32"), (std::vector<int64_t>{-1, 0, 123456789}));
  EXPECT_EQ(file->read_int("i64"), (std::vector<int64_t>{-5000000000LL, 7}));
  EXPECT_BAD_INPUT(file->read_float("i32"), "has dtype I32; a floating-point tensor");
  EXPECT_BAD_INPUT(file->read_float("f8"), "has dtype F8_E4M3; a floating-point tensor");
  EXPECT_BAD_INPUT(file->read_int("f32"), "has dtype F32; an integer tensor");
  EXPECT_BAD_INPUT(file->info("nope"), "no tensor 'nope'");
}

TEST(Safetensors, MakeHelpersEncodeValues) {
  TempDir dir;
  const std::string path = dir / "made.safetensors";
  const Tensor t({2, 2}, {1.0f, -2.5f, 1.00390625f /* 1 + 2^-8: a tie, rounds to even 1.0 in bf16 */, 3.0f});
  write_safetensors(path, {make_f32_tensor("f", t), make_bf16_tensor("b", t), make_i32_tensor("i", {3}, {4, -5, 6})});
  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file->read_float("f").values, t.values);
  EXPECT_EQ(file->read_float("b").values, (std::vector<float>{1.0f, -2.5f, 1.0f, 3.0f}));
  EXPECT_EQ(file->info("b").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(file->read_int("i"), (std::vector<int64_t>{4, -5, 6}));
}

TEST(Safetensors, WriterRefusesInconsistentTensors) {
  TempDir dir;
  const std::string path = dir / "bad.safetensors";
  testing::expect_mentions(
      testing::harness_error_message(
          [&] { write_safetensors(path, {raw_tensor("x", DType::kF32, {2}, {0, 0, 0, 0})}); }, ErrorKind::kInternal),
      "has 4 bytes for shape [2]");
  testing::expect_mentions(testing::harness_error_message(
                               [&] {
                                 write_safetensors(path, {raw_tensor("x", DType::kF32, {1}, {0, 0, 0, 0}),
                                                          raw_tensor("x", DType::kF32, {1}, {0, 0, 0, 0})});
                               },
                               ErrorKind::kInternal),
                           "written twice");
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(Safetensors, GapsUncoveredBytesAndEmptyTensorsAreAccepted) {
  TempDir dir;
  const std::string path = dir / "gaps.safetensors";
  // a: [0, 4), a 4-byte gap, b: [8, 12), an empty tensor at 12, 4 trailing bytes nobody names.
  write_raw(path,
            R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
            R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("e":{"dtype":"BF16","shape":[3,0],"data_offsets":[12,12]}})",
            bytes_of<float>({2.0f, 0.0f, 4.0f, 0.0f}));
  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file->names(), (std::vector<std::string>{"a", "b", "e"}));
  EXPECT_EQ(file->read_float("a").values, std::vector<float>{2.0f});
  EXPECT_EQ(file->read_float("b").values, std::vector<float>{4.0f});
  EXPECT_EQ(file->read_float("e").numel(), 0);
  EXPECT_TRUE(file->metadata().empty());
}

// Header defects the shared malformed table (malformed_cases.h) does not cover.
TEST(Safetensors, HeaderDefectsAreNamed) {
  TempDir dir;
  const std::vector<uint8_t> data = bytes_of<float>({1.0f, 2.0f});
  struct Case {
    const char* header;
    const char* expected;
  };
  const Case cases[] = {
      {R"({"x":{"dtype":"F32","shape":[2]}})", "tensor 'x': header entry has no 'data_offsets'"},
      {R"({"x":{"shape":[2],"data_offsets":[0,8]}})", "tensor 'x': header entry has no 'dtype'"},
      {R"({"x":{"dtype":"F32","data_offsets":[0,8]}})", "tensor 'x': header entry has no 'shape'"},
      {R"({"x":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", "tensor 'x': 'dtype' is not a string"},
      {R"({"x":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", "tensor 'x': 'shape' is not an array"},
      {R"({"x":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", "dimension 0 of 'shape' is not an integer"},
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", "'data_offsets' must be two non-negative integers"},
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[-1,7]}})",
       "'data_offsets' must be two non-negative integers"},
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", "end before they begin"},
      {R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", "the element count overflows"},
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", "unknown header field 'extra'"},
      {R"({"x":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "duplicate key 'dtype' inside 'x'"},
      {R"({"x":[1,2]})", "tensor 'x': header entry is not a JSON object"},
      {R"({"__metadata__":{"a":1}})", "'__metadata__' entry 'a' is not a string"},
      {R"({"__metadata__":[]})", "'__metadata__' is not a JSON object"},
      {R"({"x":{"dtype":"F8_E8M0","shape":[8],"data_offsets":[0,8]}})", "unsupported dtype 'F8_E8M0'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    const std::string path = dir / "h.safetensors";
    write_raw(path, c.header, data);
    EXPECT_BAD_INPUT(SafetensorsFile::open(path), c.expected);
  }
  EXPECT_BAD_INPUT(SafetensorsFile::open(dir / "missing.safetensors"), "missing.safetensors: cannot open");
}

// ---- sharded checkpoints ----

class ShardedStore : public ::testing::Test {
 protected:
  void SetUp() override {
    write_safetensors(dir / "model-00001-of-00002.safetensors", {make_f32_tensor("a.weight", Tensor({1}, {1.0f})),
                                                                 make_f32_tensor("b.weight", Tensor({1}, {2.0f}))});
    write_safetensors(dir / "model-00002-of-00002.safetensors",
                      {make_f32_tensor("c.weight", Tensor({2}, {3.0f, 4.0f}))});
  }
  void write_index(const nlohmann::json& weight_map) {
    std::ofstream(dir / "model.safetensors.index.json")
        << nlohmann::json{{"metadata", {{"total_size", 16}}}, {"weight_map", weight_map}}.dump();
  }
  TempDir dir;
};

TEST_F(ShardedStore, ResolvesEveryNameToItsShard) {
  write_index({{"a.weight", "model-00001-of-00002.safetensors"},
               {"b.weight", "model-00001-of-00002.safetensors"},
               {"c.weight", "model-00002-of-00002.safetensors"}});
  for (const std::string& path : {dir.path(), dir / "model.safetensors.index.json"}) {
    const TensorStore store = TensorStore::open(path);
    EXPECT_EQ(store.description(), path);
    EXPECT_EQ(store.names(), (std::vector<std::string>{"a.weight", "b.weight", "c.weight"}));
    EXPECT_TRUE(store.has("c.weight"));
    EXPECT_FALSE(store.has("d.weight"));
    EXPECT_EQ(store.file_of("b.weight").path(), dir / "model-00001-of-00002.safetensors");
    EXPECT_EQ(store.file_of("c.weight").read_float("c.weight").values, (std::vector<float>{3.0f, 4.0f}));
    EXPECT_BAD_INPUT(store.file_of("d.weight"), "no tensor 'd.weight'");
  }
}

TEST_F(ShardedStore, IndexDefectsAreNamed) {
  write_index({{"a.weight", "model-00001-of-00002.safetensors"},
               {"b.weight", "model-00001-of-00002.safetensors"},
               {"c.weight", "model-00003-of-00002.safetensors"}});
  EXPECT_BAD_INPUT(TensorStore::open(dir.path()),
                   "shard 'model-00003-of-00002.safetensors' (mapped for tensor 'c.weight') does not exist");
  write_index({{"a.weight", "model-00002-of-00002.safetensors"},
               {"b.weight", "model-00001-of-00002.safetensors"},
               {"c.weight", "model-00002-of-00002.safetensors"}});
  EXPECT_BAD_INPUT(TensorStore::open(dir.path()),
                   "maps tensor 'a.weight' to shard 'model-00002-of-00002.safetensors', which does not hold it");
  write_index({{"a.weight", "model-00001-of-00002.safetensors"}, {"c.weight", "model-00002-of-00002.safetensors"}});
  EXPECT_BAD_INPUT(TensorStore::open(dir.path()), "holds tensor 'b.weight', which weight_map does not map to it");
  write_index({{"a.weight", 3}});
  EXPECT_BAD_INPUT(TensorStore::open(dir.path()), "weight_map entry 'a.weight' is not a string");
  std::ofstream(dir / "model.safetensors.index.json") << R"({"metadata": {}})";
  EXPECT_BAD_INPUT(TensorStore::open(dir.path()), "missing 'weight_map'");
  std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map": {"a.weight": "x", "a.weight": "y"}})";
  EXPECT_BAD_INPUT(TensorStore::open(dir.path()), "duplicate key 'a.weight' inside 'weight_map'");
  for (const char* shard : {"../model-00001-of-00002.safetensors", "/etc/hostname", "", ".."}) {
    SCOPED_TRACE(shard);
    write_index({{"a.weight", shard}});
    EXPECT_BAD_INPUT(TensorStore::open(dir.path()), "which is not a file name beside the index");
  }
}

TEST(HostilePaths, FifosAreRefusedWithoutBlocking) {
  // Opening or reading a FIFO with no writer would block forever; both readers refuse it first.
  TempDir dir;
  ASSERT_EQ(mkfifo((dir / "model.safetensors").c_str(), 0600), 0);
  EXPECT_BAD_INPUT(SafetensorsFile::open(dir / "model.safetensors"), "model.safetensors: not a regular file");
  ASSERT_EQ(mkfifo((dir / "config.json").c_str(), 0600), 0);
  EXPECT_BAD_INPUT(load_drafter_config(dir.path()), "config.json: not a regular file");
}

TEST(TensorStoreOpen, DirectoryFormsAreResolvedOrRefused) {
  TempDir dir;
  EXPECT_BAD_INPUT(TensorStore::open(dir.path()), "holds neither model.safetensors nor model.safetensors.index.json");
  write_safetensors(dir / "model.safetensors", {make_f32_tensor("w", Tensor({1}, {5.0f}))});
  const TensorStore single = TensorStore::open(dir.path());
  EXPECT_EQ(single.names(), std::vector<std::string>{"w"});
  EXPECT_EQ(single.file_of("w").read_float("w").values, std::vector<float>{5.0f});
  std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map": {"w": "model.safetensors"}})";
  EXPECT_BAD_INPUT(TensorStore::open(dir.path()), "holds both model.safetensors and model.safetensors.index.json");
  EXPECT_BAD_INPUT(TensorStore::open(dir / "nothing-here"), "no such file or directory");
}

}  // namespace
}  // namespace dflash
