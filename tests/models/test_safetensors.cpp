// Safetensors checkpoints: bitwise round trips of every dtype and layout, a byte-exact file
// built by hand, the atomic save, and a malformed-file error for every way a file can be
// wrong. Values are compared bit for bit (no tolerance).
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/fifo_testing.h"
#include "models/json.h"
#include "models/safetensors.h"
#include "testing.h"

namespace {

using namespace kiln;
namespace fs = std::filesystem;

// A fresh directory, removed with everything in it at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() / fmt::format("kiln-safetensors-{}-{}", ::getpid(), counter++);
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ignored);
    fs::remove_all(path, ignored);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(path)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string u64_le(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out;
}

// A whole file: the length, `header` padded with spaces to 8 bytes, then `data`.
std::string file_bytes(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  return u64_le(header.size()) + header + data;
}

std::string raw_bytes(const Tensor& t) {
  const Tensor c = t.contiguous();
  const size_t n = static_cast<size_t>(c.numel()) * c.itemsize();
  return n == 0 ? std::string() : std::string(static_cast<const char*>(c.data_ptr()), n);
}

template <class Bits>
Tensor from_bits(std::vector<Bits> bits, Shape shape, DType dtype) {
  REQUIRE(sizeof(Bits) == itemsize(dtype));
  return from_blob(bits.data(), std::move(shape), dtype).clone();
}

// Loading `bytes` fails with a kiln::Error naming the file and holding each of `parts`.
void check_load_error(const std::string& path, const std::string& bytes,
                      const std::vector<std::string>& parts) {
  write_bytes(path, bytes);
  try {
    load_safetensors(path);
    FAIL("loaded without an error");
  } catch (const kiln::Error& e) {
    const std::string message = e.what();
    INFO("message: " << message);
    CHECK(message.find("load_safetensors") != std::string::npos);
    CHECK(message.find(path) != std::string::npos);
    for (const std::string& part : parts) {
      INFO("expected part: " << part);
      CHECK(message.find(part) != std::string::npos);
    }
  }
}

}  // namespace

TEST_CASE("safetensors round trip of every dtype and layout is bitwise exact", "[safetensors]") {
  TempDir dir;
  StateDict dict;
  // Bit patterns that a conversion through another type would not preserve: -0, NaN
  // payloads, infinities, subnormals, extremes.
  dict["f32"] = from_bits<uint32_t>(
      {0x3f800000, 0x80000000, 0x7fc00001, 0x7f800000, 0x00000001, 0xff7fffff}, {2, 3}, DType::f32);
  dict["f64"] = from_bits<uint64_t>({0x8000000000000000, 0x7ff0000000000001, 0x0000000000000001},
                                    {3}, DType::f64);
  dict["f16"] =
      from_bits<uint16_t>({0x3c00, 0x8000, 0x7e01, 0x7c00, 0x0001, 0xfbff}, {6}, DType::f16);
  dict["bf16"] =
      from_bits<uint16_t>({0x3f80, 0x8000, 0x7fc1, 0xff80, 0x0001, 0xff7f}, {3, 2}, DType::bf16);
  dict["i64"] = from_vector<int64_t>({INT64_MIN, INT64_MAX, -1, 0}, {2, 2});
  dict["i32"] = from_vector<int32_t>({INT32_MIN, INT32_MAX, -7});
  dict["u8"] = from_vector<uint8_t>({0, 255, 128});
  dict["bool"] = from_vector<bool>({true, false, true});
  dict["scalar.f64"] = from_vector<double>({3.25}, Shape{});
  dict["scalar.bool"] = from_vector<bool>({true}, Shape{});
  dict["empty.f32"] = zeros({0});
  dict["empty.i64"] = zeros({2, 0, 3}, {.dtype = DType::i64});
  dict["strided.f32"] = testing::strided_copy(randn({2, 3}));
  dict["transposed.i32"] = testing::transposed_copy(arange(12, {.dtype = DType::i32}).view({3, 4}));
  dict["sliced.bf16"] = randn({7}, {.dtype = DType::bf16}).slice(0, 1, 7, 3);
  dict["expanded.u8"] = from_vector<uint8_t>({9, 8}).view({2, 1}).expand({2, 3});
  REQUIRE_FALSE(dict["strided.f32"].is_contiguous());
  REQUIRE_FALSE(dict["transposed.i32"].is_contiguous());

  const std::string path = dir.file("all.safetensors");
  save_safetensors(dict, path);
  const StateDict loaded = load_safetensors(path);
  REQUIRE(loaded.size() == dict.size());
  for (const auto& [name, original] : dict) {
    INFO("tensor " << name);
    REQUIRE(loaded.count(name) == 1);
    const Tensor& back = loaded.at(name);
    CHECK(back.dtype() == original.dtype());
    CHECK(back.shape() == original.shape());
    CHECK(back.device().is_cpu());
    CHECK(back.is_contiguous());
    CHECK(raw_bytes(back) == raw_bytes(original));
  }
  CHECK(dir.entries() == std::vector<std::string>{"all.safetensors"});  // no temporary left

  // Every tensor starts at a multiple of its element size (widest first).
  const std::string bytes = read_bytes(path);
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  CHECK(header_size % 8 == 0);
  // Elements by width: 8 bytes f64, i64, scalar.f64; 4 bytes f32, i32, strided, transposed;
  // 2 bytes f16, bf16, sliced; 1 byte u8, bool, scalar.bool, expanded.
  CHECK(bytes.size() == 8 + header_size + 8 * (3 + 4 + 1) + 4 * (6 + 3 + 6 + 12) + 2 * (6 + 6 + 2) +
                            1 * (3 + 3 + 1 + 6));
}

TEST_CASE("safetensors metadata round trip including escapes and unicode", "[safetensors]") {
  TempDir dir;
  const SafetensorsMetadata metadata = {{"format", "pt"},
                                        {"quote\"back\\slash", "line\nbreak\ttab\x01\x1f/"},
                                        {"unicode", "h\xc3\xa9llo \xe2\x9c\x93 \xf0\x9f\x99\x82"},
                                        {"", ""}};
  StateDict dict{{"w\"eird\\name\n", ones({2})}};
  const std::string path = dir.file("meta.safetensors");
  save_safetensors(dict, path, metadata);
  const SafetensorsContents contents = load_safetensors_with_metadata(path);
  CHECK(contents.metadata == metadata);
  REQUIRE(contents.tensors.count("w\"eird\\name\n") == 1);
  CHECK(raw_bytes(contents.tensors.at("w\"eird\\name\n")) == raw_bytes(ones({2})));

  // An empty checkpoint without metadata is the shortest valid file: "{}" padded to 8.
  const std::string empty_path = dir.file("empty.safetensors");
  save_safetensors({}, empty_path);
  CHECK(read_bytes(empty_path) == u64_le(8) + "{}      ");
  const SafetensorsContents empty = load_safetensors_with_metadata(empty_path);
  CHECK(empty.tensors.empty());
  CHECK(empty.metadata.empty());
}

TEST_CASE("safetensors writes exactly the bytes of a hand-built file", "[safetensors]") {
  TempDir dir;
  StateDict dict;
  dict["b"] = from_vector<uint8_t>({1, 2, 3});
  dict["a"] = from_vector<float>({1.0f, -2.0f});
  dict["c"] = from_vector<int64_t>({5}, Shape{});
  const std::string path = dir.file("tiny.safetensors");
  save_safetensors(dict, path, {{"format", "kiln"}});

  // Widest dtype first, then by name; 194 header bytes padded to 200 with spaces.
  const std::string header =
      "{\"__metadata__\":{\"format\":\"kiln\"},"
      "\"c\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
      "\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[16,19]}}"
      "      ";
  REQUIRE(header.size() == 200);
  const std::string length("\xc8\x00\x00\x00\x00\x00\x00\x00", 8);  // 200, little-endian
  const std::string data(
      "\x05\x00\x00\x00\x00\x00\x00\x00"  // c = 5 (i64)
      "\x00\x00\x80\x3f\x00\x00\x00\xc0"  // a = 1.0f, -2.0f
      "\x01\x02\x03",                     // b
      19);
  CHECK(read_bytes(path) == length + header + data);
}

TEST_CASE("safetensors reads a hand-written header in any order and spacing", "[safetensors]") {
  TempDir dir;
  // Fields reordered, whitespace everywhere, escaped names, metadata last, and the header
  // lists the tensors in the opposite order to their data.
  const std::string header =
      "{ \"w\\u00e9ight\\ud83d\\ude00\" : { \"data_offsets\" : [ 4 , 8 ] , \"shape\" : [ 1 , 2 ] ,"
      " \"dtype\" : \"BF16\" } ,\n\t\"flag\\/s\": {\"shape\":[2],\"dtype\":\"BOOL\","
      "\"data_offsets\":[8,10]},\r\n \"i\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[0,4]},"
      " \"__metadata__\" : { \"k\\n\" : \"v\\\"\" } }";
  const std::string data(
      "\xfe\xff\xff\xff"  // i = -2
      "\x80\x3f\x00\xc0"  // 1.0, -2.0 in bf16
      "\x01\x00",         // true, false
      10);
  const std::string path = dir.file("hand.safetensors");
  write_bytes(path, file_bytes(header, data));
  const SafetensorsContents contents = load_safetensors_with_metadata(path);
  CHECK(contents.metadata == SafetensorsMetadata{{"k\n", "v\""}});
  REQUIRE(contents.tensors.size() == 3);
  const Tensor& weight = contents.tensors.at("w\xc3\xa9ight\xf0\x9f\x98\x80");
  CHECK(weight.dtype() == DType::bf16);
  CHECK(weight.shape() == Shape{1, 2});
  CHECK(testing::values(weight) == std::vector<double>{1.0, -2.0});
  const Tensor& flags = contents.tensors.at("flag/s");
  CHECK(flags.dtype() == DType::boolean);
  CHECK(testing::values(flags) == std::vector<double>{1.0, 0.0});
  const Tensor& i = contents.tensors.at("i");
  CHECK(i.dim() == 0);
  CHECK(i.item<int32_t>() == -2);
}

TEST_CASE("safetensors save is atomic and leaves nothing behind on failure", "[safetensors]") {
  TempDir dir;
  const StateDict good{{"x", arange(6, {.dtype = DType::f32})}};

  SECTION("a directory that does not exist") {
    const std::string path = dir.file("missing/model.safetensors");
    CHECK_THROWS_WITH(save_safetensors(good, path),
                      Catch::Contains("save_safetensors") && Catch::Contains(path));
    CHECK(dir.entries().empty());
  }
  SECTION("the target is a directory, so the final rename fails") {
    const std::string path = dir.file("taken");
    fs::create_directory(path);
    CHECK_THROWS_WITH(save_safetensors(good, path),
                      Catch::Contains(path) && Catch::Contains("rename"));
    CHECK(dir.entries() == std::vector<std::string>{"taken"});  // the temporary is gone
  }
  SECTION("an unwritable directory") {
    if (::geteuid() == 0) return;  // root writes anywhere; the other sections still apply
    fs::permissions(dir.path, fs::perms::owner_read | fs::perms::owner_exec);
    const std::string path = dir.file("model.safetensors");
    CHECK_THROWS_WITH(save_safetensors(good, path), Catch::Contains(path));
    fs::permissions(dir.path, fs::perms::owner_all);
    CHECK(dir.entries().empty());
  }
  SECTION("a failed save keeps the previous checkpoint and a good one replaces it") {
    const std::string path = dir.file("model.safetensors");
    save_safetensors(good, path);
    const std::string before = read_bytes(path);
    CHECK_THROWS_WITH(save_safetensors({{"x", Tensor()}}, path),
                      Catch::Contains(path) && Catch::Contains("'x' is undefined"));
    CHECK_THROWS_WITH(save_safetensors({{"__metadata__", ones({1})}}, path),
                      Catch::Contains(path) && Catch::Contains("reserves"));
    CHECK_THROWS_WITH(save_safetensors({{"bad\xff", ones({1})}}, path), Catch::Contains("UTF-8"));
    CHECK(read_bytes(path) == before);

    save_safetensors({{"y", ones({2}, {.dtype = DType::i64})}}, path);
    const StateDict loaded = load_safetensors(path);
    REQUIRE(loaded.size() == 1);
    CHECK(raw_bytes(loaded.at("y")) == raw_bytes(ones({2}, {.dtype = DType::i64})));
    CHECK(dir.entries() == std::vector<std::string>{"model.safetensors"});
  }
  SECTION("tensors that require grad are saved without joining a graph") {
    Tensor w = randn({3});
    w.requires_grad_();
    const Tensor every_other = (w * 2).slice(0, 0, 3, 2);
    const std::string path = dir.file("grad.safetensors");
    save_safetensors({{"w", w}, {"every_other", every_other}}, path);
    const StateDict loaded = load_safetensors(path);
    CHECK(raw_bytes(loaded.at("w")) == raw_bytes(w.detach()));
    CHECK(raw_bytes(loaded.at("every_other")) == raw_bytes(every_other.detach()));
    CHECK_FALSE(loaded.at("w").requires_grad());
  }
}

TEST_CASE("safetensors rejects truncated and padded files", "[safetensors]") {
  TempDir dir;
  const std::string source = dir.file("good.safetensors");
  save_safetensors({{"a", randn({2, 3})}, {"b", from_vector<uint8_t>({1, 2, 3})}}, source);
  const std::string good = read_bytes(source);
  uint64_t header_size = 0;
  std::memcpy(&header_size, good.data(), 8);
  const std::string path = dir.file("bad.safetensors");

  for (size_t length : {size_t{0}, size_t{1}, size_t{7}}) {
    INFO("length " << length);
    check_load_error(path, good.substr(0, length), {"too short"});
  }
  for (size_t length : {size_t{8}, size_t{12}, size_t(8 + header_size - 1)}) {
    INFO("length " << length);
    check_load_error(path, good.substr(0, length), {"header length"});
  }
  // The header is whole but data is missing, or there is too much of it.
  for (size_t length : {size_t(8 + header_size), size_t(8 + header_size + 5), good.size() - 1}) {
    INFO("length " << length);
    check_load_error(path, good.substr(0, length), {"run past"});
  }
  check_load_error(path, good + "x", {"cover only"});
  check_load_error(path, u64_le(UINT64_MAX) + "{}      ", {"header length 18446744073709551615"});
  check_load_error(path, u64_le(9) + "{}      ", {"header length 9"});
  CHECK_THROWS_WITH(load_safetensors(dir.file("nothing-here")), Catch::Contains("cannot open"));
  CHECK_THROWS_WITH(load_safetensors(dir.path.string()), Catch::Contains("not a regular file"));
}

TEST_CASE("safetensors rejects headers that are not strict JSON", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  const std::string a = R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  const std::string four(4, '\0');
  const std::string deep =
      R"({"__metadata__":)" + std::string(40, '[') + std::string(40, ']') + "}";
  struct Case {
    std::string label, header, data;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"garbage", "not json", "", {"not valid JSON", "unexpected character 'n'"}},
      {"empty header", "", "", {"not valid JSON", "unexpected end"}},
      {"trailing garbage", "{" + a + "}x", four, {"after the top-level value"}},
      {"two objects", "{" + a + "}{}", four, {"after the top-level value"}},
      {"top level array", "[]", "", {"not a JSON object"}},
      {"missing colon", R"({"a" 1})", "", {"expected ':'"}},
      {"trailing comma", "{" + a + ",}", four, {"expected a string key"}},
      {"unterminated string", R"({"a)", "", {"unterminated string"}},
      {"bad escape", R"({"\q":{}})", "", {"invalid escape"}},
      {"control character", "{\"a\tb\":{}}", "", {"control character"}},
      {"invalid UTF-8", "{\"\xff\":{}}", "", {"UTF-8"}},
      {"lone surrogate", R"({"\udc00":{}})", "", {"surrogate"}},
      {"float", R"({"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", four, {"integers"}},
      {"leading zero",
       R"({"a":{"dtype":"F32","shape":[01],"data_offsets":[0,4]}})",
       four,
       {"leading zero"}},
      {"integer overflow",
       R"({"a":{"dtype":"F32","shape":[99999999999999999999]}})",
       "",
       {"out of range"}},
      {"literal", R"({"__metadata__":null})", "", {"unexpected character 'n'"}},
      {"deep nesting", deep, "", {"nested too deeply"}},
      {"duplicate names", "{" + a + "," + a + "}", four, {"duplicate key 'a'"}},
      {"metadata value not a string",
       R"({"__metadata__":{"k":1}})",
       "",
       {"__metadata__ entry 'k'", "not a string"}},
  };
  for (const Case& c : cases) {
    INFO(c.label);
    check_load_error(path, file_bytes(c.header, c.data), c.parts);
  }
}

TEST_CASE("safetensors rejects bad dtypes shapes and offsets", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  const auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape,
                        const std::string& offsets) {
    return fmt::format(R"("{}":{{"dtype":"{}","shape":{},"data_offsets":{}}})", name, dtype, shape,
                       offsets);
  };
  const auto header = [](std::vector<std::string> entries) {
    return fmt::format("{{{}}}", fmt::join(entries, ","));
  };
  const std::string bytes8(8, '\0'), bytes12(12, '\0');
  struct Case {
    std::string label, header, data;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"unknown dtype",
       header({entry("w", "F33", "[2]", "[0,8]")}),
       bytes8,
       {"tensor 'w'", "unknown dtype \"F33\""}},
      {"unsupported dtype",
       header({entry("w", "I8", "[8]", "[0,8]")}),
       bytes8,
       {"tensor 'w'", "I8 is not supported"}},
      {"lowercase dtype", header({entry("w", "f32", "[2]", "[0,8]")}), bytes8, {"unknown dtype"}},
      {"shape too big for offsets",
       header({entry("w", "F32", "[3]", "[0,8]")}),
       bytes8,
       {"tensor 'w'", "F32[3] needs 12 bytes", "hold 8"}},
      {"shape too small for offsets",
       header({entry("w", "F64", "[]", "[0,12]")}),
       bytes12,
       {"tensor 'w'", "needs 8 bytes"}},
      {"offsets past the data",
       header({entry("w", "F32", "[4]", "[0,16]")}),
       bytes8,
       {"tensor 'w'", "run past the 8-byte data section"}},
      {"reversed offsets",
       header({entry("w", "F32", "[2]", "[8,0]")}),
       bytes8,
       {"tensor 'w'", "end before they begin"}},
      {"overlapping",
       header({entry("a", "F32", "[2]", "[0,8]"), entry("b", "F32", "[2]", "[4,12]")}),
       bytes12,
       {"tensor 'b'", "overlap tensor 'a'"}},
      {"hole between tensors",
       header({entry("a", "F32", "[1]", "[0,4]"), entry("b", "F32", "[1]", "[8,12]")}),
       bytes12,
       {"tensor 'b'", "hole at bytes [4,8]"}},
      {"data not starting at 0",
       header({entry("a", "F32", "[1]", "[4,8]")}),
       bytes8,
       {"tensor 'a'", "hole at bytes [0,4]"}},
      {"bytes after the last tensor",
       header({entry("a", "F32", "[1]", "[0,4]")}),
       bytes8,
       {"8 bytes", "cover only the first 4"}},
      {"negative size",
       header({entry("a", "F32", "[-1]", "[0,4]")}),
       "",
       {"tensor 'a'", "negative"}},
      {"element count overflow",
       header({entry("a", "U8", "[4611686018427387904,4]", "[0,8]")}),
       bytes8,
       {"tensor 'a'", "too many elements"}},
      {"three offsets", header({entry("a", "F32", "[1]", "[0,4,4]")}), "", {"tensor 'a'", "not 2"}},
      {"shape not an array",
       header({entry("a", "F32", "2", "[0,8]")}),
       bytes8,
       {"tensor 'a'", "'shape' is an integer"}},
      {"dtype not a string",
       R"({"a":{"dtype":[],"shape":[2],"data_offsets":[0,8]}})",
       bytes8,
       {"tensor 'a'", "'dtype' is an array"}},
      {"missing field",
       R"({"a":{"dtype":"F32","shape":[1]}})",
       "",
       {"tensor 'a'", "missing field 'data_offsets'"}},
      {"unknown field",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"strides":[1]}})",
       "",
       {"tensor 'a'", "unknown field 'strides'"}},
      {"entry not an object", R"({"a":[1]})", "", {"tensor 'a'", "not an object"}},
      {"bool byte not 0 or 1",
       header({entry("m", "BOOL", "[2]", "[0,2]")}),
       std::string("\x01\x02", 2),
       {"tensor 'm'", "holds the byte 2"}},
  };
  for (const Case& c : cases) {
    INFO(c.label);
    check_load_error(path, file_bytes(c.header, c.data), c.parts);
  }
}

TEST_CASE("safetensors refuses a FIFO without blocking", "[safetensors]") {
  // open() of a FIFO with no writer used to block forever (kiln-train --resume hung on a
  // model.safetensors that was one).
  TempDir dir;
  testing::Fifo fifo(dir.path / "model.safetensors");
  CHECK_THROWS_WITH(load_safetensors(fifo.path().string()),
                    Catch::Contains("load_safetensors") && Catch::Contains(fifo.path().string()) &&
                        Catch::Contains("not a regular file (a FIFO)"));
}

TEST_CASE("safetensors reads a header of 100,000 tensors in linear time", "[safetensors]") {
  // The JSON reader's duplicate-key check was a scan of the keys so far: 11 s for this file.
  // Nothing here is timed; a quadratic reader would run into ctest's timeout.
  constexpr int kTensors = 100'000;
  std::string header = "{";
  for (int i = 0; i < kTensors; ++i)
    header += fmt::format(R"({}"t{}":{{"dtype":"U8","shape":[1],"data_offsets":[{},{}]}})",
                          i == 0 ? "" : ",", i, i, i + 1);
  header += "}";
  std::string data(kTensors, '\0');
  for (int i = 0; i < kTensors; ++i) data[static_cast<size_t>(i)] = static_cast<char>(i % 251);
  TempDir dir;
  const std::string path = dir.file("many.safetensors");
  write_bytes(path, file_bytes(header, data));
  const StateDict loaded = load_safetensors(path);
  REQUIRE(loaded.size() == kTensors);
  CHECK(loaded.at("t99999").item<int64_t>() == 99'999 % 251);

  const Json json = parse_json(header, "many");
  CHECK(json.keys.size() == kTensors);
  // A duplicate is still found, however far apart the two keys are.
  header.back() = ',';
  header += R"("t0":{}})";
  CHECK_THROWS_WITH(parse_json(header, "many"), Catch::Contains("duplicate key 't0'"));
}

TEST_CASE("safetensors refuses a header over 100 MB before reading it", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("huge-header.safetensors");
  const uint64_t header_size = 100'000'008;
  write_bytes(path, u64_le(header_size) + "{}");
  // A sparse file long enough to hold the header: nothing but the length is written.
  REQUIRE(::truncate(path.c_str(), static_cast<off_t>(8 + header_size)) == 0);
  CHECK_THROWS_WITH(load_safetensors(path),
                    Catch::Contains(path) &&
                        Catch::Contains("header length 100000008 exceeds the format's limit of 100000000 bytes"));
}
