// parse(): reads the graph IR's text form (compiler/ir/graph.h) back into a Graph, re-adding
// every node through the Graph API so that op outputs are typed by the shape rules, and
// checking the printed types against them.
#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <map>
#include <optional>

#include "compiler/ir/graph.h"
#include "core/error.h"

namespace kiln::compiler {

namespace {

// A cursor over one line of text. Every error names the line.
class LineReader {
 public:
  LineReader(std::string_view text, int64_t line_number) : text_(text), line_(line_number) {}

  template <class... Args>
  [[noreturn]] void error(fmt::format_string<Args...> format, Args&&... args) const {
    fail("graph line {}: {}", line_, fmt::format(format, std::forward<Args>(args)...));
  }
  int64_t line_number() const { return line_; }

  void skip_spaces() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\r')) ++pos_;
  }
  // The next character after spaces; '\0' at the end of the line or at a comment.
  char peek() {
    skip_spaces();
    return pos_ < text_.size() && text_[pos_] != '#' ? text_[pos_] : '\0';
  }
  bool at_end() { return peek() == '\0'; }
  bool accept(char ch) {
    if (peek() != ch) return false;
    ++pos_;
    return true;
  }
  void expect(char ch, std::string_view what) {
    if (!accept(ch)) error("expected '{}' {}, found {}", ch, what, rest());
  }
  void expect_end() {
    if (!at_end()) error("unexpected text {}", rest());
  }
  // The comment after '#', trimmed ("" when there is none). Call at the end of the line.
  std::string comment() {
    skip_spaces();
    if (pos_ >= text_.size() || text_[pos_] != '#') return {};
    std::string_view c = text_.substr(pos_ + 1);
    while (!c.empty() && std::isspace(static_cast<unsigned char>(c.front()))) c.remove_prefix(1);
    while (!c.empty() && std::isspace(static_cast<unsigned char>(c.back()))) c.remove_suffix(1);
    return std::string(c);
  }

  // A name: letters, digits, '_' and '.', not starting with a digit.
  std::string_view word() {
    const char first = peek();
    if (!(std::isalpha(static_cast<unsigned char>(first)) || first == '_')) return {};
    const size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_' || text_[pos_] == '.'))
      ++pos_;
    return text_.substr(start, pos_ - start);
  }
  std::string_view expect_word(std::string_view what) {
    std::string_view w = word();
    if (w.empty()) error("expected {}, found {}", what, rest());
    return w;
  }

  // A number as written: sign, digits, '.', exponent, or the words inf and nan.
  std::string_view number_token() {
    skip_spaces();
    const size_t start = pos_;
    if (pos_ < text_.size() && (text_[pos_] == '-' || text_[pos_] == '+')) ++pos_;
    while (pos_ < text_.size()) {
      const char ch = text_[pos_];
      const bool exponent_sign =
          (ch == '-' || ch == '+') && pos_ > start && (text_[pos_ - 1] == 'e' || text_[pos_ - 1] == 'E');
      if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || exponent_sign)) break;
      ++pos_;
    }
    return text_.substr(start, pos_ - start);
  }
  int64_t parse_int(std::string_view token) const {
    int64_t v = 0;
    const char* end = token.data() + token.size();
    auto [ptr, ec] = std::from_chars(token.data() + (token.starts_with('+') ? 1 : 0), end, v);
    if (token.empty() || ec != std::errc() || ptr != end) error("bad integer '{}'", token);
    return v;
  }
  double parse_double(std::string_view token) const {
    std::string_view digits = token.starts_with('+') ? token.substr(1) : token;
    double v = 0;
    const char* end = digits.data() + digits.size();
    auto [ptr, ec] = std::from_chars(digits.data(), end, v);
    if (digits.empty() || ec != std::errc() || ptr != end) error("bad number '{}'", token);
    return v;
  }
  int64_t expect_int(std::string_view what) {
    std::string_view token = number_token();
    if (token.empty()) error("expected {}, found {}", what, rest());
    return parse_int(token);
  }

  // "text" with \" \\ \n and \r escapes.
  std::string quoted_string() {
    if (!accept('"')) error("expected a quoted string, found {}", rest());
    std::string s;
    while (true) {
      if (pos_ >= text_.size()) error("unterminated string");
      const char ch = text_[pos_++];
      if (ch == '"') return s;
      if (ch == '\\') {
        if (pos_ >= text_.size()) error("unterminated string");
        const char escaped = text_[pos_++];
        s += escaped == 'n' ? '\n' : escaped == 'r' ? '\r' : escaped;
      } else {
        s += ch;
      }
    }
  }

  // The rest of the line, for error messages.
  std::string rest() {
    skip_spaces();
    if (pos_ >= text_.size()) return "the end of the line";
    return fmt::format("'{}'", text_.substr(pos_, 24));
  }

 private:
  std::string_view text_;
  int64_t line_;
  size_t pos_ = 0;
};

std::optional<DType> dtype_named(std::string_view word) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (name(static_cast<DType>(i)) == word) return static_cast<DType>(i);
  return std::nullopt;
}

// cpu or cuda:N, after its first word has been read.
std::optional<Device> device_named(LineReader& in, std::string_view word) {
  if (word == "cpu") return Device::cpu();
  if (word != "cuda") return std::nullopt;
  in.expect(':', "after cuda (cuda:N)");
  const int64_t index = in.expect_int("a device index");
  if (index < 0 || index > 1024) in.error("bad device index {}", index);
  return Device::cuda(static_cast<int>(index));
}

bool has_float_syntax(std::string_view token) {
  return token.find_first_of(".eEin") != std::string_view::npos;  // '.', exponent, inf, nan
}

std::vector<int64_t> int_list(LineReader& in) {
  in.expect('[', "to open a list of integers");
  std::vector<int64_t> values;
  if (in.accept(']')) return values;
  do {
    values.push_back(in.expect_int("an integer"));
  } while (in.accept(','));
  in.expect(']', "to close a list of integers");
  return values;
}

AttrValue attr_value(LineReader& in) {
  const char first = in.peek();
  if (first == '"') return in.quoted_string();
  if (first == '[') return int_list(in);
  if (first == '$') {
    in.accept('$');
    if (in.peek() == 't' || in.peek() == 'f') {
      std::string_view w = in.word();
      if (w == "true" || w == "false") return Scalar(w == "true");
      in.error("bad scalar ${}", w);
    }
    std::string_view token = in.number_token();
    if (token.empty()) in.error("expected a number after '$', found {}", in.rest());
    return has_float_syntax(token) ? Scalar(in.parse_double(token)) : Scalar(in.parse_int(token));
  }
  if (first == '-' || first == '+' || first == '.' || std::isdigit(static_cast<unsigned char>(first))) {
    std::string_view token = in.number_token();
    if (has_float_syntax(token)) return in.parse_double(token);
    return in.parse_int(token);
  }
  std::string_view w = in.word();
  if (w == "true" || w == "false") return w == "true";
  if (w == "inf" || w == "nan") return in.parse_double(w);
  if (std::optional<DType> t = dtype_named(w)) return *t;
  if (std::optional<Device> d = device_named(in, w)) return *d;
  if (w.empty()) in.error("expected an attribute value, found {}", in.rest());
  in.error("unknown attribute value '{}'", w);
}

// {name=value, ...}; empty Attrs when the next character is not '{'.
Attrs attrs(LineReader& in) {
  Attrs result;
  if (!in.accept('{')) return result;
  if (in.accept('}')) return result;
  do {
    std::string name(in.expect_word("an attribute name"));
    if (result.has(name)) in.error("attribute {} given twice", name);
    in.expect('=', "after an attribute name");
    result.set(std::move(name), attr_value(in));
  } while (in.accept(','));
  in.expect('}', "to close the attributes");
  return result;
}

// f32[2,3] with optional nhwc, number and device words; or none.
TensorType tensor_type(LineReader& in) {
  std::string_view w = in.expect_word("a type such as f32[2,3]");
  if (w == "none") return TensorType{.defined = false};
  std::optional<DType> dtype = dtype_named(w);
  if (!dtype) in.error("unknown dtype '{}'", w);
  TensorType type{.dtype = *dtype, .shape = int_list(in)};
  for (int64_t size : type.shape)
    if (size < 0) in.error("negative size {} in a type", size);
  while (true) {
    const char next = in.peek();
    if (!std::isalpha(static_cast<unsigned char>(next))) break;
    std::string_view word = in.word();
    if (word == "nhwc") type.layout = MemoryFormat::channels_last;
    else if (word == "number") type.wrapped_number = true;
    else if (std::optional<Device> d = device_named(in, word)) type.device = *d;
    else in.error("unknown type qualifier '{}'", word);
  }
  return type;
}

std::vector<TensorType> tensor_types(LineReader& in) {
  std::vector<TensorType> types;
  if (in.at_end()) return types;
  do {
    types.push_back(tensor_type(in));
  } while (in.accept(','));
  return types;
}

class GraphReader {
 public:
  void line(std::string_view text, int64_t line_number) {
    LineReader in(text, line_number);
    if (in.at_end()) return;  // blank or comment
    std::vector<int64_t> defined;
    if (in.peek() == '%') {
      do {
        defined.push_back(value_number(in));
      } while (in.accept(','));
      in.expect('=', "after the defined values");
    }
    std::string_view keyword = in.expect_word("a node, return or write");
    if (defined.empty() && keyword == "return") return read_return(in);
    if (defined.empty() && keyword == "write") return read_write_back(in);
    for (int64_t n : defined)
      if (values_.contains(n)) in.error("%{} is defined twice", n);
    std::vector<Value> values;
    if (const std::optional<InputRole> role = role_of(keyword)) {
      values.push_back(read_input(in, *role));
    } else if (keyword == "constant") {
      values.push_back(read_constant(in));
    } else {
      values = read_op(in, keyword);
    }
    if (values.size() != defined.size())
      in.error("{} defines {} values, the line names {}", keyword, values.size(), defined.size());
    for (size_t i = 0; i < values.size(); ++i) values_.emplace(defined[i], values[i]);
  }

  Graph finish() { return std::move(graph_); }

 private:
  static int64_t value_number(LineReader& in) {
    in.expect('%', "before a value number");
    const int64_t n = in.expect_int("a value number");
    if (n < 0) in.error("negative value number %{}", n);
    return n;
  }
  // A value defined earlier, or `none` (when allowed).
  Value use(LineReader& in, bool allow_none) {
    if (allow_none && in.peek() == 'n') {
      if (in.word() == "none") return Value{};
      in.error("expected a value or none");
    }
    const int64_t n = value_number(in);
    auto it = values_.find(n);
    if (it == values_.end()) in.error("%{} is used before it is defined", n);
    return it->second;
  }

  // Runs a Graph call, prefixing its errors with the line.
  template <class F>
  auto on_line(const LineReader& in, F&& f) {
    try {
      return f();
    } catch (const Error& e) {
      in.error("{}", e.what());
    }
  }

  Value read_input(LineReader& in, InputRole role) {
    std::string name = in.quoted_string();
    in.expect(':', "before the input's type");
    TensorType type = tensor_type(in);
    in.expect_end();
    return on_line(in, [&] { return graph_.add_input(std::move(name), std::move(type), role); });
  }

  Value read_constant(LineReader& in) {
    const Attrs a = attrs(in);
    if (a.items().size() != 1 || a.items()[0].name != "value" || !std::holds_alternative<Scalar>(a.items()[0].value))
      in.error("a constant takes one attribute, {{value=$N}}");
    in.expect(':', "before the constant's type");
    TensorType type = tensor_type(in);
    in.expect_end();
    return on_line(in, [&] { return graph_.add_constant(a.scalar("value"), std::move(type)); });
  }

  std::vector<Value> read_op(LineReader& in, std::string_view op) {
    std::vector<Value> inputs;
    in.expect('(', fmt::format("after the op name {}", op));
    if (!in.accept(')')) {
      do {
        inputs.push_back(use(in, true));
      } while (in.accept(','));
      in.expect(')', "to close the op's inputs");
    }
    Attrs a = attrs(in);
    in.expect(':', "before the op's output types");
    const std::vector<TensorType> printed = tensor_types(in);
    in.expect_end();
    std::string source = in.comment();
    const std::vector<Value> values = on_line(in, [&] {
      return graph_.add_op(op, std::move(inputs), std::move(a), std::move(source));
    });
    if (printed.size() != values.size())
      in.error("{} has {} outputs, the line gives {} types", op, values.size(), printed.size());
    for (size_t i = 0; i < values.size(); ++i) {
      const TensorType& computed = graph_.type(values[i]);
      if (!(printed[i] == computed))
        in.error("{} output {} is printed as {} but its shape rule says {}", op, i, printed[i].str(),
                 computed.str());
    }
    return values;
  }

  void read_return(LineReader& in) {
    if (returned_) in.error("a second return");
    returned_ = true;
    std::vector<Value> outputs;
    if (!in.at_end()) {
      do {
        outputs.push_back(use(in, false));
      } while (in.accept(','));
    }
    in.expect_end();
    on_line(in, [&] { graph_.set_outputs(std::move(outputs)); });
  }

  void read_write_back(LineReader& in) {
    const Value input = use(in, false);
    in.expect('<', "in '<-'");
    in.expect('-', "in '<-'");
    const Value value = use(in, false);
    in.expect_end();
    on_line(in, [&] { graph_.add_write_back(input, value); });
  }

  Graph graph_;
  std::map<int64_t, Value> values_;  // printed number -> value in graph_
  bool returned_ = false;
};

}  // namespace

Graph parse(std::string_view text) {
  GraphReader reader;
  int64_t line_number = 0;
  while (!text.empty()) {
    ++line_number;
    const size_t end = text.find('\n');
    reader.line(text.substr(0, end), line_number);
    text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
  }
  return reader.finish();
}

}  // namespace kiln::compiler
