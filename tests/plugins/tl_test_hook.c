/* The test model-init hook: registers the model's embedding tables (the .bin files in
 * weights/) with the tl_test op library at init and unregisters them at fini. Built in several variants:
 *   (none)                 the torchloom ABI (torchloom/model_init.h)
 *   TL_HOOK_TRITON=1|2     Triton's ABI, released by triton_pytorch_model_fini (1) or
 *                          triton_pytorch_model_release (2)
 *   TL_HOOK_ABI_VERSION=N  reports another ABI version
 *   TL_HOOK_NO_FINI        exports no fini
 *   TL_HOOK_WITH_DEP       needs libtl_test_dep.so (DT_NEEDED), found through its RUNPATH */
#include <torchloom/model_init.h>

#include "tl_test_tables.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The hook's state: heap memory, so a fini that never runs (or runs twice) shows under
 * AddressSanitizer. */
typedef struct hook_state {
  char directory[4096];
} hook_state;

static hook_state* make_state(const char* directory) {
  hook_state* s = (hook_state*)malloc(sizeof(hook_state));
  if (s) snprintf(s->directory, sizeof s->directory, "%s", directory);
  return s;
}

#ifdef TL_HOOK_WITH_DEP
int tl_test_dep_value(void);
#endif

#ifndef TL_HOOK_NO_FINI
static void release(void* handle) {
  tl_test_unload_tables();
  free(handle);
}
#endif

#ifndef TL_HOOK_TRITON

#ifndef TL_HOOK_ABI_VERSION
#define TL_HOOK_ABI_VERSION TORCHLOOM_MODEL_INIT_ABI_VERSION
#endif

TORCHLOOM_MODEL_INIT_EXPORT unsigned torchloom_model_init_abi_version(void) {
  return TL_HOOK_ABI_VERSION;
}

TORCHLOOM_MODEL_INIT_EXPORT int torchloom_model_init(const torchloom_model_init_args* args,
                                                     void** handle, char* error,
                                                     size_t error_size) {
#ifdef TL_HOOK_WITH_DEP
  if (tl_test_dep_value() != 42) return 1;
#endif
  if (tl_test_load_tables(args->model_directory, args->device_index, error, error_size) != 0) {
    return 1;
  }
  *handle = make_state(args->model_directory);
  return TORCHLOOM_MODEL_INIT_OK;
}

#ifndef TL_HOOK_NO_FINI
TORCHLOOM_MODEL_INIT_EXPORT void torchloom_model_fini(void* handle) { release(handle); }
#endif

#else /* Triton's ABI: the version directory; no way to report a failure but NULL. */

TORCHLOOM_MODEL_INIT_EXPORT void* triton_pytorch_model_init(const char* model_dir,
                                                            int device_index) {
  char error[512];
  if (tl_test_load_tables(model_dir, device_index, error, sizeof error) != 0) {
    fprintf(stderr, "tl_test_hook: %s\n", error);
    return NULL;
  }
  return make_state(model_dir);
}

#if TL_HOOK_TRITON == 1
TORCHLOOM_MODEL_INIT_EXPORT void triton_pytorch_model_fini(void* handle) { release(handle); }
#else
TORCHLOOM_MODEL_INIT_EXPORT void triton_pytorch_model_release(void* handle) { release(handle); }
#endif

#endif
