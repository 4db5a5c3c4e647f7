/* Trains the Fashion-MNIST MLP 784-256-10 for one epoch with its whole training step
 * (forward, loss, backward, SGD update) compiled ahead of time by `kiln compile` into an
 * object and the header mlp_train.h: this program has neither LLVM nor Kiln's compiler in
 * it, only the object, libkiln_runtime.a and OpenBLAS. It then saves the weights (and the
 * optimizer state) to a weights file that aot_infer loads.
 *
 * The step, its initial state and its batch size come from `fashion_mnist --export` (same
 * seed, optimizer and learning rate as the demo), and the batches are the demo's: the
 * first images in order, no shuffling, a last partial batch skipped. So the epoch's mean
 * loss is the one `fashion_mnist --epochs 1` prints with the same options, to the bit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../aot_common/fashion_mnist_data.h"
#include "mlp_train.h"

#define BATCH MLP_TRAIN_INPUT_Y_ELEMENTS
_Static_assert(MLP_TRAIN_INPUT_X_ELEMENTS == BATCH * FM_PIXELS, "the step's x is f32[batch,784]");

static const char* const usage =
    "usage: aot_train [--data-dir DIR] [--train-limit N] [--print-every N] [--save PATH]\n"
    "\n"
    "Trains the MLP for one epoch on the first N Fashion-MNIST training images (default all\n"
    "60000) in batches of %d with the training step compiled ahead of time, printing the\n"
    "mean loss every --print-every steps (default 100) and of the whole epoch, then saves\n"
    "the weights to PATH (default mlp.safetensors) for aot_infer.\n"
    "  --data-dir DIR   the IDX files (default $KILN_FASHION_MNIST_DIR, else\n"
    "                   /usr/share/datasets/fashion-mnist)\n";

int main(int argc, char** argv) {
  const char* data_dir = fm_default_dir();
  const char* save_path = "mlp.safetensors";
  int64_t limit = 60000, print_every = 100;
  for (int i = 1; i < argc; ++i) {
    const char* arg = argv[i];
    if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
      printf(usage, BATCH);
      return 0;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "aot_train: error: %s '%s' (see --help)\n",
              arg[0] == '-' ? "no value for" : "unexpected argument", arg);
      return 1;
    }
    const char* value = argv[++i];
    if (!strcmp(arg, "--data-dir")) data_dir = value;
    else if (!strcmp(arg, "--save")) save_path = value;
    else if (!strcmp(arg, "--train-limit")) limit = fm_parse_count("aot_train", arg, value);
    else if (!strcmp(arg, "--print-every")) print_every = fm_parse_count("aot_train", arg, value);
    else {
      fprintf(stderr, "aot_train: error: unknown option '%s' (see --help)\n", arg);
      return 1;
    }
    if (limit < 0 || print_every < 0) return 1;
  }

  FashionMnist train;
  if (fm_load("aot_train", data_dir, "train", limit, &train) != 0) return 1;
  const int64_t steps = train.n / BATCH;
  if (steps == 0) {
    fprintf(stderr, "aot_train: error: %lld training images are fewer than one batch of %d (--train-limit)\n",
            (long long)train.n, BATCH);
    fm_free(&train);
    return 1;
  }

  /* The instance owns the arena and the state, here the initial weights and optimizer
   * state embedded in the object. */
  mlp_train_instance* model = mlp_train_create();
  if (!model) {
    fprintf(stderr, "aot_train: error: %s\n", mlp_train_error(NULL));
    fm_free(&train);
    return 1;
  }
  /* The target line without its long feature list. */
  const char* target = MLP_TRAIN_TARGET;
  const char* features = strstr(target, " features=");
  int target_length = features ? (int)(features - target) : (int)strlen(target);
  printf("training the MLP 784-256-10 on %lld images, batch %d, %lld steps (compiled for %.*s)\n",
         (long long)train.n, BATCH, (long long)steps, target_length, target);
  double sum = 0, window = 0, accuracy = 0;
  int rc = 0;
  for (int64_t s = 0; s < steps && rc == 0; ++s) {
    float loss = 0, acc = 0;
    /* One call: the whole step, the state updated in place. */
    rc = mlp_train_step(model, train.images + s * BATCH * FM_PIXELS, train.labels + s * BATCH, &loss, &acc);
    /* The demo's sums: each step's f32 loss added in double, in step order. */
    sum += loss;
    window += loss;
    accuracy += acc;
    if (print_every > 0 && (s + 1) % print_every == 0) {
      printf("step %lld/%lld: loss %.4f (mean of the last %lld steps)\n", (long long)(s + 1), (long long)steps,
             window / (double)print_every, (long long)print_every);
      window = 0;
    }
  }
  if (rc == 0) {
    printf("epoch 1/1: train loss %.9f, train accuracy %.1f%% (%lld steps)\n", sum / (double)steps,
           100 * accuracy / (double)steps, (long long)steps);
    rc = mlp_train_save_weights(model, save_path);
    if (rc == 0) printf("saved the weights and optimizer state to %s\n", save_path);
  }
  if (rc != 0) fprintf(stderr, "aot_train: error: %s\n", mlp_train_error(model));
  mlp_train_destroy(model);
  fm_free(&train);
  return rc == 0 ? 0 : 1;
}
