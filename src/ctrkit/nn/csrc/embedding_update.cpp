// The small embedding tables' per-step work on plain float / double arrays (built by ctrkit.nn.kernels with
// -ffp-contract=off, called through ctypes from ctrkit.nn.embedding_update): the dense table gradient of a lookup
// (scatter) and LazyAdam's update with the touched-row L2 in one pass over the table.
//
// Every result is the same float as the torch path's (ctrkit.nn.embedding_grad, ctrkit.training.optim): the same
// operations in the same order, no FMA contraction (the build flag); only sqrt differs, correctly rounded here
// where ATen's vectorised one is 1 ulp off for ~0.7 % of values.
//
//   scatter_rows:  dW[ids[i]] += src[i]                              i = 0 .. n-1 in order (index_add_'s order)
//   scatter_bags:  dW[ids[i]] += (dY[b] / |b|) * w_i                 i in bag b, bags in order; the division for
//                                                                    mean bags, the factor w_i with per-sample weights
//   lazy_adam_rows (every row r of W [R, D] with a non-zero or NaN gradient entry, "touched"):
//     g_r <- g_r + (l2 * W_r)                                        the touched-row L2 (skipped for l2 = 0)
//     then, where g_r is still touched (torch finds the rows again on the gradient with its L2):
//     dm = (g - m) c1,  dv = (g g - v) c2,  u = (dm + m) / (sqrt(dv + v) + eps) * (-step_size)
//     m <- m + dm,  v <- v + dv,  W <- W + u                         c1 = 1 - b1, c2 = 1 - b2; g negated to maximize
// The gradient keeps its L2 (as the torch path leaves it); rows not touched are not read past their gradient.
#include <cmath>
#include <cstdint>

namespace {

template <typename T>
int scatter_rows(T* __restrict dw, int64_t rows, int64_t d, const T* __restrict src, const int64_t* ids,
                 int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = ids[i];
    if (r < 0 || r >= rows) return 1;
    T* __restrict out = dw + r * d;
    const T* __restrict in = src + i * d;
    for (int64_t k = 0; k < d; ++k) out[k] += in[k];
  }
  return 0;
}

template <typename T>
int scatter_bags(T* __restrict dw, int64_t rows, int64_t d, const T* __restrict grad, const int64_t* ids,
                 const int64_t* offsets, int64_t bags, int mean, const T* psw) {
  for (int64_t b = 0; b < bags; ++b) {
    const int64_t lo = offsets[b], hi = offsets[b + 1];
    const T* __restrict g = grad + b * d;
    // the mean's divisor as torch's: lengths.clamp(min=1) cast to the gradient's dtype
    const T len = static_cast<T>(hi - lo > 1 ? hi - lo : 1);
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t r = ids[i];
      if (r < 0 || r >= rows) return 1;
      T* __restrict out = dw + r * d;
      if (mean && psw) {
        const T w = psw[i];
        for (int64_t k = 0; k < d; ++k) out[k] += (g[k] / len) * w;
      } else if (mean) {
        for (int64_t k = 0; k < d; ++k) out[k] += g[k] / len;
      } else if (psw) {
        const T w = psw[i];
        for (int64_t k = 0; k < d; ++k) out[k] += g[k] * w;
      } else {
        for (int64_t k = 0; k < d; ++k) out[k] += g[k];
      }
    }
  }
  return 0;
}

template <typename T>
inline bool touched(const T* g, int64_t d) {
  bool any = false;
  for (int64_t k = 0; k < d; ++k) any |= !(g[k] == T(0));  // NaN counts, as torch's |g| sum != 0
  return any;
}

template <typename T>
int64_t lazy_adam_rows(T* __restrict p, T* __restrict grad, T* __restrict m, T* __restrict v, int64_t rows,
                       int64_t d, double l2_, double c1_, double c2_, double eps_, double neg_step_, int maximize,
                       int threads) {
  const T l2 = static_cast<T>(l2_), c1 = static_cast<T>(c1_), c2 = static_cast<T>(c2_);
  const T eps = static_cast<T>(eps_), neg_step = static_cast<T>(neg_step_);
  int64_t count = 0;
#pragma omp parallel for schedule(static) num_threads(threads) reduction(+ : count) if (threads > 1 && rows * d >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    T* __restrict g = grad + r * d;
    if (!touched(g, d)) continue;
    T* __restrict w = p + r * d;
    if (l2_ != 0) {
      for (int64_t k = 0; k < d; ++k) g[k] = g[k] + (l2 * w[k]);
      if (!touched(g, d)) continue;
    }
    T* __restrict mr = m + r * d;
    T* __restrict vr = v + r * d;
    for (int64_t k = 0; k < d; ++k) {
      const T gk = maximize ? -g[k] : g[k];
      const T dm = (gk - mr[k]) * c1;
      const T dv = (gk * gk - vr[k]) * c2;
      const T denom = std::sqrt(dv + vr[k]) + eps;
      const T u = (dm + mr[k]) / denom * neg_step;
      mr[k] = mr[k] + dm;
      vr[k] = vr[k] + dv;
      w[k] = w[k] + u;
    }
    ++count;
  }
  return count;
}

}  // namespace

#define CTRKIT_EMBEDDING_UPDATE(T, SUFFIX)                                                                        \
  extern "C" int ctrkit_scatter_rows_##SUFFIX(T* dw, int64_t rows, int64_t d, const T* src, const int64_t* ids,  \
                                              int64_t n) {                                                      \
    return scatter_rows<T>(dw, rows, d, src, ids, n);                                                           \
  }                                                                                                             \
  extern "C" int ctrkit_scatter_bags_##SUFFIX(T* dw, int64_t rows, int64_t d, const T* grad, const int64_t* ids, \
                                              const int64_t* offsets, int64_t bags, int mean, const T* psw) {   \
    return scatter_bags<T>(dw, rows, d, grad, ids, offsets, bags, mean, psw);                                   \
  }                                                                                                             \
  extern "C" int64_t ctrkit_lazy_adam_rows_##SUFFIX(T* p, T* grad, T* m, T* v, int64_t rows, int64_t d,         \
                                                    double l2, double c1, double c2, double eps, double neg_step, \
                                                    int maximize, int threads) {                                \
    return lazy_adam_rows<T>(p, grad, m, v, rows, d, l2, c1, c2, eps, neg_step, maximize, threads);             \
  }

CTRKIT_EMBEDDING_UPDATE(float, f32)
CTRKIT_EMBEDDING_UPDATE(double, f64)
