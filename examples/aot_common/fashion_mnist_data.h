/* Fashion-MNIST for the C examples: the IDX files as /usr/share/datasets/fashion-mnist holds
 * them (gzip'ed or not), read with zlib into the layout Kiln's loader gives the demo
 * (frontend/idx.h): images f32 [N,784] scaled by 1/255, labels i32 [N]. The same bytes
 * give the same floats, so a C example and the C++ demo see identical batches. */
#ifndef KILN_EXAMPLES_FASHION_MNIST_DATA_H
#define KILN_EXAMPLES_FASHION_MNIST_DATA_H

#include <stddef.h>
#include <stdint.h>

#define FM_PIXELS 784 /* 28 x 28 */

typedef struct FashionMnist {
  int64_t n;       /* images read */
  float* images;   /* n x FM_PIXELS, in [0, 1] */
  int32_t* labels; /* n, in 0..9 */
} FashionMnist;

/* $KILN_FASHION_MNIST_DIR if set, else /usr/share/datasets/fashion-mnist. */
const char* fm_default_dir(void);

/* The first `limit` images (or all, if there are fewer) of split "train" or "t10k", from
 * DIR/SPLIT-{images-idx3,labels-idx1}-ubyte[.gz]. 0, or -1 after printing one line
 * "PROGRAM: error: ..." naming the file and what is wrong (no images read is an error). */
int fm_load(const char* program, const char* dir, const char* split, int64_t limit, FashionMnist* out);
void fm_free(FashionMnist* set);

/* "T-shirt/top", ..., "Ankle boot", by label. */
const char* fm_class_name(int32_t label);

/* A non-negative integer option's value, or -1 (with a message on stderr) if it is not one. */
int64_t fm_parse_count(const char* program, const char* flag, const char* text);

/* The command line of the classifying examples: [WEIGHTS] [--data-dir DIR] [--test-limit N]
 * [--help]. Sets what is given (the others keep their values). 0: go on; 1: --help was
 * asked for (print the usage, exit 0); -1: a mistake, said on stderr as "PROGRAM: error: ...". */
int fm_parse_classify_args(const char* program, int argc, char** argv, const char** weights, const char** data_dir,
                           int64_t* limit);

#endif
