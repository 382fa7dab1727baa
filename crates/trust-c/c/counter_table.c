/* counter_table: a C program sharing a counter and a small chained hash table between threads,
 * four ways: under a pthread_mutex_t, under a pthread_spinlock_t, and entrusted to the trust
 * runtime, with trust_apply from plain threads and with trust_apply_then from fibers.
 *
 *   counter_table example                       each way briefly, every result checked
 *   counter_table bench THREADS MS OUTSTANDING  each way for MS ms (`bench capi` runs this)
 *   counter_table instructions N                the loop `bench instructions` counts
 *
 * bench prints one line per run, `STRUCTURE METHOD THREADS OPERATIONS SECONDS`, and every mode
 * ends with `ok` once its checks passed.
 *
 * The operations: the counter's adds 1 and returns the new value; the table's finds a key
 * (uniform over KEYS, from each thread's own generator) among BUCKETS chains, inserts it if
 * absent, adds 1 to its count and returns the count. The checks: the counter, and the sum of
 * the table's counts, equal the operations made.
 *
 * The threads of each way: the locks run THREADS plain threads. trust_apply runs THREADS plain
 * threads calling a runtime of one worker, the trustee of both structures: the drop-in
 * replacement of a lock in a threaded program. trust_apply_then runs a runtime of THREADS
 * workers with one fiber on each, keeping OUTSTANDING requests in flight. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trust.h"

#define BUCKETS 1024
#define KEYS 8192
#define MAX_THREADS 64

/* Fails the program with a message naming what failed. */
static void die(const char *what) {
  fprintf(stderr, "counter_table: %s\n", what);
  exit(1);
}

/* Checks a trust call, naming it and the runtime's message when it failed. */
static void check(trust_status status, const char *call) {
  if (status != TRUST_OK) {
    fprintf(stderr, "counter_table: %s failed (%d): %s\n", call, (int)status, trust_last_error());
    exit(1);
  }
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* A thread's key generator (xorshift). */
static uint64_t next_key(uint64_t *state) {
  *state ^= *state << 13;
  *state ^= *state >> 7;
  *state ^= *state << 17;
  return *state % KEYS;
}

/* ---- the structures ---- */

struct node {
  uint64_t key, count;
  struct node *next;
};

struct table {
  struct node *bucket[BUCKETS];
};

static uint64_t table_add(struct table *t, uint64_t key) {
  struct node **chain = &t->bucket[key % BUCKETS], *n;
  for (n = *chain; n; n = n->next)
    if (n->key == key) return ++n->count;
  n = malloc(sizeof *n);
  if (!n) die("out of memory");
  n->key = key;
  n->count = 1;
  n->next = *chain;
  *chain = n;
  return 1;
}

static uint64_t table_total(const struct table *t) {
  uint64_t total = 0;
  for (int b = 0; b < BUCKETS; b++)
    for (const struct node *n = t->bucket[b]; n; n = n->next) total += n->count;
  return total;
}

static int tables_freed;

/* The table's destructor, given to trust_entrust: runs once, on the trustee. */
static void table_free(void *p) {
  struct table *t = p;
  for (int b = 0; b < BUCKETS; b++)
    for (struct node *n = t->bucket[b], *next; n; n = next) {
      next = n->next;
      free(n);
    }
  free(t);
  tables_freed++;
}

/* What the trustee runs: the operations as trust_fn functions (property, argument). */
static void *counter_fn(void *property, void *arg) {
  (void)arg;
  return (void *)(uintptr_t)++*(uint64_t *)property;
}
static void *table_fn(void *property, void *arg) {
  return (void *)(uintptr_t)table_add(property, (uintptr_t)arg);
}
static void *counter_read(void *property, void *arg) {
  (void)arg;
  return (void *)(uintptr_t)*(uint64_t *)property;
}
static void *table_read(void *property, void *arg) {
  (void)arg;
  return (void *)(uintptr_t)table_total(property);
}

/* ---- one run ---- */

enum structure { COUNTER, TABLE };
enum method { MUTEX, SPINLOCK, APPLY, APPLY_THEN };
static const char *structure_names[] = {"counter", "table"};
static const char *method_names[] = {"pthread_mutex", "pthread_spinlock", "apply", "apply_then"};

struct run {
  enum structure structure;
  enum method method;
  int threads;
  uint64_t limit;    /* operations per thread, or 0 for none */
  long outstanding;  /* apply_then: requests in flight per fiber */
  atomic_int stop;   /* set when the window ends */
  /* the shared state, one set per way */
  uint64_t counter;
  struct table *table;
  pthread_mutex_t mutex;
  pthread_spinlock_t spin;
  trust_trust *trusted;
  /* operations made, per thread */
  uint64_t ops[MAX_THREADS];
};

struct worker {
  struct run *run;
  int index;
};

static int more(struct run *r, uint64_t done) {
  return !atomic_load_explicit(&r->stop, memory_order_relaxed) && (!r->limit || done < r->limit);
}

/* A plain thread of the lock and trust_apply ways. */
static void *thread_main(void *p) {
  struct worker *w = p;
  struct run *r = w->run;
  uint64_t seed = 0x9E3779B97F4A7C15ull * (w->index + 1), done = 0, answer = 0;
  trust_fn fn = r->structure == COUNTER ? counter_fn : table_fn;
  while (more(r, done)) {
    uint64_t key = next_key(&seed);
    switch (r->method) {
      case MUTEX:
        pthread_mutex_lock(&r->mutex);
        answer = r->structure == COUNTER ? ++r->counter : table_add(r->table, key);
        pthread_mutex_unlock(&r->mutex);
        break;
      case SPINLOCK:
        pthread_spin_lock(&r->spin);
        answer = r->structure == COUNTER ? ++r->counter : table_add(r->table, key);
        pthread_spin_unlock(&r->spin);
        break;
      default: {
        void *result;
        check(trust_apply(r->trusted, fn, (void *)(uintptr_t)key, &result), "trust_apply");
        answer = (uintptr_t)result;
      }
    }
    if (answer == 0) die("an operation answered 0");
    done++;
  }
  r->ops[w->index] = done;
  return NULL;
}

/* A fiber's count of answered requests, and the event its callbacks set at `wake_at`. */
struct answers {
  uint64_t count, wake_at;
  int zero;
  trust_event *event;
};

/* The then callback: counts the answer, and wakes the fiber when it reaches its target. */
static void answered(void *result, void *ctx) {
  struct answers *a = ctx;
  if (result == NULL) a->zero = 1;
  if (++a->count == a->wake_at) check(trust_event_set(a->event), "trust_event_set");
}

/* Suspends the fiber until `a` counts `target` answers. */
static void wait_for_answers(struct answers *a, uint64_t target) {
  if (a->count >= target) return;
  a->wake_at = target;
  check(trust_event_wait(a->event), "trust_event_wait");
}

/* A fiber of the trust_apply_then way: keeps `outstanding` requests in flight, topping them up
 * whenever half have come back. */
static void fiber_main(void *p) {
  struct worker *w = p;
  struct run *r = w->run;
  uint64_t seed = 0x9E3779B97F4A7C15ull * (w->index + 1), issued = 0;
  struct answers a = {0};
  check(trust_event_new(&a.event), "trust_event_new");
  trust_fn fn = r->structure == COUNTER ? counter_fn : table_fn;
  while (more(r, issued)) {
    while (issued - a.count < (uint64_t)r->outstanding && more(r, issued)) {
      uint64_t key = next_key(&seed);
      check(trust_apply_then(r->trusted, fn, (void *)(uintptr_t)key, answered, &a),
            "trust_apply_then");
      issued++;
    }
    wait_for_answers(&a, issued - r->outstanding / 2);
  }
  wait_for_answers(&a, issued);
  if (a.zero) die("an operation answered 0");
  check(trust_event_free(a.event), "trust_event_free");
  r->ops[w->index] = issued;
}

/* Runs one way for `ms` milliseconds (or until each thread made `limit` operations), checks
 * the structure, and returns the operations made; `*secs` gets the time taken. */
static uint64_t run_one(enum structure s, enum method m, int threads, int ms, uint64_t limit,
                        long outstanding, double *secs) {
  static struct run r;
  memset(&r, 0, sizeof r);
  r.structure = s;
  r.method = m;
  r.threads = threads;
  r.limit = limit;
  r.outstanding = outstanding;
  struct worker workers[MAX_THREADS];
  trust_runtime *rt = NULL;
  tables_freed = 0;
  void *value = s == COUNTER ? (void *)calloc(1, sizeof(uint64_t)) : calloc(1, sizeof(struct table));
  if (!value) die("out of memory");
  if (m == MUTEX || m == SPINLOCK) {
    pthread_mutex_init(&r.mutex, NULL);
    pthread_spin_init(&r.spin, PTHREAD_PROCESS_PRIVATE);
    if (s == TABLE) r.table = value; /* the counter is `r.counter` itself */
  } else {
    check(trust_runtime_new(m == APPLY ? 1 : threads, 0, &rt), "trust_runtime_new");
    check(trust_entrust(rt, value, s == COUNTER ? free : table_free, &r.trusted), "trust_entrust");
  }
  pthread_t ids[MAX_THREADS];
  trust_fiber *fibers[MAX_THREADS];
  double start = now();
  for (int i = 0; i < threads; i++) {
    workers[i] = (struct worker){&r, i};
    if (m == APPLY_THEN)
      check(trust_spawn(rt, fiber_main, &workers[i], &fibers[i]), "trust_spawn");
    else if (pthread_create(&ids[i], NULL, thread_main, &workers[i]) != 0)
      die("pthread_create failed");
  }
  if (!limit) {
    struct timespec window = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&window, NULL);
    atomic_store(&r.stop, 1);
  }
  for (int i = 0; i < threads; i++) {
    if (m == APPLY_THEN)
      check(trust_join(fibers[i]), "trust_join");
    else
      pthread_join(ids[i], NULL);
  }
  *secs = now() - start;
  uint64_t ops = 0, held;
  for (int i = 0; i < threads; i++) ops += r.ops[i];
  if (m == MUTEX || m == SPINLOCK) {
    held = s == COUNTER ? r.counter : table_total(r.table);
    if (s == COUNTER)
      free(value);
    else
      table_free(value);
    pthread_mutex_destroy(&r.mutex);
    pthread_spin_destroy(&r.spin);
  } else {
    void *result;
    check(trust_apply(r.trusted, s == COUNTER ? counter_read : table_read, NULL, &result),
          "trust_apply");
    held = (uintptr_t)result;
    check(trust_release(r.trusted), "trust_release");
    check(trust_runtime_free(rt), "trust_runtime_free");
  }
  if (held != ops) {
    fprintf(stderr, "counter_table: %s under %s holds %llu after %llu operations\n",
            structure_names[s], method_names[m], (unsigned long long)held,
            (unsigned long long)ops);
    exit(1);
  }
  if (s == TABLE && tables_freed != 1) die("the table's destructor did not run once");
  return ops;
}

/* ---- example: each way briefly, and the API's errors ---- */

static trust_trust *nested_target;

/* Run on a trustee: a blocking call there must fail, not stall the trustee. */
static void *apply_inside(void *property, void *arg) {
  (void)property;
  (void)arg;
  trust_status s = trust_apply(nested_target, counter_fn, NULL, NULL);
  return (void *)(uintptr_t)s;
}

static void example(void) {
  for (int s = COUNTER; s <= TABLE; s++)
    for (int m = MUTEX; m <= APPLY_THEN; m++) {
      double secs;
      uint64_t ops = run_one(s, m, 2, 0, 500, 16, &secs);
      printf("%s under %s: %llu operations from 2 threads, checked\n", structure_names[s],
             method_names[m], (unsigned long long)ops);
    }

  trust_runtime *rt;
  check(trust_runtime_new(2, 0, &rt), "trust_runtime_new");
  uint64_t *counter = calloc(1, sizeof *counter);
  trust_trust *t;
  check(trust_entrust(rt, counter, free, &t), "trust_entrust");
  nested_target = trust_clone(t);
  void *result;
  check(trust_apply(t, apply_inside, NULL, &result), "trust_apply");
  if ((trust_status)(uintptr_t)result != TRUST_ERROR_DELEGATED_CONTEXT)
    die("trust_apply on a trustee did not fail with TRUST_ERROR_DELEGATED_CONTEXT");
  if (trust_apply(NULL, counter_fn, NULL, NULL) != TRUST_ERROR_NULL ||
      strstr(trust_last_error(), "NULL") == NULL)
    die("trust_apply on NULL did not fail with TRUST_ERROR_NULL and a message");
  if (trust_apply(t, NULL, NULL, NULL) != TRUST_ERROR_NULL) die("a NULL function was accepted");
  trust_runtime *bad;
  if (trust_runtime_new(1, 1, &bad) != TRUST_ERROR_START)
    die("a runtime of only a dedicated trustee started");
  printf("errors: %s\n", trust_last_error());
  check(trust_release(nested_target), "trust_release");
  check(trust_release(t), "trust_release");
  check(trust_runtime_free(rt), "trust_runtime_free");
}

/* ---- instructions: what `bench instructions` counts against its Rust twin ---- */

/* Marks the calling thread as the client, or (run as a request) the trustee, in callgrind's
 * per-thread files. */
__attribute__((noinline)) void mark_client(void) { __asm__ volatile("" ::: "memory"); }
__attribute__((noinline)) void *mark_trustee(void *property, void *arg) {
  (void)arg;
  __asm__ volatile("" ::: "memory");
  return property;
}

/* As the Rust scenario's: requests between yields, and the most left unanswered. */
#define PACE 64
#define MAX_OUTSTANDING 256

static void *add_one(void *property, void *arg) {
  (void)arg;
  ++*(uint64_t *)property;
  return NULL;
}

/* The lean callback: counts, and wakes the fiber at its target. */
static void completed(void *result, void *ctx) {
  (void)result;
  struct answers *a = ctx;
  if (++a->count == a->wake_at) trust_event_set(a->event);
}

struct paced {
  trust_trust *counter;
  uint64_t ops;
};

static void paced_main(void *p) {
  struct paced *job = p;
  struct answers a = {0};
  check(trust_event_new(&a.event), "trust_event_new");
  mark_client();
  check(trust_apply(job->counter, mark_trustee, NULL, NULL), "trust_apply");
  for (uint64_t issued = 1; issued < job->ops + 1; issued++) {
    trust_apply_then(job->counter, add_one, NULL, completed, &a);
    if (issued % PACE == 0) {
      trust_yield();
      if (issued - a.count > MAX_OUTSTANDING) wait_for_answers(&a, issued - MAX_OUTSTANDING / 2);
    }
  }
  wait_for_answers(&a, job->ops);
  check(trust_event_free(a.event), "trust_event_free");
}

static void instructions(uint64_t ops) {
  trust_runtime *rt;
  /* Worker 0 is the client, worker 1 the dedicated trustee, as in the Rust scenario. */
  check(trust_runtime_new(2, 1, &rt), "trust_runtime_new");
  struct paced job = {NULL, ops};
  check(trust_entrust(rt, calloc(1, sizeof(uint64_t)), free, &job.counter), "trust_entrust");
  trust_fiber *fiber;
  check(trust_spawn(rt, paced_main, &job, &fiber), "trust_spawn");
  check(trust_join(fiber), "trust_join");
  void *result;
  check(trust_apply(job.counter, counter_read, NULL, &result), "trust_apply");
  if ((uintptr_t)result != ops) die("the counter does not hold every increment");
  check(trust_release(job.counter), "trust_release");
  check(trust_runtime_free(rt), "trust_runtime_free");
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "example") == 0) {
    example();
  } else if (argc == 5 && strcmp(argv[1], "bench") == 0) {
    int threads = atoi(argv[2]), ms = atoi(argv[3]);
    long outstanding = atol(argv[4]);
    if (threads < 1 || threads > MAX_THREADS || ms < 1 || outstanding < 2) die("bad arguments");
    for (int s = COUNTER; s <= TABLE; s++)
      for (int m = MUTEX; m <= APPLY_THEN; m++) {
        double secs;
        uint64_t ops = run_one(s, m, threads, ms, 0, outstanding, &secs);
        printf("%s %s %d %llu %.6f\n", structure_names[s], method_names[m], threads,
               (unsigned long long)ops, secs);
        fflush(stdout);
      }
  } else if (argc == 3 && strcmp(argv[1], "instructions") == 0) {
    long long ops = atoll(argv[2]);
    if (ops < 1) die("bad arguments");
    instructions((uint64_t)ops);
  } else {
    fprintf(stderr,
            "usage: %s example | bench THREADS MS OUTSTANDING | instructions N\n", argv[0]);
    return 2;
  }
  printf("ok\n");
  return 0;
}
