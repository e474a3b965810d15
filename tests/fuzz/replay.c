// replay.c: runs a fuzz harness over files without libFuzzer, for ctest and for reproducing a
// finding in any build (gcc, sanitizers or none).
//   fuzz_<name>_replay PATH...   each PATH a file or a directory of files (not recursive)
// Exits 0 when every input ran; a broken promise or a sanitizer finding ends the process first.
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "src/base/util.h"
#include "tests/fuzz/fuzz.h"

static int compare_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_file(const char *path) {
  size_t size;
  Error err;
  unsigned char *data = read_file(path, &size, &err);
  if (!data) {
    fprintf(stderr, "replay: %s\n", err.msg);
    return -1;
  }
  // A copy of exactly `size` bytes, so that a harness reading past its input is caught by
  // AddressSanitizer as it would be under libFuzzer.
  unsigned char *input = malloc_check(size);
  memcpy(input, data, size);
  free(data);
  LLVMFuzzerTestOneInput(input, size);
  free(input);
  return 0;
}

// Runs every regular file of dir in name order; returns how many, or -1.
static int run_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  char **names = NULL;
  int count = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    char path[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
    if (count == cap) {
      cap = cap ? 2 * cap : 64;
      char **grown = malloc_check(sizeof *grown * (size_t)cap);
      if (count) memcpy(grown, names, sizeof *grown * (size_t)count);
      free(names);
      names = grown;
    }
    names[count] = malloc_check(strlen(path) + 1);
    strcpy(names[count++], path);
  }
  closedir(d);
  if (count > 1) qsort(names, (size_t)count, sizeof *names, compare_names);  // names may be NULL
  int rc = 0;
  for (int i = 0; i < count; i++) {
    if (rc == 0 && run_file(names[i]) != 0) rc = -1;
    free(names[i]);
  }
  free(names);
  return rc == 0 ? count : -1;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
    return 2;
  }
  int total = 0;
  for (int i = 1; i < argc; i++) {
    struct stat sb;
    int n = stat(argv[i], &sb) != 0  ? -1
            : S_ISDIR(sb.st_mode)    ? run_dir(argv[i])
            : run_file(argv[i]) == 0 ? 1
                                     : -1;
    if (n < 0) {
      fprintf(stderr, "replay: cannot run '%s'\n", argv[i]);
      return 1;
    }
    total += n;
  }
  if (total == 0) {
    fprintf(stderr, "replay: no inputs in the given paths\n");
    return 1;
  }
  printf("replay: %d inputs ran without a finding\n", total);
  return 0;
}
