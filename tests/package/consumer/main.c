/* Two AOT-compiled models in plain C (C99): affine (inference, weights embedded from
 * state/*.npy) and linreg (a whole SGD training step, weights in a file). Prints one line
 * per model; exit status 1 with the reason on any mismatch. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "affine.h"
#include "linreg.h"

#define FAIL(...) (fprintf(stderr, "models_c: " __VA_ARGS__), fputc('\n', stderr), 1)

static int check_affine(void) {
  /* state/w.npy and state/b.npy */
  static const float want_w[6] = {1, 0, 0, 1, 1, 1}, want_b[2] = {0.5f, -10};
  const float x[AFFINE_INPUT_X_ELEMENTS] = {1, 2, 3, -1, -2, -3};
  float w[AFFINE_STATE_W_ELEMENTS], b[AFFINE_STATE_B_ELEMENTS];
  float out[AFFINE_OUTPUT_OUT_ELEMENTS], pre[AFFINE_OUTPUT_PRE_ELEMENTS];
  affine_instance* inst = affine_create();
  if (!inst) return FAIL("affine_create: %s", affine_error(NULL));
  if (affine_get_state(inst, "w", w, sizeof w) || affine_get_state(inst, "b", b, sizeof b))
    return FAIL("affine_get_state: %s", affine_error(inst));
  if (memcmp(w, want_w, sizeof w) || memcmp(b, want_b, sizeof b))
    return FAIL("affine: the embedded state is not state/*.npy");
  if (affine_run(inst, x, out, pre)) return FAIL("affine_run: %s", affine_error(inst));
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      float p = b[j];
      for (int k = 0; k < 3; ++k) p += x[i * 3 + k] * w[k * 2 + j];
      if (fabsf(pre[i * 2 + j] - p) > 1e-5f || out[i * 2 + j] != (p > 0 ? p : 0))
        return FAIL("affine: [%d,%d] is %g / %g, want %g", i, j, pre[i * 2 + j], out[i * 2 + j], p);
    }
  if (affine_get_state(inst, "w", w, 4) == 0) return FAIL("affine_get_state accepted a wrong size");
  affine_destroy(inst);
  printf("affine: ok (%d inputs, %d outputs, %d state)\n", AFFINE_NUM_INPUTS, AFFINE_NUM_OUTPUTS, AFFINE_NUM_STATE);
  return 0;
}

static int check_linreg(const char* saved) {
  /* y = x . (1, -2, 3) + 0.5 */
  const float x[LINREG_INPUT_X_ELEMENTS] = {1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1};
  const float y[LINREG_INPUT_Y_ELEMENTS] = {1.5f, -1.5f, 3.5f, 2.5f};
  float first = 0, loss = 0, w1[LINREG_STATE_W_ELEMENTS], w2[LINREG_STATE_W_ELEMENTS];
  linreg_instance* inst = linreg_create();
  if (!inst) return FAIL("linreg_create: %s", linreg_error(NULL));
  /* Compiled with WEIGHTS file: the state (lr included) is in the weights file. */
  if (linreg_load_weights(inst, LINREG_WEIGHTS_PATH)) return FAIL("linreg_load_weights: %s", linreg_error(inst));
  for (int i = 0; i < 300; ++i) {
    if (linreg_step(inst, x, y, &loss)) return FAIL("linreg_step: %s", linreg_error(inst));
    if (i == 0) first = loss;
  }
  if (!(loss < first * 1e-3f)) return FAIL("linreg: the loss went from %g to %g in 300 steps", first, loss);
  /* Save, load into a second instance: the same parameters. */
  linreg_instance* copy = linreg_create();
  if (!copy) return FAIL("linreg_create: %s", linreg_error(NULL));
  if (linreg_save_weights(inst, saved)) return FAIL("linreg_save_weights: %s", linreg_error(inst));
  if (linreg_load_weights(copy, saved)) return FAIL("linreg_load_weights: %s", linreg_error(copy));
  if (linreg_get_state(inst, "w", w1, sizeof w1) || linreg_get_state(copy, "w", w2, sizeof w2))
    return FAIL("linreg_get_state failed");
  if (memcmp(w1, w2, sizeof w1)) return FAIL("linreg: the saved and loaded weights differ");
  linreg_destroy(copy);
  linreg_destroy(inst);
  printf("linreg: loss %g -> %g in 300 steps, w = (%.3f, %.3f, %.3f)\n", first, loss, w1[0], w1[1], w1[2]);
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 2) return FAIL("usage: models_c SAVED.weights");
  return check_affine() || check_linreg(argv[1]);
}
