/* A stand-in for `kiln compile` (run_add_model.sh): logs its arguments, writes NAME.h and
 * an object defining NAME_answer() (compiled by CC), and the weights file if asked. */
#include <stdio.h>
#include <string.h>

int main(int argc, char** argv) {
  const char *obj = NULL, *header = NULL, *name = NULL, *weights = NULL;
  FILE* log = fopen(LOG, "a");
  if (!log) return 1;
  for (int i = 1; i < argc; ++i) fprintf(log, "%s%s", i > 1 ? " " : "", argv[i]);
  fputc('\n', log);
  fclose(log);
  for (int i = 1; i + 1 < argc; ++i) {
    if (!strcmp(argv[i], "-o")) obj = argv[i + 1];
    if (!strcmp(argv[i], "--header")) header = argv[i + 1];
    if (!strcmp(argv[i], "--name")) name = argv[i + 1];
    if (!strcmp(argv[i], "--weights-file")) weights = argv[i + 1];
  }
  if (!obj || !header || !name) return 1;
  FILE* h = fopen(header, "w");
  if (!h) return 1;
  fprintf(h, "int %s_answer(void);\n", name);
  fclose(h);
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "%s -x c -c - -o '%s'", CC, obj);
  FILE* cc = popen(cmd, "w");
  if (!cc) return 1;
  fprintf(cc, "int %s_answer(void) { return 42; }\n", name);
  if (pclose(cc) != 0) return 1;
  if (weights) {
    FILE* w = fopen(weights, "w");
    if (!w) return 1;
    fclose(w);
  }
  return 0;
}
