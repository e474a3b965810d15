// rng.h: counter-based random numbers (Philox4x32-10, Salmon et al. 2011).
//
// Every random draw in swin.c (shuffle, augmentation, drop path) is a pure function of a key
// (seed, stream) and a counter (e.g. epoch, sample index, draw number), never of thread timing or
// call order: the same config and seed give the same run whatever the thread count, and a resumed
// run needs no generator state beyond the counters it already saves.
//
// The generator and the normal sampler are callable from CUDA device code (SWIN_HOSTDEV), so a
// kernel and its CPU reference draw the same numbers: random erasing fills its boxes with normals
// that are bitwise identical on both sides (kernels/augment.h).
#pragma once
#include <stdint.h>

#include "src/base/hostdev.h"

typedef struct {
  uint32_t v[4];
} Philox4;

// One Philox4x32-10 block: 128 random bits for counter (c0..c3) under key (k0, k1).
static inline SWIN_HOSTDEV Philox4 philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                              uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1;
    c3 = (uint32_t)p0;
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  Philox4 r = {{c0, c1, c2, c3}};
  return r;
}

// Streams keep different uses of one seed apart.
enum {
  RNG_STREAM_SHUFFLE = 1,
  RNG_STREAM_AUGMENT = 2,
  RNG_STREAM_DROP_PATH = 3,
  RNG_STREAM_INIT = 4,
  RNG_STREAM_ERASE = 5,       // random erasing: whether and where, per (epoch, sample)
  RNG_STREAM_ERASE_FILL = 6,  // random erasing: the per-pixel normal fill, per (epoch, sample)
  RNG_STREAM_MIXUP = 7,       // mixup / cutmix: one draw set per (global batch, rank)
  RNG_STREAM_SHARDS = 8,      // tar shards: shard order and shuffle buffer, per epoch
};

// A cursor over one counter sequence: (seed, stream) is the key, (a, b) name the unit of work
// (epoch and sample, step and layer, ...), and n counts draws inside it.
typedef struct {
  uint64_t seed;
  uint32_t stream, a, b, n;
  uint32_t buf[4];
  int left;
} Rng;

// The stream word that folds the high halves of 64-bit counters a and b into the key, so 64-bit
// counters stay distinct.
static inline SWIN_HOSTDEV uint32_t rng_stream_key(uint32_t stream, uint64_t a, uint64_t b) {
  return stream ^ (uint32_t)(a >> 32) * 0x85EBCA6Bu ^ (uint32_t)(b >> 32) * 0xC2B2AE35u;
}

// The i-th 32-bit draw of the sequence rng_make(seed, stream, a, b) produces, computed directly
// (random access: a GPU thread per draw gives the same numbers as a CPU loop over rng_u32).
static inline SWIN_HOSTDEV uint32_t rng_u32_at(uint64_t seed, uint32_t stream, uint64_t a,
                                               uint64_t b, uint32_t i) {
  Philox4 x = philox4x32((uint32_t)a, (uint32_t)b, i / 4, rng_stream_key(stream, a, b),
                         (uint32_t)seed, (uint32_t)(seed >> 32));
  return x.v[i % 4];
}

// Uniform in [0, 1) with 24 bits from one 32-bit draw (the rng_uniform mapping).
static inline SWIN_HOSTDEV float rng_u32_to_uniform(uint32_t u) {
  return (float)(u >> 8) * (1.0f / 16777216.0f);
}

static inline SWIN_HOSTDEV Rng rng_make(uint64_t seed, uint32_t stream, uint64_t a, uint64_t b) {
  Rng r = {.seed = seed,
           .stream = rng_stream_key(stream, a, b),
           .a = (uint32_t)a,
           .b = (uint32_t)b,
           .n = 0,
           .buf = {0, 0, 0, 0},
           .left = 0};
  return r;
}

// Block n of r's sequence, without moving the cursor: random access for kernels, where element
// i of an image reads block i / 4.
static inline SWIN_HOSTDEV Philox4 rng_block(const Rng *r, uint32_t n) {
  return philox4x32(r->a, r->b, n, r->stream, (uint32_t)r->seed, (uint32_t)(r->seed >> 32));
}

static inline SWIN_HOSTDEV uint32_t rng_u32(Rng *r) {
  if (r->left == 0) {
    Philox4 x = rng_block(r, r->n++);
    for (int i = 0; i < 4; i++) r->buf[i] = x.v[i];
    r->left = 4;
  }
  return r->buf[4 - r->left--];
}

// Uniform in [0, 1) with 24 bits.
static inline SWIN_HOSTDEV float rng_uniform(Rng *r) {
  return rng_u32_to_uniform(rng_u32(r));
}
// Uniform in [0, 1) with 53 bits.
static inline SWIN_HOSTDEV double rng_uniform_double(Rng *r) {
  uint64_t hi = rng_u32(r) >> 5, lo = rng_u32(r) >> 6;
  return (double)(hi * 67108864u + lo) * (1.0 / 9007199254740992.0);
}
// Uniform integer in [0, n), unbiased (rejection).
static inline SWIN_HOSTDEV uint32_t rng_below(Rng *r, uint32_t n) {
  uint32_t limit = (uint32_t)(-n) % n;  // 2^32 mod n
  for (;;) {
    uint64_t m = (uint64_t)rng_u32(r) * n;
    if ((uint32_t)m >= limit) return (uint32_t)(m >> 32);
  }
}

// ---- normals that are the same bits on the CPU and the GPU ----
//
// Box-Muller from two 24-bit uniforms, with log, sin and cos written here from +, -, *, / and
// sqrt only (all correctly rounded in IEEE fp32 on both sides), so no libm or CUDA math library
// difference can creep in. On the device every operation is an explicitly rounded intrinsic, which
// nvcc never fuses into an FMA; host C is compiled as ISO C11, where GCC does not contract either
// (-ffp-contract=off is the default in that mode). Accuracy: log and sincos to ~1e-7 relative,
// far below what matters for augmentation noise.
#ifdef __CUDA_ARCH__
#define RNG_FMUL(a, b) __fmul_rn(a, b)
#define RNG_FADD(a, b) __fadd_rn(a, b)
#define RNG_FSUB(a, b) __fsub_rn(a, b)
#define RNG_FDIV(a, b) __fdiv_rn(a, b)
#define RNG_FSQRT(a) __fsqrt_rn(a)
#else
#define RNG_FMUL(a, b) ((float)(a) * (float)(b))
#define RNG_FADD(a, b) ((float)(a) + (float)(b))
#define RNG_FSUB(a, b) ((float)(a) - (float)(b))
#define RNG_FDIV(a, b) ((float)(a) / (float)(b))
#define RNG_FSQRT(a) __builtin_sqrtf(a)
#endif

// ln(u) for u in (0, 1]: u = m 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s) with
// s = (m - 1) / (m + 1), |s| <= 0.172, summed to s^9 (truncation < 1e-9).
static inline SWIN_HOSTDEV float rng_log_unit(float u) {
  union {
    float f;
    uint32_t i;
  } bits = {u};
  int e = (int)((bits.i >> 23) & 0xFF) - 127;
  bits.i = (bits.i & 0x007FFFFFu) | 0x3F800000u;  // mantissa in [1, 2)
  float m = bits.f;
  if (m > 1.41421356f) {
    m = RNG_FMUL(m, 0.5f);
    e += 1;
  }
  float s = RNG_FDIV(RNG_FSUB(m, 1.0f), RNG_FADD(m, 1.0f)), s2 = RNG_FMUL(s, s);
  float p = RNG_FADD(1.0f / 7.0f, RNG_FMUL(s2, 1.0f / 9.0f));
  p = RNG_FADD(1.0f / 5.0f, RNG_FMUL(s2, p));
  p = RNG_FADD(1.0f / 3.0f, RNG_FMUL(s2, p));
  p = RNG_FADD(1.0f, RNG_FMUL(s2, p));
  float ln_m = RNG_FMUL(RNG_FMUL(2.0f, s), p);
  // ln 2 split so that e * hi is exact for |e| < 2^8.
  const float ln2_hi = 0.693145752f, ln2_lo = 1.42860677e-6f;
  return RNG_FADD(RNG_FMUL((float)e, ln2_hi), RNG_FADD(RNG_FMUL((float)e, ln2_lo), ln_m));
}

// cos and sin of 2 pi k / 2^24 for a 24-bit k: the top 2 bits pick the quadrant, the rest an
// angle pi/4 + t in [0, pi/2) with |t| <= pi/4, where Taylor series to t^9 / t^10 suffice.
static inline SWIN_HOSTDEV void rng_sincos_turn(uint32_t k, float *c, float *s) {
  int quadrant = (int)(k >> 22);
  float r = (float)(k & 0x3FFFFFu) * (1.0f / 4194304.0f);  // [0, 1) of the quadrant
  float t = RNG_FMUL(RNG_FSUB(r, 0.5f), 1.57079633f);
  float t2 = RNG_FMUL(t, t);
  float sp = RNG_FSUB(1.0f / 120.0f,
                      RNG_FMUL(t2, RNG_FSUB(1.0f / 5040.0f, RNG_FMUL(t2, 1.0f / 362880.0f))));
  float sin_t = RNG_FMUL(t, RNG_FSUB(1.0f, RNG_FMUL(t2, RNG_FSUB(1.0f / 6.0f, RNG_FMUL(t2, sp)))));
  float cp = RNG_FSUB(1.0f / 720.0f,
                      RNG_FMUL(t2, RNG_FSUB(1.0f / 40320.0f, RNG_FMUL(t2, 1.0f / 3628800.0f))));
  float cos_t = RNG_FSUB(
      1.0f, RNG_FMUL(t2, RNG_FSUB(0.5f, RNG_FMUL(t2, RNG_FSUB(1.0f / 24.0f, RNG_FMUL(t2, cp))))));
  const float half_sqrt2 = 0.707106781f;  // sin(pi/4) = cos(pi/4)
  float sin_a = RNG_FMUL(half_sqrt2, RNG_FADD(cos_t, sin_t));
  float cos_a = RNG_FMUL(half_sqrt2, RNG_FSUB(cos_t, sin_t));
  switch (quadrant) {
    case 0:
      *c = cos_a, *s = sin_a;
      break;
    case 1:
      *c = -sin_a, *s = cos_a;
      break;
    case 2:
      *c = -cos_a, *s = -sin_a;
      break;
    default:
      *c = sin_a, *s = -cos_a;
      break;
  }
}

// Four standard normals from one Philox block: Box-Muller on (v0, v1) and on (v2, v3).
static inline SWIN_HOSTDEV void rng_normal4(Philox4 x, float z[4]) {
  for (int pair = 0; pair < 2; pair++) {
    // u in (0, 1], so the log is finite; the angle's 24 bits index a full turn.
    float u = (float)((x.v[2 * pair] >> 8) + 1) * (1.0f / 16777216.0f);
    float radius = RNG_FSQRT(RNG_FMUL(-2.0f, rng_log_unit(u)));
    float c, s;
    rng_sincos_turn(x.v[2 * pair + 1] >> 8, &c, &s);
    z[2 * pair] = RNG_FMUL(radius, c);
    z[2 * pair + 1] = RNG_FMUL(radius, s);
  }
}

// The normal at position i of r's sequence (block i / 4, slot i % 4), without moving the cursor.
static inline SWIN_HOSTDEV float rng_normal_at(const Rng *r, uint64_t i) {
  float z[4];
  rng_normal4(rng_block(r, (uint32_t)(i >> 2)), z);
  return z[i & 3];
}
