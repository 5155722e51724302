/* The test model's embedding tables: table_<layer>.bin files in weights/ that a model-init hook
 * reads and registers with the tl_test op library's registry (tl_test_ops.cpp).
 *
 * File format, little-endian: "TLTB", int32 layer, int64 rows, int64 cols, then rows*cols
 * float32 values, row-major. */
#ifndef TL_TEST_TABLES_H
#define TL_TEST_TABLES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What the op library exports (found with dlsym: it is loaded with RTLD_GLOBAL). */
typedef int (*tl_test_register_table_fn)(int32_t layer, const float* data, int64_t rows,
                                         int64_t cols, int device_index, char* error,
                                         size_t error_size);
typedef void (*tl_test_unregister_tables_fn)(void);

/* Reads the .bin files in <directory>/weights and registers each table on the device (-1: CPU).
 * Returns 0, or 1 with a message in `error` (nothing stays registered). */
int tl_test_load_tables(const char* directory, int device_index, char* error,
                        size_t error_size);

/* Unregisters every table. */
void tl_test_unload_tables(void);

#ifdef __cplusplus
}
#endif

#endif
