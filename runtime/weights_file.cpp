// The weights file (format in runtime/aot.h): kiln_weights_write and kiln_weights_visit.
//
// The reader trusts nothing in the file: every count, length, offset and size is checked
// against the file's size with overflow-safe arithmetic before it is used, so a corrupted
// or truncated file (or one made to pass the CRC) fails with a message and never makes the
// reader touch memory outside what it read. No exception leaves these functions (C
// callers); the only allocations are the read buffer and the table's copy, in try blocks.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/aot.h"
#include "runtime/aot_internal.h"

// Tensor data is written and read as the host's bytes; the format is little-endian.
static_assert(std::endian::native == std::endian::little, "the weights file is little-endian: a port must swap");

using namespace kiln::rt::aot;

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'W', 'T', 'S', '1'};
constexpr uint64_t kHeaderBytes = 16;  // magic, count, reserved
constexpr uint64_t kCrcBytes = 4;
// A table entry without its name and shape: name length, dtype, rank, bytes, offset.
constexpr uint64_t kEntryFixedBytes = 4 + 4 + 4 + 8 + 8;
constexpr uint64_t kAlign = 64;
constexpr size_t kWhyBytes = 512;  // a table problem, before the path is put in front

// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), as zlib's crc32: table-driven.
constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t n = 0; n < 256; ++n) {
    uint32_t c = n;
    for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[n] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

// Continues a CRC: crc32_update(0, all bytes) is the CRC of all bytes, and so is feeding
// them in pieces.
uint32_t crc32_update(uint32_t crc, const uint8_t* p, size_t n) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = kCrcTable[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint64_t align_up(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

__attribute__((format(printf, 3, 4))) int fail(char* err, size_t err_size, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vformat(err, err_size, fmt, args);
  va_end(args);
  return -1;
}

// ---- writing ----

// Appends little-endian fields to a buffer that is flushed to `fd`, keeping the CRC of
// everything written.
class Writer {
 public:
  explicit Writer(int fd) : fd_(fd) { buf_.reserve(kBufBytes); }
  void u32(uint32_t v) { put_le(v, 4); }
  void u64(uint64_t v) { put_le(v, 8); }
  void bytes(const void* p, uint64_t n) {
    if (n >= kBufBytes) {
      flush();
      raw(p, n);
    } else {
      if (buf_.size() + n > kBufBytes) flush();
      buf_.insert(buf_.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    }
  }
  void zeros(uint64_t n) {
    static constexpr uint8_t kZeros[kAlign] = {};
    bytes(kZeros, n);  // padding: always below 64 bytes
  }
  uint64_t written() const { return written_ + buf_.size(); }
  uint32_t crc() {
    flush();
    return crc_;
  }
  // Writes what is buffered; false with errno set on failure (reported once, at the end).
  bool flush() {
    if (!buf_.empty()) raw(buf_.data(), buf_.size());
    buf_.clear();
    return ok_;
  }

 private:
  static constexpr size_t kBufBytes = 1 << 16;
  void put_le(uint64_t v, int n) {
    uint8_t b[8];
    for (int i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
    bytes(b, static_cast<uint64_t>(n));
  }
  void raw(const void* p, uint64_t n) {
    if (!ok_) return;
    crc_ = crc32_update(crc_, static_cast<const uint8_t*>(p), n);
    written_ += n;
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t w = ::write(fd_, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        if (w == 0) errno = EIO;
        ok_ = false;
        return;
      }
      c += w;
      n -= static_cast<uint64_t>(w);
    }
  }
  int fd_;
  std::vector<uint8_t> buf_;
  uint32_t crc_ = 0;
  uint64_t written_ = 0;
  bool ok_ = true;
};

// Why the tensors cannot be written, or nullptr; `index` names the culprit.
const char* tensors_error(int32_t n, const KilnAotTensor* tensors, const void* const* data, int32_t& index) {
  std::vector<std::string_view> names;
  for (index = 0; index < n; ++index) {
    const KilnAotTensor& t = tensors[index];
    if (const char* why = tensor_error(t)) return why;
    if (t.bytes && !data[index]) return "its data is NULL";
    if (std::strlen(t.name) > UINT32_MAX) return "its name is too long";
    names.emplace_back(t.name);
  }
  std::sort(names.begin(), names.end());
  auto dup = std::adjacent_find(names.begin(), names.end());
  if (dup == names.end()) return nullptr;
  index = static_cast<int32_t>(
      std::find_if(tensors, tensors + n, [&](const KilnAotTensor& t) { return *dup == t.name; }) - tensors);
  return "two tensors have this name";
}

// The temporary beside `path`, made with O_EXCL so that two writers never share one.
int open_temp(const std::string& path, std::string& temp) {
  static std::atomic<unsigned> counter{0};
  for (int attempt = 0; attempt < 100; ++attempt) {
    temp = path + ".tmp" + std::to_string(getpid()) + "_" + std::to_string(counter++);
    int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

// Writes the file's bytes to `fd` (layout in runtime/aot.h); false with errno set.
bool write_contents(int fd, int32_t n, const KilnAotTensor* tensors, const void* const* data) {
  uint64_t table_end = kHeaderBytes;
  for (int32_t i = 0; i < n; ++i)
    table_end += kEntryFixedBytes + std::strlen(tensors[i].name) + 8 * static_cast<uint64_t>(tensors[i].rank);
  Writer w(fd);
  w.bytes(kMagic, sizeof kMagic);
  w.u32(static_cast<uint32_t>(n));
  w.u32(0);
  uint64_t offset = align_up(table_end);
  for (int32_t i = 0; i < n; ++i) {
    const KilnAotTensor& t = tensors[i];
    size_t len = std::strlen(t.name);
    w.u32(static_cast<uint32_t>(len));
    w.bytes(t.name, len);
    w.u32(static_cast<uint32_t>(t.dtype));
    w.u32(static_cast<uint32_t>(t.rank));
    for (int32_t d = 0; d < t.rank; ++d) w.u64(static_cast<uint64_t>(t.shape[d]));
    w.u64(static_cast<uint64_t>(t.bytes));
    w.u64(offset);
    offset = align_up(offset + static_cast<uint64_t>(t.bytes));
  }
  for (int32_t i = 0; i < n; ++i) {
    w.zeros(align_up(w.written()) - w.written());
    w.bytes(data[i], static_cast<uint64_t>(tensors[i].bytes));
  }
  uint32_t crc = w.crc();
  w.u32(crc);
  return w.flush();
}

// ---- reading ----

// Reads little-endian fields from [p, end), failing (not reading) past the end.
struct Reader {
  const uint8_t* p;
  const uint8_t* end;
  bool take(uint64_t n, const uint8_t*& at) {
    if (n > static_cast<uint64_t>(end - p)) return false;
    at = p;
    p += n;
    return true;
  }
  bool u32(uint32_t& v) {
    const uint8_t* b;
    if (!take(4, b)) return false;
    v = static_cast<uint32_t>(b[0]) | static_cast<uint32_t>(b[1]) << 8 | static_cast<uint32_t>(b[2]) << 16 |
        static_cast<uint32_t>(b[3]) << 24;
    return true;
  }
  bool u64(uint64_t& v) {
    uint32_t lo, hi;
    if (!u32(lo) || !u32(hi)) return false;
    v = lo | static_cast<uint64_t>(hi) << 32;
    return true;
  }
};

// One tensor of the table, pointing into the read file.
struct Entry {
  std::string name;  // NUL-terminated for the KilnAotTensor handed to visit
  int32_t dtype;
  int32_t rank;
  std::vector<int64_t> shape;
  uint64_t bytes;
  uint64_t offset;
};

struct FileBytes {
  void operator()(uint8_t* p) const { std::free(p); }
};

// Reads all of `path` into a 64-byte aligned buffer (so each tensor's data is naturally
// aligned for the visitor); -1 with a message on failure.
int read_file(const char* path, std::unique_ptr<uint8_t[], FileBytes>& bytes, uint64_t& size, char* err,
              size_t err_size) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(err, err_size, "cannot read weights file '%s': %s", path, std::strerror(errno));
  struct stat st;
  const char* why = fstat(fd, &st) != 0 ? std::strerror(errno) : !S_ISREG(st.st_mode) ? "not a regular file" : nullptr;
  if (why) {
    ::close(fd);
    return fail(err, err_size, "cannot read weights file '%s': %s", path, why);
  }
  size = static_cast<uint64_t>(st.st_size);
  bytes.reset(static_cast<uint8_t*>(std::aligned_alloc(kAlign, align_up(size ? size : 1))));
  if (!bytes) {
    ::close(fd);
    return fail(err, err_size, "cannot read weights file '%s': out of memory for its %llu bytes", path,
                static_cast<unsigned long long>(size));
  }
  uint64_t got = 0;
  while (got < size) {
    ssize_t r = ::read(fd, bytes.get() + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int e = r < 0 ? errno : 0;
      ::close(fd);
      return fail(err, err_size, "cannot read weights file '%s': %s", path,
                  e ? std::strerror(e) : "it became shorter while being read");
    }
    got += static_cast<uint64_t>(r);
  }
  ::close(fd);
  return 0;
}

// Parses and checks the table of a file of `size` bytes whose CRC matched; -1 with a
// message (after "weights file 'P': ") naming the problem.
int parse_table(const uint8_t* file, uint64_t size, std::vector<Entry>& entries, char* err, size_t err_size) {
  const uint64_t data_end = size - kCrcBytes;
  Reader r{file + sizeof kMagic, file + data_end};
  uint32_t count = 0, reserved = 0;
  r.u32(count);
  r.u32(reserved);
  if (reserved != 0)
    return fail(err, err_size, "unknown format variant (reserved field %u, expected 0): written by a newer kiln?",
                reserved);
  // Every entry takes at least kEntryFixedBytes: a larger count is corruption, and
  // checking it first bounds what is reserved below by the file's size.
  if (count > (data_end - kHeaderBytes) / kEntryFixedBytes)
    return fail(err, err_size, "its table claims %u tensors, more than its %llu bytes can hold", count,
                static_cast<unsigned long long>(size));
  entries.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    Entry& e = entries[i];
    uint32_t len, dtype, rank;
    const uint8_t* name;
    if (!r.u32(len) || !r.take(len, name) || !r.u32(dtype) || !r.u32(rank))
      return fail(err, err_size, "tensor %u's table entry runs past the end of the file", i);
    e.name.assign(reinterpret_cast<const char*>(name), len);
    if (e.name.find('\0') != std::string::npos)
      return fail(err, err_size, "tensor %u's name contains a NUL byte", i);
    e.dtype = static_cast<int32_t>(dtype);
    e.rank = static_cast<int32_t>(rank);
    if (dtype_size(e.dtype) == 0) return fail(err, err_size, "tensor '%s' has unknown dtype %u", e.name.c_str(), dtype);
    if (e.rank < 0 || e.rank > kMaxRank)
      return fail(err, err_size, "tensor '%s' has rank %u (at most %d)", e.name.c_str(), rank, kMaxRank);
    e.shape.resize(static_cast<size_t>(e.rank));
    for (int64_t& d : e.shape) {
      uint64_t v;
      if (!r.u64(v)) return fail(err, err_size, "tensor '%s''s table entry runs past the end of the file", e.name.c_str());
      d = static_cast<int64_t>(v);
    }
    if (!r.u64(e.bytes) || !r.u64(e.offset))
      return fail(err, err_size, "tensor '%s''s table entry runs past the end of the file", e.name.c_str());
    KilnAotTensor t{e.name.c_str(), e.dtype, e.rank, e.shape.data(), static_cast<int64_t>(e.bytes)};
    const char* why = e.bytes > INT64_MAX ? "size overflows 64 bits" : tensor_error(t);
    if (why) {
      char type[160];
      format_type(type, sizeof type, t);
      return fail(err, err_size, "tensor '%s' (%s, %llu bytes): %s", e.name.c_str(), type,
                  static_cast<unsigned long long>(e.bytes), why);
    }
  }
  // The data: in table order, each 64-byte aligned, after the table and the previous
  // tensor, inside the file. Subtractions only: no sum can overflow.
  uint64_t used = static_cast<uint64_t>(r.p - file);
  for (const Entry& e : entries) {
    if (e.offset % kAlign || e.offset < used || e.offset > data_end || e.bytes > data_end - e.offset)
      return fail(err, err_size,
                  "tensor '%s''s data (%llu bytes at offset %llu) is misplaced: not 64-byte aligned, overlapping "
                  "the table or another tensor, or past the end of the file",
                  e.name.c_str(), static_cast<unsigned long long>(e.bytes), static_cast<unsigned long long>(e.offset));
    used = e.offset + e.bytes;
  }
  std::vector<std::string_view> names;
  for (const Entry& e : entries) names.emplace_back(e.name);
  std::sort(names.begin(), names.end());
  auto dup = std::adjacent_find(names.begin(), names.end());
  if (dup != names.end())
    return fail(err, err_size, "it holds two tensors named '%.*s'", static_cast<int>(dup->size()), dup->data());
  return 0;
}

}  // namespace

extern "C" {

int kiln_weights_write(const char* path, int32_t n, const KilnAotTensor* tensors, const void* const* data, char* err,
                       size_t err_size) {
  if (!path) return fail(err, err_size, "kiln_weights_write: the path is NULL");
  if (n < 0 || (n > 0 && (!tensors || !data)))
    return fail(err, err_size, "cannot write weights file '%s': no tensors given (count %d)", path, n);
  std::string temp;
  int fd = -1;
  try {
    int32_t i = 0;
    if (const char* why = tensors_error(n, tensors, data, i))
      return fail(err, err_size, "cannot write weights file '%s': tensor %d ('%s'): %s", path, i,
                  tensors[i].name ? tensors[i].name : "", why);
    fd = open_temp(path, temp);
    if (fd < 0) return fail(err, err_size, "cannot write weights file '%s': %s", path, std::strerror(errno));
    // No fsync: the rename makes a failure in this process leave the old file or none;
    // durability across a power loss is not what a weights file needs to pay for.
    bool ok = write_contents(fd, n, tensors, data);
    int e = errno;
    if (::close(fd) != 0 && ok) ok = false, e = errno;
    fd = -1;
    if (ok && std::rename(temp.c_str(), path) != 0) ok = false, e = errno;
    if (ok) return 0;
    ::unlink(temp.c_str());
    return fail(err, err_size, "cannot write weights file '%s': %s", path, std::strerror(e));
  } catch (...) {  // std::bad_alloc: the path, the name list or the write buffer
    if (fd >= 0) ::close(fd);
    if (!temp.empty()) ::unlink(temp.c_str());
    return fail(err, err_size, "cannot write weights file '%s': out of memory", path);
  }
}

int kiln_weights_visit(const char* path, KilnWeightsVisit visit, void* ctx, char* err, size_t err_size) {
  if (!path) return fail(err, err_size, "kiln_weights_visit: the path is NULL");
  if (!visit) return fail(err, err_size, "kiln_weights_visit: the visitor is NULL");
  try {
    std::unique_ptr<uint8_t[], FileBytes> file;
    uint64_t size = 0;
    if (read_file(path, file, size, err, err_size) != 0) return -1;
    if (size < kHeaderBytes + kCrcBytes)
      return fail(err, err_size, "weights file '%s' is truncated: %llu bytes, less than any weights file (%llu)", path,
                  static_cast<unsigned long long>(size), static_cast<unsigned long long>(kHeaderBytes + kCrcBytes));
    if (std::memcmp(file.get(), kMagic, sizeof kMagic) != 0)
      return fail(err, err_size, "'%s' is not a kiln weights file (it does not start with KILNWTS1)", path);
    const uint8_t* c = file.get() + size - kCrcBytes;
    uint32_t stored = static_cast<uint32_t>(c[0]) | static_cast<uint32_t>(c[1]) << 8 |
                      static_cast<uint32_t>(c[2]) << 16 | static_cast<uint32_t>(c[3]) << 24;
    uint32_t computed = crc32_update(0, file.get(), size - kCrcBytes);
    if (stored != computed)
      return fail(err, err_size,
                  "weights file '%s' is corrupted or truncated: its checksum is 0x%08x, its contents' 0x%08x", path,
                  stored, computed);
    std::vector<Entry> entries;
    char why[kWhyBytes];
    if (parse_table(file.get(), size, entries, why, sizeof why) != 0)
      return fail(err, err_size, "weights file '%s' is invalid: %s", path, why);
    for (const Entry& e : entries) {
      KilnAotTensor t{e.name.c_str(), e.dtype, e.rank, e.shape.data(), static_cast<int64_t>(e.bytes)};
      if (int rc = visit(ctx, &t, file.get() + e.offset)) return rc;
    }
    return 0;
  } catch (const std::bad_alloc&) {  // the table's copy
    return fail(err, err_size, "cannot read weights file '%s': out of memory", path);
  } catch (...) {  // a visitor must not throw (it is a C callback); if one does, C callers still see none
    return fail(err, err_size, "internal error: reading weights file '%s': the visitor threw", path);
  }
}

}  // extern "C"
