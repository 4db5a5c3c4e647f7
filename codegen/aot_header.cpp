// The generated C header of an AOT object (codegen/aot.h aot_header, aot_name_error); its
// layout and identifier rules are documented in docs/aot.md.
#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>
#include <string_view>

#include "codegen/aot.h"
#include "codegen/aot_dtype.h"

#ifndef KILN_VERSION
#error "KILN_VERSION is set by codegen/CMakeLists.txt"
#endif

namespace kiln {
namespace {

// C (C23 included) and C++ keywords: none may name a model, and a prototype parameter that
// would be one gets a prefix.
constexpr std::string_view kKeywords[] = {
    "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break", "case", "catch",
    "char", "char8_t", "char16_t", "char32_t", "class", "co_await", "co_return", "co_yield", "compl", "concept",
    "const", "consteval", "constexpr", "constinit", "const_cast", "continue", "decltype", "default", "delete",
    "do", "double", "dynamic_cast", "else", "enum", "explicit", "export", "extern", "false", "float", "for",
    "friend", "goto", "if", "inline", "int", "long", "mutable", "namespace", "new", "noexcept", "not", "not_eq",
    "nullptr", "operator", "or", "or_eq", "private", "protected", "public", "register", "reinterpret_cast",
    "requires", "restrict", "return", "short", "signed", "sizeof", "static", "static_assert", "static_cast",
    "struct", "switch", "template", "this", "thread_local", "throw", "true", "try", "typedef", "typeid",
    "typename", "typeof", "typeof_unqual", "union", "unsigned", "using", "virtual", "void", "volatile",
    "wchar_t", "while", "xor", "xor_eq"};

bool is_keyword(std::string_view s) {
  return std::find(std::begin(kKeywords), std::end(kKeywords), s) != std::end(kKeywords);
}

// The types of <stddef.h> and <stdint.h>, which the header includes: a parameter so named
// would hide its type from the parameters after it (`const int32_t* int32_t, const
// int32_t* b` does not compile), so such parameters get a prefix too.
constexpr std::string_view kStandardTypes[] = {
    "size_t",        "ptrdiff_t",      "max_align_t",    "wchar_t",        "nullptr_t",      "int8_t",
    "int16_t",       "int32_t",        "int64_t",        "uint8_t",        "uint16_t",       "uint32_t",
    "uint64_t",      "int_least8_t",   "int_least16_t",  "int_least32_t",  "int_least64_t",  "uint_least8_t",
    "uint_least16_t", "uint_least32_t", "uint_least64_t", "int_fast8_t",    "int_fast16_t",   "int_fast32_t",
    "int_fast64_t",  "uint_fast8_t",   "uint_fast16_t",  "uint_fast32_t",  "uint_fast64_t",  "intptr_t",
    "uintptr_t",     "intmax_t",       "uintmax_t"};

bool is_standard_type(std::string_view s) {
  return std::find(std::begin(kStandardTypes), std::end(kStandardTypes), s) != std::end(kStandardTypes);
}

// The longest fixed part a NAME gets: NAME_WEIGHTS_EMBEDDED stays within the 63 significant
// characters C99 guarantees for a macro name.
constexpr size_t kMaxNameLength = 63 - std::string_view("_WEIGHTS_EMBEDDED").size();

bool is_ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// "fc1.weight" -> "FC1_WEIGHT": other characters than ASCII letters and digits become '_',
// runs of '_' one, and none leads or trails, so that no macro or parameter made from it
// holds a "__" (reserved in C++) or starts with "_" + upper case (reserved in C).
std::string identifier_stem(std::string_view name) {
  std::string s;
  for (char c : name) {
    char d = is_ident_char(c) && c != '_' ? c : '_';
    if (d == '_' && (s.empty() || s.back() == '_')) continue;
    s += d;
  }
  if (!s.empty() && s.back() == '_') s.pop_back();
  return upper(s.empty() ? "tensor" : s);
}

// One stem per name, unique: names whose stems are equal get "_<index>" (their position in
// `names`) appended, again until no two are equal (an appended stem may meet another name's).
std::vector<std::string> unique_stems(const std::vector<std::string>& names) {
  std::vector<std::string> stems;
  for (const std::string& n : names) stems.push_back(identifier_stem(n));
  for (bool changed = true; changed;) {
    changed = false;
    std::map<std::string, int> count;
    for (const std::string& s : stems) ++count[s];
    for (size_t i = 0; i < stems.size(); ++i) {
      if (count[stems[i]] < 2) continue;
      stems[i] += "_" + std::to_string(i);
      changed = true;
    }
  }
  return stems;
}

// A C string literal of `s`: quotes, backslashes and anything but printable ASCII escaped
// (octal, always three digits, so that a following digit is not taken into the escape).
std::string c_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') out += std::string("\\") + c;
    else if (u >= 0x20 && u < 0x7f && c != '?') out += c;  // '?': no trigraphs
    else out += fmt::format("\\{:03o}", u);
  }
  return out + "\"";
}

// Text for one line inside a /* */ comment.
std::string comment_text(std::string s) {
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  for (size_t at; (at = s.find("*/")) != std::string::npos;) s.replace(at, 2, "* /");
  return s;
}

const char* c_type(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::i32: return "int32_t";
    case DType::i64: return "int64_t";
    case DType::boolean: return "uint8_t";
  }
  return "void";
}

struct Entry {
  std::string name;
  TensorType type;
  std::string stem;   // upper case, unique in its kind
  std::string param;  // the prototype's parameter (inputs and outputs)
};

// A kind's entries; `out` says whether they are outputs (parameters "out_...").
std::vector<Entry> entries(const std::vector<std::pair<std::string, TensorType>>& tensors, bool out) {
  std::vector<std::string> names;
  for (const auto& t : tensors) names.push_back(t.first);
  std::vector<std::string> stems = unique_stems(names);
  std::vector<Entry> result;
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::string p = lower(stems[i]);
    // Inputs keep their name unless it cannot be a parameter (a keyword, a type of the
    // headers included) or could meet an output's or a prefixed input's: then "in_" (the
    // stems are unique, so the prefixed ones are too).
    bool plain = !std::isdigit(static_cast<unsigned char>(p[0])) && !is_keyword(p) && !is_standard_type(p) &&
                 p != "inst" &&
                 p.rfind("in_", 0) != 0 && p.rfind("out_", 0) != 0;
    p = out ? "out_" + p : plain ? p : "in_" + p;
    result.push_back({tensors[i].first, tensors[i].second, stems[i], p});
  }
  return result;
}

std::string shape_initializer(const Shape& shape) {
  std::string s;
  for (int64_t d : shape) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return "{" + s + "}";
}

void tensor_macros(std::string& h, const std::string& prefix, const Entry& e) {
  const std::string m = prefix + e.stem;
  const TensorType& t = e.type;
  h += fmt::format("#define {}_NAME {}\n", m, c_string(e.name));
  h += fmt::format("#define {}_DTYPE {} /* {}: {} */\n", m, aot_dtype(t.dtype), dtype_name(t.dtype), c_type(t.dtype));
  h += fmt::format("#define {}_RANK {}\n", m, t.rank());
  // C has no empty initializer (before C23) nor zero-length arrays: a scalar's is {1}, which
  // keeps `int64_t shape[] = ..._SHAPE;` valid and its product the element count.
  h += fmt::format("#define {}_SHAPE {}{}\n", m, t.rank() == 0 ? "{1}" : shape_initializer(t.shape),
                   t.rank() == 0 ? " /* rank 0: no dimensions */" : "");
  h += fmt::format("#define {}_ELEMENTS {}\n", m, t.numel());
  h += fmt::format("#define {}_BYTES {}\n", m, t.numel() * static_cast<int64_t>(dtype_size(t.dtype)));
}

std::vector<std::pair<std::string, TensorType>> input_list(const Graph& g, const std::vector<size_t>& which) {
  std::vector<std::pair<std::string, TensorType>> out;
  for (size_t i : which) {
    ValueId v = g.inputs()[i].value;
    out.emplace_back(g.value(v).name, g.type(v));
  }
  return out;
}

}  // namespace

std::string aot_name_error(const std::string& name) {
  if (name.empty()) return "the name is empty";
  if (std::isdigit(static_cast<unsigned char>(name[0])) || !std::all_of(name.begin(), name.end(), is_ident_char))
    return fmt::format("'{}' is not a C identifier (ASCII letters, digits and '_', not starting with a digit)",
                       name);
  if (is_keyword(name)) return fmt::format("'{}' is a C or C++ keyword", name);
  if (name[0] == '_')
    return fmt::format("'{}' starts with '_': its macros ({}_...) would be reserved identifiers", name,
                       upper(name));
  if (name.find("__") != std::string::npos)
    return fmt::format("'{}' contains '__': C++ reserves such identifiers", name);
  if (name.back() == '_')
    return fmt::format("'{}' ends with '_': its functions ({}_create) would contain '__', which C++ reserves",
                       name, name);
  if (name.size() > kMaxNameLength)
    return fmt::format("'{}' is {} characters long; at most {}, so that every macro it prefixes stays within "
                       "the 63 characters C guarantees",
                       name, name.size(), kMaxNameLength);
  return "";
}

std::string aot_header(const Graph& g, const std::string& name, const std::string& target, int64_t arena_bytes,
                       WeightsMode weights) {
  if (std::string err = aot_name_error(name); !err.empty()) throw Error("model name " + err);
  const Signature sig = signature(g);
  const bool step = updates_state(sig);
  const bool embedded = weights == WeightsMode::Embed;
  std::vector<std::pair<std::string, TensorType>> outs;
  for (size_t i : sig.outputs) outs.emplace_back(g.outputs()[i].name, g.type(g.outputs()[i].value));
  const std::vector<Entry> inputs = entries(input_list(g, sig.inputs), false);
  const std::vector<Entry> outputs = entries(outs, true);
  const std::vector<Entry> state = entries(input_list(g, sig.state), false);
  const std::string M = upper(name), inst = name + "_instance", fn = name + (step ? "_step" : "_run");

  std::string args;  // the run/step parameters after inst
  std::string call;  // the same names, for the usage comment
  for (const Entry& e : inputs) {
    args += fmt::format(", const {}* {}", c_type(e.type.dtype), e.param);
    call += ", " + e.param;
  }
  for (const Entry& e : outputs) {
    args += fmt::format(", {}* {}", c_type(e.type.dtype), e.param);
    call += ", " + e.param;
  }

  std::string h;
  h += fmt::format("/* The C interface of model {}, compiled by kiln {} from graph @{}.\n", name, KILN_VERSION,
                   comment_text(g.name()));
  h += " * Generated by `kiln compile`: do not edit. docs/aot.md describes this interface.\n";
  h += fmt::format(" * Target: {}\n", comment_text(target));
  h += " * Link the object with libkiln_runtime.a and OpenBLAS (-lopenblas -lpthread -lm).\n *\n";
  h += " * Usage:\n";
  h += fmt::format(" *   {}* m = {}_create();   (NULL on failure: {}_error(NULL) says why)\n", inst, name, name);
  if (embedded)
    h += fmt::format(" *   {}_load_weights(m, path);   (optional: the weights are embedded; this replaces them)\n",
                     name);
  else
    h += fmt::format(" *   {}_load_weights(m, path);   (required: the state starts at zero, the weights are "
                     "in a file)\n",
                     name);
  h += fmt::format(" *   if ({}(m{}) != 0)   ({})\n", fn, call,
                   step ? "one training step: updates the state in place" : "inference");
  h += fmt::format(" *     fprintf(stderr, \"%s\\n\", {}_error(m));\n", name);
  h += fmt::format(" *   {}_save_weights(m, path);   (every state tensor, in the weights file format)\n", name);
  h += fmt::format(" *   {}_destroy(m);\n", name);
  h += fmt::format(" * Inputs are read and outputs written as dense row-major (C order) arrays of the types and\n"
                   " * sizes below ({0}_INPUT_* and {0}_OUTPUT_*), naturally aligned; they may not overlap\n"
                   " * each other or the instance. {1}_get_state / {1}_set_state copy one state tensor by\n"
                   " * name, exactly its {0}_STATE_*_BYTES.\n *\n",
                   M, name);
  h += fmt::format(" * Errors: the int functions return 0 on success and -1 on failure; {}_error(inst) is then\n"
                   " * a one-line message, valid until the next call on inst. After a failed run or step the\n"
                   " * outputs and the state are invalid; a failed load_weights leaves the state unchanged.\n *\n",
                   name);
  h += " * Threads: separate instances may be used at the same time from separate threads; one\n"
       " * instance is used by one thread at a time (its calls must not overlap). The functions are\n"
       " * reentrant on separate instances: nothing is shared but the runtime's one thread pool\n"
       " * (KILN_NUM_THREADS threads, default: every core) and the per-thread message of a failed\n"
       " * create.\n */\n";
  // The name as it is (not upper case, as the macros): models mlp and MLP have distinct
  // guards, so one program can include both headers.
  const std::string guard = "KILN_MODEL_" + name + "_H";
  h += fmt::format("#ifndef {0}\n#define {0}\n\n#include <stddef.h>\n#include <stdint.h>\n\n", guard);
  h += "#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n";

  h += fmt::format("#define {}_TARGET {}\n", M, c_string(target));
  h += fmt::format("#define {}_ARENA_BYTES {}\n", M, arena_bytes);
  h += fmt::format("#define {}_NUM_INPUTS {}\n", M, inputs.size());
  h += fmt::format("#define {}_NUM_OUTPUTS {}\n", M, outputs.size());
  h += fmt::format("#define {}_NUM_STATE {}\n", M, state.size());
  h += fmt::format("#define {}_WEIGHTS_EMBEDDED {}\n", M, embedded ? 1 : 0);
  h += "\n/* Per tensor: _NAME, _DTYPE (0 f32, 1 f64, 2 i32, 3 i64, 4 bool as uint8_t), _RANK, _SHAPE,\n"
       " * _ELEMENTS, _BYTES. */\n";
  h += fmt::format("/* Inputs, in the order of {}'s parameters. */\n", fn);
  for (const Entry& e : inputs) tensor_macros(h, M + "_INPUT_", e);
  h += "/* Outputs, in the same order after the inputs. */\n";
  for (const Entry& e : outputs) tensor_macros(h, M + "_OUTPUT_", e);
  h += fmt::format("/* State, held by the instance{}. */\n", step ? " and updated by each step" : "");
  for (const Entry& e : state) tensor_macros(h, M + "_STATE_", e);

  h += fmt::format("\ntypedef struct {0} {0};\n\n", inst);
  h += fmt::format("{0}* {1}_create(void); /* NULL on failure: {1}_error(NULL) says why */\n", inst, name);
  h += fmt::format("void {1}_destroy({0}* inst); /* NULL: nothing to do */\n", inst, name);
  h += step ? "/* One training step: reads the inputs, writes the outputs, updates the state in place. */\n"
            : "/* Inference: reads the inputs, writes the outputs. */\n";
  h += fmt::format("int {}({}* inst{});\n", fn, inst, args);
  h += fmt::format("int {1}_get_state(const {0}* inst, const char* name, void* dst, size_t bytes);\n", inst, name);
  h += fmt::format("int {1}_set_state({0}* inst, const char* name, const void* src, size_t bytes);\n", inst, name);
  h += fmt::format("int {1}_load_weights({0}* inst, const char* path);\n", inst, name);
  h += fmt::format("int {1}_save_weights(const {0}* inst, const char* path);\n", inst, name);
  h += fmt::format("const char* {1}_error(const {0}* inst);\n", inst, name);
  h += fmt::format("\n#ifdef __cplusplus\n}}\n#endif\n\n#endif /* {} */\n", guard);
  return h;
}

}  // namespace kiln
