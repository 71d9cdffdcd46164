/* Minimal assertion helpers shared by the C tests of librtpu. */
#ifndef RTPU_TEST_CHECK_H
#define RTPU_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rtpu.h"

/* The header's size macros are what a C compiler lays the structs out as
 * (the Rust side checks them against Rust's layout). */
_Static_assert(RTPU_RUNTIME_OPEN_ARGS_STRUCT_SIZE == sizeof(rtpu_runtime_open_args), "runtime_open_args");
_Static_assert(RTPU_DEVICE_INFO_STRUCT_SIZE == sizeof(rtpu_device_info), "device_info");
_Static_assert(RTPU_BUFFER_FROM_HOST_ARGS_STRUCT_SIZE == sizeof(rtpu_buffer_from_host_args),
               "buffer_from_host_args");
_Static_assert(RTPU_COMPILE_ARGS_STRUCT_SIZE == sizeof(rtpu_compile_args), "compile_args");
_Static_assert(RTPU_EXECUTE_ARGS_STRUCT_SIZE == sizeof(rtpu_execute_args), "execute_args");
_Static_assert(RTPU_OP_OUTPUT_STRUCT_SIZE == sizeof(rtpu_op_output), "op_output");
_Static_assert(RTPU_CACHE_INFO_STRUCT_SIZE == sizeof(rtpu_cache_info), "cache_info");
_Static_assert(RTPU_COLLECTIVE_ARGS_STRUCT_SIZE == sizeof(rtpu_collective_args), "collective_args");
_Static_assert(RTPU_HOST_TRANSPORT_STRUCT_SIZE == sizeof(rtpu_host_transport), "host_transport");
_Static_assert(RTPU_SHARDING_STRUCT_SIZE == sizeof(rtpu_sharding), "sharding");

/* A float32 view of `s` (sizes and strides borrowed: they must outlive the
 * returned reference). */
static inline rtpu_tensor_ref f32_view(const rtpu_storage *s, int64_t offset, const int64_t *sizes,
                                       const int64_t *strides, size_t ndim) {
  return (rtpu_tensor_ref){.storage = s, .storage_offset = offset, .sizes = sizes,
                           .strides = strides, .ndim = ndim, .dtype = RTPU_DTYPE_FLOAT32};
}

/* Arguments that copy `data_size` bytes of `dtype` elements, shaped `dims`
 * (borrowed), to device 0. */
static inline rtpu_buffer_from_host_args from_host_args(const void *data, size_t data_size,
                                                        uint32_t dtype, const int64_t *dims,
                                                        size_t num_dims) {
  return (rtpu_buffer_from_host_args){.struct_size = RTPU_BUFFER_FROM_HOST_ARGS_STRUCT_SIZE,
                                      .data = data, .data_size = data_size, .dtype = dtype,
                                      .dims = dims, .num_dims = num_dims};
}

/* Arguments that compile `code_size` bytes of StableHLO for one device. */
static inline rtpu_compile_args compile_args(const char *code, size_t code_size) {
  return (rtpu_compile_args){.struct_size = RTPU_COMPILE_ARGS_STRUCT_SIZE, .code = code,
                             .code_size = code_size, .num_replicas = 1, .num_partitions = 1};
}

/* Arguments that run an executable on `num_args` buffers (borrowed), none
 * donated. */
static inline rtpu_execute_args execute_args(const rtpu_buffer *const *arguments, size_t num_args) {
  return (rtpu_execute_args){.struct_size = RTPU_EXECUTE_ARGS_STRUCT_SIZE, .arguments = arguments,
                             .num_args = num_args};
}

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

/* The call must succeed; otherwise print rtpu's message and fail. */
#define CHECK_OK(call)                                                        \
  do {                                                                        \
    rtpu_error *check_ok_err_ = (call);                                       \
    if (check_ok_err_ != NULL) {                                              \
      fprintf(stderr, "%s:%d: %s failed (%u): %s\n", __FILE__, __LINE__, #call, \
              rtpu_error_code(check_ok_err_), rtpu_error_message(check_ok_err_)); \
      rtpu_error_destroy(check_ok_err_);                                      \
      exit(1);                                                                \
    }                                                                         \
  } while (0)

/* The call must fail with `code` and a non-empty message containing `needle`
 * (NULL: any message). The error is destroyed. */
static inline void check_error(rtpu_error *err, unsigned code, const char *needle, const char *what,
                        const char *file, int line) {
  if (err == NULL) {
    fprintf(stderr, "%s:%d: %s succeeded; expected error %u\n", file, line, what, code);
    exit(1);
  }
  const char *message = rtpu_error_message(err);
  if (rtpu_error_code(err) != code || message == NULL || message[0] == '\0' ||
      (needle != NULL && strstr(message, needle) == NULL)) {
    fprintf(stderr, "%s:%d: %s gave error %u \"%s\"; expected %u containing \"%s\"\n", file, line,
            what, rtpu_error_code(err), message ? message : "(null)", code, needle ? needle : "");
    exit(1);
  }
  rtpu_error_destroy(err);
}

#define CHECK_ERROR(call, code, needle) check_error((call), (code), (needle), #call, __FILE__, __LINE__)

/* A runtime on $RTPU_PLUGIN with the plugin's default options. */
static inline rtpu_runtime *open_runtime(void) {
  rtpu_runtime_open_args args = {.struct_size = RTPU_RUNTIME_OPEN_ARGS_STRUCT_SIZE};
  rtpu_runtime *rt = NULL;
  CHECK_OK(rtpu_runtime_open(&args, &rt));
  return rt;
}

/* The current value of the metric named `name`; exits if there is none. */
static inline uint64_t metric(const char *name) {
  size_t index = 0;
  CHECK_OK(rtpu_metric_find(name, &index));
  uint64_t *values = calloc(index + 1, sizeof *values);
  CHECK(values != NULL);
  CHECK_OK(rtpu_metrics_read(values, index + 1));
  const uint64_t value = values[index];
  free(values);
  return value;
}

/* The id of the core op with this schema name; exits if there is none. */
static inline size_t find_op(const char *name) {
  for (size_t i = 0; i < rtpu_op_count(); i++) {
    if (strcmp(rtpu_op_name(i), name) == 0) return i;
  }
  fprintf(stderr, "op %s not found\n", name);
  exit(1);
}

/* Arguments of one collective on `rank`'s `input` (`root` for broadcast). */
static inline rtpu_collective_args collective_args(uint32_t collective, uint32_t op, size_t rank,
                                                   size_t root, rtpu_tensor_ref input) {
  return (rtpu_collective_args){.struct_size = RTPU_COLLECTIVE_ARGS_STRUCT_SIZE,
                                .collective = collective, .reduce_op = op, .rank = rank,
                                .root = root, .input = input};
}

/* Output `index` of `result`; its storage is a new reference for the caller. */
static inline rtpu_op_output op_output(const rtpu_op_result *result, size_t index) {
  rtpu_op_output out = {.struct_size = RTPU_OP_OUTPUT_STRUCT_SIZE};
  CHECK_OK(rtpu_op_result_get(result, index, &out));
  return out;
}

/* op(a, b) on two tensors: its first output's storage (one reference for
 * the caller). */
static inline rtpu_storage *call_binary(rtpu_runtime *rt, const char *op, rtpu_tensor_ref a,
                                        rtpu_tensor_ref b) {
  rtpu_op_arg args[2];
  memset(args, 0, sizeof args);
  args[0].tag = args[1].tag = RTPU_ARG_TENSOR;
  args[0].tensor = a;
  args[1].tensor = b;
  rtpu_op_result *result = NULL;
  CHECK_OK(rtpu_op_call(rt, find_op(op), args, 2, &result));
  rtpu_op_output out = op_output(result, 0);
  rtpu_op_result_destroy(result);
  return out.storage;
}

#endif
