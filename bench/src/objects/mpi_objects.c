/* The Open MPI side of `bench objects`: MPI_Barrier, and MPI_Ibcast of 64 bytes from rank 0
 * with k broadcasts outstanding, on every rank of MPI_COMM_WORLD (2 or 3 of them).
 *
 *   mpirun -n N mpi_objects WINDOW_MS K...
 *
 * Rank 0 prints one line per measurement:
 *   barrier ITERATIONS SECONDS     MPI_Barrier ITERATIONS times in a row, after a warm-up
 *   ibcast K MESSAGES SECONDS      MPI_Ibcast completions at rank 0 within the window, with K
 *                                  broadcasts outstanding on every rank
 * then `ok` once every check held.
 *
 * Barrier: a warm-up doubles the number of barriers in a row until they take a quarter of the
 * window; rank 0's time is broadcast so that every rank computes the same count for the window,
 * and the measured loop runs that many (timed on rank 0, from the barrier before it).
 *
 * Broadcast: rank 0 keeps K MPI_Ibcast outstanding: whenever one completes (MPI_Waitany) it
 * posts the next; every other rank keeps K posted and, whenever one completes (its
 * acknowledgement), checks the message and posts the next. Message i is 8 words: i, the total
 * count (0 until rank 0 knows it) and 6 words made from i. After a quarter window of warm-up,
 * rank 0 counts completions for one window; then it fixes the total at the messages posted so
 * far plus K (the receivers have posted at most that many), sends those, and every rank checks
 * that it received every message once, each with its own contents. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WORDS 8

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static uint64_t word(uint64_t i, int j) { return (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)j; }

static void fill(uint64_t *m, uint64_t i, uint64_t total) {
  m[0] = i;
  m[1] = total;
  for (int j = 2; j < WORDS; j++) m[j] = word(i, j);
}

/* Whether message `m` is message `i`, whatever its total. */
static int holds(const uint64_t *m, uint64_t i) {
  if (m[0] != i) return 0;
  for (int j = 2; j < WORDS; j++)
    if (m[j] != word(i, j)) return 0;
  return 1;
}

static void barriers(int rank, double window) {
  long n = 64;
  double secs;
  for (;;) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t = now();
    for (long i = 0; i < n; i++) MPI_Barrier(MPI_COMM_WORLD);
    secs = now() - t;
    MPI_Bcast(&secs, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (secs >= window / 4) break;
    n *= 2;
  }
  long iterations = (long)(n * window / secs);
  if (iterations < 1) iterations = 1;
  MPI_Barrier(MPI_COMM_WORLD);
  double t = now();
  for (long i = 0; i < iterations; i++) MPI_Barrier(MPI_COMM_WORLD);
  secs = now() - t;
  if (rank == 0) {
    printf("barrier %ld %.9f\n", iterations, secs);
    fflush(stdout);
  }
}

/* Returns the number of failed checks on this rank. */
static long broadcasts(int rank, int size, int k, double window) {
  uint64_t(*bufs)[WORDS] = malloc(sizeof(uint64_t[WORDS]) * k);
  MPI_Request *reqs = malloc(sizeof(MPI_Request) * k);
  uint64_t *seq = malloc(sizeof(uint64_t) * k);
  uint64_t posted = 0, done = 0, total = 0;
  long bad = 0;
  MPI_Barrier(MPI_COMM_WORLD);
  for (int s = 0; s < k; s++) {
    if (rank == 0) fill(bufs[s], posted, 0);
    seq[s] = posted++;
    MPI_Ibcast(bufs[s], sizeof bufs[s], MPI_BYTE, 0, MPI_COMM_WORLD, &reqs[s]);
  }
  if (rank == 0) {
    /* The window starts at the first completion after the warm-up and ends at the first one
     * a window after that. */
    double from = now() + window / 4, until = 0, t;
    uint64_t at_from = 0, at_until = 0;
    int counting = 0;
    while (total == 0 || done < total) {
      int s;
      MPI_Waitany(k, reqs, &s, MPI_STATUS_IGNORE);
      done++;
      t = now();
      if (!counting && t >= from) {
        counting = 1;
        at_from = done;
        from = t;
        until = t + window;
      } else if (counting && total == 0 && t >= until) {
        at_until = done;
        until = t;
        total = posted + k;
      }
      if (total == 0 || posted < total) {
        fill(bufs[s], posted, total);
        seq[s] = posted++;
        MPI_Ibcast(bufs[s], sizeof bufs[s], MPI_BYTE, 0, MPI_COMM_WORLD, &reqs[s]);
      }
    }
    printf("ibcast %d %llu %.9f\n", k, (unsigned long long)(at_until - at_from), until - from);
    fflush(stdout);
  } else {
    while (total == 0 || done < total) {
      int s;
      MPI_Waitany(k, reqs, &s, MPI_STATUS_IGNORE);
      done++;
      if (!holds(bufs[s], seq[s])) bad++;
      if (bufs[s][1] != 0) {
        if (total != 0 && total != bufs[s][1]) bad++;
        total = bufs[s][1];
      }
      if (total == 0 || posted < total) {
        seq[s] = posted++;
        MPI_Ibcast(bufs[s], sizeof bufs[s], MPI_BYTE, 0, MPI_COMM_WORLD, &reqs[s]);
      }
    }
    if (done != total || posted != total) bad++;
  }
  (void)size;
  free(bufs);
  free(reqs);
  free(seq);
  return bad;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2 || argc < 2) {
    if (rank == 0) fprintf(stderr, "usage: mpirun -n N %s WINDOW_MS K...\n", argv[0]);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  double window = atof(argv[1]) / 1e3;
  barriers(rank, window);
  long bad = 0;
  for (int a = 2; a < argc; a++) {
    int k = atoi(argv[a]);
    if (k < 1) MPI_Abort(MPI_COMM_WORLD, 2);
    bad += broadcasts(rank, size, k, window);
  }
  long all_bad = 0;
  MPI_Reduce(&bad, &all_bad, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    if (all_bad != 0) {
      fprintf(stderr, "%ld checks failed: a message missing, twice or wrong\n", all_bad);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    printf("ok\n");
  }
  MPI_Finalize();
  return 0;
}
