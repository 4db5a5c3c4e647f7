// The backend-neutral pieces every backend shares: target names, host memory, hashing.
#include "codegen/backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include <llvm/Support/BLAKE3.h>

#include "ir/error.h"

namespace kiln {

namespace {

class HostDevice final : public Device {
 public:
  std::string name() const override { return "cpu"; }
  bool host_visible() const override { return true; }
  void* allocate(int64_t bytes) override {
    // 256-byte aligned like cuMemAlloc's, for the CUDA emulation's sake.
    size_t n = static_cast<size_t>((std::max<int64_t>(bytes, 1) + 255) / 256 * 256);
    void* p = std::aligned_alloc(256, n);
    if (!p) throw Error("cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    std::memset(p, 0, n);
    return p;
  }
  void release(void* p) noexcept override { std::free(p); }
  void upload(void* dst, const void* src, int64_t bytes) override { copy(dst, src, bytes); }
  void download(void* dst, const void* src, int64_t bytes) override { copy(dst, src, bytes); }
  void copy(void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0 && dst != src) std::memmove(dst, src, static_cast<size_t>(bytes));
  }
};

}  // namespace

std::shared_ptr<Device> host_device() {
  static std::shared_ptr<Device> d = std::make_shared<HostDevice>();
  return d;
}

std::string hash_hex(std::string_view text) {
  llvm::BLAKE3 h;
  h.update(llvm::StringRef(text.data(), text.size()));
  llvm::BLAKE3Result<32> digest = h.final();
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (uint8_t b : digest) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

std::string resolve_target(const CompileOptions& options) {
  std::string t = options.target;
  const char* from = "CompileOptions::target";
  if (t.empty()) {
    if (const char* e = std::getenv("KILN_TARGET"); e && *e) {
      t = e;
      from = "KILN_TARGET";
    } else {
      t = "cpu";
    }
  }
  std::string known;
  for (const std::string& n : backend_names()) {
    if (n == t) return t;
    known += (known.empty() ? "" : ", ") + n;
  }
  throw Error("unknown target '" + t + "' (from " + from + "); known targets: " + known);
}

AotObject Backend::write_object(const Prepared&, const CompileOptions&, const AotModule&) const {
  throw Error("the " + name() + " backend cannot compile ahead of time (kiln compile writes CPU objects only)");
}

}  // namespace kiln
