// State files and checkpoints (train/checkpoint.h): atomic writes, checksums, loading with
// a rename table, and a folder of numbered checkpoints.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <thread>

#include "ir/error.h"
#include "runtime/file_output.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kFormatKey = "kiln.format";
constexpr std::string_view kFormat = "kiln-state-1";
constexpr std::string_view kCrcPrefix = "kiln.crc32.";
// The checksum of the other metadata entries (which hold the tensors' checksums), so that a
// flipped byte in the header is caught too. A tensor cannot be named "__metadata__".
constexpr std::string_view kMetadataCrcKey = "kiln.crc32.__metadata__";

std::string crc_hex(uint32_t crc) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08" PRIx32, crc);
  return buf;
}

uint32_t crc_of(const void* data, size_t n, uint32_t crc = 0) {
  return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), n));
}

uint32_t tensor_crc(const Tensor& t) {
  if (t.is_splat()) {
    Tensor full = t.materialized();
    return crc_of(full.raw(), full.nbytes());
  }
  return crc_of(t.raw(), t.nbytes());
}

// Every entry but the metadata checksum itself, as "key\0value\0" in key order.
uint32_t metadata_crc(const Metadata& m) {
  uint32_t crc = 0;
  for (const auto& [k, v] : m) {
    if (k == kMetadataCrcKey) continue;
    crc = crc_of(k.data(), k.size() + 1, crc);  // with the terminating NUL
    crc = crc_of(v.data(), v.size() + 1, crc);
  }
  return crc;
}

Tensor transposed(const Tensor& t) {
  Tensor full = t.is_splat() ? t.materialized() : t;
  int64_t rows = t.shape()[0], cols = t.shape()[1];
  Tensor out(t.dtype(), {cols, rows});
  size_t es = dtype_size(t.dtype());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      std::memcpy(out.raw() + static_cast<size_t>(c * rows + r) * es, full.raw() + static_cast<size_t>(r * cols + c) * es,
                  es);
  return out;
}

std::string trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string_view::npos ? "" : std::string(s.substr(b, e - b + 1));
}

constexpr std::string_view kCkptPrefix = "ckpt-", kCkptSuffix = ".safetensors";

// The step of a checkpoint's file name "ckpt-<10 or more digits>.safetensors", or nothing.
std::optional<int64_t> step_of(std::string_view name) {
  if (!name.starts_with(kCkptPrefix) || !name.ends_with(kCkptSuffix)) return std::nullopt;
  std::string_view digits = name.substr(kCkptPrefix.size(), name.size() - kCkptPrefix.size() - kCkptSuffix.size());
  if (digits.size() < 10) return std::nullopt;
  int64_t step = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    if (__builtin_mul_overflow(step, 10, &step) || __builtin_add_overflow(step, c - '0', &step)) return std::nullopt;
  }
  return step;
}

}  // namespace

void write_file_atomic(const std::string& path, std::string_view bytes) {
  // runtime/file_output.h: a temporary file fsync'ed and renamed over the file, its folder
  // fsync'ed; a device or FIFO written in place, never replaced.
  rt::OutputFile out;
  std::string why;
  if (!out.open(path, why) || !out.write(bytes, why) || !out.commit(/*durable=*/true, why)) throw Error(why);
}

void save_state(const std::string& path, const TensorMap& state, const Metadata& metadata) {
  Metadata m = metadata;
  m[std::string(kFormatKey)] = kFormat;
  for (const auto& [name, t] : state) m[std::string(kCrcPrefix) + name] = crc_hex(tensor_crc(t));
  m[std::string(kMetadataCrcKey)] = crc_hex(metadata_crc(m));
  write_file_atomic(path, serialize_safetensors(state, m));
}

SafetensorsFile read_state(const std::string& path) {
  SafetensorsFile f = read_safetensors(path);
  auto fail = [&](const std::string& what) { return Error(path + ": " + what); };
  auto format = f.metadata.find(std::string(kFormatKey));
  if (format == f.metadata.end()) {
    // Not written by save_state (Python's safetensors, PyTorch): nothing to check, unless
    // it carries Kiln's checksums, which then must hold.
    if (f.metadata.contains(std::string(kMetadataCrcKey)))
      throw fail("the metadata has Kiln's checksum but no kiln.format (the file is corrupt)");
  } else if (format->second != kFormat) {
    throw fail("kiln.format is '" + format->second + "', this Kiln reads '" + std::string(kFormat) +
               "' (written by another version of Kiln, or the file is corrupt)");
  }
  bool kiln = format != f.metadata.end();
  auto meta_crc = f.metadata.find(std::string(kMetadataCrcKey));
  if (kiln && (meta_crc == f.metadata.end() || meta_crc->second != crc_hex(metadata_crc(f.metadata))))
    throw fail("the metadata's checksum does not match (the file's header is corrupt)");
  for (const auto& [key, value] : f.metadata) {
    if (!key.starts_with(kCrcPrefix) || key == kMetadataCrcKey) continue;
    std::string name = key.substr(kCrcPrefix.size());
    auto t = f.tensors.find(name);
    if (t == f.tensors.end()) throw fail("a checksum for tensor '" + name + "', which is not in the file (the file is corrupt)");
    if (value != crc_hex(tensor_crc(t->second)))
      throw fail("tensor '" + name + "': checksum mismatch (the file is corrupt)");
  }
  if (kiln)
    for (const auto& [name, t] : f.tensors)
      if (!f.metadata.contains(std::string(kCrcPrefix) + name))
        throw fail("tensor '" + name + "' has no checksum (the file is corrupt)");
  return f;
}

TensorMap load_state(const std::string& path, const std::map<std::string, TensorType>& want,
                     const LoadStateOptions& options) {
  for (const auto& [name, src] : options.rename) {
    if (want.contains(name)) continue;
    // A typo or another model's table: loading on would leave the tensor it meant at its
    // initial value without a word.
    std::string names;
    size_t listed = 0;
    for (const auto& [have, type] : want) {
      if (listed == 40) {
        names += ", ... (" + std::to_string(want.size() - listed) + " more)";
        break;
      }
      names += (listed++ ? ", " : "") + have;
    }
    throw Error(options.rename_name + ": '" + name + "' (mapped to '" + src.name +
                "') is not a tensor of the model; it has " + std::to_string(want.size()) + ": " + names);
  }
  SafetensorsFile f = read_state(path);
  TensorMap out;
  for (const auto& [name, type] : want) {
    auto mapped = options.rename.find(name);
    SourceTensor src = mapped != options.rename.end() ? mapped->second : SourceTensor{name, false};
    std::string as = mapped != options.rename.end()
                         ? " (as '" + src.name + "'" + (src.transpose ? ", transposed" : "") + ")"
                         : "";
    auto found = f.tensors.find(src.name);
    if (found == f.tensors.end()) {
      if (options.allow_missing) continue;
      throw Error(path + ": no tensor '" + src.name + "'" +
                  (src.name != name ? " (the graph's '" + name + "' is mapped to it)" : "") +
                  "; the file has " + std::to_string(f.tensors.size()) + " tensors");
    }
    Tensor t = found->second;
    if (src.transpose) {
      if (t.rank() != 2)
        throw Error(path + ": tensor '" + name + "'" + as + ": cannot transpose " + t.type().str() +
                    " (only a 2-D tensor can be)");
      t = transposed(t);
    }
    if (options.convert_dtype && t.dtype() != type.dtype && is_float(t.dtype()) && is_float(type.dtype))
      t = t.cast(type.dtype);
    if (t.type() != type)
      throw Error(path + ": tensor '" + name + "'" + as + " is " + t.type().str() + " in the file, the graph needs " +
                  type.str());
    out.emplace(name, std::move(t));
  }
  return out;
}

std::map<std::string, SourceTensor> parse_rename_table(std::string_view text, std::string_view name) {
  std::map<std::string, SourceTensor> table;
  int line_no = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    line = line.substr(0, line.find('#'));
    auto fail = [&](const std::string& what) {
      return Error(std::string(name) + ":" + std::to_string(line_no) + ": " + what);
    };
    while (!line.empty()) {
      size_t comma = line.find(',');
      std::string item = trim(line.substr(0, comma));
      line = comma == std::string_view::npos ? std::string_view() : line.substr(comma + 1);
      if (item.empty()) continue;
      size_t eq = item.find('=');
      if (eq == std::string::npos)
        throw fail("expected KILN_NAME=SOURCE_NAME (or SOURCE_NAME:T to transpose), found '" + item + "'");
      SourceTensor src{trim(std::string_view(item).substr(eq + 1)), false};
      std::string kiln_name = trim(std::string_view(item).substr(0, eq));
      if (src.name.ends_with(":T")) {
        src.transpose = true;
        src.name = trim(std::string_view(src.name).substr(0, src.name.size() - 2));
      }
      if (kiln_name.empty() || src.name.empty())
        throw fail("expected KILN_NAME=SOURCE_NAME (or SOURCE_NAME:T to transpose), found '" + item + "'");
      if (src.name.find_first_of(":=") != std::string::npos)
        throw fail("'" + src.name + "': a source name cannot hold ':' or '=' (the only suffix is :T, to transpose)");
      if (!table.emplace(kiln_name, src).second) throw fail("'" + kiln_name + "' is mapped twice");
    }
  }
  return table;
}

std::optional<std::string> first_nonfinite(const TensorMap& state) {
  auto finite = [](const auto* p, int64_t n) {
    return std::all_of(p, p + n, [](auto v) { return std::isfinite(v); });
  };
  for (const auto& [name, t] : state) {
    const int64_t n = t.is_splat() ? 1 : t.numel();
    if ((t.dtype() == DType::f32 && !finite(t.data<float>(), n)) ||
        (t.dtype() == DType::f64 && !finite(t.data<double>(), n)))
      return name;
  }
  return std::nullopt;
}

CheckpointDir::CheckpointDir(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {
  if (keep < 1) throw Error(dir_ + ": cannot keep " + std::to_string(keep) + " checkpoints (keep at least 1)");
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw Error(dir_ + ": cannot create the checkpoint folder (" + ec.message() + ")");
  // Temporary files of writers that died (kill -9) mid-write: removed when their process is
  // gone. A live process's (another writer's) are left alone.
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    std::string n = e.path().filename().string();
    size_t at = n.rfind(".tmp.");
    if (!n.starts_with(".") || at == std::string::npos || !step_of(n.substr(1, at - 1))) continue;
    std::string pid = n.substr(at + 5, n.find('.', at + 5) - at - 5);
    if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (::kill(static_cast<pid_t>(std::stol(pid)), 0) != 0 && errno == ESRCH) fs::remove(e.path(), ec);
  }
}

std::string CheckpointDir::save(int64_t global_step, const TensorMap& state, const Metadata& metadata) {
  if (global_step < 0) throw Error(dir_ + ": cannot save a checkpoint for step " + std::to_string(global_step));
  char name[64];
  std::snprintf(name, sizeof name, "ckpt-%010lld.safetensors", static_cast<long long>(global_step));
  std::string path = (fs::path(dir_) / name).string();
  save_state(path, state, metadata);
  finite_[path] = !first_nonfinite(state);
  std::vector<std::string> all = list();
  if (all.size() <= static_cast<size_t>(keep_)) return path;
  // The newest good checkpoint stays, however many diverged ones came after it (looked for
  // newest first: in a healthy run that is the one just written, and nothing is read).
  std::string last_finite;
  for (auto it = all.rbegin(); it != all.rend() && last_finite.empty(); ++it)
    if (all_finite(*it)) last_finite = *it;
  for (size_t i = 0; i + static_cast<size_t>(keep_) < all.size(); ++i) {
    if (all[i] == last_finite) continue;
    std::error_code ec;
    fs::remove(all[i], ec);
    if (ec) throw Error(all[i] + ": cannot remove an old checkpoint (" + ec.message() + ")");
    finite_.erase(all[i]);
  }
  return path;
}

bool CheckpointDir::all_finite(const std::string& path) {
  auto known = finite_.find(path);
  if (known != finite_.end()) return known->second;
  bool finite = false;
  try {
    finite = !first_nonfinite(read_state(path).tensors);
  } catch (const Error&) {
    // Unreadable or corrupt: not a checkpoint to keep for.
  }
  return finite_[path] = finite;
}

namespace {

// The checkpoints of `dir`, oldest first.
std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    auto step = step_of(e.path().filename().string());
    if (step && e.is_regular_file(ec)) found.emplace_back(*step, e.path().string());
  }
  if (ec) throw Error(dir + ": cannot list the checkpoint folder (" + ec.message() + ")");
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (auto& [step, path] : found) paths.push_back(std::move(path));
  return paths;
}

}  // namespace

std::vector<std::string> CheckpointDir::list() const { return list_checkpoints(dir_); }

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  std::vector<std::string> all = list_checkpoints(dir);
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::optional<std::string> CheckpointDir::latest() const {
  std::vector<std::string> all = list();
  if (all.empty()) return std::nullopt;
  return all.back();
}

namespace {

// The process id a lock file holds ("" when it holds none yet: its holder has just taken it).
std::string lock_holder(int fd) {
  char buf[32];
  ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return "";
  std::string text(buf, static_cast<size_t>(n));
  text = trim(text.substr(0, text.find('\n')));
  return !text.empty() && text.size() <= 10 && text.find_first_not_of("0123456789") == std::string::npos ? text : "";
}

}  // namespace

CheckpointLock::CheckpointLock(std::string dir) : dir_(std::move(dir)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw Error(dir_ + ": cannot create the checkpoint folder (" + ec.message() + ")");
  const std::string path = (fs::path(dir_) / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(path + ": cannot open the checkpoint folder's lock file (" + std::strerror(errno) + ")");
  int locked;
  do locked = ::flock(fd_, LOCK_EX | LOCK_NB);
  while (locked != 0 && errno == EINTR);
  if (locked != 0) {
    const int err = errno;
    std::string pid;
    // The holder writes its pid right after taking the lock: wait a moment for it.
    for (int i = 0; i < 50 && pid.empty(); ++i) {
      if (i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      pid = lock_holder(fd_);
    }
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK) throw Error(path + ": cannot lock the checkpoint folder (" + std::strerror(err) + ")");
    const std::string holder = pid.empty() ? "pid unknown"
                               : pid == std::to_string(::getpid()) ? "this process, pid " + pid
                                                                   : "pid " + pid;
    throw Error(dir_ + ": the checkpoint folder is in use by another training run (" + holder +
                "); two runs writing one folder overwrite each other's checkpoints: wait for that run to end, "
                "or give another folder");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw Error(path + ": cannot write the lock file (" + std::strerror(err) + ")");
  }
}

CheckpointLock::~CheckpointLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace kiln
