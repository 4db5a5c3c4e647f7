// The AOT runtime's instances (runtime/aot.h): what an object's NAME_create / NAME_run /
// NAME_step / state / weights functions do, generically over its KilnAotModel descriptor.
// The weights file itself is runtime/weights_file.cpp.
//
// Every extern "C" function here is called from C: no exception may leave it. Allocation
// happens only in kiln_aot_create and kiln_aot_load_weights, inside try blocks; a call
// (kiln_aot_call) allocates nothing, so it cannot fail for memory once created. Messages
// go to a fixed buffer in the instance, or, where there is no instance (a failed create,
// a NULL instance argument), to a thread-local one that kiln_aot_error(NULL) returns.
#include <sys/mman.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "runtime/aot.h"
#include "runtime/aot_internal.h"
#include "runtime/kernels.h"

extern "C" const int kiln_aot_abi_v2 = KILN_AOT_ABI_VERSION;

namespace kiln::rt::aot {

int64_t dtype_size(int32_t dtype) {
  switch (dtype) {
    case KILN_DTYPE_F32: return 4;
    case KILN_DTYPE_F64: return 8;
    case KILN_DTYPE_I32: return 4;
    case KILN_DTYPE_I64: return 8;
    case KILN_DTYPE_BOOL: return 1;
    default: return 0;  // an int from a file or a descriptor: any value can arrive
  }
}

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case KILN_DTYPE_F32: return "f32";
    case KILN_DTYPE_F64: return "f64";
    case KILN_DTYPE_I32: return "i32";
    case KILN_DTYPE_I64: return "i64";
    case KILN_DTYPE_BOOL: return "bool";
    default: return "?";
  }
}

const char* tensor_error(const KilnAotTensor& t) {
  if (!t.name) return "no name";
  int64_t size = dtype_size(t.dtype);
  if (size == 0) return "unknown dtype";
  if (t.rank < 0 || t.rank > kMaxRank) return "rank out of range";
  if (t.rank > 0 && !t.shape) return "no shape";
  // The product of the nonzero dimensions must fit even when a zero makes the tensor empty:
  // the safetensors reader refuses such a shape too, so what one format accepts the other
  // writes back and reads.
  int64_t bytes = size;
  bool empty = false;
  for (int32_t d = 0; d < t.rank; ++d) {
    if (t.shape[d] < 0) return "negative dimension";
    empty = empty || t.shape[d] == 0;
    if (t.shape[d] != 0 && __builtin_mul_overflow(bytes, t.shape[d], &bytes)) return "size overflows 64 bits";
  }
  if (t.bytes != (empty ? 0 : bytes)) return "byte size does not match the shape";
  return nullptr;
}

void vformat(char* buf, size_t size, const char* fmt, va_list args) {
  if (buf && size) std::vsnprintf(buf, size, fmt, args);
}

void format(char* buf, size_t size, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vformat(buf, size, fmt, args);
  va_end(args);
}

void format_type(char* buf, size_t size, const KilnAotTensor& t) {
  if (!buf || size == 0) return;
  size_t used = 0;
  auto put = [&](const char* fmt, auto v) {
    if (used + 1 >= size) return;
    int n = std::snprintf(buf + used, size - used, fmt, v);
    if (n > 0) used += static_cast<size_t>(n) < size - used ? static_cast<size_t>(n) : size - used - 1;
  };
  buf[0] = '\0';
  put("%s[", dtype_name(t.dtype));
  for (int32_t d = 0; d < t.rank && d <= kMaxRank && t.shape; ++d) put(d ? ",%lld" : "%lld", static_cast<long long>(t.shape[d]));
  put("%s", "]");
}

}  // namespace kiln::rt::aot

using namespace kiln::rt::aot;

namespace {

constexpr size_t kMessageBytes = 1024;
constexpr int64_t kAlign = 64;

// The last failure of a call that had no instance to hold its message.
thread_local char t_error[kMessageBytes] = "";

int64_t align_up(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// State storage: one 64-byte aligned block (std::aligned_alloc), freed with free().
struct FreeBytes {
  void operator()(uint8_t* p) const { std::free(p); }
};
using Bytes = std::unique_ptr<uint8_t[], FreeBytes>;

Bytes aligned_bytes(int64_t n) {
  // At least one block: aligned_alloc(64, 0) may return NULL, which means "no memory" here.
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(kAlign, static_cast<size_t>(n > 0 ? n : kAlign)));
  if (!p) throw std::bad_alloc();
  return Bytes(p);
}

const char* model_name(const KilnAotModel& m) { return m.name ? m.name : "?"; }

}  // namespace

struct KilnAotInstance {
  const KilnAotModel* model = nullptr;
  uint8_t* arena = nullptr;  // mmap'ed: page aligned and zero-filled by the kernel
  Bytes state;               // every state tensor, each at state_offset[i]
  Bytes staging;             // room for the updates that read another state buffer
  std::vector<int64_t> state_offset;
  std::vector<int64_t> stage_offset;  // per state: its offset in `staging`, or -1
  std::vector<void*> buffers;         // what the entry gets: inputs (per call) and state
  std::vector<void*> state_data;      // state i's bytes (buffers[state_buffer[i]])
  int64_t state_bytes = 0;
  // const functions (get_state, save_weights) report failures too.
  mutable char error[kMessageBytes] = "";

  KilnAotInstance() = default;
  KilnAotInstance(const KilnAotInstance&) = delete;
  KilnAotInstance& operator=(const KilnAotInstance&) = delete;
  ~KilnAotInstance() {
    if (arena) munmap(arena, static_cast<size_t>(model->arena_bytes));
  }

  int fail(const char* fmt, ...) const __attribute__((format(printf, 2, 3))) {
    va_list args;
    va_start(args, fmt);
    vformat(error, sizeof error, fmt, args);
    va_end(args);
    return -1;
  }
  // Points state i's buffer at its place in `state` (after create, and after a load swaps
  // the storage).
  void point_state() {
    for (int32_t i = 0; i < model->n_state; ++i) {
      state_data[i] = state.get() + state_offset[i];
      buffers[model->state_buffer[i]] = state_data[i];
    }
  }
  // Index of the state named `name`, or -1 with a message listing the state's names.
  int32_t find_state(const char* name) const;
  // For kiln_aot_get_state / set_state (`verb` "get" or "set"): the index of state `name`
  // if `data` (the `role`) may be copied to or from it with `bytes` bytes, else -1.
  int32_t checked_state(const char* verb, const char* name, const void* data, const char* role, size_t bytes) const;
};

namespace {

__attribute__((format(printf, 1, 2))) int fail_free(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vformat(t_error, sizeof t_error, fmt, args);
  va_end(args);
  return -1;
}

// Whether `src`, the place of a value of `bytes` bytes, is inside the model's memory;
// buffer_bytes[b] is the size of buffer b's tensor.
const char* source_error(const KilnAotModel& m, const std::vector<int64_t>& buffer_bytes, const KilnAotSource& src,
                         int64_t bytes, bool update) {
  switch (src.kind) {
    case KILN_AOT_NONE: return update ? nullptr : "an output has no source";
    case KILN_AOT_ARENA:
      return src.offset < 0 || src.offset > m.arena_bytes - bytes ? "arena range outside the arena" : nullptr;
    case KILN_AOT_BUFFER:
      if (src.buffer < 0 || src.buffer >= m.n_buffers) return "buffer index out of range";
      return buffer_bytes[static_cast<size_t>(src.buffer)] == bytes ? nullptr : "buffer of another size";
    case KILN_AOT_CONSTANT: return bytes > 0 && !src.data ? "constant without data" : nullptr;
    default: return "unknown source kind";
  }
}

// Why the descriptor cannot be run (a bug in the code that wrote the object: the runtime
// checks once here so that a call needs no checks), or nullptr. Writes "where" into
// `where` for the message.
const char* model_error(const KilnAotModel& m, char* where, size_t where_size) {
  format(where, where_size, "%s", "the model");
  if (!m.name) return "no name";
  if (!m.entry) return "no entry function";
  if (m.arena_bytes < 1) return "arena size below 1 byte";
  if (m.n_buffers < 0 || m.n_inputs < 0 || m.n_outputs < 0 || m.n_state < 0) return "negative count";
  if (static_cast<int64_t>(m.n_inputs) + m.n_state != m.n_buffers) return "inputs + state != buffers";
  if ((m.n_inputs && (!m.inputs || !m.input_buffer)) || (m.n_outputs && (!m.outputs || !m.output_source)) ||
      (m.n_state && (!m.state || !m.state_buffer || !m.state_update)) || (m.weights && m.n_state && !m.weights_offset))
    return "missing table";
  // Each buffer belongs to exactly one input or state tensor (as inputs + state ==
  // buffers, every buffer then has its size here).
  std::vector<int64_t> buffer_bytes(static_cast<size_t>(m.n_buffers), -1);
  auto claim = [&](int32_t b, int64_t bytes) {
    if (b < 0 || b >= m.n_buffers || buffer_bytes[static_cast<size_t>(b)] >= 0) return false;
    buffer_bytes[static_cast<size_t>(b)] = bytes;
    return true;
  };
  for (int32_t i = 0; i < m.n_inputs; ++i) {
    format(where, where_size, "input %d", i);
    if (const char* why = tensor_error(m.inputs[i])) return why;
    if (!claim(m.input_buffer[i], m.inputs[i].bytes)) return "bad or shared buffer index";
  }
  for (int32_t i = 0; i < m.n_state; ++i) {
    format(where, where_size, "state %d", i);
    if (const char* why = tensor_error(m.state[i])) return why;
    if (!claim(m.state_buffer[i], m.state[i].bytes)) return "bad or shared buffer index";
    if (m.weights && (m.weights_offset[i] < 0 || m.weights_offset[i] % kAlign)) return "bad weights offset";
  }
  for (int32_t i = 0; i < m.n_state; ++i) {
    format(where, where_size, "state %d's update", i);
    if (const char* why = source_error(m, buffer_bytes, m.state_update[i], m.state[i].bytes, true)) return why;
  }
  for (int32_t i = 0; i < m.n_outputs; ++i) {
    format(where, where_size, "output %d", i);
    if (const char* why = tensor_error(m.outputs[i])) return why;
    if (const char* why = source_error(m, buffer_bytes, m.output_source[i], m.outputs[i].bytes, false)) return why;
  }
  return nullptr;
}

// ---- the CPU features (runtime/cpu_features.def) ----

struct CpuFeature {
  int bit;
  const char* name;
  unsigned leaf, subleaf;
  int reg, reg_bit, state;
};
constexpr CpuFeature kCpuFeatures[] = {
#define KILN_CPU_FEATURE(bit, name, leaf, subleaf, reg, reg_bit, state) {bit, name, leaf, subleaf, reg, reg_bit, state},
#include "runtime/cpu_features.def"
#undef KILN_CPU_FEATURE
};

// The features of the CPU this runs on (and the operating system saves the state of), as
// CPUID and XGETBV report them.
uint64_t running_cpu_features() {
#if defined(__x86_64__) || defined(__i386__)
  const unsigned max_leaf = __get_cpuid_max(0, nullptr), max_ext = __get_cpuid_max(0x80000000u, nullptr);
  unsigned a = 0, b = 0, c = 0, d = 0;
  uint64_t xcr0 = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) && (c >> 27 & 1)) {  // OSXSAVE: XGETBV is usable
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = lo | static_cast<uint64_t>(hi) << 32;
  }
  const bool avx_state = (xcr0 & 0x6) == 0x6;                    // XMM, YMM
  const bool avx512_state = avx_state && (xcr0 & 0xE0) == 0xE0;  // opmask, ZMM_Hi256, Hi16_ZMM
  uint64_t mask = 0;
  for (const CpuFeature& f : kCpuFeatures) {
    if (f.leaf > (f.leaf >= 0x80000000u ? max_ext : max_leaf)) continue;
    unsigned r[4] = {0, 0, 0, 0};
    __cpuid_count(f.leaf, f.subleaf, r[0], r[1], r[2], r[3]);
    if (!(r[f.reg] >> f.reg_bit & 1) || (f.state == 1 && !avx_state) || (f.state == 2 && !avx512_state)) continue;
    mask |= uint64_t{1} << f.bit;
  }
  return mask;
#else
  return 0;  // the features are x86's: an object that needs one cannot run here
#endif
}

// The running CPU's features less those named in $KILN_AOT_HIDE_CPU_FEATURES (for tests: a
// machine without them, faked). An unknown name there is an error (false, message in `why`),
// so that a misspelt test hook does not pass silently.
bool available_cpu_features(uint64_t& mask, char* why, size_t why_size) {
  static const uint64_t running = running_cpu_features();
  mask = running;
  const char* hide = std::getenv("KILN_AOT_HIDE_CPU_FEATURES");
  if (!hide) return true;
  for (const char* p = hide; *p;) {
    const char* end = std::strchr(p, ',');
    size_t len = end ? static_cast<size_t>(end - p) : std::strlen(p);
    bool known = len == 0;
    for (const CpuFeature& f : kCpuFeatures)
      if (std::strlen(f.name) == len && std::strncmp(f.name, p, len) == 0) {
        mask &= ~(uint64_t{1} << f.bit);
        known = true;
      }
    if (!known) {
      format(why, why_size, "KILN_AOT_HIDE_CPU_FEATURES names '%.*s', which is not a CPU feature the runtime checks",
             static_cast<int>(len > 64 ? 64 : len), p);
      return false;
    }
    p += len;
    if (*p == ',') ++p;
  }
  return true;
}

// Why the model's code cannot run on this CPU (the features it lacks, by name), or false.
bool cpu_error(const KilnAotModel& m, char* why, size_t why_size) {
  uint64_t have = 0;
  if (!available_cpu_features(have, why, why_size)) return true;
  uint64_t missing = m.cpu_features & ~have;
  if (!missing) return false;
  char names[512] = "";
  size_t used = 0;
  for (const CpuFeature& f : kCpuFeatures)
    if (missing >> f.bit & 1 && used < sizeof names)
      used += static_cast<size_t>(std::snprintf(names + used, sizeof names - used, "%s%s", used ? ", " : "", f.name));
  const char* target = m.target ? m.target : "";
  const char* cut = std::strstr(target, " features=");
  format(why, why_size,
         "its code was compiled for CPU features this CPU lacks: %s (target %.*s); compile it again for an older "
         "CPU (kiln compile --cpu x86-64-v3, the default, or --cpu native on the machine that runs it)",
         names, static_cast<int>(cut ? cut - target : static_cast<std::ptrdiff_t>(std::strlen(target))), target);
  return true;
}

// Lays out and allocates the instance's memory (throws std::bad_alloc).
void allocate(KilnAotInstance& inst) {
  const KilnAotModel& m = *inst.model;
  size_t n_state = static_cast<size_t>(m.n_state);
  inst.buffers.assign(static_cast<size_t>(m.n_buffers), nullptr);
  inst.state_data.assign(n_state, nullptr);
  inst.state_offset.resize(n_state);
  inst.stage_offset.assign(n_state, -1);
  int64_t total = 0, staged = 0;
  for (size_t i = 0; i < n_state; ++i) {
    inst.state_offset[i] = total;
    // Sizes are checked non-negative; a sum past 2^62 cannot be allocated anyway.
    if (m.state[i].bytes > (int64_t{1} << 60) || total > (int64_t{1} << 61)) throw std::bad_alloc();
    total += align_up(m.state[i].bytes);
  }
  // An update read from another state buffer would see that buffer already overwritten
  // if it were applied after it (a swap a, b = b, a): such updates are copied aside first.
  for (size_t i = 0; i < n_state; ++i) {
    const KilnAotSource& u = m.state_update[i];
    if (u.kind != KILN_AOT_BUFFER || u.buffer == m.state_buffer[i]) continue;
    for (size_t j = 0; j < n_state; ++j)
      if (m.state_buffer[j] == u.buffer) {
        inst.stage_offset[i] = staged;
        staged += align_up(m.state[i].bytes);
        break;
      }
  }
  inst.state_bytes = total;
  inst.state = aligned_bytes(total);
  if (staged) inst.staging = aligned_bytes(staged);
  std::memset(inst.state.get(), 0, static_cast<size_t>(total > 0 ? total : kAlign));
  if (m.weights)
    for (size_t i = 0; i < n_state; ++i)
      if (m.state[i].bytes)
        std::memcpy(inst.state.get() + inst.state_offset[i], m.weights + m.weights_offset[i],
                    static_cast<size_t>(m.state[i].bytes));
  inst.point_state();
}

// Where the value of `src` is now.
const uint8_t* source_data(const KilnAotInstance& inst, const KilnAotSource& src) {
  switch (src.kind) {
    case KILN_AOT_ARENA: return inst.arena + src.offset;
    case KILN_AOT_BUFFER: return static_cast<const uint8_t*>(inst.buffers[static_cast<size_t>(src.buffer)]);
    case KILN_AOT_CONSTANT: return static_cast<const uint8_t*>(src.data);
    default: return nullptr;  // NONE: checked by the callers
  }
}

void copy(void* dst, const void* src, int64_t bytes) {
  // memcpy with a zero size still requires valid pointers; a 0-byte constant has none.
  if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
}

}  // namespace

int32_t KilnAotInstance::find_state(const char* name) const {
  for (int32_t i = 0; i < model->n_state; ++i)
    if (std::strcmp(model->state[i].name, name) == 0) return i;
  // List the names, cut short so the message stays one readable line.
  char names[512] = "";
  size_t used = 0;
  int32_t listed = 0;
  for (; listed < model->n_state; ++listed) {
    const char* n = model->state[listed].name;
    size_t len = std::strlen(n);
    if (used + len + 5 > 200) break;
    used += static_cast<size_t>(std::snprintf(names + used, sizeof names - used, "%s'%s'", listed ? ", " : "", n));
  }
  if (model->n_state == 0)
    fail("model %s has no state named '%s': it has no state", model->name, name);
  else if (listed < model->n_state)
    fail("model %s has no state named '%s' (its state: %s and %d more)", model->name, name, names,
         model->n_state - listed);
  else
    fail("model %s has no state named '%s' (its state: %s)", model->name, name, names);
  return -1;
}

int32_t KilnAotInstance::checked_state(const char* verb, const char* name, const void* data, const char* role,
                                       size_t bytes) const {
  if (!name) return fail("kiln_aot_%s_state: the name is NULL", verb);
  int32_t i = find_state(name);
  if (i < 0) return -1;
  const KilnAotTensor& t = model->state[i];
  char type[160];
  format_type(type, sizeof type, t);
  if (bytes != static_cast<uint64_t>(t.bytes))
    return fail("cannot %s state '%s' of model %s: it is %s, %lld bytes, not %zu", verb, name, model->name, type,
                static_cast<long long>(t.bytes), bytes);
  if (!data) return fail("cannot %s state '%s' of model %s: the %s is NULL", verb, name, model->name, role);
  return i;
}

extern "C" {

KilnAotInstance* kiln_aot_create(const KilnAotModel* model) {
  if (!model) return fail_free("kiln_aot_create: the model is NULL"), nullptr;
  // Nothing past the version is read from a model of another version: its layout differs.
  if (model->abi_version != KILN_AOT_ABI_VERSION)
    return fail_free("cannot create the model: it was compiled for AOT ABI version %u, this runtime is version %d "
                     "(recompile it with the kiln whose runtime it links)",
                     model->abi_version, KILN_AOT_ABI_VERSION),
           nullptr;
  const KilnAotModel& m = *model;
  char cpu[kMessageBytes / 2];
  if (cpu_error(m, cpu, sizeof cpu)) return fail_free("cannot create model %s: %s", model_name(m), cpu), nullptr;
  try {
    char where[64];
    if (const char* why = model_error(m, where, sizeof where))
      return fail_free("internal error: model %s has an invalid descriptor: %s: %s (a bug in the kiln that wrote it)",
                       model_name(m), where, why),
             nullptr;
    auto inst = std::make_unique<KilnAotInstance>();
    inst->model = model;
    void* arena = mmap(nullptr, static_cast<size_t>(m.arena_bytes), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (arena == MAP_FAILED)
      return fail_free("cannot create model %s: no memory for its arena of %lld bytes (%s)", m.name,
                       static_cast<long long>(m.arena_bytes), std::strerror(errno)),
             nullptr;
    inst->arena = static_cast<uint8_t*>(arena);
    allocate(*inst);
    return inst.release();
  } catch (const std::bad_alloc&) {
    return fail_free("cannot create model %s: out of memory for its state", model_name(m)), nullptr;
  } catch (...) {
    return fail_free("internal error: creating model %s failed unexpectedly", model_name(m)), nullptr;
  }
}

void kiln_aot_destroy(KilnAotInstance* inst) { delete inst; }

int kiln_aot_call(KilnAotInstance* inst, const void* const* inputs, void* const* outputs) {
  if (!inst) return fail_free("kiln_aot_call: the instance is NULL");
  const KilnAotModel& m = *inst->model;
  if (m.n_inputs && !inputs) return inst->fail("running %s: the inputs array is NULL", m.name);
  if (m.n_outputs && !outputs) return inst->fail("running %s: the outputs array is NULL", m.name);
  for (int32_t i = 0; i < m.n_inputs; ++i) {
    if (!inputs[i] && m.inputs[i].bytes) return inst->fail("running %s: input '%s' is NULL", m.name, m.inputs[i].name);
    inst->buffers[m.input_buffer[i]] = const_cast<void*>(inputs[i]);
  }
  for (int32_t i = 0; i < m.n_outputs; ++i)
    if (!outputs[i] && m.outputs[i].bytes) return inst->fail("running %s: output '%s' is NULL", m.name, m.outputs[i].name);

  kiln_rt_take_error();  // a message left over from a failed call to other code is not ours
  m.entry(inst->buffers.data(), inst->arena);
  if (const char* failed = kiln_rt_take_error())
    return inst->fail("running %s: %s (the outputs and the state are invalid)", m.name, failed);

  // Outputs first: one may be a state buffer, whose value before the updates it returns.
  for (int32_t i = 0; i < m.n_outputs; ++i) copy(outputs[i], source_data(*inst, m.output_source[i]), m.outputs[i].bytes);
  for (int32_t i = 0; i < m.n_state; ++i)
    if (inst->stage_offset[i] >= 0)
      copy(inst->staging.get() + inst->stage_offset[i], source_data(*inst, m.state_update[i]), m.state[i].bytes);
  for (int32_t i = 0; i < m.n_state; ++i) {
    const KilnAotSource& u = m.state_update[i];
    if (u.kind == KILN_AOT_NONE || (u.kind == KILN_AOT_BUFFER && u.buffer == m.state_buffer[i])) continue;
    const void* from = inst->stage_offset[i] >= 0 ? inst->staging.get() + inst->stage_offset[i] : source_data(*inst, u);
    copy(inst->state_data[i], from, m.state[i].bytes);
  }
  return 0;
}

int kiln_aot_get_state(const KilnAotInstance* inst, const char* name, void* dst, size_t bytes) {
  if (!inst) return fail_free("kiln_aot_get_state: the instance is NULL");
  int32_t i = inst->checked_state("get", name, dst, "destination", bytes);
  if (i < 0) return -1;
  copy(dst, inst->state_data[i], inst->model->state[i].bytes);
  return 0;
}

int kiln_aot_set_state(KilnAotInstance* inst, const char* name, const void* src, size_t bytes) {
  if (!inst) return fail_free("kiln_aot_set_state: the instance is NULL");
  int32_t i = inst->checked_state("set", name, src, "source", bytes);
  if (i < 0) return -1;
  copy(inst->state_data[i], src, inst->model->state[i].bytes);
  return 0;
}

int kiln_aot_load_weights(KilnAotInstance* inst, const char* path) {
  if (!inst) return fail_free("kiln_aot_load_weights: the instance is NULL");
  if (!path) return inst->fail("kiln_aot_load_weights: the path is NULL");
  const KilnAotModel& m = *inst->model;
  // All or nothing: the file's tensors go to fresh storage laid out like the state, which
  // replaces it only when every state tensor was found and matched.
  struct Load {
    KilnAotInstance* inst;
    const char* path;
    Bytes fresh;
    std::vector<char> seen;
  };
  Load load{inst, path, nullptr, {}};
  try {
    load.fresh = aligned_bytes(inst->state_bytes);
    load.seen.assign(static_cast<size_t>(m.n_state), 0);
  } catch (const std::bad_alloc&) {
    return inst->fail("cannot load weights file '%s' into model %s: out of memory for a copy of the state", path, m.name);
  }
  auto visit = [](void* ctx, const KilnAotTensor* t, const void* data) -> int {
    Load& l = *static_cast<Load*>(ctx);
    const KilnAotModel& model = *l.inst->model;
    // A linear search per tensor: models have tens to hundreds of state tensors.
    for (int32_t i = 0; i < model.n_state; ++i) {
      const KilnAotTensor& s = model.state[i];
      if (std::strcmp(s.name, t->name) != 0) continue;
      bool same = s.dtype == t->dtype && s.rank == t->rank;
      for (int32_t d = 0; same && d < s.rank; ++d) same = s.shape[d] == t->shape[d];
      if (!same) {
        char want[160], got[160];
        format_type(want, sizeof want, s);
        format_type(got, sizeof got, *t);
        return l.inst->fail("cannot load weights file '%s' into model %s: its tensor '%s' is %s, the state is %s",
                            l.path, model.name, t->name, got, want);
      }
      copy(l.fresh.get() + l.inst->state_offset[i], data, s.bytes);
      l.seen[i] = 1;
      return 0;
    }
    return 0;  // not state of this model (e.g. optimizer state an inference model lacks)
  };
  if (kiln_weights_visit(path, visit, &load, inst->error, sizeof inst->error) != 0) return -1;
  for (int32_t i = 0; i < m.n_state; ++i)
    if (!load.seen[i])
      return inst->fail("cannot load weights file '%s' into model %s: it has no tensor '%s'", path, m.name,
                        m.state[i].name);
  inst->state = std::move(load.fresh);
  inst->point_state();
  return 0;
}

int kiln_aot_save_weights(const KilnAotInstance* inst, const char* path) {
  if (!inst) return fail_free("kiln_aot_save_weights: the instance is NULL");
  const KilnAotModel& m = *inst->model;
  return kiln_weights_write(path, m.n_state, m.state, inst->state_data.data(), inst->error, sizeof inst->error);
}

const char* kiln_aot_error(const KilnAotInstance* inst) { return inst ? inst->error : t_error; }

}  // extern "C"
