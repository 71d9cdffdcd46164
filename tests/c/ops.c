/* Storages, strided views and the generic op call through the C ABI, with
 * bad input for each entry point. */
#include <stdint.h>

#include "check.h"

enum { INVALID = RTPU_ERROR_CODE_INVALID_ARGUMENT };

/* Every metric has a name that finds it, a known unit and a help line. */
static void check_metric_descriptions(void) {
  const size_t count = rtpu_metric_count();
  CHECK(count >= 15);
  for (size_t i = 0; i < count; i++) {
    const char *name = NULL, *unit = NULL, *help = NULL;
    size_t found = count;
    CHECK_OK(rtpu_metric_describe(i, &name, &unit, &help));
    CHECK_OK(rtpu_metric_find(name, &found));
    CHECK(found == i && help[0] != '\0');
    CHECK(strcmp(unit, "count") == 0 || strcmp(unit, "bytes") == 0 || strcmp(unit, "ns") == 0 ||
          strcmp(unit, "live") == 0);
  }
}

int main(void) {
  rtpu_runtime *rt = open_runtime();
  CHECK(rtpu_op_count() > 0);
  CHECK(rtpu_op_name(rtpu_op_count()) == NULL);

  /* A 2x3 float storage; write it through the whole view. */
  rtpu_storage *s = NULL;
  CHECK_OK(rtpu_storage_new(rt, 0, 6 * sizeof(float), &s));
  CHECK(rtpu_storage_nbytes(s) == 24 && rtpu_storage_device_index(s) == 0);
  const float data[6] = {1, 2, 3, 4, 5, 6};
  const int64_t sizes[2] = {2, 3}, strides[2] = {3, 1};
  rtpu_tensor_ref whole = f32_view(s, 0, sizes, strides, 2);
  CHECK_OK(rtpu_tensor_copy_from_host(&whole, data, sizeof data));

  /* Column 1 as a strided view: add 10 in place with add_.Scalar. */
  const int64_t col_sizes[1] = {2}, col_strides[1] = {3};
  rtpu_tensor_ref column = f32_view(s, 1, col_sizes, col_strides, 1);
  rtpu_op_arg args[3];
  memset(args, 0, sizeof args);
  args[0].tag = RTPU_ARG_TENSOR;
  args[0].tensor = column;
  args[1].tag = RTPU_ARG_DOUBLE;
  args[1].double_value = 10.0;
  args[2].tag = RTPU_ARG_INT;
  args[2].int_value = 1;
  rtpu_op_result *result = NULL;
  CHECK_OK(rtpu_op_call(rt, find_op("aten::add_.Scalar"), args, 3, &result));
  CHECK(rtpu_op_result_count(result) == 1);
  rtpu_op_output out = op_output(result, 0);
  CHECK(out.alias_of == 0 && out.storage == NULL);
  rtpu_op_result_destroy(result);
  float back[6];
  CHECK_OK(rtpu_tensor_copy_to_host(&whole, back, sizeof back));
  const float want[6] = {1, 12, 3, 4, 15, 6};
  CHECK(memcmp(back, want, sizeof want) == 0);

  /* A functional op returns a new storage the caller releases. */
  args[1].tag = RTPU_ARG_TENSOR;
  args[1].tensor = whole;
  args[0].tensor = whole;
  CHECK_OK(rtpu_op_call(rt, find_op("aten::mul.Tensor"), args, 2, &result));
  out = op_output(result, 0);
  CHECK(out.alias_of == -1 && out.storage != NULL && out.ndim == 2 && out.dtype == RTPU_DTYPE_FLOAT32);
  rtpu_tensor_ref squared = f32_view(out.storage, out.storage_offset, out.sizes, out.strides, out.ndim);
  CHECK_OK(rtpu_tensor_copy_to_host(&squared, back, sizeof back));
  for (int i = 0; i < 6; i++) CHECK(back[i] == want[i] * want[i]);
  rtpu_op_result_destroy(result);
  rtpu_storage_release(out.storage);

  /* This process has run exactly the two ops above, each compiled once (the
   * C tests run with no disk cache). */
  CHECK(metric("ops_run") == 2 && metric("executables_compiled") == 2);
  CHECK(metric("host_to_device_bytes") > 0 && metric("device_to_host_bytes") > 0);
  check_metric_descriptions();

  /* Bad input: every call fails cleanly and the storage keeps its bytes. */
  rtpu_storage *none = NULL;
  CHECK_ERROR(rtpu_storage_new(NULL, 0, 4, &none), INVALID, "runtime");
  CHECK_ERROR(rtpu_storage_new(rt, 0, 4, NULL), INVALID, "storage_out");
  CHECK_ERROR(rtpu_storage_new(rt, 99, 4, &none), INVALID, "device index");
  CHECK(none == NULL);
  CHECK_ERROR(rtpu_storage_resize(NULL, 4), INVALID, "storage");
  /* More than any device holds: refused before anything is allocated. */
  CHECK_ERROR(rtpu_storage_new(rt, 0, SIZE_MAX, &none), RTPU_ERROR_CODE_RESOURCE_EXHAUSTED, "bytes of tpu:0");
  CHECK(none == NULL);
  CHECK_ERROR(rtpu_storage_resize(s, SIZE_MAX), RTPU_ERROR_CODE_RESOURCE_EXHAUSTED, "bytes of tpu:0");
  CHECK(rtpu_storage_nbytes(s) == 24);
  rtpu_storage_retain(NULL);
  rtpu_storage_release(NULL);
  CHECK(rtpu_storage_nbytes(NULL) == 0);
  const int64_t big_sizes[2] = {3, 3};
  rtpu_tensor_ref too_big = f32_view(s, 0, big_sizes, strides, 2);
  CHECK_ERROR(rtpu_tensor_copy_to_host(&too_big, back, 9 * sizeof(float)), INVALID, "storage");
  CHECK_ERROR(rtpu_tensor_copy_to_host(NULL, back, sizeof back), INVALID, "src");
  /* 2^96 elements (a stride-0 expand) wrap a 64-bit count to 0: refused. */
  const int64_t wrapping_sizes[3] = {INT64_C(1) << 32, INT64_C(1) << 32, INT64_C(1) << 32};
  const int64_t zero_strides[3] = {0, 0, 0};
  rtpu_tensor_ref wrapping = f32_view(s, 0, wrapping_sizes, zero_strides, 3);
  CHECK_ERROR(rtpu_tensor_copy_to_host(&wrapping, back, sizeof back), INVALID, "64 bits");
  CHECK_ERROR(rtpu_tensor_copy_to_host(&whole, back, 3), INVALID, "nbytes");
  CHECK_ERROR(rtpu_tensor_copy_to_host(&whole, NULL, sizeof back), INVALID, "data");
  CHECK_ERROR(rtpu_tensor_copy_from_host(&whole, data, 5), INVALID, "bytes");
  CHECK_ERROR(rtpu_tensor_copy_from_host(NULL, data, sizeof data), INVALID, "dst");
  rtpu_tensor_ref no_storage = f32_view(NULL, 0, sizes, strides, 2);
  CHECK_ERROR(rtpu_tensor_copy_from_host(&no_storage, data, sizeof data), INVALID, "storage");
  rtpu_tensor_ref bad_dtype = whole;
  bad_dtype.dtype = 77;
  CHECK_ERROR(rtpu_tensor_copy_from_host(&bad_dtype, data, sizeof data), INVALID, "dtype");

  CHECK_ERROR(rtpu_op_call(rt, rtpu_op_count(), args, 2, &result), INVALID, "rtpu_op_count");
  CHECK_ERROR(rtpu_op_call(NULL, 0, args, 2, &result), INVALID, "runtime");
  CHECK_ERROR(rtpu_op_call(rt, 0, args, 2, NULL), INVALID, "result_out");
  CHECK_ERROR(rtpu_op_call(rt, 0, NULL, 2, &result), INVALID, "args");
  args[1].tag = 99;
  CHECK_ERROR(rtpu_op_call(rt, find_op("aten::mul.Tensor"), args, 2, &result), INVALID, "tag");
  args[1].tag = RTPU_ARG_TENSOR;
  args[1].tensor = too_big;
  CHECK_ERROR(rtpu_op_call(rt, find_op("aten::mul.Tensor"), args, 2, &result), INVALID, NULL);
  args[1].tag = RTPU_ARG_STRING;
  args[1].string_value = "not a tensor";
  CHECK_ERROR(rtpu_op_call(rt, find_op("aten::mul.Tensor"), args, 2, &result), INVALID, "Tensor");
  /* A storage of another runtime is refused, even one never written (which
   * has no buffer whose client could disagree), and s keeps its bytes. */
  rtpu_runtime *other_rt = open_runtime();
  rtpu_storage *foreign = NULL;
  CHECK_OK(rtpu_storage_new(other_rt, 0, 6 * sizeof(float), &foreign));
  rtpu_tensor_ref foreign_whole = f32_view(foreign, 0, sizes, strides, 2);
  args[0].tag = args[1].tag = RTPU_ARG_TENSOR;
  args[0].tensor = whole;
  args[1].tensor = foreign_whole;
  CHECK_ERROR(rtpu_op_call(rt, find_op("aten::mul.Tensor"), args, 2, &result), INVALID, "another runtime");
  rtpu_storage_release(foreign);
  rtpu_runtime_release(other_rt);
  CHECK(rtpu_op_result_count(NULL) == 0);
  rtpu_op_result_destroy(NULL);
  CHECK_ERROR(rtpu_op_result_get(NULL, 0, &out), INVALID, "result");
  const size_t count = rtpu_metric_count();
  uint64_t values[64];
  CHECK(count <= 64);
  CHECK_ERROR(rtpu_metrics_read(values, count + 1), INVALID, "count");
  CHECK_ERROR(rtpu_metrics_read(NULL, count), INVALID, "values");
  CHECK_OK(rtpu_metrics_read(NULL, 0));
  const char *name = NULL, *unit = NULL, *help = NULL;
  CHECK_ERROR(rtpu_metric_describe(count, &name, &unit, &help), INVALID, "rtpu_metric_count");
  CHECK_ERROR(rtpu_metric_describe(0, NULL, &unit, &help), INVALID, "name_out");
  CHECK(name == NULL);
  size_t index = 7;
  CHECK_ERROR(rtpu_metric_find("no_such_metric", &index), RTPU_ERROR_CODE_NOT_FOUND, "no_such_metric");
  CHECK_ERROR(rtpu_metric_find(NULL, &index), INVALID, "name");
  CHECK_ERROR(rtpu_metric_find("ops_run", NULL), INVALID, "index_out");
  CHECK(index == 7);

  /* The C tests run with the disk cache off (RTPU_CACHE_DIR=""). */
  rtpu_cache_info cache;
  memset(&cache, 0xAB, sizeof cache);
  cache.struct_size = RTPU_CACHE_INFO_STRUCT_SIZE;
  CHECK_OK(rtpu_cache_get_info(&cache));
  CHECK(!cache.enabled && cache.entries == 0 && cache.bytes == 0 && cache.max_bytes > 0);
  cache.struct_size = 8;
  CHECK_ERROR(rtpu_cache_get_info(&cache), INVALID, "struct_size");
  CHECK_ERROR(rtpu_cache_get_info(NULL), INVALID, "info_out");
  rtpu_bytes *dir = NULL;
  CHECK_OK(rtpu_cache_dir(&dir));
  CHECK(rtpu_bytes_size(dir) == 0);
  rtpu_bytes_destroy(dir);
  CHECK_ERROR(rtpu_cache_dir(NULL), INVALID, "dir_out");
  uint64_t removed = 99;
  CHECK_OK(rtpu_cache_clear(&removed));
  CHECK(removed == 0);
  CHECK_ERROR(rtpu_cache_clear(NULL), INVALID, "removed_out");
  uint64_t released = 99;
  CHECK_OK(rtpu_host_cache_release(&released));
  CHECK(released != 99);
  CHECK_ERROR(rtpu_host_cache_release(NULL), INVALID, "released_out");

  CHECK_OK(rtpu_tensor_copy_to_host(&whole, back, sizeof back));
  CHECK(memcmp(back, want, sizeof want) == 0);

  rtpu_storage_release(s);
  rtpu_runtime_release(rt);
  printf("ops: ok\n");
  return 0;
}
