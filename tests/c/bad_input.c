/* Every C entry point given bad input returns an error with a message (or its
 * documented default) and the process lives on. Run under ASan and UBSan.
 * argv[1]: path of a fake plugin with the wrong PJRT major version. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>

#include "check.h"

enum { INVALID = RTPU_ERROR_CODE_INVALID_ARGUMENT };

static const char ADD_ONE[] =
    "module @add_one {\n"
    "  func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
    "    %one = stablehlo.constant dense<1.0> : tensor<4xf32>\n"
    "    %0 = stablehlo.add %x, %one : tensor<4xf32>\n"
    "    return %0 : tensor<4xf32>\n"
    "  }\n"
    "}\n";

static void errors_and_null_handles(void) {
  CHECK(rtpu_error_code(NULL) == RTPU_ERROR_CODE_OK);
  CHECK(strcmp(rtpu_error_message(NULL), "") == 0);
  rtpu_error_destroy(NULL);
  rtpu_buffer_destroy(NULL);
  rtpu_executable_destroy(NULL);
  rtpu_bytes_destroy(NULL);
  rtpu_runtime_retain(NULL);
  rtpu_runtime_release(NULL);
  CHECK(rtpu_runtime_platform_name(NULL) == NULL);
  CHECK(rtpu_runtime_platform_version(NULL) == NULL);
  CHECK(rtpu_runtime_device_count(NULL) == 0);
  CHECK(rtpu_executable_num_devices(NULL) == 0);
  CHECK(rtpu_executable_num_outputs(NULL) == 0);
  CHECK(rtpu_bytes_data(NULL) == NULL);
  CHECK(rtpu_bytes_size(NULL) == 0);
}

static void a_panic_is_an_error(void) {
  CHECK_ERROR(rtpu_testing_panic(), RTPU_ERROR_CODE_PANIC, "rtpu_testing_panic");
  /* The library still works afterwards. */
  CHECK(rtpu_abi_version() == RTPU_ABI_VERSION);
}

static void opening_bad_plugins(const char *fake_plugin) {
  rtpu_runtime *rt = (rtpu_runtime *)(uintptr_t)0x1; /* sentinel: must stay untouched */
  rtpu_runtime_open_args args = {0};
  args.struct_size = RTPU_RUNTIME_OPEN_ARGS_STRUCT_SIZE;

  CHECK_ERROR(rtpu_runtime_open(NULL, &rt), INVALID, "args");
  CHECK_ERROR(rtpu_runtime_open(&args, NULL), INVALID, "runtime_out");
  args.struct_size = 8;
  CHECK_ERROR(rtpu_runtime_open(&args, &rt), INVALID, "struct_size");
  args.struct_size = RTPU_RUNTIME_OPEN_ARGS_STRUCT_SIZE;

  args.plugin_path = "/nonexistent/xla_cpu_pjrt.so";
  CHECK_ERROR(rtpu_runtime_open(&args, &rt), RTPU_ERROR_CODE_NOT_FOUND, "xla-cpu-pjrt");

  args.plugin_path = fake_plugin;
  CHECK_ERROR(rtpu_runtime_open(&args, &rt), RTPU_ERROR_CODE_FAILED_PRECONDITION,
              "implements PJRT C API 99.7, but rtpu was built against " RTPU_TEST_BUILT_PJRT_API ";");
  args.plugin_path = NULL;

  rtpu_named_value option = {0};
  option.name = "cpu_device_count";
  option.value_type = 42;
  args.options = &option;
  args.num_options = 1;
  CHECK_ERROR(rtpu_runtime_open(&args, &rt), INVALID, "value_type");
  option.value_type = RTPU_VALUE_INT64;
  option.name = NULL;
  CHECK_ERROR(rtpu_runtime_open(&args, &rt), INVALID, "name");
  args.options = NULL;
  CHECK_ERROR(rtpu_runtime_open(&args, &rt), INVALID, "options");
  args.num_options = 0;

  /* No path and no $RTPU_PLUGIN: the error says how to get the CPU plugin. */
  const char *saved = getenv("RTPU_PLUGIN");
  char *copy = saved ? strdup(saved) : NULL;
  unsetenv("RTPU_PLUGIN");
  CHECK_ERROR(rtpu_runtime_open(&args, &rt), RTPU_ERROR_CODE_NOT_FOUND, "xla-cpu-pjrt");
  if (copy != NULL) {
    setenv("RTPU_PLUGIN", copy, 1);
    free(copy);
  }
  CHECK(rt == (rtpu_runtime *)(uintptr_t)0x1);
}

/* A store that only counts its releases: the CPU plugin never calls it (its
 * processes share no collectives), so this checks what rtpu owns: the
 * table's checks, the context's one release, the global device queries. */
static int32_t unused_put(void *context, const char *key, size_t key_size, const void *value,
                          size_t value_size, char *error, size_t error_size) {
  (void)context, (void)key, (void)key_size, (void)value, (void)value_size;
  snprintf(error, error_size, "not expected");
  return 2;
}
static int32_t unused_get(void *context, const char *key, size_t key_size, int64_t timeout_ms,
                          void **value_out, size_t *value_size_out, char *error, size_t error_size) {
  (void)context, (void)key, (void)key_size, (void)timeout_ms, (void)value_out, (void)value_size_out;
  snprintf(error, error_size, "not expected");
  return 2;
}
static void unused_free(void *context, void *value) { (void)context, (void)value; }
static void count_release(void *context) { ++*(int *)context; }

static void a_key_value_store_is_checked_kept_and_released_once(void) {
  int releases = 0;
  rtpu_key_value_store store = {0};
  store.struct_size = RTPU_KEY_VALUE_STORE_STRUCT_SIZE;
  store.context = &releases;
  store.put = unused_put;
  store.get = unused_get;
  store.free_value = unused_free;
  store.release = count_release;
  rtpu_named_value options[2] = {{0}, {0}};
  options[0].name = "node_id";
  options[0].value_type = RTPU_VALUE_INT64;
  options[0].int64_value = 0;
  options[1].name = "num_nodes";
  options[1].value_type = RTPU_VALUE_INT64;
  options[1].int64_value = 1;
  rtpu_runtime_open_args args = {0};
  args.struct_size = RTPU_RUNTIME_OPEN_ARGS_STRUCT_SIZE;
  args.options = options;
  args.num_options = 2;
  args.key_value_store = &store;
  rtpu_runtime *rt = NULL;
  CHECK_OK(rtpu_runtime_open(&args, &rt));
  CHECK(rtpu_runtime_global_device_count(rt) == rtpu_runtime_device_count(rt));
  CHECK(rtpu_runtime_process_index(rt) == 0);
  CHECK(releases == 0);
  rtpu_runtime_release(rt);
  CHECK(releases == 1);

  /* A table without get: refused, and its context released all the same. */
  store.get = NULL;
  CHECK_ERROR(rtpu_runtime_open(&args, &rt), INVALID, "get");
  CHECK(releases == 2);
  /* A table too short to read is refused before anything in it is used. */
  store.get = unused_get;
  store.struct_size = 8;
  CHECK_ERROR(rtpu_runtime_open(&args, &rt), INVALID, "rtpu_key_value_store.struct_size");
  CHECK(releases == 2);
  /* The args of ABI v0 end before key_value_store: it is not read. */
  args.struct_size = 32;
  args.key_value_store = (const rtpu_key_value_store *)(uintptr_t)0x1;
  CHECK_OK(rtpu_runtime_open(&args, &rt));
  rtpu_runtime_release(rt);
  CHECK(rtpu_runtime_global_device_count(NULL) == 0);
  CHECK(rtpu_runtime_process_index(NULL) == 0);
}

static void bad_runtime_queries(rtpu_runtime *rt) {
  rtpu_device_info info = {0};
  info.struct_size = RTPU_DEVICE_INFO_STRUCT_SIZE;
  CHECK_ERROR(rtpu_runtime_device_info(NULL, 0, &info), INVALID, "runtime");
  CHECK_ERROR(rtpu_runtime_device_info(rt, 0, NULL), INVALID, "info_out");
  CHECK_ERROR(rtpu_runtime_device_info(rt, rtpu_runtime_device_count(rt), &info), INVALID, "device index");
  info.struct_size = 4;
  CHECK_ERROR(rtpu_runtime_device_info(rt, 0, &info), INVALID, "struct_size");
  CHECK(info.kind == NULL);

  bool found = false;
  int64_t value = 0;
  CHECK_ERROR(rtpu_runtime_device_int_attribute(rt, 0, NULL, &found, &value), INVALID, "name");
  CHECK_ERROR(rtpu_runtime_device_int_attribute(rt, 0, "num_cores", NULL, &value), INVALID, "found_out");
  CHECK_ERROR(rtpu_runtime_device_int_attribute(rt, rtpu_runtime_device_count(rt), "num_cores", &found, &value),
              INVALID, "device index");
}

static void bad_buffers(rtpu_runtime *rt) {
  float data[4] = {1, 2, 3, 4};
  int64_t dims[1] = {4};
  rtpu_buffer_from_host_args args = from_host_args(data, sizeof data, RTPU_DTYPE_FLOAT32, dims, 1);
  rtpu_buffer *buffer = NULL;

  CHECK_ERROR(rtpu_buffer_from_host(NULL, &args, &buffer), INVALID, "runtime");
  CHECK_ERROR(rtpu_buffer_from_host(rt, NULL, &buffer), INVALID, "args");
  CHECK_ERROR(rtpu_buffer_from_host(rt, &args, NULL), INVALID, "buffer_out");
  args.struct_size = 16;
  CHECK_ERROR(rtpu_buffer_from_host(rt, &args, &buffer), INVALID, "struct_size");
  args.struct_size = RTPU_BUFFER_FROM_HOST_ARGS_STRUCT_SIZE;
  args.dtype = 999;
  CHECK_ERROR(rtpu_buffer_from_host(rt, &args, &buffer), INVALID, "dtype");
  args.dtype = RTPU_DTYPE_FLOAT32;
  args.data_size = 15;
  CHECK_ERROR(rtpu_buffer_from_host(rt, &args, &buffer), INVALID, "16 bytes");
  args.data_size = sizeof data;
  args.data = NULL;
  CHECK_ERROR(rtpu_buffer_from_host(rt, &args, &buffer), INVALID, "data");
  args.data = data;
  args.dims = NULL;
  CHECK_ERROR(rtpu_buffer_from_host(rt, &args, &buffer), INVALID, "dims");
  args.dims = dims;
  dims[0] = -4;
  CHECK_ERROR(rtpu_buffer_from_host(rt, &args, &buffer), INVALID, "dimension");
  dims[0] = 4;
  args.device_index = 1000;
  CHECK_ERROR(rtpu_buffer_from_host(rt, &args, &buffer), INVALID, "device index");
  args.device_index = 0;
  CHECK(buffer == NULL);

  CHECK_OK(rtpu_buffer_from_host(rt, &args, &buffer));
  float out[4];
  size_t size = 0, rank = 0;
  uint32_t dtype = 0;
  int64_t out_dims[2];
  rtpu_buffer *copy = NULL;
  CHECK_ERROR(rtpu_buffer_to_host(NULL, out, sizeof out), INVALID, "buffer");
  CHECK_ERROR(rtpu_buffer_to_host(buffer, NULL, sizeof out), INVALID, "dst");
  CHECK_ERROR(rtpu_buffer_to_host(buffer, out, 3), INVALID, "dst_size");
  CHECK_ERROR(rtpu_buffer_host_size(NULL, &size), INVALID, "buffer");
  CHECK_ERROR(rtpu_buffer_host_size(buffer, NULL), INVALID, "size_out");
  CHECK_ERROR(rtpu_buffer_on_device_size(NULL, &size), INVALID, "buffer");
  CHECK_ERROR(rtpu_buffer_on_device_size(buffer, NULL), INVALID, "size_out");
  CHECK_ERROR(rtpu_buffer_dtype(NULL, &dtype), INVALID, "buffer");
  CHECK_ERROR(rtpu_buffer_dtype(buffer, NULL), INVALID, "dtype_out");
  CHECK_ERROR(rtpu_buffer_rank(NULL, &rank), INVALID, "buffer");
  CHECK_ERROR(rtpu_buffer_rank(buffer, NULL), INVALID, "rank_out");
  CHECK_ERROR(rtpu_buffer_dims(NULL, out_dims, 1), INVALID, "buffer");
  CHECK_ERROR(rtpu_buffer_dims(buffer, out_dims, 2), INVALID, "rank");
  CHECK_ERROR(rtpu_buffer_dims(buffer, NULL, 1), INVALID, "dims_out");
  CHECK_ERROR(rtpu_buffer_copy_to_device(NULL, 0, &copy), INVALID, "buffer");
  CHECK_ERROR(rtpu_buffer_copy_to_device(buffer, 0, NULL), INVALID, "buffer_out");
  CHECK_ERROR(rtpu_buffer_copy_to_device(buffer, 1000, &copy), INVALID, "device index");
  CHECK(copy == NULL && size == 0 && rank == 0 && dtype == 0);

  /* The buffer is intact after all of that. */
  CHECK_OK(rtpu_buffer_to_host(buffer, out, sizeof out));
  CHECK(memcmp(out, data, sizeof data) == 0);
  rtpu_buffer_destroy(buffer);
}

static void bad_programs_and_executions(rtpu_runtime *rt) {
  static const char NOT_STABLEHLO[] = "module { this is not stablehlo }";
  rtpu_compile_args compile = compile_args(NOT_STABLEHLO, sizeof NOT_STABLEHLO - 1);
  rtpu_executable *exe = NULL;

  /* XLA's own message comes through; its code is the plugin's choice. */
  rtpu_error *parse_error = rtpu_executable_compile(rt, &compile, &exe);
  CHECK(parse_error != NULL && strstr(rtpu_error_message(parse_error), "PJRT_Client_Compile") != NULL);
  rtpu_error_destroy(parse_error);

  /* Text without a NUL, ending inside an identifier: the plugin's lexer
   * used to read past it (an ASan heap-buffer-overflow; found by the
   * stablehlo fuzz target). */
  static const char IDENTIFIER_AT_END[] = "mudlcon.l";
  char *unterminated = malloc(sizeof IDENTIFIER_AT_END - 1);
  CHECK(unterminated != NULL);
  memcpy(unterminated, IDENTIFIER_AT_END, sizeof IDENTIFIER_AT_END - 1);
  compile.code = unterminated;
  compile.code_size = sizeof IDENTIFIER_AT_END - 1;
  parse_error = rtpu_executable_compile(rt, &compile, &exe);
  CHECK(parse_error != NULL && exe == NULL);
  rtpu_error_destroy(parse_error);
  free(unterminated);
  compile = compile_args(NOT_STABLEHLO, sizeof NOT_STABLEHLO - 1);
  CHECK_ERROR(rtpu_executable_compile(NULL, &compile, &exe), INVALID, "runtime");
  CHECK_ERROR(rtpu_executable_compile(rt, NULL, &exe), INVALID, "args");
  CHECK_ERROR(rtpu_executable_compile(rt, &compile, NULL), INVALID, "executable_out");
  compile.struct_size = 24;
  CHECK_ERROR(rtpu_executable_compile(rt, &compile, &exe), INVALID, "struct_size");
  compile.struct_size = RTPU_COMPILE_ARGS_STRUCT_SIZE;
  compile.code = NULL;
  CHECK_ERROR(rtpu_executable_compile(rt, &compile, &exe), INVALID, "code");
  compile.code = ADD_ONE;
  compile.code_size = sizeof ADD_ONE - 1;
  compile.num_replicas = 0;
  CHECK_ERROR(rtpu_executable_compile(rt, &compile, &exe), INVALID, "num_replicas");
  compile.num_replicas = 1;
  /* More replicas times partitions than devices, or a product that
   * overflows: refused before the plugin sees them. */
  compile.num_partitions = SIZE_MAX;
  CHECK_ERROR(rtpu_executable_compile(rt, &compile, &exe), INVALID, "devices");
  compile.num_replicas = 2;
  compile.num_partitions = SIZE_MAX / 2 + 1;
  CHECK_ERROR(rtpu_executable_compile(rt, &compile, &exe), INVALID, "devices");
  compile.num_replicas = rtpu_runtime_device_count(rt) + 1;
  compile.num_partitions = 1;
  CHECK_ERROR(rtpu_executable_compile(rt, &compile, &exe), INVALID, "devices");
  compile.num_replicas = 1;
  CHECK(exe == NULL);
  CHECK_OK(rtpu_executable_compile(rt, &compile, &exe));

  float data[4] = {1, 2, 3, 4};
  int64_t dims4[1] = {4}, dims22[2] = {2, 2};
  rtpu_buffer_from_host_args upload = from_host_args(data, sizeof data, RTPU_DTYPE_FLOAT32, dims4, 1);
  rtpu_buffer *good = NULL, *wrong_shape = NULL, *wrong_dtype = NULL;
  CHECK_OK(rtpu_buffer_from_host(rt, &upload, &good));
  upload.dims = dims22;
  upload.num_dims = 2;
  CHECK_OK(rtpu_buffer_from_host(rt, &upload, &wrong_shape));
  upload.dims = dims4;
  upload.num_dims = 1;
  upload.dtype = RTPU_DTYPE_INT32;
  CHECK_OK(rtpu_buffer_from_host(rt, &upload, &wrong_dtype));

  const rtpu_buffer *arguments[2] = {good, good};
  rtpu_execute_args run = execute_args(arguments, 1);
  rtpu_buffer *outputs[1] = {NULL};

  CHECK_ERROR(rtpu_executable_execute(NULL, &run, outputs, 1), INVALID, "executable");
  CHECK_ERROR(rtpu_executable_execute(exe, NULL, outputs, 1), INVALID, "args");
  CHECK_ERROR(rtpu_executable_execute(exe, &run, NULL, 1), INVALID, "outputs_out");
  CHECK_ERROR(rtpu_executable_execute(exe, &run, outputs, 2), INVALID, "outputs_len");
  run.struct_size = 8;
  CHECK_ERROR(rtpu_executable_execute(exe, &run, outputs, 1), INVALID, "struct_size");
  run.struct_size = RTPU_EXECUTE_ARGS_STRUCT_SIZE;
  run.num_args = 2;
  CHECK_ERROR(rtpu_executable_execute(exe, &run, outputs, 1), INVALID, "argument count");
  run.num_args = 0;
  CHECK_ERROR(rtpu_executable_execute(exe, &run, outputs, 1), INVALID, "argument count");
  run.num_args = 1;
  arguments[0] = wrong_shape;
  CHECK_ERROR(rtpu_executable_execute(exe, &run, outputs, 1), INVALID, "float32[2, 2]");
  arguments[0] = wrong_dtype;
  CHECK_ERROR(rtpu_executable_execute(exe, &run, outputs, 1), INVALID, "int32[4]");
  arguments[0] = NULL;
  CHECK_ERROR(rtpu_executable_execute(exe, &run, outputs, 1), INVALID, "arguments[0]");
  arguments[0] = good;
  run.arguments = NULL;
  CHECK_ERROR(rtpu_executable_execute(exe, &run, outputs, 1), INVALID, "arguments");
  run.arguments = arguments;
  size_t donated = 3;
  run.donated = &donated;
  run.num_donated = 1;
  CHECK_ERROR(rtpu_executable_execute(exe, &run, outputs, 1), INVALID, "donated");
  run.donated = NULL;
  CHECK_ERROR(rtpu_executable_execute(exe, &run, outputs, 1), INVALID, "donated");
  run.num_donated = 0;
  CHECK(outputs[0] == NULL);

  /* Still runs correctly afterwards. */
  CHECK_OK(rtpu_executable_execute(exe, &run, outputs, 1));
  float out[4];
  CHECK_OK(rtpu_buffer_to_host(outputs[0], out, sizeof out));
  for (int i = 0; i < 4; i++) CHECK(out[i] == data[i] + 1.0f);
  rtpu_buffer_destroy(outputs[0]);

  rtpu_bytes *bytes = NULL;
  rtpu_executable *loaded = NULL;
  CHECK_ERROR(rtpu_executable_serialize(NULL, &bytes), INVALID, "executable");
  CHECK_ERROR(rtpu_executable_serialize(exe, NULL), INVALID, "bytes_out");
  CHECK_ERROR(rtpu_executable_deserialize(NULL, "x", 1, &loaded), INVALID, "runtime");
  CHECK_ERROR(rtpu_executable_deserialize(rt, NULL, 1, &loaded), INVALID, "data");
  CHECK_ERROR(rtpu_executable_deserialize(rt, "x", 1, NULL), INVALID, "executable_out");
  CHECK_ERROR(rtpu_executable_deserialize(rt, "garbage", 7, &loaded), INVALID, "magic");
  CHECK(bytes == NULL && loaded == NULL);

  /* Corrupted or truncated bytes never reach the plugin, which aborts the
   * process on some (found by the deserialize fuzz target). */
  CHECK_OK(rtpu_executable_serialize(exe, &bytes));
  const size_t size = rtpu_bytes_size(bytes);
  uint8_t *copy = malloc(size);
  CHECK(copy != NULL);
  memcpy(copy, rtpu_bytes_data(bytes), size);
  copy[size / 2] ^= 0x40;
  CHECK_ERROR(rtpu_executable_deserialize(rt, copy, size, &loaded), INVALID, "checksum");
  copy[size / 2] ^= 0x40;
  CHECK_ERROR(rtpu_executable_deserialize(rt, copy, size - 1, &loaded), INVALID, "checksum");
  CHECK_ERROR(rtpu_executable_deserialize(rt, copy, 12, &loaded), INVALID, "truncated");
  CHECK(loaded == NULL);
  CHECK_OK(rtpu_executable_deserialize(rt, copy, size, &loaded));
  CHECK(rtpu_executable_num_outputs(loaded) == 1);
  rtpu_executable_destroy(loaded);
  free(copy);
  rtpu_bytes_destroy(bytes);

  rtpu_buffer_destroy(good);
  rtpu_buffer_destroy(wrong_shape);
  rtpu_buffer_destroy(wrong_dtype);
  rtpu_executable_destroy(exe);
}

int main(int argc, char **argv) {
  CHECK(argc == 2);
  errors_and_null_handles();
  a_panic_is_an_error();
  opening_bad_plugins(argv[1]);
  a_key_value_store_is_checked_kept_and_released_once();
  rtpu_runtime *rt = open_runtime();
  bad_runtime_queries(rt);
  bad_buffers(rt);
  bad_programs_and_executions(rt);
  a_panic_is_an_error();
  rtpu_runtime_release(rt);
  printf("bad_input: ok\n");
  return 0;
}
