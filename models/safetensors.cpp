// The safetensors format, written and read with nothing but POSIX file calls: a strict JSON
// parser for the header, validation of every byte range before any tensor is read, and an
// atomic save (temporary file, fsync, rename).
#include "models/safetensors.h"

#include <fcntl.h>
#include <fmt/ranges.h>
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
#include "core/regular_file.h"
#include "models/json.h"

namespace kiln {
namespace {

// The format stores little-endian bytes; kiln tensors are written as they lie in memory.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");
static_assert(sizeof(bool) == 1, "BOOL tensors are stored as one byte per element");

constexpr std::string_view kMetadataKey = "__metadata__";
// The reference implementation's bound on the JSON header (100 MB): a larger one is refused
// before it is read.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

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
  const Json root = parse_json(text, context);
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
  // Refuses a FIFO or a device without blocking on it.
  const RegularFile file(path, "load_safetensors");
  const int64_t file_size = file.size();
  if (file_size < 8)
    fail("{}: file is {} bytes, too short for the 8-byte header length", context, file_size);

  uint64_t header_size = 0;
  file.read_at(&header_size, 8, 0);
  if (header_size > static_cast<uint64_t>(file_size - 8))
    fail(
        "{}: header length {} exceeds the {} bytes that follow it (truncated or not a "
        "safetensors file?)",
        context, header_size, file_size - 8);
  if (header_size > kMaxHeaderBytes)
    fail("{}: header length {} exceeds the format's limit of {} bytes", context, header_size,
         kMaxHeaderBytes);
  std::string header_text(header_size, '\0');
  file.read_at(header_text.data(), header_text.size(), 8);
  const int64_t data_start = 8 + static_cast<int64_t>(header_size);
  Header header = parse_header(header_text, file_size - data_start, context);

  SafetensorsContents contents{.metadata = std::move(header.metadata)};
  for (const TensorEntry& entry : header.entries) {
    Tensor tensor = make_tensor(entry.shape, entry.dtype);
    const auto nbytes = static_cast<size_t>(entry.end - entry.begin);
    if (nbytes > 0) file.read_at(tensor.data_ptr(), nbytes, data_start + entry.begin);
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
