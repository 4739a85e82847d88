// libFuzzer target: the strict JSON reader of safetensors headers (models/json.cpp). Any
// input either parses or throws kiln::Error; whatever parses survives a round trip of its
// strings through append_json_string.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/error.h"
#include "models/json.h"

namespace {

// Re-serializes `value` with the library's own string escaping.
void write(const kiln::Json& value, std::string& out) {
  switch (value.kind) {
    case kiln::Json::Kind::string:
      kiln::append_json_string(out, value.text);
      return;
    case kiln::Json::Kind::integer:
      out += std::to_string(value.integer);
      return;
    case kiln::Json::Kind::array:
      out += '[';
      for (size_t i = 0; i < value.values.size(); ++i) {
        if (i > 0) out += ',';
        write(value.values[i], out);
      }
      out += ']';
      return;
    case kiln::Json::Kind::object:
      out += '{';
      for (size_t i = 0; i < value.keys.size(); ++i) {
        if (i > 0) out += ',';
        kiln::append_json_string(out, value.keys[i]);
        out += ':';
        write(value.values[i], out);
      }
      out += '}';
      return;
  }
}

bool same(const kiln::Json& a, const kiln::Json& b) {
  if (a.kind != b.kind || a.text != b.text || a.integer != b.integer || a.keys != b.keys ||
      a.values.size() != b.values.size())
    return false;
  for (size_t i = 0; i < a.values.size(); ++i)
    if (!same(a.values[i], b.values[i])) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  kiln::Json value;
  try {
    value = kiln::parse_json(text, "fuzz");
  } catch (const kiln::Error&) {
    return 0;
  }
  // What parsed is valid UTF-8 throughout, and reads back the same after writing it out.
  std::string out;
  write(value, out);
  if (!kiln::is_valid_utf8(out)) std::abort();
  try {
    if (!same(kiln::parse_json(out, "round trip"), value)) std::abort();
  } catch (const kiln::Error&) {
    std::abort();
  }
  return 0;
}
