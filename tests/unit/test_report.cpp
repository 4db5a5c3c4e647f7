// What a training run shows and leaves behind (train/report.h): the progress bar and epoch
// lines, the metrics CSV, and the SVG plot, which is also rendered to PNG with rsvg-convert
// (Debian's librsvg2-bin) and checked pixel by pixel.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "error_of.h"
#include "subprocess.h"
#include "temp_dir.h"
#include "train/report.h"

using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::StartsWith;
using kiln::testing::TempDir;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Everything written to a FILE* that is not a terminal.
std::string written(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  return s;
}

kiln::StepInfo step(int64_t index, int64_t batches, double seconds) {
  return {.epoch = 1, .batch_index = index, .batches = batches, .global_step = 938 + index + 1, .samples = 64,
          .loss = 0.41234, .accuracy = 0.8, .lr = 0.05, .seconds = seconds};
}

kiln::EpochMetrics epoch(int64_t e, double loss, double acc, std::optional<kiln::EvalMetrics> test) {
  return {.epoch = e, .train_loss = loss, .train_accuracy = acc, .test = test, .lr = 0.05, .steps = 938,
          .samples = 60000, .seconds = 5.5, .samples_per_second = 10909.1};
}

std::vector<kiln::EpochMetrics> three_epochs() {
  return {epoch(1, 0.62, 0.78, kiln::EvalMetrics{.loss = 0.48, .accuracy = 0.83}),
          epoch(2, 0.41, 0.85, kiln::EvalMetrics{.loss = 0.40, .accuracy = 0.86}),
          epoch(3, 0.36, 0.87, kiln::EvalMetrics{.loss = 0.37, .accuracy = 0.875})};
}

// A rough well-formedness check: every element is closed in order, attributes are quoted,
// and no number came out as nan or inf.
void check_well_formed(const std::string& svg) {
  REQUIRE_THAT(svg, StartsWith("<?xml"));
  std::vector<std::string> open;
  size_t elements = 0;
  for (size_t i = svg.find('<'); i != std::string::npos; i = svg.find('<', i + 1)) {
    const size_t end = svg.find('>', i);
    REQUIRE(end != std::string::npos);
    const std::string tag = svg.substr(i + 1, end - i - 1);
    REQUIRE(std::count(tag.begin(), tag.end(), '"') % 2 == 0);
    if (tag[0] == '?') continue;
    if (tag[0] == '/') {
      REQUIRE_FALSE(open.empty());
      CHECK(tag.substr(1) == open.back());
      open.pop_back();
      continue;
    }
    ++elements;
    if (tag.back() != '/') open.push_back(tag.substr(0, tag.find_first_of(" \n")));
  }
  CHECK(open.empty());
  CHECK(elements > 20);
  CHECK(svg.find("nan") == std::string::npos);
  CHECK(svg.find("inf") == std::string::npos);
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
  return n;
}

uint32_t be32(const std::string& s, size_t at) {
  return uint32_t(uint8_t(s[at])) << 24 | uint32_t(uint8_t(s[at + 1])) << 16 | uint32_t(uint8_t(s[at + 2])) << 8 |
         uint32_t(uint8_t(s[at + 3]));
}

// An 8-bit RGB or RGBA, non-interlaced PNG (what rsvg-convert writes) as its pixels, row by row.
struct Png {
  uint32_t width = 0, height = 0;
  size_t channels = 4;
  std::vector<uint8_t> rgba;  // `channels` bytes a pixel
};
Png decode_png(const std::string& file) {
  REQUIRE(file.size() > 33);
  REQUIRE(file.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
  Png png{be32(file, 16), be32(file, 20), 4, {}};
  REQUIRE(uint8_t(file[24]) == 8);  // bit depth
  REQUIRE((uint8_t(file[25]) == 6 || uint8_t(file[25]) == 2));  // RGBA or RGB
  png.channels = uint8_t(file[25]) == 6 ? 4 : 3;
  REQUIRE(uint8_t(file[28]) == 0);  // not interlaced
  std::string idat;
  for (size_t at = 8; at + 8 <= file.size();) {
    const uint32_t len = be32(file, at);
    if (file.compare(at + 4, 4, "IDAT") == 0) idat += file.substr(at + 8, len);
    at += 12 + len;
  }
  const size_t stride = size_t(png.width) * png.channels, bpp = png.channels;
  std::vector<uint8_t> raw((stride + 1) * png.height);
  uLongf raw_len = raw.size();
  REQUIRE(uncompress(raw.data(), &raw_len, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) == Z_OK);
  REQUIRE(raw_len == raw.size());
  png.rgba.resize(stride * png.height);
  for (size_t y = 0; y < png.height; ++y) {
    const uint8_t filter = raw[y * (stride + 1)];
    const uint8_t* in = &raw[y * (stride + 1) + 1];
    uint8_t* out = &png.rgba[y * stride];
    const uint8_t* up = y ? out - stride : nullptr;
    for (size_t x = 0; x < stride; ++x) {
      const int a = x >= bpp ? out[x - bpp] : 0, b = up ? up[x] : 0, c = up && x >= bpp ? up[x - bpp] : 0;
      int pred = 0;
      switch (filter) {
        case 0: pred = 0; break;
        case 1: pred = a; break;
        case 2: pred = b; break;
        case 3: pred = (a + b) / 2; break;
        case 4: {
          const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
          pred = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
          break;
        }
        default: FAIL("PNG filter " << int(filter));
      }
      out[x] = uint8_t(in[x] + pred);
    }
  }
  return png;
}

// Pixels within `tolerance` of the colour #rrggbb.
size_t pixels_near(const Png& png, uint32_t rgb, int tolerance = 40) {
  size_t n = 0;
  for (size_t i = 0; i + 2 < png.rgba.size(); i += png.channels) {
    const int r = png.rgba[i], g = png.rgba[i + 1], b = png.rgba[i + 2];
    if (std::abs(r - int(rgb >> 16)) + std::abs(g - int(rgb >> 8 & 255)) + std::abs(b - int(rgb & 255)) <= tolerance)
      ++n;
  }
  return n;
}

}  // namespace

TEST_CASE("the progress bar line shows steps, loss, speed and ETA within the width", "[report]") {
  const std::string line = kiln::Progress::bar_line(step(411, 938, 4.0), 3);
  CHECK_THAT(line, StartsWith("epoch 2/3 ["));
  CHECK_THAT(line, ContainsSubstring("] 412/938  loss 0.4123  6592 samples/s  ETA 0:05"));
  CHECK(line.size() <= 80);
  CHECK(count(line, "=") == 412 * (line.find(']') - line.find('[') - 1) / 938);
  // The last step: a full bar, nothing left.
  const std::string done = kiln::Progress::bar_line(step(937, 938, 9.0), 3);
  CHECK_THAT(done, ContainsSubstring("=] 938/938"));
  CHECK_THAT(done, ContainsSubstring("ETA 0:00"));
  CHECK_THAT(kiln::Progress::bar_line(step(0, 938, 0.0), 3), ContainsSubstring("[>"));
  // A last partial batch: the rate counts the examples seen, not steps times this batch.
  kiln::StepInfo last = step(937, 938, 9.0);
  last.samples = 32;
  CHECK_THAT(kiln::Progress::bar_line(last, 3, 80, 937 * 64 + 32), ContainsSubstring("  6667 samples/s"));
}

TEST_CASE("the epoch line has train and test metrics, and leaves out what a model lacks", "[report]") {
  CHECK(kiln::Progress::epoch_line(three_epochs()[1], 3) ==
        "epoch 2/3  train loss 0.4100 accuracy 85.00%  test loss 0.4000 accuracy 86.00%  5.5 s  10909 samples/s");
  CHECK(kiln::Progress::epoch_line(epoch(1, 0.5, NAN, std::nullopt), 1) ==
        "epoch 1/1  train loss 0.5000  5.5 s  10909 samples/s");
}

TEST_CASE("progress off a terminal is one line per epoch; quiet is nothing", "[report]") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  {
    kiln::Progress p(f, 3);
    for (int64_t i = 0; i < 938; ++i) p.on_step(step(i, 938, 0.01 * double(i)));
    p.on_epoch(three_epochs()[1]);
  }
  CHECK(written(f) == kiln::Progress::epoch_line(three_epochs()[1], 3) + "\n");
  std::fclose(f);

  std::FILE* q = std::tmpfile();
  kiln::Progress quiet(q, 3, /*quiet=*/true);
  quiet.on_step(step(937, 938, 1));
  quiet.on_epoch(three_epochs()[1]);
  CHECK(written(q).empty());
  std::fclose(q);
}

TEST_CASE("on a terminal the bar is redrawn in place, at most ~10 times a second", "[report]") {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  REQUIRE(master >= 0);
  REQUIRE(::grantpt(master) == 0);
  REQUIRE(::unlockpt(master) == 0);
  std::FILE* tty = std::fopen(::ptsname(master), "w");
  REQUIRE(tty);
  REQUIRE(::isatty(::fileno(tty)));
  {
    kiln::Progress p(tty, 3);
    for (int64_t i = 0; i < 938; ++i) p.on_step(step(i, 938, 0.001 * double(i)));  // far faster than 10 Hz
    p.on_epoch(three_epochs()[1]);
  }
  std::fclose(tty);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(master, buf, sizeof buf)) > 0;) {
    out.append(buf, size_t(n));
    if (out.find("samples/s\r\n") != std::string::npos || out.find("samples/s\n") != std::string::npos) break;
  }
  ::close(master);
  const size_t draws = count(out, "\r" + std::string("epoch 2/3 ["));
  CHECK(draws >= 2);   // the first step and the last
  CHECK(draws <= 20);  // not one per step
  CHECK_THAT(out, ContainsSubstring("938/938"));
  CHECK_THAT(out, ContainsSubstring("\x1b[K"));
  CHECK_THAT(out, ContainsSubstring("\r\x1b[K" + kiln::Progress::epoch_line(three_epochs()[1], 3)));
}

TEST_CASE("the metrics CSV has a row per epoch, step rows every N steps, empty fields for what is missing",
          "[report]") {
  TempDir dir;
  const std::string path = dir / "m.csv";
  {
    kiln::MetricsCsv csv(path, /*every_steps=*/2);
    CHECK(read_text(path) ==
          "kind,epoch,step,train_loss,train_accuracy,test_loss,test_accuracy,lr,samples,seconds,samples_per_second\n");
    for (int64_t i = 0; i < 3; ++i) {
      kiln::StepInfo s{.epoch = 0, .batch_index = i, .batches = 3, .global_step = i + 1, .samples = 10,
                       .loss = 1.0 + double(i), .accuracy = 0.5, .lr = 0.1, .seconds = double(i + 1)};
      csv.on_step(s);
      if (i == 1) CHECK_THAT(read_text(path), ContainsSubstring("\nstep,1,2,1.5,0.5,,,0.1,20,2,10\n"));  // flushed
    }
    csv.on_epoch(epoch(1, 2.0, 0.5, std::nullopt));
    csv.on_epoch(epoch(2, 0.25, NAN, kiln::EvalMetrics{.loss = 0.5, .accuracy = 0.75}));
  }
  const std::string text = read_text(path);
  CHECK_THAT(text, ContainsSubstring("\nepoch,1,3,2,0.5,,,0.05,60000,5.5,10909.1\n"));
  CHECK_THAT(text, ContainsSubstring("\nepoch,2,3,0.25,,0.5,0.75,0.05,60000,5.5,10909.1\n"));
  CHECK(count(text, "\n") == 4);  // the header, one step row, two epoch rows

  {  // appending (a resumed run) keeps the rows and writes no second header
    kiln::MetricsCsv more(path, 0, /*append=*/true);
    more.on_epoch(three_epochs()[2]);
  }
  CHECK(count(read_text(path), "kind,") == 1);
  CHECK(count(read_text(path), "\nepoch,") == 3);

  CHECK(kiln::testing::error_of([&] { kiln::MetricsCsv bad(dir / "no/such/dir/m.csv"); }) ==
        "cannot write '" + dir / "no/such/dir/m.csv" + "': its folder '" + dir / "no/such/dir" + "' does not exist");
}

TEST_CASE("the SVG plot is well formed, with two panels, both series, ticks and a legend", "[report]") {
  const std::string svg = kiln::plot_svg(three_epochs(), "lenet on fashion-mnist <sgd>");
  check_well_formed(svg);
  CHECK_THAT(svg, ContainsSubstring("lenet on fashion-mnist &lt;sgd&gt;"));
  CHECK_THAT(svg, ContainsSubstring(">accuracy (%)</text>"));
  CHECK(count(svg, ">epoch</text>") == 2);
  CHECK(count(svg, "<polyline") == 4);            // train and test in each panel
  CHECK(count(svg, "<circle") == 3 * 2 + 1);      // train markers and the legend's
  CHECK(count(svg, "<rect x=") == 3 * 2 + 1 + 2); // test markers, the legend's, the two frames
  CHECK_THAT(svg, ContainsSubstring(">train</text>"));
  CHECK_THAT(svg, ContainsSubstring(">test</text>"));
  // Nice ticks: the epochs as whole numbers, the accuracy axis within [0, 100].
  for (const char* t : {">1</text>", ">2</text>", ">3</text>", ">78</text>", ">88</text>", ">0.3</text>", ">0.7</text>"})
    CHECK_THAT(svg, ContainsSubstring(t));
  CHECK(svg.find(">1.5</text>") == std::string::npos);

  // One epoch, no test data, a NaN loss: still a picture, with nothing invalid in it.
  const std::string one = kiln::plot_svg({epoch(1, 0.7, 0.75, std::nullopt)}, "one");
  check_well_formed(one);
  CHECK(count(one, "<circle") == 2 + 1);
  CHECK(count(one, "<polyline") == 0);  // a single point is a marker, not a line
  const std::string gaps = kiln::plot_svg({epoch(1, NAN, NAN, std::nullopt), epoch(2, 0.5, 0.8, std::nullopt)}, "");
  check_well_formed(gaps);
  const std::string none = kiln::plot_svg({epoch(1, NAN, NAN, std::nullopt)}, "");
  check_well_formed(none);
  CHECK(count(none, ">no data</text>") == 2);
  check_well_formed(kiln::plot_svg({}, "empty"));
}

TEST_CASE("write_plot replaces the file whole and reports where it cannot write", "[report]") {
  TempDir dir;
  kiln::write_plot(dir / "p.svg", three_epochs(), "t");
  CHECK(read_text(dir / "p.svg") == kiln::plot_svg(three_epochs(), "t"));
  CHECK(dir.files() == std::vector<std::string>{"p.svg"});
  CHECK_THAT(kiln::testing::error_of([&] { kiln::write_plot(dir / "no/p.svg", three_epochs(), "t"); }),
             StartsWith("cannot write '" + dir / "no/p.svg" + "': "));
}

TEST_CASE("the SVG plot renders with rsvg-convert to a picture with both curves", "[report]") {
  if (run_shell("command -v rsvg-convert").status != 0)
    SKIP("rsvg-convert is not installed (Debian package librsvg2-bin; scripts/setup.sh installs it)");
  TempDir dir;
  kiln::write_plot(dir / "p.svg", three_epochs(), "lenet on fashion-mnist");
  RunResult r = run_shell("rsvg-convert -o '" + dir / "p.png" + "' '" + dir / "p.svg" + "'");
  INFO(r.output);
  REQUIRE(r.status == 0);
  const Png png = decode_png(read_text(dir / "p.png"));
  CHECK(png.width == 960);
  CHECK(png.height == 420);
  const size_t total = size_t(png.width) * png.height;
  CHECK(pixels_near(png, 0xffffff, 0) > total / 2);  // a white background
  CHECK(pixels_near(png, 0x1f77b4) > 300);           // the train curves
  CHECK(pixels_near(png, 0xd95f02) > 200);           // the test curves
  CHECK(pixels_near(png, 0x000000, 160) > 2000);     // text and axes
}

TEST_CASE("the metrics CSV writes f32 metrics as the shortest text of the f32", "[report]") {
  TempDir dir;
  const std::string path = dir / "m.csv";
  // What the trainer reports: f32 values, and example-weighted means of them in double.
  const double accuracy = static_cast<double>(0.8213f), loss = static_cast<double>(0.4123f);
  {
    kiln::MetricsCsv csv(path, /*every_steps=*/1);
    csv.on_step({.epoch = 0, .batch_index = 0, .batches = 1, .global_step = 1, .samples = 10, .loss = loss,
                 .accuracy = accuracy, .lr = 0.05, .seconds = 2});
    csv.on_epoch(epoch(1, loss, accuracy, kiln::EvalMetrics{.loss = loss, .accuracy = (7.0 * 0.8f + 3.0 * 0.9f) / 10.0}));
  }
  const std::string text = read_text(path);
  CHECK_THAT(text, ContainsSubstring("\nstep,1,1,0.4123,0.8213,,,0.05,10,2,5\n"));
  CHECK_THAT(text, ContainsSubstring("\nepoch,1,1,0.4123,0.8213,0.4123,0.83,0.05,60000,5.5,10909.1\n"));
  CHECK(text.find("0.8212999") == std::string::npos);
}

TEST_CASE("the plot's train curves go through the step points; the markers stay at the epochs", "[report]") {
  // Every 2 steps of 4 an epoch: the running means at 0.5 and 1 epoch, 1.5 and 2.
  kiln::StepMeans means(2);
  std::vector<kiln::StepPoint> points;
  for (int64_t e = 0; e < 2; ++e) {
    for (int64_t i = 0; i < 4; ++i) {
      kiln::StepInfo s{.epoch = e, .batch_index = i, .batches = 4, .global_step = e * 4 + i + 1, .samples = 8,
                       .loss = 1.0 - 0.1 * double(e * 4 + i), .accuracy = 0.5, .lr = 0.1, .seconds = 1};
      if (std::optional<kiln::StepPoint> p = means.on_step(s)) points.push_back(*p);
    }
    means.on_epoch();
  }
  REQUIRE(points.size() == 4);
  CHECK(points[0].at == 0.5);
  CHECK(points[0].loss == (1.0 + 0.9) / 2);
  CHECK(points[1].at == 1.0);
  CHECK(points[2].at == 1.5);
  CHECK(points[2].epoch == 2);
  CHECK(points[2].loss == (0.6 + 0.5) / 2);  // the sums start again with each epoch
  CHECK(points[3].global_step == 8);

  const std::vector<kiln::EpochMetrics> epochs = {epoch(1, 0.85, 0.5, kiln::EvalMetrics{.loss = 0.7, .accuracy = 0.6}),
                                                  epoch(2, 0.45, 0.5, kiln::EvalMetrics{.loss = 0.5, .accuracy = 0.7})};
  const std::string svg = kiln::plot_svg(epochs, "t", points);
  check_well_formed(svg);
  // The first polyline is the train loss: 4 step points and 2 epoch points.
  const size_t at = svg.find("<polyline points=\"");
  REQUIRE(at != std::string::npos);
  const std::string pts = svg.substr(at, svg.find('"', at + 18) - at);
  CHECK(count(pts, ",") == 6);
  CHECK(count(svg, "<circle") == 2 * 2 + 1);      // train markers at the epochs only, and the legend's
  CHECK(count(svg, "<rect x=") == 2 * 2 + 1 + 2); // test markers, the legend's, the two frames
  CHECK(svg != kiln::plot_svg(epochs, "t"));
  check_well_formed(kiln::plot_svg({}, "steps only", points));
}
