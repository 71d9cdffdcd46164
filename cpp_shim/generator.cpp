// Random generators: a generator is a (seed, offset) pair. Each random op
// receives the pair as an RTPU_ARG_GENERATOR and the offset then advances,
// so successive ops draw different numbers and a saved state replays them.

#include "rtpu_torch.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <mutex>
#include <optional>
#include <unordered_map>

namespace rtpu_torch {
namespace {

// torch.cuda's default seed, so a fresh process starts the same way.
constexpr uint64_t kDefaultSeed = 67280421310721ULL;
// get_state(): seed then offset, native-endian uint64 each.
constexpr int64_t kStateSize = 16;

struct RtpuGeneratorImpl final : c10::GeneratorImpl {
  explicit RtpuGeneratorImpl(c10::DeviceIndex device, uint64_t seed)
      : c10::GeneratorImpl(
            c10::Device(kDevice, device),
            c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        seed_(seed) {}

  static c10::DeviceType device_type() {
    return kDevice;
  }

  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }

  void set_offset(uint64_t offset) override {
    offset_ = offset;
  }

  uint64_t get_offset() const override {
    return offset_;
  }

  uint64_t current_seed() const override {
    return seed_;
  }

  uint64_t seed() override {
    const uint64_t seed = c10::detail::getNonDeterministicRandom(true);
    set_current_seed(seed);
    return seed;
  }

  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(
        state.device().is_cpu() && state.dtype() == at::kByte &&
            state.numel() == kStateSize && state.is_contiguous(),
        "rtpu: a tpu generator state is a contiguous CPU uint8 tensor of ",
        kStateSize,
        " bytes (from get_state()); got ",
        state.numel(),
        " elements of ",
        state.dtype().name(),
        " on ",
        state.device());
    const auto* bytes = static_cast<const uint8_t*>(state.data());
    std::memcpy(&seed_, bytes, sizeof(seed_));
    std::memcpy(&offset_, bytes + sizeof(seed_), sizeof(offset_));
  }

  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto state = at::detail::empty_cpu({kStateSize}, at::kByte);
    auto* bytes = static_cast<uint8_t*>(state.mutable_data_ptr());
    std::memcpy(bytes, &seed_, sizeof(seed_));
    std::memcpy(bytes + sizeof(seed_), &offset_, sizeof(offset_));
    return state.getIntrusivePtr();
  }

 private:
  RtpuGeneratorImpl* clone_impl() const override {
    auto* copy = new RtpuGeneratorImpl(device().index(), seed_);
    copy->offset_ = offset_;
    return copy;
  }

  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The default generators, created on first use. Leaked: Python's
// torch.Generator objects may refer to them during teardown.
struct Defaults {
  std::mutex mutex;
  std::unordered_map<c10::DeviceIndex, at::Generator> generators;
  std::optional<uint64_t> seed_all;

  static Defaults& get() {
    static Defaults* defaults = new Defaults();
    return *defaults;
  }
};

c10::DeviceIndex resolve(c10::DeviceIndex index) {
  return index < 0 ? current_device() : index;
}

} // namespace

const at::Generator& default_generator(c10::DeviceIndex index) {
  index = resolve(index);
  check_device_index(index);
  auto& defaults = Defaults::get();
  std::lock_guard<std::mutex> lock(defaults.mutex);
  auto found = defaults.generators.find(index);
  if (found == defaults.generators.end()) {
    found = defaults.generators
                .emplace(
                    index,
                    at::make_generator<RtpuGeneratorImpl>(
                        index, defaults.seed_all.value_or(kDefaultSeed)))
                .first;
  }
  // unordered_map keeps element references valid across insertions.
  return found->second;
}

at::Generator new_generator(c10::DeviceIndex index) {
  index = resolve(index);
  check_device_index(index);
  return at::make_generator<RtpuGeneratorImpl>(index, kDefaultSeed);
}

void manual_seed_all(uint64_t seed) {
  auto& defaults = Defaults::get();
  std::lock_guard<std::mutex> lock(defaults.mutex);
  defaults.seed_all = seed;
  for (auto& [index, generator] : defaults.generators) {
    std::lock_guard<std::mutex> generator_lock(generator.mutex());
    generator.set_current_seed(seed);
  }
}

std::array<int64_t, 2> next_random_state(
    const std::optional<at::Generator>& generator,
    c10::DeviceIndex device) {
  at::Generator chosen = generator.has_value() && generator->defined()
      ? *generator
      : default_generator(device);
  TORCH_CHECK(
      chosen.device().type() == kDevice,
      "rtpu: a tpu op needs a tpu generator, got one for ",
      chosen.device());
  auto* impl = dynamic_cast<RtpuGeneratorImpl*>(chosen.unsafeGetGeneratorImpl());
  TORCH_CHECK(impl != nullptr, "rtpu: this tpu generator was not made by rtpu");
  std::lock_guard<std::mutex> lock(chosen.mutex());
  const uint64_t seed = impl->current_seed();
  const uint64_t offset = impl->get_offset();
  impl->set_offset(offset + 1);
  return {static_cast<int64_t>(seed), static_cast<int64_t>(offset)};
}

} // namespace rtpu_torch
