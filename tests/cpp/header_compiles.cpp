// The generated header must compile as C++17 and link against librtpu.
#include "rtpu.h"

#include <cstdio>

int main() {
  rtpu_error *err = rtpu_testing_panic();
  const bool ok = rtpu_abi_version() == RTPU_ABI_VERSION && rtpu_error_code(err) == RTPU_ERROR_CODE_PANIC;
  rtpu_error_destroy(err);
  std::printf("header_compiles: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
