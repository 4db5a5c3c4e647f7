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
