/* One-row products over llmc's packed narrow weights, for llvm-cpu on x86-64 with AVX2 + FMA (and
 * many-row products: llmc_gemm_bf16, _fp8, _int8, and _f32 over f32 weights stored packed, below).
 *
 * Linked into IREE executables as an object file (compiler/ukernels.py builds it with the system C
 * compiler and rewrites each `llmc.matvec_*` op into a dispatch that calls it). A decode step's
 * linear layers are these products: y[1, N] = x[1, K] @ w[N, K].T, the weight read once from its
 * narrow packed form P[N/G, K, G] (P[b, k, j] = w[G*b + j, k]; passes/_packed.py), decoded in
 * registers and multiplied in f32. G is 32 for fp8, bf16 and int8 (_packed.KERNEL_GROUPS); fp8 in a module
 * whose every CPU has AVX512_BF16 is packed in a pair layout of 64-channel groups instead (llmc_matvec_fp8dp).
 *
 * Why by hand: IREE 3.13's vectorizer reads one group of G channels at a time, with no software
 * prefetch, and that loop is bound by how far its loads run ahead of its arithmetic (docs/targets.md,
 * "cpu matvec kernels"). Here a workgroup's groups of channels are read one after the other, one
 * sequential stream (faster than several side by side on one Zen 4 core), except groups of 64 KiB or
 * more of bf16 (2 side by side; on Zen 3 every bf16 group: the caller's `pair_min_k`);
 * int8's and fp8's loops prefetch ahead. bf16 has a second form for CPUs with AVX-512F (one 64-byte
 * load and two decodes per K step: llmc_matvec_bf16_avx512), chosen when the module is compiled. A workgroup
 * computes `per_wg` groups (the caller sizes it: compiler/ukernels.py).
 *
 * Values: each weight decodes exactly as the graph's own decode does (the caller's scale and its
 * constant factor are applied after the sum, in the graph):
 *   fp8  (E4M3FN codes): bits (code & 0x80) << 24 | (code & 0x7F) << 20 read as f32 = value x 2^-120
 *   int8 (signed codes): the integer as f32
 *   bf16 (bf16 bits):    bits << 16 read as f32 (exact)
 * Only the f32 summation order differs from the graph: 2 partial sums per channel (even and odd k).
 *
 * Embedded-ELF rules (IREE loads the executable itself): no libc, no globals, no TLS, no syscalls.
 *
 * ABI: IREE lowers each memref argument of the external call to its descriptor (allocated pointer,
 * aligned pointer, offset, size, stride: 1-D here), then the index operands as size_t. The data
 * starts at aligned + offset elements.
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#define MEMREF(T, name) T *name##_base, T *restrict name##_aligned, size_t name##_offset, size_t name##_size, size_t name##_stride
#define DATA(name) (name##_aligned + name##_offset)

/* How far ahead of its stream the one-group loop of int8 and fp8 prefetches: the caller's `ahead`
 * (compiler/ukernels.py MATVEC_PREFETCH_BY_CPU: 512 bytes, 2048 on Zen 3; measured in docs/targets.md). */

/* ---- decodes: 8 codes at p -> 8 f32 lanes ---- */

static inline __m256 dec_int8(const int8_t *p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

static inline __m256 dec_bf16(const uint16_t *p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* ---- 32-channel groups (int8): one group at a time ----
 *
 * A K step of a group is one 32-byte row: four 8-code widening loads (vpmovsxbd), four int -> f32
 * conversions, four FMAs and one broadcast of x, each 8-lane sum holding 8 consecutive channels (no
 * transpose at the end). Until 2026-12-01 int8 had 8-channel groups: a 64-byte line was eight K steps,
 * so eight widening loads and eight broadcasts, and one core read 0.61 of a plain read over the
 * Llama-3-8B-shaped products against 0.86-0.87 for this loop (tools/bench_matvec.py's driver; docs/
 * targets.md "cpu matvec kernels"). One group at a time, so a workgroup's weights are one sequential
 * stream, with a prefetch ahead as fp8's; even and odd k in two partial sums per channel. */

/* The one-group loop of the 1-byte kinds (int8, fp8): a workgroup's 32-channel groups one after the other,
 * a prefetch `ahead` bytes ahead of the stream, even k into a[] and odd k into c[], added before
 * STORE(y, sums) puts the group's 32 sums in channel order. FMA(row, x, sums) adds one K step's 32 codes. */
#define PREFETCHED_GROUPS(NAME, FMA, STORE)                                                                \
  static inline void NAME(const float *restrict x, const int8_t *restrict p, float *restrict y, size_t k,   \
                          size_t first, size_t count, size_t ahead) {                                      \
    for (size_t b = first; b < first + count; b++) {                                                       \
      const int8_t *p0 = p + b * k * 32;                                                                   \
      __m256 a[4], c[4];                                                                                   \
      for (int j = 0; j < 4; j++) a[j] = c[j] = _mm256_setzero_ps();                                       \
      size_t i = 0;                                                                                        \
      for (; i + 2 <= k; i += 2) {                                                                         \
        _mm_prefetch((const char *)(p0 + i * 32) + ahead, _MM_HINT_T0);                                    \
        FMA(p0 + i * 32, _mm256_broadcast_ss(x + i), a);                                                   \
        FMA(p0 + i * 32 + 32, _mm256_broadcast_ss(x + i + 1), c);                                          \
      }                                                                                                    \
      if (i < k) FMA(p0 + i * 32, _mm256_broadcast_ss(x + i), a);                                          \
      for (int j = 0; j < 4; j++) a[j] = _mm256_add_ps(a[j], c[j]);                                        \
      STORE(y + b * 32, a);                                                                                \
    }                                                                                                      \
  }

/* one K step: a[j] lane l = channel 8j + l */
static inline void int8_fma(const int8_t *p, __m256 x, __m256 a[4]) {
  for (int j = 0; j < 4; j++) a[j] = _mm256_fmadd_ps(dec_int8(p + 8 * j), x, a[j]);
}

static inline void int8_store(float *y, const __m256 a[4]) {
  for (int j = 0; j < 4; j++) _mm256_storeu_ps(y + 8 * j, a[j]);
}

PREFETCHED_GROUPS(int8_groups, int8_fma, int8_store)

/* ---- 32-channel groups (fp8): one group at a time ----
 *
 * One K step of a group is 32 codes, one 256-bit load: dword d holds channels 4d..4d+3 (byte j is
 * channel 4d + j). Each code is moved to the top byte of a 16-bit half and shifted right by 4 with
 * its sign (bits 15..12: sign copies, 11..4: the code), then to the top half of its dword; the mask
 * keeps the sign bit and the 7 bits below the exponent's top, the same f32 bits as the graph's
 * decode. 5 shifts and 4 ands per 32 codes, no shuffle: a one-byte-per-lane widening
 * (vpmovsxbd) per 8 codes ran at 16.5 GB/s on one Zen 3 core, this at 21 (docs/targets.md). */

#define FP8_MASK _mm256_set1_epi32((int)0x87F00000u)

/* One group at a time, so a workgroup's weights are one sequential stream, with a prefetch ahead of
 * it. Until 2026-11-27 two groups were read side by side (two streams). Both forms alternating in one
 * process, 1 thread, on a Zen 4 machine: small-125m (K = 768 and 2048) decode 158.6 -> 202.9 tok/s;
 * the Llama-3-8B-shaped checkpoint (K = 4096 and 14336) 3.31 -> 3.73 tok/s (4 rounds each, every
 * round faster). At 2 threads the 8B's rounds were bimodal (4.4-4.6 or 5.7-6.5 tok/s for both forms;
 * the two streams faster in 5 of 8 rounds): no measured gain, no clear loss (docs/targets.md). */

/* The 32 codes at p -> d[j] lane d = channel 4d + j. */
static inline void dec_fp8x32(const int8_t *p, __m256 d[4]) {
  __m256i v = _mm256_loadu_si256((const __m256i *)p);
  __m256i odd = _mm256_srai_epi16(v, 4);                         /* bytes 1, 3 */
  __m256i even = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 4);  /* bytes 0, 2 */
  d[0] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(even, 16), FP8_MASK));
  d[1] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(odd, 16), FP8_MASK));
  d[2] = _mm256_castsi256_ps(_mm256_and_si256(even, FP8_MASK));
  d[3] = _mm256_castsi256_ps(_mm256_and_si256(odd, FP8_MASK));
}

static inline void fp8_fma(const int8_t *p, __m256 x, __m256 a[4]) {
  __m256 d[4];
  dec_fp8x32(p, d);
  for (int j = 0; j < 4; j++) a[j] = _mm256_fmadd_ps(d[j], x, a[j]);
}

/* a[j] lane d = channel 4d + j -> y[0..32) in channel order (a 4 x 8 transpose). */
static inline void fp8_store(float *y, const __m256 a[4]) {
  __m256 t0 = _mm256_unpacklo_ps(a[0], a[1]), t1 = _mm256_unpackhi_ps(a[0], a[1]);
  __m256 t2 = _mm256_unpacklo_ps(a[2], a[3]), t3 = _mm256_unpackhi_ps(a[2], a[3]);
  __m256 d04 = _mm256_shuffle_ps(t0, t2, 0x44), d15 = _mm256_shuffle_ps(t0, t2, 0xEE); /* dwords 0 | 4, 1 | 5 */
  __m256 d26 = _mm256_shuffle_ps(t1, t3, 0x44), d37 = _mm256_shuffle_ps(t1, t3, 0xEE); /* dwords 2 | 6, 3 | 7 */
  _mm256_storeu_ps(y, _mm256_permute2f128_ps(d04, d15, 0x20));
  _mm256_storeu_ps(y + 8, _mm256_permute2f128_ps(d26, d37, 0x20));
  _mm256_storeu_ps(y + 16, _mm256_permute2f128_ps(d04, d15, 0x31));
  _mm256_storeu_ps(y + 24, _mm256_permute2f128_ps(d26, d37, 0x31));
}

PREFETCHED_GROUPS(fp8_groups, fp8_fma, fp8_store)

/* ---- 32-channel groups (bf16): one group at a time, or 2 side by side from K = 1024 ----
 *
 * A K step of one group is 32 weights, 64 bytes: one cache line, as fp8's. On small-125m's K = 768
 * products this loop read 19.4-20.0 GB/s where the 16-channel one (two K steps a line) read 15.9-17.2;
 * 768 x 2048 17.1 vs 19.1 (one core, Zen 4, weights streamed from memory; docs/targets.md "cpu matvec
 * kernels"). No software prefetch: a prefetch 512 bytes ahead of each stream cut this loop to 11 GB/s
 * on Zen 4 (the hardware prefetcher follows two sequential streams on its own).
 * Two groups side by side only where a group is 64 KiB or more (K >= 1024): a smaller group is read
 * alone, one after the other, so the workgroup's weights are one sequential stream. small-125m bf16
 * decode (K = 768 except the down projection) at 1 thread, both forms alternating in one process:
 * 108.2 -> 124.4 and 95.7 -> 107.8 tok/s; reading the K = 2048 products alone as well made no further
 * difference there (121.3), and in a C harness two streams read K = 2048 groups 5-8% faster.
 * That threshold is the caller's (`pair_min_k`, compiler/ukernels.py `bf16_pair_min_k`), since the
 * better stream count depends on the core: on Zen 3 (znver3) two groups side by side at every K read
 * 0.95 of a plain read's rate in a C harness where one stream read 0.80, and small-125m bf16 decode
 * ran 44.0 -> 48.9 tok/s at 1 thread with pairs everywhere (pair_min_k 0); on Zen 4 one stream read
 * 0.95 and two 0.80. */

static inline void bf16_fma(const uint16_t *p, __m256 x, __m256 a[4]) {
  for (int j = 0; j < 4; j++) a[j] = _mm256_fmadd_ps(dec_bf16(p + 8 * j), x, a[j]);
}

static inline void bf16_store(float *y, const __m256 a[4], const __m256 c[4]) {
  for (int j = 0; j < 4; j++) _mm256_storeu_ps(y + 8 * j, _mm256_add_ps(a[j], c[j]));
}

static inline void bf16_groups(const float *restrict x, const uint16_t *restrict p, float *restrict y, size_t k,
                               size_t first, size_t count, size_t pair_min_k) {
  size_t b = first, end = first + count;
  for (; k >= pair_min_k && b + 2 <= end; b += 2) { /* two streams, no software prefetch (above) */
    const uint16_t *p0 = p + b * k * 32, *p1 = p0 + k * 32;
    __m256 a0[4], c0[4], a1[4], c1[4];
    for (int j = 0; j < 4; j++) a0[j] = c0[j] = a1[j] = c1[j] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 2 <= k; i += 2) {
      __m256 x0 = _mm256_broadcast_ss(x + i), x1 = _mm256_broadcast_ss(x + i + 1);
      bf16_fma(p0 + i * 32, x0, a0);
      bf16_fma(p1 + i * 32, x0, a1);
      bf16_fma(p0 + i * 32 + 32, x1, c0);
      bf16_fma(p1 + i * 32 + 32, x1, c1);
    }
    if (i < k) {
      __m256 x0 = _mm256_broadcast_ss(x + i);
      bf16_fma(p0 + i * 32, x0, a0);
      bf16_fma(p1 + i * 32, x0, a1);
    }
    bf16_store(y + b * 32, a0, c0);
    bf16_store(y + b * 32 + 32, a1, c1);
  }
  for (; b < end; b++) { /* one group at a time: small groups, and an odd group out */
    const uint16_t *p0 = p + b * k * 32;
    __m256 a0[4], c0[4];
    for (int j = 0; j < 4; j++) a0[j] = c0[j] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 2 <= k; i += 2) {
      bf16_fma(p0 + i * 32, _mm256_broadcast_ss(x + i), a0);
      bf16_fma(p0 + i * 32 + 32, _mm256_broadcast_ss(x + i + 1), c0);
    }
    if (i < k) bf16_fma(p0 + i * 32, _mm256_broadcast_ss(x + i), a0);
    bf16_store(y + b * 32, a0, c0);
  }
}

/* ---- the same, with AVX-512F: llmc_matvec_bf16_avx512 (a module whose every CPU has it) ----
 *
 * A K step of a group (one 64-byte line) is decoded whole: each 32-bit lane of the line holds two channels'
 * bf16 bits, channel 2d in its low half and 2d + 1 in its high half, so a shift left by 16 gives the even
 * channels' f32 values and an and with 0xFFFF0000 the odd ones' (exact, as the AVX2 decode). A K step is
 * then 2 decodes and 2 FMAs (gcc takes the line from memory in both decodes, the second read an L1 hit;
 * clang loads it once) where the AVX2 loop has 4 widening loads, 4 shifts and 4 FMAs: with fewer
 * operations per line waiting on memory, more lines are in flight. The sums are the AVX2 loop's (even k
 * into one partial sum per channel, odd k into another, added at the end), so the results are
 * bit-identical (NaN payloads aside); the even/odd lanes are put back in channel order once per group.
 * Measured on one Zen 4 core (which runs a 512-bit operation as two 256-bit halves), small-125m's
 * products in a C harness: 1.036-1.088x the AVX2 loop's rate (per-round ratio medians of 41-61 rounds);
 * small-125m bf16 decode in IREE, both builds alternating in one process: per-round ratio medians 1.091x
 * and 1.074x at 1 thread, no clear change at 2 (docs/targets.md "cpu matvec kernels"). Not measured on an
 * Intel AVX-512 core (where 512-bit arithmetic can lower the clock). */

/* one K step of a group (the line at p) into the even channels' sums (lo) and the odd ones' (hi) */
__attribute__((target("avx512f"))) static inline void bf16_fma_512(const uint16_t *p, __m512 x, __m512 *lo, __m512 *hi) {
  __m512i w = _mm512_loadu_si512((const void *)p);
  *lo = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), x, *lo);
  *hi = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xFFFF0000u))), x, *hi);
}

/* lo / hi: the even / odd channels' sums of a group -> y[0..32) in channel order */
__attribute__((target("avx512f"))) static inline void bf16_store_512(float *y, __m512 lo, __m512 hi) {
  const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i second = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  _mm512_storeu_ps(y, _mm512_permutex2var_ps(lo, first, hi));
  _mm512_storeu_ps(y + 16, _mm512_permutex2var_ps(lo, second, hi));
}

/* even k into a0 / a1 (even / odd channels), odd k into c0 / c1, as the AVX2 loop's a and c */
__attribute__((target("avx512f"))) static void bf16_groups_512(const float *restrict x, const uint16_t *restrict p,
                                                               float *restrict y, size_t k, size_t first, size_t count,
                                                               size_t pair_min_k) {
  size_t b = first, end = first + count;
  for (; k >= pair_min_k && b + 2 <= end; b += 2) { /* two streams, as the AVX2 loop */
    const uint16_t *p0 = p + b * k * 32, *p1 = p0 + k * 32;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0, e0 = a0, e1 = a0;
    size_t i = 0;
    for (; i + 2 <= k; i += 2) {
      __m512 x0 = _mm512_set1_ps(x[i]), x1 = _mm512_set1_ps(x[i + 1]);
      bf16_fma_512(p0 + i * 32, x0, &a0, &a1);
      bf16_fma_512(p1 + i * 32, x0, &d0, &d1);
      bf16_fma_512(p0 + i * 32 + 32, x1, &c0, &c1);
      bf16_fma_512(p1 + i * 32 + 32, x1, &e0, &e1);
    }
    if (i < k) {
      __m512 x0 = _mm512_set1_ps(x[i]);
      bf16_fma_512(p0 + i * 32, x0, &a0, &a1);
      bf16_fma_512(p1 + i * 32, x0, &d0, &d1);
    }
    bf16_store_512(y + b * 32, _mm512_add_ps(a0, c0), _mm512_add_ps(a1, c1));
    bf16_store_512(y + b * 32 + 32, _mm512_add_ps(d0, e0), _mm512_add_ps(d1, e1));
  }
  for (; b < end; b++) { /* one group at a time */
    const uint16_t *p0 = p + b * k * 32;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, c0 = a0, c1 = a0;
    size_t i = 0;
    for (; i + 2 <= k; i += 2) {
      bf16_fma_512(p0 + i * 32, _mm512_set1_ps(x[i]), &a0, &a1);
      bf16_fma_512(p0 + i * 32 + 32, _mm512_set1_ps(x[i + 1]), &c0, &c1);
    }
    if (i < k) bf16_fma_512(p0 + i * 32, _mm512_set1_ps(x[i]), &a0, &a1);
    bf16_store_512(y + b * 32, _mm512_add_ps(a0, c0), _mm512_add_ps(a1, c1));
  }
}

/* ---- fp8 with AVX-512 BF16 dot products: llmc_matvec_fp8dp (a module whose every CPU has AVX512_BF16) ----
 *
 * The AVX2 loop above spends 13 vector operations on 32 codes (5 shifts, 4 ands, 4 FMAs) and one x broadcast
 * per 32 bytes; on one Zen 4 core it reads ~0.85-0.9 of a plain read from memory. Here the weights are packed
 * for the loop (kind "fp8dp", passes/_packed.py pack_pairs): 64-channel groups, each K pair (k, k + 1) of a
 * group one 128-byte block, four 32-byte vectors q = 0..3, and in vector q dword d holds the codes
 *     byte 0: (channel 16q + d, k)      byte 1: (channel 16q + 8 + d, k)
 *     byte 2: (channel 16q + d, k + 1)  byte 3: (channel 16q + 8 + d, k + 1)
 * so a code in the top byte of its 16-bit half, shifted right by 4 with its sign and masked with 0x87F0, is
 * the bf16 of the graph's f32 bits (code & 0x80) << 8 | (code & 0x7F) << 4 (value x 2^-120 exactly: bf16 has
 * f32's exponent range), and each 32-bit lane is then one channel's pair (k, k + 1): the odd bytes shifted so
 * give channels 16q + 8 + d, the even bytes first moved up by 8 give channels 16q + d. vdpbf16ps multiplies
 * a lane's two bf16 halves with x's pair (x[k], x[k + 1]) and adds both products to the lane's f32 sum.
 * x comes as two bf16 halves of x' = x * 2^32 (the graph computes them: compiler/ukernels.py fp8_x_halves),
 * hi = bf16(x') and lo = bf16(x' - hi), each summed in, so |x' - (hi + lo)| <= 2^-17 |x'| and each product
 * of two bf16 values is exact in f32. The 2^32 keeps the products clear of f32's subnormal range
 * (vdpbf16ps flushes subnormal inputs and results whatever the MXCSR says); the sums are multiplied by
 * 2^-32 at the end (exact). Per 32 codes: 5 shifts and ands and 4 dot products, one pair of x broadcasts
 * per 128 bytes. A subnormal code (|value| < 2^-6) reads as 0, as in the AVX2 loop under IREE's
 * flush-to-zero. One group at a time (one sequential stream); no software prefetch (it made this loop no
 * faster). Sums: per channel the hi and lo sums apart, added at the end. In a C harness over two of the
 * Llama-3-8B-shaped layers from memory, one Zen 4 core, two runs of 24 rounds alternating with the AVX2 loop:
 * 1.087x and 1.105x its rate (22 and 24 of 24 rounds faster), 0.98-1.02 of a plain read; the same dot products
 * on the 32-channel layout (a broadcast pair per 64 bytes) 1.004x, and on 64-channel groups in the plain
 * [K, 64] order with a byte permutation per vector 1.037x (docs/targets.md "fp8 with AVX-512 BF16 dot
 * products over a pair layout"). Needs K even. */

#define FP8DP_TARGET "avx512f,avx512vl,avx512bf16"

typedef uint32_t fp8dp_pair __attribute__((may_alias)); /* two bf16 halves of x, read as one dword */

__attribute__((target(FP8DP_TARGET))) static void fp8dp_groups(const uint16_t *restrict xq, const int8_t *restrict p,
                                                               float *restrict y, size_t k, size_t first, size_t count) {
  const fp8dp_pair *hi = (const fp8dp_pair *)xq, *lo = (const fp8dp_pair *)(xq + k);
  const __m256i mask = _mm256_set1_epi16((short)0x87F0);
  const __m256 unit = _mm256_set1_ps(0x1p-32f); /* x was taken x 2^32 */
  for (size_t b = first; b < first + count; b++) {
    const int8_t *p0 = p + b * k * 64;
    __m256 a[8], c[8]; /* a[2q] / a[2q + 1]: channels 16q + d / 16q + 8 + d with hi; c: the same with lo */
    for (int j = 0; j < 8; j++) a[j] = c[j] = _mm256_setzero_ps();
    for (size_t i = 0; i < k / 2; i++) {
      __m256bh h = (__m256bh)_mm256_set1_epi32((int)hi[i]), l = (__m256bh)_mm256_set1_epi32((int)lo[i]);
      const int8_t *r = p0 + i * 128;
      for (int q = 0; q < 4; q++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(r + 32 * q));
        __m256bh e = (__m256bh)_mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(v, 8), 4), mask);
        __m256bh o = (__m256bh)_mm256_and_si256(_mm256_srai_epi16(v, 4), mask);
        a[2 * q] = _mm256_dpbf16_ps(a[2 * q], e, h);
        c[2 * q] = _mm256_dpbf16_ps(c[2 * q], e, l);
        a[2 * q + 1] = _mm256_dpbf16_ps(a[2 * q + 1], o, h);
        c[2 * q + 1] = _mm256_dpbf16_ps(c[2 * q + 1], o, l);
      }
    }
    for (int j = 0; j < 8; j++) _mm256_storeu_ps(y + b * 64 + 8 * j, _mm256_mul_ps(_mm256_add_ps(a[j], c[j]), unit));
  }
}

/* ---- many-row products over bf16 groups (a prefill chunk or bucket: M fixed) ----
 *
 * y[M, N] = x[M, K] @ w.T with each 32-channel group's two 16-channel halves as the B panels of a 6 x 16
 * register block: 12 f32 accumulators (6 rows x two 8-lane halves), each k step decodes the panel's 16
 * bf16 weights once and multiplies them with 6 broadcast x values. IREE 3.13's data-tiled matmul for
 * AVX2 uses an 8 x 8 block (8 accumulators), which waits on the FMA latency: 73-82 GFLOP/s on
 * small-125m's prefill products on this project's EPYC, against 91-95 for this block in a standalone
 * loop (1 thread, 128 x 2048 x 768 and 128 x 768 x 2048; docs/targets.md "bf16 prefill kernel"). A
 * half panel's rows are 32 weights apart, so its K cache lines (48 KiB at K = 768) stay in L2 while
 * every 6-row block of x passes over it. */

/* The 6 x 16 block, generic in how a panel row of 16 weights becomes two f32 vectors: NAME##_rows##R
 * computes y[R rows, 16 columns] (+)= x[R rows, 0 : kb] @ w[kb][16] (first: y overwritten, else
 * added to), x's rows ldx apart, w's rows WS elements apart; NAME##_panel runs it over every row of x. */
#define GEMM_ROWS(NAME, T, LOAD, WS, R)                                                                    \
  static inline void NAME##_rows##R(const float *restrict x, size_t ldx, size_t kb, const T *restrict w,  \
                                    float *restrict y, size_t ldy, int first) {                            \
    __m256 a0[R], a1[R];                                                                                   \
    _Pragma("GCC unroll 8") for (int j = 0; j < R; j++) {                                                  \
      a0[j] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + j * ldy);                                  \
      a1[j] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + j * ldy + 8);                              \
    }                                                                                                      \
    for (size_t i = 0; i < kb; i++) {                                                                      \
      __m256 b0 = LOAD(w + i * WS), b1 = LOAD(w + i * WS + 8);                                             \
      _Pragma("GCC unroll 8") for (int j = 0; j < R; j++) {                                                \
        __m256 a = _mm256_broadcast_ss(x + j * ldx + i);                                                   \
        a0[j] = _mm256_fmadd_ps(a, b0, a0[j]);                                                             \
        a1[j] = _mm256_fmadd_ps(a, b1, a1[j]);                                                             \
      }                                                                                                    \
    }                                                                                                      \
    _Pragma("GCC unroll 8") for (int j = 0; j < R; j++) {                                                  \
      _mm256_storeu_ps(y + j * ldy, a0[j]);                                                                \
      _mm256_storeu_ps(y + j * ldy + 8, a1[j]);                                                            \
    }                                                                                                      \
  }

#define GEMM_PANEL(NAME, T, LOAD, WS)                                                                      \
  GEMM_ROWS(NAME, T, LOAD, WS, 6)                                                                          \
  GEMM_ROWS(NAME, T, LOAD, WS, 5)                                                                          \
  GEMM_ROWS(NAME, T, LOAD, WS, 4)                                                                          \
  GEMM_ROWS(NAME, T, LOAD, WS, 3)                                                                          \
  GEMM_ROWS(NAME, T, LOAD, WS, 2)                                                                          \
  GEMM_ROWS(NAME, T, LOAD, WS, 1)                                                                          \
  static inline void NAME##_panel(const float *restrict x, size_t m, size_t ldx, size_t kb, const T *restrict w, \
                                  float *restrict y, size_t ldy, int first) {                              \
    size_t r = 0;                                                                                          \
    for (; r + 6 <= m; r += 6) NAME##_rows6(x + r * ldx, ldx, kb, w, y + r * ldy, ldy, first);             \
    switch (m - r) {                                                                                       \
      case 5: NAME##_rows5(x + r * ldx, ldx, kb, w, y + r * ldy, ldy, first); break;                       \
      case 4: NAME##_rows4(x + r * ldx, ldx, kb, w, y + r * ldy, ldy, first); break;                       \
      case 3: NAME##_rows3(x + r * ldx, ldx, kb, w, y + r * ldy, ldy, first); break;                       \
      case 2: NAME##_rows2(x + r * ldx, ldx, kb, w, y + r * ldy, ldy, first); break;                       \
      case 1: NAME##_rows1(x + r * ldx, ldx, kb, w, y + r * ldy, ldy, first); break;                       \
      default: break;                                                                                      \
    }                                                                                                      \
  }

GEMM_PANEL(gemm_bf16, uint16_t, dec_bf16, 32)     /* half of a 32-channel bf16 group, decoded in the loop */
GEMM_PANEL(gemm_f32, float, _mm256_load_ps, 16)   /* a decoded f32 buffer (fp8, int8: below) */
GEMM_PANEL(gemm_f32w, float, _mm256_loadu_ps, 16) /* f32 weights packed in the .irpa (llmc_gemm_f32) */

/* groups [first, first + count) of y's 32-channel column blocks, every row: each group's two 16-channel
 * halves as panels whose rows are 32 weights apart */
static inline void bf16_gemm_groups(const float *restrict x, const uint16_t *restrict p, float *restrict y, size_t m,
                                    size_t k, size_t n, size_t first, size_t count) {
  for (size_t b = first; b < first + count; b++) {
    gemm_bf16_panel(x, m, k, k, p + b * k * 32, y + b * 32, n, 1);
    gemm_bf16_panel(x, m, k, k, p + b * k * 32 + 16, y + b * 32 + 16, n, 1);
  }
}

/* f32 weights stored packed (passes/f32_gemm_weights.py): the panels are the weight itself */
static inline void f32_gemm_groups(const float *restrict x, const float *restrict p, float *restrict y, size_t m,
                                   size_t k, size_t n, size_t first, size_t count) {
  for (size_t b = first; b < first + count; b++) gemm_f32w_panel(x, m, k, k, p + b * k * 16, y + b * 16, n, 1);
}

/* ---- many-row products over fp8 and int8 groups: decoded a K block at a time ----
 *
 * Their decode costs more instructions than bf16's shift, and a 6-row block would repeat it for every
 * block of rows; instead each 16-channel panel (half an fp8 or int8 group) is decoded
 * GEMM_KB rows of K at a time into an f32 buffer on the stack (8 KiB a panel), and the same 6 x 16
 * block runs over the buffer, adding to y after the first K block. */

#define GEMM_KB 128

/* Each decode below fills, for K row kk of group pb (and kk + 1 where it takes a K pair), the rows of the two
 * 16-wide panels q0 and q0 + 1 at w0 and w1 (16 floats a row). */

/* fp8, 32-channel groups (q0 is 0): one K row -> its two panel rows (fp8_store's transpose, split in halves) */
static inline void fp8_gemm_row(const int8_t *pb, size_t kk, int q0, float *w0, float *w1) {
  (void)q0;
  __m256 d[4], t[4];
  dec_fp8x32(pb + kk * 32, d);
  __m256 t0 = _mm256_unpacklo_ps(d[0], d[1]), t1 = _mm256_unpackhi_ps(d[0], d[1]);
  __m256 t2 = _mm256_unpacklo_ps(d[2], d[3]), t3 = _mm256_unpackhi_ps(d[2], d[3]);
  t[0] = _mm256_shuffle_ps(t0, t2, 0x44), t[1] = _mm256_shuffle_ps(t0, t2, 0xEE);
  t[2] = _mm256_shuffle_ps(t1, t3, 0x44), t[3] = _mm256_shuffle_ps(t1, t3, 0xEE);
  _mm256_store_ps(w0, _mm256_permute2f128_ps(t[0], t[1], 0x20));
  _mm256_store_ps(w0 + 8, _mm256_permute2f128_ps(t[2], t[3], 0x20));
  _mm256_store_ps(w1, _mm256_permute2f128_ps(t[0], t[1], 0x31));
  _mm256_store_ps(w1 + 8, _mm256_permute2f128_ps(t[2], t[3], 0x31));
}

/* int8, 32-channel groups (q0 is 0): one K row -> channels 0..15 and 16..31, in order */
static inline void int8_gemm_row(const int8_t *pb, size_t kk, int q0, float *w0, float *w1) {
  (void)q0;
  const int8_t *row = pb + kk * 32;
  _mm256_store_ps(w0, dec_int8(row));
  _mm256_store_ps(w0 + 8, dec_int8(row + 8));
  _mm256_store_ps(w1, dec_int8(row + 16));
  _mm256_store_ps(w1 + 8, dec_int8(row + 24));
}

/* fp8dp (the pair layout above, 64-channel groups): vector q of a K pair's block is panel q's two rows, so
 * dec_fp8x32 gives row kk as d[0] | d[1] (channels 16q..16q+7 | 16q+8..16q+15) and row kk + 1 as d[2] | d[3]:
 * no transpose. kk even. */
static inline void fp8dp_gemm_pair(const int8_t *pb, size_t kk, int q0, float *w0, float *w1) {
  float *w[2] = {w0, w1};
  for (int h = 0; h < 2; h++) {
    __m256 d[4];
    dec_fp8x32(pb + kk * 64 + 32 * (q0 + h), d);
    for (int j = 0; j < 4; j++) _mm256_store_ps(w[h] + 8 * j, d[j]);
  }
}

/* G-channel groups of 1-byte codes, G / 16 panels each: for each pair of panels and each K block, DECODE fills
 * the block's rows STEP at a time (1, or a K pair), and the 6 x 16 block runs over both panels. The 32-channel
 * kinds have one pair of panels. GEMM_KB is even, so a pair never straddles two K blocks (K even for STEP 2). */
#define PANEL_GEMM_GROUPS(NAME, G, STEP, DECODE)                                                           \
  static inline void NAME(const float *restrict x, const int8_t *restrict p, float *restrict y, size_t m,   \
                          size_t k, size_t n, size_t first, size_t count) {                                \
    float w[2][GEMM_KB * 16] __attribute__((aligned(32)));                                                 \
    for (size_t b = first; b < first + count; b++) {                                                       \
      const int8_t *pb = p + b * k * G;                                                                    \
      for (int q0 = 0; q0 < G / 16; q0 += 2)                                                               \
        for (size_t k0 = 0; k0 < k; k0 += GEMM_KB) {                                                       \
          size_t kb = k - k0 < GEMM_KB ? k - k0 : GEMM_KB;                                                 \
          for (size_t i = 0; i < kb; i += STEP) DECODE(pb, k0 + i, q0, w[0] + i * 16, w[1] + i * 16);      \
          gemm_f32_panel(x + k0, m, k, kb, w[0], y + b * G + 16 * q0, n, k0 == 0);                          \
          gemm_f32_panel(x + k0, m, k, kb, w[1], y + b * G + 16 * q0 + 16, n, k0 == 0);                     \
        }                                                                                                  \
    }                                                                                                      \
  }

PANEL_GEMM_GROUPS(fp8_gemm_groups, 32, 1, fp8_gemm_row)
PANEL_GEMM_GROUPS(int8_gemm_groups, 32, 1, int8_gemm_row)
PANEL_GEMM_GROUPS(fp8dp_gemm_groups, 64, 2, fp8dp_gemm_pair)

/* ---- entry points: workgroup `wg` computes groups [wg * per_wg, (wg + 1) * per_wg) ----
 *
 * The many-row ones take the rows GEMM_MB at a time (a dynamic prefill may have thousands): each
 * block of x (GEMM_MB x K f32: 192 KiB at K = 768, 1 MiB at 4096) stays in L2 while the workgroup's
 * panels pass over it. */

#define GEMM_MB 64
#define ROW_BLOCKS(CALL)                                                                                   \
  for (size_t r0 = 0; r0 < m; r0 += GEMM_MB) {                                                             \
    size_t mb = m - r0 < GEMM_MB ? m - r0 : GEMM_MB;                                                       \
    CALL;                                                                                                  \
  }

static inline void span(size_t groups, size_t per_wg, size_t wg, size_t *first, size_t *count) {
  size_t f = wg * per_wg, e = f + per_wg;
  if (e > groups) e = groups;
  *first = f;
  *count = f < e ? e - f : 0;
}

void llmc_matvec_fp8(MEMREF(const float, x), MEMREF(const int8_t, p), MEMREF(float, y), size_t k, size_t groups,
                     size_t per_wg, size_t wg, size_t ahead) {
  size_t first, count;
  span(groups, per_wg, wg, &first, &count);
  fp8_groups(DATA(x), DATA(p), DATA(y), k, first, count, ahead);
}

/* xq: x as bf16 hi / lo halves, [2, K] (above); ukernels.py emits it only in a module whose every CPU has
 * AVX512_BF16 (passes/_packed.py packs those weights for it). K even. */
void llmc_matvec_fp8dp(MEMREF(const uint16_t, xq), MEMREF(const int8_t, p), MEMREF(float, y), size_t k, size_t groups,
                       size_t per_wg, size_t wg) {
  size_t first, count;
  span(groups, per_wg, wg, &first, &count);
  fp8dp_groups(DATA(xq), DATA(p), DATA(y), k, first, count);
}

void llmc_matvec_int8(MEMREF(const float, x), MEMREF(const int8_t, p), MEMREF(float, y), size_t k, size_t groups,
                      size_t per_wg, size_t wg, size_t ahead) {
  size_t first, count;
  span(groups, per_wg, wg, &first, &count);
  int8_groups(DATA(x), DATA(p), DATA(y), k, first, count, ahead);
}

/* pair_min_k: groups of K >= pair_min_k are read two side by side, smaller ones one after the other (above) */
void llmc_matvec_bf16(MEMREF(const float, x), MEMREF(const uint16_t, p), MEMREF(float, y), size_t k, size_t groups,
                      size_t per_wg, size_t wg, size_t pair_min_k) {
  size_t first, count;
  span(groups, per_wg, wg, &first, &count);
  bf16_groups(DATA(x), DATA(p), DATA(y), k, first, count, pair_min_k);
}

/* The same products with AVX-512F (above): ukernels.py calls this one only in a module whose every CPU has it */
void llmc_matvec_bf16_avx512(MEMREF(const float, x), MEMREF(const uint16_t, p), MEMREF(float, y), size_t k,
                             size_t groups, size_t per_wg, size_t wg, size_t pair_min_k) {
  size_t first, count;
  span(groups, per_wg, wg, &first, &count);
  bf16_groups_512(DATA(x), DATA(p), DATA(y), k, first, count, pair_min_k);
}

/* llmc_gemm_<KIND>(x, p, y, m, k, groups, per_wg, wg): the workgroup's groups of G channels, every row */
#define GEMM_ENTRY(KIND, T, G)                                                                             \
  void llmc_gemm_##KIND(MEMREF(const float, x), MEMREF(const T, p), MEMREF(float, y), size_t m, size_t k,   \
                        size_t groups, size_t per_wg, size_t wg) {                                         \
    size_t first, count;                                                                                   \
    span(groups, per_wg, wg, &first, &count);                                                              \
    ROW_BLOCKS(KIND##_gemm_groups(DATA(x) + r0 * k, DATA(p), DATA(y) + r0 * groups * G, mb, k, groups * G,  \
                                  first, count))                                                           \
  }

GEMM_ENTRY(bf16, uint16_t, 32)
GEMM_ENTRY(fp8, int8_t, 32)
GEMM_ENTRY(fp8dp, int8_t, 64)
GEMM_ENTRY(int8, int8_t, 32)
GEMM_ENTRY(f32, float, 16)

/* ---- decode attention: one query row per head over the first L rows of an f32 or bf16 KV cache ----
 *
 * llmc_attn_decode(q, k, v, bias, y, l, g, c, d, h): for KV head h and each of its g query heads j,
 *   y[h g + j] = softmax_t(q[h g + j] . k[h, t] + bias[t]) @ v[h, t]    for t < l (q already scaled)
 * q, y: [Hk * g, d]; k, v: the cache [Hk, c, d] (rows l..c-1 are not read); bias: [l], additive
 * (-inf masks a row). One workgroup per KV head. The rows are read once for all g query heads, in
 * blocks of ATTN_BLOCK with the softmax kept online (a running maximum and sum per query head, the
 * accumulated output rescaled when the maximum grows), so scores never need L floats of stack. A
 * block's maximum is a vector maximum with a NaN flag beside it, and its weighted value rows are added
 * 32 columns of up to 3 query heads at a time, those outputs held in registers over the block's rows
 * (attn_values; until 2026-12-02 every row loaded and stored each output: small-125m's 12 layers at 140
 * rows took 298-393 us in a C harness with the caches cold, 266-287 us now, and 237-259 / 115-122 us
 * warm; docs/targets.md "Decode attention kernel"). A query row whose every score is -inf gives 0, as
 * PyTorch's SDPA does (torch 2.13 on cpu).
 * Needs d % 8 == 0, d <= ATTN_MAX_D, g <= ATTN_MAX_G (compiler/ukernels.py refuses any other call).
 * llmc_attn_decode_bf16: the same with k and v holding bf16 bits (--kv-dtype bf16), each widened to f32
 * exactly as it is read; the arithmetic is the f32 one.
 *
 * exp: e^x = 2^n e^r with n = round(x log2 e), r = x - n ln 2 (ln 2 in two parts), e^r by its Taylor
 * series to r^7 (|r| <= ln2 / 2: relative error under 2^-23); x < -87 (the f32 normal range's end,
 * and -inf) gives exactly 0, as exp does there with denormals flushed (IREE's workers flush them). */

/* rows per block: each block reads ATTN_BLOCK key rows, then as many value rows. 256 against 64: a layer's
 * attention at 1900 rows 263 vs 350 us in a C harness (12 layers' caches in turn), a decode step 3% faster
 * (docs/targets.md "Decode attention at long contexts"); 512 no faster than 256. Stack: 2 x 8 KB. */
#define ATTN_BLOCK 256
#define ATTN_MAX_D 256
#define ATTN_MAX_G 8

static inline __m256 exp_neg(__m256 x) { /* x <= 0 or -inf; NaN stays NaN */
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 in = x, nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q); /* taken before the clamp below drops the NaN */
  __m256 keep = _mm256_cmp_ps(x, lo, _CMP_NLT_UQ); /* false for x < -87 and -inf */
  x = _mm256_max_ps(x, lo);                       /* NaN in x: max returns lo; restored below */
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23); /* n in [-126, 0]: 2^n is normal */
  __m256 y = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
  return _mm256_blendv_ps(_mm256_and_ps(y, keep), in, nan);
}

static inline float hsum8(__m256 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* 8 vectors -> one vector of their 8 horizontal sums (lane i = sum of a[i]) */
static inline __m256 hsum8x8(const __m256 a[8]) {
  __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
  __m256 s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
  __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
  /* s0123 lanes: [a0 a1 a2 a3 | a0 a1 a2 a3] partial halves (low 128 = low halves' sums, high = high halves') */
  __m256 lo = _mm256_permute2f128_ps(s0123, s4567, 0x20), hi = _mm256_permute2f128_ps(s0123, s4567, 0x31);
  return _mm256_add_ps(lo, hi);
}

/* 8 cache elements from element i of a K or V cache: f32 as they are, bf16 widened (exact) */
static inline __m256 kv_load(const void *p, size_t i, int bf16) {
  return bf16 ? dec_bf16((const uint16_t *)p + i) : _mm256_loadu_ps((const float *)p + i);
}

/* max(m, s[0..n)), or NaN when m or any s[i] is NaN (a NaN score: NaN out); s 32-byte aligned */
static inline float block_max(const float *s, size_t n, float m) {
  __m256 vm = _mm256_set1_ps(m), nan = _mm256_cmp_ps(vm, vm, _CMP_UNORD_Q);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_load_ps(s + i);
    vm = _mm256_max_ps(vm, x);  /* a NaN x gives x (the second operand): caught by the flag below */
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  float r = _mm_cvtss_f32(h);
  if (_mm256_movemask_ps(nan)) return __builtin_nanf("");
  for (; i < n; i++) r = s[i] > r || s[i] != s[i] ? s[i] : r;
  return r;
}

/* acc[j0 .. j0 + JN)[e0 .. e0 + 32) += sum over the block's rows i of sc[j][i] * v[t0 + i][e0 ..]: those
 * 4 x JN vectors in registers across the rows (JN a constant at each call: gcc then keeps the arrays
 * in registers; with a run-time count it kept them in memory), each value vector loaded once for JN heads */
static inline __attribute__((always_inline)) void attn_values(float (*restrict acc)[ATTN_MAX_D], float (*restrict sc)[ATTN_BLOCK],
    const void *restrict v, size_t t0, size_t n, size_t d, size_t e0, size_t j0, const int JN, int bf16) {
  __m256 a[3][4];
  for (int j = 0; j < JN; j++)
    for (int u = 0; u < 4; u++) a[j][u] = _mm256_load_ps(acc[j0 + j] + e0 + 8 * u);
  for (size_t i = 0; i < n; i++) {
    __m256 w[3];
    for (int j = 0; j < JN; j++) w[j] = _mm256_broadcast_ss(sc[j0 + j] + i);
    for (int u = 0; u < 4; u++) {
      __m256 ve = kv_load(v, (t0 + i) * d + e0 + 8 * u, bf16);
      for (int j = 0; j < JN; j++) a[j][u] = _mm256_fmadd_ps(w[j], ve, a[j][u]);
    }
  }
  for (int j = 0; j < JN; j++)
    for (int u = 0; u < 4; u++) _mm256_store_ps(acc[j0 + j] + e0 + 8 * u, a[j][u]);
}

/* the same for the last d - e0 < 32 columns (d % 32 != 0) of heads j0 .. j0 + jn, the outputs in memory */
static inline __attribute__((always_inline)) void attn_values_tail(float (*restrict acc)[ATTN_MAX_D], float (*restrict sc)[ATTN_BLOCK],
    const void *restrict v, size_t t0, size_t n, size_t d, size_t e0, size_t j0, size_t jn, int bf16) {
  for (size_t i = 0; i < n; i++)
    for (size_t e = e0; e < d; e += 8) {
      __m256 ve = kv_load(v, (t0 + i) * d + e, bf16);
      for (size_t j = j0; j < j0 + jn; j++)
        _mm256_store_ps(acc[j] + e, _mm256_fmadd_ps(_mm256_set1_ps(sc[j][i]), ve, _mm256_load_ps(acc[j] + e)));
    }
}

/* one KV head's attention; bf16: the caches hold bf16 bits (a compile-time constant at both calls), kt
 * then room for 8 key rows widened (32-byte aligned; the f32 form has none: its stack stays as it was,
 * which measured faster than with the array beside) */
static inline __attribute__((always_inline)) void attn_head(const float *restrict q, const void *restrict k,
                      const void *restrict v, const float *restrict bias, float *restrict y, size_t l, size_t g,
                      size_t d, int bf16, float *restrict kt) {
  float acc[ATTN_MAX_G][ATTN_MAX_D] __attribute__((aligned(32)));
  float sc[ATTN_MAX_G][ATTN_BLOCK] __attribute__((aligned(32)));
  float mx[ATTN_MAX_G], sum[ATTN_MAX_G];
  size_t dv = d / 8;
  for (size_t j = 0; j < g; j++) {
    mx[j] = -__builtin_inff();
    sum[j] = 0.0f;
    for (size_t e = 0; e < d; e += 8) _mm256_store_ps(acc[j] + e, _mm256_setzero_ps());
  }
  for (size_t t0 = 0; t0 < l; t0 += ATTN_BLOCK) {
    size_t n = l - t0 < ATTN_BLOCK ? l - t0 : ATTN_BLOCK;
    /* scores: 8 rows at a time, one vector of 8 sums per query head; a bf16 cache's 8 rows are widened
     * once into kt and read from there by every query head (not widened again per head) */
    size_t t = 0;
    for (; t + 8 <= n; t += 8) {
      if (bf16)
        for (size_t e = 0; e < 8 * d; e += 8) _mm256_store_ps(kt + e, kv_load(k, (t0 + t) * d + e, 1));
      for (size_t j = 0; j < g; j++) {
        __m256 a[8];
        for (int r = 0; r < 8; r++) a[r] = _mm256_setzero_ps();
        for (size_t e = 0; e < dv; e++) {
          __m256 qe = _mm256_loadu_ps(q + j * d + 8 * e);
          for (int r = 0; r < 8; r++)
            a[r] = _mm256_fmadd_ps(qe, bf16 ? _mm256_load_ps(kt + r * d + 8 * e) : kv_load(k, (t0 + t + r) * d + 8 * e, 0), a[r]);
        }
        _mm256_store_ps(sc[j] + t, _mm256_add_ps(hsum8x8(a), _mm256_loadu_ps(bias + t0 + t)));
      }
    }
    for (; t < n; t++) {
      for (size_t j = 0; j < g; j++) {
        __m256 a = _mm256_setzero_ps();
        for (size_t e = 0; e < dv; e++) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + j * d + 8 * e), kv_load(k, (t0 + t) * d + 8 * e, bf16), a);
        sc[j][t] = hsum8(a) + bias[t0 + t];
      }
    }
    /* online softmax: the block's maximum, the old sums and outputs rescaled, weights e^(s - max) */
    for (size_t j = 0; j < g; j++) {
      float m = block_max(sc[j], n, mx[j]);
      if (m == -__builtin_inff()) { /* every score so far masked: weights 0, nothing to add */
        for (size_t i = 0; i < n; i++) sc[j][i] = 0.0f;
        continue;
      }
      float alpha = _mm256_cvtss_f32(exp_neg(_mm256_set1_ps(mx[j] - m))); /* mx = -inf: 0 */
      mx[j] = m;
      __m256 va = _mm256_set1_ps(alpha), vm = _mm256_set1_ps(m), s = _mm256_setzero_ps();
      for (size_t e = 0; e < d; e += 8) _mm256_store_ps(acc[j] + e, _mm256_mul_ps(_mm256_load_ps(acc[j] + e), va));
      size_t i = 0;
      for (; i + 8 <= n; i += 8) {
        __m256 w = exp_neg(_mm256_sub_ps(_mm256_load_ps(sc[j] + i), vm));
        _mm256_store_ps(sc[j] + i, w);
        s = _mm256_add_ps(s, w);
      }
      float tail = 0.0f;
      for (; i < n; i++) {
        float w = _mm256_cvtss_f32(exp_neg(_mm256_set1_ps(sc[j][i] - m)));
        sc[j][i] = w;
        tail += w;
      }
      sum[j] = sum[j] * alpha + hsum8(s) + tail;
    }
    /* outputs: 32 columns of up to 3 query heads held in registers over the block's rows, then the last
     * d % 32 columns of every head */
    size_t d32 = d - d % 32;
    for (size_t e0 = 0; e0 < d32; e0 += 32)
      for (size_t j0 = 0; j0 < g; j0 += 3) {
        size_t jn = g - j0 < 3 ? g - j0 : 3;
        if (jn == 3)
          attn_values(acc, sc, v, t0, n, d, e0, j0, 3, bf16);
        else if (jn == 2)
          attn_values(acc, sc, v, t0, n, d, e0, j0, 2, bf16);
        else
          attn_values(acc, sc, v, t0, n, d, e0, j0, 1, bf16);
      }
    if (d32 < d) attn_values_tail(acc, sc, v, t0, n, d, d32, 0, g, bf16);
  }
  for (size_t j = 0; j < g; j++) {
    __m256 inv = _mm256_set1_ps(sum[j] > 0.0f ? 1.0f / sum[j] : 0.0f); /* every key masked: 0 */
    for (size_t e = 0; e < d; e += 8) _mm256_storeu_ps(y + j * d + e, _mm256_mul_ps(_mm256_load_ps(acc[j] + e), inv));
  }
}

void llmc_attn_decode(MEMREF(const float, q), MEMREF(const float, k), MEMREF(const float, v), MEMREF(const float, bias),
                      MEMREF(float, y), size_t l, size_t g, size_t c, size_t d, size_t h) {
  attn_head(DATA(q) + h * g * d, DATA(k) + h * c * d, DATA(v) + h * c * d, DATA(bias), DATA(y) + h * g * d, l, g, d, 0, 0);
}

/* the same over a bf16 cache (--kv-dtype bf16): half the bytes read, each element widened exactly */
void llmc_attn_decode_bf16(MEMREF(const float, q), MEMREF(const uint16_t, k), MEMREF(const uint16_t, v),
                           MEMREF(const float, bias), MEMREF(float, y), size_t l, size_t g, size_t c, size_t d, size_t h) {
  float kt[8 * ATTN_MAX_D] __attribute__((aligned(32)));
  attn_head(DATA(q) + h * g * d, DATA(k) + h * c * d, DATA(v) + h * c * d, DATA(bias), DATA(y) + h * g * d, l, g, d, 1, kt);
}

/* ---- prefill-chunk attention: C query rows per head over the first L rows of an f32 or bf16 KV cache ----
 *
 * llmc_attn_chunk(q, k, v, bias, y, l, g, c, cm, d, np, wg): for KV head h, its g query heads j and the
 * query positions i of one block,
 *   y[h g + j, i] = softmax_t(q[h g + j, i] . k[h, t] + bias[i, t]) @ v[h, t]    for t < l (q already scaled)
 * q, y: [Hk * g, c, d]; k, v: the cache [Hk, cm, d] (rows l..cm-1 are not read); bias: [c, l], additive
 * (-inf masks a key: the chunk's causal mask and padding). Workgroup wg: KV head wg / nb and positions
 * np (wg % nb) .. + np - 1, nb = ceil(c / np); np is 8 or 16 (CHUNK_ROWS_D below bounds g np d).
 * A workgroup's g np rows share every key block: the block's scores are computed for all rows (4 keys x
 * 24 rows per register tile, q held transposed so that each key element is broadcast against 8 rows),
 * kept transposed (st[t][r]: the softmax runs down 8 rows at a time), the softmax kept online per row
 * (running maximum and sum, the outputs rescaled only when a maximum grows), then the weights times the
 * block's values (6 rows x 16 columns a tile). No key block is transposed or copied (a bf16 one is
 * widened 4 rows at a time). A row whose every key is masked gives 0, as PyTorch's SDPA does.
 * llmc_attn_chunk_bf16: the same with k and v holding bf16 bits, each widened to f32 exactly. */

#define CHUNK_KEYS 64      /* keys per block */
#define CHUNK_MAX_ROWS 64  /* g np per workgroup */
#define CHUNK_ROWS_D 4096  /* g np d per workgroup: q^T and the outputs, 16 KB of f32 each */

/* scores of 4 keys (rows kr) against W vectors of 8 rows from row vector rv: st[t + u][8 (rv + w) ..] */
static inline __attribute__((always_inline)) void chunk_scores(float *restrict st, const float *restrict qt,
    const float *const kr[4], size_t R, size_t d, size_t t, size_t rv, const int W) {
  __m256 a[4][3];
  for (int u = 0; u < 4; u++)
    for (int w = 0; w < W; w++) a[u][w] = _mm256_setzero_ps();
  for (size_t e = 0; e < d; e++) {
    const float *qe = qt + e * R + rv * 8;
    __m256 qv[3];
    for (int w = 0; w < W; w++) qv[w] = _mm256_load_ps(qe + 8 * w);
    for (int u = 0; u < 4; u++) {
      __m256 ku = _mm256_broadcast_ss(kr[u] + e);
      for (int w = 0; w < W; w++) a[u][w] = _mm256_fmadd_ps(ku, qv[w], a[u][w]);
    }
  }
  for (int u = 0; u < 4; u++)
    for (int w = 0; w < W; w++) _mm256_store_ps(st + (t + u) * R + (rv + w) * 8, a[u][w]);
}

/* rows r .. r + U - 1 of the outputs += their weights over the block's n keys @ the block's value rows */
static inline __attribute__((always_inline)) void chunk_values(float *restrict o, const float *restrict st,
    const void *restrict v, size_t R, size_t d, size_t r, size_t t0, size_t n, const int U, int bf16) {
  for (size_t e = 0; e < d; e += 16) {
    __m256 a[6][2];
    for (int u = 0; u < U; u++) {
      a[u][0] = _mm256_load_ps(o + (r + u) * d + e);
      a[u][1] = _mm256_load_ps(o + (r + u) * d + e + 8);
    }
    for (size_t t = 0; t < n; t++) {
      __m256 v0 = kv_load(v, (t0 + t) * d + e, bf16), v1 = kv_load(v, (t0 + t) * d + e + 8, bf16);
      const float *p = st + t * R + r;
      for (int u = 0; u < U; u++) {
        __m256 pu = _mm256_broadcast_ss(p + u);
        a[u][0] = _mm256_fmadd_ps(pu, v0, a[u][0]);
        a[u][1] = _mm256_fmadd_ps(pu, v1, a[u][1]);
      }
    }
    for (int u = 0; u < U; u++) {
      _mm256_store_ps(o + (r + u) * d + e, a[u][0]);
      _mm256_store_ps(o + (r + u) * d + e + 8, a[u][1]);
    }
  }
}

static inline __attribute__((always_inline)) void attn_chunk_rows(const float *restrict q, const void *restrict k,
    const void *restrict v, const float *restrict bias, float *restrict y, size_t l, size_t g, size_t c, size_t d,
    size_t c0, size_t np, int bf16) {
  const size_t R = g * np, RV = R / 8, npe = c - c0 < np ? c - c0 : np;
  float qt[CHUNK_ROWS_D] __attribute__((aligned(32)));               /* q^T: qt[e R + r], r = j np + i */
  float o[CHUNK_ROWS_D] __attribute__((aligned(32)));                /* outputs: o[r d + e] */
  float st[CHUNK_KEYS * CHUNK_MAX_ROWS] __attribute__((aligned(32))); /* scores, then weights: st[t R + r] */
  float bt[CHUNK_KEYS * 16] __attribute__((aligned(32)));            /* the block's bias: bt[t np + i] */
  float kb[4 * CHUNK_ROWS_D / 8] __attribute__((aligned(32)));       /* 4 key rows as f32 (widened, or zeros past l) */
  __m256 mx[CHUNK_MAX_ROWS / 8], sm[CHUNK_MAX_ROWS / 8];
  for (size_t j = 0; j < g; j++)
    for (size_t i = 0; i < np; i++)
      for (size_t e = 0; e < d; e++) qt[e * R + j * np + i] = i < npe ? q[(j * c + c0 + i) * d + e] : 0.0f;
  for (size_t x = 0; x < R * d; x += 8) _mm256_store_ps(o + x, _mm256_setzero_ps());
  for (size_t x = 0; x < RV; x++) {
    mx[x] = _mm256_set1_ps(-__builtin_inff());
    sm[x] = _mm256_setzero_ps();
  }
  for (size_t t0 = 0; t0 < l; t0 += CHUNK_KEYS) {
    const size_t n = l - t0 < CHUNK_KEYS ? l - t0 : CHUNK_KEYS;
    /* scores, 4 keys at a time (the last 4 padded with zero rows) */
    for (size_t t = 0; t < n; t += 4) {
      const float *kr[4];
      if (bf16 || t + 4 > n) {
        for (size_t u = 0; u < 4; u++)
          for (size_t e = 0; e < d; e += 8)
            _mm256_store_ps(kb + u * d + e, t + u >= n ? _mm256_setzero_ps() : kv_load(k, (t0 + t + u) * d + e, bf16));
        for (size_t u = 0; u < 4; u++) kr[u] = kb + u * d;
      } else {
        for (size_t u = 0; u < 4; u++) kr[u] = (const float *)k + (t0 + t + u) * d;
      }
      size_t rv = 0;
      for (; rv + 3 <= RV; rv += 3) chunk_scores(st, qt, kr, R, d, t, rv, 3);
      if (RV - rv == 2) chunk_scores(st, qt, kr, R, d, t, rv, 2);
      else if (RV - rv == 1) chunk_scores(st, qt, kr, R, d, t, rv, 1);
    }
    /* the block's bias, transposed; positions past c masked whole (computed, never stored) */
    for (size_t i = 0; i < np; i++)
      for (size_t t = 0; t < n; t++) bt[t * np + i] = i < npe ? bias[(c0 + i) * l + t0 + t] : -__builtin_inff();
    /* online softmax, 8 rows at a time (np is a multiple of 8, so 8 rows are one query head's positions) */
    const __m256 ninf = _mm256_set1_ps(-__builtin_inff()), one = _mm256_set1_ps(1.0f);
    for (size_t rv = 0; rv < RV; rv++) {
      const float *b = bt + (rv * 8) % np;
      __m256 m = mx[rv];
      for (size_t t = 0; t < n; t++) {
        __m256 s = _mm256_add_ps(_mm256_load_ps(st + t * R + rv * 8), _mm256_loadu_ps(b + t * np));
        _mm256_store_ps(st + t * R + rv * 8, s);
        m = _mm256_max_ps(m, s);
      }
      /* a row whose keys so far are all masked keeps maximum -inf: its weights come out 0 against 0 */
      __m256 safe = _mm256_blendv_ps(m, _mm256_setzero_ps(), _mm256_cmp_ps(m, ninf, _CMP_EQ_OQ));
      __m256 alpha = exp_neg(_mm256_sub_ps(mx[rv], safe));
      mx[rv] = m;
      __m256 s = _mm256_setzero_ps();
      for (size_t t = 0; t < n; t++) {
        __m256 w = exp_neg(_mm256_sub_ps(_mm256_load_ps(st + t * R + rv * 8), safe));
        _mm256_store_ps(st + t * R + rv * 8, w);
        s = _mm256_add_ps(s, w);
      }
      sm[rv] = _mm256_fmadd_ps(sm[rv], alpha, s);
      if (_mm256_movemask_ps(_mm256_cmp_ps(alpha, one, _CMP_NEQ_UQ)) == 0) continue; /* no maximum grew */
      float al[8] __attribute__((aligned(32)));
      _mm256_store_ps(al, alpha);
      for (int w = 0; w < 8; w++) {
        __m256 a = _mm256_set1_ps(al[w]);
        float *orow = o + (rv * 8 + w) * d;
        for (size_t e = 0; e < d; e += 8) _mm256_store_ps(orow + e, _mm256_mul_ps(_mm256_load_ps(orow + e), a));
      }
    }
    /* outputs += weights @ the block's values: 6 rows x 16 columns a tile, then 4 or 2 rows (R is a
     * multiple of 8; d of 16) */
    size_t r = 0;
    for (; r + 6 <= R; r += 6) chunk_values(o, st, v, R, d, r, t0, n, 6, bf16);
    if (R - r == 4) chunk_values(o, st, v, R, d, r, t0, n, 4, bf16);
    else if (R - r == 2) chunk_values(o, st, v, R, d, r, t0, n, 2, bf16);
  }
  float sv[CHUNK_MAX_ROWS] __attribute__((aligned(32)));
  for (size_t rv = 0; rv < RV; rv++) _mm256_store_ps(sv + rv * 8, sm[rv]);
  for (size_t j = 0; j < g; j++)
    for (size_t i = 0; i < npe; i++) {
      const size_t r = j * np + i;
      __m256 inv = _mm256_set1_ps(sv[r] > 0.0f ? 1.0f / sv[r] : 0.0f); /* every key masked: 0 */
      for (size_t e = 0; e < d; e += 8) _mm256_storeu_ps(y + (j * c + c0 + i) * d + e, _mm256_mul_ps(_mm256_load_ps(o + r * d + e), inv));
    }
}

void llmc_attn_chunk(MEMREF(const float, q), MEMREF(const float, k), MEMREF(const float, v), MEMREF(const float, bias),
                     MEMREF(float, y), size_t l, size_t g, size_t c, size_t cm, size_t d, size_t np, size_t wg) {
  const size_t nb = (c + np - 1) / np, h = wg / nb, c0 = wg % nb * np;
  attn_chunk_rows(DATA(q) + h * g * c * d, DATA(k) + h * cm * d, DATA(v) + h * cm * d, DATA(bias),
                  DATA(y) + h * g * c * d, l, g, c, d, c0, np, 0);
}

/* the same over a bf16 cache (--kv-dtype bf16) */
void llmc_attn_chunk_bf16(MEMREF(const float, q), MEMREF(const uint16_t, k), MEMREF(const uint16_t, v),
                          MEMREF(const float, bias), MEMREF(float, y), size_t l, size_t g, size_t c, size_t cm, size_t d,
                          size_t np, size_t wg) {
  const size_t nb = (c + np - 1) / np, h = wg / nb, c0 = wg % nb * np;
  attn_chunk_rows(DATA(q) + h * g * c * d, DATA(k) + h * cm * d, DATA(v) + h * cm * d, DATA(bias),
                  DATA(y) + h * g * c * d, l, g, c, d, c0, np, 1);
}
