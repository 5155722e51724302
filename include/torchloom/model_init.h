/*
 * torchloom/model_init.h: the C ABI of a model-init hook library (MODEL_INIT_LIBRARY).
 *
 * A hook library runs native set-up for one model before the model loads (for example, it
 * reads sidecar weight files and registers them where the model's custom ops find them) and
 * tears it down after the model is destroyed. It is plain C, so a hook may be written in C,
 * C++ or anything that exports C symbols, and it does not depend on torch's C++ ABI.
 *
 * A hook library exports three functions:
 *
 *   unsigned torchloom_model_init_abi_version(void);
 *       returns TORCHLOOM_MODEL_INIT_ABI_VERSION as the library was compiled with; torchloom
 *       refuses a library whose version differs from its own.
 *
 *   int torchloom_model_init(const torchloom_model_init_args* args, void** handle,
 *                            char* error, size_t error_size);
 *       runs once per runner, before the model loads, with CUDA initialised and current on
 *       the runner's device. Returns TORCHLOOM_MODEL_INIT_OK and sets *handle (may be NULL)
 *       on success. On failure returns any other value, writes a NUL-terminated message of
 *       at most error_size bytes (including the NUL) to `error`, and releases whatever it
 *       acquired: torchloom will not call fini, and unloads the library.
 *
 *   void torchloom_model_fini(void* handle);
 *       runs exactly once, after the model is destroyed, with the handle init returned;
 *       then torchloom unloads the library (dlclose).
 *
 * Each runner loads the library with dlopen(RTLD_NOW | RTLD_LOCAL): its symbols are not
 * visible to other libraries. Runners of several models may load the same library at once;
 * init and fini calls of different runners may run on different threads concurrently.
 *
 * Libraries written for Triton's PyTorch-backend hook are accepted unchanged:
 *   void* triton_pytorch_model_init(const char* model_dir, int device_index);
 *   void triton_pytorch_model_fini(void* handle);  (or triton_pytorch_model_release)
 * Such a hook is given the version directory (the one holding the model file), as Triton
 * gives it, and cannot report a failure: whatever it returns, NULL included, is the handle.
 */
#ifndef TORCHLOOM_MODEL_INIT_H
#define TORCHLOOM_MODEL_INIT_H

#include <stddef.h>

/* Bumped whenever the functions or torchloom_model_init_args change incompatibly. */
#define TORCHLOOM_MODEL_INIT_ABI_VERSION 1u

/* torchloom_model_init's return value on success; any other value is a failure. */
#define TORCHLOOM_MODEL_INIT_OK 0

/* Put in front of the three functions a hook library defines. */
#if defined(__cplusplus)
#define TORCHLOOM_MODEL_INIT_EXPORT extern "C" __attribute__((visibility("default")))
#else
#define TORCHLOOM_MODEL_INIT_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* What init is told about the model. The strings live until init returns. */
typedef struct torchloom_model_init_args {
  const char* model_name;      /* the model's name (config.pbtxt's, else the directory's) */
  const char* model_directory; /* the model directory (holds config.pbtxt, if any) */
  const char* version_directory; /* the directory holding the model file (for a Triton
                                    layout, <model_directory>/<version>) */
  int device_index;              /* the CUDA device index, or -1 for the CPU */
} torchloom_model_init_args;

typedef unsigned (*torchloom_model_init_abi_version_fn)(void);
typedef int (*torchloom_model_init_fn)(const torchloom_model_init_args* args, void** handle,
                                       char* error, size_t error_size);
typedef void (*torchloom_model_fini_fn)(void* handle);

#ifdef __cplusplus
}
#endif

#endif /* TORCHLOOM_MODEL_INIT_H */
