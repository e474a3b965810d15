// fastmath.h: fp32 exp, normal density and normal CDF as static inline functions that gcc
// vectorizes (AVX2 + FMA at -O3 -march=native, without -ffast-math) inside plain loops.
//
// Without -ffast-math, libm's expf / erff stay calls, so a loop that uses them runs one element
// at a time. These are written only with +, *, fma, division, compares that become
// blends, and integer bit operations on the float representation; nothing calls libm.
//
// Accuracy (measured by tests/test_fastmath.c against double):
//   fast_expf(x)        relative error <= 2e-7 for x in [-87.3, 88.7]; 0 below ln(FLT_MIN)
//                       (results that would be subnormal are flushed), +inf above ln(FLT_MAX),
//                       NaN propagates.
//   fast_normal_pdf(x)  relative error <= 3e-7 wherever the result is a normal float.
//   fast_normal_cdf(x)  relative error <= 4e-7 wherever the result is a normal float, including
//                       the far left tail (Phi(-10) ~ 7.6e-24), because the tail is computed
//                       directly rather than as 1 - Phi(|x|); Phi(x) = 1 - Phi(-x) for x > 0.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

// fma when the target has it (one rounding, one instruction); otherwise a * b + c. ISO C mode
// (-std=c11) does not contract a * b + c on its own, so the fma is spelled out.
static inline float fastmath_fma(float a, float b, float c) {
#ifdef __FMA__
  return fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

// The bit pattern of a float and back; memcpy is how C11 spells a bit cast, and gcc compiles it
// to nothing (or to a register move inside vector code).
static inline uint32_t fastmath_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}
static inline float fastmath_from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

// cond ? a : b through bit masks. A plain ?: becomes a branch in gcc's IR, other passes then
// move arithmetic into its arms, and without -fno-trapping-math the vectorizer refuses to
// execute such (possibly trapping) arms unconditionally: the whole loop stays scalar. Masks
// give it no branch to start from; it compiles to a compare and a blend.
static inline float fastmath_select(int cond, float a, float b) {
  uint32_t mask = 0u - (uint32_t)(cond != 0);
  return fastmath_from_bits((fastmath_bits(a) & mask) | (fastmath_bits(b) & ~mask));
}

// exp(hi + lo) for |lo| <= 2^-10 |hi|: the argument is carried as an unevaluated sum so that
// a caller can pass a value (-x^2 / 2 near -87) more precisely than one fp32 holds.
//
// exp(s) = 2^n exp(r), n = round(s / ln2), r = s - n ln2 in [-ln2/2, ln2/2]. ln2 is split into
// LN2_HI (16 significant bits, so n * LN2_HI is exact for |n| <= 256) and LN2_LO, and
// hi - n * LN2_HI is exact, so r carries no cancellation error. exp(r) = 1 + r + r^2 q(r) with
// q a degree-4 near-minimax fit (fit error 1.2e-8). 2^n is applied by adding n to the exponent
// field of exp(r), which is valid while the result is a normal float: s in [EXP_MIN, EXP_MAX],
// the fp32 values inside [ln(FLT_MIN), ln(FLT_MAX)]. Outside, the result is selected instead:
// 0 below, and s + inf above, which is +inf for large s and NaN for NaN.
static inline float fastmath_exp_sum(float hi, float lo) {
  const float EXP_MIN = -0x1.5d589ep+6f;  // -87.33654: exp is just above FLT_MIN
  const float EXP_MAX = 0x1.62e42ep+6f;   // 88.72283: largest x with exp(x) < FLT_MAX
  const float LOG2E = 0x1.715476p+0f;     // 1 / ln 2
  const float LN2_HI = 0x1.62e4p-1f;      // ln 2 rounded to 16 bits
  const float LN2_LO = 0x1.7f7d1cp-20f;   // ln 2 - LN2_HI
  const float ROUND_SHIFT = 0x1.8p+23f;   // 1.5 * 2^23: adding it rounds to an integer
  float s = hi + lo;
  // t's low mantissa bits hold round(s / ln2) as a two's-complement integer (|s / ln2| < 2^22
  // wherever the result is used).
  float t = fastmath_fma(s, LOG2E, ROUND_SHIFT);
  float n = t - ROUND_SHIFT;
  uint32_t n_bits = fastmath_bits(t) - fastmath_bits(ROUND_SHIFT);
  float r = fastmath_fma(-n, LN2_HI, hi);
  r = fastmath_fma(-n, LN2_LO, r) + lo;
  float q = fastmath_fma(1.390152960e-03f, r, 8.363739587e-03f);
  q = fastmath_fma(q, r, 4.166686162e-02f);
  q = fastmath_fma(q, r, 1.666657329e-01f);
  q = fastmath_fma(q, r, 5.000000000e-01f);
  float p = fastmath_fma(fastmath_fma(q, r, 1.0f), r, 1.0f);  // 1 + r + r^2 q
  float y = fastmath_from_bits(fastmath_bits(p) + (n_bits << 23));
  y = fastmath_select(s <= EXP_MAX, y, s + INFINITY);
  return fastmath_select(s < EXP_MIN, 0.0f, y);
}

// exp(x) in fp32. lo = -0.0f makes s = x + lo and r + lo exact no-ops that gcc removes
// (x + -0 is x for every x, including -0; x + +0 would not be).
static inline float fast_expf(float x) {
  return fastmath_exp_sum(x, -0.0f);
}

// Past |x| = 13.5 the Gaussian exp(-x^2 / 2) < exp(-91) is below FLT_MIN and flushes to 0, so
// |x| is clamped there (the tail fit below covers [0, 13.5]). The clamp keeps NaN (the compare
// is false) and turns inf into a finite value, so that Phi(+-inf) comes out as 1 and 0.
static inline float fastmath_abs_clamped(float x) {
  float a = fabsf(x);
  return fastmath_select(a > 13.5f, 13.5f, a);
}

// exp(-a^2 / 2) with a^2 formed exactly: fp32 a * a is off by up to 8e-6 at a^2 ~ 170, which
// would be a 4e-6 relative error in the result. a = ah + al with ah = a cut to 12
// significant bits, so ah^2 is exact and a^2 = ah^2 + al (a + ah).
static inline float fastmath_gauss(float a) {
  float ah = fastmath_from_bits(fastmath_bits(a) & 0xfffff000u);
  float hi = -0.5f * (ah * ah);
  float lo = -0.5f * ((a - ah) * (a + ah));
  return fastmath_exp_sum(hi, lo);
}

// Phi(-a) / exp(-a^2 / 2) for a in [0, 13.5]: the normal tail without its Gaussian factor, a
// slowly varying function (0.5 at a = 0, ~1 / (a sqrt(2 pi)) for large a). It is fitted as
// t Q(t), t = 1 / (1 + 0.3 a) in (0.198, 1], Q of degree 9 (near-minimax in relative error,
// fit error 4e-9 with the fp32 coefficients). This is erfc(a / sqrt 2) / 2 in the form
// t exp(-z^2 + P(t)) of the classical Chebyshev erfc fits, with the exp taken out so that it
// is computed once, precisely, in fastmath_gauss.
static inline float fastmath_normal_tail_ratio(float a) {
  float t = 1.0f / fastmath_fma(0.3f, a, 1.0f);
  float q = fastmath_fma(-2.059414424e-02f, t, 1.122708917e-01f);
  q = fastmath_fma(q, t, -2.278118730e-01f);
  q = fastmath_fma(q, t, 1.912272722e-01f);
  q = fastmath_fma(q, t, -7.893991470e-02f);
  q = fastmath_fma(q, t, 9.588517249e-02f);
  q = fastmath_fma(q, t, 7.848823071e-02f);
  q = fastmath_fma(q, t, 1.102131903e-01f);
  q = fastmath_fma(q, t, 1.195746362e-01f);
  q = fastmath_fma(q, t, 1.196865365e-01f);
  return t * q;
}

// phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
static inline float fast_normal_pdf(float x) {
  return fastmath_gauss(fastmath_abs_clamped(x)) * 0x1.988454p-2f;
}

// Phi(x), the standard normal CDF: the tail Phi(-|x|) directly, and 1 - tail for x > 0.
static inline float fast_normal_cdf(float x) {
  float a = fastmath_abs_clamped(x);
  float tail = fastmath_gauss(a) * fastmath_normal_tail_ratio(a);
  return fastmath_select(x > 0.0f, 1.0f - tail, tail);
}
