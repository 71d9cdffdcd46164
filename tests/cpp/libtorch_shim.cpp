// A libtorch program without Python: it loads librtpu_torch.so (argv[1])
// and runs ops on the PrivateUse1 device through the shim.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <dlfcn.h>

#include <cstdio>

namespace {

int run() {
  const c10::Device device(c10::DeviceType::PrivateUse1, 0);
  const at::Tensor x = at::randn({4, 3});
  const at::Tensor w = at::randn({3, 5});
  const at::Tensor got = at::mm(x.to(device), w.to(device)).relu().cpu();
  const at::Tensor want = at::mm(x, w).relu();
  if (!at::allclose(got, want, 1e-5, 1e-6)) {
    std::fprintf(stderr, "mm + relu on the device differs from CPU\n");
    return 1;
  }
  // Bad input is a c10::Error, and the process goes on.
  try {
    (void)(x.to(device) + at::ones({7}).to(device));
    std::fprintf(stderr, "mismatched shapes did not raise\n");
    return 1;
  } catch (const c10::Error& e) {
    if (std::string(e.what()).find("broadcast") == std::string::npos) {
      std::fprintf(stderr, "unexpected message: %s\n", e.what());
      return 1;
    }
  }
  std::printf("libtorch_shim: ok\n");
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s path/to/librtpu_torch.so\n", argv[0]);
    return 2;
  }
  // The shim's static initialisers register the device, ops and fallback.
  if (dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    std::fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  try {
    return run();
  } catch (const c10::Error& e) {
    // E.g. no plugin found: the message is the test's to check.
    std::fprintf(stderr, "libtorch_shim: %s\n", e.what_without_backtrace());
    return 1;
  }
}
