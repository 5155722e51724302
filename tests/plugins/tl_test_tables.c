/* Shared by the test hook library (tl_test_hook.c) and the static_hook test, which links it
 * into the test program. Plain C on purpose: a hook library needs no C++ and no torch. */
#define _GNU_SOURCE
#include "tl_test_tables.h"

#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char* error, size_t error_size, const char* what, const char* path) {
  snprintf(error, error_size, "%s%s%s", what, path ? ": " : "", path ? path : "");
  return 1;
}

static int load_one(const char* path, tl_test_register_table_fn register_table,
                    int device_index, char* error, size_t error_size) {
  FILE* f = fopen(path, "rb");
  if (!f) return fail(error, error_size, "cannot open table", path);
  char magic[4];
  int32_t layer = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  int rc = 1;
  float* data = NULL;
  if (fread(magic, 1, 4, f) != 4 || memcmp(magic, "TLTB", 4) != 0 ||
      fread(&layer, sizeof layer, 1, f) != 1 || fread(&rows, sizeof rows, 1, f) != 1 ||
      fread(&cols, sizeof cols, 1, f) != 1 || rows <= 0 || cols <= 0) {
    fail(error, error_size, "not a table file", path);
  } else if (!(data = malloc((size_t)(rows * cols) * sizeof(float)))) {
    fail(error, error_size, "out of memory reading", path);
  } else if (fread(data, sizeof(float), (size_t)(rows * cols), f) != (size_t)(rows * cols)) {
    fail(error, error_size, "table file is truncated", path);
  } else {
    rc = register_table(layer, data, rows, cols, device_index, error, error_size);
  }
  free(data);
  fclose(f);
  return rc;
}

int tl_test_load_tables(const char* directory, int device_index, char* error,
                        size_t error_size) {
  tl_test_register_table_fn register_table;
  /* POSIX's way to turn dlsym's object pointer into a function pointer in ISO C. */
  *(void**)&register_table = dlsym(RTLD_DEFAULT, "tl_test_register_table");
  if (!register_table) {
    return fail(error, error_size,
                "the tl_test op library is not loaded (name it in OP_LIBRARIES)", NULL);
  }
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/weights", directory);
  DIR* d = opendir(dir);
  if (!d) return fail(error, error_size, "no weights directory", dir);
  int tables = 0;
  int rc = 0;
  struct dirent* e;
  while (rc == 0 && (e = readdir(d)) != NULL) {
    const size_t n = strlen(e->d_name);
    if (n < 5 || strcmp(e->d_name + n - 4, ".bin") != 0) continue;
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    rc = load_one(path, register_table, device_index, error, error_size);
    if (rc == 0) ++tables;
  }
  closedir(d);
  if (rc == 0 && tables == 0) rc = fail(error, error_size, "no weights/*.bin files in", dir);
  if (rc != 0 && tables > 0) tl_test_unload_tables();
  return rc;
}

void tl_test_unload_tables(void) {
  tl_test_unregister_tables_fn unregister;
  *(void**)&unregister = dlsym(RTLD_DEFAULT, "tl_test_unregister_tables");
  if (unregister) unregister();
}
