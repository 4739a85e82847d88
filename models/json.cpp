#include "models/json.h"

#include <fmt/format.h>

#include <cstdint>
#include <unordered_set>

#include "core/error.h"
#include "core/utf8.h"

namespace kiln {
namespace {

constexpr int kMaxJsonDepth = 32;  // safetensors needs 3; a bound keeps recursion safe

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
    // A hash set keeps the duplicate check linear: a header with 100,000 tensors took
    // seconds with a scan of the keys so far.
    std::unordered_set<std::string> seen;
    while (true) {
      skip_whitespace();
      if (peek() != '"') error("expected a string key");
      const size_t key_pos = pos_;
      std::string key = parse_string();
      if (!seen.insert(key).second) {
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

}  // namespace

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

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

Json parse_json(std::string_view text, const std::string& context) {
  return JsonParser(text, context).parse_document();
}

}  // namespace kiln
