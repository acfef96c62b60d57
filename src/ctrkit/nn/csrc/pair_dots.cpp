// DotInteraction's copies around its two batched matmuls (ctrkit.nn.interaction): the forward writes the interaction
// output row by row, [dense | the Gram matrix's strict upper triangle, row-major], straight from the Gram matrix
// (instead of an index_select into a new tensor and a cat); the backward writes the pair gradients mirrored into
// both triangles of a (n, n) matrix per sample, zero diagonal (instead of a cat with a zero column and an
// index_select). Copies only: every value is the one the torch ops give. Plain C++, no torch headers.
#include <cstdint>
#include <cstring>

namespace {

// out (B rows, ld_out apart): [dense[b, :d] (when dense) | gram[b, i, j] for i < j]; gram (B, n, n) contiguous.
template <typename T>
void pairs_forward(T* out, int64_t ld_out, const T* dense, int64_t d, const T* gram, int64_t B, int64_t n,
                   int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && B * n * n >= (1 << 15))
  for (int64_t b = 0; b < B; ++b) {
    T* o = out + b * ld_out;
    if (dense != nullptr) {
      std::memcpy(o, dense + b * d, size_t(d) * sizeof(T));
      o += d;
    }
    const T* g = gram + b * n * n;
    for (int64_t i = 0; i + 1 < n; ++i) {
      const int64_t len = n - 1 - i;
      std::memcpy(o, g + i * n + i + 1, size_t(len) * sizeof(T));
      o += len;
    }
  }
}

// sym (B, n, n) contiguous: sym[b, i, j] = sym[b, j, i] = grad[b, col0 + p(i, j)], sym[b, i, i] = 0; grad's rows
// ld_grad apart and its columns ld_col apart (a column-major gradient is read where it lies).
template <typename T>
void pairs_backward(T* sym, const T* grad, int64_t ld_grad, int64_t ld_col, int64_t col0, int64_t B, int64_t n,
                    int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && B * n * n >= (1 << 15))
  for (int64_t b = 0; b < B; ++b) {
    const T* g = grad + b * ld_grad + col0 * ld_col;
    T* s = sym + b * n * n;
    for (int64_t i = 0; i < n; ++i) {
      s[i * n + i] = T(0);
      for (int64_t j = i + 1; j < n; ++j, g += ld_col) {
        const T v = *g;
        s[i * n + j] = v;
        s[j * n + i] = v;
      }
    }
  }
}

}  // namespace

#define CTRKIT_PAIR_DOTS(T, SUFFIX)                                                                            \
  extern "C" void ctrkit_pairs_forward_##SUFFIX(T* out, int64_t ld_out, const T* dense, int64_t d, const T* gram, \
                                                int64_t B, int64_t n, int threads) {                          \
    pairs_forward<T>(out, ld_out, dense, d, gram, B, n, threads);                                            \
  }                                                                                                          \
  extern "C" void ctrkit_pairs_backward_##SUFFIX(T* sym, const T* grad, int64_t ld_grad, int64_t ld_col,       \
                                                 int64_t col0, int64_t B, int64_t n, int threads) {           \
    pairs_backward<T>(sym, grad, ld_grad, ld_col, col0, B, n, threads);                                     \
  }
CTRKIT_PAIR_DOTS(float, f32)
CTRKIT_PAIR_DOTS(double, f64)
