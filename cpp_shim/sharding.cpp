// Sharded storages (SPMD): a tpu tensor's storage split over the devices of
// a mesh (rtpu_storage_shard), and how it is split. rtpu.distributed's
// Mesh and mark_sharding turn axis names into these tile layouts.

#include "rtpu_torch.h"

#include <c10/util/Exception.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

namespace rtpu_torch {
namespace {

rtpu_storage* storage_of(const at::Tensor& tensor, const char* op) {
  TORCH_CHECK(
      tensor.device().type() == c10::DeviceType::PrivateUse1,
      "rtpu: ",
      op,
      " takes a tpu tensor, got one on ",
      tensor.device());
  return storage_handle(tensor.storage());
}

std::vector<size_t> unsigned_list(const std::vector<int64_t>& values, const char* what) {
  std::vector<size_t> out;
  for (const int64_t v : values) {
    TORCH_CHECK(v >= 0, "rtpu: shard_storage: ", what, " must be >= 0, got ", v);
    out.push_back(static_cast<size_t>(v));
  }
  return out;
}

void op_shard_storage(
    const at::Tensor& tensor,
    std::vector<int64_t> devices,
    std::vector<int64_t> dims,
    std::vector<int64_t> tiles,
    int64_t replicas,
    std::vector<int64_t> partitions) {
  rtpu_storage* storage = storage_of(tensor, "shard_storage");
  auto device_list = unsigned_list(devices, "devices");
  auto partition_list = unsigned_list(partitions, "partitions");
  TORCH_CHECK(
      dims.size() == tiles.size(),
      "rtpu: shard_storage: one tile count per dim: ",
      dims.size(),
      " dims, ",
      tiles.size(),
      " tile counts");
  rtpu_sharding sharding{};
  sharding.struct_size = RTPU_SHARDING_STRUCT_SIZE;
  sharding.devices = device_list.data();
  sharding.num_devices = device_list.size();
  sharding.dims = dims.data();
  sharding.tiles = tiles.data();
  sharding.rank = dims.size();
  sharding.replicas = replicas;
  sharding.partitions = partition_list.data();
  sharding.num_partitions = partition_list.size();
  check(rtpu_storage_shard(storage, to_rtpu_dtype(tensor.scalar_type()), &sharding));
}

using ShardingInfo = std::tuple<
    bool,
    std::vector<int64_t>,
    std::vector<int64_t>,
    std::vector<int64_t>,
    int64_t,
    std::vector<int64_t>>;

ShardingInfo op_storage_sharding(const at::Tensor& tensor) {
  rtpu_storage* storage = storage_of(tensor, "storage_sharding");
  rtpu_sharding counts{};
  counts.struct_size = RTPU_SHARDING_STRUCT_SIZE;
  bool sharded = false;
  check(rtpu_storage_sharding(storage, &sharded, &counts));
  if (!sharded) {
    return {false, {}, {}, {}, 1, {}};
  }
  std::vector<size_t> devices(counts.num_devices);
  std::vector<int64_t> dims(counts.rank);
  std::vector<int64_t> tiles(counts.rank);
  std::vector<size_t> partitions(counts.num_partitions);
  rtpu_sharding filled = counts;
  filled.devices = devices.data();
  filled.dims = dims.data();
  filled.tiles = tiles.data();
  filled.partitions = partitions.data();
  check(rtpu_storage_sharding(storage, &sharded, &filled));
  return {
      sharded,
      std::vector<int64_t>(devices.begin(), devices.end()),
      dims,
      tiles,
      filled.replicas,
      std::vector<int64_t>(partitions.begin(), partitions.end())};
}

} // namespace

TORCH_LIBRARY_FRAGMENT(rtpu, m) {
  // Splits the tensor's storage, read as `dims`, over the mesh `devices`:
  // tiles[d] tiles along dim d, each held by `replicas` partitions listed
  // in `partitions` (row-major over the tiles, then the copy).
  m.def(
      "shard_storage(Tensor tensor, int[] devices, int[] dims, int[] tiles, int replicas, "
      "int[] partitions) -> ()",
      TORCH_FN(op_shard_storage));
  // How the tensor's storage is split (sharded false: on one device).
  m.def(
      "storage_sharding(Tensor tensor) -> (bool sharded, int[] devices, int[] dims, "
      "int[] tiles, int replicas, int[] partitions)",
      TORCH_FN(op_storage_sharding));
}

} // namespace rtpu_torch
