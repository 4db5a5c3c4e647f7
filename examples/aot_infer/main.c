/* Classifies the Fashion-MNIST test set with the MLP 784-256-10 compiled ahead of time by
 * `kiln compile` into an object and the header mlp_infer.h, and prints the accuracy. The
 * program is plain C and has neither LLVM nor Kiln's compiler in it: only the object,
 * libkiln_runtime.a and OpenBLAS.
 *
 * Weights: from the weights file given as the first argument (`aot_train` writes one; the
 * optimizer state in it is ignored here), read by mlp_infer_load_weights, which checks
 * each tensor's dtype and shape and the file's checksum. Without one, the model's own
 * weights are used: embedded in the object when it was compiled with `--weights embed`
 * (the untrained initial ones, from `fashion_mnist --export`); a model compiled with
 * `--weights file` has none of its own and needs the file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../aot_common/fashion_mnist_data.h"
#include "mlp_infer.h"

#define BATCH MLP_INFER_OUTPUT_PREDICTED_ELEMENTS
_Static_assert(MLP_INFER_INPUT_X_ELEMENTS == BATCH * FM_PIXELS, "the model's x is f32[batch,784]");

static const char* const usage =
    "usage: aot_infer [WEIGHTS] [--data-dir DIR] [--test-limit N]\n"
    "\n"
    "Classifies the first N Fashion-MNIST test images (default all 10000) in batches of %d\n"
    "with the MLP compiled ahead of time, and prints the accuracy. WEIGHTS: a weights file\n"
    "(aot_train's output, or the one `kiln compile --weights file` wrote); without it the\n"
    "weights embedded in the object are used (%s).\n"
    "  --data-dir DIR   the IDX files (default $KILN_FASHION_MNIST_DIR, else\n"
    "                   /usr/share/datasets/fashion-mnist)\n";

int main(int argc, char** argv) {
  const char* data_dir = fm_default_dir();
  const char* weights = NULL;
  int64_t limit = 10000;
  int parsed = fm_parse_classify_args("aot_infer", argc, argv, &weights, &data_dir, &limit);
  if (parsed < 0) return 1;
  if (parsed > 0) {
    printf(usage, BATCH, MLP_INFER_WEIGHTS_EMBEDDED ? "this build has them" : "this build has none");
    return 0;
  }
  if (!weights && !MLP_INFER_WEIGHTS_EMBEDDED) {
    fprintf(stderr,
            "aot_infer: error: this model was compiled with --weights file and holds no weights: give a weights "
            "file (aot_train's output, or the .safetensors file `kiln compile --weights file` wrote next to the object)\n");
    return 1;
  }

  FashionMnist test;
  if (fm_load("aot_infer", data_dir, "t10k", limit, &test) != 0) return 1;

  mlp_infer_instance* model = mlp_infer_create();
  if (!model) {
    fprintf(stderr, "aot_infer: error: %s\n", mlp_infer_error(NULL));
    fm_free(&test);
    return 1;
  }
  int rc = 0;
  if (weights) {
    rc = mlp_infer_load_weights(model, weights);
    if (rc == 0) printf("loaded the weights from %s\n", weights);
  } else {
    printf("no weights file given: using the weights embedded in the object (the initial, untrained ones)\n");
  }

  /* Whole batches; the last partial one padded with blank images whose answers are unused. */
  float* x = calloc((size_t)BATCH * FM_PIXELS, sizeof(float));
  float* logits = malloc(MLP_INFER_OUTPUT_LOGITS_BYTES);
  int32_t* predicted = malloc(MLP_INFER_OUTPUT_PREDICTED_BYTES);
  int32_t shown[10];
  int64_t right = 0;
  if (!x || !logits || !predicted) {
    fprintf(stderr, "aot_infer: error: out of memory\n");
    rc = 1;
  }
  for (int64_t begin = 0; begin < test.n && rc == 0; begin += BATCH) {
    int64_t rows = test.n - begin < BATCH ? test.n - begin : BATCH;
    memcpy(x, test.images + begin * FM_PIXELS, (size_t)rows * FM_PIXELS * sizeof(float));
    memset(x + rows * FM_PIXELS, 0, (size_t)(BATCH - rows) * FM_PIXELS * sizeof(float));
    rc = mlp_infer_run(model, x, logits, predicted);
    for (int64_t r = 0; r < rows && rc == 0; ++r) {
      right += predicted[r] == test.labels[begin + r];
      if (begin + r < 10) shown[begin + r] = predicted[r];
    }
  }
  if (rc == 0) {
    int64_t n_shown = test.n < 10 ? test.n : 10;
    printf("%5s  %-12s  %s\n", "image", "predicted", "label");
    for (int64_t i = 0; i < n_shown; ++i)
      printf("%5lld  %-12s  %s%s\n", (long long)i, fm_class_name(shown[i]), fm_class_name(test.labels[i]),
             shown[i] == test.labels[i] ? "  (right)" : "");
    printf("test accuracy %.1f%% on %lld images (%lld right)\n", 100.0 * (double)right / (double)test.n,
           (long long)test.n, (long long)right);
  } else if (x && logits && predicted) {
    fprintf(stderr, "aot_infer: error: %s\n", mlp_infer_error(model));
  }
  free(x);
  free(logits);
  free(predicted);
  mlp_infer_destroy(model);
  fm_free(&test);
  return rc == 0 ? 0 : 1;
}
