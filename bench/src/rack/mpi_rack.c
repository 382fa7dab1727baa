/* The Open MPI line of `bench rack`: the rack's operation (add x to a counter another process
 * holds, answer the new value) with point-to-point messages.
 *
 *   mpirun -n 2 mpi_rack WARMUP_MS WINDOW_MS DEPTH
 *
 * Rank 1 serves: DEPTH receives (MPI_Irecv) stay posted; it completes them oldest first (MPI
 * matches messages to receives in the order they were posted, so that is arrival order), adds
 * each request's x to its counter, answers the new value with MPI_Isend and posts the receive
 * again. Rank 0 keeps DEPTH requests outstanding (an MPI_Irecv for the answer, then an MPI_Isend
 * of x, per request), waits for the oldest answer and sends the next request in its place. It
 * runs once for the warm-up and once for the window, each until every answer is in, checks
 * every answer is the running sum of what it sent, and prints
 *   DEPTH ANSWERED SECONDS P50_US P99_US CALLS
 * (answers within the window, the window's length, latency from a request's send to its
 * answer, every request of the run), then `ok`. An x of 0 tells the server to stop. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define MAX_DEPTH 4096
#define MAX_SAMPLES 8000000

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void serve(int depth) {
  static uint64_t in[MAX_DEPTH], out[MAX_DEPTH];
  static MPI_Request recv[MAX_DEPTH], send[MAX_DEPTH];
  uint64_t counter = 0;
  for (int i = 0; i < depth; i++) {
    send[i] = MPI_REQUEST_NULL;
    MPI_Irecv(&in[i], 1, MPI_UINT64_T, 0, 0, MPI_COMM_WORLD, &recv[i]);
  }
  for (int i = 0;; i = (i + 1) % depth) {
    MPI_Wait(&recv[i], MPI_STATUS_IGNORE);
    if (in[i] == 0) {
      for (int j = 0; j < depth; j++) {
        if (j != i) {
          MPI_Cancel(&recv[j]);
          MPI_Wait(&recv[j], MPI_STATUS_IGNORE);
        }
        MPI_Wait(&send[j], MPI_STATUS_IGNORE);
      }
      return;
    }
    counter += in[i];
    MPI_Wait(&send[i], MPI_STATUS_IGNORE); /* the answer sent from this slot last time */
    out[i] = counter;
    MPI_Isend(&out[i], 1, MPI_UINT64_T, 0, 0, MPI_COMM_WORLD, &send[i]);
    MPI_Irecv(&in[i], 1, MPI_UINT64_T, 0, 0, MPI_COMM_WORLD, &recv[i]);
  }
}

/* The client's state across its two runs: what it has added, and its request count. */
static uint64_t added, sent;
static double *samples;

/* One run of rank 0: DEPTH requests outstanding for `window` seconds, then every answer in.
 * Prints the line when `print`. */
static void run(int depth, double window, int print) {
  static uint64_t x[MAX_DEPTH], answer[MAX_DEPTH];
  static MPI_Request recv[MAX_DEPTH], send[MAX_DEPTH];
  static double issued[MAX_DEPTH];
  uint64_t first = sent;
  long answered = 0, n = 0;
  for (int i = 0; i < depth; i++) {
    x[i] = 1 + sent++ % 1000;
    issued[i] = now();
    MPI_Irecv(&answer[i], 1, MPI_UINT64_T, 1, 0, MPI_COMM_WORLD, &recv[i]);
    MPI_Isend(&x[i], 1, MPI_UINT64_T, 1, 0, MPI_COMM_WORLD, &send[i]);
  }
  double start = now(), secs = 0;
  int open = 1;
  /* Answers come in request order: the server answers in arrival order, and messages between
   * two processes on one tag are not overtaken. */
  for (int i = 0, outstanding = depth; outstanding > 0; i = (i + 1) % depth) {
    MPI_Wait(&recv[i], MPI_STATUS_IGNORE);
    MPI_Wait(&send[i], MPI_STATUS_IGNORE);
    double t = now();
    added += x[i];
    if (answer[i] != added) {
      fprintf(stderr, "an answer was %llu, %llu was added\n", (unsigned long long)answer[i],
              (unsigned long long)added);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (open) {
      answered++;
      if (n < MAX_SAMPLES) samples[n++] = t - issued[i];
      if (t - start >= window) {
        open = 0;
        secs = t - start;
      }
    }
    if (open) {
      x[i] = 1 + sent++ % 1000;
      issued[i] = now();
      MPI_Irecv(&answer[i], 1, MPI_UINT64_T, 1, 0, MPI_COMM_WORLD, &recv[i]);
      MPI_Isend(&x[i], 1, MPI_UINT64_T, 1, 0, MPI_COMM_WORLD, &send[i]);
    } else {
      outstanding--;
    }
  }
  if (print) {
    qsort(samples, n, sizeof(double), by_value);
    double p50 = n ? samples[n / 2] : 0, p99 = n ? samples[(long)(n * 0.99)] : 0;
    printf("%d %ld %.6f %.3f %.3f %llu\n", depth, answered, secs, p50 * 1e6, p99 * 1e6,
           (unsigned long long)(sent - first));
  }
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int depth = argc == 4 ? atoi(argv[3]) : 0;
  if (size != 2 || depth < 1 || depth > MAX_DEPTH) {
    if (rank == 0) fprintf(stderr, "usage: mpirun -n 2 %s WARMUP_MS WINDOW_MS DEPTH (1..%d)\n",
                           argv[0], MAX_DEPTH);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (rank == 1) {
    serve(depth);
  } else {
    samples = malloc(sizeof(double) * MAX_SAMPLES);
    run(depth, atof(argv[1]) / 1e3, 0);
    run(depth, atof(argv[2]) / 1e3, 1);
    uint64_t stop = 0;
    MPI_Send(&stop, 1, MPI_UINT64_T, 1, 0, MPI_COMM_WORLD);
    printf("ok\n");
  }
  MPI_Finalize();
  return 0;
}
