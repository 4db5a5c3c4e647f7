// What a training run shows and leaves behind: a progress bar on a terminal (one line per
// epoch otherwise), a CSV of metrics and a standalone SVG plot of the curves.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "runtime/file_output.h"
#include "train/trainer.h"

namespace kiln {

// Progress on `out`. On a terminal (isatty) one line redrawn at most ~10 times a second:
//   epoch 2/3 [=========>          ] 412/938  loss 0.4123  10234 samples/s  ETA 0:03
// and at each epoch's end a permanent line with the epoch's metrics (train and test).
// When `out` is not a terminal, only the per-epoch lines. quiet: nothing at all.
class Progress {
 public:
  Progress(std::FILE* out, int64_t epochs, bool quiet = false);
  void on_step(const StepInfo& s);
  void on_epoch(const EpochMetrics& m);
  // Ends a bar line left half-drawn (training stopped mid-epoch), so that what is printed
  // next starts on a line of its own.
  void interrupt();
  static std::string epoch_line(const EpochMetrics& m, int64_t epochs);  // the permanent line
  // `seen`: examples trained in the epoch so far, this step's included (-1: steps done times
  // this step's batch, exact but for a last partial batch).
  static std::string bar_line(const StepInfo& s, int64_t epochs, int width = 80, int64_t seen = -1);

 private:
  std::FILE* out_;
  int64_t epochs_;
  bool quiet_, tty_;
  double last_draw_ = -1;
  int64_t seen_ = 0;  // examples trained in the epoch so far
};

// The training curve within epochs: the running means of the epoch so far, every N steps
// (the metrics CSV's step rows and the plot's points between epochs).
struct StepPoint {
  int64_t epoch = 0;        // 1-based: the epoch the step is in
  int64_t global_step = 0;  // the step's (steps done, this one included)
  double at = 0;            // in epochs: epoch - 1 + the epoch's batches done / its batches
  double loss = 0, accuracy = 0;  // example-weighted means over the epoch's steps so far
  double lr = 0;            // the step's rate
  int64_t samples = 0;      // examples in those steps
  double seconds = 0;       // since the epoch started
};

class StepMeans {
 public:
  explicit StepMeans(int64_t every_steps) : every_(every_steps) {}
  // Adds the step to the running sums; its point when every_steps > 0 divides its global step.
  std::optional<StepPoint> on_step(const StepInfo& s);
  void on_epoch();  // the next step starts an epoch: the sums start again
  int64_t last_step() const { return step_; }  // the last step's global_step

 private:
  int64_t every_ = 0;
  double loss_sum_ = 0, acc_sum_ = 0;
  int64_t samples_ = 0;
  int64_t step_ = 0;
};

// CSV: a header line, then one row per epoch
//   kind,epoch,step,train_loss,train_accuracy,test_loss,test_accuracy,lr,samples,seconds,samples_per_second
// with kind "epoch"; with every_steps > 0 also rows of kind "step" (StepMeans: the running
// means of the epoch so far) every that many steps. Losses and accuracies are f32 values and
// their means: they are written as the shortest text that reads back as the same f32
// ("0.8213", not "0.8212999999523163"); the rate, seconds and speed as the shortest that
// reads back as the same double. Each row is written to the file as it comes (a crashed run
// keeps its rows; a device or FIFO is written in place); empty fields for what a row does
// not have. kiln::Error "cannot write 'PATH': ..." when the file cannot be written.
class MetricsCsv {
 public:
  MetricsCsv(const std::string& path, int64_t every_steps = 0, bool append = false);
  ~MetricsCsv();
  void on_step(const StepInfo& s);
  void on_epoch(const EpochMetrics& m);

 private:
  void write(const std::string& row);
  rt::OutputFile out_;
  StepMeans means_;
};

// A standalone SVG (no scripts, no external fonts) with two panels side by side: loss
// (train and test) and accuracy in % (train and test) against the epoch, with axes, ticks,
// labels, a title and a legend. `steps` (StepMeans' points, e.g. every --metrics-every
// steps) put the train curves' points between the epochs too: the lines go through them,
// the markers stay at the epochs' ends. Written atomically; kiln::Error when it cannot be.
std::string plot_svg(const std::vector<EpochMetrics>& epochs, const std::string& title,
                     const std::vector<StepPoint>& steps = {});
void write_plot(const std::string& path, const std::vector<EpochMetrics>& epochs, const std::string& title,
                const std::vector<StepPoint>& steps = {});

}  // namespace kiln
