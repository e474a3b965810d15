// rng.h: counter-based random numbers (Philox4x32-10, Salmon et al. 2011).
//
// Every random draw in swin.c (shuffle, augmentation, drop path) is a pure function of a key
// (seed, stream) and a counter (e.g. epoch, sample index, draw number), never of thread timing or
// call order: the same config and seed give the same run whatever the thread count, and a resumed
// run needs no generator state beyond the counters it already saves.
#pragma once
#include <stdint.h>

#include "src/hostdev.h"

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
  RNG_STREAM_INIT = 4
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

static inline Rng rng_make(uint64_t seed, uint32_t stream, uint64_t a, uint64_t b) {
  Rng r = {.seed = seed,
           .stream = rng_stream_key(stream, a, b),
           .a = (uint32_t)a,
           .b = (uint32_t)b,
           .n = 0,
           .buf = {0, 0, 0, 0},
           .left = 0};
  return r;
}

static inline uint32_t rng_u32(Rng *r) {
  if (r->left == 0) {
    Philox4 x =
        philox4x32(r->a, r->b, r->n++, r->stream, (uint32_t)r->seed, (uint32_t)(r->seed >> 32));
    for (int i = 0; i < 4; i++) r->buf[i] = x.v[i];
    r->left = 4;
  }
  return r->buf[4 - r->left--];
}

// Uniform in [0, 1) with 24 bits.
static inline float rng_uniform(Rng *r) {
  return rng_u32_to_uniform(rng_u32(r));
}
// Uniform in [0, 1) with 53 bits.
static inline double rng_uniform_double(Rng *r) {
  uint64_t hi = rng_u32(r) >> 5, lo = rng_u32(r) >> 6;
  return (double)(hi * 67108864u + lo) * (1.0 / 9007199254740992.0);
}
// Uniform integer in [0, n), unbiased (rejection).
static inline uint32_t rng_below(Rng *r, uint32_t n) {
  uint32_t limit = (uint32_t)(-n) % n;  // 2^32 mod n
  for (;;) {
    uint64_t m = (uint64_t)rng_u32(r) * n;
    if ((uint32_t)m >= limit) return (uint32_t)(m >> 32);
  }
}
