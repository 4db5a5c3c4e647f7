// Progress lines, the metrics CSV and the SVG plot of a training run (train/report.h).
#include "train/report.h"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "ir/error.h"
#include "train/checkpoint.h"

namespace kiln {
namespace {

// "1:05" or "1:02:05".
std::string clock_text(double seconds) {
  int64_t s = std::isfinite(seconds) && seconds > 0 ? static_cast<int64_t>(seconds + 0.5) : 0;
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Progress

Progress::Progress(std::FILE* out, int64_t epochs, bool quiet)
    : out_(out), epochs_(epochs), quiet_(quiet), tty_(!quiet && ::isatty(::fileno(out)) != 0) {}

std::string Progress::bar_line(const StepInfo& s, int64_t epochs, int width, int64_t seen) {
  const int64_t done = s.batch_index + 1;
  const double per_step = done > 0 ? s.seconds / static_cast<double>(done) : 0.0;
  if (seen < 0) seen = done * s.samples;
  const double rate = s.seconds > 0 ? static_cast<double>(seen) / s.seconds : 0.0;
  std::string head = fmt::format("epoch {}/{} ", s.epoch + 1, epochs);
  std::string tail = fmt::format(" {}/{}  loss {:.4f}  {:.0f} samples/s  ETA {}", done, s.batches, s.loss, rate,
                                 clock_text(per_step * static_cast<double>(s.batches - done)));
  // The bar takes what the width leaves, within reason.
  const int64_t room = static_cast<int64_t>(width) - static_cast<int64_t>(head.size() + tail.size()) - 2;
  const int64_t bar = std::clamp<int64_t>(room, 10, 40);
  const int64_t filled = s.batches > 0 ? std::min<int64_t>(bar, done * bar / s.batches) : bar;
  std::string cells(static_cast<size_t>(bar), ' ');
  for (int64_t i = 0; i < filled; ++i) cells[static_cast<size_t>(i)] = '=';
  if (filled < bar) cells[static_cast<size_t>(filled)] = '>';
  return head + "[" + cells + "]" + tail;
}

std::string Progress::epoch_line(const EpochMetrics& m, int64_t epochs) {
  auto part = [](const char* what, double loss, double accuracy) {
    std::string s = fmt::format("  {} loss {:.4f}", what, loss);
    if (std::isfinite(accuracy)) s += fmt::format(" accuracy {:.2f}%", 100.0 * accuracy);
    return s;
  };
  std::string line = fmt::format("epoch {}/{}", m.epoch, epochs) + part("train", m.train_loss, m.train_accuracy);
  if (m.test) line += part("test", m.test->loss, m.test->accuracy);
  line += fmt::format("  {:.1f} s  {:.0f} samples/s", m.seconds, m.samples_per_second);
  return line;
}

void Progress::on_step(const StepInfo& s) {
  if (!tty_) return;
  seen_ += s.samples;
  // At most ~10 redraws a second (a terminal is slow), but always the epoch's last step.
  const double now = wall_seconds();
  if (last_draw_ >= 0 && now - last_draw_ < 0.1 && s.batch_index + 1 < s.batches) return;
  last_draw_ = now;
  fmt::print(out_, "\r{}\x1b[K", bar_line(s, epochs_, 80, seen_));
  std::fflush(out_);
}

void Progress::interrupt() {
  if (!tty_ || last_draw_ < 0) return;
  std::fputc('\n', out_);
  std::fflush(out_);
  last_draw_ = -1;
}

void Progress::on_epoch(const EpochMetrics& m) {
  if (quiet_) return;
  fmt::print(out_, "{}{}\n", tty_ ? "\r\x1b[K" : "", epoch_line(m, epochs_));
  std::fflush(out_);
  last_draw_ = -1;
  seen_ = 0;
}

// ---------------------------------------------------------------------------------------
// MetricsCsv

namespace {

constexpr const char* kCsvHeader =
    "kind,epoch,step,train_loss,train_accuracy,test_loss,test_accuracy,lr,samples,seconds,samples_per_second\n";

// A number as the shortest text that reads back the same; empty when not finite.
std::string field(double v) { return std::isfinite(v) ? fmt::format("{}", v) : std::string(); }
// An f32 value (or a mean of them) as the shortest text that reads back as the same f32.
std::string field_f32(double v) {
  if (!std::isfinite(v)) return {};
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, static_cast<float>(v));
  return std::string(buf, r.ptr);
}

}  // namespace

std::optional<StepPoint> StepMeans::on_step(const StepInfo& s) {
  const double n = static_cast<double>(s.samples);
  loss_sum_ += s.loss * n;
  acc_sum_ += s.accuracy * n;
  samples_ += s.samples;
  step_ = s.global_step;
  if (every_ <= 0 || s.global_step % every_ != 0) return std::nullopt;
  const double seen = static_cast<double>(samples_);
  return StepPoint{.epoch = s.epoch + 1,
                   .global_step = s.global_step,
                   .at = static_cast<double>(s.epoch) +
                         (s.batches > 0 ? static_cast<double>(s.batch_index + 1) / static_cast<double>(s.batches) : 1.0),
                   .loss = loss_sum_ / seen,
                   .accuracy = acc_sum_ / seen,
                   .lr = s.lr,
                   .samples = samples_,
                   .seconds = s.seconds};
}

void StepMeans::on_epoch() {
  loss_sum_ = acc_sum_ = 0;
  samples_ = 0;
}

MetricsCsv::MetricsCsv(const std::string& path, int64_t every_steps, bool append) : means_(every_steps) {
  // runtime/file_output.h: a regular file is written directly, a row at a time (a reader
  // follows the run); a device or FIFO in place, never replaced.
  std::string why;
  if (!out_.open(path, why, append ? rt::OutputFile::Mode::Append : rt::OutputFile::Mode::Truncate)) throw Error(why);
  if (!out_.had_bytes() || !append) write(kCsvHeader);
}

MetricsCsv::~MetricsCsv() {
  std::string why;
  if (out_.fd() >= 0) out_.commit(false, why);  // closes it: every row is written already
}

void MetricsCsv::write(const std::string& row) {
  if (std::string why; !out_.write(row, why)) throw Error(why);
}

void MetricsCsv::on_step(const StepInfo& s) {
  const std::optional<StepPoint> p = means_.on_step(s);
  if (!p) return;
  const double seen = static_cast<double>(p->samples);
  write(fmt::format("step,{},{},{},{},,,{},{},{},{}\n", p->epoch, p->global_step, field_f32(p->loss),
                    field_f32(p->accuracy), field(p->lr), p->samples, field(p->seconds),
                    field(p->seconds > 0 ? seen / p->seconds : NAN)));
}

void MetricsCsv::on_epoch(const EpochMetrics& m) {
  means_.on_epoch();
  const double test_loss = m.test ? m.test->loss : NAN, test_acc = m.test ? m.test->accuracy : NAN;
  // step: the run's steps after this epoch (the last step seen; a resumed run's count).
  write(fmt::format("epoch,{},{},{},{},{},{},{},{},{},{}\n", m.epoch, means_.last_step(), field_f32(m.train_loss),
                    field_f32(m.train_accuracy), field_f32(test_loss), field_f32(test_acc), field(m.lr), m.samples,
                    field(m.seconds), field(m.samples_per_second)));
}

// ---------------------------------------------------------------------------------------
// The SVG plot

namespace {

std::string xml_escape(std::string_view text) {
  std::string s;
  for (char c : text) {
    switch (c) {
      case '&': s += "&amp;"; break;
      case '<': s += "&lt;"; break;
      case '>': s += "&gt;"; break;
      case '"': s += "&quot;"; break;
      default: s += c;
    }
  }
  return s;
}

// An axis from lo to hi at a "nice" step (1, 2, 2.5 or 5 times a power of ten), covering the
// data, with its ticks and the decimals their labels need.
struct Axis {
  double lo = 0, hi = 1, step = 0.2;
  int decimals = 1;
  std::vector<double> ticks() const {
    std::vector<double> t;
    for (int i = 0; lo + i * step <= hi + step * 1e-6; ++i) t.push_back(lo + i * step);
    return t;
  }
  std::string label(double v) const { return fmt::format("{:.{}f}", std::abs(v) < step * 1e-6 ? 0.0 : v, decimals); }
};

Axis nice_axis(double lo, double hi, double min_step = 0) {
  if (!(hi > lo)) {  // one value (or none): a band around it
    const double pad = lo == 0 ? 1.0 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / 5;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  const double nf = f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10;
  Axis a;
  a.step = std::max(nf * mag, min_step);
  a.lo = std::floor(lo / a.step + 1e-9) * a.step;
  a.hi = std::ceil(hi / a.step - 1e-9) * a.step;
  a.decimals = std::max(0, static_cast<int>(-std::floor(std::log10(a.step) + 1e-9)) + (nf == 2.5 ? 1 : 0));
  return a;
}

struct Series {
  const char* name;
  const char* color;
  bool dashed;
  std::vector<double> x, y;  // in x order; y NaN where there is none
  std::vector<bool> marked;  // a marker at this point (the epochs' ends)
  void add(double at, double value, bool mark) {
    x.push_back(at);
    y.push_back(value);
    marked.push_back(mark);
  }
};

constexpr int kWidth = 960, kHeight = 420;
constexpr const char* kTrainColor = "#1f77b4";
constexpr const char* kTestColor = "#d95f02";

// A marker: a circle for train, a square for test.
std::string marker(const Series& s, double x, double y) {
  if (!s.dashed) return fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3.5" fill="{}"/>)", x, y, s.color);
  return fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="7" height="7" fill="{}"/>)", x - 3.5, y - 3.5, s.color);
}

// One panel at (left, top), size w x h for its plot area: frame, grid, ticks, labels, series.
std::string panel(double left, double top, double w, double h, const std::string& heading, const std::string& ylabel,
                  const Axis& xa, const std::vector<Series>& series,
                  std::optional<std::pair<double, double>> clamp) {
  std::string out;
  double lo = INFINITY, hi = -INFINITY;
  for (const Series& s : series)
    for (double v : s.y)
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  const bool empty = !(lo <= hi);
  Axis ya = empty ? Axis{} : nice_axis(lo, hi);
  if (clamp && !empty) ya.lo = std::max(ya.lo, clamp->first), ya.hi = std::min(ya.hi, clamp->second);
  auto px = [&](double x) { return left + (x - xa.lo) / (xa.hi - xa.lo) * w; };
  auto py = [&](double y) { return top + h - (y - ya.lo) / (ya.hi - ya.lo) * h; };

  out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" font-size="15" font-weight="bold">{}</text>)"
                     "\n",
                     left + w / 2, top - 12, xml_escape(heading));
  for (double t : ya.ticks()) {
    out += fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#dddddd"/>)"
                       R"(<text x="{:.1f}" y="{:.1f}" text-anchor="end" font-size="12">{}</text>)"
                       "\n",
                       left, py(t), left + w, py(t), left - 6, py(t) + 4, ya.label(t));
  }
  for (double t : xa.ticks()) {
    out += fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#333333"/>)"
                       R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" font-size="12">{}</text>)"
                       "\n",
                       px(t), top + h, px(t), top + h + 5, px(t), top + h + 19, xa.label(t));
  }
  out += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="none" stroke="#333333"/>)"
                     "\n",
                     left, top, w, h);
  out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" font-size="13">epoch</text>)"
                     "\n",
                     left + w / 2, top + h + 38);
  out += fmt::format(R"(<text x="{0:.1f}" y="{1:.1f}" text-anchor="middle" font-size="13" )"
                     R"svg(transform="rotate(-90 {0:.1f} {1:.1f})">{2}</text>)svg"
                     "\n",
                     left - 48, top + h / 2, xml_escape(ylabel));
  if (empty) {
    out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" font-size="13" fill="#777777">no data</text>)"
                       "\n",
                       left + w / 2, top + h / 2);
    return out;
  }
  for (const Series& s : series) {
    // The line breaks where a value is missing; every value present gets a marker.
    std::string points;
    auto flush = [&] {
      if (points.find(' ') != std::string::npos)
        out += fmt::format(R"(<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{}/>)"
                           "\n",
                           points, s.color, s.dashed ? R"( stroke-dasharray="6 4")" : "");
      points.clear();
    };
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.y[i])) {
        flush();
        continue;
      }
      points += fmt::format("{}{:.1f},{:.1f}", points.empty() ? "" : " ", px(s.x[i]), py(s.y[i]));
    }
    flush();
    for (size_t i = 0; i < s.x.size(); ++i)
      if (s.marked[i] && std::isfinite(s.y[i])) out += marker(s, px(s.x[i]), py(s.y[i])) + "\n";
  }
  return out;
}

}  // namespace

std::string plot_svg(const std::vector<EpochMetrics>& epochs, const std::string& title,
                     const std::vector<StepPoint>& steps) {
  Series train_loss{"train", kTrainColor, false, {}, {}, {}}, test_loss{"test", kTestColor, true, {}, {}, {}};
  Series train_acc = train_loss, test_acc = test_loss;
  // The train curves through the step points and the epochs' ends, in x order (a step point
  // at an epoch's end comes before the epoch's own, marked, point).
  struct Point {
    double at;
    bool epoch;
    double loss, accuracy;
  };
  std::vector<Point> train;
  for (const StepPoint& p : steps) train.push_back({p.at, false, p.loss, p.accuracy});
  for (const EpochMetrics& m : epochs) {
    const double at = static_cast<double>(m.epoch);
    train.push_back({at, true, m.train_loss, m.train_accuracy});
    test_loss.add(at, m.test ? m.test->loss : NAN, true);
    test_acc.add(at, m.test ? 100.0 * m.test->accuracy : NAN, true);
  }
  std::stable_sort(train.begin(), train.end(),
                   [](const Point& a, const Point& b) { return a.at < b.at || (a.at == b.at && !a.epoch && b.epoch); });
  for (const Point& p : train) {
    train_loss.add(p.at, p.loss, p.epoch);
    train_acc.add(p.at, 100.0 * p.accuracy, p.epoch);
  }
  // Epochs on the x axis: whole numbers; one epoch gets a band around it.
  const std::vector<double>& xs = train_loss.x;
  double first = xs.empty() ? 1 : std::floor(*std::min_element(xs.begin(), xs.end()));
  double last = xs.empty() ? 1 : std::ceil(*std::max_element(xs.begin(), xs.end()));
  Axis xa = first < last ? nice_axis(first, last, 1.0) : nice_axis(first - 1, first + 1, 1.0);
  xa.decimals = 0;

  std::string svg = fmt::format(
      R"(<?xml version="1.0" encoding="UTF-8"?>)"
      "\n"
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}" )"
      R"(font-family="DejaVu Sans, Arial, Helvetica, sans-serif">)"
      "\n"
      R"(<rect width="{0}" height="{1}" fill="white"/>)"
      "\n"
      R"(<text x="{2}" y="30" text-anchor="middle" font-size="18" font-weight="bold">{3}</text>)"
      "\n",
      kWidth, kHeight, kWidth / 2, xml_escape(title));
  const double top = 90, w = 370, h = 250;
  svg += panel(90, top, w, h, "loss", "loss", xa, {train_loss, test_loss}, std::nullopt);
  svg += panel(570, top, w, h, "accuracy", "accuracy (%)", xa, {train_acc, test_acc},
               std::make_pair(0.0, 100.0));
  // The legend, under the title, for both panels.
  const double ly = 52;
  const std::vector<const Series*> legend = {&train_loss, &test_loss};
  double lx = kWidth / 2.0 - 90;
  for (const Series* s : legend) {
    svg += fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="{}" stroke-width="2"{}/>)",
                       lx, ly, lx + 30, ly, s->color, s->dashed ? R"( stroke-dasharray="6 4")" : "");
    svg += marker(*s, lx + 15, ly);
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="13">{}</text>)"
                       "\n",
                       lx + 38, ly + 4.5, s->name);
    lx += 110;
  }
  svg += "</svg>\n";
  return svg;
}

void write_plot(const std::string& path, const std::vector<EpochMetrics>& epochs, const std::string& title,
                const std::vector<StepPoint>& steps) {
  write_file_atomic(path, plot_svg(epochs, title, steps));
}

}  // namespace kiln
