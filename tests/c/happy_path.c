/* The C ABI's happy path on the real plugin named by $RTPU_PLUGIN: open a
 * runtime, move buffers, compile and run StableHLO, serialise and reload. */
#include <math.h>
#include <stdint.h>
#include <time.h>

#include "check.h"

static const char MATMUL_TANH[] =
    "module @matmul_tanh {\n"
    "  func.func public @main(%a: tensor<2x3xf32>, %b: tensor<3x2xf32>) -> tensor<2x2xf32> {\n"
    "    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0]"
    " : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>\n"
    "    %1 = stablehlo.tanh %0 : tensor<2x2xf32>\n"
    "    return %1 : tensor<2x2xf32>\n"
    "  }\n"
    "}\n";

static rtpu_buffer *upload(const rtpu_runtime *rt, const float *data, size_t count,
                           const int64_t *dims, size_t num_dims) {
  rtpu_buffer_from_host_args args =
      from_host_args(data, count * sizeof(float), RTPU_DTYPE_FLOAT32, dims, num_dims);
  rtpu_buffer *buffer = NULL;
  CHECK_OK(rtpu_buffer_from_host(rt, &args, &buffer));
  CHECK(buffer != NULL);
  return buffer;
}

static void run_matmul(const rtpu_executable *exe, rtpu_buffer *a, rtpu_buffer *b, float out[4]) {
  const rtpu_buffer *arguments[2] = {a, b};
  rtpu_execute_args args = execute_args(arguments, 2);
  rtpu_buffer *outputs[1] = {NULL};
  CHECK_OK(rtpu_executable_execute(exe, &args, outputs, 1));
  CHECK(outputs[0] != NULL);
  CHECK_OK(rtpu_buffer_to_host(outputs[0], out, 4 * sizeof(float)));
  rtpu_buffer_destroy(outputs[0]);
}

int main(void) {
  CHECK(rtpu_abi_version() == RTPU_ABI_VERSION);
  CHECK(rtpu_version() == RTPU_VERSION);

  /* The plugin comes from $RTPU_PLUGIN; ask the CPU plugin for two devices. */
  rtpu_named_value device_count = {0};
  device_count.name = "cpu_device_count";
  device_count.value_type = RTPU_VALUE_INT64;
  device_count.int64_value = 2;
  rtpu_runtime_open_args open_args = {0};
  open_args.struct_size = RTPU_RUNTIME_OPEN_ARGS_STRUCT_SIZE;
  open_args.options = &device_count;
  open_args.num_options = 1;
  rtpu_runtime *rt = NULL;
  CHECK_OK(rtpu_runtime_open(&open_args, &rt));
  CHECK(strcmp(rtpu_runtime_platform_name(rt), "cpu") == 0);
  CHECK(strlen(rtpu_runtime_platform_version(rt)) > 0);
  CHECK(rtpu_runtime_device_count(rt) == 2);
  for (size_t i = 0; i < 2; i++) {
    rtpu_device_info info = {0};
    info.struct_size = RTPU_DEVICE_INFO_STRUCT_SIZE;
    CHECK_OK(rtpu_runtime_device_info(rt, i, &info));
    CHECK(strlen(info.kind) > 0);
    CHECK(strlen(info.description) > 0);
    CHECK(!info.has_memory_stats || info.bytes_in_use >= 0);
    /* The CPU plugin's devices report no core count; TPUs do. */
    bool found = true;
    int64_t cores = -7;
    CHECK_OK(rtpu_runtime_device_int_attribute(rt, i, "num_cores", &found, &cores));
    CHECK(!found && cores == -7);
  }

  /* Fresh random inputs in [-1, 1); the seed is printed to replay a failure. */
  unsigned seed = (unsigned)time(NULL);
  printf("happy_path: seed %u\n", seed);
  srand(seed);
  float a[6], b[6];
  for (int i = 0; i < 6; i++) {
    a[i] = 2.0f * (float)rand() / (float)RAND_MAX - 1.0f;
    b[i] = 2.0f * (float)rand() / (float)RAND_MAX - 1.0f;
  }
  const int64_t dims_a[2] = {2, 3}, dims_b[2] = {3, 2};
  rtpu_buffer *da = upload(rt, a, 6, dims_a, 2);
  rtpu_buffer *db = upload(rt, b, 6, dims_b, 2);

  uint32_t dtype = 0;
  size_t rank = 0, host_size = 0, device_size = 0;
  int64_t dims[2] = {0, 0};
  CHECK_OK(rtpu_buffer_dtype(da, &dtype));
  CHECK(dtype == RTPU_DTYPE_FLOAT32);
  CHECK_OK(rtpu_buffer_rank(da, &rank));
  CHECK(rank == 2);
  CHECK_OK(rtpu_buffer_dims(da, dims, 2));
  CHECK(dims[0] == 2 && dims[1] == 3);
  CHECK_OK(rtpu_buffer_host_size(da, &host_size));
  CHECK(host_size == sizeof a);
  CHECK_OK(rtpu_buffer_on_device_size(da, &device_size));
  CHECK(device_size >= sizeof a);

  rtpu_compile_args compile = compile_args(MATMUL_TANH, sizeof MATMUL_TANH - 1);
  rtpu_executable *exe = NULL;
  CHECK_OK(rtpu_executable_compile(rt, &compile, &exe));
  CHECK(rtpu_executable_num_devices(exe) == 1);
  CHECK(rtpu_executable_num_outputs(exe) == 1);

  float out[4];
  run_matmul(exe, da, db, out);
  for (int i = 0; i < 2; i++) {
    for (int j = 0; j < 2; j++) {
      double acc = 0;
      for (int k = 0; k < 3; k++) acc += (double)a[i * 3 + k] * (double)b[k * 2 + j];
      double want = tanh(acc);
      CHECK(fabs(out[i * 2 + j] - want) <= 1e-5 * fabs(want) + 1e-6);
    }
  }

  /* Serialise, reload, and run again: same numbers. */
  rtpu_bytes *bytes = NULL;
  CHECK_OK(rtpu_executable_serialize(exe, &bytes));
  CHECK(rtpu_bytes_size(bytes) > 0 && rtpu_bytes_data(bytes) != NULL);
  rtpu_executable *loaded = NULL;
  CHECK_OK(rtpu_executable_deserialize(rt, rtpu_bytes_data(bytes), rtpu_bytes_size(bytes), &loaded));
  rtpu_bytes_destroy(bytes);
  float again[4];
  run_matmul(loaded, da, db, again);
  CHECK(memcmp(out, again, sizeof out) == 0);

  /* Device-to-device copy. */
  rtpu_buffer *moved = NULL;
  CHECK_OK(rtpu_buffer_copy_to_device(da, 1, &moved));
  float back[6];
  CHECK_OK(rtpu_buffer_to_host(moved, back, sizeof back));
  CHECK(memcmp(back, a, sizeof a) == 0);

  /* Reference counting: children outlive the last runtime reference. */
  rtpu_runtime_retain(rt);
  rtpu_runtime_release(rt);
  rtpu_runtime_release(rt);
  run_matmul(exe, da, db, again);
  CHECK(memcmp(out, again, sizeof out) == 0);

  rtpu_buffer_destroy(moved);
  rtpu_executable_destroy(loaded);
  rtpu_executable_destroy(exe);
  rtpu_buffer_destroy(da);
  rtpu_buffer_destroy(db);
  printf("happy_path: ok\n");
  return 0;
}
