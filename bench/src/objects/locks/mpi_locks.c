/* The Open MPI side of `bench objects-locks` (O3): passive-target locks on windows, on every
 * rank of MPI_COMM_WORLD (2 or 3 of them).
 *
 *   mpirun -n N mpi_locks WINDOW_MS ACCOUNTS
 *
 * Rank 0 prints one line per measurement:
 *   lock OPS SECONDS MIN   one contended lock: every rank in a loop locks rank 0's word
 *                          exclusively (MPI_Win_lock), gets it, adds 1, puts it and unlocks;
 *                          OPS by all ranks within the window, MIN by the rank that did fewest
 *   transfer OPS SECONDS MIN  transfers between two of ACCOUNTS accounts spread over 341 windows:
 *                          lock both accounts' (window, rank) in order, get both balances,
 *                          move 1 to 50 if the first has it, unlock; OPS by all ranks
 * then `ok` once every check held: the counter equals the increments made, and the balances
 * add up to what they started at.
 *
 * Account a lives on rank a % N, as word j / 341 of window j % 341 (j = a / N); 341 windows
 * is Open MPI's most (seed 004, App. B.1). Each rank runs for a quarter window of warm-up,
 * then counts its operations for one window on its own clock; the counts are summed. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define WINDOWS 341
#define START 1000

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static uint64_t next(uint64_t *x) {
  *x ^= *x << 13;
  *x ^= *x >> 7;
  *x ^= *x << 17;
  return *x;
}

/* Runs `op` for a quarter window, then counts it for one; returns the count and sets *secs. */
typedef void (*Op)(void *state);
static uint64_t timed(Op op, void *state, double window, double *secs) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t = now();
  while (now() - t < window / 4) op(state);
  uint64_t n = 0;
  t = now();
  do {
    op(state);
    n++;
  } while (now() - t < window);
  *secs = now() - t;
  return n;
}

struct Counter {
  MPI_Win win;
  uint64_t done;
};

static void increment(void *p) {
  struct Counter *c = p;
  uint64_t v;
  MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, c->win);
  MPI_Get(&v, 1, MPI_UINT64_T, 0, 0, 1, MPI_UINT64_T, c->win);
  MPI_Win_flush(0, c->win);
  v++;
  MPI_Put(&v, 1, MPI_UINT64_T, 0, 0, 1, MPI_UINT64_T, c->win);
  MPI_Win_unlock(0, c->win);
  c->done++;
}

struct Bank {
  MPI_Win wins[WINDOWS];
  uint64_t *bases[WINDOWS];
  uint64_t accounts, rng;
  int size;
};

/* Account a's rank, window and word. */
static void place(const struct Bank *b, uint64_t a, int *rank, int *w, MPI_Aint *word) {
  uint64_t j = a / b->size;
  *rank = a % b->size;
  *w = j % WINDOWS;
  *word = j / WINDOWS;
}

static void transfer(void *p) {
  struct Bank *b = p;
  uint64_t x = next(&b->rng), y = next(&b->rng);
  uint64_t a = x % b->accounts, c = y % b->accounts, amount = 1 + (y >> 40) % 50;
  if (a == c) c = (c + 1) % b->accounts;
  int ra, rc, wa, wc;
  MPI_Aint ia, ic;
  place(b, a, &ra, &wa, &ia);
  place(b, c, &rc, &wc, &ic);
  int same = ra == rc && wa == wc;
  /* In (window, rank) order: no two ranks wait for each other. */
  int first_c = wc < wa || (wc == wa && rc < ra);
  if (first_c) {
    MPI_Win_lock(MPI_LOCK_EXCLUSIVE, rc, 0, b->wins[wc]);
    if (!same) MPI_Win_lock(MPI_LOCK_EXCLUSIVE, ra, 0, b->wins[wa]);
  } else {
    MPI_Win_lock(MPI_LOCK_EXCLUSIVE, ra, 0, b->wins[wa]);
    if (!same) MPI_Win_lock(MPI_LOCK_EXCLUSIVE, rc, 0, b->wins[wc]);
  }
  uint64_t va, vc;
  MPI_Get(&va, 1, MPI_UINT64_T, ra, ia, 1, MPI_UINT64_T, b->wins[wa]);
  MPI_Get(&vc, 1, MPI_UINT64_T, rc, ic, 1, MPI_UINT64_T, b->wins[wc]);
  MPI_Win_flush(ra, b->wins[wa]);
  if (!same) MPI_Win_flush(rc, b->wins[wc]);
  if (va >= amount) {
    va -= amount;
    vc += amount;
    MPI_Put(&va, 1, MPI_UINT64_T, ra, ia, 1, MPI_UINT64_T, b->wins[wa]);
    MPI_Put(&vc, 1, MPI_UINT64_T, rc, ic, 1, MPI_UINT64_T, b->wins[wc]);
  }
  MPI_Win_unlock(ra, b->wins[wa]);
  if (!same) MPI_Win_unlock(rc, b->wins[wc]);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2 || argc != 3) {
    if (rank == 0) fprintf(stderr, "usage: mpirun -n N %s WINDOW_MS ACCOUNTS\n", argv[0]);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  double window = atof(argv[1]) / 1e3, secs, max_secs;
  uint64_t accounts = strtoull(argv[2], NULL, 10), n, all, fewest;
  if (accounts < 2) MPI_Abort(MPI_COMM_WORLD, 2);
  long bad = 0;

  struct Counter c = {.done = 0};
  uint64_t *counter;
  MPI_Win_allocate(sizeof(uint64_t), sizeof(uint64_t), MPI_INFO_NULL, MPI_COMM_WORLD, &counter,
                   &c.win);
  MPI_Win_lock(MPI_LOCK_EXCLUSIVE, rank, 0, c.win);
  *counter = 0;
  MPI_Win_unlock(rank, c.win);
  MPI_Barrier(MPI_COMM_WORLD);
  n = timed(increment, &c, window, &secs);
  MPI_Reduce(&n, &all, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(&n, &fewest, 1, MPI_UINT64_T, MPI_MIN, 0, MPI_COMM_WORLD);
  MPI_Reduce(&secs, &max_secs, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  uint64_t increments;
  MPI_Reduce(&c.done, &increments, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, c.win);
    if (*counter != increments) bad++;
    MPI_Win_unlock(0, c.win);
    printf("lock %llu %.9f %llu\n", (unsigned long long)all, max_secs, (unsigned long long)fewest);
    fflush(stdout);
  }
  MPI_Win_free(&c.win);

  struct Bank b = {.accounts = accounts, .size = size, .rng = 0x9E3779B97F4A7C15ull * (rank + 1)};
  uint64_t mine = (accounts - rank + size - 1) / size; /* accounts a with a % size == rank */
  uint64_t words = ((accounts + size - 1) / size + WINDOWS - 1) / WINDOWS;
  for (int w = 0; w < WINDOWS; w++) {
    MPI_Win_allocate(words * sizeof(uint64_t), sizeof(uint64_t), MPI_INFO_NULL, MPI_COMM_WORLD,
                     &b.bases[w], &b.wins[w]);
    MPI_Win_lock(MPI_LOCK_EXCLUSIVE, rank, 0, b.wins[w]);
    for (uint64_t i = 0; i < words; i++) b.bases[w][i] = 0;
    for (uint64_t j = w; j < mine; j += WINDOWS) b.bases[w][j / WINDOWS] = START;
    MPI_Win_unlock(rank, b.wins[w]);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  n = timed(transfer, &b, window, &secs);
  MPI_Barrier(MPI_COMM_WORLD);
  uint64_t held = 0, total = 0;
  for (int w = 0; w < WINDOWS; w++) {
    MPI_Win_lock(MPI_LOCK_SHARED, rank, 0, b.wins[w]);
    for (uint64_t i = 0; i < words; i++) held += b.bases[w][i];
    MPI_Win_unlock(rank, b.wins[w]);
  }
  MPI_Reduce(&held, &total, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(&n, &all, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(&n, &fewest, 1, MPI_UINT64_T, MPI_MIN, 0, MPI_COMM_WORLD);
  MPI_Reduce(&secs, &max_secs, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    if (total != accounts * START) {
      fprintf(stderr, "balances add up to %llu, not %llu\n", (unsigned long long)total,
              (unsigned long long)(accounts * START));
      bad++;
    }
    printf("transfer %llu %.9f %llu\n", (unsigned long long)all, max_secs,
           (unsigned long long)fewest);
    fflush(stdout);
  }
  for (int w = 0; w < WINDOWS; w++) MPI_Win_free(&b.wins[w]);

  if (rank == 0) {
    if (bad != 0) {
      fprintf(stderr, "%ld checks failed\n", bad);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    printf("ok\n");
  }
  MPI_Finalize();
  return 0;
}
