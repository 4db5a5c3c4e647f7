#include "ir/strides.h"

#include <string>

#include "ir/attrs.h"
#include "ir/error.h"
#include "ir/ops.h"

namespace kiln {

StridedView source_view(const Node& n, const Shape& in, const Shape& out) {
  if (n.op == Op::BroadcastTo) return {broadcast_strides(in, out), 0};
  std::vector<int64_t> s = strides_of(in);
  if (n.op == Op::Transpose) {
    const auto& perm = attr_ints(n.attrs, "perm");
    std::vector<int64_t> src(perm.size());
    for (size_t d = 0; d < perm.size(); ++d) src[d] = s[static_cast<size_t>(perm[d])];
    return {src, 0};
  }
  if (n.op == Op::Slice) {
    const auto& start = attr_ints(n.attrs, "start");
    const auto& step = attr_ints(n.attrs, "step");
    StridedView v{std::vector<int64_t>(s.size()), 0};
    for (size_t d = 0; d < s.size(); ++d) {
      v.base += start[d] * s[d];
      v.strides[d] = step[d] * s[d];
    }
    return v;
  }
  internal_error("source_view", std::string(op_name(n.op)) + " does not read its operand as a strided view");
}

MergedDims merge_dims(const Shape& shape, const std::vector<StridedView>& views) {
  MergedDims m;
  m.strides.resize(views.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !m.dims.empty();
    for (size_t k = 0; k < views.size() && merge; ++k) merge = m.strides[k].back() == views[k].strides[d] * shape[d];
    if (merge) {
      m.dims.back() *= shape[d];
      for (size_t k = 0; k < views.size(); ++k) m.strides[k].back() = views[k].strides[d];
    } else {
      m.dims.push_back(shape[d]);
      for (size_t k = 0; k < views.size(); ++k) m.strides[k].push_back(views[k].strides[d]);
    }
  }
  return m;
}

}  // namespace kiln
