// The op enum and per-op facts, generated from ir/ops.def.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ir/attrs.h"

namespace kiln {

enum class Op : uint16_t {
#define KILN_OP(Enum, spelling, min_arity, max_arity, traits, schema) Enum,
#include "ir/ops.def"
#undef KILN_OP
};

inline constexpr int kNumOps = 0
#define KILN_OP(Enum, spelling, min_arity, max_arity, traits, schema) +1
#include "ir/ops.def"
#undef KILN_OP
    ;

enum OpTrait : uint32_t {
  kElementwise = 1u << 0,
  kUnary = 1u << 1,
  kBinary = 1u << 2,
  kCommutative = 1u << 3,
  kCompare = 1u << 4,
  kReduction = 1u << 5,
  kShape = 1u << 6,
  kFloatOnly = 1u << 7,          // operands must be f32 or f64
  kNonDifferentiable = 1u << 8,  // gradients stop here
  kBackwardOnly = 1u << 9,       // emitted by autodiff; has no gradient rule itself
  kRegion = 1u << 10,            // has a body (Node::body); results come from it
  // Communicates with the other processes of a data-parallel run (docs/distributed.md):
  // never folded (its value depends on the other ranks), always a kernel of its own.
  kCollective = 1u << 11,
};

struct AttrSpec {
  std::string name;
  AttrKind kind;
  std::optional<Attr> default_value;  // absent: required
};

struct OpInfo {
  Op op;
  std::string_view spelling;
  int min_arity;
  int max_arity;  // -1: variadic
  uint32_t traits;
  std::vector<AttrSpec> attrs;  // in canonical (printing) order

  bool has(OpTrait t) const { return (traits & t) != 0; }
  const AttrSpec* find_attr(std::string_view name) const;
};

const OpInfo& op_info(Op op);
std::string_view op_name(Op op);
std::optional<Op> parse_op(std::string_view spelling);
const std::vector<Op>& all_ops();

}  // namespace kiln
