/* Deferred execution, flushes, locations, recompile controls, metrics and
 * captured graphs through the C ABI, with bad input for each entry point. */
#define _POSIX_C_SOURCE 200809L /* dup, dup2, fileno: to read what rtpu prints */
#include <stdint.h>
#include <unistd.h>

#include "check.h"

enum { INVALID = RTPU_ERROR_CODE_INVALID_ARGUMENT };

static const int64_t kSizes[1] = {4}, kStrides[1] = {1};

static rtpu_tensor_ref vector_of(const rtpu_storage *s) {
  return f32_view(s, 0, kSizes, kStrides, 1);
}

/* op(a, b), a binary op of two 4-vectors, as a new storage (one reference
 * for the caller). */
static rtpu_storage *binary(rtpu_runtime *rt, const char *op, const rtpu_storage *a,
                            const rtpu_storage *b) {
  return call_binary(rt, op, vector_of(a), vector_of(b));
}

static rtpu_storage *square(rtpu_runtime *rt, const rtpu_storage *x) {
  return binary(rt, "aten::mul.Tensor", x, x);
}

static rtpu_storage *divide(rtpu_runtime *rt, const rtpu_storage *a, const rtpu_storage *b) {
  return binary(rt, "aten::div.Tensor", a, b);
}

/* Records a chain of `depth` divisions by x (a graph of `depth` ops) and
 * flushes it at one site, returning the flush's result. */
static rtpu_error *flush_chain(rtpu_runtime *rt, const rtpu_storage *x, int depth) {
  rtpu_storage *value = divide(rt, x, x);
  for (int i = 1; i < depth; i++) {
    rtpu_storage *next = divide(rt, value, x);
    rtpu_storage_release(value);
    value = next;
  }
  rtpu_error *err = rtpu_engine_flush("deferred.c: recompiles");
  rtpu_storage_release(value);
  return err;
}

/* What `flush_chain` printed to stderr (NUL-terminated into `text`). */
static void flush_chain_capturing_stderr(rtpu_runtime *rt, const rtpu_storage *x, int depth,
                                         char *text, size_t size) {
  fflush(stderr);
  FILE *capture = tmpfile();
  CHECK(capture != NULL);
  const int saved = dup(fileno(stderr));
  CHECK(saved >= 0 && dup2(fileno(capture), fileno(stderr)) >= 0);
  rtpu_error *err = flush_chain(rt, x, depth);
  fflush(stderr);
  CHECK(dup2(saved, fileno(stderr)) >= 0);
  close(saved);
  CHECK_OK(err);
  rewind(capture);
  const size_t n = fread(text, 1, size - 1, capture);
  text[n] = '\0';
  fclose(capture);
}

/* The recompile controls, seen through their effects at one flush site: a
 * limit refuses a second graph there with its explanation, no limit lets it
 * compile, and explanations reach stderr only when turned on. */
static void recompile_controls(rtpu_runtime *rt, const rtpu_storage *x) {
  char printed[4096];
  CHECK_OK(rtpu_engine_set_mode(RTPU_MODE_DEFERRED));
  rtpu_engine_set_recompile_limit(0);
  CHECK_OK(flush_chain(rt, x, 1));
  CHECK_ERROR(flush_chain(rt, x, 2), RTPU_ERROR_CODE_FAILED_PRECONDITION,
              "past the recompile limit of 0: 2 ops instead of 1; the first new one is aten::div");
  rtpu_engine_set_recompile_limit(-1);
  rtpu_engine_set_explain_recompiles(true);
  const uint64_t recompiles = metric("recompiles");
  flush_chain_capturing_stderr(rt, x, 2, printed, sizeof printed);
  CHECK(strstr(printed, "rtpu: recompiling the graph flushed at deferred.c: recompiles") != NULL);
  CHECK(strstr(printed, "2 ops instead of 1") != NULL);
  rtpu_engine_set_explain_recompiles(false);
  flush_chain_capturing_stderr(rt, x, 3, printed, sizeof printed);
  CHECK(strstr(printed, "recompiling") == NULL);
  CHECK(metric("recompiles") == recompiles + 2);
  CHECK_OK(rtpu_engine_set_mode(RTPU_MODE_EAGER));
}

static void check_values(const rtpu_storage *s, const float *want) {
  float back[4];
  rtpu_tensor_ref ref = vector_of(s);
  CHECK_OK(rtpu_tensor_copy_to_host(&ref, back, sizeof back));
  CHECK(memcmp(back, want, sizeof back) == 0);
}

/* A graph whose device-side index check fails writes nothing: x, squared
 * in place in that graph, keeps its old values, and the next op works. */
static void failed_check_keeps_old_values(rtpu_runtime *rt, const rtpu_storage *x,
                                          const float *values) {
  rtpu_storage *index = NULL;
  CHECK_OK(rtpu_storage_new(rt, 0, 4 * sizeof(int64_t), &index));
  const int64_t positions[4] = {0, 1, 2, 3};
  rtpu_tensor_ref index_ref = vector_of(index);
  index_ref.dtype = RTPU_DTYPE_INT64;
  CHECK_OK(rtpu_tensor_copy_from_host(&index_ref, positions, sizeof positions));
  CHECK_OK(rtpu_engine_set_mode(RTPU_MODE_DEFERRED));
  rtpu_op_arg args[3];
  memset(args, 0, sizeof args);
  args[0].tag = args[1].tag = RTPU_ARG_TENSOR;
  args[0].tensor = args[1].tensor = vector_of(x);
  rtpu_op_result *result = NULL;
  CHECK_OK(rtpu_op_call(rt, find_op("aten::mul_.Tensor"), args, 2, &result));
  rtpu_op_result_destroy(result);
  /* Indices the graph computes ({0, 1, 4, 9} of 4 rows) are checked on the
   * device; the failure shows at the next sync point. */
  args[0].tensor = args[1].tensor = index_ref;
  CHECK_OK(rtpu_op_call(rt, find_op("aten::mul.Tensor"), args, 2, &result));
  rtpu_op_output squared = op_output(result, 0);
  rtpu_op_result_destroy(result);
  args[0].tensor = vector_of(x);
  args[1].tag = RTPU_ARG_INT;
  args[1].int_value = 0;
  args[2].tag = RTPU_ARG_TENSOR;
  args[2].tensor = index_ref;
  args[2].tensor.storage = squared.storage;
  CHECK_OK(rtpu_op_call(rt, find_op("aten::index_select"), args, 3, &result));
  rtpu_op_result_destroy(result);
  CHECK_OK(rtpu_engine_flush("deferred.c: a failing check"));
  CHECK_ERROR(rtpu_engine_synchronize(), INVALID, "out of range");
  CHECK_OK(rtpu_engine_set_mode(RTPU_MODE_EAGER));
  check_values(x, values);
  rtpu_storage_release(squared.storage);
  rtpu_storage_release(index);
}

int main(void) {
  rtpu_runtime *rt = open_runtime();
  rtpu_storage *x = NULL;
  CHECK_OK(rtpu_storage_new(rt, 0, 4 * sizeof(float), &x));
  const float data[4] = {1, 2, 3, 4}, squares[4] = {1, 4, 9, 16}, fourth[4] = {1, 16, 81, 256};
  rtpu_tensor_ref xr = vector_of(x);
  CHECK_OK(rtpu_tensor_copy_from_host(&xr, data, sizeof data));

  /* Deferred: ops are recorded, run at the flush (or when read). */
  const uint64_t recorded = metric("ops_recorded"), executions = metric("graph_executions");
  CHECK(rtpu_engine_mode() == RTPU_MODE_EAGER);
  CHECK_OK(rtpu_engine_set_mode(RTPU_MODE_DEFERRED));
  CHECK(rtpu_engine_mode() == RTPU_MODE_DEFERRED);
  const uint32_t here = rtpu_location_intern("deferred.c:main");
  CHECK(here != 0 && here == rtpu_location_intern("deferred.c:main"));
  CHECK(rtpu_location_intern(NULL) == 0);
  rtpu_location_set_current(here);
  rtpu_storage *y = square(rt, x);
  rtpu_storage *z = square(rt, y);
  CHECK(metric("ops_recorded") == recorded + 2 && metric("graph_executions") == executions);
  CHECK_OK(rtpu_engine_flush("deferred.c: the flush"));
  CHECK_OK(rtpu_engine_flush(NULL));
  CHECK_OK(rtpu_engine_synchronize());
  CHECK(metric("graph_executions") == executions + 1);
  check_values(y, squares);
  check_values(z, fourth);
  rtpu_storage_release(z);
  CHECK_OK(rtpu_engine_set_mode(RTPU_MODE_EAGER));
  recompile_controls(rt, x);
  failed_check_keeps_old_values(rt, x, data);

  /* Capture y = x * x once, replay it on another input. */
  CHECK_OK(rtpu_capture_begin(rt, &xr, 1));
  rtpu_storage *captured_out = square(rt, x);
  /* The mode stays put until the capture ends. */
  CHECK_ERROR(rtpu_engine_set_mode(RTPU_MODE_EAGER), INVALID, "being captured");
  CHECK(rtpu_engine_mode() == RTPU_MODE_DEFERRED);
  rtpu_tensor_ref out_ref = vector_of(captured_out);
  rtpu_graph *graph = NULL;
  CHECK_OK(rtpu_capture_end(rt, &out_ref, 1, "deferred.c: capture", &graph));
  CHECK(rtpu_graph_replayable(graph) && rtpu_graph_reason(graph) == NULL);
  check_values(captured_out, squares);
  rtpu_tensor_ref yr = vector_of(y);
  rtpu_op_result *replayed = NULL;
  CHECK_OK(rtpu_graph_replay(graph, &yr, 1, &replayed));
  CHECK(rtpu_op_result_count(replayed) == 1);
  rtpu_op_output out = op_output(replayed, 0);
  check_values(out.storage, fourth);
  rtpu_storage_release(out.storage);
  rtpu_op_result_destroy(replayed);

  /* Bad input: clear errors, nothing changes. */
  CHECK_ERROR(rtpu_engine_set_mode(7), INVALID, "mode 7");
  CHECK(rtpu_engine_mode() == RTPU_MODE_EAGER);
  CHECK_ERROR(rtpu_graph_replay(NULL, &yr, 1, &replayed), INVALID, "graph");
  CHECK_ERROR(rtpu_graph_replay(graph, &yr, 1, NULL), INVALID, "result_out");
  rtpu_tensor_ref two[2] = {yr, yr};
  CHECK_ERROR(rtpu_graph_replay(graph, two, 2, &replayed), INVALID, "num_inputs");
  CHECK_ERROR(rtpu_graph_replay(graph, NULL, 1, &replayed), INVALID, "inputs");
  CHECK_ERROR(rtpu_capture_end(rt, &out_ref, 1, "no capture", &graph), INVALID, "capture");
  CHECK_ERROR(rtpu_capture_begin(NULL, &xr, 1), INVALID, "runtime");
  /* Bad input to capture_end still ends the capture: a new one can begin. */
  CHECK_OK(rtpu_capture_begin(rt, &xr, 1));
  CHECK_ERROR(rtpu_capture_end(rt, &out_ref, 1, "bad", NULL), INVALID, "graph_out");
  CHECK(rtpu_engine_mode() == RTPU_MODE_EAGER);
  CHECK_OK(rtpu_capture_begin(rt, &xr, 1));
  CHECK_ERROR(rtpu_capture_end(rt, &out_ref, 1, NULL, &graph), INVALID, "site");
  CHECK_ERROR(rtpu_capture_begin(rt, NULL, 1), INVALID, "inputs");
  CHECK(!rtpu_graph_replayable(NULL) && rtpu_graph_reason(NULL) == NULL);
  rtpu_graph_destroy(NULL);
  check_values(y, squares);

  /* A capture that computes nothing is not replayable, and says why. */
  rtpu_graph *empty = NULL;
  CHECK_OK(rtpu_capture_begin(rt, &xr, 1));
  CHECK_OK(rtpu_capture_end(rt, NULL, 0, "deferred.c: empty", &empty));
  CHECK(!rtpu_graph_replayable(empty) && strstr(rtpu_graph_reason(empty), "nothing") != NULL);
  CHECK_ERROR(rtpu_graph_replay(empty, &xr, 1, &replayed), INVALID, "cannot be replayed");
  rtpu_graph_destroy(empty);

  rtpu_graph_destroy(graph);
  rtpu_storage_release(captured_out);
  rtpu_storage_release(y);
  rtpu_storage_release(x);
  rtpu_runtime_release(rt);
  printf("deferred: ok\n");
  return 0;
}
