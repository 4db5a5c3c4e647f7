// Fuzz target: the output files of runtime/file_output.h (write_files, same_file,
// check_output_paths), on fuzzed trees and path sets inside a private temporary folder.
//
// The input builds a small tree (regular and read-only files, folders, relative symlinks,
// dangling or not, FIFOs, and as root character devices with /dev/null's numbers), then
// names 1 to 4 outputs with paths made of those names, ".", ".." and a trailing '/', and
// writes them. Paths never climb above the folder ("..", also through symlinks, whose
// targets hold no ".."), so nothing outside it is ever written. Checked:
// - same_file is symmetric, and a path is the same file as itself;
// - write_files fails exactly when check_output_paths does, or later with a reason, and then
//   no file, link or folder changed and no temporary file is left;
// - on success every output reads back its bytes (a FIFO's reader gets the bytes of each
//   output naming it, in order), a device or FIFO is still one, a symlink is still a
//   symlink, a replaced file keeps its permissions, nothing not named changed, and no
//   temporary file is left.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "runtime/file_output.h"

namespace fs = std::filesystem;

namespace {

[[noreturn]] void bug(const std::string& what) {
  std::fprintf(stderr, "fuzz: %s\n", what.c_str());
  std::abort();
}

// The private folder, made once and removed at exit; every input starts from it empty.
// (Never destroyed: the exit handler that removes it runs after static destructors.)
const std::string& root() {
  static const std::string& dir = *new std::string([] {
    std::string templ = (fs::temp_directory_path() / "kiln_fuzz_outputs_XXXXXX").string();
    if (!::mkdtemp(templ.data())) bug("mkdtemp failed");
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(root(), ec);
    });
    return fs::canonical(templ).string();
  }());
  return dir;
}

struct Input {
  const uint8_t* p;
  size_t left;
  unsigned next() {
    if (left == 0) return 0;
    --left;
    return *p++;
  }
};

constexpr const char* kNames[] = {"a", "b", "c", "d", "e"};

// A path of 1 or 2 names ("d/a"): where an entry is made, or a symlink's target.
std::string name_path(Input& in) {
  std::string p = kNames[in.next() % 5];
  if (in.next() % 3 == 0) p += std::string("/") + kNames[in.next() % 5];
  return p;
}

// An output's path: 1 to 3 parts of names, "." and "..", never above the folder; sometimes
// a trailing '/'.
std::string output_path(Input& in) {
  std::string p;
  int depth = 0;
  const unsigned parts = 1 + in.next() % 3;
  for (unsigned i = 0; i < parts; ++i) {
    unsigned k = in.next() % 8;
    std::string part = k < 5 ? kNames[k] : k == 5 ? "." : depth > 0 ? ".." : "a";
    depth += part == ".." ? -1 : part == "." ? 0 : 1;
    p += (p.empty() ? "" : "/") + part;
  }
  if (in.next() % 16 == 0) p += "/";
  return p;
}

struct Entry {
  char type;  // 'f' regular, 'd' folder, 'l' symlink, 'p' FIFO, 'c' device, '?' other
  std::string text;  // a regular file's bytes, a link's target
  mode_t mode = 0;
  bool operator==(const Entry&) const = default;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Every entry under the folder, by relative path, without following symlinks.
std::map<std::string, Entry> snapshot() {
  std::map<std::string, Entry> out;
  for (auto it = fs::recursive_directory_iterator(root()); it != fs::recursive_directory_iterator(); ++it) {
    const std::string path = it->path().string();
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) bug("lstat failed on " + path);
    Entry e;
    e.mode = st.st_mode & 07777;
    if (S_ISREG(st.st_mode)) e.type = 'f', e.text = slurp(path);
    else if (S_ISDIR(st.st_mode)) e.type = 'd';
    else if (S_ISLNK(st.st_mode)) e.type = 'l', e.text = fs::read_symlink(path).string(), e.mode = 0;
    else if (S_ISFIFO(st.st_mode)) e.type = 'p';
    else if (S_ISCHR(st.st_mode)) e.type = 'c';
    else e.type = '?';
    out.emplace(path.substr(root().size() + 1), e);
  }
  return out;
}

void check_no_temporaries(const std::map<std::string, Entry>& tree) {
  for (const auto& [path, e] : tree)
    if (path.find(".tmp.") != std::string::npos) bug("a temporary file was left behind: " + path);
}

std::string resolved(const std::string& path) {
  std::error_code ec;
  std::string r = fs::canonical(path, ec).string();
  return ec ? std::string() : r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root())) fs::remove_all(e.path(), ec);

  // The tree.
  std::vector<int> readers;  // one per FIFO, so that opening one for writing never waits
  std::map<ino_t, int> reader_of;
  const unsigned entries = in.next() % 8;
  for (unsigned i = 0; i < entries; ++i) {
    const std::string rel = name_path(in);
    const std::string path = root() + "/" + rel;
    fs::create_directories(fs::path(path).parent_path(), ec);
    const unsigned kind = in.next() % 6;
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0) continue;  // made already
    if (kind == 0 || kind == 5) {
      std::ofstream(path, std::ios::binary) << "old " << rel;
      if (kind == 5) ::chmod(path.c_str(), 0444);
    } else if (kind == 1) {
      fs::create_directory(path, ec);
    } else if (kind == 2) {
      fs::create_symlink(name_path(in), path, ec);  // relative, no "..": it stays inside
    } else if (kind == 3) {
      if (::mkfifo(path.c_str(), 0600) == 0) {
        int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK);
        struct stat st {};
        if (fd < 0 || ::fstat(fd, &st) != 0) bug("cannot open the FIFO just made");
        readers.push_back(fd);
        reader_of[st.st_ino] = fd;
      }
    } else {
      (void)::mknod(path.c_str(), S_IFCHR | 0666, makedev(1, 3));  // root only
    }
  }

  // The outputs, their bytes, and what each names now.
  std::vector<std::string> paths;
  std::vector<std::string> contents;
  const unsigned outputs = 1 + in.next() % 4;
  for (unsigned i = 0; i < outputs; ++i) {
    paths.push_back(root() + "/" + output_path(in));
    contents.push_back("output " + std::to_string(i) + std::string(in.next() % 3, 'x'));
  }
  for (const std::string& a : paths) {
    if (!kiln::rt::same_file(a, a)) bug("'" + a + "' is not the same file as itself");
    for (const std::string& b : paths)
      if (kiln::rt::same_file(a, b) != kiln::rt::same_file(b, a)) bug("same_file is not symmetric: " + a + ", " + b);
  }
  std::vector<struct stat> before(paths.size());
  std::vector<bool> existed(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) existed[i] = ::stat(paths[i].c_str(), &before[i]) == 0;
  std::vector<bool> was_link(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) {
    struct stat st {};
    std::string p = paths[i];
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    was_link[i] = ::lstat(p.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
  }
  const std::map<std::string, Entry> tree = snapshot();

  std::vector<kiln::rt::OutputBytes> files;
  for (size_t i = 0; i < paths.size(); ++i) files.emplace_back(paths[i], contents[i]);
  std::string precheck, why;
  const bool checked = kiln::rt::check_output_paths(paths, precheck);
  const bool wrote = kiln::rt::write_files(files, false, why);

  // What each FIFO received.
  std::map<int, std::string> received;
  for (int fd : readers) {
    char buf[4096];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) received[fd].append(buf, static_cast<size_t>(n));
    ::close(fd);
  }
  const std::map<std::string, Entry> after = snapshot();
  check_no_temporaries(after);

  if (!checked && wrote) bug("write_files wrote what check_output_paths refuses: " + precheck);
  if (!checked && why != precheck) bug("write_files says '" + why + "', check_output_paths '" + precheck + "'");
  if (!wrote) {
    if (why.empty()) bug("write_files failed without a reason");
    if (after != tree) bug("write_files failed ('" + why + "') but changed the tree");
    for (const auto& [fd, bytes] : received)
      if (!checked && !bytes.empty()) bug("a FIFO got '" + bytes + "' though the paths were refused: " + why);
    return 0;
  }

  // Success: each output holds its bytes, and only the outputs changed.
  std::set<std::string> written;  // the outputs' resolved destinations
  std::map<int, std::string> expected;
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string dest = resolved(paths[i]);
    if (dest.empty() || dest.compare(0, root().size() + 1, root() + "/") != 0)
      bug("output '" + paths[i] + "' was written outside the folder: '" + dest + "'");
    written.insert(dest);
    struct stat st {};
    if (::stat(paths[i].c_str(), &st) != 0) bug("output '" + paths[i] + "' does not exist after writing");
    const bool in_place = existed[i] && !S_ISREG(before[i].st_mode);
    if (in_place) {
      if ((st.st_mode & S_IFMT) != (before[i].st_mode & S_IFMT)) bug("output '" + paths[i] + "' changed its kind");
      if (S_ISFIFO(st.st_mode)) expected[reader_of.at(st.st_ino)] += contents[i];
      continue;
    }
    if (!S_ISREG(st.st_mode)) bug("output '" + paths[i] + "' is not a regular file after writing");
    if (slurp(paths[i]) != contents[i]) bug("output '" + paths[i] + "' does not hold its bytes");
    if (existed[i] && (st.st_mode & 07777) != (before[i].st_mode & 07777))
      bug("output '" + paths[i] + "' lost its permissions");
    struct stat lst {};
    std::string p = paths[i];
    if (was_link[i] && (::lstat(p.c_str(), &lst) != 0 || !S_ISLNK(lst.st_mode)))
      bug("output '" + paths[i] + "' was a symlink and is not one any more");
  }
  for (const auto& [fd, bytes] : received)
    if (bytes != expected[fd]) bug("a FIFO got '" + bytes + "', not '" + expected[fd] + "'");
  for (const auto& [rel, e] : after) {
    const std::string full = root() + "/" + rel;
    auto old = tree.find(rel);
    if (written.count(full)) continue;
    if (old == tree.end()) bug("'" + rel + "' appeared, though no output names it");
    if (!(old->second == e)) bug("'" + rel + "' changed, though no output names it");
  }
  for (const auto& [rel, e] : tree)
    if (!after.count(rel)) bug("'" + rel + "' disappeared");
  return 0;
}
