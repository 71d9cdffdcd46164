/* Events through the C ABI: points in a device's work that can be queried,
 * waited for and timed, with bad input for each entry point. */
#include <stdint.h>

#include "check.h"

enum {
  INVALID = RTPU_ERROR_CODE_INVALID_ARGUMENT,
  PRECONDITION = RTPU_ERROR_CODE_FAILED_PRECONDITION
};

static const int64_t kSizes[2] = {256, 256}, kStrides[2] = {256, 1};

static rtpu_tensor_ref matrix_of(const rtpu_storage *s) {
  return f32_view(s, 0, kSizes, kStrides, 2);
}

/* a @ b as a new storage (one reference for the caller). */
static rtpu_storage *matmul(rtpu_runtime *rt, const rtpu_storage *a, const rtpu_storage *b) {
  return call_binary(rt, "aten::mm", matrix_of(a), matrix_of(b));
}

static int done(const rtpu_event *event) {
  bool finished = false;
  CHECK_OK(rtpu_event_query(event, &finished));
  return finished;
}

int main(void) {
  rtpu_runtime *rt = open_runtime();
  static float identity[256 * 256];
  for (int i = 0; i < 256; i++) identity[i * 256 + i] = 1;
  rtpu_storage *x = NULL;
  CHECK_OK(rtpu_storage_new(rt, 0, sizeof identity, &x));
  rtpu_tensor_ref xr = matrix_of(x);
  CHECK_OK(rtpu_tensor_copy_from_host(&xr, identity, sizeof identity));
  CHECK_OK(rtpu_engine_synchronize());

  /* Nothing in flight: an event is done when recorded. */
  rtpu_event *start = NULL, *end = NULL;
  CHECK_OK(rtpu_event_record(rt, 0, &start));
  CHECK(done(start));

  /* A chain of matmuls, then a mark after it. */
  rtpu_storage *y = matmul(rt, x, x);
  for (int i = 0; i < 20; i++) {
    rtpu_storage *next = matmul(rt, y, x);
    rtpu_storage_release(y);
    y = next;
  }
  CHECK_OK(rtpu_event_record(rt, 0, &end));
  /* Work still running cannot be timed. */
  double ms = -1;
  rtpu_error *early = rtpu_event_elapsed_ms(start, end, &ms);
  if (early != NULL) {
    CHECK_ERROR(early, PRECONDITION, "finished");
    CHECK(ms == -1);
  }
  CHECK_OK(rtpu_event_synchronize(end));
  CHECK(done(end));
  CHECK_OK(rtpu_event_elapsed_ms(start, end, &ms));
  CHECK(ms > 0);
  double back = 1;
  CHECK_OK(rtpu_event_elapsed_ms(end, start, &back));
  CHECK(back == -ms);
  /* The work is done: reading it waits for nothing, and it is right. */
  static float result[256 * 256];
  rtpu_tensor_ref yr = matrix_of(y);
  CHECK_OK(rtpu_tensor_copy_to_host(&yr, result, sizeof result));
  CHECK(memcmp(result, identity, sizeof result) == 0);

  /* Bad input names the argument and writes nothing. */
  rtpu_event *untouched = (rtpu_event *)&back;
  CHECK_ERROR(rtpu_event_record(NULL, 0, &untouched), INVALID, "runtime");
  CHECK_ERROR(rtpu_event_record(rt, rtpu_runtime_device_count(rt), &untouched), INVALID, "device index");
  CHECK_ERROR(rtpu_event_record(rt, 0, NULL), INVALID, "event_out");
  CHECK(untouched == (rtpu_event *)&back);
  bool flag = true;
  CHECK_ERROR(rtpu_event_query(NULL, &flag), INVALID, "event");
  CHECK_ERROR(rtpu_event_query(end, NULL), INVALID, "done_out");
  CHECK_ERROR(rtpu_event_synchronize(NULL), INVALID, "event");
  CHECK_ERROR(rtpu_event_elapsed_ms(NULL, end, &ms), INVALID, "start");
  CHECK_ERROR(rtpu_event_elapsed_ms(start, NULL, &ms), INVALID, "end");
  CHECK_ERROR(rtpu_event_elapsed_ms(start, end, NULL), INVALID, "ms_out");
  CHECK(flag);
  rtpu_event_destroy(NULL);

  rtpu_event_destroy(start);
  rtpu_event_destroy(end);
  rtpu_storage_release(y);
  rtpu_storage_release(x);
  rtpu_runtime_release(rt);
  printf("events: ok\n");
  return 0;
}
