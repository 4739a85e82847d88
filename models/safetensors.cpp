// The safetensors format, written and read with nothing but POSIX file calls: a strict JSON
// parser for the header, validation of every byte range before any tensor is read, and an
// atomic save (temporary file, fsync, rename).
#include "models/safetensors.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <random>
#include <string_view>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "core/grad_mode.h"

namespace kiln {
namespace {

// The format stores little-endian bytes; kiln tensors are written as they lie in memory.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");
static_assert(sizeof(bool) == 1, "BOOL tensors are stored as one byte per element");

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr int kMaxJsonDepth = 32;  // the format needs 3; a bound keeps recursion safe

struct FormatDType {
  DType dtype;
  std::string_view name;
};
constexpr FormatDType kFormatDTypes[] = {
    {DType::f32, "F32"}, {DType::f64, "F64"}, {DType::f16, "F16"}, {DType::bf16, "BF16"},
    {DType::i64, "I64"}, {DType::i32, "I32"}, {DType::u8, "U8"},   {DType::boolean, "BOOL"}};
// Valid in the format, but kiln has no dtype for them: a clearer error than "unknown".
constexpr std::string_view kUnsupportedFormatDTypes[] = {"I8",      "I16",     "U16",     "U32",
                                                         "U64",     "F8_E4M3", "F8_E5M2", "F8_E8M0",
                                                         "F6_E2M3", "F6_E3M2", "F4",      "C64"};

std::string_view format_name(DType dtype) {
  for (const FormatDType& d : kFormatDTypes)
    if (d.dtype == dtype) return d.name;
  fail("safetensors: dtype {} has no safetensors name", name(dtype));
}

std::string errno_message(int error) { return std::generic_category().message(error); }

// Length of the UTF-8 sequence starting at s[i], or 0 when it is malformed (overlong forms,
// surrogates and code points past U+10FFFF included).
size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  size_t length;
  uint32_t code_point;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2, code_point = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3, code_point = lead & 0x0F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4, code_point = lead & 0x07;
  } else {
    return 0;
  }
  if (i + length > s.size()) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    code_point = (code_point << 6) | (byte(i + k) & 0x3F);
  }
  const uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (code_point < smallest[length] || code_point > 0x10FFFF) return 0;
  if (code_point >= 0xD800 && code_point <= 0xDFFF) return 0;
  return length;
}

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

// ---------------------------------------------------------------------------------------
// JSON: only what the header needs (objects, arrays, strings, integers), parsed strictly.

struct Json {
  enum class Kind { object, array, string, integer };
  Kind kind = Kind::object;
  std::string text;               // string
  int64_t integer = 0;            // integer
  std::vector<std::string> keys;  // object keys, in file order, no duplicates
  std::vector<Json> values;       // object values (parallel to keys) or array items
};

std::string_view kind_name(Json::Kind kind) {
  switch (kind) {
    case Json::Kind::object:
      return "an object";
    case Json::Kind::array:
      return "an array";
    case Json::Kind::string:
      return "a string";
    case Json::Kind::integer:
      return "an integer";
  }
  return "?";
}

class JsonParser {
 public:
  JsonParser(std::string_view text, const std::string& context) : text_(text), context_(context) {}

  // One value, then only whitespace (the format pads the header with spaces) to the end.
  Json parse_document() {
    skip_whitespace();
    Json value = parse_value(0);
    skip_whitespace();
    if (pos_ != text_.size()) error("unexpected data after the top-level value");
    return value;
  }

 private:
  [[noreturn]] void error(std::string_view what) const {
    fail("{}: header is not valid JSON: {} at byte {} of {}", context_, what, pos_, text_.size());
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  void skip_whitespace() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r'))
      ++pos_;
  }

  void expect(char c, std::string_view what) {
    skip_whitespace();
    if (at_end() || peek() != c) error(fmt::format("expected {}", what));
    ++pos_;
  }

  Json parse_value(int depth) {
    if (depth > kMaxJsonDepth) error("values nested too deeply");
    skip_whitespace();
    if (at_end()) error("unexpected end of the header");
    const char c = peek();
    if (c == '{') return parse_object(depth);
    if (c == '[') return parse_array(depth);
    if (c == '"') {
      Json value{.kind = Json::Kind::string};
      value.text = parse_string();
      return value;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_integer();
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7F) error(fmt::format("unexpected character '{}'", c));
    error(fmt::format("unexpected byte 0x{:02x}", byte));
  }

  Json parse_object(int depth) {
    Json object{.kind = Json::Kind::object};
    ++pos_;  // '{'
    skip_whitespace();
    if (peek() == '}') {
      ++pos_;
      return object;
    }
    while (true) {
      skip_whitespace();
      if (peek() != '"') error("expected a string key");
      const size_t key_pos = pos_;
      std::string key = parse_string();
      if (std::find(object.keys.begin(), object.keys.end(), key) != object.keys.end()) {
        pos_ = key_pos;
        error(fmt::format("duplicate key '{}'", key));
      }
      expect(':', "':' after an object key");
      object.values.push_back(parse_value(depth + 1));
      object.keys.push_back(std::move(key));
      skip_whitespace();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}', "',' or '}' in an object");
      return object;
    }
  }

  Json parse_array(int depth) {
    Json array{.kind = Json::Kind::array};
    ++pos_;  // '['
    skip_whitespace();
    if (peek() == ']') {
      ++pos_;
      return array;
    }
    while (true) {
      array.values.push_back(parse_value(depth + 1));
      skip_whitespace();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(']', "',' or ']' in an array");
      return array;
    }
  }

  uint32_t parse_hex4() {
    if (pos_ + 4 > text_.size()) error("truncated \\u escape");
    uint32_t value = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text_[pos_++];
      value <<= 4;
      if (c >= '0' && c <= '9')
        value |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        value |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        value |= static_cast<uint32_t>(c - 'A' + 10);
      else
        error("invalid hex digit in a \\u escape");
    }
    return value;
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string parse_string() {
    ++pos_;  // '"'
    std::string out;
    while (true) {
      if (at_end()) error("unterminated string");
      const auto c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) error("unescaped control character in a string");
      if (c >= 0x80) {
        const size_t n = utf8_sequence_length(text_, pos_);
        if (n == 0) error("invalid UTF-8 in a string");
        out.append(text_.substr(pos_, n));
        pos_ += n;
        continue;
      }
      ++pos_;
      if (c != '\\') {
        out += static_cast<char>(c);
        continue;
      }
      if (at_end()) error("unterminated escape");
      const char e = text_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t cp = parse_hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) error("unpaired low surrogate in a \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (text_.substr(pos_, 2) != "\\u") error("unpaired high surrogate in a \\u escape");
            pos_ += 2;
            const uint32_t low = parse_hex4();
            if (low < 0xDC00 || low > 0xDFFF) error("unpaired high surrogate in a \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          --pos_;
          error("invalid escape in a string");
      }
    }
  }

  Json parse_integer() {
    const size_t start = pos_;
    const bool negative = peek() == '-';
    if (negative) ++pos_;
    if (at_end() || peek() < '0' || peek() > '9') error("expected a digit");
    if (peek() == '0' && pos_ + 1 < text_.size() && text_[pos_ + 1] >= '0' &&
        text_[pos_ + 1] <= '9')
      error("leading zero in a number");
    // Accumulated negatively so that INT64_MIN fits.
    int64_t value = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      const int digit = peek() - '0';
      if (__builtin_mul_overflow(value, 10, &value) ||
          __builtin_sub_overflow(value, digit, &value)) {
        pos_ = start;
        error("integer out of range");
      }
      ++pos_;
    }
    if (peek() == '.' || peek() == 'e' || peek() == 'E') error("numbers must be integers");
    if (!negative) {
      if (value == INT64_MIN) {
        pos_ = start;
        error("integer out of range");
      }
      value = -value;
    }
    Json number{.kind = Json::Kind::integer};
    number.integer = value;
    return number;
  }

  std::string_view text_;
  const std::string& context_;
  size_t pos_ = 0;
};

// ---------------------------------------------------------------------------------------
// The header's meaning: tensor entries and metadata, checked against the data section.

struct TensorEntry {
  std::string name;
  DType dtype;
  Shape shape;
  int64_t begin = 0, end = 0;  // byte range within the data section
};

struct Header {
  std::vector<TensorEntry> entries;
  SafetensorsMetadata metadata;
};

const Json* find_member(const Json& object, std::string_view key) {
  for (size_t i = 0; i < object.keys.size(); ++i)
    if (object.keys[i] == key) return &object.values[i];
  return nullptr;
}

std::vector<int64_t> non_negative_integers(const Json& array, const std::string& where,
                                           std::string_view field) {
  if (array.kind != Json::Kind::array)
    fail("{}: '{}' is {}, not an array", where, field, kind_name(array.kind));
  std::vector<int64_t> out;
  for (const Json& item : array.values) {
    if (item.kind != Json::Kind::integer)
      fail("{}: '{}' holds {}, not an integer", where, field, kind_name(item.kind));
    if (item.integer < 0) fail("{}: '{}' holds the negative number {}", where, field, item.integer);
    out.push_back(item.integer);
  }
  return out;
}

TensorEntry parse_entry(const std::string& name, const Json& value, const std::string& context) {
  const std::string where = fmt::format("{}: tensor '{}'", context, name);
  if (value.kind != Json::Kind::object)
    fail("{}: entry is {}, not an object", where, kind_name(value.kind));
  for (const std::string& key : value.keys)
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      fail("{}: unknown field '{}'", where, key);
  const Json* dtype = find_member(value, "dtype");
  const Json* shape = find_member(value, "shape");
  const Json* offsets = find_member(value, "data_offsets");
  if (!dtype || !shape || !offsets)
    fail("{}: missing field '{}'", where, !dtype ? "dtype" : !shape ? "shape" : "data_offsets");

  TensorEntry entry{.name = name};
  if (dtype->kind != Json::Kind::string)
    fail("{}: 'dtype' is {}, not a string", where, kind_name(dtype->kind));
  const FormatDType* known = nullptr;
  for (const FormatDType& d : kFormatDTypes)
    if (d.name == dtype->text) known = &d;
  if (!known) {
    for (std::string_view unsupported : kUnsupportedFormatDTypes)
      if (unsupported == dtype->text)
        fail("{}: dtype {} is not supported by kiln (F32, F64, F16, BF16, I64, I32, U8, BOOL)",
             where, dtype->text);
    fail("{}: unknown dtype \"{}\"", where, dtype->text);
  }
  entry.dtype = known->dtype;
  entry.shape = non_negative_integers(*shape, where, "shape");

  const std::vector<int64_t> range = non_negative_integers(*offsets, where, "data_offsets");
  if (range.size() != 2)
    fail("{}: 'data_offsets' has {} numbers, not 2 (begin, end)", where, range.size());
  entry.begin = range[0];
  entry.end = range[1];
  if (entry.begin > entry.end)
    fail("{}: data_offsets [{},{}] end before they begin", where, entry.begin, entry.end);

  int64_t numel = 1;
  bool empty = std::find(entry.shape.begin(), entry.shape.end(), 0) != entry.shape.end();
  int64_t nbytes = 0;
  if (!empty) {
    for (int64_t size : entry.shape)
      if (__builtin_mul_overflow(numel, size, &numel))
        fail("{}: shape {} has too many elements", where, shape_str(entry.shape));
    if (__builtin_mul_overflow(numel, static_cast<int64_t>(itemsize(entry.dtype)), &nbytes))
      fail("{}: shape {} has too many elements", where, shape_str(entry.shape));
  }
  if (entry.end - entry.begin != nbytes)
    fail("{}: {}{} needs {} bytes but data_offsets [{},{}] hold {}", where, known->name,
         shape_str(entry.shape), nbytes, entry.begin, entry.end, entry.end - entry.begin);
  return entry;
}

Header parse_header(std::string_view text, int64_t data_size, const std::string& context) {
  if (!is_valid_utf8(text)) fail("{}: header is not valid UTF-8", context);
  const Json root = JsonParser(text, context).parse_document();
  if (root.kind != Json::Kind::object)
    fail("{}: header is {}, not a JSON object", context, kind_name(root.kind));

  Header header;
  for (size_t i = 0; i < root.keys.size(); ++i) {
    const std::string& key = root.keys[i];
    const Json& value = root.values[i];
    if (key == kMetadataKey) {
      if (value.kind != Json::Kind::object)
        fail("{}: __metadata__ is {}, not an object", context, kind_name(value.kind));
      for (size_t m = 0; m < value.keys.size(); ++m) {
        if (value.values[m].kind != Json::Kind::string)
          fail("{}: __metadata__ entry '{}' is {}, not a string", context, value.keys[m],
               kind_name(value.values[m].kind));
        header.metadata[value.keys[m]] = value.values[m].text;
      }
      continue;
    }
    TensorEntry entry = parse_entry(key, value, context);
    if (entry.end > data_size)
      fail("{}: tensor '{}': data_offsets [{},{}] run past the {}-byte data section", context, key,
           entry.begin, entry.end, data_size);
    header.entries.push_back(std::move(entry));
  }

  // The format requires the tensors to tile the data section exactly: no overlaps, no holes.
  std::vector<const TensorEntry*> by_offset;
  for (const TensorEntry& e : header.entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorEntry* a, const TensorEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  int64_t covered = 0;
  const TensorEntry* previous = nullptr;
  for (const TensorEntry* e : by_offset) {
    if (e->begin < covered)
      fail("{}: tensor '{}': data_offsets [{},{}] overlap tensor '{}' [{},{}]", context, e->name,
           e->begin, e->end, previous->name, previous->begin, previous->end);
    if (e->begin > covered)
      fail(
          "{}: tensor '{}': data_offsets [{},{}] leave a hole at bytes [{},{}] of the data "
          "section",
          context, e->name, e->begin, e->end, covered, e->begin);
    covered = e->end;
    previous = e;
  }
  if (covered != data_size)
    fail("{}: the data section has {} bytes but the tensors cover only the first {}", context,
         data_size, covered);
  return header;
}

// ---------------------------------------------------------------------------------------
// POSIX file helpers.

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }
  // Closes now, reporting the error a deferred write may only surface here.
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

void read_exactly(int fd, void* destination, size_t nbytes, int64_t offset,
                  const std::string& context) {
  auto* out = static_cast<char*>(destination);
  while (nbytes > 0) {
    const ssize_t n = ::pread(fd, out, std::min<size_t>(nbytes, size_t{1} << 30), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("{}: read failed: {}", context, errno_message(errno));
    if (n == 0) fail("{}: file ended early at byte {} (changed while reading?)", context, offset);
    out += n;
    nbytes -= static_cast<size_t>(n);
    offset += n;
  }
}

void write_all(int fd, const void* source, size_t nbytes, const std::string& context) {
  const auto* in = static_cast<const char*>(source);
  while (nbytes > 0) {
    const ssize_t n = ::write(fd, in, std::min<size_t>(nbytes, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("{}: write failed: {}", context, errno_message(errno));
    in += n;
    nbytes -= static_cast<size_t>(n);
  }
}

// Removes the temporary file unless the save got as far as renaming it.
class TemporaryFile {
 public:
  explicit TemporaryFile(std::string path) : path_(std::move(path)) {}
  ~TemporaryFile() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;
  const std::string& path() const { return path_; }
  void keep() { path_.clear(); }

 private:
  std::string path_;
};

std::string random_suffix() {
  std::random_device device;
  const uint64_t bits = (static_cast<uint64_t>(device()) << 32) ^ device();
  return fmt::format("{:016x}", bits);
}

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20)
          out += fmt::format("\\u{:04x}", c);
        else
          out += ch;
    }
  }
  out += '"';
}

struct TensorToWrite {
  const std::string* name;
  Tensor data;  // contiguous, on the CPU
  size_t nbytes;
};

}  // namespace

void save_safetensors(const StateDict& tensors, const std::string& path,
                      const SafetensorsMetadata& metadata) {
  const std::string context = fmt::format("save_safetensors: '{}'", path);
  NoGradGuard no_grad;  // the copies below are I/O, not part of any graph

  std::vector<TensorToWrite> items;
  for (const auto& [name, tensor] : tensors) {
    if (name == kMetadataKey)
      fail("{}: a tensor cannot be named '{}' (the format reserves it)", context, name);
    if (!is_valid_utf8(name)) fail("{}: tensor name '{}' is not valid UTF-8", context, name);
    if (!tensor.defined()) fail("{}: tensor '{}' is undefined", context, name);
    Tensor data = tensor.detach();
    if (!data.device().is_cpu()) data = data.to(Device::cpu());
    data = data.contiguous();
    items.push_back({&name, data, static_cast<size_t>(data.numel()) * data.itemsize()});
  }
  for (const auto& [key, value] : metadata)
    if (!is_valid_utf8(key) || !is_valid_utf8(value))
      fail("{}: metadata entry '{}' is not valid UTF-8", context, key);

  // Widest elements first (then by name): every tensor then starts at a multiple of its
  // element size, so readers that map the file can use the bytes in place.
  std::stable_sort(items.begin(), items.end(), [](const TensorToWrite& a, const TensorToWrite& b) {
    return a.data.itemsize() > b.data.itemsize();
  });

  std::string header = "{";
  if (!metadata.empty()) {
    append_json_string(header, kMetadataKey);
    header += ":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) header += ',';
      first = false;
      append_json_string(header, key);
      header += ':';
      append_json_string(header, value);
    }
    header += '}';
  }
  size_t offset = 0;
  for (const TensorToWrite& item : items) {
    if (header.size() > 1) header += ',';
    append_json_string(header, *item.name);
    header += fmt::format(":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                          format_name(item.data.dtype()), fmt::join(item.data.shape(), ","), offset,
                          offset + item.nbytes);
    offset += item.nbytes;
  }
  header += '}';
  // The data section starts 8-byte aligned (after the 8-byte length and the header).
  header.append((8 - header.size() % 8) % 8, ' ');

  std::string prefix(8, '\0');
  const uint64_t header_size = header.size();
  std::memcpy(prefix.data(), &header_size, 8);  // little-endian host, checked above

  TemporaryFile temporary(path + ".tmp." + random_suffix());
  FileDescriptor file(
      ::open(temporary.path().c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
  if (file.get() < 0) {
    const int error = errno;
    temporary.keep();  // not created: nothing to remove, and never remove someone else's file
    fail("{}: cannot create the temporary file '{}': {}", context, temporary.path(),
         errno_message(error));
  }
  write_all(file.get(), prefix.data(), prefix.size(), context);
  write_all(file.get(), header.data(), header.size(), context);
  for (const TensorToWrite& item : items)
    if (item.nbytes > 0) write_all(file.get(), item.data.data_ptr(), item.nbytes, context);
  if (::fsync(file.get()) != 0) fail("{}: fsync failed: {}", context, errno_message(errno));
  if (file.close() != 0) fail("{}: close failed: {}", context, errno_message(errno));
  if (::rename(temporary.path().c_str(), path.c_str()) != 0)
    fail("{}: cannot rename '{}' to it: {}", context, temporary.path(), errno_message(errno));
  temporary.keep();

  // Best effort: make the rename itself durable. Some file systems cannot fsync a directory.
  const size_t slash = path.find_last_of('/');
  const std::string directory = slash == std::string::npos ? "."
                                : slash == 0               ? "/"
                                                           : path.substr(0, slash);
  FileDescriptor dir(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() >= 0) ::fsync(dir.get());
}

SafetensorsContents load_safetensors_with_metadata(const std::string& path) {
  const std::string context = fmt::format("load_safetensors: '{}'", path);
  FileDescriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (file.get() < 0) fail("{}: cannot open: {}", context, errno_message(errno));
  struct stat info {};
  if (::fstat(file.get(), &info) != 0) fail("{}: cannot stat: {}", context, errno_message(errno));
  if (!S_ISREG(info.st_mode)) fail("{}: not a regular file", context);
  const int64_t file_size = info.st_size;
  if (file_size < 8)
    fail("{}: file is {} bytes, too short for the 8-byte header length", context, file_size);

  uint64_t header_size = 0;
  read_exactly(file.get(), &header_size, 8, 0, context);
  if (header_size > static_cast<uint64_t>(file_size - 8))
    fail(
        "{}: header length {} exceeds the {} bytes that follow it (truncated or not a "
        "safetensors file?)",
        context, header_size, file_size - 8);
  std::string header_text(header_size, '\0');
  read_exactly(file.get(), header_text.data(), header_text.size(), 8, context);
  const int64_t data_start = 8 + static_cast<int64_t>(header_size);
  Header header = parse_header(header_text, file_size - data_start, context);

  SafetensorsContents contents{.metadata = std::move(header.metadata)};
  for (const TensorEntry& entry : header.entries) {
    Tensor tensor = make_tensor(entry.shape, entry.dtype);
    const auto nbytes = static_cast<size_t>(entry.end - entry.begin);
    if (nbytes > 0)
      read_exactly(file.get(), tensor.data_ptr(), nbytes, data_start + entry.begin, context);
    if (entry.dtype == DType::boolean) {
      // Any byte but 0 or 1 is not a bool: reading it as one would be undefined behaviour.
      const auto* bytes = static_cast<const unsigned char*>(tensor.data_ptr());
      for (size_t i = 0; i < nbytes; ++i)
        if (bytes[i] > 1)
          fail("{}: tensor '{}': BOOL element {} holds the byte {}, not 0 or 1", context,
               entry.name, i, bytes[i]);
    }
    contents.tensors.emplace(entry.name, std::move(tensor));
  }
  return contents;
}

StateDict load_safetensors(const std::string& path) {
  return load_safetensors_with_metadata(path).tensors;
}

}  // namespace kiln
