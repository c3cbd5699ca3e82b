// Row partials of a log-sum-exp, the hot loop of the vocab-parallel selected logprob.
//
// For each of `rows` rows of `width` contiguous logits (fp32, bf16 or fp16), writes
// fp32 (m, s) = (max, sum exp(x - m)); a row whose max is -inf gives (-inf, 0).
//
// Why hand-written: every logit goes through one exp, so the exp's cost sets the
// operator's speed. A general-purpose vector exp (Sleef's, used by torch.compile) spends
// about twice the instructions of one specialised to arguments <= 0 with a relative
// error of ~2e-7, far below the fp32 threshold of 1e-5 on a logprob.
//
// Why the bits do not depend on the caller: each row is reduced by the same fixed
// sequence of operations (lane accumulators, a fixed tail, a fixed horizontal tree),
// with unaligned loads only, so neither the row's address, the number of rows in the
// call nor the thread that runs it changes a single bit. Results never go subnormal
// (arguments are clamped at -87), so flush-to-zero settings cannot change them either.
//
// Why it runs at the speed of one read of the logits: a row's max pass and exp pass are
// software-pipelined across rows. The exp pass of row i (from L1, where its max pass
// left it) runs interleaved with the max pass of row i + 1 (from L2), while row i + 2 is
// prefetched from memory into L2. The instruction stream interleaves independent work
// only: each accumulator still sees exactly the operations, in the order, of a row
// reduced alone, so pipelining changes no bit (the tests compare against rows scored
// alone, in other batches and at other offsets).

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__) && !defined(XCONF_NATIVE_GENERIC)
#define XCONF_NATIVE_AVX512 1
#include <immintrin.h>
#else
#define XCONF_NATIVE_AVX512 0
#endif

namespace {

constexpr int kLanes = 16;
// While row i's exp pass runs, row i + kPrefetchRows is prefetched into L2 (not L1: an L1
// prefetch holds one of the core's few line-fill buffers until its line arrives, which
// caps the bytes in flight below what memory delivers; and row i + 1 is already being
// read by its max pass). Measured on the 2-core Xeon (2048 x 151936 fp32, 2374-wide rows,
// one thread, CPU time against torch's sum): unpipelined with the next row prefetched
// into L1 1.13 read passes, into L2 two rows ahead 1.04, pipelined as here 0.99; with
// no prefetch at all 1.43.
constexpr int64_t kPrefetchRows = 2;
constexpr float kLog2e = 1.44269504088896341f;
// exp(-87) is about 1.6e-38, still a normal float: below it every term is negligible
// beside the row's largest term (exp(0) = 1), and clamping keeps results normal.
constexpr float kFloor = -87.0f;
// Near-minimax fit of 2^f on [0, 1): relative error below 1.6e-7 with fp32 Horner.
constexpr float kC0 = 0.9999999403953552f;
constexpr float kC1 = 0.6931530833244324f;
constexpr float kC2 = 0.24015361070632935f;
constexpr float kC3 = 0.05582631751894951f;
constexpr float kC4 = 0.008989340625703335f;
constexpr float kC5 = 0.0018775765784084797f;

enum Dtype : int32_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

#if XCONF_NATIVE_AVX512

using Vec = __m512;

inline Vec splat(float v) { return _mm512_set1_ps(v); }
inline Vec vmax(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec vsub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec vmul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline float hmax(Vec v) { return _mm512_reduce_max_ps(v); }
inline float hsum(Vec v) { return _mm512_reduce_add_ps(v); }

inline Vec load(const void* base, int32_t dtype, int64_t at) {
  if (dtype == kFloat32) return _mm512_loadu_ps(static_cast<const float*>(base) + at);
  const __m256i raw = _mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + at));
  if (dtype == kFloat16) return _mm512_cvtph_ps(raw);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// The last `count` (< 16) elements from `at`, the other lanes -inf.
inline Vec load_tail(const void* base, int32_t dtype, int64_t at, int count) {
  const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1u);
  const Vec ninf = splat(-INFINITY);
  if (dtype == kFloat32)
    return _mm512_mask_loadu_ps(ninf, mask, static_cast<const float*>(base) + at);
  const __m256i raw = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(base) + at);
  const Vec wide = dtype == kFloat16
                       ? _mm512_cvtph_ps(raw)
                       : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  return _mm512_mask_blend_ps(mask, ninf, wide);
}

// exp(d) for d <= 0; NaN stays NaN.
inline Vec exp_nonpositive(Vec d) {
  d = _mm512_max_ps(splat(kFloor), d);  // NaN in the second operand is returned as is
  const Vec log2e = splat(kLog2e);
  const Vec t = _mm512_mul_ps(d, log2e);
  const Vec rounding = _mm512_fmsub_ps(d, log2e, t);  // what rounding t lost
  const Vec f = _mm512_add_ps(_mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC),
                              rounding);  // t - floor(t), in [0, 1)
  Vec p = _mm512_fmadd_ps(splat(kC5), f, splat(kC4));
  p = _mm512_fmadd_ps(p, f, splat(kC3));
  p = _mm512_fmadd_ps(p, f, splat(kC2));
  p = _mm512_fmadd_ps(p, f, splat(kC1));
  p = _mm512_fmadd_ps(p, f, splat(kC0));
  return _mm512_scalef_ps(p, t);  // p * 2^floor(t)
}

inline void prefetch(const void* base, int32_t dtype, int64_t at) {
  const int64_t bytes = dtype == kFloat32 ? 4 : 2;
  _mm_prefetch(static_cast<const char*>(base) + at * bytes, _MM_HINT_T1);
  _mm_prefetch(static_cast<const char*>(base) + (at + kLanes) * bytes, _MM_HINT_T1);
}

#else  // portable: GCC/Clang vector extensions, 16 lanes on any target

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1fu) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal half: normalise
    uint32_t shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    bits = sign | ((113u - shift) << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

float scalar_at(const void* base, int32_t dtype, int64_t index) {
  if (dtype == kFloat32) return static_cast<const float*>(base)[index];
  const uint16_t raw = static_cast<const uint16_t*>(base)[index];
  if (dtype == kFloat16) return half_to_float(raw);
  const uint32_t bits = static_cast<uint32_t>(raw) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}


typedef float Vec __attribute__((vector_size(64)));
typedef int32_t IVec __attribute__((vector_size(64)));

inline Vec splat(float v) { return Vec{} + v; }
inline Vec vmax(Vec a, Vec b) { return a > b ? a : b; }
inline Vec vadd(Vec a, Vec b) { return a + b; }
inline Vec vsub(Vec a, Vec b) { return a - b; }
inline Vec vmul(Vec a, Vec b) { return a * b; }

inline float hmax(Vec v) {
  float lanes[kLanes];
  std::memcpy(lanes, &v, sizeof lanes);
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) lanes[l] = lanes[l] > lanes[l + width] ? lanes[l] : lanes[l + width];
  return lanes[0];
}

inline float hsum(Vec v) {
  float lanes[kLanes];
  std::memcpy(lanes, &v, sizeof lanes);
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  return lanes[0];
}

inline Vec load(const void* base, int32_t dtype, int64_t at) {
  Vec out;
  if (dtype == kFloat32) {
    std::memcpy(&out, static_cast<const float*>(base) + at, sizeof out);
    return out;
  }
  float lanes[kLanes];
  for (int l = 0; l < kLanes; ++l) lanes[l] = scalar_at(base, dtype, at + l);
  std::memcpy(&out, lanes, sizeof out);
  return out;
}

inline Vec load_tail(const void* base, int32_t dtype, int64_t at, int count) {
  float lanes[kLanes];
  for (int l = 0; l < kLanes; ++l) lanes[l] = l < count ? scalar_at(base, dtype, at + l) : -INFINITY;
  Vec out;
  std::memcpy(&out, lanes, sizeof out);
  return out;
}

inline Vec exp_nonpositive(Vec d) {
  d = d < kFloor ? splat(kFloor) : d;  // NaN compares false and stays
  const Vec t = d * kLog2e;
  const Vec magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  Vec n = (t + magic) - magic;
  n = n > t ? n - 1.0f : n;  // floor(t), in [-126, 0]
  const Vec f = t - n;
  Vec p = kC5 * f + kC4;
  p = p * f + kC3;
  p = p * f + kC2;
  p = p * f + kC1;
  p = p * f + kC0;
  n = n == n ? n : splat(0.0f);  // NaN lanes: keep p's NaN bits
  IVec bits;
  std::memcpy(&bits, &p, sizeof bits);
  bits += __builtin_convertvector(n, IVec) << 23;  // p * 2^n, always a normal float
  Vec out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

inline void prefetch(const void* base, int32_t dtype, int64_t at) {
  const int64_t bytes = dtype == kFloat32 ? 4 : 2;
  __builtin_prefetch(static_cast<const char*>(base) + at * bytes, 0, 2);
  __builtin_prefetch(static_cast<const char*>(base) + (at + kLanes) * bytes, 0, 2);
}

#endif

const void* offset(const void* base, int32_t dtype, int64_t elements) {
  const int64_t bytes = dtype == kFloat32 ? 4 : 2;
  return static_cast<const char*>(base) + elements * bytes;
}

// The max pass of one row: four accumulators over 64-element steps (one would serialise
// on the max latency), then single vectors, then the masked tail.
struct MaxPass {
  Vec m0 = splat(-INFINITY), m1 = splat(-INFINITY), m2 = splat(-INFINITY),
      m3 = splat(-INFINITY);
  int64_t j = 0;

  // One 64-element step at j; the caller checks j + 64 <= body.
  void step(const void* row, int32_t dtype) {
    m0 = vmax(m0, load(row, dtype, j));
    m1 = vmax(m1, load(row, dtype, j + kLanes));
    m2 = vmax(m2, load(row, dtype, j + 2 * kLanes));
    m3 = vmax(m3, load(row, dtype, j + 3 * kLanes));
    j += 4 * kLanes;
  }

  // The rest of the pass from j: returns the row's max; `tail` gets its masked tail.
  float finish(const void* row, int32_t dtype, int64_t body, int tail_count, Vec* tail) {
    while (j + 4 * kLanes <= body) step(row, dtype);
    for (; j < body; j += kLanes) m0 = vmax(m0, load(row, dtype, j));
    *tail = tail_count ? load_tail(row, dtype, body, tail_count) : splat(-INFINITY);
    return hmax(vmax(vmax(vmax(m0, *tail), m1), vmax(m2, m3)));
  }
};

inline Vec exp_term(const void* row, int32_t dtype, int64_t at, Vec shift) {
  return exp_nonpositive(vsub(load(row, dtype, at), shift));
}

// (m, s) of `rows` rows of `width` logits, `stride` elements apart, pipelined (see the
// top of the file). The exp pass: two accumulators taking alternate vectors, the rest
// into the first, the tail into the second, a fixed horizontal sum. A row whose max is
// -inf is the identity partial (-inf, 0): its exp pass would only add clamped terms.
void reduce_rows(const void* x, int32_t dtype, int64_t rows, int64_t width, int64_t stride,
                 float* m_out, float* s_out) {
  const int64_t body = width - width % kLanes;
  const int tail_count = static_cast<int>(width - body);
  Vec tail;
  MaxPass first;
  float m = first.finish(x, dtype, body, tail_count, &tail);
  for (int64_t i = 0; i < rows; ++i) {
    const void* row = offset(x, dtype, i * stride);
    const void* next = i + 1 < rows ? offset(x, dtype, (i + 1) * stride) : nullptr;
    const void* ahead =
        i + kPrefetchRows < rows ? offset(x, dtype, (i + kPrefetchRows) * stride) : nullptr;
    MaxPass following;
    m_out[i] = m;
    if (m == -INFINITY) {
      s_out[i] = 0.0f;
    } else {
      const Vec shift = splat(m);
      Vec a0 = splat(0.0f), a1 = splat(0.0f);
      int64_t j = 0;
      if (next != nullptr) {
        for (; j + 4 * kLanes <= body; j += 4 * kLanes) {
          if (ahead != nullptr) {
            prefetch(ahead, dtype, j);
            prefetch(ahead, dtype, j + 2 * kLanes);
          }
          following.step(next, dtype);  // at j, in step with this loop
          a0 = vadd(a0, exp_term(row, dtype, j, shift));
          a1 = vadd(a1, exp_term(row, dtype, j + kLanes, shift));
          a0 = vadd(a0, exp_term(row, dtype, j + 2 * kLanes, shift));
          a1 = vadd(a1, exp_term(row, dtype, j + 3 * kLanes, shift));
        }
      }
      for (; j + 2 * kLanes <= body; j += 2 * kLanes) {
        if (ahead != nullptr) prefetch(ahead, dtype, j);
        a0 = vadd(a0, exp_term(row, dtype, j, shift));
        a1 = vadd(a1, exp_term(row, dtype, j + kLanes, shift));
      }
      for (; j < body; j += kLanes) a0 = vadd(a0, exp_term(row, dtype, j, shift));
      if (tail_count) a1 = vadd(a1, exp_nonpositive(vsub(tail, shift)));
      s_out[i] = hsum(vadd(a0, a1));
    }
    if (next != nullptr) m = following.finish(next, dtype, body, tail_count, &tail);
  }
}

// Partials in order merged into one: returns M = max m_t and writes S = sum s_t exp(m_t - M),
// lane-accumulated over chunks of 16 with a fixed tree. Any NaN gives (NaN, NaN); all
// identity partials give (-inf, 0).
float merge_row(const float* m, const float* s, int64_t count, float* s_out) {
  float big = -INFINITY;
  bool nan = false;
  for (int64_t t = 0; t < count; ++t) {
    nan = nan || m[t] != m[t] || s[t] != s[t];
    big = m[t] > big ? m[t] : big;
  }
  if (nan) {
    *s_out = NAN;
    return NAN;
  }
  if (big == -INFINITY) {
    *s_out = 0.0f;
    return big;
  }
  const Vec shift = splat(big);
  Vec acc = splat(0.0f);
  float mb[kLanes], sb[kLanes];
  for (int64_t t = 0; t < count; t += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const bool in = t + l < count;
      mb[l] = in ? m[t + l] : -INFINITY;  // padding lanes add 0 * exp(-87) = 0
      sb[l] = in ? s[t + l] : 0.0f;
    }
    Vec mv, sv;
    std::memcpy(&mv, mb, sizeof mv);
    std::memcpy(&sv, sb, sizeof sv);
    acc = vadd(acc, vmul(sv, exp_nonpositive(vsub(mv, shift))));
  }
  *s_out = hsum(acc);
  return big;
}

// log(v) for finite v >= 1 in double, from + - * / only (no libm), so every build and
// every C library gives the same bits: v = r 2^e with r in [sqrt(1/2), sqrt(2)),
// log r = 2 atanh(z), z = (r - 1) / (r + 1), |z| < 0.172, series to z^19 (error < 1e-16).
double log_fixed(double v) {
  int e = 0;
  double r = std::frexp(v, &e);  // exact: r in [0.5, 1)
  if (r < 0.70710678118654752) {
    r *= 2.0;
    e -= 1;
  }
  const double z = (r - 1.0) / (r + 1.0);
  const double z2 = z * z;
  double p = 1.0 / 19.0;
  for (int k = 17; k >= 1; k -= 2) p = p * z2 + 1.0 / k;
  return static_cast<double>(e) * 0.69314718055994531 + 2.0 * z * p;
}

// M + log S of one merged row, rounded once to fp32.
float lse_of(float big, float total) {
  if (big != big || total != total) return NAN;
  if (big == -INFINITY) return big;
  return static_cast<float>(static_cast<double>(big) + log_fixed(total));
}

}  // namespace

extern "C" {

// 512 when built for AVX-512, 0 for the portable vector code.
int32_t xconf_partials_isa(void) { return XCONF_NATIVE_AVX512 ? 512 : 0; }

// Rows start `row_stride` elements apart; `m_out` and `s_out` hold `rows` floats each.
void xconf_row_partials(const void* x, int32_t dtype, int64_t rows, int64_t width,
                        int64_t row_stride, float* m_out, float* s_out) {
  if (rows <= 0) return;
  if (width <= 0) {
    for (int64_t i = 0; i < rows; ++i) {
      m_out[i] = -INFINITY;
      s_out[i] = 0.0f;
    }
    return;
  }
  reduce_rows(x, dtype, rows, width, row_stride, m_out, s_out);
}

// Deterministic merge: `rows` rows of `tiles` partials (row-major) to the rows' LSE.
void xconf_merge_lse(const float* m, const float* s, int64_t rows, int64_t tiles,
                     float* lse_out) {
  for (int64_t i = 0; i < rows; ++i) {
    float total = 0.0f;
    const float big = merge_row(m + i * tiles, s + i * tiles, tiles, &total);
    lse_out[i] = lse_of(big, total);
  }
}

}  // extern "C"
