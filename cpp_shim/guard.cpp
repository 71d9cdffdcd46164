// Devices, streams and events for PrivateUse1. The current device is
// thread-local. Each device has one queue of work: rtpu_op_call returns once
// a program is launched, and PJRT runs a device's programs in launch order.
// Streams are names for that queue (the default stream 0, and any number of
// new ones, as torch.Stream() and FSDP2 make), each current per thread, so
// code written for CUDA streams runs unchanged: every stream's work is the
// device's, so a stream waiting for another stream or an event of the same
// device waits for work already ahead of it. An event marks the work
// launched on its device before it was recorded (rtpu_event_record); query,
// synchronize and elapsed_time act on that work.

#include "rtpu_torch.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <memory>
#include <unordered_map>

namespace rtpu_torch {
namespace {

thread_local c10::DeviceIndex tl_current_device = 0;

// This thread's current stream per device; absent means the default one.
thread_local std::unordered_map<c10::DeviceIndex, c10::StreamId>
    tl_current_streams;

// Ids of streams made by getNewStream / getStreamFromGlobalPool; 0 is the
// default stream's.
std::atomic<c10::StreamId> g_next_stream_id{1};

c10::Device concrete(c10::Device device) {
  return device.has_index() ? device : c10::Device(kDevice, tl_current_device);
}

c10::Stream new_stream(c10::Device device) {
  return c10::Stream(c10::Stream::UNSAFE, concrete(device), g_next_stream_id++);
}

struct EventDeleter {
  void operator()(rtpu_event* event) const {
    rtpu_event_destroy(event);
  }
};
using EventPtr = std::unique_ptr<rtpu_event, EventDeleter>;

// The work launched on `device` so far.
EventPtr mark(c10::DeviceIndex device) {
  check_device_index(device);
  rtpu_event* event = nullptr;
  check(rtpu_event_record(runtime(), static_cast<size_t>(device), &event));
  return EventPtr(event);
}

bool finished(const rtpu_event* event) {
  bool done = false;
  check(rtpu_event_query(event, &done));
  return done;
}

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
    device = concrete(device);
    const auto current = tl_current_streams.find(device.index());
    if (current == tl_current_streams.end()) {
      return getDefaultStream(device);
    }
    return c10::Stream(c10::Stream::UNSAFE, device, current->second);
  }

  c10::Stream getDefaultStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, concrete(device));
  }

  c10::Stream getStreamFromGlobalPool(c10::Device device, bool) const override {
    return new_stream(device);
  }

  // Priorities order nothing: the device has one queue.
  c10::Stream getNewStream(c10::Device device, int) const override {
    return new_stream(device);
  }

  c10::Stream exchangeStream(c10::Stream stream) const override {
    const c10::Stream previous = getStream(stream.device());
    tl_current_streams[stream.device_index()] = stream.id();
    return previous;
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    return device_count();
  }

  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    rtpu_event_destroy(static_cast<rtpu_event*>(event));
  }

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
    EventPtr marked = mark(stream.device_index());
    // Recording again moves the event to the new point.
    rtpu_event_destroy(static_cast<rtpu_event*>(*event));
    *event = marked.release();
  }

  // The stream's work is queued behind the event's already (one queue per
  // device); across devices, a program waits for the buffers it reads.
  void block(void*, const c10::Stream&) const override {}

  bool queryEvent(void* event) const override {
    // An event never recorded marks no work.
    return event == nullptr || finished(static_cast<rtpu_event*>(event));
  }

  bool queryStream(const c10::Stream& stream) const override {
    return finished(mark(stream.device_index()).get());
  }

  // Runs what deferred mode has pending too, as torch.tpu.synchronize does.
  void synchronizeStream(const c10::Stream&) const override {
    check(rtpu_engine_synchronize());
  }

  void synchronizeEvent(void* event) const override {
    if (event != nullptr) {
      check(rtpu_event_synchronize(static_cast<rtpu_event*>(event)));
    }
  }

  void synchronizeDevice(const c10::DeviceIndex) const override {
    check(rtpu_engine_synchronize());
  }

  // c10::Event has checked that both events were recorded with timing on
  // and have finished.
  double elapsedTime(void* start, void* end, const c10::DeviceIndex)
      const override {
    double ms = 0;
    check(rtpu_event_elapsed_ms(
        static_cast<rtpu_event*>(start), static_cast<rtpu_event*>(end), &ms));
    return ms;
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
