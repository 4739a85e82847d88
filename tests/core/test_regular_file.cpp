// core/regular_file.h, the one way kiln's readers open user files: a FIFO, a directory or a
// device is refused at once (a FIFO used to block open() forever), a missing file is named,
// a size bound is checked before allocating, and reads return every byte or fail.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/disk_cache.h"
#include "core/fifo_testing.h"
#include "core/regular_file.h"
#include "testing.h"

using namespace kiln;

namespace {

// A private scratch folder, removed with its contents.
struct TempDir {
  disk_cache::ScratchDir scratch{"test"};
  const std::filesystem::path& path = scratch.path();
};

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

}  // namespace

TEST_CASE("RegularFile refuses a FIFO without blocking, naming it", "[core][files]") {
  TempDir dir;
  testing::Fifo fifo(dir.path / "checkpoint.fifo");
  CHECK_THROWS_WITH(RegularFile(fifo.path(), "reader"),
                    Catch::StartsWith("reader: ") && Catch::Contains(fifo.path().string()) &&
                        Catch::Contains("not a regular file (a FIFO)"));
  CHECK_THROWS_WITH(read_regular_file(fifo.path(), "reader", 100), Catch::Contains("a FIFO"));
  // Through a symbolic link too.
  const std::filesystem::path link = dir.path / "link";
  std::filesystem::create_symlink(fifo.path(), link);
  CHECK_THROWS_WITH(RegularFile(link, "reader"),
                    Catch::Contains(link.string()) && Catch::Contains("a FIFO"));
}

TEST_CASE("RegularFile refuses directories and devices and names a missing file", "[core][files]") {
  TempDir dir;
  CHECK_THROWS_WITH(RegularFile(dir.path, "reader"),
                    Catch::Contains("not a regular file (a directory)"));
  CHECK_THROWS_WITH(RegularFile("/dev/null", "reader"),
                    Catch::Contains("/dev/null is not a regular file (a character device)"));
  const std::filesystem::path missing = dir.path / "missing.bin";
  CHECK_THROWS_WITH(RegularFile(missing, "reader"),
                    Catch::Contains("reader: cannot open " + missing.string()) &&
                        Catch::Contains("No such file or directory"));
}

TEST_CASE("read_regular_file reads the whole file within its bound", "[core][files]") {
  TempDir dir;
  const std::filesystem::path path = dir.path / "data.bin";
  write_text(path, std::string("a\0b", 3));
  CHECK(read_regular_file(path, "reader", 3) == std::string("a\0b", 3));
  CHECK_THROWS_WITH(read_regular_file(path, "reader", 2),
                    Catch::Contains(path.string() + " holds 3 bytes, more than the 2 bytes"));
  write_text(path, "");
  CHECK(read_regular_file(path, "reader", 0).empty());
}

TEST_CASE("RegularFile::read_at reads exact ranges and names a short file", "[core][files]") {
  TempDir dir;
  const std::filesystem::path path = dir.path / "data.bin";
  write_text(path, "0123456789");
  const RegularFile file(path, "reader");
  CHECK(file.size() == 10);
  char out[4] = {};
  file.read_at(out, 4, 3);
  CHECK(std::string(out, 4) == "3456");
  CHECK_THROWS_WITH(
      file.read_at(out, 4, 8),
      Catch::Contains(path.string() + " ended at byte 10, 2 bytes into a read of 4 at byte 8"));
}
