/* Collectives over the 4 devices of the CPU runtime, one thread per rank as
 * a data-parallel C program would call them, and bad input for each entry
 * point. Runs under ASan and UBSan. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>

#include "check.h"

enum { RANKS = 4, N = 8, INVALID = RTPU_ERROR_CODE_INVALID_ARGUMENT };
static const uint64_t kTimeoutMs = 60000;

static rtpu_runtime *g_runtime;
static rtpu_communicator *g_comm;

static rtpu_tensor_ref ref_of(const rtpu_storage *s, const int64_t *sizes, size_t ndim) {
  static const int64_t kStrides[2] = {2, 1};
  return f32_view(s, 0, sizes, ndim == 2 ? kStrides : kStrides + 1, ndim);
}

/* A new storage on `device` holding `values` (N floats). */
static rtpu_storage *upload(size_t device, const float *values) {
  rtpu_storage *s = NULL;
  CHECK_OK(rtpu_storage_new(g_runtime, device, N * sizeof(float), &s));
  static const int64_t kSizes[1] = {N};
  rtpu_tensor_ref ref = ref_of(s, kSizes, 1);
  CHECK_OK(rtpu_tensor_copy_from_host(&ref, values, N * sizeof(float)));
  return s;
}

static rtpu_collective_args args_for(size_t rank, uint32_t collective, uint32_t op,
                                     const rtpu_storage *input) {
  static const int64_t kSizes[2] = {N / 2, 2};
  return collective_args(collective, op, rank, 2, ref_of(input, kSizes, 2));
}

/* What rank r holds: r * 10 + i. */
static float value(size_t rank, size_t i) { return (float)(rank * 10 + i); }

struct rank_job {
  size_t rank;
  uint32_t collective, op;
  float out[RANKS * N];
  size_t out_count;
};

static void *run_rank(void *arg) {
  struct rank_job *job = arg;
  float in[N];
  for (size_t i = 0; i < N; i++) in[i] = value(job->rank, i);
  rtpu_storage *input = upload(job->rank, in);
  rtpu_collective_args args = args_for(job->rank, job->collective, job->op, input);
  rtpu_work *work = NULL;
  CHECK_OK(rtpu_collective_start(g_comm, &args, &work));
  rtpu_storage *output = NULL;
  CHECK_OK(rtpu_work_wait(work, kTimeoutMs, &output));
  rtpu_work_destroy(work);
  if (job->collective == RTPU_COLLECTIVE_BARRIER) {
    CHECK(output == NULL);
  } else {
    job->out_count = rtpu_storage_nbytes(output) / sizeof(float);
    const int64_t sizes[1] = {(int64_t)job->out_count};
    rtpu_tensor_ref ref = ref_of(output, sizes, 1);
    CHECK_OK(rtpu_tensor_copy_to_host(&ref, job->out, job->out_count * sizeof(float)));
    /* The result is a storage like any other: ops take it. */
    rtpu_storage *doubled = call_binary(g_runtime, "aten::add.Tensor", ref, ref);
    float twice[RANKS * N];
    rtpu_tensor_ref doubled_ref = ref_of(doubled, sizes, 1);
    CHECK_OK(rtpu_tensor_copy_to_host(&doubled_ref, twice, job->out_count * sizeof(float)));
    for (size_t k = 0; k < job->out_count; k++) CHECK(twice[k] == 2 * job->out[k]);
    rtpu_storage_release(doubled);
    rtpu_storage_release(output);
  }
  rtpu_storage_release(input);
  return NULL;
}

static void on_every_rank(uint32_t collective, uint32_t op, struct rank_job *jobs) {
  pthread_t threads[RANKS];
  for (size_t r = 0; r < RANKS; r++) {
    memset(&jobs[r], 0, sizeof jobs[r]);
    jobs[r].rank = r;
    jobs[r].collective = collective;
    jobs[r].op = op;
    CHECK(pthread_create(&threads[r], NULL, run_rank, &jobs[r]) == 0);
  }
  for (size_t r = 0; r < RANKS; r++) CHECK(pthread_join(threads[r], NULL) == 0);
}

static void collectives_from_four_threads(void) {
  static struct rank_job jobs[RANKS];
  /* Sums of small integers are exact in float32. */
  on_every_rank(RTPU_COLLECTIVE_ALL_REDUCE, RTPU_REDUCE_SUM, jobs);
  for (size_t r = 0; r < RANKS; r++) {
    CHECK(jobs[r].out_count == N);
    for (size_t i = 0; i < N; i++) CHECK(jobs[r].out[i] == (float)(60 + 4 * i));
  }
  on_every_rank(RTPU_COLLECTIVE_ALL_REDUCE, RTPU_REDUCE_MAX, jobs);
  for (size_t r = 0; r < RANKS; r++)
    for (size_t i = 0; i < N; i++) CHECK(jobs[r].out[i] == value(3, i));
  on_every_rank(RTPU_COLLECTIVE_ALL_GATHER, RTPU_REDUCE_SUM, jobs);
  for (size_t r = 0; r < RANKS; r++) {
    CHECK(jobs[r].out_count == RANKS * N);
    for (size_t k = 0; k < RANKS * N; k++) CHECK(jobs[r].out[k] == value(k / N, k % N));
  }
  /* 4 rows of 2 over 4 ranks: rank r gets row r, summed. */
  on_every_rank(RTPU_COLLECTIVE_REDUCE_SCATTER, RTPU_REDUCE_SUM, jobs);
  for (size_t r = 0; r < RANKS; r++) {
    CHECK(jobs[r].out_count == 2);
    for (size_t i = 0; i < 2; i++) CHECK(jobs[r].out[i] == (float)(60 + 4 * (2 * r + i)));
  }
  on_every_rank(RTPU_COLLECTIVE_ALL_TO_ALL, RTPU_REDUCE_SUM, jobs);
  for (size_t r = 0; r < RANKS; r++)
    for (size_t k = 0; k < N; k++) CHECK(jobs[r].out[k] == value(k / 2, 2 * r + k % 2));
  on_every_rank(RTPU_COLLECTIVE_BROADCAST, RTPU_REDUCE_SUM, jobs);
  for (size_t r = 0; r < RANKS; r++)
    for (size_t i = 0; i < N; i++) CHECK(jobs[r].out[i] == value(2, i));
  on_every_rank(RTPU_COLLECTIVE_BARRIER, RTPU_REDUCE_SUM, jobs);
}

static void bad_input(void) {
  float zeros[N] = {0};
  rtpu_storage *on_0 = upload(0, zeros);
  rtpu_work *work = NULL;
  rtpu_collective_args args = args_for(0, RTPU_COLLECTIVE_ALL_REDUCE, RTPU_REDUCE_SUM, on_0);
  CHECK_ERROR(rtpu_collective_start(NULL, &args, &work), INVALID, "communicator");
  CHECK_ERROR(rtpu_collective_start(g_comm, NULL, &work), INVALID, "args");
  CHECK_ERROR(rtpu_collective_start(g_comm, &args, NULL), INVALID, "work_out");
  args.struct_size = 8;
  CHECK_ERROR(rtpu_collective_start(g_comm, &args, &work), INVALID, "struct_size");
  args = args_for(0, 17, RTPU_REDUCE_SUM, on_0);
  CHECK_ERROR(rtpu_collective_start(g_comm, &args, &work), INVALID, "RTPU_COLLECTIVE_");
  args = args_for(0, RTPU_COLLECTIVE_ALL_REDUCE, 9, on_0);
  CHECK_ERROR(rtpu_collective_start(g_comm, &args, &work), INVALID, "RTPU_REDUCE_");
  args = args_for(4, RTPU_COLLECTIVE_ALL_REDUCE, RTPU_REDUCE_SUM, on_0);
  CHECK_ERROR(rtpu_collective_start(g_comm, &args, &work), INVALID, "rank");
  args = args_for(1, RTPU_COLLECTIVE_ALL_REDUCE, RTPU_REDUCE_SUM, on_0);
  CHECK_ERROR(rtpu_collective_start(g_comm, &args, &work), INVALID, "the rank's device tpu:1");
  args = args_for(0, RTPU_COLLECTIVE_ALL_REDUCE, RTPU_REDUCE_SUM, on_0);
  static const int64_t kHalf[1] = {N / 2};
  args.input = ref_of(on_0, kHalf, 1);
  CHECK_ERROR(rtpu_collective_start(g_comm, &args, &work), INVALID, "cover all of its storage");
  CHECK_ERROR(rtpu_work_wait(NULL, 1, NULL), INVALID, "work");
  rtpu_work_destroy(NULL);

  /* Rank 0 alone: its wait times out, naming the ranks that never came. */
  args = args_for(0, RTPU_COLLECTIVE_ALL_REDUCE, RTPU_REDUCE_SUM, on_0);
  CHECK_OK(rtpu_collective_start(g_comm, &args, &work));
  CHECK_ERROR(rtpu_work_wait(work, 100, NULL), RTPU_ERROR_CODE_DEADLINE_EXCEEDED,
              "for ranks [1, 2, 3], which never called it");
  CHECK_ERROR(rtpu_work_wait(work, 100, NULL), INVALID, "already waited");
  rtpu_work_destroy(work);
  rtpu_storage_release(on_0);

  const size_t twice[2] = {1, 1};
  rtpu_communicator *comm = NULL;
  CHECK_ERROR(rtpu_communicator_new_local(g_runtime, twice, 2, &comm), INVALID, "each device once");
  CHECK_ERROR(rtpu_communicator_new_local(g_runtime, NULL, 2, &comm), INVALID, "devices");
  CHECK_ERROR(rtpu_communicator_new_local(NULL, twice, 1, &comm), INVALID, "runtime");
  CHECK_ERROR(rtpu_communicator_new_local(g_runtime, twice, 1, NULL), INVALID, "communicator_out");
  CHECK(rtpu_communicator_size(NULL) == 0);
  rtpu_communicator_destroy(NULL);
}

int main(void) {
  g_runtime = open_runtime();
  CHECK(rtpu_runtime_device_count(g_runtime) >= RANKS);
  const size_t devices[RANKS] = {0, 1, 2, 3};
  CHECK_OK(rtpu_communicator_new_local(g_runtime, devices, RANKS, &g_comm));
  CHECK(rtpu_communicator_size(g_comm) == RANKS);
  const uint64_t collectives = metric("collectives_run");
  collectives_from_four_threads();
  CHECK(metric("collectives_run") == collectives + 7);
  rtpu_communicator_destroy(g_comm);
  /* A fresh communicator: the failed round above stays with the old one. */
  CHECK_OK(rtpu_communicator_new_local(g_runtime, devices, RANKS, &g_comm));
  bad_input();
  rtpu_communicator_destroy(g_comm);
  rtpu_runtime_release(g_runtime);
  printf("collectives: ok\n");
  return 0;
}
