// Parser for the canonical text form (see ir/printer.cpp for the grammar by example).
//
// A hand-written recursive-descent parser over bytes. It recurses only into a fused node's
// body (a nested graph, parsed by a child Parser with its own value namespace), at most
// kMaxFusedNesting deep, so no input can exhaust the stack. Every failure is a kiln::Error
// that names FILE:LINE:COL, what was found there and what was expected. The graph is
// built with the ordinary builders, so shape rules and attribute schemas are checked
// exactly as for traced code; the declared result type of each node must match the
// inferred one (for a fused node: its body's output types).
#include "ir/parser.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>
#include <unordered_map>

#include "ir/calling.h"

namespace kiln {
namespace {

// A splat constant stores one element whatever its type; the elements of list literals are
// stored, so their total over the file (fused bodies included) is bounded.
constexpr int64_t kMaxConstantBytes = int64_t{1} << 30;

bool is_ident_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_number_text(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!is_digit(c)) return false;
  return true;
}

// A scalar as written (a number, or a word such as true or inf) and where it starts.
struct Token {
  std::string_view text;
  size_t pos;
};

// A tensor literal as written; it becomes a Tensor once the declared type is known.
struct Literal {
  std::vector<Token> elements;
  bool is_list = false;
};

class Parser {
 public:
  // `parent`: the parser of the graph whose fused node this parser reads the body of.
  Parser(std::string_view src, std::string_view file, const Parser* parent = nullptr)
      : src_(src), file_(file), parent_(parent), depth_(parent ? parent->depth_ + 1 : 0),
        constant_bytes_(parent ? parent->constant_bytes_ : &own_constant_bytes_) {}
  // The whole input: one graph, then end of input; the result is verified.
  Graph parse_graph();

 private:
  struct ValueRef {
    std::string key;  // the text after '%': a name or a number
    size_t pos;
    bool numbered;
  };

  // Positions and diagnostics.
  std::string line_col(size_t at) const;  // "LINE:COL"
  [[noreturn]] void fail(size_t at, const std::string& what) const;
  // Fails at the next token with "expected WHAT, found TOKEN".
  [[noreturn]] void fail_expected(const std::string& what);
  std::string describe_next() const;
  // Lexing.
  char peek() const { return pos_ < src_.size() ? src_[pos_] : '\0'; }
  bool at_end() const { return pos_ >= src_.size(); }
  void skip_ws();
  bool consume(char c);
  void expect(char c, std::string_view context);
  std::string_view word();
  Token scalar(const std::string& what);
  // Grammar.
  void parse_graph_def();
  void parse_input();
  void parse_node();
  void parse_fused(const std::vector<ValueRef>& results, size_t op_at, std::vector<ValueId> operands,
                   const std::vector<size_t>& operand_at);
  Graph parse_body();
  void parse_return();
  ValueRef parse_value_ref();
  ValueId use_value(size_t* at = nullptr);
  void check_new(const ValueRef& def) const;
  TensorType parse_type();
  Attr parse_attr(const AttrSpec& spec, Literal& literal);
  int64_t to_int(Token tok, const std::string& what) const;
  template <typename T>
  T to_float(Token tok, const std::string& what) const;
  void set_element(Tensor& t, int64_t i, const Token& e) const;
  Tensor build_tensor(const Literal& lit, const TensorType& type, size_t type_pos);
  void parse_note(ValueId v);
  std::string read_note();  // a trailing comment on the current line, or ""

  std::string_view src_;
  std::string file_;
  const Parser* parent_;
  int depth_;  // how many fused bodies this graph is nested in
  int64_t own_constant_bytes_ = 0;
  int64_t* constant_bytes_;  // list literals' bytes so far in the whole file (the root's count)
  size_t pos_ = 0;
  Graph g_;
  struct Def {
    ValueId value;
    size_t pos;
  };
  std::unordered_map<std::string, Def> defs_;
};

// The 1-based line and column of byte `at` of `text`.
std::pair<int64_t, int64_t> line_and_column(std::string_view text, size_t at) {
  at = std::min(at, text.size());
  int64_t line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < at; ++i)
    if (text[i] == '\n') ++line, line_start = i + 1;
  return {line, static_cast<int64_t>(at - line_start + 1)};
}

// "LINE:COL" of byte `at` of `text`.
std::string line_col_in(std::string_view text, size_t at) {
  auto [line, column] = line_and_column(text, at);
  return std::to_string(line) + ":" + std::to_string(column);
}

std::string Parser::line_col(size_t at) const { return line_col_in(src_, at); }

void Parser::fail(size_t at, const std::string& what) const {
  auto [line, column] = line_and_column(src_, at);
  throw ParseError(file_ + ":" + std::to_string(line) + ":" + std::to_string(column) + ": error: " + what, file_, line,
                   column);
}

void Parser::fail_expected(const std::string& what) {
  skip_ws();
  fail(pos_, "expected " + what + ", found " + describe_next());
}

// The token at the current position, quoted, for "expected X, found Y".
std::string Parser::describe_next() const {
  if (at_end()) return "end of input";
  char c = peek();
  size_t end = pos_ + 1;
  if (is_ident_char(c) || c == '%' || (c == '-' && end < src_.size() && is_ident_char(src_[end])))
    while (end < src_.size() && is_ident_char(src_[end]) && end - pos_ < 40) ++end;
  else if (!std::isprint(static_cast<unsigned char>(c))) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "byte 0x%02x", static_cast<unsigned char>(c));
    return buf;
  }
  return "'" + std::string(src_.substr(pos_, end - pos_)) + "'";
}

void Parser::skip_ws() {
  while (!at_end()) {
    char c = peek();
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++pos_;
    } else if (src_.substr(pos_, 2) == "//") {
      size_t nl = src_.find('\n', pos_);
      pos_ = nl == std::string_view::npos ? src_.size() : nl;
    } else {
      return;
    }
  }
}

bool Parser::consume(char c) {
  skip_ws();
  if (at_end() || peek() != c) return false;
  ++pos_;
  return true;
}

void Parser::expect(char c, std::string_view context) {
  if (consume(c)) return;
  fail_expected("'" + std::string(1, c) + "' " + std::string(context));
}

// A run of identifier characters at the current position (possibly empty).
std::string_view Parser::word() {
  size_t start = pos_;
  while (!at_end() && is_ident_char(peek())) ++pos_;
  return src_.substr(start, pos_ - start);
}

// One scalar: a number, possibly negative, or a word (true, inf, nan). Exponent signs
// are the only '+' or '-' inside a number.
Token Parser::scalar(const std::string& what) {
  skip_ws();
  size_t start = pos_;
  if (peek() == '-') ++pos_;
  bool number = is_digit(peek());
  while (!at_end()) {
    char c = peek();
    bool exponent_sign =
        number && (c == '+' || c == '-') && (src_[pos_ - 1] == 'e' || src_[pos_ - 1] == 'E');
    if (!is_ident_char(c) && !exponent_sign) break;
    ++pos_;
  }
  if (pos_ == start || (pos_ == start + 1 && src_[start] == '-')) {
    pos_ = start;
    fail_expected(what);
  }
  return {src_.substr(start, pos_ - start), start};
}

int64_t Parser::to_int(Token tok, const std::string& what) const {
  int64_t v = 0;
  const char* last = tok.text.data() + tok.text.size();
  auto [end, ec] = std::from_chars(tok.text.data(), last, v);
  if (ec == std::errc::result_out_of_range && end == last)
    fail(tok.pos, "integer " + std::string(tok.text) + " is out of range in " + what);
  if (ec != std::errc() || end != last)
    fail(tok.pos, "expected an integer in " + what + ", found '" + std::string(tok.text) + "'");
  return v;
}

template <typename T>
T Parser::to_float(Token tok, const std::string& what) const {
  std::string_view s = tok.text;
  if (s == "inf") return std::numeric_limits<T>::infinity();
  if (s == "-inf") return -std::numeric_limits<T>::infinity();
  if (s == "nan") return std::numeric_limits<T>::quiet_NaN();
  // from_chars would also take "infinity" and friends; only plain numbers are ours.
  bool numeric = is_digit(s[0]) || (s[0] == '-' && s.size() > 1 && is_digit(s[1]));
  T v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  bool whole = end == s.data() + s.size();
  if (numeric && whole && ec == std::errc::result_out_of_range)
    fail(tok.pos, "number " + std::string(s) + " is out of range in " + what);
  if (!numeric || !whole || ec != std::errc())
    fail(tok.pos, "expected a number in " + what + ", found '" + std::string(s) + "'");
  return v;
}

Graph Parser::parse_graph() {
  parse_graph_def();
  skip_ws();
  if (!at_end()) fail_expected("end of input after the graph");
  try {
    verify(g_);
  } catch (const Error& e) {
    fail(pos_, e.what());
  }
  return std::move(g_);
}

// graph @NAME(INPUTS) { NODES return OUTPUTS }
void Parser::parse_graph_def() {
  skip_ws();
  size_t at = pos_;
  if (word() != "graph") {
    pos_ = at;
    fail_expected(parent_ ? "'graph' to start the body of fused" : "'graph'");
  }
  expect('@', "before the graph name");
  std::string_view name = word();
  if (name.empty()) fail_expected("a graph name after '@'");
  g_.set_name(std::string(name));
  expect('(', "after the graph name");
  if (!consume(')')) {
    do parse_input();
    while (consume(','));
    expect(')', "after the graph inputs");
  }
  skip_ws();
  at = pos_;
  const bool fixed = word() == "fixed_batch";
  if (!fixed) pos_ = at;
  expect('{', "to start the graph body");
  if (fixed) {
    std::string why = read_note();
    g_.set_fixed_batch(why.empty() ? "the graph says fixed_batch" : why);
  }
  for (;;) {
    skip_ws();
    if (peek() == '%') {
      parse_node();
      continue;
    }
    at = pos_;
    if (word() == "return") {
      parse_return();
      break;
    }
    pos_ = at;
    fail_expected("a value definition or 'return'");
  }
  expect('}', "after the return statement");
}

Parser::ValueRef Parser::parse_value_ref() {
  skip_ws();
  size_t at = pos_;
  if (peek() != '%') fail_expected("a value such as '%x'");
  ++pos_;
  std::string key(word());
  if (key.empty()) fail(at, "expected a value name after '%'");
  bool numbered = is_number_text(key);
  if (!numbered && !is_valid_name(key))
    fail(at, "invalid value name '%" + key + "': use a number, or a letter or '_' then letters, digits, '_' or '.'");
  return {std::move(key), at, numbered};
}

ValueId Parser::use_value(size_t* at) {
  ValueRef ref = parse_value_ref();
  if (at) *at = ref.pos;
  auto it = defs_.find(ref.key);
  if (it == defs_.end()) {
    for (const Parser* p = parent_; p; p = p->parent_)
      if (p->defs_.count(ref.key))
        fail(ref.pos, "unknown value '%" + ref.key + "' in body @" + g_.name() +
                          ": a fused body sees only its own inputs (pass '%" + ref.key + "' as an operand)");
    fail(ref.pos, "unknown value '%" + ref.key + "'");
  }
  return it->second.value;
}

void Parser::check_new(const ValueRef& def) const {
  auto it = defs_.find(def.key);
  if (it != defs_.end())
    fail(def.pos, "duplicate value name '%" + def.key + "' (first defined at " + line_col(it->second.pos) + ")");
}

void Parser::parse_input() {
  skip_ws();
  size_t at = pos_;
  bool is_state = word() == "state";
  if (!is_state) pos_ = at;
  if (is_state && parent_) fail(at, "the inputs of a fused body cannot be state");
  ValueRef ref = parse_value_ref();
  if (ref.numbered) fail(ref.pos, "graph input '%" + ref.key + "' needs a name, not a number");
  check_new(ref);
  expect(':', "after input '%" + ref.key + "'");
  TensorType type = parse_type();
  ValueId v = g_.add_input(ref.key, std::move(type), is_state);
  defs_[ref.key] = Def{v, ref.pos};
}

TensorType Parser::parse_type() {
  skip_ws();
  size_t at = pos_;
  std::string_view name = word();
  if (name.empty()) fail_expected("a tensor type such as f32[2,3]");
  auto dtype = parse_dtype(name);
  if (!dtype) fail(at, "unknown dtype '" + std::string(name) + "' (expected f32, f64, i32, i64 or bool)");
  expect('[', "after the dtype");
  Shape shape;
  if (!consume(']')) {
    do {
      Token tok = scalar("a dimension");
      int64_t d = to_int(tok, "a shape");
      if (d < 0) fail(tok.pos, "dimension " + std::to_string(d) + " is negative");
      shape.push_back(d);
    } while (consume(','));
    expect(']', "after the dimensions");
  }
  TensorType type{*dtype, std::move(shape)};
  if (!bounded_num_elements(type.shape))
    fail(at, "type " + type.str() + " is too large (more than 2^40 elements)");
  return type;
}

Attr Parser::parse_attr(const AttrSpec& spec, Literal& literal) {
  skip_ws();
  size_t at = pos_;
  std::string what = "attribute '" + spec.name + "'";
  auto int_list = [&] {
    if (!consume('[')) fail_expected("'[' to start the list in " + what);
    std::vector<int64_t> v;
    if (consume(']')) return v;
    do v.push_back(to_int(scalar("an integer"), what));
    while (consume(','));
    expect(']', "to end the list in " + what);
    return v;
  };
  switch (spec.kind) {
    case AttrKind::Int: return to_int(scalar("an integer"), what);
    case AttrKind::Ints: return int_list();
    case AttrKind::Float: {
      // An integer stays one, so that complete_attrs can refuse what a double would round.
      Token tok = scalar("a number");
      int64_t i = 0;
      const char* last = tok.text.data() + tok.text.size();
      auto [end, ec] = std::from_chars(tok.text.data(), last, i);
      if (ec == std::errc() && end == last) return i;
      return to_float<double>(tok, what);
    }
    case AttrKind::Bool: {
      Token tok = scalar("true or false");
      if (tok.text != "true" && tok.text != "false")
        fail(at, "expected true or false in " + what + ", found '" + std::string(tok.text) + "'");
      return tok.text == "true";
    }
    case AttrKind::DType: {
      std::string_view tok = word();
      auto d = parse_dtype(tok);
      if (!d) {
        pos_ = at;
        fail_expected("a dtype (f32, f64, i32, i64 or bool) in " + what);
      }
      return *d;
    }
    case AttrKind::Tensor: {
      // Kept as text until the result type says what to build.
      literal.is_list = consume('[');
      if (literal.is_list && consume(']')) return Tensor();
      do literal.elements.push_back(scalar("a tensor element"));
      while (literal.is_list && consume(','));
      if (literal.is_list) expect(']', "to end the tensor in " + what);
      return Tensor();
    }
  }
  fail(at, "unsupported attribute kind");
}

void Parser::set_element(Tensor& t, int64_t i, const Token& e) const {
  std::string what = "a tensor of " + std::string(dtype_name(t.dtype()));
  switch (t.dtype()) {
    case DType::f32: t.data<float>()[i] = to_float<float>(e, what); return;
    case DType::f64: t.data<double>()[i] = to_float<double>(e, what); return;
    case DType::i32: {
      int64_t v = to_int(e, what);
      if (v < INT32_MIN || v > INT32_MAX) fail(e.pos, "integer " + std::string(e.text) + " is out of range for i32");
      t.data<int32_t>()[i] = static_cast<int32_t>(v);
      return;
    }
    case DType::i64: t.data<int64_t>()[i] = to_int(e, what); return;
    case DType::boolean:
      if (e.text != "true" && e.text != "false" && e.text != "0" && e.text != "1")
        fail(e.pos, "expected true or false for a bool tensor, found '" + std::string(e.text) + "'");
      t.data<uint8_t>()[i] = e.text == "true" || e.text == "1";
      return;
  }
}

Tensor Parser::build_tensor(const Literal& lit, const TensorType& type, size_t type_pos) {
  int64_t n = type.numel();
  if (lit.is_list && static_cast<int64_t>(lit.elements.size()) != n)
    fail(type_pos, "tensor literal has " + std::to_string(lit.elements.size()) + " elements but " +
                       type.str() + " needs " + std::to_string(n) + " (or a single element to splat)");
  if (!lit.is_list) {
    // A splat: one element, checked even when the shape is empty, and stored once.
    Tensor one(type.dtype, {});
    set_element(one, 0, lit.elements.at(0));
    return Tensor::splat(one, type.shape);
  }
  *constant_bytes_ += n * static_cast<int64_t>(dtype_size(type.dtype));
  if (*constant_bytes_ > kMaxConstantBytes)
    fail(type_pos, "the tensor literals of this file hold more than 1 GiB in all; pass large tensors "
                   "as graph inputs (.npy files) instead");
  Tensor t(type.dtype, type.shape);
  for (int64_t i = 0; i < n; ++i) set_element(t, i, lit.elements[i]);
  return t;
}

void Parser::parse_node() {
  // One result, or several for a fused node: %0, %h = fused(...).
  std::vector<ValueRef> results;
  std::unordered_map<std::string, size_t> listed;  // key -> position, for duplicates in the list
  do {
    ValueRef r = parse_value_ref();
    check_new(r);
    auto [it, added] = listed.emplace(r.key, r.pos);
    if (!added) fail(r.pos, "duplicate value name '%" + r.key + "' (first defined at " + line_col(it->second) + ")");
    results.push_back(std::move(r));
  } while (consume(','));
  expect('=', "after '%" + results.back().key + "'");
  skip_ws();
  size_t op_at = pos_;
  std::string_view op_text = word();
  if (op_text.empty()) fail_expected("an op name");
  std::optional<Op> op = parse_op(op_text);
  if (!op) fail(op_at, "unknown op '" + std::string(op_text) + "'");
  const OpInfo& info = op_info(*op);
  if (results.size() > 1 && !info.has(kRegion))
    fail(results[1].pos, std::string(info.spelling) + " has one result, not " + std::to_string(results.size()) +
                             " (only fused nodes have several)");

  expect('(', "after the op name");
  std::vector<ValueId> operands;
  std::vector<size_t> operand_at;
  if (!consume(')')) {
    do {
      operand_at.push_back(0);
      operands.push_back(use_value(&operand_at.back()));
    } while (consume(','));
    expect(')', "after operands");
  }

  AttrMap attrs;
  std::vector<std::pair<std::string, Literal>> literals;
  skip_ws();
  size_t brace_at = pos_;
  if (consume('{') && !consume('}')) {
    do {
      skip_ws();
      size_t name_at = pos_;
      std::string name(word());
      if (name.empty()) fail_expected("an attribute name");
      if (info.has(kRegion) && name == "graph")
        fail(brace_at, "the body of " + std::string(info.spelling) +
                           " comes after the result types: fused(OPERANDS) : TYPES { graph @NAME(...) { ... } }");
      const AttrSpec* spec = info.find_attr(name);
      if (!spec) {
        std::string known;
        for (const AttrSpec& s : info.attrs) known += (known.empty() ? "" : ", ") + s.name;
        fail(name_at, "unknown attribute '" + name + "' for " + std::string(info.spelling) + " (" +
                          (known.empty() ? "it takes none" : "it takes " + known) + ")");
      }
      if (attrs.count(name)) fail(name_at, "duplicate attribute '" + name + "'");
      expect('=', "after attribute '" + name + "'");
      Literal literal;
      attrs[name] = parse_attr(*spec, literal);
      if (spec->kind == AttrKind::Tensor) literals.emplace_back(name, std::move(literal));
    } while (consume(','));
    expect('}', "after attributes");
  }

  if (info.has(kRegion)) return parse_fused(results, op_at, std::move(operands), operand_at);

  const ValueRef& result = results[0];
  expect(':', "before the result type");
  skip_ws();
  size_t type_at = pos_;
  TensorType declared = parse_type();
  for (auto& [name, literal] : literals) attrs[name] = build_tensor(literal, declared, type_at);

  ValueId v;
  try {
    v = g_.add_node_at(*op, std::move(operands), std::move(attrs), result.numbered ? "" : result.key, "");
  } catch (const Error& e) {
    fail(op_at, e.what());
  }
  if (g_.type(v) != declared)
    fail(type_at, "declared " + declared.str() + " but " + std::string(info.spelling) + " gives " +
                      g_.type(v).str());
  // Only fused nodes have a body; say so rather than "expected a value definition".
  size_t after = pos_;
  skip_ws();
  if (peek() == '{') fail(pos_, std::string(info.spelling) + " has no body (only fused nodes have one)");
  pos_ = after;
  defs_[result.key] = Def{v, result.pos};
  parse_note(v);
}

// The rest of a fused node, after its operands: `: TYPES { graph @NAME(...) { ... } }`.
void Parser::parse_fused(const std::vector<ValueRef>& results, size_t op_at, std::vector<ValueId> operands,
                         const std::vector<size_t>& operand_at) {
  expect(':', "before the result types");
  std::vector<std::pair<TensorType, size_t>> declared;
  do {
    skip_ws();
    size_t at = pos_;
    declared.emplace_back(parse_type(), at);
  } while (consume(','));
  if (declared.size() > results.size())
    fail(declared[results.size()].second, "fused defines " + std::to_string(results.size()) +
                                              " result(s) but declares " + std::to_string(declared.size()) + " types");
  if (declared.size() < results.size())
    fail_expected("',' and the type of result " + std::to_string(declared.size()) + " (fused defines " +
                  std::to_string(results.size()) + " results)");
  skip_ws();
  size_t body_at = pos_;
  if (!consume('{')) fail_expected("'{' to start the body of fused");
  skip_ws();
  size_t graph_at = pos_;
  Graph body = parse_body();
  expect('}', "after the body of fused");

  const std::string body_name = "body @" + body.name();
  if (body.inputs().size() != operands.size())
    fail(graph_at, body_name + " takes " + std::to_string(body.inputs().size()) + " input(s) but fused has " +
                       std::to_string(operands.size()) + " operand(s)");
  for (size_t k = 0; k < operands.size(); ++k) {
    const Value& in = body.value(body.inputs()[k].value);
    if (in.type != g_.type(operands[k]))
      fail(operand_at[k], "operand " + std::to_string(k) + " is " + g_.type(operands[k]).str() + " but " +
                              body_name + " input %" + in.name + " is " + in.type.str());
  }
  const auto& outs = body.outputs();
  if (outs.size() != results.size())
    fail(body_at, "fused defines " + std::to_string(results.size()) + " result(s) but " + body_name + " returns " +
                      std::to_string(outs.size()) + " output(s)");
  for (size_t k = 0; k < outs.size(); ++k)
    if (body.type(outs[k].value) != declared[k].first)
      fail(declared[k].second, "declared " + declared[k].first.str() + " for result " + std::to_string(k) +
                                   " but " + body_name + " output '" + outs[k].name + "' is " +
                                   body.type(outs[k].value).str());

  std::vector<std::string> names;
  for (const ValueRef& r : results) names.push_back(r.numbered ? "" : r.key);
  std::vector<ValueId> vs;
  try {
    vs = g_.add_fused(std::move(operands), std::move(body), std::move(names));
  } catch (const Error& e) {
    fail(op_at, e.what());
  }
  for (size_t k = 0; k < results.size(); ++k) defs_[results[k].key] = Def{vs[k], results[k].pos};
  parse_note(vs[0]);
}

// A fused node's body: a whole graph in a namespace of its own, parsed by a child parser.
Graph Parser::parse_body() {
  if (depth_ + 1 > kMaxFusedNesting)
    fail(pos_, "fused bodies nest more than " + std::to_string(kMaxFusedNesting) + " deep");
  Parser sub(src_, file_, this);
  sub.pos_ = pos_;
  sub.parse_graph_def();
  pos_ = sub.pos_;
  return std::move(sub.g_);
}

// A comment on the same line as a node is its note.
void Parser::parse_note(ValueId v) {
  std::string note = read_note();
  if (!note.empty()) g_.set_note(v, std::move(note));
}

std::string Parser::read_note() {
  while (!at_end() && (peek() == ' ' || peek() == '\t')) ++pos_;
  if (src_.substr(pos_, 2) != "//") return "";
  size_t start = pos_ + 2;
  size_t end = src_.find('\n', start);
  if (end == std::string_view::npos) end = src_.size();
  pos_ = end;
  if (start < end && src_[start] == ' ') ++start;
  while (end > start && (src_[end - 1] == ' ' || src_[end - 1] == '\t' || src_[end - 1] == '\r')) --end;
  return std::string(src_.substr(start, end - start));
}

void Parser::parse_return() {
  skip_ws();
  if (peek() == '}') return;
  do {
    skip_ws();
    size_t name_at = pos_;
    std::string name(word());
    if (name.empty()) fail_expected("an output name");
    expect('=', "after output name '" + name + "'");
    ValueId v = use_value();
    try {
      g_.add_output(name, v);
    } catch (const Error& e) {
      fail(name_at, e.what());
    }
    if (std::string bad = update_error(g_, name, v); !bad.empty()) fail(name_at, bad);
  } while (consume(','));
}

}  // namespace

Graph parse(std::string_view text, std::string_view filename) {
  try {
    return Parser(text, filename).parse_graph();
  } catch (const std::bad_alloc&) {
    throw Error(std::string(filename) + ": error: out of memory while parsing");
  }
}

Graph parse_file(const std::string& path) {
  // Reading stops at the first NUL byte (a .kir file is text: /dev/zero or a binary is
  // not one) and beyond kMaxFileBytes, rather than filling memory first.
  constexpr size_t kMaxFileBytes = size_t{1} << 30;
  bool is_stdin = path == "-";
  std::string name = is_stdin ? "<stdin>" : path;
  std::FILE* f = is_stdin ? stdin : std::fopen(path.c_str(), "rb");
  if (!f) throw Error(path + ": cannot open: " + std::strerror(errno));
  std::string text, error;
  char buf[65536];
  size_t n;
  while (error.empty() && (n = std::fread(buf, 1, sizeof buf, f)) > 0) {
    if (const void* nul = std::memchr(buf, 0, n)) {
      text.append(buf, static_cast<size_t>(static_cast<const char*>(nul) - buf));
      error = name + ":" + line_col_in(text, text.size()) + ": error: a NUL byte: this is not a .kir text file";
    } else if (text.size() + n > kMaxFileBytes) {
      error = name + ": error: larger than 1 GiB, more than a .kir file may be";
    } else {
      text.append(buf, n);
    }
  }
  bool failed = error.empty() && std::ferror(f) != 0;
  int err = errno;
  if (!is_stdin) std::fclose(f);
  if (!error.empty()) throw Error(error);
  if (failed) throw Error(path + ": cannot read: " + std::strerror(err));
  return parse(text, name);
}

}  // namespace kiln
