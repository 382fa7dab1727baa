/* The Open MPI side of `bench regions`: MPI one-sided operations from rank 0 on a window of
 * rank 1, passive target (MPI_Win_lock_all, MPI_Win_flush after each operation or batch).
 *
 *   mpirun -n 2 mpi_regions WINDOW_MS SIZE...
 *
 * Rank 0 prints one line per measurement, `name x calls seconds p50_us p99_us`:
 *   fetch_add 1 ...   MPI_Fetch_and_op (MPI_SUM, one uint64) + MPI_Win_flush, one at a time
 *   fetch_add 64 ...  64 MPI_Fetch_and_op, then one MPI_Win_flush (latency per batch)
 *   put SIZE ...      MPI_Put of SIZE bytes + MPI_Win_flush (complete at the target)
 *   get SIZE ...      MPI_Get of SIZE bytes + MPI_Win_flush
 * and checks at the end that the counter holds every add made. Rank 1 only waits in a
 * barrier (which drives MPI's progress for transports that need the target's help). */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_BYTES 65536
#define MAX_SAMPLES 4000000

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double *samples;

/* Sorts the first n samples and prints the line for them. */
static void report(const char *name, long x, long calls, long n, double secs) {
  qsort(samples, n, sizeof(double), by_value);
  double p50 = n ? samples[n / 2] : 0, p99 = n ? samples[(long)(n * 0.99)] : 0;
  printf("%s %ld %ld %.6f %.3f %.3f\n", name, x, calls, secs, p50 * 1e6, p99 * 1e6);
  fflush(stdout);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2 || argc < 2) {
    if (rank == 0) fprintf(stderr, "usage: mpirun -n 2 %s WINDOW_MS SIZE...\n", argv[0]);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  double window = atof(argv[1]) / 1e3;
  uint64_t *base;
  MPI_Win win;
  /* Bytes 0..MAX_BYTES for puts and gets, then the counter. */
  MPI_Win_allocate(MAX_BYTES + 8, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
  memset(base, 0, MAX_BYTES + 8);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    samples = malloc(sizeof(double) * MAX_SAMPLES);
    static uint64_t buf[MAX_BYTES / 8], results[64];
    uint64_t one = 1, added = 0;
    MPI_Win_lock_all(0, win);
    for (int depth = 1; depth <= 64; depth *= 64) {
      long calls = 0, n = 0;
      double start = now(), t = start;
      while (t - start < window) {
        for (int i = 0; i < depth; i++)
          MPI_Fetch_and_op(&one, &results[i], MPI_UINT64_T, 1, MAX_BYTES, MPI_SUM, win);
        MPI_Win_flush(1, win);
        double after = now();
        if (n < MAX_SAMPLES) samples[n++] = after - t;
        t = after;
        calls += depth;
      }
      added += calls;
      report("fetch_add", depth, calls, n, t - start);
    }
    for (int k = 2; k < argc; k++) {
      long bytes = atol(argv[k]);
      if (bytes < 8 || bytes > MAX_BYTES) MPI_Abort(MPI_COMM_WORLD, 2);
      for (int get = 0; get <= 1; get++) {
        long calls = 0, n = 0;
        double start = now(), t = start;
        while (t - start < window) {
          if (get)
            MPI_Get(buf, bytes, MPI_BYTE, 1, 0, bytes, MPI_BYTE, win);
          else
            MPI_Put(buf, bytes, MPI_BYTE, 1, 0, bytes, MPI_BYTE, win);
          MPI_Win_flush(1, win);
          double after = now();
          if (n < MAX_SAMPLES) samples[n++] = after - t;
          t = after;
          calls++;
        }
        report(get ? "get" : "put", bytes, calls, n, t - start);
      }
    }
    uint64_t total = 0;
    MPI_Get(&total, 1, MPI_UINT64_T, 1, MAX_BYTES, 1, MPI_UINT64_T, win);
    MPI_Win_flush(1, win);
    MPI_Win_unlock_all(win);
    if (total != added) {
      fprintf(stderr, "the counter holds %llu, %llu were added\n", (unsigned long long)total,
              (unsigned long long)added);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    printf("ok\n");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Win_free(&win);
  MPI_Finalize();
  return 0;
}
