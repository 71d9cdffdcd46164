// The PrivateUse1 hooks: what ATen asks of an accelerator (availability,
// devices, generators, pointers, storage resizing).

#include "rtpu_torch.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>

namespace rtpu_torch {
namespace {

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }

  bool isAvailable() const override {
    return device_count() > 0;
  }

  bool hasPrimaryContext(c10::DeviceIndex) const override {
    return true;
  }

  void init() const override {
    runtime();
  }

  c10::DeviceIndex deviceCount() const override {
    return device_count();
  }

  void setCurrentDevice(c10::DeviceIndex device) const override {
    set_current_device(device);
  }

  c10::DeviceIndex getCurrentDevice() const override {
    return current_device();
  }

  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const auto old = current_device();
    set_current_device(device);
    return old;
  }

  c10::DeviceIndex maybeExchangeDevice(
      c10::DeviceIndex device) const override {
    if (device < 0 || device >= device_count()) {
      return current_device();
    }
    return exchangeDevice(device);
  }

  const at::Generator& getDefaultGenerator(
      c10::DeviceIndex device) const override {
    return default_generator(device);
  }

  at::Generator getNewGenerator(c10::DeviceIndex device) const override {
    return new_generator(device);
  }

  at::Device getDeviceFromPtr(void* data) const override {
    return c10::Device(kDevice, device_from_ptr(data));
  }

  bool isPinnedPtr(const void*) const override {
    return false;
  }

  at::Allocator* getPinnedMemoryAllocator() const override {
    // Host-to-device copies are synchronous reads of host memory, so pinned
    // memory buys nothing: pin_memory() gives an ordinary CPU tensor.
    return c10::GetCPUAllocator();
  }

  void resizePrivateUse1Bytes(
      const c10::Storage& storage,
      size_t nbytes) const override {
    resize_storage_bytes(storage, nbytes);
  }
};

struct Register {
  Register() {
    at::RegisterPrivateUse1HooksInterface(new Hooks());
  }
} g_register;

} // namespace
} // namespace rtpu_torch
