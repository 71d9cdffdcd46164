/* A communicator over two real processes (this one and a forked child,
 * each with its own runtime), its bytes moved by a host transport the test
 * plugs in over a socketpair, as an embedder plugs in gloo or MPI. Every
 * collective, ranks that disagree, a transport failure, a peer that is gone,
 * and bad input. Runs under ASan and UBSan. */
#define _POSIX_C_SOURCE 200809L
#include <poll.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

enum { WORLD = 2, N = 8, INVALID = RTPU_ERROR_CODE_INVALID_ARGUMENT };
static const uint64_t kTimeoutMs = 60000;

struct link {
  int fd;
  size_t rank;
  int releases;
};

static int fail(char *error, size_t size, const char *message) {
  snprintf(error, size, "%s", message);
  return 1;
}

/* Moves `n` bytes one way, giving up after 10 s without progress. */
static int transfer(const struct link *l, void *data, size_t n, int sending) {
  char *p = data;
  while (n > 0) {
    struct pollfd ready = {l->fd, sending ? POLLOUT : POLLIN, 0};
    if (poll(&ready, 1, 10000) != 1) return -1;
    /* MSG_NOSIGNAL: a peer that is gone is an error, not SIGPIPE. */
    const ssize_t done = sending ? send(l->fd, p, n, MSG_NOSIGNAL) : read(l->fd, p, n);
    if (done <= 0) return -1;
    p += done;
    n -= (size_t)done;
  }
  return 0;
}

/* Sends `mine`, receives the peer's into `theirs`: rank 0 sends first, so
 * the two never both wait to send. */
static int swap(const struct link *l, const void *mine, void *theirs, size_t n) {
  if (l->rank == 0) {
    return transfer(l, (void *)mine, n, 1) || transfer(l, theirs, n, 0) ? -1 : 0;
  }
  return transfer(l, theirs, n, 0) || transfer(l, (void *)mine, n, 1) ? -1 : 0;
}

static int t_all_gather(void *context, const void *input, void *output, size_t nbytes, char *error,
                        size_t error_size) {
  const struct link *l = context;
  char *out = output;
  memcpy(out + l->rank * nbytes, input, nbytes);
  if (swap(l, input, out + (1 - l->rank) * nbytes, nbytes)) return fail(error, error_size, "peer gone");
  return 0;
}

static int t_all_reduce(void *context, void *data, size_t nbytes, uint32_t dtype, uint32_t op,
                        char *error, size_t error_size) {
  if (dtype != RTPU_DTYPE_FLOAT32) return fail(error, error_size, "this transport reduces float32 only");
  float *mine = data, theirs[64];
  if (nbytes > sizeof theirs) return fail(error, error_size, "too large for this transport");
  if (swap(context, data, theirs, nbytes)) return fail(error, error_size, "peer gone");
  const struct link *l = context;
  for (size_t i = 0; i < nbytes / sizeof(float); i++) {
    /* Rank order, so both ranks compute the same bits. */
    const float a = l->rank == 0 ? mine[i] : theirs[i], b = l->rank == 0 ? theirs[i] : mine[i];
    mine[i] = op == RTPU_REDUCE_SUM ? a + b : op == RTPU_REDUCE_PROD ? a * b
            : op == RTPU_REDUCE_MIN ? (a < b ? a : b) : (a > b ? a : b);
  }
  return 0;
}

static int t_all_to_all(void *context, const void *input, void *output, size_t nbytes, char *error,
                        size_t error_size) {
  const struct link *l = context;
  const size_t piece = nbytes / WORLD;
  const char *in = input;
  char *out = output;
  memcpy(out + l->rank * piece, in + l->rank * piece, piece);
  if (swap(l, in + (1 - l->rank) * piece, out + (1 - l->rank) * piece, piece))
    return fail(error, error_size, "peer gone");
  return 0;
}

static int t_broadcast(void *context, void *data, size_t nbytes, size_t root, char *error,
                       size_t error_size) {
  const struct link *l = context;
  if (transfer(l, data, nbytes, l->rank == root)) return fail(error, error_size, "peer gone");
  return 0;
}

static int t_barrier(void *context, char *error, size_t error_size) {
  char mine = 1, theirs = 0;
  if (swap(context, &mine, &theirs, 1)) return fail(error, error_size, "peer gone");
  return 0;
}

static void t_release(void *context) { ((struct link *)context)->releases++; }

static rtpu_host_transport transport_over(struct link *l) {
  return (rtpu_host_transport){.struct_size = RTPU_HOST_TRANSPORT_STRUCT_SIZE, .context = l,
                               .all_reduce = t_all_reduce, .all_gather = t_all_gather,
                               .all_to_all = t_all_to_all, .broadcast = t_broadcast,
                               .barrier = t_barrier, .release = t_release};
}

static rtpu_runtime *g_runtime;

static rtpu_storage *upload(const float *values, size_t n) {
  rtpu_storage *s = NULL;
  CHECK_OK(rtpu_storage_new(g_runtime, 0, n * sizeof(float), &s));
  const int64_t sizes[1] = {(int64_t)n}, strides[1] = {1};
  rtpu_tensor_ref ref = f32_view(s, 0, sizes, strides, 1);
  CHECK_OK(rtpu_tensor_copy_from_host(&ref, values, n * sizeof(float)));
  return s;
}

/* Runs one collective on rank `rank`'s values r*10+i (n of them, read as
 * n/2 x 2) and returns the result's floats in `out` (their count). */
static size_t run(rtpu_communicator *comm, size_t rank, uint32_t collective, uint32_t op, size_t n,
                  float *out, rtpu_error **error) {
  float in[16];
  for (size_t i = 0; i < n; i++) in[i] = (float)(rank * 10 + i);
  rtpu_storage *input = upload(in, n);
  const int64_t sizes[2] = {(int64_t)n / 2, 2}, strides[2] = {2, 1};
  rtpu_collective_args args =
      collective_args(collective, op, rank, 1, f32_view(input, 0, sizes, strides, 2));
  rtpu_work *work = NULL;
  size_t count = 0;
  *error = rtpu_collective_start(comm, &args, &work);
  if (*error == NULL) {
    rtpu_storage *output = NULL;
    *error = rtpu_work_wait(work, kTimeoutMs, &output);
    if (output != NULL) {
      count = rtpu_storage_nbytes(output) / sizeof(float);
      const int64_t out_sizes[1] = {(int64_t)count}, out_strides[1] = {1};
      rtpu_tensor_ref ref = f32_view(output, 0, out_sizes, out_strides, 1);
      CHECK_OK(rtpu_tensor_copy_to_host(&ref, out, count * sizeof(float)));
      rtpu_storage_release(output);
    }
    rtpu_work_destroy(work);
  }
  rtpu_storage_release(input);
  return count;
}

static size_t run_ok(rtpu_communicator *comm, size_t rank, uint32_t collective, uint32_t op, size_t n,
                     float *out) {
  rtpu_error *error = NULL;
  const size_t count = run(comm, rank, collective, op, n, out, &error);
  CHECK_OK(error);
  return count;
}

static float v(size_t rank, size_t i) { return (float)(rank * 10 + i); }

static void rank_main(size_t rank, int fd) {
  g_runtime = open_runtime();
  struct link l = {fd, rank, 0};
  rtpu_host_transport t = transport_over(&l);
  rtpu_communicator *comm = NULL;
  CHECK_OK(rtpu_communicator_new_processes(g_runtime, 0, rank, WORLD, &t, &comm));
  CHECK(rtpu_communicator_size(comm) == WORLD);
  float out[32];

  CHECK(run_ok(comm, rank, RTPU_COLLECTIVE_ALL_REDUCE, RTPU_REDUCE_SUM, N, out) == N);
  for (size_t i = 0; i < N; i++) CHECK(out[i] == v(0, i) + v(1, i));
  run_ok(comm, rank, RTPU_COLLECTIVE_ALL_REDUCE, RTPU_REDUCE_AVG, N, out);
  for (size_t i = 0; i < N; i++) CHECK(out[i] == (v(0, i) + v(1, i)) / 2);
  CHECK(run_ok(comm, rank, RTPU_COLLECTIVE_ALL_GATHER, RTPU_REDUCE_SUM, N, out) == WORLD * N);
  for (size_t k = 0; k < WORLD * N; k++) CHECK(out[k] == v(k / N, k % N));
  /* 4 rows of 2: rank r gets rows 2r and 2r + 1, summed. */
  CHECK(run_ok(comm, rank, RTPU_COLLECTIVE_REDUCE_SCATTER, RTPU_REDUCE_MAX, N, out) == N / 2);
  for (size_t i = 0; i < N / 2; i++) CHECK(out[i] == v(1, rank * N / 2 + i));
  run_ok(comm, rank, RTPU_COLLECTIVE_ALL_TO_ALL, RTPU_REDUCE_SUM, N, out);
  for (size_t k = 0; k < N; k++) CHECK(out[k] == v(k / (N / 2), rank * N / 2 + k % (N / 2)));
  run_ok(comm, rank, RTPU_COLLECTIVE_BROADCAST, RTPU_REDUCE_SUM, N, out);
  for (size_t i = 0; i < N; i++) CHECK(out[i] == v(1, i));
  CHECK(run_ok(comm, rank, RTPU_COLLECTIVE_BARRIER, RTPU_REDUCE_SUM, N, out) == 0);

  /* Rank 1 passes 10 values where rank 0 passes 8: both get the error,
   * before any payload moved, and the next collective works. */
  rtpu_error *error = NULL;
  run(comm, rank, RTPU_COLLECTIVE_ALL_REDUCE, RTPU_REDUCE_SUM, rank == 1 ? N + 2 : N, out, &error);
  CHECK_ERROR(error, INVALID, rank == 0 ? "rank 0 called all_reduce(Sum) of float32[4, 2], ranks [1]"
                                        : "rank 1 called all_reduce(Sum) of float32[5, 2], ranks [0]");
  run_ok(comm, rank, RTPU_COLLECTIVE_ALL_REDUCE, RTPU_REDUCE_MIN, N, out);
  for (size_t i = 0; i < N; i++) CHECK(out[i] == v(0, i));

  /* The transport's own failure comes back with its message. */
  rtpu_storage *ints = NULL;
  CHECK_OK(rtpu_storage_new(g_runtime, 0, 4 * sizeof(int32_t), &ints));
  const int32_t four[4] = {1, 2, 3, 4};
  const int64_t sizes[1] = {4}, strides[1] = {1};
  rtpu_tensor_ref ints_ref = {ints, 0, sizes, strides, 1, RTPU_DTYPE_INT32};
  CHECK_OK(rtpu_tensor_copy_from_host(&ints_ref, four, sizeof four));
  rtpu_collective_args args =
      collective_args(RTPU_COLLECTIVE_ALL_REDUCE, RTPU_REDUCE_SUM, rank, 0, ints_ref);
  rtpu_work *work = NULL;
  CHECK_OK(rtpu_collective_start(comm, &args, &work));
  CHECK_ERROR(rtpu_work_wait(work, kTimeoutMs, NULL), RTPU_ERROR_CODE_INTERNAL,
              "all_reduce failed (1): this transport reduces float32 only");
  CHECK_ERROR(rtpu_work_wait(work, kTimeoutMs, NULL), INVALID, "already waited");
  rtpu_work_destroy(work);
  args.rank = 1 - rank;
  CHECK_ERROR(rtpu_collective_start(comm, &args, &work), INVALID, "this process is rank");
  rtpu_storage_release(ints);

  if (rank == 1) {
    /* Gone without a word: rank 0's next collective says so, in time. */
    rtpu_communicator_destroy(comm);
    CHECK(l.releases == 1);
    rtpu_runtime_release(g_runtime);
    close(fd);
    exit(0);
  }
  run(comm, rank, RTPU_COLLECTIVE_ALL_REDUCE, RTPU_REDUCE_SUM, N, out, &error);
  CHECK_ERROR(error, RTPU_ERROR_CODE_INTERNAL, "peer gone");
  rtpu_communicator_destroy(comm);
  CHECK(l.releases == 1);

  /* Bad input; the transport's context is released even when refused. */
  struct link spare = {-1, 0, 0};
  rtpu_host_transport bad = transport_over(&spare);
  CHECK_ERROR(rtpu_communicator_new_processes(g_runtime, 0, 2, WORLD, &bad, &comm), INVALID, "rank");
  CHECK_ERROR(rtpu_communicator_new_processes(g_runtime, 99, 0, WORLD, &bad, &comm), INVALID, "device");
  CHECK_ERROR(rtpu_communicator_new_processes(NULL, 0, 0, WORLD, &bad, &comm), INVALID, "runtime");
  CHECK_ERROR(rtpu_communicator_new_processes(g_runtime, 0, 0, WORLD, &bad, NULL), INVALID,
              "communicator_out");
  CHECK(spare.releases == 4);
  CHECK_ERROR(rtpu_communicator_new_processes(g_runtime, 0, 0, WORLD, NULL, &comm), INVALID, "transport");
  bad.struct_size = 8;
  CHECK_ERROR(rtpu_communicator_new_processes(g_runtime, 0, 0, WORLD, &bad, &comm), INVALID,
              "struct_size");
  CHECK(spare.releases == 4);
  rtpu_runtime_release(g_runtime);
}

int main(void) {
  int fds[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  /* Fork before either opens a runtime: each process has its own. */
  const pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) {
    close(fds[0]);
    rank_main(1, fds[1]);
    return 0;
  }
  close(fds[1]);
  rank_main(0, fds[0]);
  int status = 0;
  CHECK(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  close(fds[0]);
  printf("processes: ok\n");
  return 0;
}
