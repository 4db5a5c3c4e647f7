// Holds the C declarations in runtime/*.h to the ABI table (runtime/abi.def) at compile
// time: generated code declares each function with the table's types, so a declaration
// that drifts from its line would be called with the wrong arguments.
#include <type_traits>

#include "runtime/abi.h"

namespace {

using namespace kiln::rt::abi;

// How a C type is passed in the table's vocabulary: any pointer as ptr, the rest as itself.
template <typename T>
using AbiType = std::conditional_t<std::is_pointer_v<T>, ptr, T>;

template <typename F>
struct AbiOf;
template <typename R, typename... A>
struct AbiOf<R(A...)> {
  using type = AbiType<R>(AbiType<A>...);
};

#define KILN_RT(name, ret, ...)                                                 \
  static_assert(std::is_same_v<AbiOf<decltype(name)>::type, ret(__VA_ARGS__)>, \
                #name " is declared with other types than its line in runtime/abi.def");
#include "runtime/abi.def"
#undef KILN_RT

}  // namespace
