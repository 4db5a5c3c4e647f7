// The backend-neutral pieces every backend shares: target names, host memory, hashing.
#include "codegen/backend.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include <sys/mman.h>

#include <fmt/format.h>

#include <llvm/Support/BLAKE3.h>

#include "ir/error.h"

namespace kiln {

namespace {

class HostDevice final : public Device {
 public:
  std::string name() const override { return "cpu"; }
  bool host_visible() const override { return true; }
  // Zero-filled and 256-byte aligned like cuMemAlloc's, for the CUDA emulation's sake. A
  // large buffer (a model's weights, set as state) is pages mapped zero and populated by
  // the kernel in one go (MAP_POPULATE): filling DistilBERT's 265 MB of weights spent half
  // a second in a memset that the copy into it then overwrote, a page fault per 4 KiB.
  void* allocate(int64_t bytes) override {
    size_t n = static_cast<size_t>((std::max<int64_t>(bytes, 1) + 255) / 256 * 256);
    if (n >= kMappedBytes) return map(n, bytes);
    void* p = std::aligned_alloc(256, n);
    if (!p) throw Error("cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    std::memset(p, 0, n);
    return p;
  }
  void release(void* p) noexcept override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (auto it = mapped_.find(p); it != mapped_.end()) {
        munmap(p, it->second);
        mapped_.erase(it);
        return;
      }
    }
    std::free(p);
  }
  void upload(void* dst, const void* src, int64_t bytes) override { copy(dst, src, bytes); }
  void download(void* dst, const void* src, int64_t bytes) override { copy(dst, src, bytes); }
  void copy(void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0 && dst != src) std::memmove(dst, src, static_cast<size_t>(bytes));
  }

 private:
  static constexpr size_t kMappedBytes = size_t{1} << 20;

  void* map(size_t n, int64_t bytes) {
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED)
      throw Error("cannot allocate " + std::to_string(bytes) + " bytes of host memory: " + std::strerror(errno));
    std::lock_guard<std::mutex> lock(mutex_);
    mapped_.emplace(p, n);
    return p;
  }

  std::mutex mutex_;
  std::unordered_map<void*, size_t> mapped_;  // mapped buffers: their length
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

namespace {
struct TargetText {
  std::string text;  // as given: "cuda:1"
  const char* from;  // where it came from, for errors
};

TargetText target_text(const CompileOptions& options) {
  if (!options.target.empty()) return {options.target, "CompileOptions::target"};
  if (const char* e = std::getenv("KILN_TARGET"); e && *e) return {e, "KILN_TARGET"};
  return {"cpu", "the default"};
}

// "cuda:1" -> ("cuda", 1); "cuda" -> ("cuda", none). kiln::Error for "cuda:" or "cuda:x".
std::pair<std::string, std::optional<int>> split_device(const TargetText& t) {
  size_t colon = t.text.rfind(':');
  if (colon == std::string::npos) return {t.text, std::nullopt};
  std::optional<int> n = device_number(std::string_view(t.text).substr(colon + 1));
  if (!n)
    throw Error("bad target '" + t.text + "' (from " + t.from + "): a device suffix is ':N' with N a GPU number, "
                "e.g. cuda:0");
  return {t.text.substr(0, colon), n};
}
}  // namespace

std::optional<int> device_number(std::string_view digits) {
  if (digits.empty() || digits.size() > 4 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  int n = 0;
  for (char c : digits) n = n * 10 + (c - '0');
  return n;
}

std::string resolve_target(const CompileOptions& options) {
  TargetText t = target_text(options);
  std::string name = split_device(t).first;
  std::string known;
  for (const std::string& n : backend_names()) {
    if (n == name) return name;
    known += (known.empty() ? "" : ", ") + n;
  }
  throw Error("unknown target '" + t.text + "' (from " + t.from + "); known targets: " + known);
}

CompileOptions resolve_device(CompileOptions options) {
  TargetText t = target_text(options);
  std::optional<int> suffix = split_device(t).second;
  options.target = resolve_target(options);
  if (suffix) {
    if (options.device != 0 && options.device != *suffix)
      throw Error(fmt::format("the target '{}' (from {}) names device {} but the device option says {}", t.text,
                              t.from, *suffix, options.device));
    options.device = *suffix;
  }
  if (options.device < 0) throw Error(fmt::format("bad device {}: devices are numbered from 0", options.device));
  if (options.device != 0 && options.target != "cuda")
    throw Error(fmt::format("the {} target has one device, 0; device {} is for the cuda target (cuda:{})",
                            options.target, options.device, options.device));
  return options;
}

AotObject Backend::write_object(const Prepared&, const CompileOptions&, const AotModule&) const {
  throw Error("the " + name() + " backend cannot compile ahead of time (kiln compile writes CPU objects only)");
}

}  // namespace kiln
