// oxla's float32 GEMM for XLA:CPU, reached through an XLA FFI custom call ("oxla_sgemm").
//
// Y[..., N] = act(X[..., K] * W[K, N] + bias[N] (+ R[..., N])), W packed once at plan time into
// panels of 32 columns, (ceil(N / 32), K, 32), zero padded (`pack` in oxla/native/__init__.py);
// act is none, Relu, Clip(lo, hi), x * sigmoid(x) (SiLU, with the MLAS polynomial that oxla's
// Sigmoid uses) or HardSwish, applied to each stored tile while it is in L1.
//
// Why oxla owns this kernel (docs/benchmarks.md, ninth round): XLA:CPU's dots gain 0.9-1.9x
// from the second core, onnxruntime's MLAS 2x. This kernel cuts a product into parts that the
// calling thread and the intra-op pool's threads claim one at a time, so that a pool thread
// that wakes late (25-70 us on these VMs) costs only its share; the fused epilogue saves the
// pass over the output that the activation or residual Add took. On one core it is within
// 0-12% of MLAS on the suite's 1x1 shapes (AVX-512, 12 rows x 32 columns per micro-tile, 24
// accumulators) but no faster than XLA's dot inside a model, so oxla uses it on several cores.
//
// Needs AVX-512F; built on first use by oxla/native/__init__.py with the host's C++ compiler.

#include <immintrin.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int NR = 32;  // columns per packed panel (two 16-lane vectors)
constexpr int MR = 12;  // rows per micro-tile
// W's packed panels read in place while W fits in half of L2; above that each thread first packs
// its rows of X so that one panel of W stays in cache across all of them.
constexpr int64_t DIRECT_W_BYTES = 1 << 20;

enum Act : int64_t { NONE = 0, RELU = 1, CLIP = 2, SILU = 3, HARD_SWISH = 4 };

// What happens to a stored tile (acc + bias) next: + residual R (Y's layout), activation.
struct Epilogue {
  const float* residual;  // nullptr or R at the tile's first element
  int64_t ldr;
  int64_t act;
  float lo, hi;           // Clip's bounds
};

// x * sigmoid(x), sigmoid as MLAS's rational polynomial (oxla's Sigmoid: elementwise.py)
inline __m512 silu(__m512 v) {
  __m512 x = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-18.0f)), _mm512_set1_ps(18.0f));
  __m512 x2 = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(4.37031012579801e-11f);
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(1.15627324459942e-07f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(6.08574864600143e-05f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(8.51377133304701e-03f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(2.48287947061529e-01f));
  __m512 q = _mm512_set1_ps(6.10247389755681e-13f);
  q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(5.76102136993427e-09f));
  q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(6.29106785017040e-06f));
  q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(1.70198817374094e-03f));
  q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(1.16817656904453e-01f));
  q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(9.93151921023180e-01f));
  __m512 s = _mm512_add_ps(_mm512_div_ps(_mm512_mul_ps(p, x), q), _mm512_set1_ps(0.5f));
  s = _mm512_min_ps(_mm512_max_ps(s, _mm512_setzero_ps()), _mm512_set1_ps(1.0f));
  return _mm512_mul_ps(v, s);
}

// A tile's rows: acc + bias, stored under the column masks (all 16 when !MASK).
template <int R, int NV, bool MASK>
inline void store_tile(__m512 (&c0)[R], __m512 (&c1)[R], float* C, int64_t ldc,
                       const float* bias, __mmask16 m0, __mmask16 m1) {
  __m512 z0 = _mm512_maskz_loadu_ps(m0, bias);
  __m512 z1 = NV == 2 ? _mm512_maskz_loadu_ps(m1, bias + 16) : z0;
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) {
    if (MASK && NV == 1) _mm512_mask_storeu_ps(C + i * ldc, m0, _mm512_add_ps(c0[i], z0));
    else _mm512_storeu_ps(C + i * ldc, _mm512_add_ps(c0[i], z0));
    if (NV == 2) {
      if (MASK) _mm512_mask_storeu_ps(C + i * ldc + 16, m1, _mm512_add_ps(c1[i], z1));
      else _mm512_storeu_ps(C + i * ldc + 16, _mm512_add_ps(c1[i], z1));
    }
  }
}

// The rest of the epilogue over a stored tile, still in L1: + residual, activation.
template <int64_t ACT>
void post_rows(float* C, int64_t ldc, const float* r, int64_t ldr, int rows, int64_t nc,
               const Epilogue& e) {
  for (int i = 0; i < rows; ++i) {
    for (int64_t c = 0; c < nc; c += 16) {
      __mmask16 m = nc - c >= 16 ? 0xFFFF : (__mmask16)((1u << (nc - c)) - 1);
      float* y = C + i * ldc + c;
      __m512 v = _mm512_maskz_loadu_ps(m, y);
      if (r) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, r + i * ldr + c));
      if (ACT == RELU) v = _mm512_max_ps(v, _mm512_setzero_ps());
      if (ACT == CLIP) v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(e.lo)), _mm512_set1_ps(e.hi));
      if (ACT == SILU) v = silu(v);
      if (ACT == HARD_SWISH) {
        __m512 g = _mm512_fmadd_ps(v, _mm512_set1_ps(1.0f / 6.0f), _mm512_set1_ps(0.5f));
        g = _mm512_min_ps(_mm512_max_ps(g, _mm512_setzero_ps()), _mm512_set1_ps(1.0f));
        v = _mm512_mul_ps(v, g);
      }
      _mm512_mask_storeu_ps(y, m, v);
    }
  }
}

void post(float* C, int64_t ldc, int rows, int64_t nc, const Epilogue& e) {
  if (e.act == NONE && e.residual == nullptr) return;
  switch (e.act) {
    case RELU: post_rows<RELU>(C, ldc, e.residual, e.ldr, rows, nc, e); break;
    case CLIP: post_rows<CLIP>(C, ldc, e.residual, e.ldr, rows, nc, e); break;
    case SILU: post_rows<SILU>(C, ldc, e.residual, e.ldr, rows, nc, e); break;
    case HARD_SWISH: post_rows<HARD_SWISH>(C, ldc, e.residual, e.ldr, rows, nc, e); break;
    default: post_rows<NONE>(C, ldc, e.residual, e.ldr, rows, nc, e); break;
  }
}

// One micro-tile, rows read in place: C[0:R, 0:nc] = A[0:R, :K] * Bp[:K, 0:32], finished.
template <int R, int NV, bool MASK>
inline void tile_direct(int64_t K, const float* __restrict A, int64_t lda,
                        const float* __restrict Bp, float* C, int64_t ldc, const float* bias,
                        __mmask16 m0, __mmask16 m1) {
  __m512 c0[R], c1[R];
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) {
    c0[i] = _mm512_setzero_ps();
    c1[i] = _mm512_setzero_ps();
  }
  const float* a4 = A + 4 * lda;
  const float* a8 = A + 8 * lda;
  for (int64_t k = 0; k < K; ++k) {
    __m512 b0 = _mm512_loadu_ps(Bp);
    __m512 b1 = NV == 2 ? _mm512_loadu_ps(Bp + 16) : b0;
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      const float* base = i < 4 ? A : i < 8 ? a4 : a8;
      __m512 a = _mm512_set1_ps(base[(i & 3) * lda + k]);
      c0[i] = _mm512_fmadd_ps(a, b0, c0[i]);
      if (NV == 2) c1[i] = _mm512_fmadd_ps(a, b1, c1[i]);
    }
    Bp += NR;
  }
  store_tile<R, NV, MASK>(c0, c1, C, ldc, bias, m0, m1);
}

// One micro-tile, rows packed as (K, R): the same product.
template <int R, int NV, bool MASK>
inline void tile_packed(int64_t K, const float* __restrict Ap, const float* __restrict Bp,
                        float* C, int64_t ldc, const float* bias, __mmask16 m0, __mmask16 m1) {
  __m512 c0[R], c1[R];
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) {
    c0[i] = _mm512_setzero_ps();
    c1[i] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < K; ++k) {
    __m512 b0 = _mm512_loadu_ps(Bp);
    __m512 b1 = NV == 2 ? _mm512_loadu_ps(Bp + 16) : b0;
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      __m512 a = _mm512_set1_ps(Ap[i]);
      c0[i] = _mm512_fmadd_ps(a, b0, c0[i]);
      if (NV == 2) c1[i] = _mm512_fmadd_ps(a, b1, c1[i]);
    }
    Ap += R;
    Bp += NR;
  }
  store_tile<R, NV, MASK>(c0, c1, C, ldc, bias, m0, m1);
}

struct Panel {
  int64_t n0, nc;
  __mmask16 m0, m1;
};

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
  Panel panel(int64_t p) const {
    Panel q;
    q.n0 = p * NR;
    q.nc = N - q.n0 < NR ? N - q.n0 : NR;
    q.m0 = q.nc >= 16 ? 0xFFFF : (__mmask16)((1u << q.nc) - 1);
    q.m1 = q.nc >= 32 ? 0xFFFF : q.nc > 16 ? (__mmask16)((1u << (q.nc - 16)) - 1) : 0;
    return q;
  }
  int64_t row(int64_t b) const { return M * b / blocks; }
};

template <int NV, bool MASK>
void direct_rows(int r, int64_t K, const float* A, int64_t lda, const float* Bp, float* C,
                 int64_t ldc, const float* bias, __mmask16 m0, __mmask16 m1) {
  switch (r) {
#define OXLA_R(n) case n: tile_direct<n, NV, MASK>(K, A, lda, Bp, C, ldc, bias, m0, m1); break;
    OXLA_R(1) OXLA_R(2) OXLA_R(3) OXLA_R(4) OXLA_R(5) OXLA_R(6)
    OXLA_R(7) OXLA_R(8) OXLA_R(9) OXLA_R(10) OXLA_R(11) OXLA_R(12)
#undef OXLA_R
  }
}

template <int NV, bool MASK>
void packed_rows(int r, int64_t K, const float* Ap, const float* Bp, float* C, int64_t ldc,
                 const float* bias, __mmask16 m0, __mmask16 m1) {
  switch (r) {
#define OXLA_R(n) case n: tile_packed<n, NV, MASK>(K, Ap, Bp, C, ldc, bias, m0, m1); break;
    OXLA_R(1) OXLA_R(2) OXLA_R(3) OXLA_R(4) OXLA_R(5) OXLA_R(6)
    OXLA_R(7) OXLA_R(8) OXLA_R(9) OXLA_R(10) OXLA_R(11) OXLA_R(12)
#undef OXLA_R
  }
}

void tile(const Job& j, int64_t b, const Panel& q, const float* ap) {
  int64_t r0 = j.row(b);
  int r = (int)(j.row(b + 1) - r0);
  const float* bp = j.Bp + q.n0 * j.K;
  const float* bias = j.bias + q.n0;
  float* c = j.C + r0 * j.N + q.n0;
  if (ap == nullptr) {
    const float* a = j.A + r0 * j.K;
    if (q.nc == 32) direct_rows<2, false>(r, j.K, a, j.K, bp, c, j.N, bias, q.m0, q.m1);
    else if (q.nc > 16) direct_rows<2, true>(r, j.K, a, j.K, bp, c, j.N, bias, q.m0, q.m1);
    else if (q.nc == 16) direct_rows<1, false>(r, j.K, a, j.K, bp, c, j.N, bias, q.m0, q.m1);
    else direct_rows<1, true>(r, j.K, a, j.K, bp, c, j.N, bias, q.m0, q.m1);
  } else {
    if (q.nc == 32) packed_rows<2, false>(r, j.K, ap, bp, c, j.N, bias, q.m0, q.m1);
    else if (q.nc > 16) packed_rows<2, true>(r, j.K, ap, bp, c, j.N, bias, q.m0, q.m1);
    else if (q.nc == 16) packed_rows<1, false>(r, j.K, ap, bp, c, j.N, bias, q.m0, q.m1);
    else packed_rows<1, true>(r, j.K, ap, bp, c, j.N, bias, q.m0, q.m1);
  }
  Epilogue e{j.residual ? j.residual + r0 * j.N + q.n0 : nullptr, j.N, j.act, j.lo, j.hi};
  post(c, j.N, r, q.nc, e);
}

// Row blocks [b0, b1) times column panels [p0, p1).
void run_range(const Job& j, int64_t b0, int64_t b1, int64_t p0, int64_t p1) {
  if (j.direct) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t p = p0; p < p1; ++p) tile(j, b, j.panel(p), nullptr);
    return;
  }
  thread_local std::vector<float> buf;
  buf.resize((size_t)((b1 - b0) * MR * j.K));
  for (int64_t b = b0; b < b1; ++b) {
    int64_t r0 = j.row(b);
    int r = (int)(j.row(b + 1) - r0);
    const float* a = j.A + r0 * j.K;
    float* dst = buf.data() + (b - b0) * MR * j.K;
    for (int64_t k = 0; k < j.K; ++k)
      for (int i = 0; i < r; ++i) dst[k * r + i] = a[i * j.K + k];
  }
  for (int64_t p = p0; p < p1; ++p) {
    Panel q = j.panel(p);
    for (int64_t b = b0; b < b1; ++b) tile(j, b, q, buf.data() + (b - b0) * MR * j.K);
  }
}

// Part `part` of `parts`: rows split when there are enough row blocks, else column panels.
void run_part(const Job& j, int part, int parts) {
  int64_t panels = (j.N + NR - 1) / NR;
  if (j.blocks >= 4 * parts || panels < parts)
    run_range(j, j.blocks * part / parts, j.blocks * (part + 1) / parts, 0, panels);
  else
    run_range(j, 0, j.blocks, panels * part / parts, panels * (part + 1) / parts);
}

// A kernel's work is cut into `chunks` parts that the caller and the intra-op pool's threads
// claim one at a time through `ticket` (generation << 32 | next part). A pool thread that starts
// late finds nothing left, and the caller, which never waits for a part nobody claimed, has done
// the work itself. The team outlives every call, so a late pool task only reads its ticket.
using PartFn = void (*)(const void* ctx, int part, int parts);

struct Team {
  std::mutex busy;  // one parallel call at a time; a concurrent one runs on its caller alone
  std::atomic<uint64_t> ticket{0};
  std::atomic<int64_t> finished{0};  // parts done in the current call
  PartFn fn = nullptr;
  const void* ctx = nullptr;
  int chunks = 1;
  uint64_t gen = 0;

  // Claim and run parts of generation `g` until none is left.
  void work(uint64_t g) {
    for (;;) {
      uint64_t t = ticket.load(std::memory_order_acquire);
      if ((t >> 32) != g || (int64_t)(t & 0xFFFFFFFFu) >= chunks) return;
      if (!ticket.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel)) continue;
      fn(ctx, (int)(t & 0xFFFFFFFFu), chunks);
      finished.fetch_add(1, std::memory_order_release);
    }
  }
};

Team* team() {
  static Team* t = new Team();  // never freed: late pool tasks may still read it at exit
  return t;
}

// Parts per thread: finer parts let a late pool thread take a share (EfficientNet-B0: the pool's
// thread ran 41% of the parts with 2, 4 or 8 per thread).
constexpr int CHUNKS_PER_THREAD = 2;

// fn(ctx, part, parts) over every part, on `threads` threads when the work is worth a handoff.
void parallel(PartFn fn, const void* ctx, int threads, bool worth, ffi::ThreadPool& pool) {
  if (threads > 1 && worth) {
    Team* t = team();
    std::unique_lock<std::mutex> lock(t->busy, std::try_to_lock);
    if (lock.owns_lock()) {
      uint64_t g = (t->gen + 1) & 0xFFFFFFFFu;
      t->gen = g;
      t->fn = fn;
      t->ctx = ctx;
      t->chunks = CHUNKS_PER_THREAD * threads;
      t->finished.store(0, std::memory_order_relaxed);
      t->ticket.store(g << 32, std::memory_order_release);
      for (int i = 0; i < threads - 1; ++i) pool.Schedule([t, g] { t->work(g); });
      t->work(g);
      while (t->finished.load(std::memory_order_acquire) < t->chunks) _mm_pause();
      return;
    }
  }
  fn(ctx, 0, 1);
}

void gemm_part(const void* ctx, int part, int parts) {
  run_part(*static_cast<const Job*>(ctx), part, parts);
}

// The threads a call may use: its attribute, capped by the client's pool and the machine.
int usable(int64_t threads, ffi::ThreadPool& pool) {
  int64_t pooled = pool.num_threads();
  if (pooled > 0 && threads > pooled) threads = pooled;
  unsigned cores = std::thread::hardware_concurrency();
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
  j.direct = K * N * 4 <= DIRECT_W_BYTES;
  double flops = 2.0 * (double)M * (double)K * (double)N;
  parallel(gemm_part, &j, usable(threads, pool), flops >= 4e5, pool);  // below, ~3 us of work
  return ffi::Error::Success();
}

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
