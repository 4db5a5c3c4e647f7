#include <stdio.h>

#include "affine.h"
#include "linreg.h"

#ifndef FAKE_RUNTIME_LINKED
#error "kiln_add_model's library does not link Kiln::runtime"
#endif

int main(void) {
  printf("answers %d %d, weights %s\n", affine_answer(), linreg_answer(), WEIGHTS);
  return 0;
}
