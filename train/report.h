// What a training run shows and leaves behind: a progress bar on a terminal (one line per
// epoch otherwise), a CSV of metrics and a standalone SVG plot of the curves.
#pragma once

#include <cstdio>
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

// CSV: a header line, then one row per epoch
//   kind,epoch,step,train_loss,train_accuracy,test_loss,test_accuracy,lr,samples,seconds,samples_per_second
// with kind "epoch"; with every_steps > 0 also rows of kind "step" (the running means of the
// epoch so far) every that many steps. Each row is written to the file as it comes (a crashed
// run keeps its rows; a device or FIFO is written in place); empty fields for what a row does
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
  int64_t every_ = 0;
  double loss_sum_ = 0, acc_sum_ = 0;
  int64_t samples_ = 0;
  int64_t step_ = 0;  // the last step's global_step
};

// A standalone SVG (no scripts, no external fonts) with two panels side by side: loss
// (train and test) and accuracy in % (train and test) against the epoch, with axes, ticks,
// labels, a title and a legend. Written atomically; kiln::Error when it cannot be.
std::string plot_svg(const std::vector<EpochMetrics>& epochs, const std::string& title);
void write_plot(const std::string& path, const std::vector<EpochMetrics>& epochs, const std::string& title);

}  // namespace kiln
