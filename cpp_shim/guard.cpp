// Device and stream management for PrivateUse1: the current device is
// thread-local; each device has one stream. rtpu_op_call returns once the
// work is enqueued, and the work of a device runs in call order; a host read
// waits for the value it reads. So one stream never waits on an event of
// another (there is none), and synchronizing a stream or a device waits for
// everything enqueued (rtpu_engine_synchronize).

#include "rtpu_torch.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

namespace rtpu_torch {
namespace {

thread_local c10::DeviceIndex tl_current_device = 0;

// Any non-NULL value: events carry no state.
void* const kRecordedEvent = reinterpret_cast<void*>(1);

struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kDevice;
  }

  c10::Device exchangeDevice(c10::Device device) const override {
    TORCH_INTERNAL_ASSERT(device.type() == kDevice);
    const c10::Device old = getDevice();
    if (old.index() != device.index()) {
      setDevice(device);
    }
    return old;
  }

  c10::Device getDevice() const override {
    return c10::Device(kDevice, tl_current_device);
  }

  void setDevice(c10::Device device) const override {
    TORCH_INTERNAL_ASSERT(device.type() == kDevice);
    set_current_device(device.index());
  }

  void uncheckedSetDevice(c10::Device device) const noexcept override {
    tl_current_device = device.index();
  }

  c10::Stream getStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }

  c10::Stream getDefaultStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }

  c10::Stream getStreamFromGlobalPool(c10::Device device, bool) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }

  c10::Stream getNewStream(c10::Device device, int) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }

  c10::Stream exchangeStream(c10::Stream stream) const override {
    return c10::Stream(c10::Stream::DEFAULT, stream.device());
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    return device_count();
  }

  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}

  void record(
      void** event,
      const c10::Stream& stream,
      const c10::DeviceIndex device_index,
      const c10::EventFlag) const override {
    TORCH_CHECK(
        device_index == -1 || device_index == stream.device_index(),
        "rtpu: event on tpu:",
        static_cast<int>(device_index),
        " does not match its stream's device tpu:",
        static_cast<int>(stream.device_index()));
    *event = kRecordedEvent;
  }

  void block(void*, const c10::Stream&) const override {}

  bool queryEvent(void*) const override {
    return true;
  }

  bool queryStream(const c10::Stream&) const override {
    return true;
  }

  void synchronizeStream(const c10::Stream&) const override {
    check(rtpu_engine_synchronize());
  }

  // An event marks everything enqueued before it; waiting for all of it is
  // what waiting for the event means here.
  void synchronizeEvent(void*) const override {
    check(rtpu_engine_synchronize());
  }

  void synchronizeDevice(const c10::DeviceIndex) const override {
    check(rtpu_engine_synchronize());
  }

  double elapsedTime(void*, void*, const c10::DeviceIndex) const override {
    TORCH_CHECK(false, "rtpu: tpu events do not record time");
  }
};

} // namespace

c10::DeviceIndex current_device() {
  return tl_current_device;
}

void set_current_device(c10::DeviceIndex index) {
  check_device_index(index);
  tl_current_device = index;
}

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

} // namespace rtpu_torch
