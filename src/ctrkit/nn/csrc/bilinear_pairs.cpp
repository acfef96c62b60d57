// FiBiNET's shared bilinear node (ctrkit.nn.bilinear_pairs_native), forward and backward, on plain float / double
// arrays (built by ctrkit.nn.kernels, called through ctypes: no torch headers).
//
// Layout: feature-major, the batch in the last (contiguous) dim, so L consecutive samples of one row are one SIMD
// vector and every per-sample formula below is one scalar program run on L samples at once (vertical
// multiply-adds, no transposes, no horizontal sums except dW's, once per pair and thread).
//
//   e    (F, D, B)       the fields v_i, row (i, d)
//   a    (F, B)          SENET's field weights a_i
//   w    (P, D, D)       W_ij[d][c] of the pairs i < j in upper-triangle order (i outer, j inner)
//   x    (2 P D, B)      the DNN input X^T: rows (pair, c) hold p_ij = (v_i W_ij) ⊙ v_j, rows P D + (pair, c)
//                        hold q_ij = a_i a_j p_ij (the same layer applied to the re-weighted fields a_i v_i)
//
// Backward, per pair and sample, with u = v_i W_ij, s = a_i a_j and g_p, g_q the gradient's p and q rows:
//   dp = g_p + s g_q,  ds = <g_q, u ⊙ v_j>,  da_i += ds a_j,  da_j += ds a_i,
//   dv_j += dp ⊙ u,  du = dp ⊙ v_j,  dv_i += W_ij du,  dW_ij += v_i^T du (summed over samples)
// u is recomputed (D x D multiply-adds) instead of kept: one pass over the pairs reads g once and writes nothing
// per pair but the fields' gradient rows. The batch tail (B mod L samples) runs the same program one sample at a
// time.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "lanes.h"

namespace {

constexpr int kMaxDim = 64;

using namespace ctrkit_lanes;


struct Shape {
  int64_t b;  // samples, the row stride of every array
  int f, d;
};

// The pairs' left and right fields in upper-triangle order.
inline void pair_fields(int f, std::vector<int>& left, std::vector<int>& right) {
  for (int i = 0; i < f; ++i)
    for (int j = i + 1; j < f; ++j) left.push_back(i), right.push_back(j);
}

// u = v_i W (D lanes-vectors) for the samples at column col.
template <typename V, typename T, int DD>
inline void left_product(const T* __restrict vi, const T* __restrict w, int64_t b, int d, V* __restrict u) {
  const int dim = DD > 0 ? DD : d;
  for (int c = 0; c < dim; ++c) u[c] = V{};
  for (int r = 0; r < dim; ++r) {
    const V x = load<V>(vi + r * b);
    const T* wr = w + r * dim;
    for (int c = 0; c < dim; ++c) u[c] += x * wr[c];
  }
}

// The forward of one pair for the samples at column col (W one lane vector V, or one scalar T for the batch tail):
// W of this pair, the v_i and v_j rows, a_i and a_j, the p and q rows of x.
template <typename W, typename T, int DD>
inline void forward_cols(int64_t b, int d, const T* __restrict vi, const T* __restrict vj, const T* __restrict ai,
                         const T* __restrict aj, const T* __restrict w, T* __restrict xp, T* __restrict xq,
                         int64_t col) {
  const int dim = DD > 0 ? DD : d;
  W u[DD > 0 ? DD : kMaxDim];
  left_product<W, T, DD>(vi + col, w, b, dim, u);
  const W s = load<W>(ai + col) * load<W>(aj + col);
  for (int c = 0; c < dim; ++c) {
    const W p = u[c] * load<W>(vj + c * b + col);
    store(xp + c * b + col, p);
    store(xq + c * b + col, p * s);
  }
}

template <typename T, int DD>
void forward_pair(const Shape& sh, const T* vi, const T* vj, const T* ai, const T* aj, const T* w, T* xp, T* xq,
                  int64_t c0, int64_t c1) {
  using V = typename Lanes<T>::V;
  constexpr int kL = Lanes<T>::kCount;
  int64_t col = c0;
  for (; col + kL <= c1; col += kL) forward_cols<V, T, DD>(sh.b, sh.d, vi, vj, ai, aj, w, xp, xq, col);
  for (; col < c1; ++col) forward_cols<T, T, DD>(sh.b, sh.d, vi, vj, ai, aj, w, xp, xq, col);
}

// The backward of one pair for the samples at column col, accumulating into dv_i, dv_j, da_i, da_j (rows of this
// thread's columns); du = dp ⊙ v_j (D values per sample) goes to ``du_out`` for dW.
template <typename W, typename T, int DD>
inline void backward_cols(int64_t b, int d, const T* __restrict vi, const T* __restrict vj, const T* __restrict ai,
                          const T* __restrict aj, const T* __restrict w, const T* __restrict gp,
                          const T* __restrict gq, T* __restrict dvi, T* __restrict dvj, T* __restrict dai,
                          T* __restrict daj, W* __restrict du_out, int64_t col) {
  const int dim = DD > 0 ? DD : d;
  W u[DD > 0 ? DD : kMaxDim], du[DD > 0 ? DD : kMaxDim];
  left_product<W, T, DD>(vi + col, w, b, dim, u);
  const W a_i = load<W>(ai + col), a_j = load<W>(aj + col), s = a_i * a_j;
  W ds = W{};
  for (int c = 0; c < dim; ++c) {
    const int64_t k = c * b + col;
    const W v = load<W>(vj + k), g = load<W>(gq + k);
    ds += g * (u[c] * v);
    const W dp = load<W>(gp + k) + s * g;
    store(dvj + k, load<W>(dvj + k) + dp * u[c]);
    du[c] = dp * v;
    du_out[c] = du[c];
  }
  store(dai + col, load<W>(dai + col) + ds * a_j);
  store(daj + col, load<W>(daj + col) + ds * a_i);
  for (int r = 0; r < dim; ++r) {
    const T* wr = w + r * dim;
    const int64_t k = r * b + col;
    W t = du[0] * wr[0];
    for (int c = 1; c < dim; ++c) t += du[c] * wr[c];
    store(dvi + k, load<W>(dvi + k) + t);
  }
}

// acc[r][c] += sum over the n vectors of samples from column col of v_i[r] du[c] (du: n x D vectors), in 4 x 4
// register blocks (the partial sums are read and written once per call, not once per vector of samples).
template <typename V, typename T, int DD>
inline void accumulate_dw(const T* __restrict vi, int64_t b, int d, int64_t col, int n, const V* __restrict du,
                          V* __restrict acc) {
  constexpr int kL = Lanes<T>::kCount;
  const int dim = DD > 0 ? DD : d;
  for (int r0 = 0; r0 < dim; r0 += 4)
    for (int c0 = 0; c0 < dim; c0 += 4) {
      constexpr bool kWhole = DD > 0 && DD % 4 == 0;  // compile-time 4 x 4 blocks: the sums stay in registers
      const int nr = kWhole || dim - r0 >= 4 ? 4 : dim - r0, nc = kWhole || dim - c0 >= 4 ? 4 : dim - c0;
      V a[4][4];
      for (int i = 0; i < nr; ++i)
        for (int j = 0; j < nc; ++j) a[i][j] = acc[(r0 + i) * dim + c0 + j];
      for (int m = 0; m < n; ++m) {
        V x[4], y[4];
        for (int i = 0; i < nr; ++i) x[i] = load<V>(vi + (r0 + i) * b + col + m * kL);
        for (int j = 0; j < nc; ++j) y[j] = du[m * dim + c0 + j];
        for (int i = 0; i < nr; ++i)
          for (int j = 0; j < nc; ++j) a[i][j] += x[i] * y[j];
      }
      for (int i = 0; i < nr; ++i)
        for (int j = 0; j < nc; ++j) acc[(r0 + i) * dim + c0 + j] = a[i][j];
    }
}

constexpr int kGroup = 16;  // vectors of samples per dW accumulation: their du (16 x D vectors) stays in L1

// The backward of one pair on the samples [c0, c1): dW's per-lane partial sums into acc, the batch tail's (scalars)
// into acc1. ``dub``: scratch of kGroup * D vectors.
template <typename T, int DD>
void backward_pair(const Shape& sh, const T* vi, const T* vj, const T* ai, const T* aj, const T* w, const T* gp,
                   const T* gq, T* dvi, T* dvj, T* dai, T* daj, typename Lanes<T>::V* acc, T* acc1,
                   typename Lanes<T>::V* dub, int64_t c0, int64_t c1) {
  using V = typename Lanes<T>::V;
  constexpr int kL = Lanes<T>::kCount;
  const int dim = DD > 0 ? DD : sh.d;
  int64_t col = c0;
  while (col + kL <= c1) {
    const int64_t start = col;
    int n = 0;
    for (; n < kGroup && col + kL <= c1; ++n, col += kL)
      backward_cols<V, T, DD>(sh.b, sh.d, vi, vj, ai, aj, w, gp, gq, dvi, dvj, dai, daj, dub + n * dim, col);
    accumulate_dw<V, T, DD>(vi, sh.b, sh.d, start, n, dub, acc);
  }
  for (; col < c1; ++col) {
    T du[DD > 0 ? DD : kMaxDim];
    backward_cols<T, T, DD>(sh.b, sh.d, vi, vj, ai, aj, w, gp, gq, dvi, dvj, dai, daj, du, col);
    for (int r = 0; r < dim; ++r)
      for (int c = 0; c < dim; ++c) acc1[r * dim + c] += vi[r * sh.b + col] * du[c];
  }
}

// Each thread takes a contiguous range of whole vectors of samples and runs every pair over it (pairs outer, so
// one pair's W and dW partial sums stay in L1 while its rows stream).
template <typename T, int DD>
void forward_all(const Shape& sh, const T* e, const T* a, const T* w, T* x, int threads) {
  std::vector<int> left, right;
  pair_fields(sh.f, left, right);
  const int64_t p = static_cast<int64_t>(left.size()), d = sh.d, b = sh.b;
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    int64_t c0, c1;
    thread_columns(b, Lanes<T>::kCount, c0, c1);
    for (int64_t k = 0; k < p; ++k)
      forward_pair<T, DD>(sh, e + left[k] * d * b, e + right[k] * d * b, a + left[k] * b, a + right[k] * b,
                          w + k * d * d, x + k * d * b, x + (p + k) * d * b, c0, c1);
  }
}

template <typename T, int DD>
void backward_all(const Shape& sh, const T* e, const T* a, const T* w, const T* g, T* de, T* da, T* dw,
                  int threads) {
  using V = typename Lanes<T>::V;
  std::vector<int> left, right;
  pair_fields(sh.f, left, right);
  const int64_t p = static_cast<int64_t>(left.size()), d = sh.d, b = sh.b, dd = d * d;
  std::memset(de, 0, sizeof(T) * sh.f * d * b);
  std::memset(da, 0, sizeof(T) * sh.f * b);
  std::memset(dw, 0, sizeof(T) * p * dd);
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    int64_t c0, c1;
    thread_columns(b, Lanes<T>::kCount, c0, c1);
    std::vector<V> acc(static_cast<size_t>(dd));
    std::vector<V> dub(static_cast<size_t>(kGroup * d));
    std::vector<T> acc1(static_cast<size_t>(dd)), part(static_cast<size_t>(p * dd));
    for (int64_t k = 0; k < p; ++k) {
      std::fill(acc.begin(), acc.end(), V{});
      std::fill(acc1.begin(), acc1.end(), T(0));
      const int64_t i = left[k], j = right[k];
      backward_pair<T, DD>(sh, e + i * d * b, e + j * d * b, a + i * b, a + j * b, w + k * dd, g + k * d * b,
                           g + (p + k) * d * b, de + i * d * b, de + j * d * b, da + i * b, da + j * b, acc.data(),
                           acc1.data(), dub.data(), c0, c1);
      for (int64_t r = 0; r < dd; ++r) part[k * dd + r] = lane_sum(acc[r]) + acc1[r];
    }
#pragma omp critical
    for (int64_t r = 0; r < p * dd; ++r) dw[r] += part[r];
  }
}

}  // namespace

// Entry points: every array C-contiguous as above. Returns 0, or 1 when the shape is outside the kernel's limits
// (2 <= F, 1 <= D <= 64, B >= 0) with nothing written. ``threads``: OpenMP threads over ranges of samples.
#define CTRKIT_BILINEAR_PAIRS(SUFFIX, T)                                                                        \
  extern "C" int ctrkit_bilinear_shared_forward_##SUFFIX(const T* e, const T* a, const T* w, T* x, int64_t b,   \
                                                         int f, int d, int threads) {                          \
    if (f < 2 || d < 1 || d > kMaxDim || b < 0) return 1;                                                      \
    const Shape sh{b, f, d};                                                                                   \
    if (d == 16)                                                                                               \
      forward_all<T, 16>(sh, e, a, w, x, threads);                                                             \
    else if (d == 8)                                                                                           \
      forward_all<T, 8>(sh, e, a, w, x, threads);                                                              \
    else                                                                                                       \
      forward_all<T, 0>(sh, e, a, w, x, threads);                                                              \
    return 0;                                                                                                  \
  }                                                                                                            \
  extern "C" int ctrkit_bilinear_shared_backward_##SUFFIX(const T* e, const T* a, const T* w, const T* g,      \
                                                          T* de, T* da, T* dw, int64_t b, int f, int d,        \
                                                          int threads) {                                       \
    if (f < 2 || d < 1 || d > kMaxDim || b < 0) return 1;                                                      \
    const Shape sh{b, f, d};                                                                                   \
    if (d == 16)                                                                                               \
      backward_all<T, 16>(sh, e, a, w, g, de, da, dw, threads);                                                \
    else if (d == 8)                                                                                           \
      backward_all<T, 8>(sh, e, a, w, g, de, da, dw, threads);                                                 \
    else                                                                                                       \
      backward_all<T, 0>(sh, e, a, w, g, de, da, dw, threads);                                                 \
    return 0;                                                                                                  \
  }

CTRKIT_BILINEAR_PAIRS(f32, float)
CTRKIT_BILINEAR_PAIRS(f64, double)
