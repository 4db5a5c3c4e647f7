// Prepared graph -> CUDA C: one NVRTC program per graph plus the list of launches that
// runs it. The renderer is a mapping from ops to C expressions (tinygrad-style) and one
// kernel per planned kernel (passes/kernel_plan.h): a loop kernel is one elementwise
// kernel with broadcasting by strides, a fused region renders its body's kernels, a
// reduction is a block-level tree reduction (shared memory + warp shuffles), matmul is a
// cuBLAS call (GemmLaunch) followed by its epilogue loop.
//
// Kernel ABI (the same for NVRTC and the CPU emulation, codegen/cuda/emu):
//   extern "C" __global__ void kiln_kN(unsigned char* __restrict__ arena,
//                                      void* const* __restrict__ bufs)
// `arena` is the device arena (the memory plan's arena, then the scratch area at
// `scratch_offset`: the kernel plan's scratch, then the renderer's own, which kernels of
// different nodes share as they run one after another: conv2d_grad_weight's partial
// sums); bufs[i] is graph input i's device pointer (state included, in
// Graph::inputs() order) and bufs[inputs + j] is constant j's device copy. Every offset
// and shape is a literal in the source: nothing else is passed. No dynamic shared memory;
// blocks are at most 1024 threads; kernels call only the prelude's helpers and CUDA's math
// functions.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "codegen/backend.h"
#include "ir/tensor.h"

namespace kiln::cuda {

// A device address: arena + offset, or bufs[index] + offset.
struct Ref {
  enum class Base : uint8_t { Arena, Buffer } base = Base::Arena;
  int32_t index = -1;  // Buffer
  int64_t offset = 0;  // bytes
};

// One cuBLAS strided-batched GEMM, row-major in Kiln's terms: C[b] = op(A[b]) x op(B[b]),
// C is m x n, op(A) m x k, op(B) k x n; a batch stride of 0 broadcasts an operand.
struct GemmLaunch {
  DType dtype = DType::f32;  // f32 or f64
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0, batch = 1;
  int64_t lda = 0, ldb = 0, ldc = 0;  // row-major leading dimensions
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements
  Ref a, b, c;
};

struct KernelLaunch {
  std::string name;  // kiln_kN
  std::array<int64_t, 3> grid{1, 1, 1}, block{1, 1, 1};
};

// all_reduce, in place at `data`: staged through host memory, where the installed
// collective (runtime/collective.h) sums it over the ranks, and copied back. A GPU-direct
// collective (NCCL) would take the device pointer instead; the launch carries all it needs.
struct CollectiveLaunch {
  DType dtype = DType::f32;
  int64_t count = 0;  // elements
  Ref data;
};

struct Launch {
  enum class Kind : uint8_t { Kernel, Gemm, Copy, AllReduce } kind = Kind::Kernel;
  KernelLaunch kernel;
  GemmLaunch gemm;
  CollectiveLaunch collective;
  Ref copy_dst, copy_src;  // Copy (device to device)
  int64_t copy_bytes = 0;
  int32_t node = -1;  // the top-level node it belongs to (profiles)
};

struct Rendered {
  std::string source;             // the whole NVRTC program (prelude + kernels)
  std::vector<Launch> launches;   // in order
  std::vector<Tensor> constants;  // bufs[inputs + j] holds constants[j] (materialized)
  std::vector<int32_t> constant_index;  // by top-level ValueId: index into constants, or -1
  int64_t arena_bytes = 0;        // the memory plan's arena
  int64_t scratch_offset = 0;     // where scratch starts in the arena (64-aligned)
  int64_t scratch_bytes = 0;
  int64_t total_bytes() const { return scratch_offset + scratch_bytes; }
};

struct RenderOptions {
  int block_size = 256;  // threads per block of elementwise kernels
};

// Throws kiln::Error for an op it cannot render (naming it); never for a valid graph.
Rendered render(const Prepared& p, const RenderOptions& options = {});

}  // namespace kiln::cuda
