#include "fashion_mnist_data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

const char* fm_default_dir(void) {
  const char* env = getenv("KILN_FASHION_MNIST_DIR");
  return env && *env ? env : "/usr/share/datasets/fashion-mnist";
}

/* DIR/BASE.gz if it exists, else DIR/BASE (gzread reads an uncompressed file as it is). */
static gzFile open_idx(const char* dir, const char* base, char* path, size_t path_size) {
  snprintf(path, path_size, "%s/%s.gz", dir, base);
  gzFile f = gzopen(path, "rb");
  if (!f) {
    snprintf(path, path_size, "%s/%s", dir, base);
    f = gzopen(path, "rb");
  }
  return f;
}

static int read_exact(gzFile f, void* dst, size_t bytes) {
  /* gzread takes an unsigned count: read in chunks that fit. */
  unsigned char* p = dst;
  while (bytes > 0) {
    unsigned chunk = bytes > (1u << 30) ? (1u << 30) : (unsigned)bytes;
    int got = gzread(f, p, chunk);
    if (got <= 0) return -1;
    p += got;
    bytes -= (size_t)got;
  }
  return 0;
}

/* Opens an IDX file of u8 elements with `rank` dimensions, reads its dims and leaves the
 * file at the first element. NULL with a message in err. */
static gzFile open_u8_idx(const char* dir, const char* base, int rank, uint32_t* dims, char* err, size_t err_size) {
  char path[4096];
  gzFile f = open_idx(dir, base, path, sizeof path);
  if (!f) {
    snprintf(err, err_size,
             "%s/%s.gz: no such file; Fashion-MNIST comes with the Debian package dataset-fashion-mnist, "
             "or set KILN_FASHION_MNIST_DIR (or --data-dir) to a folder holding it",
             dir, base);
    return NULL;
  }
  unsigned char header[4];
  if (read_exact(f, header, 4) != 0 || header[0] != 0 || header[1] != 0 || header[2] != 0x08 || header[3] != rank) {
    snprintf(err, err_size, "%s: not an IDX file of u8 with %d dimensions", path, rank);
    gzclose(f);
    return NULL;
  }
  for (int i = 0; i < rank; ++i) {
    unsigned char b[4];
    if (read_exact(f, b, 4) != 0) {
      snprintf(err, err_size, "%s: the IDX header is truncated", path);
      gzclose(f);
      return NULL;
    }
    dims[i] = (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
  }
  return f;
}

static int load(const char* dir, const char* split, int64_t limit, FashionMnist* out, char* err, size_t err_size) {
  memset(out, 0, sizeof *out);
  char images_base[64], labels_base[64];
  snprintf(images_base, sizeof images_base, "%s-images-idx3-ubyte", split);
  snprintf(labels_base, sizeof labels_base, "%s-labels-idx1-ubyte", split);
  uint32_t idims[3], ldims[1];
  gzFile fi = open_u8_idx(dir, images_base, 3, idims, err, err_size);
  if (!fi) return -1;
  gzFile fl = open_u8_idx(dir, labels_base, 1, ldims, err, err_size);
  if (!fl) {
    gzclose(fi);
    return -1;
  }
  int rc = -1;
  unsigned char* bytes = NULL;
  if (idims[1] != 28 || idims[2] != 28) {
    snprintf(err, err_size, "%s/%s: Fashion-MNIST images are 28x28, these are %ux%u", dir, images_base,
             (unsigned)idims[1], (unsigned)idims[2]);
    goto done;
  }
  if (idims[0] != ldims[0]) {
    snprintf(err, err_size, "%s: %u images but %u labels", dir, (unsigned)idims[0], (unsigned)ldims[0]);
    goto done;
  }
  int64_t n = idims[0] < (uint64_t)limit ? (int64_t)idims[0] : limit;
  bytes = malloc((size_t)n * FM_PIXELS + 1);
  out->images = malloc(((size_t)n * FM_PIXELS + 1) * sizeof(float));
  out->labels = malloc(((size_t)n + 1) * sizeof(int32_t));
  if (!bytes || !out->images || !out->labels) {
    snprintf(err, err_size, "out of memory for %lld images", (long long)n);
    goto done;
  }
  if (read_exact(fi, bytes, (size_t)n * FM_PIXELS) != 0) {
    snprintf(err, err_size, "%s/%s: truncated: fewer pixels than the header's %u images", dir, images_base,
             (unsigned)idims[0]);
    goto done;
  }
  /* As Kiln's loader does: float(pixel) / 255.0f, the same rounding. */
  for (int64_t i = 0; i < n * FM_PIXELS; ++i) out->images[i] = (float)bytes[i] / 255.0f;
  if (read_exact(fl, bytes, (size_t)n) != 0) {
    snprintf(err, err_size, "%s/%s: truncated: fewer labels than the header's %u", dir, labels_base,
             (unsigned)ldims[0]);
    goto done;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (bytes[i] > 9) {
      snprintf(err, err_size, "%s/%s: label %u of image %lld is not a class 0..9", dir, labels_base,
               (unsigned)bytes[i], (long long)i);
      goto done;
    }
    out->labels[i] = bytes[i];
  }
  out->n = n;
  rc = 0;
done:
  free(bytes);
  gzclose(fi);
  gzclose(fl);
  if (rc != 0) fm_free(out);
  return rc;
}

int fm_load(const char* program, const char* dir, const char* split, int64_t limit, FashionMnist* out) {
  char err[4200];
  if (load(dir, split, limit, out, err, sizeof err) != 0) {
    fprintf(stderr, "%s: error: %s\n", program, err);
    return -1;
  }
  if (out->n == 0) {
    fprintf(stderr, "%s: error: no %s images to use (a limit of 0, or an empty set in %s)\n", program, split, dir);
    fm_free(out);
    return -1;
  }
  return 0;
}

void fm_free(FashionMnist* set) {
  free(set->images);
  free(set->labels);
  memset(set, 0, sizeof *set);
}

const char* fm_class_name(int32_t label) {
  static const char* const names[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                        "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return label >= 0 && label < 10 ? names[label] : "?";
}

int64_t fm_parse_count(const char* program, const char* flag, const char* text) {
  char* end = NULL;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < 0) {
    fprintf(stderr, "%s: error: %s needs a non-negative integer, got '%s'\n", program, flag, text);
    return -1;
  }
  return v;
}

int fm_parse_classify_args(const char* program, int argc, char** argv, const char** weights, const char** data_dir,
                           int64_t* limit) {
  for (int i = 1; i < argc; ++i) {
    const char* arg = argv[i];
    if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) return 1;
    if (arg[0] != '-' && !*weights) {
      *weights = arg;
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "%s: error: %s '%s' (see --help)\n", program,
              arg[0] == '-' ? "no value for" : "unexpected argument", arg);
      return -1;
    }
    const char* value = argv[++i];
    if (!strcmp(arg, "--data-dir")) {
      *data_dir = value;
    } else if (!strcmp(arg, "--test-limit")) {
      *limit = fm_parse_count(program, arg, value);
      if (*limit < 0) return -1;
    } else {
      fprintf(stderr, "%s: error: unknown option '%s' (see --help)\n", program, arg);
      return -1;
    }
  }
  return 0;
}
