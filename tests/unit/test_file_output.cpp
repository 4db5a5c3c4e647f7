// runtime/file_output.h: devices and FIFOs are written in place, never replaced; regular
// files are replaced whole or not at all; several outputs are written all or nothing.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "runtime/file_output.h"
#include "train/checkpoint.h"
#include "train/report.h"
#include "temp_dir.h"

using Catch::Matchers::ContainsSubstring;
using kiln::testing::TempDir;

namespace {

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void put(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

mode_t type_of(const std::string& path) {
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  return st.st_mode & S_IFMT;
}

}  // namespace

TEST_CASE("an output file replaces a regular file whole, through its symlink", "[file_output]") {
  TempDir dir;
  put(dir / "a.txt", "old");
  ::chmod((dir / "a.txt").c_str(), 0600);
  std::filesystem::create_symlink(dir / "a.txt", dir / "link");
  std::string why;
  REQUIRE(kiln::rt::write_files({{dir / "link", "new"}}, true, why));
  CHECK(read(dir / "a.txt") == "new");
  CHECK(type_of(dir / "link") == S_IFLNK);  // the link stays a link
  struct stat st {};
  REQUIRE(::stat((dir / "a.txt").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);  // and the file keeps its permissions
  CHECK(dir.files().size() == 2);      // no temporary left behind
}

TEST_CASE("an output file never replaces a device or a FIFO", "[file_output]") {
  TempDir dir;
  // A private character device with /dev/null's numbers (needs root; CI runs as root).
  const std::string node = dir / "null";
  bool have_node = ::mknod(node.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0;
  if (have_node) {
    std::string why;
    bool ok = kiln::rt::write_files({{node, "bytes"}}, false, why);
    // A filesystem mounted nodev refuses to open it: an error, but the node stays.
    if (!ok) CHECK_THAT(why, ContainsSubstring("cannot open it"));
    CHECK(type_of(node) == S_IFCHR);
    // Through a symlink too.
    std::filesystem::create_symlink(node, dir / "to-null");
    kiln::rt::OutputFile f;
    if (f.open(dir / "to-null", why)) {
      CHECK(f.in_place());
      CHECK(f.write("x", why));
      CHECK(f.commit(true, why));
    }
    CHECK(type_of(node) == S_IFCHR);
    CHECK(type_of(dir / "to-null") == S_IFLNK);
  } else {
    WARN("mknod needs root: the device case is checked with a FIFO only");
  }
  // A FIFO with a reader: written in place.
  const std::string fifo = dir / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  int rd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  REQUIRE(rd >= 0);
  std::string why;
  CHECK(kiln::rt::write_files({{fifo, "through"}}, true, why));
  char buf[16] = {};
  CHECK(::read(rd, buf, sizeof buf) == 7);
  ::close(rd);
  CHECK(std::string(buf) == "through");
  CHECK(type_of(fifo) == S_IFIFO);
}

TEST_CASE("several outputs are written all or nothing", "[file_output]") {
  TempDir dir;
  put(dir / "keep.o", "object");
  std::filesystem::create_directory(dir / "sub");
  std::string why;
  // A folder as the second output: nothing is written, the first file is as it was.
  CHECK_FALSE(kiln::rt::write_files({{dir / "keep.o", "new object"}, {dir / "sub", "header"}}, false, why));
  CHECK_THAT(why, ContainsSubstring("is a folder"));
  CHECK(read(dir / "keep.o") == "object");
  // A folder that cannot be written in: the same.
  CHECK_FALSE(kiln::rt::write_files({{dir / "keep.o", "new"}, {dir / "missing/h.h", "header"}}, false, why));
  CHECK_THAT(why, ContainsSubstring("its folder '" + dir / "missing" + "' does not exist"));
  CHECK(read(dir / "keep.o") == "object");
  CHECK(dir.files().size() == 2);
}

TEST_CASE("two outputs naming one file are refused", "[file_output]") {
  TempDir dir;
  put(dir / "same.o", "object");
  std::string why;
  CHECK_FALSE(kiln::rt::write_files({{dir / "same.o", "a"}, {dir / "same.o", "b"}}, false, why));
  CHECK_THAT(why, ContainsSubstring("named for two outputs"));
  // Spelled differently, or through a symlink, and for files that do not exist yet.
  std::filesystem::create_symlink(dir / "same.o", dir / "alias.o");
  CHECK_FALSE(kiln::rt::write_files({{dir / "same.o", "a"}, {dir / "alias.o", "b"}}, false, why));
  CHECK_THAT(why, ContainsSubstring("are the same file"));
  CHECK_FALSE(kiln::rt::write_files({{dir / "new.h", "a"}, {dir / "sub/../new.h", "b"}}, false, why));
  std::filesystem::create_directory(dir / "sub");
  CHECK_FALSE(kiln::rt::write_files({{dir / "new.h", "a"}, {dir / "sub/../new.h", "b"}}, false, why));
  CHECK(read(dir / "same.o") == "object");
  CHECK_FALSE(kiln::rt::same_file(dir / "x.h", dir / "x.o"));
}

TEST_CASE("an output file through a dangling symlink creates the file it names", "[file_output]") {
  TempDir dir;
  std::filesystem::create_symlink("real.txt", dir / "link");
  std::string why;
  REQUIRE(kiln::rt::write_files({{dir / "link", "made"}}, false, why));
  CHECK(type_of(dir / "link") == S_IFLNK);
  CHECK(read(dir / "real.txt") == "made");
  // It is the same file as its target, before and after it exists.
  std::filesystem::create_symlink("later.txt", dir / "link2");
  CHECK(kiln::rt::same_file(dir / "link2", dir / "later.txt"));
  CHECK_FALSE(kiln::rt::write_files({{dir / "later.txt", "a"}, {dir / "link2", "b"}}, false, why));
  CHECK_THAT(why, ContainsSubstring("are the same file"));
}

TEST_CASE("an output file refuses what open(2) would: a read-only file, a folder's path", "[file_output]") {
  TempDir dir;
  std::string why;
  CHECK_FALSE(kiln::rt::write_files({{dir / "new/", "x"}}, false, why));
  CHECK_THAT(why, ContainsSubstring("ends in '/'"));
  CHECK_FALSE(kiln::rt::write_files({{"", "x"}}, false, why));
  CHECK_THAT(why, ContainsSubstring("empty"));
  put(dir / "ro.txt", "keep");
  ::chmod((dir / "ro.txt").c_str(), 0444);
  if (::geteuid() != 0) {  // root may write anything
    CHECK_FALSE(kiln::rt::write_files({{dir / "ro.txt", "new"}}, false, why));
    CHECK_THAT(why, ContainsSubstring("Permission denied"));
    CHECK(read(dir / "ro.txt") == "keep");
  }
  // A name near NAME_MAX still gets a temporary file.
  const std::string longest = dir / std::string(255, 'n');
  CHECK(kiln::rt::write_files({{longest, "long"}}, false, why));
  CHECK(read(longest) == "long");
}

TEST_CASE("a streamed output file writes a regular file directly and a device in place", "[file_output]") {
  TempDir dir;
  using Mode = kiln::rt::OutputFile::Mode;
  std::string why;
  put(dir / "m.csv", "old rows\n");
  {
    kiln::rt::OutputFile f;
    REQUIRE(f.open(dir / "m.csv", why, Mode::Append));
    CHECK(f.had_bytes());
    CHECK_FALSE(f.in_place());
    REQUIRE(f.write("row 1\n", why));
    CHECK(read(dir / "m.csv") == "old rows\nrow 1\n");  // visible before the file is closed
  }
  {
    kiln::rt::OutputFile f;
    REQUIRE(f.open(dir / "m.csv", why, Mode::Truncate));
    REQUIRE(f.write("fresh\n", why));
    CHECK(f.commit(false, why));
  }
  CHECK(read(dir / "m.csv") == "fresh\n");
  const std::string node = dir / "null";
  if (::mknod(node.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0) {
    kiln::rt::OutputFile f;
    if (f.open(node, why, Mode::Truncate)) {
      CHECK(f.in_place());
      CHECK(f.write("row\n", why));
    }
    CHECK(type_of(node) == S_IFCHR);
  }
  CHECK(dir.files().size() == 1 + (std::filesystem::exists(node) ? 1 : 0));
}

TEST_CASE("checkpoints, plots and metrics write a device in place", "[file_output][checkpoint]") {
  TempDir dir;
  const std::string node = dir / "null";
  if (::mknod(node.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0) SKIP("mknod needs root (CI runs as root)");
  int fd = ::open(node.c_str(), O_WRONLY);
  if (fd < 0) SKIP("the temporary folder is on a nodev mount");
  ::close(fd);
  kiln::save_state(node, {{"w", kiln::Tensor(kiln::DType::f32, {2})}}, {{"k", "v"}});
  CHECK(type_of(node) == S_IFCHR);
  kiln::write_file_atomic(node, "bytes");
  CHECK(type_of(node) == S_IFCHR);
  kiln::write_plot(node, {}, "title");
  CHECK(type_of(node) == S_IFCHR);
  {
    kiln::MetricsCsv csv(node, 1, /*append=*/true);
  }
  CHECK(type_of(node) == S_IFCHR);
}
