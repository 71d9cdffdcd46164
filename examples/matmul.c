/* Compiles a StableHLO matmul, runs it through librtpu on the PJRT plugin
 * named by $RTPU_PLUGIN (XLA's CPU plugin by default in scripts/example), and
 * prints the result. Build: cc -std=c11 -Iinclude examples/matmul.c -Ltarget/release -lrtpu */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rtpu.h"

static const char MATMUL[] =
    "module @matmul {\n"
    "  func.func public @main(%a: tensor<2x3xf32>, %b: tensor<3x2xf32>) -> tensor<2x2xf32> {\n"
    "    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0]"
    " : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>\n"
    "    return %0 : tensor<2x2xf32>\n"
    "  }\n"
    "}\n";

/* Prints and frees `err`, then exits; returns when `err` is NULL (success). */
static void check(rtpu_error *err, const char *what) {
  if (err == NULL) return;
  fprintf(stderr, "%s failed: %s\n", what, rtpu_error_message(err));
  rtpu_error_destroy(err);
  exit(1);
}

static rtpu_buffer *upload(const rtpu_runtime *rt, const float *data, const int64_t dims[2]) {
  rtpu_buffer_from_host_args args;
  memset(&args, 0, sizeof args);
  args.struct_size = RTPU_BUFFER_FROM_HOST_ARGS_STRUCT_SIZE;
  args.data = data;
  args.data_size = (size_t)(dims[0] * dims[1]) * sizeof(float);
  args.dtype = RTPU_DTYPE_FLOAT32;
  args.dims = dims;
  args.num_dims = 2;
  rtpu_buffer *buffer = NULL;
  check(rtpu_buffer_from_host(rt, &args, &buffer), "rtpu_buffer_from_host");
  return buffer;
}

int main(void) {
  rtpu_runtime_open_args open_args;
  memset(&open_args, 0, sizeof open_args);
  open_args.struct_size = RTPU_RUNTIME_OPEN_ARGS_STRUCT_SIZE; /* plugin: $RTPU_PLUGIN */
  rtpu_runtime *rt = NULL;
  check(rtpu_runtime_open(&open_args, &rt), "rtpu_runtime_open");
  printf("platform %s (%s), %zu device(s)\n", rtpu_runtime_platform_name(rt),
         rtpu_runtime_platform_version(rt), rtpu_runtime_device_count(rt));

  const float a[6] = {1, 2, 3, 4, 5, 6};
  const float b[6] = {7, 8, 9, 10, 11, 12};
  const int64_t dims_a[2] = {2, 3}, dims_b[2] = {3, 2};
  rtpu_buffer *da = upload(rt, a, dims_a);
  rtpu_buffer *db = upload(rt, b, dims_b);

  rtpu_compile_args compile;
  memset(&compile, 0, sizeof compile);
  compile.struct_size = RTPU_COMPILE_ARGS_STRUCT_SIZE;
  compile.code = MATMUL;
  compile.code_size = sizeof MATMUL - 1;
  compile.num_replicas = 1;
  compile.num_partitions = 1;
  rtpu_executable *exe = NULL;
  check(rtpu_executable_compile(rt, &compile, &exe), "rtpu_executable_compile");

  const rtpu_buffer *arguments[2] = {da, db};
  rtpu_execute_args run;
  memset(&run, 0, sizeof run);
  run.struct_size = RTPU_EXECUTE_ARGS_STRUCT_SIZE;
  run.arguments = arguments;
  run.num_args = 2;
  rtpu_buffer *result = NULL;
  check(rtpu_executable_execute(exe, &run, &result, 1), "rtpu_executable_execute");

  float out[4];
  check(rtpu_buffer_to_host(result, out, sizeof out), "rtpu_buffer_to_host");
  printf("[[1 2 3] [4 5 6]] @ [[7 8] [9 10] [11 12]] =\n[[%g %g]\n [%g %g]]\n", out[0], out[1], out[2], out[3]);

  rtpu_buffer_destroy(result);
  rtpu_executable_destroy(exe);
  rtpu_buffer_destroy(da);
  rtpu_buffer_destroy(db);
  rtpu_runtime_release(rt);
  return 0;
}
