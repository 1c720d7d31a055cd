// oxla's float32 GEMM for XLA:CPU, reached through an XLA FFI custom call ("oxla_sgemm"); below
// it, on the same vector layer and threads, a convolution ("oxla_sconv"), a depthwise
// convolution ("oxla_sdwconv"), the time loops of GRU and LSTM layers ("oxla_sgru",
// "oxla_slstm") and NonMaxSuppression's greedy pass ("oxla_snms").
//
// Y[..., N] = act(X[..., K] * W[K, N] + bias[N] (+ R[..., N])), W packed once at plan time into
// panels of 32 columns, (ceil(N / 32), K, 32), zero padded (`pack` in oxla/native/__init__.py);
// act is none, Relu, Clip(lo, hi), x * sigmoid(x) (SiLU, with the MLAS polynomial that oxla's
// Sigmoid uses) or HardSwish, applied to each stored tile while it is in L1.
//
// Why oxla owns this kernel (docs/benchmarks.md, ninth round): XLA:CPU's dots gain 0.9-1.9x
// from the second core, onnxruntime's MLAS 2x. This kernel cuts a product into parts that the
// calling thread and the intra-op pool's threads (on oxla's one-thread client, spinning helpers
// of oxla's own) claim one at a time, so that a pool thread that wakes late (25-70 us on these
// VMs) costs only its share; the fused epilogue saves the
// pass over the output that the activation or residual Add took. On one core it is within
// 0-12% of MLAS on the suite's 1x1 shapes (AVX-512, 12 rows x 32 columns per micro-tile, 24
// accumulators) but no faster than XLA's dot inside a model, so oxla uses it on several cores.
//
// Built on first use by oxla/native/__init__.py with the host's C++ compiler, for AVX-512F or,
// where the CPU lacks it, for AVX2 + FMA (the vector layer below; 8 lanes, 6 x 16 micro-tiles).

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// ---- The vector layer: one source for AVX-512F and for AVX2 + FMA ------------------------------
//
// oxla/native/__init__.py builds this file with -mavx512f where the CPU has it, else with -mavx2
// -mfma. V is one register of L float lanes; Mask selects the first lanes of one (a k-mask on
// AVX-512, a lane vector for vmaskmovps on AVX2: slower there, so the AVX2 kernels take unmasked
// paths where a block is full).
#if defined(__AVX512F__)
constexpr int L = 16;
using V = __m512;
using Mask = __mmask16;
constexpr bool CHEAP_MASKS = true;
inline V v_zero() { return _mm512_setzero_ps(); }
inline V v_set(float f) { return _mm512_set1_ps(f); }
inline V v_load(const float* p) { return _mm512_loadu_ps(p); }
inline void v_store(float* p, V v) { _mm512_storeu_ps(p, v); }
inline V v_load_m(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
inline void v_store_m(float* p, Mask m, V v) { _mm512_mask_storeu_ps(p, m, v); }
inline Mask lanes(int64_t n) {
  return n >= L ? (Mask)0xFFFF : n <= 0 ? (Mask)0 : (Mask)((1u << n) - 1);
}
inline V v_fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V v_add(V a, V b) { return _mm512_add_ps(a, b); }
inline V v_sub(V a, V b) { return _mm512_sub_ps(a, b); }
inline V v_mul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V v_div(V a, V b) { return _mm512_div_ps(a, b); }
inline V v_min(V a, V b) { return _mm512_min_ps(a, b); }
inline V v_max(V a, V b) { return _mm512_max_ps(a, b); }
using VI = __m512i;  // lane indices
inline V v_perm(V v, VI idx) { return _mm512_permutexvar_ps(idx, v); }  // lane l: v[idx[l]]
inline VI vi_load(const int32_t* p) { return _mm512_loadu_si512(p); }
template <int J>  // lane l: v[4 (l / 4) + J], in-lane (vpermilps)
inline V v_quad(V v) { return _mm512_permute_ps(v, J * 0x55); }
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int L = 8;
using V = __m256;
using Mask = __m256i;
constexpr bool CHEAP_MASKS = false;
inline V v_zero() { return _mm256_setzero_ps(); }
inline V v_set(float f) { return _mm256_set1_ps(f); }
inline V v_load(const float* p) { return _mm256_loadu_ps(p); }
inline void v_store(float* p, V v) { _mm256_storeu_ps(p, v); }
inline V v_load_m(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
inline void v_store_m(float* p, Mask m, V v) { _mm256_maskstore_ps(p, m, v); }
inline Mask lanes(int64_t n) {
  int k = n >= L ? L : n <= 0 ? 0 : (int)n;
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline V v_fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V v_add(V a, V b) { return _mm256_add_ps(a, b); }
inline V v_sub(V a, V b) { return _mm256_sub_ps(a, b); }
inline V v_mul(V a, V b) { return _mm256_mul_ps(a, b); }
inline V v_div(V a, V b) { return _mm256_div_ps(a, b); }
inline V v_min(V a, V b) { return _mm256_min_ps(a, b); }
inline V v_max(V a, V b) { return _mm256_max_ps(a, b); }
using VI = __m256i;
inline V v_perm(V v, VI idx) { return _mm256_permutevar8x32_ps(v, idx); }
inline VI vi_load(const int32_t* p) { return _mm256_loadu_si256((const __m256i*)p); }
template <int J>  // lane l: v[4 (l / 4) + J], in-lane (vpermilps)
inline V v_quad(V v) { return _mm256_permute_ps(v, J * 0x55); }
#else
#error "oxla's native kernels need AVX-512F, or AVX2 and FMA"
#endif

// p's first n lanes (the rest zero), unmasked when the vector is full.
inline V v_load_n(const float* p, int64_t n) { return n >= L ? v_load(p) : v_load_m(p, lanes(n)); }
inline void v_store_n(float* p, int64_t n, V v) {
  if (n >= L) v_store(p, v);
  else v_store_m(p, lanes(n), v);
}

constexpr int NR = 32;  // columns per packed panel (Python's pack())
// A micro-tile: MR rows x TC columns, 2 MR accumulators (AVX-512: 12 x 32 in 24 of its 32
// registers; AVX2: 6 x 16 in 12 of its 16), a panel of 32 columns taken in NR / TC tiles. On
// AVX-512 two whole panels side by side go in tiles of 6 rows x 64 columns instead (tile_rows4):
// also 24 accumulators, but a term loads 4 vectors of W and broadcasts 6 inputs where the 12 x 32
// tile broadcasts 12 and loads 2. Alone on one core of an Intel Xeon (AVX-512), alternated with
// the 12 x 32 build: 3136x64x256 0.90x the time, 784x128x512 0.97x, 196x256x1024 0.81x,
// 196x1024x256 0.90x, the packed 49x512x2048 equal; in models (GEMM, convolution and Winograd
// products), one core / default threads: ResNet-50 0.935x / 0.97x, DBNet-style 0.93x / 0.96x,
// EfficientNet-B0 0.90x at default threads.
constexpr int TC = 2 * L;
constexpr int MR = L == 16 ? 12 : 6;
// The GEMM reads W's packed panels in place while W fits in half of this core's L2 (asked once;
// 1 MiB where the C library cannot say); above that each thread first packs its rows of X so that
// one panel of W stays in cache across all of them, where in place every block of MR rows passed
// over all of W, from L3. On Zen 3 (512 KiB L2) this was 1 MiB: the kernel alone, two threads /
// one, 196x256x1024 and 196x1024x256 (W 1 MiB) 0.84-0.90x / 0.90-0.93x the time, 784x256x512
// and 784x512x256 (W 512 KiB) 0.92-0.97x / 0.95-0.97x, the others equal; ResNet-50 0.975x and
// the DBNet-style segmenter 0.978x at default threads.
int64_t direct_w_bytes() {
  static const int64_t bytes = [] {
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? (int64_t)l2 / 2 : (int64_t)1 << 20;
  }();
  return bytes;
}
// The convolution's own bound (conv_range), measured apart: at half of Zen 3's L2 its 3x3
// 128 -> 128 layers at 28x28 ran 1.15x the time.
constexpr int64_t CONV_WIDE_W_BYTES = 1 << 20;

enum Act : int64_t { NONE = 0, RELU = 1, CLIP = 2, SILU = 3, HARD_SWISH = 4 };

// What happens to a stored tile (acc + bias) next: + residual R (Y's layout), activation.
struct Epilogue {
  const float* residual;  // nullptr or R at the tile's first element
  int64_t ldr;
  int64_t act;
  float lo, hi;           // Clip's bounds
};

// x p(x^2) / q(x^2), p and q by Horner's rule from their highest coefficient (MLAS's form of
// its logistic and tanh approximations).
template <size_t NP, size_t NQ>
inline V odd_rational(V x, const float (&p)[NP], const float (&q)[NQ]) {
  V x2 = v_mul(x, x);
  V a = v_set(p[0]), b = v_set(q[0]);
  for (size_t i = 1; i < NP; ++i) a = v_fma(a, x2, v_set(p[i]));
  for (size_t i = 1; i < NQ; ++i) b = v_fma(b, x2, v_set(q[i]));
  return v_div(v_mul(a, x), b);
}

// sigmoid as MLAS's rational polynomial (oxla's Sigmoid: elementwise.py; onnxruntime's GRU/LSTM)
inline V logistic(V v) {
  constexpr float P[] = {4.37031012579801e-11f, 1.15627324459942e-07f, 6.08574864600143e-05f,
                         8.51377133304701e-03f, 2.48287947061529e-01f};
  constexpr float Q[] = {6.10247389755681e-13f, 5.76102136993427e-09f, 6.29106785017040e-06f,
                         1.70198817374094e-03f, 1.16817656904453e-01f, 9.93151921023180e-01f};
  V x = v_min(v_max(v, v_set(-18.0f)), v_set(18.0f));
  V s = v_add(odd_rational(x, P, Q), v_set(0.5f));
  return v_min(v_max(s, v_zero()), v_set(1.0f));
}

// x * sigmoid(x)
inline V silu(V v) { return v_mul(v, logistic(v)); }

template <int R, int NV, bool MASK>
inline void finish_tile(V (&c0)[R], V (&c1)[R], const Epilogue& e, Mask m0, Mask m1);

// A tile's rows: acc + bias, then (e: the last K block) the epilogue in registers, stored under
// the column masks (all lanes when !MASK).
template <int R, int NV, bool MASK>
inline void store_tile(V (&c0)[R], V (&c1)[R], float* C, int64_t ldc, const float* bias,
                       Mask m0, Mask m1, const Epilogue* e) {
  V z0 = MASK ? v_load_m(bias, m0) : v_load(bias);
  V z1 = NV == 2 ? (MASK ? v_load_m(bias + L, m1) : v_load(bias + L)) : z0;
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) {
    c0[i] = v_add(c0[i], z0);
    if (NV == 2) c1[i] = v_add(c1[i], z1);
  }
  if (e != nullptr) finish_tile<R, NV, MASK>(c0, c1, *e, m0, m1);
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) {
    if (MASK && NV == 1) v_store_m(C + i * ldc, m0, c0[i]);
    else v_store(C + i * ldc, c0[i]);
    if (NV == 2) {
      if (MASK) v_store_m(C + i * ldc + L, m1, c1[i]);
      else v_store(C + i * ldc + L, c1[i]);
    }
  }
}

// v is the second operand of each min and max: vminps / vmaxps return the second operand when
// either is NaN, so a NaN stays NaN as in ONNX (onnxruntime, XLA); v_max(v, 0) turned it into 0.
template <int64_t ACT>
inline V activate(V v, float lo, float hi) {
  if (ACT == RELU) return v_max(v_zero(), v);
  if (ACT == CLIP) return v_min(v_set(hi), v_max(v_set(lo), v));
  if (ACT == SILU) return silu(v);
  if (ACT == HARD_SWISH) {
    V g = v_fma(v, v_set(1.0f / 6.0f), v_set(0.5f));
    g = v_min(v_set(1.0f), v_max(v_zero(), g));
    return v_mul(v, g);
  }
  return v;
}

template <int R, int NV, int64_t ACT>
inline void activate_tile(V (&c0)[R], V (&c1)[R], float lo, float hi) {
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) {
    c0[i] = activate<ACT>(c0[i], lo, hi);
    if (NV == 2) c1[i] = activate<ACT>(c1[i], lo, hi);
  }
}

// The epilogue on a tile's accumulators (acc + bias): + residual R (Y's layout), activation. In
// registers, where a pass over the stored tile had loaded and stored each element again.
template <int R, int NV, bool MASK>
inline void finish_tile(V (&c0)[R], V (&c1)[R], const Epilogue& e, Mask m0, Mask m1) {
  if (e.residual != nullptr) {
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      const float* r = e.residual + i * e.ldr;
      c0[i] = v_add(c0[i], MASK && NV == 1 ? v_load_m(r, m0) : v_load(r));
      if (NV == 2) c1[i] = v_add(c1[i], MASK ? v_load_m(r + L, m1) : v_load(r + L));
    }
  }
  switch (e.act) {
    case RELU: activate_tile<R, NV, RELU>(c0, c1, e.lo, e.hi); break;
    case CLIP: activate_tile<R, NV, CLIP>(c0, c1, e.lo, e.hi); break;
    case SILU: activate_tile<R, NV, SILU>(c0, c1, e.lo, e.hi); break;
    case HARD_SWISH: activate_tile<R, NV, HARD_SWISH>(c0, c1, e.lo, e.hi); break;
    default: break;
  }
}

// The accumulators: zero, or (ACC: a later K block) C's rows as an earlier block stored them.
template <int R, int NV, bool MASK, bool ACC>
inline void tile_start(V (&c0)[R], V (&c1)[R], const float* C, int64_t ldc, Mask m0, Mask m1) {
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) {
    if (!ACC) {
      c0[i] = v_zero();
      c1[i] = v_zero();
      continue;
    }
    c0[i] = MASK && NV == 1 ? v_load_m(C + i * ldc, m0) : v_load(C + i * ldc);
    c1[i] = NV == 2 ? (MASK ? v_load_m(C + i * ldc + L, m1) : v_load(C + i * ldc + L)) : c0[i];
  }
}

// One micro-tile, rows read in place: C[0:R, 0:nc] (+)= A[0:R, :K] * Bp[:K, 0:nc] (Bp's rows NR
// apart), + bias.
template <int R, int NV, bool MASK, bool ACC>
inline void tile_direct(int64_t K, const float* __restrict A, int64_t lda,
                        const float* __restrict Bp, float* C, int64_t ldc, const float* bias,
                        Mask m0, Mask m1, const Epilogue* e) {
  V c0[R], c1[R];
  tile_start<R, NV, MASK, ACC>(c0, c1, C, ldc, m0, m1);
  const float* a4 = A + 4 * lda;
  const float* a8 = A + 8 * lda;
  for (int64_t k = 0; k < K; ++k) {
    V b0 = v_load(Bp);
    V b1 = NV == 2 ? v_load(Bp + L) : b0;
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      const float* base = i < 4 ? A : i < 8 ? a4 : a8;
      V a = v_set(base[(i & 3) * lda + k]);
      c0[i] = v_fma(a, b0, c0[i]);
      if (NV == 2) c1[i] = v_fma(a, b1, c1[i]);
    }
    Bp += NR;
  }
  store_tile<R, NV, MASK>(c0, c1, C, ldc, bias, m0, m1, e);
}

// One micro-tile, rows packed as (K, R), all of K: C[0:R, 0:nc] = the same product + bias.
template <int R, int NV, bool MASK>
inline void tile_packed(int64_t K, const float* __restrict Ap, const float* __restrict Bp,
                        float* C, int64_t ldc, const float* bias, Mask m0, Mask m1,
                        const Epilogue* e) {
  V c0[R], c1[R];
  tile_start<R, NV, MASK, false>(c0, c1, C, ldc, m0, m1);
  for (int64_t k = 0; k < K; ++k) {
    V b0 = v_load(Bp);
    V b1 = NV == 2 ? v_load(Bp + L) : b0;
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      V a = v_set(Ap[i]);
      c0[i] = v_fma(a, b0, c0[i]);
      if (NV == 2) c1[i] = v_fma(a, b1, c1[i]);
    }
    Ap += R;
    Bp += NR;
  }
  store_tile<R, NV, MASK>(c0, c1, C, ldc, bias, m0, m1, e);
}

// AVX-512: R <= 6 rows x 4L columns (two whole panels, Bp and Bp2 at the same term), 24
// accumulators: a term's 24 multiply-adds load 4 vectors of W and broadcast R inputs, where the
// 12 x 2L tile loads 2 and broadcasts 12.
// PACKED: A's term k of row i at A[k lda + i], else at A[i lda + k].
template <int R, bool ACC, bool PACKED>
inline void tile_direct4(int64_t K, const float* __restrict A, int64_t lda,
                         const float* __restrict Bp, const float* __restrict Bp2, float* C,
                         int64_t ldc, const float* bias, const Epilogue* e) {
  const Mask all = lanes(L);
  V c0[R], c1[R], c2[R], c3[R];  // columns [0, 2L) and [2L, 4L): the 12 x 2L tile's start and store
  tile_start<R, 2, false, ACC>(c0, c1, C, ldc, all, all);
  tile_start<R, 2, false, ACC>(c2, c3, C + 2 * L, ldc, all, all);
  for (int64_t k = 0; k < K; ++k) {
    V b0 = v_load(Bp), b1 = v_load(Bp + L), b2 = v_load(Bp2), b3 = v_load(Bp2 + L);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      V a = v_set(PACKED ? A[k * lda + i] : A[i * lda + k]);
      c0[i] = v_fma(a, b0, c0[i]);
      c1[i] = v_fma(a, b1, c1[i]);
      c2[i] = v_fma(a, b2, c2[i]);
      c3[i] = v_fma(a, b3, c3[i]);
    }
    Bp += NR;
    Bp2 += NR;
  }
  store_tile<R, 2, false>(c0, c1, C, ldc, bias, all, all, e);
  Epilogue e2;  // the right half's: its residual 2L columns on
  if (e != nullptr) {
    e2 = *e;
    if (e2.residual != nullptr) e2.residual += 2 * L;
  }
  store_tile<R, 2, false>(c2, c3, C + 2 * L, ldc, bias + 2 * L, all, all, e ? &e2 : nullptr);
}

template <bool ACC, bool PACKED>
void direct4_rows(int r, int64_t K, const float* A, int64_t lda, const float* Bp,
                  const float* Bp2, float* C, int64_t ldc, const float* bias, const Epilogue* e) {
  switch (r) {
#define OXLA_R(n) \
  case n: tile_direct4<n, ACC, PACKED>(K, A, lda, Bp, Bp2, C, ldc, bias, e); break;
    OXLA_R(1) OXLA_R(2) OXLA_R(3) OXLA_R(4) OXLA_R(5) OXLA_R(6)
#undef OXLA_R
  }
}

struct Panel {
  int64_t n0, nc;  // nc: at most NR, or 2 NR for two whole panels side by side (span_of)
  int64_t panels() const { return nc > NR ? 2 : 1; }
};

// Columns [32 p, 32 p + 32) of N.
Panel panel_of(int64_t N, int64_t p) {
  Panel q;
  q.n0 = p * NR;
  q.nc = N - q.n0 < NR ? N - q.n0 : NR;
  return q;
}

// Panel p of [p, p1), or on AVX-512 panels p and p + 1 together where both are whole (tile_rows
// takes them in tiles of 6 rows x 64 columns; on AVX2's 16 registers the 6 x 2L tile stays).
Panel span_of(int64_t N, int64_t p, int64_t p1) {
  if (L == 16 && p + 1 < p1 && (p + 2) * NR <= N) return Panel{p * NR, 2 * NR};
  return panel_of(N, p);
}

// f(span) for the spans of panels [p0, p1) of N columns (span_of), in order.
template <typename F>
inline void each_span(int64_t N, int64_t p0, int64_t p1, F f) {
  for (int64_t p = p0; p < p1;) {
    Panel q = span_of(N, p, p1);
    f(q);
    p += q.panels();
  }
}

struct Job {
  const float* A;
  const float* Bp;
  const float* bias;
  const float* residual;  // nullptr, or R with Y's shape
  float* C;
  int64_t M, K, N;
  int64_t blocks;  // row blocks of at most MR rows, sizes as even as possible
  int64_t act;
  float lo, hi;
  bool direct;
  bool by_rows;  // parts split the row blocks (else the column panels): gemm_split
  int64_t row(int64_t b) const { return M * b / blocks; }
};

// r rows (r <= MR) of one tile; the tile sizes above MR are never instantiated.
template <int NV, bool MASK, bool ACC>
void direct_rows(int r, int64_t K, const float* A, int64_t lda, const float* Bp, float* C,
                 int64_t ldc, const float* bias, Mask m0, Mask m1, const Epilogue* e) {
  switch (r) {
#define OXLA_R(n) \
  case n: if constexpr (n <= MR) tile_direct<n, NV, MASK, ACC>(K, A, lda, Bp, C, ldc, bias, m0, m1, e); break;
    OXLA_R(1) OXLA_R(2) OXLA_R(3) OXLA_R(4) OXLA_R(5) OXLA_R(6)
    OXLA_R(7) OXLA_R(8) OXLA_R(9) OXLA_R(10) OXLA_R(11) OXLA_R(12)
#undef OXLA_R
  }
}

template <int NV, bool MASK>
void packed_rows(int r, int64_t K, const float* Ap, const float* Bp, float* C, int64_t ldc,
                 const float* bias, Mask m0, Mask m1, const Epilogue* e) {
  switch (r) {
#define OXLA_R(n) \
  case n: if constexpr (n <= MR) tile_packed<n, NV, MASK>(K, Ap, Bp, C, ldc, bias, m0, m1, e); break;
    OXLA_R(1) OXLA_R(2) OXLA_R(3) OXLA_R(4) OXLA_R(5) OXLA_R(6)
    OXLA_R(7) OXLA_R(8) OXLA_R(9) OXLA_R(10) OXLA_R(11) OXLA_R(12)
#undef OXLA_R
  }
}

// A convolution over more than KC_MAX terms (K = KH KW C) is summed in K blocks of at most KC
// terms through Y: the block of a W panel (KC x 32 floats, 64 KiB) stays in L2 while every row
// block of a group passes over it, where a whole panel (K x 32, 576 KiB at K = 4608) went to L3
// once per row block. The kernel alone in a jitted call, one core / two: 3x3 512 -> 512 at 7x7
// 4.63 -> 4.22 ms / 2.71 -> 2.44, at 14x14 stride 2 4.84 -> 4.36 / 3.38 -> 2.68; in the suite's
// models at default threads ResNet-50 0.997, DBNet-style 0.988 the time. Blocking K = 1152 (128
// channels) was 6% slower on two cores, and the GEMM's products slower (run_range).
constexpr int64_t KC = 512;
constexpr int64_t KC_MAX = 2560;

struct KBlock {
  int64_t k0, kn;  // terms [k0, k0 + kn)
  bool first, last;
};

inline int64_t k_blocks(int64_t K) { return K <= KC_MAX ? 1 : (K + KC - 1) / KC; }
inline KBlock k_block(int64_t K, int64_t blocks, int64_t i) {
  int64_t k0 = K * i / blocks, k1 = K * (i + 1) / blocks;
  return KBlock{k0, k1 - k0, i == 0, i == blocks - 1};
}

alignas(64) const float ZEROS[TC] = {};
alignas(64) const float ZEROS64[4 * L] = {};

// Rows [r0, r0 + r) of C times the two whole panels from column n0 (AVX-512) over the terms of
// K block kb, A read in place (ap == nullptr: rows of lda) or packed (ap: (K, r); whole K only),
// in tiles of at most 6 rows x 4L columns.
void tile_rows4(int r, int64_t K, const KBlock& kb, const float* a, int64_t lda,
                const float* ap, const float* Bp, int64_t n0, const float* bias, float* c,
                int64_t ldc, const float* residual, int64_t act, float lo, float hi) {
  const float* bp = Bp + n0 * K + kb.k0 * NR;
  const float* bp2 = bp + K * NR;
  const float* bs = kb.first && bias != nullptr ? bias + n0 : ZEROS64;
  int h = r <= 6 ? r : (r + 1) / 2;  // rows in halves as even as possible: 11 as 6 + 5
  for (int i0 = 0; i0 < r; i0 += h, h = r - i0) {
    Epilogue es{residual ? residual + i0 * ldc + n0 : nullptr, ldc, act, lo, hi};
    const Epilogue* e = kb.last ? &es : nullptr;
    float* ci = c + i0 * ldc + n0;
    const float* ai = a + i0 * lda + kb.k0;
    if (ap != nullptr) direct4_rows<false, true>(h, K, ap + i0, r, bp, bp2, ci, ldc, bs, e);
    else if (kb.first) direct4_rows<false, false>(h, kb.kn, ai, lda, bp, bp2, ci, ldc, bs, e);
    else direct4_rows<true, false>(h, kb.kn, ai, lda, bp, bp2, ci, ldc, bs, e);
  }
}

// Rows [r0, r0 + r) of C times panel q (two whole ones: tile_rows4) over the terms of K block kb,
// A read in place (ap == nullptr: a rows of lda) or packed (ap: (K, r); the GEMM's, whole K
// only): the first block stores the product + bias, later ones add theirs, the last finishes
// with residual and activation. The panel's columns go in tiles of TC (one on AVX-512, two on
// AVX2), each under its own lane masks.
void tile_rows(int r, int64_t K, const KBlock& kb, const float* a, int64_t lda, const float* ap,
               const float* Bp, const Panel& q, const float* bias, float* c, int64_t ldc,
               const float* residual, int64_t act, float lo, float hi) {
  if (q.panels() == 2) {
    tile_rows4(r, K, kb, a, lda, ap, Bp, q.n0, bias, c, ldc, residual, act, lo, hi);
    return;
  }
  int64_t kn = kb.kn;
  a += kb.k0;
  for (int64_t s = 0; s < q.nc; s += TC) {
    int64_t nc = q.nc - s < TC ? q.nc - s : TC;
    const float* bp = Bp + q.n0 * K + kb.k0 * NR + s;
    const float* bs = kb.first && bias != nullptr ? bias + q.n0 + s : ZEROS;  // none: zeros
    float* cs = c + q.n0 + s;
    Mask m0 = lanes(nc), m1 = lanes(nc - L);
    Epilogue es{residual ? residual + q.n0 + s : nullptr, ldc, act, lo, hi};
    const Epilogue* e = kb.last ? &es : nullptr;
#define OXLA_ROWS(KIND, ACC, ...)                                                               \
  if (nc == TC) KIND##_rows<2, false ACC>(r, kn, __VA_ARGS__, bp, cs, ldc, bs, m0, m1, e);      \
  else if (nc > L) KIND##_rows<2, true ACC>(r, kn, __VA_ARGS__, bp, cs, ldc, bs, m0, m1, e);    \
  else if (nc == L) KIND##_rows<1, false ACC>(r, kn, __VA_ARGS__, bp, cs, ldc, bs, m0, m1, e);  \
  else KIND##_rows<1, true ACC>(r, kn, __VA_ARGS__, bp, cs, ldc, bs, m0, m1, e);
#define OXLA_ACC(x) , x
    if (ap != nullptr) { OXLA_ROWS(packed, , ap) }
    else if (kb.first) { OXLA_ROWS(direct, OXLA_ACC(false), a, lda) }
    else { OXLA_ROWS(direct, OXLA_ACC(true), a, lda) }
#undef OXLA_ACC
#undef OXLA_ROWS
  }
}

void tile(const Job& j, int64_t b, const Panel& q, const KBlock& kb, const float* ap) {
  int64_t r0 = j.row(b);
  tile_rows((int)(j.row(b + 1) - r0), j.K, kb, j.A + r0 * j.K, j.K, ap, j.Bp, q, j.bias,
            j.C + r0 * j.N, j.N, j.residual ? j.residual + r0 * j.N : nullptr, j.act, j.lo, j.hi);
}

// Row blocks [b0, b1) times column panels [p0, p1). (K blocks as the convolution's were slower
// here: BERT-base's 128 x 3072 x 768 product 7.9 -> 8.8 ms on one core.)
void run_range(const Job& j, int64_t b0, int64_t b1, int64_t p0, int64_t p1) {
  KBlock whole{0, j.K, true, true};
  if (j.direct) {
    for (int64_t b = b0; b < b1; ++b)
      each_span(j.N, p0, p1, [&](const Panel& q) { tile(j, b, q, whole, nullptr); });
    return;
  }
  // W not read in place: each of its panels over all the rows. A share of the rows is packed
  // first; a share of the panels (by_rows false) reads all of X's rows in place.
  thread_local std::vector<float> buf;
  if (j.by_rows) {
    buf.resize((size_t)((b1 - b0) * MR * j.K));
    for (int64_t b = b0; b < b1; ++b) {
      int64_t r0 = j.row(b);
      int r = (int)(j.row(b + 1) - r0);
      const float* a = j.A + r0 * j.K;
      float* dst = buf.data() + (b - b0) * MR * j.K;
      for (int64_t k = 0; k < j.K; ++k)
        for (int i = 0; i < r; ++i) dst[k * r + i] = a[i * j.K + k];
    }
  }
  each_span(j.N, p0, p1, [&](const Panel& q) {
    for (int64_t b = b0; b < b1; ++b)
      tile(j, b, q, whole, j.by_rows ? buf.data() + (b - b0) * MR * j.K : nullptr);
  });
}

// Parts per thread, in rounds of halving size (`Part`): finer parts let a late pool thread take a
// share (EfficientNet-B0: the pool's thread ran 41% of the parts with 2, 4 or 8 per thread), and
// the last, small ones let the threads end together. Two equal parts per thread before: the caller
// then waited for the other thread 2.8-3.1 ms a call of ResNet-50 at default threads (the pool's
// thread starting 24-36 us late, each part 1/4 of a kernel), 1.8 ms of DBNet-style's, 0.57-0.68
// ms of EfficientNet-B0's (spinning helpers); with 4 rounds 1.07, 0.65-0.86 and 0.17-0.24 ms.
// Sessions of both in one process, blocks interleaved, default threads (2 cores, Intel AVX-512):
// ResNet-50 0.965x the time, DBNet-style 0.953x, EfficientNet-B0 0.950x, MobileNetV3-small
// 0.948x, the detector 0.952x, ShuffleNetV2 0.996x, ViT-S/16 0.990x; 3 or 5 rounds gained less.
constexpr int CHUNKS_PER_THREAD = 4;

// Part `index` of a kernel's `count` parts on `threads` threads (`parallel`): the parts come in
// rounds of one per thread, each round's parts half the size of the last one's (count / threads
// rounds), so that the threads, claiming them in order, end within a small part of each other.
struct Part {
  int index, count, threads;
  // Where part i starts in n items: n times the weight of the parts before it over the total.
  int64_t start(int64_t n, int i) const {
    if (i >= count) return n;
    int rounds = count / threads, round = i / threads;
    int64_t total = (int64_t)threads * ((1 << rounds) - 1);
    int64_t before = (int64_t)threads * ((1 << rounds) - (1 << (rounds - round))) +
                     (int64_t)(i % threads) * (1 << (rounds - 1 - round));
    return n * before / total;
  }
  int64_t lo(int64_t n) const { return start(n, index); }
  int64_t hi(int64_t n) const { return start(n, index + 1); }
};

// Whether the parts of a product on `threads` threads split its rows (else its column panels):
// where W is read in place, when there are enough row blocks; where it is not (`direct`), each
// part of the rows reads all of W once more, and each part of the panels all of X, from L2 or
// L3: the rows when X is the larger. A share of the panels reads X in place (packing all of X
// for each part cost more than the product of the smaller ones). With 4 rounds of parts every
// product split its rows: BERT-base's 128x3072x768 (W 9.4 MB) took 1.33x the time of two equal
// parts per thread. Against two rounds of row parts, the kernel alone at two threads: 128x768x768
// 0.69x the time, 128x3072x768 0.74x, 49x2048x512 0.73x, 49x512x2048 0.86x; onnxruntime's
// 0.94-1.03x the time (the build before 1.09-1.39x; a run in a slow phase of the host measured
// 1.27-1.53x against onnxruntime for three of them); one thread 0.90-1.0x.
bool gemm_split(const Job& j, int threads) {
  int64_t panels = (j.N + NR - 1) / NR;
  if (panels < CHUNKS_PER_THREAD * threads) return true;
  return j.blocks >= 8 * threads && (j.direct || j.M >= j.N);
}

// A part of the product (`gemm_split`).
void run_part(const Job& j, const Part& p) {
  int64_t panels = (j.N + NR - 1) / NR;
  if (j.by_rows)
    run_range(j, p.lo(j.blocks), p.hi(j.blocks), 0, panels);
  else
    run_range(j, 0, j.blocks, p.lo(panels), p.hi(panels));
}

// A kernel's work is cut into `chunks` parts that the caller and the intra-op pool's threads (or
// oxla's helpers) claim one at a time through `ticket` (generation << 32 | next part). A pool
// thread that starts late finds nothing left, and the caller, which never waits for a part nobody
// claimed, has done the work itself. The team outlives every call, so a late pool task only reads
// its ticket.
using PartFn = void (*)(const void* ctx, const Part& part);

struct Team {
  std::mutex busy;  // one parallel call at a time; a concurrent one runs on its caller alone
  std::atomic<uint64_t> ticket{0};
  std::atomic<int64_t> finished{0};  // parts done in the current call
  PartFn fn = nullptr;
  const void* ctx = nullptr;
  int chunks = 1, threads = 1;
  uint64_t gen = 0;
  std::atomic<int> caller_cpu{-1};  // the core the calling thread ran on when it posted its parts

  // Claim and run parts of generation `g` until none is left.
  void work(uint64_t g) {
    for (;;) {
      uint64_t t = ticket.load(std::memory_order_acquire);
      if ((t >> 32) != g || (int64_t)(t & 0xFFFFFFFFu) >= chunks) return;
      if (!ticket.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel)) continue;
      fn(ctx, Part{(int)(t & 0xFFFFFFFFu), chunks, threads});
      finished.fetch_add(1, std::memory_order_release);
    }
  }
};

// A pool task the kernel woke that the guest's scheduler started on the calling thread's own core
// (the other one idle) preempts the caller there: the caller's Schedule did not return until the
// task had run every part, 25-45 us a call in some blocks of 60 calls (576@14 depthwise), and the
// woken thread, last run on that core, was woken there again next call. Yielding the core at once
// ends that: the caller goes on with the parts, and the task's thread moves to the idle core.
// One process, 20 rounds of 60 two-thread calls each way, onnxruntime's blocks interleaved: of
// 1200 calls 250 / 316 had started their task on the caller's core, 15 / 0 with the yield;
// 576@14 73.0 -> 55.6 us a call, MobileNetV2's 960@7 48.8 -> 33.6 us (onnxruntime 74.9, 41.2).
inline void step_aside(int caller_cpu) {
  if (caller_cpu >= 0 && sched_getcpu() == caller_cpu) sched_yield();
}

Team* team() {
  static Team* t = new Team();  // never freed: late pool tasks may still read it at exit
  return t;
}

// ---- oxla's spinning helpers ------------------------------------------------------------------
//
// On oxla's one-thread client (a segment of small kernels: cpu_client.prefers_one_thread) XLA's
// loops run on the caller alone, since waking the intra-op pool's sleeping thread costs 25-40 us
// a kernel on these VMs. The kernels here then split their parts with helpers of their own, which
// after each part spin for SPIN_NS (as onnxruntime's pool threads do between its kernels) before
// they sleep: between two kernels of a model the helper is still spinning and joins the next one
// within a cache line's transfer. MobileNetV3-small at default threads (2 cores), every 1x1 and
// depthwise convolution on the kernels, one-thread client: 2.26 ms with the kernels on the
// caller alone, 1.54 ms with a spinning helper (onnxruntime 1.36).
// Spinning for 100 us instead: 3% slower; for 1000 us: equal.
constexpr int64_t SPIN_NS = 300000;
// A kernel takes no more helpers than gives each thread this much work (~1-2 us): on two cores
// only kernels under 1e5 flops stay on the caller (models of small kernels send none of those
// here: native_gemm.SMALL_MIN_FLOPS); a bound for machines with many cores, where a small
// kernel cut into 2 parts per core would cost more in claims than it computes. Not measured
// beyond two cores.
constexpr double SPIN_FLOPS_PER_THREAD = 5e4;

struct Helper {
  std::mutex m;
  std::condition_variable cv;
  std::atomic<int> asleep{0};
};

// A helper's life: spin on the team's ticket, run the parts of each new generation, sleep after
// SPIN_NS without one.
void helper_loop(Team* t, Helper* h) {
  using clock = std::chrono::steady_clock;
  uint64_t seen = t->ticket.load(std::memory_order_acquire) >> 32;
  for (;;) {
    auto last = clock::now();
    for (int n = 1;; ++n) {
      uint64_t g = t->ticket.load(std::memory_order_acquire) >> 32;
      if (g != seen) {
        seen = g;
        t->work(g);
        last = clock::now();
        continue;
      }
      _mm_pause();
      if ((n & 63) == 0 && (clock::now() - last).count() > SPIN_NS) break;
    }
    std::unique_lock<std::mutex> lk(h->m);
    h->asleep.store(1, std::memory_order_seq_cst);
    h->cv.wait(lk, [&] { return (t->ticket.load(std::memory_order_seq_cst) >> 32) != seen; });
    h->asleep.store(0, std::memory_order_relaxed);
  }
}

// The helpers started so far (at most cores - 1; never stopped). A forked child starts its own.
std::vector<Helper*>* helpers = new std::vector<Helper*>();
[[maybe_unused]] const int forked = pthread_atfork(nullptr, nullptr,
                                                   [] { helpers = new std::vector<Helper*>(); });

// Post generation g's parts to `n` helpers (started on first use), waking any that sleeps.
void post_to_helpers(Team* t, uint64_t g, int n) {
  while ((int)helpers->size() < n) {
    Helper* h = new Helper();
    try {
      std::thread(helper_loop, t, h).detach();
    } catch (const std::system_error&) {  // no thread to be had: the caller runs the parts
      delete h;
      break;
    }
    helpers->push_back(h);
  }
  t->ticket.store(g << 32, std::memory_order_seq_cst);
  for (Helper* h : *helpers)
    if (h->asleep.load(std::memory_order_seq_cst)) {
      std::lock_guard<std::mutex> lk(h->m);
      h->cv.notify_one();
    }
}

// fn(ctx, part, parts) over every part on `threads` threads: the intra-op pool's where it has
// enough, when the work is worth a wake (below 4e5 flops, ~3 us); else oxla's spinning helpers,
// up to SPIN_FLOPS_PER_THREAD (a bound of 1e5 or 4e5 flops for any helper: MobileNetV3-small
// 1.01x and 1.06x the time).
void parallel(PartFn fn, const void* ctx, int threads, double flops, ffi::ThreadPool& pool,
              int per_thread = CHUNKS_PER_THREAD) {
  bool spin = pool.num_threads() < threads;
  if (spin && flops < SPIN_FLOPS_PER_THREAD * threads)  // (below 1e5 flops: the caller alone)
    threads = std::max(1, (int)(flops / SPIN_FLOPS_PER_THREAD));
  if (threads > 1 && (spin || flops >= 4e5)) {
    Team* t = team();
    std::unique_lock<std::mutex> lock(t->busy, std::try_to_lock);
    if (lock.owns_lock()) {
      // close the last generation before its fields change: a thread that read its ticket before
      // (a helper, or a pool task that started late) would otherwise claim a part past its end
      // against the new part count, and its CAS on the unchanged ticket would succeed
      t->ticket.store((t->gen << 32) | 0xFFFFFFFFu, std::memory_order_seq_cst);
      uint64_t g = (t->gen + 1) & 0xFFFFFFFFu;
      t->gen = g;
      t->fn = fn;
      t->ctx = ctx;
      t->chunks = per_thread * threads;
      t->threads = threads;
      t->finished.store(0, std::memory_order_relaxed);
      if (spin) {
        post_to_helpers(t, g, threads - 1);
      } else {
        t->caller_cpu.store(sched_getcpu(), std::memory_order_relaxed);
        t->ticket.store(g << 32, std::memory_order_release);
        for (int i = 0; i < threads - 1; ++i)
          pool.Schedule([t, g] {
            step_aside(t->caller_cpu.load(std::memory_order_relaxed));
            t->work(g);
          });
      }
      t->work(g);
      // a part another thread took: if that thread lost its core, let it have this one
      for (int n = 1; t->finished.load(std::memory_order_acquire) < t->chunks; ++n) {
        _mm_pause();
        if ((n & 1023) == 0) std::this_thread::yield();
      }
      return;
    }
  }
  fn(ctx, Part{0, 1, 1});
}

void gemm_part(const void* ctx, const Part& part) {
  run_part(*static_cast<const Job*>(ctx), part);
}

// The threads a call may use: its attribute, capped by the machine (past the client's pool's,
// oxla's helpers: `parallel`) and, for the recurrences (`pooled`, which run on the pool's threads
// alone), by the client's pool.
int usable(int64_t threads, ffi::ThreadPool& pool, bool pooled = false) {
  int64_t in_pool = pool.num_threads();
  if (pooled && in_pool > 0 && threads > in_pool) threads = in_pool;
  // asked once: glibc reads /sys/devices/system/cpu/online for it (an open, a read and a close:
  // 25-30 us a call on these VMs, more than many kernels take)
  static const unsigned cores = std::thread::hardware_concurrency();
  if (cores > 0 && threads > (int64_t)cores) threads = cores;
  return threads < 1 ? 1 : (int)threads;
}

ffi::Error Sgemm(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                 ffi::Buffer<ffi::F32> bias, ffi::Buffer<ffi::F32> residual,
                 ffi::ResultBuffer<ffi::F32> y, int64_t threads, int64_t act, float lo,
                 float hi) {
  auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() < 1 || wd.size() != 3 || wd[2] != NR || yd.size() != xd.size())
    return ffi::Error::InvalidArgument("oxla_sgemm: operand ranks");
  int64_t K = xd[xd.size() - 1], N = yd[yd.size() - 1];
  int64_t M = 1;
  for (size_t i = 0; i + 1 < xd.size(); ++i) {
    if (xd[i] != yd[i]) return ffi::Error::InvalidArgument("oxla_sgemm: batch dimensions");
    M *= xd[i];
  }
  if (wd[1] != K || wd[0] * NR < N || wd[0] * NR >= N + NR)
    return ffi::Error::InvalidArgument("oxla_sgemm: packed weight shape");
  if ((int64_t)bias.element_count() != N)
    return ffi::Error::InvalidArgument("oxla_sgemm: bias length");
  int64_t nr = residual.element_count();
  if (nr != 0 && nr != M * N) return ffi::Error::InvalidArgument("oxla_sgemm: residual shape");
  if (act < NONE || act > HARD_SWISH) return ffi::Error::InvalidArgument("oxla_sgemm: act");
  if (M == 0 || N == 0) return ffi::Error::Success();
  Job j;
  j.A = x.typed_data();
  j.Bp = w.typed_data();
  j.bias = bias.typed_data();
  j.residual = nr ? residual.typed_data() : nullptr;
  j.C = y->typed_data();
  j.M = M;
  j.K = K;
  j.N = N;
  j.blocks = (M + MR - 1) / MR;
  j.act = act;
  j.lo = lo;
  j.hi = hi;
  j.direct = K * N * 4 <= direct_w_bytes();
  int used = usable(threads, pool);
  j.by_rows = gemm_split(j, used);
  double flops = 2.0 * (double)M * (double)K * (double)N;
  // below ~3 us of work the caller alone; the rows of a W not read in place in two rounds of
  // parts (each part reads all of W)
  parallel(gemm_part, &j, used, flops, pool, j.by_rows && !j.direct ? 2 : CHUNKS_PER_THREAD);
  return ffi::Error::Success();
}

// ---- Convolution, channels last (implicit GEMM) ---------------------------------------------
//
// Y[n, oh, ow, :] = act(sum_{i, j, c} X[n, oh*sh - pt + i*dh, ow*sw - pl + j*dw, c] W[i, j, c, :]
//                       + bias (+ R[n, oh, ow, :])), taps outside X reading zero.
// W (KH, KW, C, M) is packed like a GEMM's (K = KH KW C); output pixels are the rows. Each block
// of MR pixels has its rows of the im2col matrix copied (C floats per tap, zeros outside X) into
// a thread-local buffer that stays in L1/L2 while every panel of W passes over it: no im2col
// tensor in memory, no padded copy of X. Two threads, against XLA:CPU's convolution (or its
// im2col dot) and onnxruntime, ms: 3x3 64->64 at 56 0.67 / 0.97 / 0.56, 512->512 at 7 0.87 /
// 2.87 / 0.68, 7x7/2 stem 3->64 at 224 0.87 / 0.99 / 0.67 (docs/benchmarks.md, tenth round).
// Grouped windows whose groups' outputs fit one panel read X in place instead (conv_grouped).

struct ConvJob {
  const float* X;
  const float* Bp;
  const float* bias;
  const float* residual;  // nullptr, or R with Y's shape
  float* Y;
  int64_t N, H, W, C, OH, OW, M;  // M: output channels; C: channels a group reads
  int64_t KH, KW, sh, sw, dh, dw, pt, pl;
  int64_t K, rows, blocks;
  // groups of C input and MS = M / groups output channels (CX = groups C), each group's W its own
  // PP panels (the last one's columns past MS zero): PANELS = groups PP
  int64_t groups = 1, CX, MS, PP, PANELS;
  int64_t act;
  float lo, hi;
  uint64_t call;  // this call's number (conv_calls): a thread's im2col rows of it are kept
  int64_t row(int64_t b) const { return rows * b / blocks; }
};

// Numbers the convolution calls, so that a thread that runs several parts of one call that each
// cover every block (the split by W's panels) makes the im2col rows once, not once per part.
std::atomic<uint64_t> conv_calls{0};

// n floats from s to d (zeros when s is nullptr), L lanes at a time: the copies are short (C
// floats, or KW C when a kernel row lies inside X), where a memcpy call costs more than the move.
inline void copy_floats(float* d, const float* s, int64_t n) {
  int64_t i = 0;
  for (; i + L <= n; i += L) v_store(d + i, s ? v_load(s + i) : v_zero());
  if (i < n) {
    Mask m = lanes(n - i);
    v_store_m(d + i, m, s ? v_load_m(s + i, m) : v_zero());
  }
}

// The im2col rows of output pixels [m0, m0 + r), each K floats, into dst: group g's channels.
void im2col_rows(const ConvJob& j, int64_t m0, int r, float* dst, int64_t g = 0) {
  const int64_t ohw = j.OH * j.OW, wc = j.KW * j.C;
  for (int i = 0; i < r; ++i) {
    int64_t m = m0 + i, n = m / ohw, p = m % ohw, oh = p / j.OW, ow = p % j.OW;
    const float* xn = j.X + n * j.H * j.W * j.CX + g * j.C;
    float* d = dst + i * j.K;
    int64_t iw0 = ow * j.sw - j.pl;
    bool inside = iw0 >= 0 && iw0 + (j.KW - 1) * j.dw < j.W;
    for (int64_t a = 0; a < j.KH; ++a, d += wc) {
      int64_t ih = oh * j.sh - j.pt + a * j.dh;
      if (ih < 0 || ih >= j.H) {
        copy_floats(d, nullptr, wc);
        continue;
      }
      const float* xr = xn + ih * j.W * j.CX;
      if (inside && j.dw == 1 && j.groups == 1) {
        copy_floats(d, xr + iw0 * j.C, wc);
        continue;
      }
      for (int64_t b = 0; b < j.KW; ++b) {
        int64_t iw = iw0 + b * j.dw;
        copy_floats(d + b * j.C, iw < 0 || iw >= j.W ? nullptr : xr + iw * j.CX, j.C);
      }
    }
  }
}

// Im2col rows held per group of blocks: while they fit here, one panel of W (K x 32) passes over
// all of them. A W over CONV_WIDE_W_BYTES is read once per group, so its groups are as large as
// CONV_ROWS_MAX_BYTES allows (512 channels at 7x7: 49 rows of 4608, W 9.4 MB read once, not once
// per block).
constexpr int64_t CONV_ROWS_BYTES = 128 << 10;
constexpr int64_t CONV_ROWS_MAX_BYTES = 4 << 20;

// A grouped convolution's tile read from X in place, no im2col: term (t, c) of row i is
// P[t MR + i][off + c], P[t MR + i] the pixel tap t of the row reads (zeros outside X), off the
// group's first channel; Bp the panel's (taps C, NR) floats. Accumulated over every tap in
// registers; one K block (KC_MAX) only.
template <int R, int NV, bool MASK>
inline void tile_taps(int64_t taps, int64_t C, const float* const* P, int64_t off,
                      const float* __restrict Bp, float* Y, int64_t ldc, const float* bias,
                      Mask m0, Mask m1, const Epilogue* e) {
  V c0[R], c1[R];
  tile_start<R, NV, MASK, false>(c0, c1, Y, ldc, m0, m1);
  for (int64_t t = 0; t < taps; ++t, P += MR) {
    const float* a[R];
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) a[i] = P[i] + off;
    for (int64_t k = 0; k < C; ++k) {
      V b0 = v_load(Bp);
      V b1 = NV == 2 ? v_load(Bp + L) : b0;
#pragma GCC unroll 16
      for (int i = 0; i < R; ++i) {
        V av = v_set(a[i][k]);
        c0[i] = v_fma(av, b0, c0[i]);
        if (NV == 2) c1[i] = v_fma(av, b1, c1[i]);
      }
      Bp += NR;
    }
  }
  store_tile<R, NV, MASK>(c0, c1, Y, ldc, bias, m0, m1, e);
}

template <int NV, bool MASK>
void taps_rows(int r, int64_t taps, int64_t C, const float* const* P, int64_t off,
               const float* Bp, float* Y, int64_t ldc, const float* bias, Mask m0, Mask m1,
               const Epilogue* e) {
  switch (r) {
#define OXLA_R(n) \
  case n: if constexpr (n <= MR) tile_taps<n, NV, MASK>(taps, C, P, off, Bp, Y, ldc, bias, m0, m1, e); break;
    OXLA_R(1) OXLA_R(2) OXLA_R(3) OXLA_R(4) OXLA_R(5) OXLA_R(6)
    OXLA_R(7) OXLA_R(8) OXLA_R(9) OXLA_R(10) OXLA_R(11) OXLA_R(12)
#undef OXLA_R
  }
}

// Groups of 4 channels in and 4 out (ResNeXt-50's first stage), 4 groups to a block of 16 output
// channels: lane l of a row's 16 outputs sums, over the taps and its group's 4 inputs j, X's
// channel 4 (l / 4) + j (v_quad of the row's 16 inputs) times Q[t][j][l], its weight. 4
// multiply-adds and 4 in-lane permutes a row and tap, where the 16 x 16 block-diagonal W of 4
// groups took 16 multiply-adds, three quarters of them on zeros. Q: the block's (taps, 4, 16).
// ResNeXt-50's 3x3 128 -> 128 at 56x56 (32 groups), the kernel alone against the block-diagonal
// build, onnxruntime interleaved: one thread 0.33-0.34x onnxruntime's time where it took
// 0.66x, default threads 0.36-0.41x where 0.70-0.79x. The whole model (three such layers), one
// core: 0.93-0.97x the time in three runs; at default threads within the runs' spread (0.94x to
// 1.08x, the first session built the slower in each).
template <int R>
inline void tile_quads(int64_t taps, const float* const* P, int64_t off, const float* Q, float* Y,
                       int64_t ldc, const float* bias, const Epilogue* e) {
  constexpr int NV = 16 / L;
  const Mask all = lanes(L);
  V c0[R], c1[R];
  tile_start<R, NV, false, false>(c0, c1, Y, ldc, all, all);
  for (int64_t t = 0; t < taps; ++t, P += MR, Q += 64) {
    V w0[4], w1[4];
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {
      w0[q] = v_load(Q + 16 * q);
      w1[q] = NV == 2 ? v_load(Q + 16 * q + L) : w0[q];
    }
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      const float* x = P[i] + off;
      V x0 = v_load(x);
      c0[i] = v_fma(v_quad<0>(x0), w0[0], c0[i]);
      c0[i] = v_fma(v_quad<1>(x0), w0[1], c0[i]);
      c0[i] = v_fma(v_quad<2>(x0), w0[2], c0[i]);
      c0[i] = v_fma(v_quad<3>(x0), w0[3], c0[i]);
      if (NV == 2) {
        V x1 = v_load(x + L);
        c1[i] = v_fma(v_quad<0>(x1), w1[0], c1[i]);
        c1[i] = v_fma(v_quad<1>(x1), w1[1], c1[i]);
        c1[i] = v_fma(v_quad<2>(x1), w1[2], c1[i]);
        c1[i] = v_fma(v_quad<3>(x1), w1[3], c1[i]);
      }
    }
  }
  store_tile<R, NV, false>(c0, c1, Y, ldc, bias, all, all, e);
}

void quads_rows(int r, int64_t taps, const float* const* P, int64_t off, const float* Q, float* Y,
                int64_t ldc, const float* bias, const Epilogue* e) {
  switch (r) {
#define OXLA_R(n) \
  case n: if constexpr (n <= MR) tile_quads<n>(taps, P, off, Q, Y, ldc, bias, e); break;
    OXLA_R(1) OXLA_R(2) OXLA_R(3) OXLA_R(4) OXLA_R(5) OXLA_R(6)
    OXLA_R(7) OXLA_R(8) OXLA_R(9) OXLA_R(10) OXLA_R(11) OXLA_R(12)
#undef OXLA_R
  }
}

// Whether a grouped job runs on tile_quads: groups of 4 in and 4 out, whole blocks of 16.
inline bool quads(const ConvJob& j) { return j.C == 4 && j.MS == 4 && j.M % 16 == 0; }

// The pixels block b's rows read at each tap (tile_taps' P: taps x MR), zeros where the tap lies
// outside X.
void tap_pointers(const ConvJob& j, int64_t b, const float* zeros, const float** P) {
  const int64_t ohw = j.OH * j.OW, r0 = j.row(b), r = j.row(b + 1) - r0;
  for (int64_t i = 0; i < r; ++i) {
    int64_t m = r0 + i, n = m / ohw, p = m % ohw, oh = p / j.OW, ow = p % j.OW;
    const float* xn = j.X + n * j.H * j.W * j.CX;
    for (int64_t a = 0, t = 0; a < j.KH; ++a) {
      int64_t ih = oh * j.sh - j.pt + a * j.dh;
      for (int64_t c = 0; c < j.KW; ++c, ++t) {
        int64_t iw = ow * j.sw - j.pl + c * j.dw;
        P[t * MR + i] = ih < 0 || ih >= j.H || iw < 0 || iw >= j.W ? zeros
                                                                    : xn + (ih * j.W + iw) * j.CX;
      }
    }
  }
}

// Blocks per table of tap_pointers (each KH KW MR pointers) in conv_grouped.
constexpr int64_t TAP_TABLE_POINTERS = 8192;

// conv_range for a window over groups of at most one panel of outputs (one K block): X read in
// place (tile_taps), where each group's im2col rows (C floats a tap, copied from X's pixels at
// stride CX, the row's n, oh, ow divided out again for every group) took a third of the time on
// ResNeXt-50's 16-channel groups at 14x14. Blocks in runs whose tap tables fit
// TAP_TABLE_POINTERS; each panel passes over a run's blocks, its group's channels of their
// pixels staying in cache. ResNeXt-50 (groups of 4 packed 4 at a time, 8 two at a time, 16 and
// 32), in one process against the build before, onnxruntime interleaved: default threads
// 0.89-0.94x the time (five runs), one core 0.73x and 0.92x. Single layers alone swing with
// where the host puts the pool's threads: from 0.7x to 1.5x of either build, run to run. Groups
// of two whole panels or more (AlexNet's 128) keep the im2col rows and their 6 x 64 tiles: there
// this path took 1.1x the time.
void conv_grouped(const ConvJob& j, int64_t b0, int64_t b1, int64_t p0, int64_t p1) {
  const int64_t taps = j.KH * j.KW, per = taps * MR;
  int64_t run = TAP_TABLE_POINTERS / per;
  if (run < 1) run = 1;
  thread_local std::vector<const float*> table;
  thread_local std::vector<float> zeros;
  if ((int64_t)zeros.size() < j.CX) zeros.assign((size_t)j.CX, 0.0f);
  table.resize((size_t)(per * (run < b1 - b0 ? run : b1 - b0)));
  // tile_quads' weights for panels [p0, p1), 4 groups' a block (conv_part splits them so): each
  // group's 4 columns of its panel (K = 4 taps), once for all the blocks
  thread_local std::vector<float> q;
  if (quads(j)) {
    q.resize((size_t)(taps * 16 * (p1 - p0)));
    for (int64_t p = p0; p < p1; p += 4)
      for (int64_t t = 0; t < taps; ++t)
        for (int64_t k = 0; k < 4; ++k)
          for (int64_t l = 0; l < 16; ++l)
            q[(size_t)(((p - p0) / 4 * taps + t) * 64 + k * 16 + l)] =
                j.Bp[(p + l / 4) * NR * j.K + (t * 4 + k) * NR + l % 4];
  }
  for (int64_t g0 = b0; g0 < b1; g0 += run) {
    int64_t g1 = g0 + run < b1 ? g0 + run : b1;
    for (int64_t b = g0; b < g1; ++b) tap_pointers(j, b, zeros.data(), table.data() + (b - g0) * per);
    if (quads(j)) {
      for (int64_t p = p0; p < p1; p += 4) {
        const float* qp = q.data() + (p - p0) / 4 * taps * 64;
        for (int64_t b = g0; b < g1; ++b) {
          int64_t r0 = j.row(b);
          Epilogue e{j.residual ? j.residual + r0 * j.M + 4 * p : nullptr, j.M, j.act, j.lo, j.hi};
          quads_rows((int)(j.row(b + 1) - r0), taps, table.data() + (b - g0) * per, 4 * p, qp,
                     j.Y + r0 * j.M + 4 * p, j.M, j.bias + 4 * p, &e);
        }
      }
      continue;
    }
    for (int64_t p = p0; p < p1; ++p) {
      int64_t s = p / j.PP, i = p - s * j.PP, n0 = s * j.MS + i * NR;
      int64_t ncp = j.MS - i * NR < NR ? j.MS - i * NR : NR;
      for (int64_t u = 0; u < ncp; u += TC) {
        int64_t nc = ncp - u < TC ? ncp - u : TC;
        const float* bp = j.Bp + p * NR * j.K + u;
        const float* bias = j.bias + n0 + u;
        Mask m0 = lanes(nc), m1 = lanes(nc - L);
        for (int64_t b = g0; b < g1; ++b) {
          int64_t r0 = j.row(b);
          int r = (int)(j.row(b + 1) - r0);
          const float* const* P = table.data() + (b - g0) * per;
          float* y = j.Y + r0 * j.M + n0 + u;
          Epilogue e{j.residual ? j.residual + r0 * j.M + n0 + u : nullptr, j.M, j.act, j.lo, j.hi};
          if (nc == TC) taps_rows<2, false>(r, taps, j.C, P, s * j.C, bp, y, j.M, bias, m0, m1, &e);
          else if (nc > L) taps_rows<2, true>(r, taps, j.C, P, s * j.C, bp, y, j.M, bias, m0, m1, &e);
          else if (nc == L) taps_rows<1, false>(r, taps, j.C, P, s * j.C, bp, y, j.M, bias, m0, m1, &e);
          else taps_rows<1, true>(r, taps, j.C, P, s * j.C, bp, y, j.M, bias, m0, m1, &e);
        }
      }
    }
  }
}

void conv_range(const ConvJob& j, int64_t b0, int64_t b1, int64_t p0, int64_t p1) {
  if (j.groups > 1 && j.MS <= NR && (j.KH * j.KW > 1 || quads(j)) && k_blocks(j.K) == 1) {
    conv_grouped(j, b0, b1, p0, p1);
    return;
  }
  int64_t row_bytes = MR * j.K * (int64_t)sizeof(float);
  bool wide = j.K * ((j.M + NR - 1) / NR) * NR * (int64_t)sizeof(float) > CONV_WIDE_W_BYTES;
  // no channels (K = 0): the bias alone, every block in one group
  int64_t group = row_bytes ? (wide ? CONV_ROWS_MAX_BYTES : CONV_ROWS_BYTES) / row_bytes : b1 - b0;
  if (group < 1) group = 1;
  if (group > b1 - b0) group = b1 - b0;
  int64_t nk = k_blocks(j.K);
  thread_local std::vector<float> buf;
  // A part that covers every block in one group (the split by W's panels: ResNet's 3x3 layers
  // at 7x7, 49 im2col rows of 4608) leaves them in buf, and the thread's later parts of the same
  // call (ConvJob::call) use them as they are, where each part made all of them again. The
  // kernel alone at two threads against the build before: 512 -> 512 at 7x7 0.90x and 0.95x the
  // time, 256 -> 256 0.93x; one thread equal.
  thread_local uint64_t buf_call = 0;  // the call whose every block buf holds (0: none)
  bool whole = b0 == 0 && b1 == j.blocks && group == b1 && j.groups == 1;
  // A 1x1 window at stride 1 without pads reads X's rows as they lie: a group's im2col row is
  // its C channels of the pixel, C floats in place at stride CX. ShuffleNet's grouped 1x1
  // convolutions (6 channels a group) spent most of their time copying them.
  bool in_place = j.KH == 1 && j.KW == 1 && j.sh == 1 && j.sw == 1 && j.pt == 0 && j.pl == 0
                  && j.OH == j.H && j.OW == j.W;
  bool kept = in_place || (whole && buf_call == j.call);
  buf_call = whole && !in_place ? j.call : 0;  // a part runs to its end on this thread
  if (!in_place) buf.resize((size_t)(group * MR * j.K));
  // W's panels [p0, p1) group by group (one group: all of them), each group's from its own
  // im2col rows; a group's panel i is its columns [32 i, 32 i + 32) of MS (fewer in its last),
  // at Y's columns s MS + 32 i (tile_rows reads W at Bp + n0 K: shifted to the packed panel)
  for (int64_t g0 = b0; g0 < b1; g0 += group) {
    int64_t g1 = g0 + group < b1 ? g0 + group : b1;
    for (int64_t q0 = p0; q0 < p1;) {
      int64_t s = q0 / j.PP, q1 = (s + 1) * j.PP < p1 ? (s + 1) * j.PP : p1;
      for (int64_t b = g0; b < g1 && !kept; ++b)
        im2col_rows(j, j.row(b), (int)(j.row(b + 1) - j.row(b)),
                    buf.data() + (b - g0) * MR * j.K, s);
      for (int64_t k = 0; k < nk; ++k) {
        KBlock kb = k_block(j.K, nk, k);
        for (int64_t p = q0; p < q1;) {
          int64_t i = p - s * j.PP;
          Panel q{s * j.MS + i * NR, j.MS - i * NR < NR ? j.MS - i * NR : NR};
          if (L == 16 && p + 1 < q1 && (i + 2) * NR <= j.MS) q.nc = 2 * NR;  // span_of's pairs
          const float* bp = j.Bp + (p * NR - q.n0) * j.K;
          for (int64_t b = g0; b < g1; ++b) {
            int64_t r0 = j.row(b);
            const float* a = in_place ? j.X + r0 * j.CX + s * j.C : buf.data() + (b - g0) * MR * j.K;
            tile_rows((int)(j.row(b + 1) - r0), j.K, kb, a, in_place ? j.CX : j.K,
                      nullptr, bp, q, j.bias, j.Y + r0 * j.M, j.M,
                      j.residual ? j.residual + r0 * j.M : nullptr, j.act, j.lo, j.hi);
          }
          p += q.panels();
        }
      }
      q0 = q1;
    }
  }
}

void conv_part(const void* ctx, const Part& p) {
  const ConvJob& j = *static_cast<const ConvJob*>(ctx);
  // tile_quads' blocks of 4 groups are split whole
  int64_t per = quads(j) ? 4 : 1, panels = j.PANELS / per;
  if (j.blocks >= 8 * p.threads || panels < p.count)
    conv_range(j, p.lo(j.blocks), p.hi(j.blocks), 0, j.PANELS);
  else
    conv_range(j, 0, j.blocks, per * p.lo(panels), per * p.hi(panels));
}

ffi::Error Sconv(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                 ffi::Buffer<ffi::F32> bias, ffi::Buffer<ffi::F32> residual,
                 ffi::ResultBuffer<ffi::F32> y, int64_t threads, int64_t act, float lo, float hi,
                 int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                 int64_t pt, int64_t pl, int64_t groups) {
  auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 4 || wd.size() != 3 || wd[2] != NR || yd.size() != 4 || xd[0] != yd[0])
    return ffi::Error::InvalidArgument("oxla_sconv: operand ranks");
  if (kh < 1 || kw < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1 || pt < 0 || pl < 0)
    return ffi::Error::InvalidArgument("oxla_sconv: window");
  // groups > 1: X's channels and Y's in `groups` equal groups, each group's W panels of its own
  if (groups < 1 || xd[3] % groups != 0 || yd[3] % groups != 0)
    return ffi::Error::InvalidArgument("oxla_sconv: groups");
  ConvJob j;
  j.N = xd[0]; j.H = xd[1]; j.W = xd[2]; j.CX = xd[3]; j.groups = groups; j.C = xd[3] / groups;
  j.OH = yd[1]; j.OW = yd[2]; j.M = yd[3];
  j.MS = j.M / groups; j.PP = (j.MS + NR - 1) / NR; j.PANELS = groups * j.PP;
  j.KH = kh; j.KW = kw; j.sh = sh; j.sw = sw; j.dh = dh; j.dw = dw; j.pt = pt; j.pl = pl;
  j.K = kh * kw * j.C;
  if (wd[1] != j.K || wd[0] != j.PANELS)
    return ffi::Error::InvalidArgument("oxla_sconv: packed weight shape");
  if ((int64_t)bias.element_count() != j.M)
    return ffi::Error::InvalidArgument("oxla_sconv: bias length");
  j.rows = j.N * j.OH * j.OW;
  int64_t nr = residual.element_count();
  if (nr != 0 && nr != j.rows * j.M) return ffi::Error::InvalidArgument("oxla_sconv: residual shape");
  if (act < NONE || act > HARD_SWISH) return ffi::Error::InvalidArgument("oxla_sconv: act");
  if (j.rows == 0 || j.M == 0) return ffi::Error::Success();
  j.X = x.typed_data();
  j.Bp = w.typed_data();
  j.bias = bias.typed_data();
  j.residual = nr ? residual.typed_data() : nullptr;
  j.Y = y->typed_data();
  j.blocks = (j.rows + MR - 1) / MR;
  j.act = act;
  j.lo = lo;
  j.hi = hi;
  j.call = conv_calls.fetch_add(1, std::memory_order_relaxed) + 1;
  double flops = 2.0 * (double)j.rows * (double)j.K * (double)j.M;
  parallel(conv_part, &j, usable(threads, pool), flops, pool);
  return ffi::Error::Success();
}

// ---- Winograd F(2x2, 3x3), channels last ---------------------------------------------------
//
// Y = act(conv3x3(X, g) + bias (+ R)), stride 1, padding 1, from U = G g G^T (16 positions, each
// (C, M) packed like a GEMM's W: (16, panels, C, NR)). Per block of tiles (2x2 output pixels
// each): V[p] = (B^T d B)[p] of every tile's 4x4 input d (zeros outside X), for each channel
// vector; 16 products M[p] = V[p] U[p] on the GEMM's micro-tiles (V read in place, rows of C);
// Y's 2x2 = A^T M A + bias, + R, activation, stored where it lies inside Y. The transforms are
// oxla/lowering/ops/winograd.py's (Lavin and Gray's B^T, A^T). A block holds its tiles' V and M
// (16 x tiles x (C + M) floats, thread-local) and reads all of U once: blocks are as large as
// make U's reads no more than V's and M's, at least WINO_BLOCK_BYTES of them and at most
// WINO_BLOCK_MAX_BYTES.

constexpr int64_t WINO_BLOCK_BYTES = 256 << 10;
// Blocks' V and M bounded (each thread's buffers): U of 2048 channels is 256 MiB.
constexpr int64_t WINO_BLOCK_MAX_BYTES = 4 << 20;
// A layer whose U is larger than this (256 channels: 4 MiB) takes one part per thread, not
// CHUNKS_PER_THREAD (measured against two equal ones): each part reads all of U. Default
// threads, onnxruntime interleaved: the DBNet-style segmenter (256 channels at 20x20, 512 at
// 10x10) 0.929x and 0.922x the time, ResNet-50 0.981x and 1.001x; at 1 MiB (128 channels) too,
// four 128-channel layers at 28x28 ran 1.08x.
constexpr int64_t WINO_ONE_PART_U_BYTES = 2 << 20;

struct WinoJob {
  const float* X;
  const float* Up;        // (16, panels, C, NR)
  const float* bias;      // (M,)
  const float* residual;  // nullptr, or R with Y's shape
  float* Y;
  int64_t N, H, W, C, M, TH, TW, tiles, panels;
  int64_t block;          // tiles per block
  int64_t act;
  float lo, hi;
};

// V (16, n, C) of tiles [t0, t0 + n).
void wino_in(const WinoJob& j, int64_t t0, int64_t n, float* vt) {
  const int64_t ps = n * j.C, per = j.TH * j.TW;
  for (int64_t i = 0; i < n; ++i) {
    int64_t t = t0 + i, img = t / per, ty = t % per / j.TW, tx = t % per % j.TW;
    const float* xn = j.X + img * j.H * j.W * j.C;
    const float* src[4][4];
    for (int a = 0; a < 4; ++a)
      for (int b = 0; b < 4; ++b) {
        int64_t y = 2 * ty - 1 + a, x = 2 * tx - 1 + b;
        src[a][b] = y >= 0 && y < j.H && x >= 0 && x < j.W ? xn + (y * j.W + x) * j.C : nullptr;
      }
    float* v = vt + i * j.C;
    for (int64_t c = 0; c < j.C; c += L) {
      int64_t nc = j.C - c;
      V d[4][4];
      for (int a = 0; a < 4; ++a)
        for (int b = 0; b < 4; ++b) d[a][b] = src[a][b] ? v_load_n(src[a][b] + c, nc) : v_zero();
      V r[4][4];  // B^T d
      for (int b = 0; b < 4; ++b) {
        r[0][b] = v_sub(d[0][b], d[2][b]);
        r[1][b] = v_add(d[1][b], d[2][b]);
        r[2][b] = v_sub(d[2][b], d[1][b]);
        r[3][b] = v_sub(d[1][b], d[3][b]);
      }
      for (int a = 0; a < 4; ++a) {  // (B^T d) B
        float* o = v + 4 * a * ps + c;
        v_store_n(o, nc, v_sub(r[a][0], r[a][2]));
        v_store_n(o + ps, nc, v_add(r[a][1], r[a][2]));
        v_store_n(o + 2 * ps, nc, v_sub(r[a][2], r[a][1]));
        v_store_n(o + 3 * ps, nc, v_sub(r[a][1], r[a][3]));
      }
    }
  }
}

// Y's pixels of tiles [t0, t0 + n) from their products M (16, n, M).
template <int64_t ACT>
void wino_out(const WinoJob& j, int64_t t0, int64_t n, const float* mt) {
  const int64_t ps = n * j.M, per = j.TH * j.TW;
  for (int64_t i = 0; i < n; ++i) {
    int64_t t = t0 + i, img = t / per, ty = t % per / j.TW, tx = t % per % j.TW;
    int64_t rows = 2 * ty + 1 < j.H ? 2 : 1, cols = 2 * tx + 1 < j.W ? 2 : 1;
    int64_t at = ((img * j.H + 2 * ty) * j.W + 2 * tx) * j.M;
    const float* m = mt + i * j.M;
    for (int64_t c = 0; c < j.M; c += L) {
      int64_t nc = j.M - c;
      V s[4][2];  // M A, row by row
      for (int a = 0; a < 4; ++a) {
        const float* q = m + 4 * a * ps + c;
        V m0 = v_load_n(q, nc), m1 = v_load_n(q + ps, nc), m2 = v_load_n(q + 2 * ps, nc),
          m3 = v_load_n(q + 3 * ps, nc);
        s[a][0] = v_add(v_add(m0, m1), m2);
        s[a][1] = v_sub(v_sub(m1, m2), m3);
      }
      V b = v_load_n(j.bias + c, nc);
      for (int64_t y = 0; y < rows; ++y)
        for (int64_t x = 0; x < cols; ++x) {
          V o = y == 0 ? v_add(v_add(s[0][x], s[1][x]), s[2][x])
                       : v_sub(v_sub(s[1][x], s[2][x]), s[3][x]);
          o = v_add(o, b);
          int64_t off = at + (y * j.W + x) * j.M + c;
          if (j.residual) o = v_add(o, v_load_n(j.residual + off, nc));
          v_store_n(j.Y + off, nc, activate<ACT>(o, j.lo, j.hi));
        }
    }
  }
}

// Tiles [t0, t0 + n).
void wino_block(const WinoJob& j, int64_t t0, int64_t n, float* vt, float* mt) {
  wino_in(j, t0, n, vt);
  int64_t blocks = (n + MR - 1) / MR;
  KBlock kb{0, j.C, true, false};  // products stored as they are (the epilogue is wino_out's)
  for (int p = 0; p < 16; ++p) {
    const float* a = vt + p * n * j.C;
    const float* bp = j.Up + p * j.panels * j.C * NR;
    float* c = mt + p * n * j.M;
    each_span(j.M, 0, j.panels, [&](const Panel& pq) {
      for (int64_t b = 0; b < blocks; ++b) {
        int64_t r0 = n * b / blocks, r1 = n * (b + 1) / blocks;
        tile_rows((int)(r1 - r0), j.C, kb, a + r0 * j.C, j.C, nullptr, bp, pq, nullptr,
                  c + r0 * j.M, j.M, nullptr, NONE, 0.0f, 0.0f);
      }
    });
  }
  switch (j.act) {
    case RELU: wino_out<RELU>(j, t0, n, mt); break;
    case CLIP: wino_out<CLIP>(j, t0, n, mt); break;
    case SILU: wino_out<SILU>(j, t0, n, mt); break;
    case HARD_SWISH: wino_out<HARD_SWISH>(j, t0, n, mt); break;
    default: wino_out<NONE>(j, t0, n, mt); break;
  }
}

// A part: a share of the tiles, all of U. (Where U outweighs the tiles, every tile and a share of
// U's panels was measured too: 4 layers of 256 channels at 14x14, in a model, 1.09x the time.)
void wino_part(const void* ctx, const Part& p) {
  const WinoJob& j = *static_cast<const WinoJob*>(ctx);
  int64_t t0 = p.lo(j.tiles), t1 = p.hi(j.tiles);
  int64_t block = std::min(j.block, t1 - t0);
  if (block < 1) return;
  thread_local std::vector<float> vt, mt;
  vt.resize((size_t)(16 * block * j.C));
  mt.resize((size_t)(16 * block * j.M));
  for (int64_t t = t0; t < t1; t += block)
    wino_block(j, t, std::min(block, t1 - t), vt.data(), mt.data());
}

ffi::Error Swino(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> u,
                 ffi::Buffer<ffi::F32> bias, ffi::Buffer<ffi::F32> residual,
                 ffi::ResultBuffer<ffi::F32> y, int64_t threads, int64_t act, float lo, float hi) {
  auto xd = x.dimensions(), ud = u.dimensions(), yd = y->dimensions();
  if (xd.size() != 4 || ud.size() != 4 || ud[0] != 16 || ud[3] != NR || yd.size() != 4)
    return ffi::Error::InvalidArgument("oxla_swino: operand ranks");
  WinoJob j;
  j.N = xd[0]; j.H = xd[1]; j.W = xd[2]; j.C = xd[3]; j.M = yd[3];
  if (yd[0] != j.N || yd[1] != j.H || yd[2] != j.W)
    return ffi::Error::InvalidArgument("oxla_swino: Y is not X's size");
  j.panels = (j.M + NR - 1) / NR;
  if (ud[1] != j.panels || ud[2] != j.C)
    return ffi::Error::InvalidArgument("oxla_swino: packed transform shape");
  if ((int64_t)bias.element_count() != j.M)
    return ffi::Error::InvalidArgument("oxla_swino: bias length");
  int64_t nr = residual.element_count();
  if (nr != 0 && nr != j.N * j.H * j.W * j.M)
    return ffi::Error::InvalidArgument("oxla_swino: residual shape");
  if (act < NONE || act > HARD_SWISH) return ffi::Error::InvalidArgument("oxla_swino: act");
  if (j.N * j.H * j.W * j.M == 0) return ffi::Error::Success();
  j.TH = (j.H + 1) / 2; j.TW = (j.W + 1) / 2;
  j.tiles = j.N * j.TH * j.TW;
  j.X = x.typed_data();
  j.Up = u.typed_data();
  j.bias = bias.typed_data();
  j.residual = nr ? residual.typed_data() : nullptr;
  j.Y = y->typed_data();
  j.act = act;
  j.lo = lo;
  j.hi = hi;
  // blocks of tiles that read U no more than their V and M, within the bounds above; each part
  // reads all of U: above WINO_ONE_PART_U_BYTES one part per thread
  int64_t u_bytes = 16 * j.panels * NR * j.C * (int64_t)sizeof(float);
  int64_t want = std::min(std::max(WINO_BLOCK_BYTES, u_bytes), WINO_BLOCK_MAX_BYTES);
  j.block = std::max<int64_t>(want / (64 * (j.C + j.M)), MR);
  double flops = 32.0 * (double)j.tiles * (double)j.C * (double)j.M;
  parallel(wino_part, &j, usable(threads, pool), flops, pool,
           u_bytes > WINO_ONE_PART_U_BYTES ? 1 : CHUNKS_PER_THREAD);
  return ffi::Error::Success();
}

// ---- Depthwise convolution, channels last (M output channels per input channel) -----------
//
// Y[n, oh, ow, c] = act(bias[c] + sum_{i, j} P(X)[n, oh*sh - pt + i*dh, ow*sw - pl + j*dw, c / M]
//                                        * W[i, j, c]), taps outside X reading zero,
// where P(X) = pre_act(X + pre_bias) (pre_act Relu, Clip or HardSwish) or X itself: the bias and
// activation of the layer that made X
// (a 1x1 convolution XLA computes), applied to each element as it is loaded, so that no pass of
// its own writes them (XLA had fused them into its taps loop).
// L channels (16 on AVX-512, 8 on AVX2) x DW_P output pixels of a row at a time (DW_P
// accumulators). Where a block's taps lie
// inside X's row and the kernel width and stride are ones it was compiled for, each input pixel
// of a kernel row is loaded once and feeds every tap that reads it (3x3 stride 1: 10 loads for 24
// multiply-adds, against one load per multiply-add); elsewhere (borders, other windows) one load
// per tap, taps outside X skipped. Work items are (image row, L channels), claimed in parts. On
// AVX2 the compiled rows take full blocks of channels only (unmasked loads), a last partial block
// goes one load per tap under its mask.
// A channel multiplier M > 1 (ONNX's group = X's channels, M of W's output channels each; Keras's
// depth_multiplier): a block of L output channels from c reads X's channels from c / M, one
// masked load permuted so that lane l holds channel (c + l) / M (MUL instances; M = 1 compiles
// as before).

constexpr int64_t NO_PRE = -1;  // pre_act when X is read as it is

struct DwJob {
  const float* X;  // (N, H, Wd, CX)
  const float* W;  // (KH, KW, C)
  const float* bias;
  const float* pre_bias;  // (CX,) when pre_act != NO_PRE
  float* Y;  // (N, OH, OW, C)
  const int32_t* idx;  // M > 1: per block of L output channels, each lane's X channel less c / M
  int64_t N, H, Wd, C, CX, M, OH, OW, KH, KW, sh, sw, dh, dw, pt, pl;
  int64_t cblocks, items;
  int64_t act, pre_act;
  float lo, hi, pre_lo, pre_hi;
};

// One block of L output channels from c: m its lanes; X's channels read from cx (c / M), under mx,
// permuted by idx when M > 1 (with M = 1, cx = c and neither mx nor idx is read).
struct DwLanes {
  Mask m, mx;
  VI idx;
  int64_t cx;
};

template <bool MUL>
inline DwLanes dw_lanes(const DwJob& j, int64_t cb) {
  int64_t c = cb * L;
  DwLanes d;
  d.m = lanes(j.C - c);
  if (MUL) {
    d.cx = c / j.M;
    d.mx = lanes(j.CX - d.cx);
    d.idx = vi_load(j.idx + cb * L);
  } else {
    d.cx = c;
  }
  return d;
}

inline V activate_rt(V v, int64_t act, float lo, float hi) {
  switch (act) {
    case RELU: return activate<RELU>(v, lo, hi);
    case CLIP: return activate<CLIP>(v, lo, hi);
    case SILU: return activate<SILU>(v, lo, hi);
    case HARD_SWISH: return activate<HARD_SWISH>(v, lo, hi);
    default: return v;
  }
}

// X's channels at `x` (channels [c, c + L) under m, all of them when FULL; with MUL channels
// [cx, cx + L) under mx, permuted to the output lanes) as the depthwise taps read them; pre_bias
// is in the output lanes.
template <int64_t PRE, bool FULL, bool MUL>
inline V load_x(const DwJob& j, const float* x, const DwLanes& d, V pre_bias) {
  V v = MUL ? v_perm(v_load_m(x, d.mx), d.idx) : FULL ? v_load(x) : v_load_m(x, d.m);
  if (PRE == NO_PRE) return v;
  return activate<PRE>(v_add(v, pre_bias), j.pre_lo, j.pre_hi);
}

// The pre-activation's bias in the output lanes of block d.
template <int64_t PRE, bool FULL, bool MUL>
inline V load_pre_bias(const DwJob& j, const DwLanes& d, V otherwise) {
  if (PRE == NO_PRE) return otherwise;
  if (MUL) return v_perm(v_load_m(j.pre_bias + d.cx, d.mx), d.idx);
  return FULL ? v_load(j.pre_bias + d.cx) : v_load_m(j.pre_bias + d.cx, d.m);
}

constexpr int DW_P = 8;  // output pixels per block

// DW_P output pixels from ow0 (the first P stored), each input pixel of a kernel row loaded once;
// CHECK: some of them lie outside X's row (they read zero).
template <int KW_, int SW_, int64_t PRE, bool CHECK, bool MUL>
inline void dw_fast(const DwJob& j, const float* xn, int64_t oh, int64_t ow0, int64_t c,
                    const DwLanes& d, float* y, int P) {
  constexpr int IN = (DW_P - 1) * SW_ + KW_;  // input pixels one kernel row reads
  constexpr bool F = !CHEAP_MASKS;  // channel blocks: masked on AVX-512, full on AVX2
  Mask m = d.m;
  V b = F ? v_load(j.bias + c) : v_load_m(j.bias + c, m);
  V pb = load_pre_bias<PRE, F, MUL>(j, d, b);
  V acc[DW_P];
#pragma GCC unroll 8
  for (int p = 0; p < DW_P; ++p) acc[p] = b;
  int64_t iw0 = ow0 * SW_ - j.pl;
  // The inputs [lo, hi) of a kernel row lie inside X's row. Those outside are skipped with their
  // multiply-adds, where each had been loaded as a zero (its address checked and multiplied
  // out). The kernel alone against the build before, onnxruntime interleaved, one thread / two:
  // 5x5 960@7 0.81x / 0.87x the time, 3x3 960@7 0.94x / 0.85x, 3x3 576@14 0.89x / 0.87x, 5x5
  // 240@14 0.83x / 0.88x, 5x5 144@28 0.83x; whole models, two sessions of each build in one
  // process: MobileNetV2, EfficientNet-B0, the detector and MobileNetV3-small 0.92-1.01x.
  // Rows above and below X were skipped so already: a padded tap adds nothing (where 0 x inf
  // would have made NaN).
  int64_t lo = iw0 < 0 ? -iw0 : 0, hi = j.Wd - iw0 < IN ? j.Wd - iw0 : IN;
  for (int64_t a = 0; a < j.KH; ++a) {
    int64_t ih = oh * j.sh - j.pt + a * j.dh;
    if (ih < 0 || ih >= j.H) continue;
    const float* xr = xn + ih * j.Wd * j.CX + d.cx;
    V w[KW_];
#pragma GCC unroll 8
    for (int t = 0; t < KW_; ++t) {
      const float* wt = j.W + (a * KW_ + t) * j.C + c;
      w[t] = F ? v_load(wt) : v_load_m(wt, m);
    }
#pragma GCC unroll 32
    for (int i = 0; i < IN; ++i) {
      if (CHECK && (i < lo || i >= hi)) continue;  // a zero: its multiply-adds change nothing
      V v = load_x<PRE, F, MUL>(j, xr + (iw0 + i) * j.CX, d, pb);
#pragma GCC unroll 8
      for (int t = 0; t < KW_; ++t) {
        int q = i - t;
        if (q >= 0 && q % SW_ == 0 && q / SW_ < DW_P)
          acc[q / SW_] = v_fma(v, w[t], acc[q / SW_]);
      }
    }
  }
#pragma GCC unroll 8
  for (int p = 0; p < DW_P; ++p) {
    if (p >= P) continue;
    V out = activate_rt(acc[p], j.act, j.lo, j.hi);
    if (F) v_store(y + p * j.C, out);
    else v_store_m(y + p * j.C, m, out);
  }
}

// P output pixels from ow, one load per tap; CHECK: some taps fall outside X's row.
template <int64_t PRE, int P, bool CHECK, bool MUL>
inline void dw_block(const DwJob& j, const float* xn, int64_t oh, int64_t ow, int64_t c,
                     const DwLanes& d, float* y) {
  Mask m = d.m;
  V b = v_load_m(j.bias + c, m);
  V pb = load_pre_bias<PRE, false, MUL>(j, d, b);
  V acc[P];
#pragma GCC unroll 8
  for (int p = 0; p < P; ++p) acc[p] = b;
  for (int64_t a = 0; a < j.KH; ++a) {
    int64_t ih = oh * j.sh - j.pt + a * j.dh;
    if (ih < 0 || ih >= j.H) continue;
    const float* xr = xn + ih * j.Wd * j.CX + d.cx;
    for (int64_t t = 0; t < j.KW; ++t) {
      V w = v_load_m(j.W + (a * j.KW + t) * j.C + c, m);
      int64_t iw0 = ow * j.sw - j.pl + t * j.dw;
#pragma GCC unroll 8
      for (int p = 0; p < P; ++p) {
        int64_t iw = iw0 + p * j.sw;
        if (CHECK && (iw < 0 || iw >= j.Wd)) continue;
        acc[p] = v_fma(load_x<PRE, false, MUL>(j, xr + iw * j.CX, d, pb), w, acc[p]);
      }
    }
  }
#pragma GCC unroll 8
  for (int p = 0; p < P; ++p)
    v_store_m(y + p * j.C, m, activate_rt(acc[p], j.act, j.lo, j.hi));
}

using DwFast = void (*)(const DwJob&, const float*, int64_t, int64_t, int64_t, const DwLanes&,
                       float*, int);

// The compiled kernel rows for this window ([0]: inside X, [1]: checked), or nulls.
template <int64_t PRE, bool MUL>
std::pair<DwFast, DwFast> dw_fast_for(const DwJob& j) {
  if (j.dw != 1) return {nullptr, nullptr};
#define OXLA_DW(K, S)          \
  if (j.KW == K && j.sw == S) \
    return {dw_fast<K, S, PRE, false, MUL>, dw_fast<K, S, PRE, true, MUL>};
  OXLA_DW(3, 1) OXLA_DW(3, 2) OXLA_DW(5, 1) OXLA_DW(5, 2) OXLA_DW(7, 1) OXLA_DW(7, 2)
#undef OXLA_DW
  return {nullptr, nullptr};
}

template <int64_t PRE, bool MUL>
void dw_items(const DwJob& j, int64_t i0, int64_t i1) {
  auto [fast, checked] = dw_fast_for<PRE, MUL>(j);
  for (int64_t it = i0; it < i1;) {
    // the items of one row in this range: its channel blocks [cb0, cb1), taken per pixel block
    // (every channel of a pixel block before the next: X's rows are read in address order, each
    // cache line once). One core: 162x162x32 3x3 541 -> 449 us, 112x112x96 3x3/2 296 -> 246 us,
    // the smaller shapes equal; in the models (builds alternated, onnxruntime interleaved) the
    // detector 1.30 / 1.24 against 1.37 / 1.49x onnxruntime, EfficientNet-B0 1.04 / 1.09 against
    // 1.08 / 1.14x.
    int64_t r = it / j.cblocks, cb0 = it % j.cblocks;
    int64_t cb1 = std::min(j.cblocks, cb0 + (i1 - it));
    it += cb1 - cb0;
    int64_t n = r / j.OH, oh = r % j.OH;
    const float* xn = j.X + n * j.H * j.Wd * j.CX;
    float* yrow = j.Y + r * j.OW * j.C;
    for (int64_t ow = 0; ow < j.OW; ow += DW_P) {
      int p = (int)(j.OW - ow < DW_P ? j.OW - ow : DW_P);
      // the taps of all DW_P pixels (those past OW too: the fast rows compute them) inside X
      bool inside = ow * j.sw - j.pl >= 0 &&
                    (ow + DW_P - 1) * j.sw - j.pl + (j.KW - 1) * j.dw < j.Wd;
      for (int64_t cb = cb0; cb < cb1; ++cb) {
        int64_t c = cb * L;
        DwLanes d = dw_lanes<MUL>(j, cb);
        bool fast_here = fast != nullptr && (CHEAP_MASKS || j.C - c >= L);
        float* y = yrow + ow * j.C + c;
        if (fast_here && inside) fast(j, xn, oh, ow, c, d, y, p);
        else if (fast_here) checked(j, xn, oh, ow, c, d, y, p);
        else if (p == DW_P && inside) dw_block<PRE, DW_P, false, MUL>(j, xn, oh, ow, c, d, y);
        else if (p == DW_P) dw_block<PRE, DW_P, true, MUL>(j, xn, oh, ow, c, d, y);
        else
          for (int q = 0; q < p; ++q)
            dw_block<PRE, 1, true, MUL>(j, xn, oh, ow + q, c, d, y + q * j.C);
      }
    }
  }
}

void dw_part(const void* ctx, const Part& p) {
  const DwJob& j = *static_cast<const DwJob*>(ctx);
  int64_t i0 = p.lo(j.items), i1 = p.hi(j.items);
  bool mul = j.M > 1;
  switch (j.pre_act) {  // the activations compiled as pre_act (Sdwconv accepts no other)
    case RELU: mul ? dw_items<RELU, true>(j, i0, i1) : dw_items<RELU, false>(j, i0, i1); break;
    case CLIP: mul ? dw_items<CLIP, true>(j, i0, i1) : dw_items<CLIP, false>(j, i0, i1); break;
    case HARD_SWISH:
      mul ? dw_items<HARD_SWISH, true>(j, i0, i1) : dw_items<HARD_SWISH, false>(j, i0, i1);
      break;
    default: mul ? dw_items<NO_PRE, true>(j, i0, i1) : dw_items<NO_PRE, false>(j, i0, i1); break;
  }
}

ffi::Error Sdwconv(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                   ffi::Buffer<ffi::F32> bias, ffi::Buffer<ffi::F32> pre_bias,
                   ffi::ResultBuffer<ffi::F32> y, int64_t threads, int64_t act, float lo,
                   float hi, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt,
                   int64_t pl, int64_t pre_act, float pre_lo, float pre_hi) {
  auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 4 || wd.size() != 3 || yd.size() != 4 || xd[0] != yd[0] || wd[2] != yd[3] ||
      xd[3] < 1 || yd[3] % xd[3] != 0)
    return ffi::Error::InvalidArgument("oxla_sdwconv: operand shapes");
  if (sh < 1 || sw < 1 || dh < 1 || dw < 1 || pt < 0 || pl < 0 || wd[0] < 1 || wd[1] < 1)
    return ffi::Error::InvalidArgument("oxla_sdwconv: window");
  if ((int64_t)bias.element_count() != yd[3])
    return ffi::Error::InvalidArgument("oxla_sdwconv: bias length");
  if (act < NONE || act > HARD_SWISH ||
      (pre_act != NO_PRE && pre_act != RELU && pre_act != CLIP && pre_act != HARD_SWISH))
    return ffi::Error::InvalidArgument("oxla_sdwconv: act");
  if ((int64_t)pre_bias.element_count() != (pre_act == NO_PRE ? 0 : xd[3]))
    return ffi::Error::InvalidArgument("oxla_sdwconv: pre_bias length");
  DwJob j;
  j.N = xd[0]; j.H = xd[1]; j.Wd = xd[2]; j.CX = xd[3]; j.C = yd[3]; j.M = j.C / j.CX;
  j.OH = yd[1]; j.OW = yd[2];
  j.KH = wd[0]; j.KW = wd[1];
  j.sh = sh; j.sw = sw; j.dh = dh; j.dw = dw; j.pt = pt; j.pl = pl;
  j.cblocks = (j.C + L - 1) / L;
  j.items = j.N * j.OH * j.cblocks;
  if (j.items == 0 || j.OW == 0) return ffi::Error::Success();
  std::vector<int32_t> idx(j.M > 1 ? j.cblocks * L : 0);
  for (int64_t c = 0; c < (int64_t)idx.size(); ++c)  // lanes past C repeat the last channel
    idx[c] = (int32_t)(std::min(c, j.C - 1) / j.M - c / L * L / j.M);
  j.idx = idx.data();
  j.X = x.typed_data();
  j.W = w.typed_data();
  j.bias = bias.typed_data();
  j.pre_bias = pre_act == NO_PRE ? nullptr : pre_bias.typed_data();
  j.Y = y->typed_data();
  j.act = act;
  j.lo = lo;
  j.hi = hi;
  j.pre_act = pre_act;
  j.pre_lo = pre_lo;
  j.pre_hi = pre_hi;
  double flops = 2.0 * (double)(j.items * L * j.OW) * (double)(j.KH * j.KW);
  parallel(dw_part, &j, usable(threads, pool), flops, pool);
  return ffi::Error::Success();
}

// ---- Image stems: a convolution over a few input channels, read channels first -----------------
//
// Y[n, oh, ow, m] = act(bias[m] + sum_{i, j, c} X[n, c, oh*sh - pt + i*dh, ow*sw - pl + j*dw]
//                                              * W[(i KW + j) C + c, m]),
// taps outside X reading zero; X is (N, C, H, W) (channels_first: the model's image, before the
// transpose ChannelsLastPass put at the graph's edge) or (N, H, W, C); Y is channels last; W is
// packed in panels of NR columns as the GEMM's (K = KH KW C rows). Y may carry a zero border (out
// pads: the next convolution's padding, written here instead of in a pass of its own).
// Why (docs/benchmarks.md, fourteenth round): XLA runs a 3x3 stride-2 stem over RGB as a loop of
// 27 multiply-adds per output channel block over the image moved channels last (an innermost
// axis of 3 floats): 7-8 GFLOP/s alone in jax.jit, ResNet's 7x7 one on YNNPACK. Here each output
// row's KH x C input rows are copied once into a zero-padded buffer (borders and the layout
// handled there), and a tile of ST_P output pixels x 2L output channels takes, per tap, one
// broadcast input value per pixel against two vectors of W: 42-68 GFLOP/s for the 3x3 stems, 84
// for ResNet's 7x7, on one Zen 3 core.
// Stride 2 over RGB is compiled for (stem_tile<..., 3, ..., 2>): with the stride a constant the
// tile's 12 input reads sit at fixed offsets from one pointer, where a stride in a register kept
// a pointer per pixel and spilled them; and channels in whole tiles of 4L (stem_tile4, AVX-512)
// take 6 pixels x 64 channels. In jax.jit on one core of the Intel Xeon (AVX-512), alternated
// with the previous build and onnxruntime in one process: ResNet's 7x7 at 224 0.74-0.83x the
// time (1.80-1.91 ms, onnxruntime 1.90-1.99), at 320 0.74-0.79x, the 3x3 stride-2 3 -> 32 at
// 224 0.73-0.75x; MobileNetV3-small at default threads 0.94x, ResNet-50 at one thread 0.99x.

constexpr int ST_P = L == 16 ? 12 : 6;  // output pixels per tile (2 ST_P accumulators)

struct StemJob {
  const float* X;
  const float* Wp;    // (panels, K, NR)
  const float* bias;  // (panels NR,): zeros past M
  float* Y;
  int64_t N, C, H, Wd, OH, OW, M, K, KH, KW, sh, sw, dh, dw, pt, pl;
  int64_t ot, ol, ob, orr;   // Y's zero border (out pads): top, left, bottom, right
  int64_t sn, sc, sh_, sw_;  // X's strides (elements) for n, c, h, w
  int64_t RL;                // a padded input row's length: the tiles of a row read inside it
  int64_t act;
  float lo, hi;
};

// Output pixels [ow0, ow0 + P) of one row, 2L output channels from column col (panel p's half);
// L channels alone when TWO is false (the last channels, M - col <= L: ResNet's 7x7 stem over 8
// channels in the shipped resnet_small computed a vector of padding for each one it kept, 17% of
// the model's samples; builds alternated, batch 4: 1.59 / 1.67 against 1.69 / 1.80x onnxruntime).
// CC: C when compiled for it (1, 3), else 0; SW: the stride along W when compiled for it (2),
// else 0.
template <int64_t ACT, int64_t CC, bool TWO, int64_t SW>
inline void stem_tile(const StemJob& j, const float* rows, int64_t ow0, int64_t col, int P,
                      float* y) {
  const int64_t C = CC ? CC : j.C;
  const int64_t sw = SW ? SW : j.sw;  // known: the pixels' reads at fixed offsets from one pointer
  int64_t panel = col / NR, half = col % NR;
  const float* w = j.Wp + panel * j.K * NR + half;
  V a0[ST_P], a1[ST_P];
  V b0 = v_load(j.bias + col), b1 = TWO ? v_load(j.bias + col + L) : b0;
#pragma GCC unroll 16
  for (int p = 0; p < ST_P; ++p) a0[p] = b0, a1[p] = b1;
  for (int64_t i = 0; i < j.KH; ++i)
    for (int64_t t = 0; t < j.KW; ++t) {
      const float* r = rows + i * C * j.RL + ow0 * sw + t * j.dw;
#pragma GCC unroll 4
      for (int64_t c = 0; c < C; ++c, r += j.RL, w += NR) {
        V w0 = v_load(w), w1 = TWO ? v_load(w + L) : w0;
#pragma GCC unroll 16
        for (int p = 0; p < ST_P; ++p) {
          V x = v_set(r[p * sw]);
          a0[p] = v_fma(x, w0, a0[p]);
          if (TWO) a1[p] = v_fma(x, w1, a1[p]);
        }
      }
    }
  int64_t n0 = j.M - col, n1 = j.M - col - L;  // valid lanes of the two vectors
  for (int p = 0; p < P; ++p) {
    float* yp = y + p * j.M + col;
    v_store_n(yp, n0, activate<ACT>(a0[p], j.lo, j.hi));
    if (TWO && n1 > 0) v_store_n(yp + L, n1, activate<ACT>(a1[p], j.lo, j.hi));
  }
}

// Output pixels [ow0, ow0 + P) of one row (P <= ST_P4), all of 4L output channels from column col
// (two whole panels; AVX-512 only, where 24 accumulators, 4 vectors of W and a broadcast fit the
// 32 registers): a tap's 24 multiply-adds load 4 vectors of W and 6 inputs, where a tile of
// ST_P pixels x 2L channels loads 2 and 12.
constexpr int ST_P4 = 6;

template <int64_t ACT, int64_t CC, int64_t SW>
inline void stem_tile4(const StemJob& j, const float* rows, int64_t ow0, int64_t col, int P,
                       float* y) {
  const int64_t C = CC ? CC : j.C;
  const int64_t sw = SW ? SW : j.sw;
  const float* w = j.Wp + col / NR * j.K * NR;
  const float* w2 = w + j.K * NR;  // the next panel
  V a[ST_P4][4];
  V b[4] = {v_load(j.bias + col), v_load(j.bias + col + L), v_load(j.bias + col + 2 * L),
            v_load(j.bias + col + 3 * L)};
#pragma GCC unroll 8
  for (int p = 0; p < ST_P4; ++p)
    for (int v = 0; v < 4; ++v) a[p][v] = b[v];
  for (int64_t i = 0; i < j.KH; ++i)
    for (int64_t t = 0; t < j.KW; ++t) {
      const float* r = rows + i * C * j.RL + ow0 * sw + t * j.dw;
#pragma GCC unroll 4
      for (int64_t c = 0; c < C; ++c, r += j.RL, w += NR, w2 += NR) {
        V w0 = v_load(w), w1 = v_load(w + L), w2v = v_load(w2), w3 = v_load(w2 + L);
#pragma GCC unroll 8
        for (int p = 0; p < ST_P4; ++p) {
          V x = v_set(r[p * sw]);
          a[p][0] = v_fma(x, w0, a[p][0]);
          a[p][1] = v_fma(x, w1, a[p][1]);
          a[p][2] = v_fma(x, w2v, a[p][2]);
          a[p][3] = v_fma(x, w3, a[p][3]);
        }
      }
    }
  for (int p = 0; p < P; ++p) {
    float* yp = y + p * j.M + col;
    for (int v = 0; v < 4; ++v) v_store(yp + v * L, activate<ACT>(a[p][v], j.lo, j.hi));
  }
}

template <int64_t ACT>
void stem_rows(const StemJob& j, int64_t r0, int64_t r1) {
  thread_local std::vector<float> buf;
  buf.resize((size_t)(j.KH * j.C * j.RL));
  float* rows = buf.data();
  for (int64_t r = r0; r < r1; ++r) {
    int64_t n = r / j.OH, oh = r % j.OH;
    // rows[(i C + c) RL + q] = X[n, c, oh sh - pt + i dh, q - pl], zero outside X
    for (int64_t i = 0; i < j.KH; ++i) {
      int64_t ih = oh * j.sh - j.pt + i * j.dh;
      for (int64_t c = 0; c < j.C; ++c) {
        float* dst = rows + (i * j.C + c) * j.RL;
        if (ih < 0 || ih >= j.H) {
          std::fill(dst, dst + j.RL, 0.0f);
          continue;
        }
        const float* src = j.X + n * j.sn + c * j.sc + ih * j.sh_;
        int64_t q0 = j.pl < j.RL ? j.pl : j.RL, q1 = j.pl + j.Wd < j.RL ? j.pl + j.Wd : j.RL;
        std::fill(dst, dst + q0, 0.0f);
        if (j.sw_ == 1) std::copy(src, src + (q1 - q0), dst + q0);
        else for (int64_t q = q0; q < q1; ++q) dst[q] = src[(q - j.pl) * j.sw_];
        std::fill(dst + q1, dst + j.RL, 0.0f);
      }
    }
    int64_t owp = j.OW + j.ol + j.orr, ohp = j.OH + j.ot + j.ob;
    float* yrow = j.Y + ((n * ohp + oh + j.ot) * owp + j.ol) * j.M;
    std::fill(yrow - j.ol * j.M, yrow, 0.0f);
    std::fill(yrow + j.OW * j.M, yrow + (j.OW + j.orr) * j.M, 0.0f);
    if (oh == 0) {
      float* top = j.Y + n * ohp * owp * j.M;
      std::fill(top, top + j.ot * owp * j.M, 0.0f);
    }
    if (oh == j.OH - 1) {
      float* bottom = j.Y + (n * ohp + j.ot + j.OH) * owp * j.M;
      std::fill(bottom, bottom + j.ob * owp * j.M, 0.0f);
    }
    int64_t wide = L == 16 ? j.M / (4 * L) * (4 * L) : 0;  // channels in tiles of 4L
    for (int64_t ow = 0; ow < j.OW && wide > 0; ow += ST_P4) {
      int P = (int)(j.OW - ow < ST_P4 ? j.OW - ow : ST_P4);
      float* y = yrow + ow * j.M;
      for (int64_t col = 0; col < wide; col += 4 * L) {
        if (j.C == 3 && j.sw == 2) stem_tile4<ACT, 3, 2>(j, rows, ow, col, P, y);
        else if (j.C == 3) stem_tile4<ACT, 3, 0>(j, rows, ow, col, P, y);
        else stem_tile4<ACT, 0, 0>(j, rows, ow, col, P, y);
      }
    }
    for (int64_t ow = 0; ow < j.OW && wide < j.M; ow += ST_P) {
      int P = (int)(j.OW - ow < ST_P ? j.OW - ow : ST_P);
      for (int64_t col = wide; col < j.M; col += 2 * L) {
        float* y = yrow + ow * j.M;
        if (j.M - col > L) {
          if (j.C == 3 && j.sw == 2) stem_tile<ACT, 3, true, 2>(j, rows, ow, col, P, y);
          else if (j.C == 3) stem_tile<ACT, 3, true, 0>(j, rows, ow, col, P, y);
          else if (j.C == 1) stem_tile<ACT, 1, true, 0>(j, rows, ow, col, P, y);
          else stem_tile<ACT, 0, true, 0>(j, rows, ow, col, P, y);
        } else {
          if (j.C == 3 && j.sw == 2) stem_tile<ACT, 3, false, 2>(j, rows, ow, col, P, y);
          else if (j.C == 3) stem_tile<ACT, 3, false, 0>(j, rows, ow, col, P, y);
          else if (j.C == 1) stem_tile<ACT, 1, false, 0>(j, rows, ow, col, P, y);
          else stem_tile<ACT, 0, false, 0>(j, rows, ow, col, P, y);
        }
      }
    }
  }
}

void stem_part(const void* ctx, const Part& p) {
  const StemJob& j = *static_cast<const StemJob*>(ctx);
  int64_t rows = j.N * j.OH, r0 = p.lo(rows), r1 = p.hi(rows);
  switch (j.act) {
    case RELU: stem_rows<RELU>(j, r0, r1); break;
    case CLIP: stem_rows<CLIP>(j, r0, r1); break;
    case SILU: stem_rows<SILU>(j, r0, r1); break;
    case HARD_SWISH: stem_rows<HARD_SWISH>(j, r0, r1); break;
    default: stem_rows<NONE>(j, r0, r1); break;
  }
}

ffi::Error Sstem(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                 ffi::Buffer<ffi::F32> bias, ffi::ResultBuffer<ffi::F32> y, int64_t threads,
                 int64_t act, float lo, float hi, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                 int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t channels_first,
                 int64_t out_top, int64_t out_left, int64_t out_bottom, int64_t out_right) {
  auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 4 || wd.size() != 3 || wd[2] != NR || yd.size() != 4 || xd[0] != yd[0])
    return ffi::Error::InvalidArgument("oxla_sstem: operand ranks");
  if (kh < 1 || kw < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1 || pt < 0 || pl < 0)
    return ffi::Error::InvalidArgument("oxla_sstem: window");
  if (act < NONE || act > HARD_SWISH) return ffi::Error::InvalidArgument("oxla_sstem: act");
  if (out_top < 0 || out_left < 0 || out_bottom < 0 || out_right < 0 ||
      yd[1] <= out_top + out_bottom || yd[2] <= out_left + out_right)
    return ffi::Error::InvalidArgument("oxla_sstem: out pads");
  StemJob j;
  j.N = xd[0];
  if (channels_first) {
    j.C = xd[1]; j.H = xd[2]; j.Wd = xd[3];
    j.sw_ = 1; j.sh_ = j.Wd; j.sc = j.H * j.Wd; j.sn = j.C * j.sc;
  } else {
    j.H = xd[1]; j.Wd = xd[2]; j.C = xd[3];
    j.sc = 1; j.sw_ = j.C; j.sh_ = j.Wd * j.C; j.sn = j.H * j.sh_;
  }
  j.ot = out_top; j.ol = out_left; j.ob = out_bottom; j.orr = out_right;
  j.OH = yd[1] - out_top - out_bottom; j.OW = yd[2] - out_left - out_right; j.M = yd[3];
  j.KH = kh; j.KW = kw; j.sh = sh; j.sw = sw; j.dh = dh; j.dw = dw; j.pt = pt; j.pl = pl;
  j.K = kh * kw * j.C;
  int64_t panels = (j.M + NR - 1) / NR;
  if (wd[1] != j.K || wd[0] != panels)
    return ffi::Error::InvalidArgument("oxla_sstem: packed weight shape");
  if ((int64_t)bias.element_count() != j.M)
    return ffi::Error::InvalidArgument("oxla_sstem: bias length");
  if (j.N * j.M == 0) return ffi::Error::Success();
  std::vector<float> b((size_t)(panels * NR), 0.0f);
  std::copy(bias.typed_data(), bias.typed_data() + j.M, b.begin());
  // tiles read ST_P pixels from each multiple of ST_P: the row holds the last tile's window
  j.RL = ((j.OW + ST_P - 1) / ST_P * ST_P - 1) * sw + (kw - 1) * dw + 1;
  j.X = x.typed_data();
  j.Wp = w.typed_data();
  j.bias = b.data();
  j.Y = y->typed_data();
  j.act = act;
  j.lo = lo;
  j.hi = hi;
  double flops = 2.0 * (double)(j.N * j.OH * j.OW) * (double)j.K * (double)j.M;
  parallel(stem_part, &j, usable(threads, pool), flops, pool);
  return ffi::Error::Success();
}

// ---- GRU and LSTM recurrences (ONNX's, with their default activations: Sigmoid and Tanh) -----
//
// The GRU below; the LSTM (lstm_block) shares its dots, threads and edges.
//
// Per direction d (bidirectional: forward, then backward in time) and step t, with H the state:
//   z = sig(c(XW_z + H R_z^T + Rb_z)),  r = sig(c(XW_r + H R_r^T + Rb_r)),
//   h = tanh(c(XW_h + r * (H R_h^T + Rb_h)))    (linear_before_reset)
//   h = tanh(c(XW_h + (r * H) R_h^T + Rb_h))    (otherwise: a second stage per step),
//   H' = (1 - z) * h + z * H;
// c is Clip(-clip, clip) when clip > 0; a step at or past a sequence's length keeps H and outputs
// zeros; a sequence of length 0 ends in zeros. XW (T, B, D, 3H) are the input projections X W^T
// (one dot over every step, before the call), W's bias added here. sig and tanh are MLAS's
// rational polynomials (onnxruntime's GRU uses them; logistic is also silu's, above).
//
// Why oxla owns this loop (docs/benchmarks.md, thirteenth round): a step is a matrix-vector
// product that reads all of R (3H x H; 786 KB at H = 256, over a Zen 3 core's 512 KB L2), and
// XLA:CPU runs its time loop on one core. Here every step's hidden units are split between the
// caller and the intra-op pool's threads (gru_run), each always the same units (rows j, H + j,
// 2H + j of R), so that each core reads its share of R from its own L2. On one core it is no
// faster than XLA's at batch 1 (both stream R from L3); its register blocks of four rows by two
// sequences win for batches, so there oxla uses it for batches only.

// Hidden units per block: the dots of a block's rows are kept (B, gates, GRU_JB).
constexpr int64_t GRU_JB = 32;

struct GruJob {
  const float* xw;
  const float* wb;    // (D, gates H): W's bias, added to XW here
  const float* R[2];  // per direction (gates H, H)
  const float* rb;
  const float* h0;
  const int32_t* lens;  // nullptr: every sequence is T long
  float* y;
  float* yh;
  float* scratch;  // per direction (4, B, H): the state before and after a step; then GRU: z
                   // between the two stages of a step and r * H (!lbr); LSTM: the cell state
  int64_t T, B, D, H;
  int64_t phases;
  int64_t gates;  // 3: GRU, 4: LSTM (oxla_slstm)
  bool lbr, reverse;
  float clip;
  // LSTM only
  const float* c0;
  const float* P;  // (D, 3H) peepholes i, o, f, or nullptr
  float* yc;
  bool input_forget;
};

inline float v_hsum(V v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps(v);
#else
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
#endif
}


inline V tanh_v(V v) {  // MLAS's MlasTanhKernel
  constexpr float P[] = {-2.76076847742355e-16f, 2.00018790482477e-13f, -8.60467152213735e-11f,
                         5.12229709037114e-08f, 1.48572235717979e-05f, 6.37261928875436e-04f,
                         4.89352455891786e-03f};
  constexpr float Q[] = {1.19825839466702e-06f, 1.18534705686654e-04f, 2.26843463243900e-03f,
                         4.89352518554385e-03f};
  return odd_rational(v_min(v_max(v, v_set(-9.0f)), v_set(9.0f)), P, Q);
}

// Rows r[0..3] (H apart) times h rows x0, x1 (two sequences): out0[0..3], out1[0..3].
inline void gru_dots_4x2(const float* r, int64_t H, const float* x0, const float* x1, float* o0,
                         float* o1) {
  V a[8];
  for (V& v : a) v = v_zero();
  int64_t k = 0;
  for (; k + L <= H; k += L) {
    V y0 = v_load(x0 + k), y1 = v_load(x1 + k);
    for (int q = 0; q < 4; ++q) {
      V w = v_load(r + q * H + k);
      a[q] = v_fma(w, y0, a[q]);
      a[4 + q] = v_fma(w, y1, a[4 + q]);
    }
  }
  if (k < H) {
    Mask m = lanes(H - k);
    V y0 = v_load_m(x0 + k, m), y1 = v_load_m(x1 + k, m);
    for (int q = 0; q < 4; ++q) {
      V w = v_load_m(r + q * H + k, m);
      a[q] = v_fma(w, y0, a[q]);
      a[4 + q] = v_fma(w, y1, a[4 + q]);
    }
  }
  for (int q = 0; q < 4; ++q) {
    o0[q] = v_hsum(a[q]);
    o1[q] = v_hsum(a[4 + q]);
  }
}

// out[b * ldo + i] = R[i, :] . h[b, :] for rows i < n (rows H apart) and every b < B: four rows
// at a time, which stay in L1 while the sequences pass over them, two at a time (8 accumulators:
// R's rows are loaded once for both).
void gru_dots(const float* R, int64_t H, int64_t n, const float* h, int64_t B, float* out,
              int64_t ldo) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const float* r = R + i * H;
    int64_t b = 0;
    for (; b + 2 <= B; b += 2)
      gru_dots_4x2(r, H, h + b * H, h + (b + 1) * H, out + b * ldo + i, out + (b + 1) * ldo + i);
    for (; b < B; ++b) {
      const float* x = h + b * H;
      V a0 = v_zero(), a1 = v_zero(), a2 = v_zero(), a3 = v_zero();
      int64_t k = 0;
      for (; k + L <= H; k += L) {
        V xv = v_load(x + k);
        a0 = v_fma(v_load(r + k), xv, a0);
        a1 = v_fma(v_load(r + H + k), xv, a1);
        a2 = v_fma(v_load(r + 2 * H + k), xv, a2);
        a3 = v_fma(v_load(r + 3 * H + k), xv, a3);
      }
      if (k < H) {
        Mask m = lanes(H - k);
        V xv = v_load_m(x + k, m);
        a0 = v_fma(v_load_m(r + k, m), xv, a0);
        a1 = v_fma(v_load_m(r + H + k, m), xv, a1);
        a2 = v_fma(v_load_m(r + 2 * H + k, m), xv, a2);
        a3 = v_fma(v_load_m(r + 3 * H + k, m), xv, a3);
      }
      float* o = out + b * ldo + i;
      o[0] = v_hsum(a0);
      o[1] = v_hsum(a1);
      o[2] = v_hsum(a2);
      o[3] = v_hsum(a3);
    }
  }
  for (; i < n; ++i) {
    const float* r = R + i * H;
    for (int64_t b = 0; b < B; ++b) {
      const float* x = h + b * H;
      V a = v_zero();
      for (int64_t k = 0; k < H; k += L)
        a = v_fma(v_load_n(r + k, H - k), v_load_n(x + k, H - k), a);
      out[b * ldo + i] = v_hsum(a);
    }
  }
}

inline V v_sub1(V z) { return v_fma(z, v_set(-1.0f), v_set(1.0f)); }  // 1 - z

inline V gru_clip(V v, float clip) {
  return clip > 0 ? v_min(v_max(v, v_set(-clip)), v_set(clip)) : v;
}

// Stage s over hidden units [j0, j0 + n) (n <= GRU_JB) of every sequence.
// What stage s of a job reads and writes: its direction d, step i (of T), phase p (GRU without
// linear_before_reset: 2 a step), time t, and the direction's scratch (4, B, H); the dots of a
// block's rows go to acc (B, gates, GRU_JB), a thread's own buffer.
struct GruStage {
  int64_t d, i, p, t;
  float* state;
  const float* cur;  // the state before the step
  float* next;       // after it
  const float *R, *rb, *wb;
  float* acc;
  int64_t lda;
};

GruStage gru_stage(const GruJob& j, int64_t s) {
  GruStage g;
  g.d = s / (j.T * j.phases);
  g.i = (s / j.phases) % j.T;
  g.p = s % j.phases;
  bool backward = j.D == 2 ? g.d == 1 : j.reverse;
  g.t = backward ? j.T - 1 - g.i : g.i;
  int64_t BH = j.B * j.H, G = j.gates * j.H;
  g.state = j.scratch + g.d * 4 * BH;
  g.cur = g.state + (g.i % 2) * BH;
  g.next = g.state + ((g.i + 1) % 2) * BH;
  g.R = j.R[g.d];
  g.rb = j.rb + g.d * G;
  g.wb = j.wb + g.d * G;
  thread_local std::vector<float> acc;
  acc.resize((size_t)(j.B * j.gates * GRU_JB));
  g.acc = acc.data();
  g.lda = j.gates * GRU_JB;
  return g;
}

// Sequence b at or past its end: units [j0, j0 + n) keep their state and output zero.
inline void gru_keep(const GruJob& j, const GruStage& g, int64_t b, int64_t j0, int64_t n) {
  float* yt = j.y + ((g.t * j.D + g.d) * j.B + b) * j.H;
  for (int64_t c = 0; c < n; ++c) {
    g.next[b * j.H + j0 + c] = g.cur[b * j.H + j0 + c];
    yt[j0 + c] = 0.0f;
  }
}

void gru_block(const GruJob& j, int64_t s, int64_t j0, int64_t n) {
  GruStage st = gru_stage(j, s);
  int64_t d = st.d, p = st.p, t = st.t, H = j.H, B = j.B, G = 3 * H, lda = st.lda;
  float *zbuf = st.state + 2 * B * H, *rh = st.state + 3 * B * H;
  const float *cur = st.cur, *R = st.R, *rb = st.rb, *wb = st.wb;
  float *next = st.next, *acc = st.acc;
  bool last = p == j.phases - 1;
  if (p == 0) {
    gru_dots(R + j0 * H, H, n, cur, B, acc, lda);
    gru_dots(R + (H + j0) * H, H, n, cur, B, acc + GRU_JB, lda);
    if (j.lbr) gru_dots(R + (2 * H + j0) * H, H, n, cur, B, acc + 2 * GRU_JB, lda);
  } else {
    gru_dots(R + (2 * H + j0) * H, H, n, rh, B, acc + 2 * GRU_JB, lda);
  }
  for (int64_t b = 0; b < B; ++b) {
    if (j.lens && t >= j.lens[b]) {
      if (last) gru_keep(j, st, b, j0, n);
      continue;
    }
    float* yt = j.y + ((t * j.D + d) * B + b) * H;
    const float* xw = j.xw + ((t * B + b) * j.D + d) * G;
    const float* a = acc + b * lda;
    for (int64_t c = 0; c < n; c += L) {
      int64_t m = n - c, u = j0 + c;
      V h = v_load_n(cur + b * H + u, m);
      V z;
      if (p == 0) {
        z = logistic(gru_clip(v_add(v_add(v_load_n(xw + u, m), v_load_n(wb + u, m)),
                                    v_add(v_load_n(a + c, m), v_load_n(rb + u, m))), j.clip));
        V r = logistic(gru_clip(v_add(v_add(v_load_n(xw + H + u, m), v_load_n(wb + H + u, m)),
                                      v_add(v_load_n(a + GRU_JB + c, m), v_load_n(rb + H + u, m))),
                                j.clip));
        if (!j.lbr) {
          v_store_n(zbuf + b * H + u, m, z);
          v_store_n(rh + b * H + u, m, v_mul(r, h));
          continue;
        }
        V hr = v_add(v_load_n(a + 2 * GRU_JB + c, m), v_load_n(rb + 2 * H + u, m));
        V xh = v_add(v_load_n(xw + 2 * H + u, m), v_load_n(wb + 2 * H + u, m));
        V g = tanh_v(gru_clip(v_fma(r, hr, xh), j.clip));
        V out = v_fma(v_sub1(z), g, v_mul(z, h));
        v_store_n(next + b * H + u, m, out);
        v_store_n(yt + u, m, out);
      } else {
        z = v_load_n(zbuf + b * H + u, m);
        V xh = v_add(v_load_n(xw + 2 * H + u, m), v_load_n(wb + 2 * H + u, m));
        V g = tanh_v(gru_clip(v_add(xh, v_add(v_load_n(a + 2 * GRU_JB + c, m),
                                              v_load_n(rb + 2 * H + u, m))), j.clip));
        V out = v_fma(v_sub1(z), g, v_mul(z, h));
        v_store_n(next + b * H + u, m, out);
        v_store_n(yt + u, m, out);
      }
    }
  }
}

// LSTM (oxla_slstm), one stage per step, hidden units [j0, j0 + n) of every sequence:
//   i = sig(c(Z_i + P_i * C)), f = sig(c(Z_f + P_f * C)) (or 1 - i with input_forget),
//   C' = f * C + i * tanh(c(Z_c)), o = sig(c(Z_o + P_o * C')), H' = o * tanh(C'),
// Z = XW + Wb + H R^T + Rb with gates ordered i, o, f, c (ONNX's LSTM and oxla's rule, rnn.py).
// The cell state of a unit is only ever read and written by the thread that runs the unit.
void lstm_block(const GruJob& j, int64_t s, int64_t j0, int64_t n) {
  GruStage st = gru_stage(j, s);
  int64_t d = st.d, t = st.t, H = j.H, B = j.B, G = 4 * H, lda = st.lda;
  float* cell = st.state + 2 * B * H;
  const float *cur = st.cur, *R = st.R, *rb = st.rb, *wb = st.wb;
  float *next = st.next, *acc = st.acc;
  const float* P = j.P ? j.P + d * 3 * H : nullptr;
  for (int64_t g = 0; g < 4; ++g)
    gru_dots(R + (g * H + j0) * H, H, n, cur, B, acc + g * GRU_JB, lda);
  for (int64_t b = 0; b < B; ++b) {
    if (j.lens && t >= j.lens[b]) {
      gru_keep(j, st, b, j0, n);
      continue;
    }
    float* yt = j.y + ((t * j.D + d) * B + b) * H;
    const float* xw = j.xw + ((t * B + b) * j.D + d) * G;
    const float* a = acc + b * lda;
    for (int64_t c = 0; c < n; c += L) {
      int64_t m = n - c, u = j0 + c;
      V z[4];
      for (int g = 0; g < 4; ++g)
        z[g] = v_add(v_add(v_load_n(xw + g * H + u, m), v_load_n(wb + g * H + u, m)),
                     v_add(v_load_n(a + g * GRU_JB + c, m), v_load_n(rb + g * H + u, m)));
      V C = v_load_n(cell + b * H + u, m);
      V zi = P ? v_fma(v_load_n(P + u, m), C, z[0]) : z[0];
      V ig = logistic(gru_clip(zi, j.clip));
      V fg;
      if (j.input_forget) {
        fg = v_sub1(ig);
      } else {
        V zf = P ? v_fma(v_load_n(P + 2 * H + u, m), C, z[2]) : z[2];
        fg = logistic(gru_clip(zf, j.clip));
      }
      V Cn = v_fma(fg, C, v_mul(ig, tanh_v(gru_clip(z[3], j.clip))));
      V zo = P ? v_fma(v_load_n(P + H + u, m), Cn, z[1]) : z[1];
      V og = logistic(gru_clip(zo, j.clip));
      V out = v_mul(og, tanh_v(Cn));
      v_store_n(cell + b * H + u, m, Cn);
      v_store_n(next + b * H + u, m, out);
      v_store_n(yt + u, m, out);
    }
  }
}

// Stage s over part `part` of `parts` of the hidden units (cut at multiples of L), in blocks
// of GRU_JB: one part per thread, so that each thread reads the same rows of R at every step.
void gru_part(const GruJob& j, int64_t s, int part, int parts) {
  int64_t units = (j.H + L - 1) / L;
  int64_t u0 = std::min(j.H, units * part / parts * L);
  int64_t u1 = std::min(j.H, units * (part + 1) / parts * L);
  for (int64_t u = u0; u < u1; u += GRU_JB) {
    if (j.gates == 4) lstm_block(j, s, u, std::min(GRU_JB, u1 - u));
    else gru_block(j, s, u, std::min(GRU_JB, u1 - u));
  }
}

// The caller and pool threads over a call, split by hidden units: part k of every stage is pool
// thread k's, part 0 the caller's, so that each thread reads the same rows of R (in its own L2)
// at every step. `claim` is gen:16 | stage:24 | parts taken:16. The caller publishes a stage,
// runs its part, takes every part still free (its pool thread has not arrived) and waits for
// those others took (`done`: parts finished in the call). A stage costs a thread one claim:
// per-block claims cost 2-3 us a step in cache line transfers between cores.
//
// Measured and not kept: a bidirectional layer's directions on two threads (each reads its
// whole R from L3, no thread waits for the other within a direction): as fast or 5-10% slower.
struct GruTeam {
  std::mutex busy;
  alignas(64) std::atomic<uint64_t> claim{0};
  alignas(64) std::atomic<int64_t> done{0};
  uint64_t gen = 0;
};

GruTeam* gru_team() {
  static GruTeam* t = new GruTeam();  // never freed: a late pool task may still read it at exit
  return t;
}

constexpr uint64_t GRU_END = (1u << 24) - 1;  // the stage after the last
constexpr int GRU_MAX_PARTS = 16;
// Multiply-adds a thread's part of a step has at least: below, a second thread costs more (its
// claim, the caller's wait) than it saves (hidden 128 at batch 1, 49-65 K a step: 1.2-1.5x slower
// on two threads than on one).
constexpr double GRU_PART_MACS = 5e4;
inline uint64_t gru_claim(uint64_t g, uint64_t s, uint64_t taken) {
  return g << 40 | s << 16 | taken;
}

// The serial steps between stages: a direction's first state in, its last state out.
void gru_edges(const GruJob& j, int64_t s, bool first) {
  int64_t per = j.T * j.phases, d = s / per, BH = j.B * j.H;
  float* state = j.scratch + d * 4 * BH;
  bool lstm = j.gates == 4;
  if (first && s % per == 0) {
    std::copy(j.h0 + d * BH, j.h0 + (d + 1) * BH, state);
    if (lstm) std::copy(j.c0 + d * BH, j.c0 + (d + 1) * BH, state + 2 * BH);
  }
  if (!first && s % per == per - 1) {
    const float* fin = state + (j.T % 2) * BH;
    for (int64_t b = 0; b < j.B; ++b) {
      bool empty = j.lens && j.lens[b] <= 0;
      for (int64_t u = 0; u < j.H; ++u) {
        j.yh[d * BH + b * j.H + u] = empty ? 0.0f : fin[b * j.H + u];
        if (lstm) j.yc[d * BH + b * j.H + u] = empty ? 0.0f : state[2 * BH + b * j.H + u];
      }
    }
  }
}

// Every stage of direction d, on this thread.
void gru_direction(const GruJob& j, int64_t d) {
  int64_t per = j.T * j.phases;
  for (int64_t s = d * per; s < (d + 1) * per; ++s) {
    gru_edges(j, s, true);
    gru_part(j, s, 0, 1);
    gru_edges(j, s, false);
  }
}

// Part k of each stage from the one published when it arrives, until the call ends.
void gru_part_helper(GruTeam* t, uint64_t g, const GruJob* job, int k, int parts) {
  uint64_t next = 0;  // the first stage this thread may still take
  for (;;) {
    uint64_t c = t->claim.load(std::memory_order_acquire);
    uint64_t s = (c >> 16) & GRU_END, taken = c & 0xFFFF;
    if ((c >> 40) != g || s == GRU_END) return;
    if (s < next || (taken >> k & 1)) {
      _mm_pause();
      continue;
    }
    if (t->claim.compare_exchange_weak(c, c | (uint64_t)1 << k, std::memory_order_acq_rel)) {
      gru_part(*job, (int64_t)s, k, parts);
      t->done.fetch_add(1, std::memory_order_release);
      next = s + 1;
    }
  }
}

void gru_run(const GruJob& j, int threads, ffi::ThreadPool& pool) {
  int64_t stages = j.D * j.T * j.phases;
  double macs = (double)(j.gates * j.H) * (double)(j.H * j.B);  // a step's
  int64_t most = std::min<int64_t>((j.H + L - 1) / L, (int64_t)(macs / GRU_PART_MACS));
  int parts = (int)std::max<int64_t>(1, std::min<int64_t>(std::min(threads, GRU_MAX_PARTS), most));
  GruTeam* t = gru_team();
  std::unique_lock<std::mutex> lock(t->busy, std::defer_lock);
  if (parts < 2 || stages >= (int64_t)GRU_END || !lock.try_lock()) {
    for (int64_t d = 0; d < j.D; ++d) gru_direction(j, d);
    return;
  }
  uint64_t g = (t->gen + 1) & 0xFFFF;
  t->gen = g;
  t->done.store(0, std::memory_order_relaxed);
  const GruJob* job = &j;
  uint64_t all = ((uint64_t)1 << parts) - 1;
  t->claim.store(gru_claim(g, 0, all), std::memory_order_release);  // nothing to take yet
  for (int k = 1; k < parts; ++k)
    pool.Schedule([t, g, job, k, parts] { gru_part_helper(t, g, job, k, parts); });
  int64_t others = 0;  // parts run by pool threads so far
  for (int64_t s = 0; s < stages; ++s) {
    gru_edges(j, s, true);
    t->claim.store(gru_claim(g, s, 1), std::memory_order_release);
    gru_part(j, s, 0, parts);
    for (int k = 1; k < parts; ++k) {
      uint64_t c = t->claim.load(std::memory_order_acquire);
      while (!(c >> k & 1)) {
        if (t->claim.compare_exchange_weak(c, c | (uint64_t)1 << k, std::memory_order_acq_rel)) {
          gru_part(j, s, k, parts);
          --others;  // counted below as taken by another thread
          break;
        }
      }
    }
    others += parts - 1;
    while (t->done.load(std::memory_order_acquire) < others) _mm_pause();
    gru_edges(j, s, false);
  }
  t->claim.store(gru_claim(g, GRU_END, all), std::memory_order_release);
}


// The operands both loops take, checked and set in j (whose gates, phases and op-specific fields
// the caller set), then the loop on `threads`; `more(D, B, H)` checks the op's own operands.
template <typename More>
ffi::Error recurrent_call(const std::string& what, GruJob& j, ffi::Buffer<ffi::F32>& xw,
                          ffi::Buffer<ffi::F32>& wb, ffi::Buffer<ffi::F32>& r0,
                          ffi::Buffer<ffi::F32>& r1, ffi::Buffer<ffi::F32>& rb,
                          ffi::Buffer<ffi::F32>& h0, ffi::Buffer<ffi::S32>& lens,
                          ffi::ResultBuffer<ffi::F32>& y, ffi::ResultBuffer<ffi::F32>& yh,
                          int64_t reverse, float clip, int threads, ffi::ThreadPool& pool,
                          More more) {
  auto rd = r0.dimensions(), yd = y->dimensions();
  if (rd.size() != 2 || r1.dimensions().size() != 2 || yd.size() != 4)
    return ffi::Error::InvalidArgument(what + ": operand ranks");
  int64_t T = yd[0], D = yd[1], B = yd[2], H = rd[1], G = j.gates * H;
  if ((D != 1 && D != 2) || rd[0] != G || r1.dimensions()[0] != G || r1.dimensions()[1] != H ||
      yd[3] != H || (int64_t)xw.element_count() != T * B * D * G)
    return ffi::Error::InvalidArgument(what + ": operand shapes");
  if ((int64_t)rb.element_count() != D * G || (int64_t)wb.element_count() != D * G ||
      (int64_t)h0.element_count() != D * B * H || (int64_t)yh->element_count() != D * B * H ||
      !more(D, B, H))
    return ffi::Error::InvalidArgument(what + ": bias, peephole or state shape");
  int64_t nl = lens.element_count();
  if (nl != 0 && nl != B) return ffi::Error::InvalidArgument(what + ": sequence_lens length");
  if (T == 0 || B == 0 || H == 0) return ffi::Error::InvalidArgument(what + ": empty operand");
  std::vector<float> scratch((size_t)(4 * D * B * H));
  j.xw = xw.typed_data();
  j.wb = wb.typed_data();
  j.R[0] = r0.typed_data();
  j.R[1] = r1.typed_data();
  j.rb = rb.typed_data();
  j.h0 = h0.typed_data();
  j.lens = nl ? lens.typed_data() : nullptr;
  j.y = y->typed_data();
  j.yh = yh->typed_data();
  j.scratch = scratch.data();
  j.T = T; j.B = B; j.D = D; j.H = H;
  j.reverse = reverse != 0;
  j.clip = clip;
  gru_run(j, threads, pool);
  return ffi::Error::Success();
}

ffi::Error Sgru(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> xw, ffi::Buffer<ffi::F32> wb,
                ffi::Buffer<ffi::F32> r0, ffi::Buffer<ffi::F32> r1, ffi::Buffer<ffi::F32> rb,
                ffi::Buffer<ffi::F32> h0, ffi::Buffer<ffi::S32> lens,
                ffi::ResultBuffer<ffi::F32> y, ffi::ResultBuffer<ffi::F32> yh, int64_t threads,
                int64_t linear_before_reset, int64_t reverse, float clip) {
  GruJob j{};
  j.gates = 3;
  j.lbr = linear_before_reset != 0;
  j.phases = j.lbr ? 1 : 2;
  return recurrent_call("oxla_sgru", j, xw, wb, r0, r1, rb, h0, lens, y, yh, reverse, clip,
                        usable(threads, pool, true), pool,
                        [](int64_t, int64_t, int64_t) { return true; });
}

ffi::Error Slstm(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> xw, ffi::Buffer<ffi::F32> wb,
                 ffi::Buffer<ffi::F32> r0, ffi::Buffer<ffi::F32> r1, ffi::Buffer<ffi::F32> rb,
                 ffi::Buffer<ffi::F32> p, ffi::Buffer<ffi::F32> h0, ffi::Buffer<ffi::F32> c0,
                 ffi::Buffer<ffi::S32> lens, ffi::ResultBuffer<ffi::F32> y,
                 ffi::ResultBuffer<ffi::F32> yh, ffi::ResultBuffer<ffi::F32> yc, int64_t threads,
                 int64_t input_forget, int64_t reverse, float clip) {
  GruJob j{};
  j.gates = 4;
  j.phases = 1;
  j.input_forget = input_forget != 0;
  int64_t np = p.element_count();
  j.c0 = c0.typed_data();
  j.P = np ? p.typed_data() : nullptr;
  j.yc = yc->typed_data();
  auto more = [&](int64_t D, int64_t B, int64_t H) {
    return (int64_t)c0.element_count() == D * B * H && (int64_t)yc->element_count() == D * B * H &&
           (np == 0 || np == D * 3 * H);
  };
  return recurrent_call("oxla_slstm", j, xw, wb, r0, r1, rb, h0, lens, y, yh, reverse, clip,
                        usable(threads, pool, true), pool, more);
}

// ---- NonMaxSuppression ("oxla_snms") ------------------------------------------------------------
//
// Greedy per-(batch, class) NMS as oxla's host op and onnxruntime compute it, written as the hint
// of NonMaxSuppressionRanked (oxla/lowering/ops/image.py): row 0 [1, count, 0], then `count` rows
// [batch, class, box] in (batch, class, selection) order, zeros after. Boxes go by descending
// score, ties (0.0 and -0.0 included) to the lower index, NaN scores last; with a score threshold
// only scores above it take part. A box is kept unless a kept box overlaps it: IoU = the
// intersection's width (clamped at 0) times its height over area + area - intersection, in
// float32 as the host's `_overlap_matrix` (no contraction into FMAs), above the threshold; boxes
// without a positive area overlap nothing. Each row ranks only a prefix of its candidates
// (nth_element) and sorts the rest when the prefix runs out before the limit.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

inline float nan_min(float a, float b) { return (a != a || b != b) ? NAN : (b < a ? b : a); }
inline float nan_max(float a, float b) { return (a != a || b != b) ? NAN : (b > a ? b : a); }

#if defined(__AVX512F__)
inline unsigned v_gt_bits(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
#else
inline unsigned v_gt_bits(V a, V b) { return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ)); }
#endif

// The kept boxes of one (batch, class) that can overlap something, one array per corner, padded
// to whole vectors with boxes that overlap nothing.
struct NmsKept {
  std::vector<float> x0, x1, y0, y1, area;
  int64_t n = 0;
  void reset(int64_t cap) {
    int64_t size = (cap + L - 1) / L * L;
    for (auto* v : {&x0, &y0, &area}) v->assign(size, 1.0f);
    for (auto* v : {&x1, &y1}) v->assign(size, 0.0f);
    n = 0;
  }
  void add(float bx0, float bx1, float by0, float by1, float barea) {
    x0[n] = bx0; x1[n] = bx1; y0[n] = by0; y1[n] = by1; area[n] = barea;
    ++n;
  }
  // Whether a kept box overlaps box (cx0, cx1, cy0, cy1, carea): IoU = the intersection's width
  // (clamped at 0) times its height over area + area - intersection > threshold. An intersection
  // empty on either side (or NaN) passes no threshold (clamped width times height is then 0, -0 or
  // NaN), so lanes need a positive width, height and product; the product and the quotient are
  // then the scalar ones (no NaN reaches min and max: boxes with a NaN corner or no positive area
  // never overlap and are not held here).
  bool overlaps(float cx0, float cx1, float cy0, float cy1, float carea, float threshold) const {
    const V bx0 = v_set(cx0), bx1 = v_set(cx1), by0 = v_set(cy0), by1 = v_set(cy1);
    const V barea = v_set(carea), zero = v_zero(), thr = v_set(threshold);
    for (int64_t j = 0; j < n; j += L) {
      V wide = v_sub(v_min(v_load(&x1[j]), bx1), v_max(v_load(&x0[j]), bx0));
      V high = v_sub(v_min(v_load(&y1[j]), by1), v_max(v_load(&y0[j]), by0));
      unsigned live = v_gt_bits(wide, zero) & v_gt_bits(high, zero);
      if (n - j < L) live &= (1u << (n - j)) - 1;
      if (!live) continue;
      V inter = v_mul(wide, high);
      V uni = v_sub(v_add(v_load(&area[j]), barea), inter);
      if (live & v_gt_bits(inter, zero) & v_gt_bits(v_div(inter, uni), thr)) return true;
    }
    return false;
  }
};

struct NmsBox { float y0, x0, y1, x1, area; bool inert; };

// Descending score, ties to the lower index, NaN last, as one unsigned key: ~(the score's bits
// mapped to an increasing order) above the index; -0.0 ranks as 0.0.
inline uint64_t nms_rank(float score, int64_t index) {
  uint32_t u;
  std::memcpy(&u, &score, 4);
  uint32_t key;
  if (score != score) {
    key = 0xFFFFFFFFu;
  } else {
    if (score == 0) u = 0;
    key = ~((u & 0x80000000u) ? ~u : (u | 0x80000000u));
  }
  return (uint64_t)key << 32 | (uint64_t)index;
}

// XLA runs with denormals flushed to zero; the host op (numpy) and onnxruntime keep them: an
// area or intersection below FLT_MIN must not become 0 here. MXCSR is the thread's own, so each
// thread that computes takes one of these.
struct KeepDenormals {
  unsigned csr = _mm_getcsr();
  KeepDenormals() { _mm_setcsr(csr & ~0x8040u); }  // FTZ (bit 15) and DAZ (bit 6) off
  ~KeepDenormals() { _mm_setcsr(csr); }
};

struct NmsJob {
  const NmsBox* corners;  // (B, N)
  const float* scores;    // (B, C, N)
  int64_t* out;           // the hint's rows after its head: row r's kept boxes from r * limit
  int64_t* counts;        // kept boxes of each row
  int64_t B, C, N, limit;
  float iou, min_score;
  bool has_min;
};

// A part's rows (batch, class), one equal part per thread: each one's kept boxes as
// [batch, class, box] at its own slots (Snms compacts them after).
void nms_part(const void* ctx, const Part& p) {
  const NmsJob& j = *static_cast<const NmsJob*>(ctx);
  KeepDenormals keep;
  const int64_t rows = j.B * j.C;
  const int64_t prefix = std::max<int64_t>(2 * j.limit, 64);
  std::vector<uint64_t> order(j.N);
  std::vector<int32_t> kept;
  kept.reserve(j.limit);
  NmsKept held;
  held.reset(j.limit);
  for (int64_t r = p.lo(rows); r < p.hi(rows); ++r) {
    const int64_t b = r / j.C, c = r % j.C;
    const float* s = j.scores + r * j.N;
    const NmsBox* corners = j.corners + b * j.N;
    int64_t n = 0;
    for (int64_t i = 0; i < j.N; ++i)
      if (!j.has_min || s[i] > j.min_score) order[n++] = nms_rank(s[i], i);
    int64_t sorted = std::min(n, prefix);
    if (sorted < n) std::nth_element(order.begin(), order.begin() + sorted, order.begin() + n);
    std::sort(order.begin(), order.begin() + sorted);
    kept.clear();
    held.n = 0;
    for (int64_t p = 0; p < n && (int64_t)kept.size() < j.limit; ++p) {
      if (p == sorted) {
        std::sort(order.begin() + sorted, order.begin() + n);
        sorted = n;
      }
      int32_t box = (int32_t)(order[p] & 0xFFFFFFFFu);
      const NmsBox& e = corners[box];
      if (e.inert) {
        kept.push_back(box);
      } else if (!held.overlaps(e.x0, e.x1, e.y0, e.y1, e.area, j.iou)) {
        kept.push_back(box);
        held.add(e.x0, e.x1, e.y0, e.y1, e.area);
      }
    }
    int64_t* row_out = j.out + 3 * r * j.limit;
    for (int32_t k : kept) {
      row_out[0] = b; row_out[1] = c; row_out[2] = k;
      row_out += 3;
    }
    j.counts[r] = (int64_t)kept.size();
  }
}

ffi::Error Snms(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> boxes, ffi::Buffer<ffi::F32> scores,
                ffi::ResultBuffer<ffi::S64> hint, int64_t threads, int64_t limit, float iou,
                int64_t has_min, float min_score, int64_t center) {
  auto bd = boxes.dimensions();
  auto sd = scores.dimensions();
  if (bd.size() != 3 || bd[2] != 4 || sd.size() != 3 || sd[0] != bd[0] || sd[2] != bd[1] ||
      limit < 1 || limit > bd[1])
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "oxla_snms: boxes must be (B, N, 4), scores (B, C, N), 1 <= limit <= N");
  const int64_t B = bd[0], N = bd[1], C = sd[1];
  if ((int64_t)hint->element_count() != 3 * (1 + B * C * limit))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "oxla_snms: the hint's shape");
  const float* bx = boxes.typed_data();
  int64_t* out = hint->typed_data();
  std::vector<NmsBox> corners(B * N);
  {
    KeepDenormals keep;  // denormal areas stay positive
    for (int64_t i = 0; i < B * N; ++i) {
      const float* q = bx + i * 4;
      NmsBox& e = corners[i];
      if (center) {  // [x_center, y_center, width, height]
        float hh = q[3] / 2, hw = q[2] / 2;
        e.y0 = q[1] - hh; e.x0 = q[0] - hw; e.y1 = q[1] + hh; e.x1 = q[0] + hw;
      } else {
        e.y0 = nan_min(q[0], q[2]); e.x0 = nan_min(q[1], q[3]);
        e.y1 = nan_max(q[0], q[2]); e.x1 = nan_max(q[1], q[3]);
      }
      float area = (e.y1 - e.y0) * (e.x1 - e.x0);
      e.area = area > 0 ? area : NAN;
      e.inert = !(area > 0) || e.y0 != e.y0 || e.x0 != e.x0 || e.y1 != e.y1 || e.x1 != e.x1;
    }
  }
  std::vector<int64_t> counts(B * C);
  NmsJob j{corners.data(), scores.typed_data(), out + 3, counts.data(), B, C, N, limit,
           iou, min_score, has_min != 0};
  // a row's ranking and greedy pass: ~N + the kept boxes' overlaps, counted as flops for
  // `parallel`'s choice of threads
  parallel(nms_part, &j, usable(threads, pool), (double)(B * C) * (double)N * 64.0, pool, 1);
  // the rows' boxes one after another (each moves down, never past the next row's)
  int64_t count = 0;
  for (int64_t r = 0; r < B * C; ++r) {
    if (count != r * limit && counts[r])
      std::memmove(out + 3 + 3 * count, out + 3 + 3 * r * limit, sizeof(int64_t) * 3 * counts[r]);
    count += counts[r];
  }
  std::fill(out + 3 + 3 * count, out + 3 * (1 + B * C * limit), int64_t{0});
  out[0] = 1;
  out[1] = count;
  out[2] = 0;
  return ffi::Error::Success();
}

#pragma GCC pop_options

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(OxlaSgemm, Sgemm,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // X (..., K)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // W packed (P, K, 32)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // bias (N,)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // residual: Y's shape, or (0,)
                                  .Ret<ffi::Buffer<ffi::F32>>()   // Y (..., N)
                                  .Attr<int64_t>("threads")
                                  .Attr<int64_t>("act")
                                  .Attr<float>("lo")
                                  .Attr<float>("hi"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(OxlaSconv, Sconv,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // X (N, H, W, C)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // W packed (P, KH KW C / groups, 32)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // bias (M,)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // residual: Y's shape, or (0,)
                                  .Ret<ffi::Buffer<ffi::F32>>()   // Y (N, OH, OW, M)
                                  .Attr<int64_t>("threads")
                                  .Attr<int64_t>("act")
                                  .Attr<float>("lo")
                                  .Attr<float>("hi")
                                  .Attr<int64_t>("kh")
                                  .Attr<int64_t>("kw")
                                  .Attr<int64_t>("sh")
                                  .Attr<int64_t>("sw")
                                  .Attr<int64_t>("dh")
                                  .Attr<int64_t>("dw")
                                  .Attr<int64_t>("pt")
                                  .Attr<int64_t>("pl")
                                  .Attr<int64_t>("groups"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(OxlaSwino, Swino,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // X (N, H, W, C)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // U packed (16, P, C, 32)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // bias (M,)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // residual: Y's shape, or (0,)
                                  .Ret<ffi::Buffer<ffi::F32>>()   // Y (N, H, W, M)
                                  .Attr<int64_t>("threads")
                                  .Attr<int64_t>("act")
                                  .Attr<float>("lo")
                                  .Attr<float>("hi"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(OxlaSdwconv, Sdwconv,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // X (N, H, W, C)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // W (KH, KW, C)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // bias (C,)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // pre_bias (C,) or (0,)
                                  .Ret<ffi::Buffer<ffi::F32>>()   // Y (N, OH, OW, C)
                                  .Attr<int64_t>("threads")
                                  .Attr<int64_t>("act")
                                  .Attr<float>("lo")
                                  .Attr<float>("hi")
                                  .Attr<int64_t>("sh")
                                  .Attr<int64_t>("sw")
                                  .Attr<int64_t>("dh")
                                  .Attr<int64_t>("dw")
                                  .Attr<int64_t>("pt")
                                  .Attr<int64_t>("pl")
                                  .Attr<int64_t>("pre_act")      // -1: X read as it is
                                  .Attr<float>("pre_lo")
                                  .Attr<float>("pre_hi"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(OxlaSstem, Sstem,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // X (N, C, H, W) or (N, H, W, C)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // W packed (P, KH KW C / groups, 32)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // bias (M,)
                                  .Ret<ffi::Buffer<ffi::F32>>()   // Y (N, ot + OH + ob, ...)
                                  .Attr<int64_t>("threads")
                                  .Attr<int64_t>("act")
                                  .Attr<float>("lo")
                                  .Attr<float>("hi")
                                  .Attr<int64_t>("kh")
                                  .Attr<int64_t>("kw")
                                  .Attr<int64_t>("sh")
                                  .Attr<int64_t>("sw")
                                  .Attr<int64_t>("dh")
                                  .Attr<int64_t>("dw")
                                  .Attr<int64_t>("pt")
                                  .Attr<int64_t>("pl")
                                  .Attr<int64_t>("channels_first")
                                  .Attr<int64_t>("out_top")       // Y's zero border
                                  .Attr<int64_t>("out_left")
                                  .Attr<int64_t>("out_bottom")
                                  .Attr<int64_t>("out_right"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(OxlaSgru, Sgru,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // X W^T (T B, D 3H)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // W's bias (D, 3H)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // R of direction 0 (3H, H)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // R of direction 1, or 0's
                                  .Arg<ffi::Buffer<ffi::F32>>()   // Rb (D, 3H)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // initial state (D, B, H)
                                  .Arg<ffi::Buffer<ffi::S32>>()   // sequence_lens (B,) or (0,)
                                  .Ret<ffi::Buffer<ffi::F32>>()   // Y (T, D, B, H)
                                  .Ret<ffi::Buffer<ffi::F32>>()   // Y_h (D, B, H)
                                  .Attr<int64_t>("threads")
                                  .Attr<int64_t>("linear_before_reset")
                                  .Attr<int64_t>("reverse")       // D = 1: backward in time
                                  .Attr<float>("clip"));         // <= 0: none

XLA_FFI_DEFINE_HANDLER_SYMBOL(OxlaSlstm, Slstm,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // X W^T (T B, D 4H)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // W's bias (D, 4H)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // R of direction 0 (4H, H)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // R of direction 1, or 0's
                                  .Arg<ffi::Buffer<ffi::F32>>()   // Rb (D, 4H)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // P (D, 3H) or (0,)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // initial hidden state (D, B, H)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // initial cell state (D, B, H)
                                  .Arg<ffi::Buffer<ffi::S32>>()   // sequence_lens (B,) or (0,)
                                  .Ret<ffi::Buffer<ffi::F32>>()   // Y (T, D, B, H)
                                  .Ret<ffi::Buffer<ffi::F32>>()   // Y_h (D, B, H)
                                  .Ret<ffi::Buffer<ffi::F32>>()   // Y_c (D, B, H)
                                  .Attr<int64_t>("threads")
                                  .Attr<int64_t>("input_forget")
                                  .Attr<int64_t>("reverse")       // D = 1: backward in time
                                  .Attr<float>("clip"));         // <= 0: none

XLA_FFI_DEFINE_HANDLER_SYMBOL(OxlaSnms, Snms,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // boxes (B, N, 4)
                                  .Arg<ffi::Buffer<ffi::F32>>()   // scores (B, C, N)
                                  .Ret<ffi::Buffer<ffi::S64>>()   // hint (1 + B C limit, 3)
                                  .Attr<int64_t>("threads")
                                  .Attr<int64_t>("limit")         // max_output_boxes_per_class
                                  .Attr<float>("iou")
                                  .Attr<int64_t>("has_min")       // 0: no score threshold
                                  .Attr<float>("min_score")
                                  .Attr<int64_t>("center"));      // center_point_box
