/* The driver of tools/bench_matvec.py: times llmc's one-row product kernels (compiler/csrc/matvec_x86_64.c,
 * linked in as the object llmc itself builds) over model-shaped packed weights streamed from memory, against
 * a plain read of the same bytes, in one process. Not part of any module llmc builds.
 *
 *   bench_matvec [-t THREADS] ROUNDS SPEC [SPEC ...]
 *   SPEC = KIND:FUNCTION:ARG:G:GROUPSxKxPER[,GROUPSxKxPER ...]   (products in the order a step runs them)
 *
 * KIND is fp8, fp8dp (fp8 in the pair layout of passes/_packed.py pack_pairs, for CPUs with AVX512_BF16; G 64),
 * int8 or bf16 (1, 1, 1, 2 bytes a weight); FUNCTION the C function the compile would call for it
 * (llmc_matvec_bf16 or llmc_matvec_bf16_avx512 for bf16); ARG the C function's last argument (bf16: the stream threshold; fp8, int8: the prefetch distance in bytes; fp8dp: unused); G the channels
 * of a packed group (passes/_packed.py KERNEL_GROUPS: the layout the kernels read). The weights lie one product after the other in one buffer of 2 MB pages (as llmc's resident
 * weights), each product called workgroup by workgroup, in order, as IREE's local-sync device calls them; the
 * MXCSR flushes denormals as IREE's workers do. Each round times, per kind (kinds in alternating order from
 * round to round): a plain read of the kind's bytes (four 256-bit loads per 128 bytes into four f32 sums), then every product.
 *
 * With THREADS > 1 (the calling thread and THREADS - 1 more, each pinned to its own CPU where the affinity mask
 * allows), each thread reads a contiguous 1/THREADS of the bytes for the plain read, and the products run as
 * IREE's local-task device runs a step's: each product's workgroups handed out one at a time from an atomic
 * counter, and every thread waiting at a barrier after each product; but a spinning barrier, not IREE's sleeping
 * hand-off, so what is left is the loops' own rate at THREADS threads and the cost of the product boundaries.
 * A third timing, `stream`, runs every workgroup of every product with each thread taking a contiguous
 * 1/THREADS of them and no barrier at all: the loops' rate at THREADS threads with no boundary costs.
 *
 * Prints, one line each:
 *   huge BYTES          how much of the process's anonymous memory is in 2 MB pages, after the fill (the kernel
 *                       may give fewer than asked for: /sys/kernel/mm/transparent_hugepage)
 *   check KIND ERROR    the first product against a double-precision sum of the same decoded weights:
 *                       max over channels of |error| / sum |x w|
 *   check_threads KIND MODE ERROR   (THREADS > 1) the same for the last product, as the threads leave it after
 *                       one run of every product (MODE claim or stream); a channel no thread wrote reads NaN
 *   round R KIND READ_S KERNEL_S BYTES
 *   stream R KIND STREAM_S     (THREADS > 1 only)
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define MEMREF(T, name) T *name##_base, T *name##_aligned, size_t name##_offset, size_t name##_size, size_t name##_stride
void llmc_matvec_fp8(MEMREF(const float, x), MEMREF(const int8_t, p), MEMREF(float, y), size_t k, size_t groups,
                     size_t per_wg, size_t wg, size_t ahead);
void llmc_matvec_fp8dp(MEMREF(const uint16_t, xq), MEMREF(const int8_t, p), MEMREF(float, y), size_t k, size_t groups,
                       size_t per_wg, size_t wg);
void llmc_matvec_int8(MEMREF(const float, x), MEMREF(const int8_t, p), MEMREF(float, y), size_t k, size_t groups,
                      size_t per_wg, size_t wg, size_t ahead);
void llmc_matvec_bf16(MEMREF(const float, x), MEMREF(const uint16_t, p), MEMREF(float, y), size_t k, size_t groups,
                      size_t per_wg, size_t wg, size_t pair_min_k);
void llmc_matvec_bf16_avx512(MEMREF(const float, x), MEMREF(const uint16_t, p), MEMREF(float, y), size_t k,
                             size_t groups, size_t per_wg, size_t wg, size_t pair_min_k);

#define MAX_PRODUCTS 4096
#define MAX_KINDS 8

enum loop { FP8, FP8DP, INT8, BF16, BF16_AVX512 }; /* the C function a SPEC names, resolved once at parse */

typedef struct {
  char kind[8], function[40];
  enum loop loop;
  size_t arg, group, elem, count, bytes; /* arg: the C function's last (bf16: pair_min_k; fp8, int8: ahead) */
  size_t groups[MAX_PRODUCTS], k[MAX_PRODUCTS], per[MAX_PRODUCTS];
} spec_t;

static size_t workgroups(const spec_t *s, size_t i) { return (s->groups[i] + s->per[i] - 1) / s->per[i]; }

static size_t product_bytes(const spec_t *s, size_t i) { return s->groups[i] * s->k[i] * s->group * s->elem; }

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void die(const char *what) {
  fprintf(stderr, "bench_matvec: %s\n", what);
  exit(2);
}

static void parse(const char *arg, spec_t *s) {
  const char *c1 = strchr(arg, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL, *c3 = c2 ? strchr(c2 + 1, ':') : NULL;
  const char *c4 = c3 ? strchr(c3 + 1, ':') : NULL;
  if (!c4 || c1 - arg >= (long)sizeof s->kind || c2 - c1 - 1 >= (long)sizeof s->function) die("bad SPEC");
  memset(s, 0, sizeof *s);
  memcpy(s->kind, arg, c1 - arg);
  memcpy(s->function, c1 + 1, c2 - c1 - 1);
  s->arg = strtoull(c2 + 1, NULL, 10);
  s->group = strtoull(c3 + 1, NULL, 10);
  if (!strcmp(s->kind, "fp8")) s->loop = FP8, s->elem = 1;
  else if (!strcmp(s->kind, "fp8dp")) s->loop = FP8DP, s->elem = 1;
  else if (!strcmp(s->kind, "int8")) s->loop = INT8, s->elem = 1;
  else if (!strcmp(s->kind, "bf16")) s->loop = strcmp(s->function, "llmc_matvec_bf16_avx512") ? BF16 : BF16_AVX512, s->elem = 2;
  else die("KIND must be fp8, fp8dp, int8 or bf16");
  if (s->group != 8 && s->group != 32 && s->group != 64) die("G must be 8, 32 or 64");
  if ((s->loop == FP8DP) != (s->group == 64)) die("fp8dp's G is 64, and only fp8dp's");
  for (const char *p = c4 + 1; *p;) {
    if (s->count == MAX_PRODUCTS) die("too many products");
    char *end;
    s->groups[s->count] = strtoull(p, &end, 10);
    if (*end != 'x') die("bad product (GROUPSxKxPER)");
    s->k[s->count] = strtoull(end + 1, &end, 10);
    if (*end != 'x') die("bad product (GROUPSxKxPER)");
    s->per[s->count] = strtoull(end + 1, &end, 10);
    if (!s->groups[s->count] || !s->k[s->count] || !s->per[s->count]) die("zero in a product");
    s->bytes += product_bytes(s, s->count);
    s->count++;
    p = *end == ',' ? end + 1 : end;
  }
}

/* fp8dp's x: the bf16 halves of x * 2^32, [2, K] (hi then lo, each rounded to nearest even), as the compiled
 * graph computes them (compiler/ukernels.py fp8_x_halves); one buffer per K, made on its first use (the check
 * or the untimed round 0) */
#define MAX_HALVES 8
static size_t halves_k[MAX_HALVES];
static uint16_t *halves[MAX_HALVES];

static uint16_t bf16_bits(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return (uint16_t)((b + 0x7FFF + ((b >> 16) & 1)) >> 16);
}

static const uint16_t *x_halves(const float *x, size_t k) {
  int i = 0;
  for (; i < MAX_HALVES && halves[i]; i++)
    if (halves_k[i] == k) return halves[i];
  if (i == MAX_HALVES) die("too many K values for fp8dp");
  uint16_t *h = malloc(4 * k);
  if (!h) die("out of memory");
  for (size_t j = 0; j < k; j++) {
    float v = x[j] * 0x1p32f, hi;
    h[j] = bf16_bits(v);
    uint32_t hb = (uint32_t)h[j] << 16;
    memcpy(&hi, &hb, 4);
    h[k + j] = bf16_bits(v - hi);
  }
  halves_k[i] = k, halves[i] = h;
  return h;
}

static void call(const spec_t *s, size_t i, const float *x, const void *p, float *y, size_t wg) {
  size_t n = s->groups[i] * s->group, k = s->k[i], g = s->groups[i], per = s->per[i];
  switch (s->loop) {
  case FP8: llmc_matvec_fp8(0, x, 0, k, 1, 0, p, 0, n * k, 1, 0, y, 0, n, 1, k, g, per, wg, s->arg); break;
  case FP8DP: {
    const uint16_t *xq = x_halves(x, k);
    llmc_matvec_fp8dp(0, xq, 0, 2 * k, 1, 0, p, 0, n * k, 1, 0, y, 0, n, 1, k, g, per, wg);
    break;
  }
  case INT8: llmc_matvec_int8(0, x, 0, k, 1, 0, p, 0, n * k, 1, 0, y, 0, n, 1, k, g, per, wg, s->arg); break;
  case BF16_AVX512: llmc_matvec_bf16_avx512(0, x, 0, k, 1, 0, p, 0, n * k, 1, 0, y, 0, n, 1, k, g, per, wg, s->arg); break;
  case BF16: llmc_matvec_bf16(0, x, 0, k, 1, 0, p, 0, n * k, 1, 0, y, 0, n, 1, k, g, per, wg, s->arg); break;
  }
}

static void products(const spec_t *s, const float *x, const uint8_t *w, float *y) {
  for (size_t i = 0; i < s->count; i++) {
    for (size_t wg = 0; wg < workgroups(s, i); wg++) call(s, i, x, w, y, wg);
    w += product_bytes(s, i);
  }
}

/* the weight a code stands for, as the kernels decode it under flush-to-zero (fp8 in units of 2^-120) */
static double value(const spec_t *s, const uint8_t *w, size_t index) {
  if (s->loop == INT8) return (int8_t)w[index];
  if (s->loop == BF16 || s->loop == BF16_AVX512) {
    uint32_t bits = (uint32_t)((const uint16_t *)w)[index] << 16;
    float f;
    memcpy(&f, &bits, 4);
    return fpclassify(f) == FP_SUBNORMAL ? 0.0 : f;
  }
  unsigned c = w[index], e = (c >> 3) & 15, m = c & 7; /* fp8 and fp8dp */
  double v = e ? ldexp(1.0 + m / 8.0, (int)e - 7) : 0.0; /* E4M3 subnormals read as 0 */
  return ldexp(c & 0x80 ? -v : v, -120);
}

/* y against product `i` (weights at w) of double-precision sums: max over channels of |error| / sum |x w| */
static double error_of(const spec_t *s, size_t i0, const float *x, const uint8_t *w, const float *y) {
  size_t k = s->k[i0], g = s->group;
  double worst = 0;
  for (size_t c = 0; c < s->groups[i0] * g; c++) {
    double sum = 0, terms = 0;
    for (size_t i = 0; i < k; i++) {
      size_t j = c % g, at = s->loop == FP8DP /* the pair layout: passes/_packed.py pack_pairs */
                                ? (c / g) * k * g + (i / 2) * 128 + (j / 16) * 32 + (j % 8) * 4 + 2 * (i % 2) + (j / 8) % 2
                                : ((c / g) * k + i) * g + j;
      double t = value(s, w, at) * x[i];
      sum += t;
      terms += fabs(t);
    }
    double e = terms > 0 ? fabs(y[c] - sum) / terms : fabs(y[c] - sum);
    if (!(e <= worst)) worst = e; /* NaN (a channel never written) sticks */
  }
  return worst;
}

static double check(const spec_t *s, const float *x, const uint8_t *w, float *y) {
  for (size_t wg = 0; wg < workgroups(s, 0); wg++) call(s, 0, x, w, y, wg);
  return error_of(s, 0, x, w, y);
}

static long long anon_huge_bytes(void) {
  FILE *f = fopen("/proc/self/smaps_rollup", "r");
  char line[256];
  long long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "AnonHugePages:", 14)) kb = atoll(line + 14);
  if (f) fclose(f);
  return kb < 0 ? -1 : kb * 1024;
}

/* The round's roofline: every byte loaded once, four 256-bit loads per 128 bytes into four independent f32 sums
 * (the weights' bits read as floats; denormals are flushed by then, so no assists). Measured beside torch's sum of
 * a 2 MB-page buffer (tools/bench.py's roofline) in one process on the Zen 4 VM, 16 rounds: this form 1.002x its
 * rate; the earlier form (byte adds into two sums) 0.933x, which made every kernel look ~7% closer to the
 * roofline than bench.py's figures (docs/targets.md "The loops' own roofline"). */
static double plain_read(const uint8_t *w, size_t bytes) {
  __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
  for (size_t i = 0; i + 128 <= bytes; i += 128) {
    a = _mm256_add_ps(a, _mm256_load_ps((const float *)(w + i)));
    b = _mm256_add_ps(b, _mm256_load_ps((const float *)(w + i + 32)));
    c = _mm256_add_ps(c, _mm256_load_ps((const float *)(w + i + 64)));
    d = _mm256_add_ps(d, _mm256_load_ps((const float *)(w + i + 96)));
  }
  float t[8];
  _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
  return t[0];
}

/* ---- THREADS > 1: persistent threads that run one job at a time, meeting at a spinning barrier ---- */

static int nthreads = 1;
static atomic_int barrier_count, barrier_sense;

static void barrier(int *sense) { /* sense-reversing: every thread keeps its own sense */
  *sense = !*sense;
  if (atomic_fetch_add(&barrier_count, 1) == nthreads - 1) {
    atomic_store(&barrier_count, 0);
    atomic_store(&barrier_sense, *sense);
  } else {
    while (atomic_load(&barrier_sense) != *sense) _mm_pause();
  }
}

enum job { JOB_READ, JOB_CLAIM, JOB_STREAM, JOB_QUIT };
static struct {
  enum job job;
  const spec_t *spec;
  const float *x;
  const uint8_t *w;
  float *y, *y_last; /* the last product writes y_last: `stream` runs products side by side, so they would
                       * overwrite each other's y, and the threaded check reads the last product's */
  size_t bytes;
  atomic_size_t next[MAX_PRODUCTS]; /* JOB_CLAIM: each product's next workgroup */
} work;
static double read_sinks[64];

static void run_job(int t, int *sense) {
  const spec_t *s = work.spec;
  if (work.job == JOB_READ) {
    size_t lines = work.bytes / 128, a = lines * t / nthreads, b = lines * (t + 1) / nthreads;
    read_sinks[t] += plain_read(work.w + 128 * a, 128 * (b - a));
  } else if (work.job == JOB_CLAIM) {
    const uint8_t *w = work.w;
    for (size_t i = 0; i < s->count; i++) {
      size_t nwg = workgroups(s, i), wg;
      float *y = i + 1 == s->count ? work.y_last : work.y;
      while ((wg = atomic_fetch_add(&work.next[i], 1)) < nwg) call(s, i, work.x, w, y, wg);
      barrier(sense);
      w += product_bytes(s, i);
    }
  } else if (work.job == JOB_STREAM) {
    size_t total = 0, at = 0;
    for (size_t i = 0; i < s->count; i++) total += workgroups(s, i);
    size_t a = total * t / nthreads, b = total * (t + 1) / nthreads;
    const uint8_t *w = work.w;
    for (size_t i = 0; i < s->count; i++) {
      for (size_t wg = 0; wg < workgroups(s, i); wg++, at++)
        if (at >= a && at < b) call(s, i, work.x, w, i + 1 == s->count ? work.y_last : work.y, wg);
      w += product_bytes(s, i);
    }
  }
}

static cpu_set_t allowed_cpus; /* the process's affinity mask at start, before any thread is pinned */

static void pin(int t) {
  int seen = 0;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &allowed_cpus) && seen++ == t) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(c, &one);
      pthread_setaffinity_np(pthread_self(), sizeof one, &one);
      return;
    }
}

static void *worker(void *arg) {
  int t = (int)(intptr_t)arg, sense = 0;
  pin(t);
  _mm_setcsr(_mm_getcsr() | 0x8040); /* FTZ | DAZ, as IREE's workers run */
  for (;;) {
    barrier(&sense); /* the job is set */
    if (work.job == JOB_QUIT) return NULL;
    run_job(t, &sense);
    barrier(&sense); /* the job is done */
  }
}

/* the calling thread's part of a job, with every worker: seconds from the start barrier to the end one */
static double timed(enum job job, const spec_t *s, const float *x, const uint8_t *w, float *y, size_t bytes) {
  static int sense = 0;
  work.job = job, work.spec = s, work.x = x, work.w = w, work.y = y, work.bytes = bytes;
  for (size_t i = 0; s && i < s->count; i++) atomic_store(&work.next[i], 0);
  barrier(&sense);
  if (job == JOB_QUIT) return 0; /* the workers leave after the start barrier */
  double t0 = now();
  run_job(0, &sense);
  barrier(&sense);
  return now() - t0;
}

int main(int argc, char **argv) {
  if (argc > 2 && !strcmp(argv[1], "-t")) {
    nthreads = atoi(argv[2]);
    argc -= 2, argv += 2;
    if (nthreads < 1 || nthreads > 64) die("THREADS must be 1 to 64");
  }
  if (argc < 3) die("usage: bench_matvec [-t THREADS] ROUNDS SPEC [SPEC ...]");
  int rounds = atoi(argv[1]), kinds = argc - 2;
  if (rounds < 1 || kinds > MAX_KINDS) die("ROUNDS must be >= 1, at most 8 SPECs");
  static spec_t specs[MAX_KINDS];
  size_t bytes = 0, kmax = 0;
  for (int i = 0; i < kinds; i++) {
    parse(argv[2 + i], &specs[i]);
    if (specs[i].bytes > bytes) bytes = specs[i].bytes;
    for (size_t j = 0; j < specs[i].count; j++) if (specs[i].k[j] > kmax) kmax = specs[i].k[j];
  }
  size_t mapped = (bytes + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
  uint8_t *w = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (w == MAP_FAILED) die("cannot map the weights");
  madvise(w, mapped, MADV_HUGEPAGE);
  uint64_t r = 0x9E3779B97F4A7C15ull; /* xorshift; & 0x77: no fp8 NaN codes (0x7F, 0xFF) */
  for (size_t i = 0; i < mapped; i += 8) {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    uint64_t v = r & 0x7777777777777777ull;
    memcpy(w + i, &v, 8);
  }
  float *x = aligned_alloc(64, (kmax * 4 + 63) / 64 * 64), *y = aligned_alloc(64, 4u << 20);
  work.y_last = aligned_alloc(64, 4u << 20);
  if (!x || !y || !work.y_last) die("out of memory");
  for (size_t i = 0; i < kmax; i++) x[i] = (float)((int)(i * 2654435761u % 2001) - 1000) / 300.0f;
  printf("huge %lld\n", anon_huge_bytes());
  _mm_setcsr(_mm_getcsr() | 0x8040); /* FTZ | DAZ, as IREE's workers run */
  for (int i = 0; i < kinds; i++) {
    for (size_t j = 0; j < specs[i].count; j++)
      if (specs[i].groups[j] * specs[i].group > (1u << 20)) die("a product with over 2^20 channels");
    printf("check %s %.3e\n", specs[i].kind, check(&specs[i], x, w, y));
    if (specs[i].loop == FP8DP) /* x's halves for every K now: the threads only read them */
      for (size_t j = 0; j < specs[i].count; j++) x_halves(x, specs[i].k[j]);
  }
  pthread_t threads[64];
  if (nthreads > 1) {
    if (sched_getaffinity(0, sizeof allowed_cpus, &allowed_cpus)) CPU_ZERO(&allowed_cpus); /* then nothing is pinned */
    pin(0);
    for (int t = 1; t < nthreads; t++)
      if (pthread_create(&threads[t], NULL, worker, (void *)(intptr_t)t)) die("cannot start a thread");
  }
  for (int i = 0; nthreads > 1 && i < kinds; i++) { /* the threads' sums: the last product, as each job leaves it */
    const spec_t *s = &specs[i];
    size_t before = 0;
    for (size_t j = 0; j + 1 < s->count; j++) before += product_bytes(s, j);
    for (enum job job = JOB_CLAIM; job <= JOB_STREAM; job++) {
      memset(work.y_last, 0xFF, 4u << 20); /* NaN: a channel no thread wrote fails the check */
      timed(job, s, x, w, y, 0);
      printf("check_threads %s %s %.3e\n", s->kind, job == JOB_CLAIM ? "claim" : "stream",
             error_of(s, s->count - 1, x, w + before, work.y_last));
    }
  }
  volatile double sink = 0;
  for (int round = 0; round <= rounds; round++) { /* round 0 warms up */
    for (int j = 0; j < kinds; j++) {
      const spec_t *s = &specs[round & 1 ? kinds - 1 - j : j];
      if (nthreads > 1) {
        double read_s = timed(JOB_READ, NULL, x, w, y, s->bytes), kernel_s = timed(JOB_CLAIM, s, x, w, y, 0);
        double stream_s = timed(JOB_STREAM, s, x, w, y, 0);
        if (round) printf("round %d %s %.6f %.6f %zu\nstream %d %s %.6f\n", round, s->kind, read_s, kernel_s, s->bytes,
                          round, s->kind, stream_s);
        continue;
      }
      double t0 = now();
      sink += plain_read(w, s->bytes);
      double t1 = now();
      products(s, x, w, y);
      double t2 = now();
      if (round) printf("round %d %s %.6f %.6f %zu\n", round, s->kind, t1 - t0, t2 - t1, s->bytes);
    }
    fflush(stdout);
  }
  if (nthreads > 1) {
    timed(JOB_QUIT, NULL, x, w, y, 0);
    for (int t = 1; t < nthreads; t++) pthread_join(threads[t], NULL);
    for (int t = 0; t < nthreads; t++) sink += read_sinks[t];
  }
  return 0;
}
