/* Classifies the Fashion-MNIST test set with a model trained by `kiln train`, exported with
 * --export and compiled ahead of time, and prints the accuracy: the deployment path of
 * docs/aot.md, end to end, in plain C (the object, libkiln_runtime.a and OpenBLAS: neither
 * LLVM nor Kiln's compiler):
 *
 *   kiln train lenet --data fashion-mnist --export out/
 *   kiln compile out/model.kir --state-weights out/weights.safetensors -o m.o --header m.h
 *   cc -I. examples/aot_classify/main.c examples/aot_common/fashion_mnist_data.c m.o \
 *      libkiln_runtime.a $(pkg-config --libs openblas) -lz -lm -lstdc++ -lpthread -o classify
 *   ./classify
 *
 * prints the test accuracy `kiln train` printed, to the image. The model is any exported
 * classifier (inputs x: f32[batch,784] or [batch,1,28,28]; outputs logits and predicted):
 * its C prefix is MODEL (lenet by default; -DMODEL=mlp -DMODEL_UPPER=MLP for the MLP) and
 * its header MODEL_HEADER (default "m.h"). The weights are those embedded in the object, or
 * the weights file given as an argument (a model compiled with --weights file needs one). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../aot_common/fashion_mnist_data.h"

#ifndef MODEL
#define MODEL lenet
#define MODEL_UPPER LENET
#endif
#ifndef MODEL_HEADER
#define MODEL_HEADER "m.h"
#endif
#include MODEL_HEADER

/* FN(_run) is lenet_run, CONST(_INPUT_X_ELEMENTS) is LENET_INPUT_X_ELEMENTS. */
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define FN(suffix) CAT(MODEL, suffix)
#define CONST(suffix) CAT(MODEL_UPPER, suffix)

#define BATCH CONST(_OUTPUT_PREDICTED_ELEMENTS)
_Static_assert(CONST(_INPUT_X_ELEMENTS) == BATCH * FM_PIXELS, "the model's x is f32[batch,784] or [batch,1,28,28]");
/* The dtype numbering of the generated headers: 0 is f32, 2 is i32 (docs/aot.md). */
_Static_assert(CONST(_INPUT_X_DTYPE) == 0 && CONST(_OUTPUT_PREDICTED_DTYPE) == 2,
               "the model takes f32 images and predicts i32 classes");

static const char* const usage =
    "usage: aot_classify [WEIGHTS] [--data-dir DIR] [--test-limit N]\n"
    "\n"
    "Classifies the first N Fashion-MNIST test images (default all 10000) in batches of %d with\n"
    "the model compiled ahead of time, and prints the accuracy. WEIGHTS: a weights file\n"
    "(safetensors: kiln train --export's weights.safetensors, a checkpoint) to load; without it\n"
    "the weights embedded in the object are used (%s).\n"
    "  --data-dir DIR   the IDX files (default $KILN_FASHION_MNIST_DIR, else\n"
    "                   /usr/share/datasets/fashion-mnist)\n";

int main(int argc, char** argv) {
  const char* data_dir = fm_default_dir();
  const char* weights = NULL;
  int64_t limit = 10000;
  int parsed = fm_parse_classify_args("aot_classify", argc, argv, &weights, &data_dir, &limit);
  if (parsed < 0) return 1;
  if (parsed > 0) {
    printf(usage, BATCH, CONST(_WEIGHTS_EMBEDDED) ? "this build has them" : "this build has none");
    return 0;
  }
  if (!weights && !CONST(_WEIGHTS_EMBEDDED)) {
    fprintf(stderr, "aot_classify: error: this model was compiled with --weights file and holds no weights: give "
                    "its weights file\n");
    return 1;
  }

  FashionMnist test;
  if (fm_load("aot_classify", data_dir, "t10k", limit, &test) != 0) return 1;
  FN(_instance)* model = FN(_create)();
  if (!model) { /* e.g. a CPU without a feature the object was compiled for: the message names it */
    fprintf(stderr, "aot_classify: error: %s\n", FN(_error)(NULL));
    fm_free(&test);
    return 1;
  }
  int rc = weights ? FN(_load_weights)(model, weights) : 0;

  /* Whole batches; the last partial one padded with blank images whose answers are unused. */
  float* x = calloc((size_t)BATCH * FM_PIXELS, sizeof(float));
  float* logits = malloc(CONST(_OUTPUT_LOGITS_BYTES));
  int32_t* predicted = malloc(CONST(_OUTPUT_PREDICTED_BYTES));
  int64_t right = 0;
  if (!x || !logits || !predicted) {
    fprintf(stderr, "aot_classify: error: out of memory\n");
    free(x);
    free(logits);
    free(predicted);
    FN(_destroy)(model);
    fm_free(&test);
    return 1;
  }
  for (int64_t begin = 0; begin < test.n && rc == 0; begin += BATCH) {
    int64_t rows = test.n - begin < BATCH ? test.n - begin : BATCH;
    memcpy(x, test.images + begin * FM_PIXELS, (size_t)rows * FM_PIXELS * sizeof(float));
    memset(x + rows * FM_PIXELS, 0, (size_t)(BATCH - rows) * FM_PIXELS * sizeof(float));
    rc = FN(_run)(model, x, logits, predicted);
    for (int64_t r = 0; r < rows && rc == 0; ++r) right += predicted[r] == test.labels[begin + r];
  }
  if (rc == 0)
    printf("test accuracy %.2f%% on %lld images (%lld right)\n", 100.0 * (double)right / (double)test.n,
           (long long)test.n, (long long)right);
  else
    fprintf(stderr, "aot_classify: error: %s\n", FN(_error)(model));
  free(x);
  free(logits);
  free(predicted);
  FN(_destroy)(model);
  fm_free(&test);
  return rc == 0 ? 0 : 1;
}
