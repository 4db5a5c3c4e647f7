/* The AOT runtime: what an object written by `kiln compile` (codegen/aot.h) calls, and the
 * weights file format. Plain C (C99 and C++), part of libkiln_runtime.a, which depends on
 * nothing of Kiln's but OpenBLAS, libm and pthreads. Users do not call these functions:
 * the object's own NAME_* functions (declared in its generated header, docs/aot.md) do.
 *
 * A compiled model is described by one read-only KilnAotModel in the object (the entry
 * function, the arena size, every input / output / state tensor with its place in memory,
 * the embedded weights); the runtime does the rest generically: the instance's memory, the
 * positional calls, the state updates, the weights file. Every function returns 0 on
 * success and -1 on failure, with a one-line message for kiln_aot_error(). Separate
 * instances may be used from separate threads at the same time; one instance is used by
 * one thread at a time.
 */
#ifndef KILN_RUNTIME_AOT_H
#define KILN_RUNTIME_AOT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever KilnAotModel or a function below changes. An object references the
 * symbol kiln_aot_abi_v<N> of its version, so linking it against a runtime of another
 * version fails at link time, not at run time. */
#define KILN_AOT_ABI_VERSION 2
extern const int kiln_aot_abi_v2;

/* Element types: the numbering of the generated headers' NAME_*_DTYPE constants. */
enum {
  KILN_DTYPE_F32 = 0,
  KILN_DTYPE_F64 = 1,
  KILN_DTYPE_I32 = 2,
  KILN_DTYPE_I64 = 3,
  KILN_DTYPE_BOOL = 4 /* one byte, 0 or 1 */
};

typedef struct KilnAotTensor {
  const char* name;
  int32_t dtype; /* KILN_DTYPE_* */
  int32_t rank;
  const int64_t* shape; /* rank entries (NULL when rank is 0) */
  int64_t bytes;        /* elements x element size */
} KilnAotTensor;

/* Where a value is after the entry function ran. */
enum {
  KILN_AOT_NONE = 0,     /* state update only: none, or written in place by the code */
  KILN_AOT_ARENA = 1,    /* arena + offset */
  KILN_AOT_BUFFER = 2,   /* buffers[buffer]: an input or state buffer, unchanged */
  KILN_AOT_CONSTANT = 3  /* data (read-only, in the object) */
};
typedef struct KilnAotSource {
  int32_t kind; /* KILN_AOT_* */
  int32_t buffer;
  int64_t offset;
  const void* data;
} KilnAotSource;

/* buffers[i] = graph input i of the compiled graph (inputs and state, in graph order);
 * arena: arena_bytes, 64-byte aligned, zero-filled when allocated. */
typedef void (*KilnAotEntry)(void** buffers, uint8_t* arena);

typedef struct KilnAotModel {
  uint32_t abi_version; /* KILN_AOT_ABI_VERSION */
  const char* name;     /* the NAME of NAME_create */
  const char* target;   /* "x86_64-unknown-linux-gnu cpu=haswell features=+avx2,..." */
  KilnAotEntry entry;
  int64_t arena_bytes; /* arena + scratch; at least 1 */
  int32_t n_buffers;   /* graph inputs, state included */

  /* The caller's inputs (the non-state graph inputs, in graph order) and where each goes. */
  int32_t n_inputs;
  const KilnAotTensor* inputs;
  const int32_t* input_buffer;

  /* The returned outputs (every output but the state updates, in graph order). */
  int32_t n_outputs;
  const KilnAotTensor* outputs;
  const KilnAotSource* output_source;

  /* State (parameters, optimizer buffers): held by the instance, in graph order. */
  int32_t n_state;
  const KilnAotTensor* state;
  const int32_t* state_buffer;
  const KilnAotSource* state_update; /* X.next's place after a call; NONE: nothing to copy */

  /* Initial state: state[i] at weights + weights_offset[i] (64-byte aligned offsets), or
   * weights == NULL when the model was compiled with --weights file (state starts at zero
   * until NAME_load_weights / NAME_set_state). */
  const uint8_t* weights;
  const int64_t* weights_offset;

  /* The CPU features the code may use (x86: bit i = the feature of runtime/cpu_features.def
   * with BIT i, e.g. avx2, avx512f), as the target machine it was compiled for enables them;
   * kiln_aot_create refuses to run it on a CPU that lacks one. 0 on other architectures. */
  uint64_t cpu_features;
} KilnAotModel;

typedef struct KilnAotInstance KilnAotInstance;

/* A new instance: its arena, its state (the embedded weights copied in, or zeros). NULL on
 * failure (out of memory, a model of another ABI version, a CPU without a feature the code
 * was compiled for, named in the message): kiln_aot_error(NULL) says why, on this thread.
 * For tests: the environment variable KILN_AOT_HIDE_CPU_FEATURES, a comma-separated list of
 * feature names (avx512f,avx2,...), makes the check treat them as missing on this CPU. */
KilnAotInstance* kiln_aot_create(const KilnAotModel* model);
void kiln_aot_destroy(KilnAotInstance* inst); /* NULL is a no-op */

/* One call: inputs[i] points at model->inputs[i] (bytes as described, dense, row-major,
 * naturally aligned), outputs[i] receives model->outputs[i]. Then every state update is
 * applied (state X takes X.next's value). Inputs and outputs may not overlap each other
 * or the instance. -1 when the code reported a failure (the message names it); the
 * outputs and the state are then invalid. */
int kiln_aot_call(KilnAotInstance* inst, const void* const* inputs, void* const* outputs);

/* State by name: exactly `bytes` bytes (the tensor's size), else -1 naming both sizes. */
int kiln_aot_get_state(const KilnAotInstance* inst, const char* name, void* dst, size_t bytes);
int kiln_aot_set_state(KilnAotInstance* inst, const char* name, const void* src, size_t bytes);

/* The weights file (below): load every state tensor of the model from it, matched by name
 * with its dtype and shape checked (the file may hold more, e.g. optimizer state an
 * inference model lacks); save every state tensor. On a failed load the state is
 * unchanged. */
int kiln_aot_load_weights(KilnAotInstance* inst, const char* path);
int kiln_aot_save_weights(const KilnAotInstance* inst, const char* path);

/* The message of the instance's last failure ("" if none); with NULL, the last failure on
 * this thread of a call without an instance (a failed kiln_aot_create, or a call given a
 * NULL instance). Valid until the next call on the instance. */
const char* kiln_aot_error(const KilnAotInstance* inst);

/* The weights file is safetensors (https://github.com/huggingface/safetensors): an 8-byte
 * little-endian header length N, N bytes of flat JSON
 *   {"__metadata__": {"kiln.format": "kiln-state-1", "kiln.crc32.NAME": "<8 hex digits>", ...,
 *                     "kiln.crc32.__metadata__": "<8 hex digits>"},
 *    "NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]}, ...}
 * padded with spaces to a multiple of 8, then the tensors' data, little-endian, C order,
 * tiling the data section exactly. dtypes F32, F64, I32, I64, BOOL. The metadata holds the
 * CRC-32 (IEEE 802.3, as zlib's crc32) of each tensor's data and of the metadata's other
 * entries ("key\0value\0" in key order), as Kiln's training checkpoints do: a checkpoint is a
 * weights file, and Python's `safetensors` or PyTorch read both. Reading checks the
 * checksums a file carries (one with kiln.format must carry them all). The KILNWTS1 files of
 * earlier versions are still read, with a deprecation line on stderr.
 * Written to a temporary name in the same folder and renamed, so a failure leaves no
 * partial file (a device such as /dev/null is written in place). Shared by AOT objects and
 * the compiler (codegen/aot.h save_weights). */
int kiln_weights_write(const char* path, int32_t n, const KilnAotTensor* tensors, const void* const* data,
                       char* err, size_t err_size);
/* Reads the whole file (a regular file; its header at most 100 MB), checks its header, sizes,
 * layout and checksums, then calls visit for each tensor in the header's order; a non-zero
 * return from visit stops with that value. The data of a file Kiln wrote is naturally
 * aligned; another writer's may not be (copy it with memcpy). */
typedef int (*KilnWeightsVisit)(void* ctx, const KilnAotTensor* tensor, const void* data);
int kiln_weights_visit(const char* path, KilnWeightsVisit visit, void* ctx, char* err, size_t err_size);

#ifdef __cplusplus
}
#endif

#endif /* KILN_RUNTIME_AOT_H */
