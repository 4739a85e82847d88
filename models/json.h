#pragma once
// A strict JSON reader for what the safetensors header needs (objects, arrays, strings,
// integers), and the UTF-8 and string-escaping helpers that go with it.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

// A parsed JSON value.
struct Json {
  enum class Kind { object, array, string, integer };
  Kind kind = Kind::object;
  std::string text;               // string
  int64_t integer = 0;            // integer
  std::vector<std::string> keys;  // object keys, in file order, no duplicates
  std::vector<Json> values;       // object values (parallel to keys) or array items
};

// Parses one JSON value followed only by whitespace; errors are kiln::Errors that start
// with `context` (the file being read).
Json parse_json(std::string_view text, const std::string& context);
// "an object", "an array", ...: for error messages.
std::string_view kind_name(Json::Kind kind);
// Whether s is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool is_valid_utf8(std::string_view s);
// Appends s to out as a quoted, escaped JSON string.
void append_json_string(std::string& out, std::string_view s);

}  // namespace kiln
