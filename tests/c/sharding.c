/* A storage split over a mesh of 4 devices through the C ABI: it reads back
 * whole, says how it is split, an op on it runs as one SPMD program, and bad
 * shardings are errors that leave the storage as it was. */
#include <stdint.h>

#include "check.h"

enum { INVALID = RTPU_ERROR_CODE_INVALID_ARGUMENT };

int main(void) {
  rtpu_runtime *rt = open_runtime();
  CHECK(rtpu_runtime_device_count(rt) >= 4);

  /* An 8x2 float storage: rows split in 4, one tile per device. */
  rtpu_storage *s = NULL;
  CHECK_OK(rtpu_storage_new(rt, 0, 16 * sizeof(float), &s));
  float data[16];
  for (int i = 0; i < 16; i++) data[i] = (float)i;
  const int64_t sizes[2] = {8, 2}, strides[2] = {2, 1};
  rtpu_tensor_ref whole = f32_view(s, 0, sizes, strides, 2);
  CHECK_OK(rtpu_tensor_copy_from_host(&whole, data, sizeof data));

  size_t devices[4] = {0, 1, 2, 3}, partitions[4] = {0, 1, 2, 3};
  int64_t dims[2] = {8, 2}, tiles[2] = {4, 1};
  rtpu_sharding sharding;
  memset(&sharding, 0, sizeof sharding);
  sharding.struct_size = RTPU_SHARDING_STRUCT_SIZE;
  sharding.devices = devices;
  sharding.num_devices = 4;
  sharding.dims = dims;
  sharding.tiles = tiles;
  sharding.rank = 2;
  sharding.replicas = 1;
  sharding.partitions = partitions;
  sharding.num_partitions = 4;

  /* Bad shardings: an uneven split, a partition twice, a device twice, a
   * short struct, NULL. The storage stays on one device. */
  int64_t three[2] = {3, 1};
  sharding.tiles = three;
  sharding.num_partitions = 3;
  CHECK_ERROR(rtpu_storage_shard(s, RTPU_DTYPE_FLOAT32, &sharding), INVALID, NULL);
  sharding.tiles = tiles;
  sharding.num_partitions = 4;
  size_t repeated[4] = {0, 1, 1, 3};
  sharding.partitions = repeated;
  CHECK_ERROR(rtpu_storage_shard(s, RTPU_DTYPE_FLOAT32, &sharding), INVALID, NULL);
  sharding.partitions = partitions;
  sharding.devices = repeated;
  CHECK_ERROR(rtpu_storage_shard(s, RTPU_DTYPE_FLOAT32, &sharding), INVALID, NULL);
  sharding.devices = devices;
  sharding.struct_size = 8;
  CHECK_ERROR(rtpu_storage_shard(s, RTPU_DTYPE_FLOAT32, &sharding), INVALID, NULL);
  sharding.struct_size = RTPU_SHARDING_STRUCT_SIZE;
  CHECK_ERROR(rtpu_storage_shard(s, RTPU_DTYPE_FLOAT32, NULL), INVALID, NULL);
  CHECK_ERROR(rtpu_storage_shard(NULL, RTPU_DTYPE_FLOAT32, &sharding), INVALID, NULL);
  bool sharded = true;
  rtpu_sharding read;
  memset(&read, 0, sizeof read);
  read.struct_size = RTPU_SHARDING_STRUCT_SIZE;
  CHECK_OK(rtpu_storage_sharding(s, &sharded, &read));
  CHECK(!sharded);

  CHECK_OK(rtpu_storage_shard(s, RTPU_DTYPE_FLOAT32, &sharding));

  /* Counts first, then the arrays; too small an array is an error. */
  CHECK_OK(rtpu_storage_sharding(s, &sharded, &read));
  CHECK(sharded && read.num_devices == 4 && read.rank == 2 && read.num_partitions == 4 &&
        read.replicas == 1);
  size_t got_devices[4], got_partitions[4];
  int64_t got_dims[2], got_tiles[2];
  read.devices = got_devices;
  read.dims = got_dims;
  read.tiles = got_tiles;
  read.partitions = got_partitions;
  read.num_partitions = 2;
  CHECK_ERROR(rtpu_storage_sharding(s, &sharded, &read), INVALID, NULL);
  read.num_partitions = 4;
  CHECK_OK(rtpu_storage_sharding(s, &sharded, &read));
  CHECK(got_dims[0] == 8 && got_dims[1] == 2 && got_tiles[0] == 4 && got_tiles[1] == 1);
  for (int i = 0; i < 4; i++) CHECK(got_devices[i] == (size_t)i && got_partitions[i] == (size_t)i);

  float back[16];
  CHECK_OK(rtpu_tensor_copy_to_host(&whole, back, sizeof back));
  CHECK(memcmp(back, data, sizeof data) == 0);

  /* An op on it runs over the mesh and matches the host. */
  rtpu_op_arg args[2];
  memset(args, 0, sizeof args);
  args[0].tag = RTPU_ARG_TENSOR;
  args[0].tensor = whole;
  args[1].tag = RTPU_ARG_TENSOR;
  args[1].tensor = whole;
  rtpu_op_result *result = NULL;
  CHECK_OK(rtpu_op_call(rt, find_op("aten::mul.Tensor"), args, 2, &result));
  rtpu_op_output out = op_output(result, 0);
  rtpu_tensor_ref squared = f32_view(out.storage, out.storage_offset, out.sizes, out.strides, out.ndim);
  CHECK_OK(rtpu_tensor_copy_to_host(&squared, back, sizeof back));
  for (int i = 0; i < 16; i++) CHECK(back[i] == data[i] * data[i]);
  CHECK(metric("spmd_executions") >= 1);
  rtpu_op_result_destroy(result);
  rtpu_storage_release(out.storage);

  rtpu_storage_release(s);
  rtpu_runtime_release(rt);
  printf("sharding: ok\n");
  return 0;
}
