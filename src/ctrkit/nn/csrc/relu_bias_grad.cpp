// The backward epilogue of Linear -> ReLU (ctrkit.nn.mlp_native): dZ = dY where Y > 0 (else 0), written once, and
// the bias gradient db = sum over rows of dZ, summed on the same pass. The column sums reproduce ATen's CPU sum over
// dim 0 of a contiguous (rows, cols) tensor (SumKernel.cpp's cascade: per column, running sums over 2^p-row chunks
// folded into four levels; the columns past the last whole block of 4 vectors summed in four interleaved row
// streams first), so db is the float torch's dZ.sum(0) gives, bit for bit; tests/nn/test_mlp_native.py checks it
// against torch at several widths and thread counts. Plain C++ on float / double arrays, no torch headers.
#include <algorithm>
#include <cstdint>
#include <vector>
#if defined(_OPENMP)
#include <omp.h>
#endif

namespace {

int64_t ceil_log2(int64_t x) {
  int64_t p = 0;
  while ((int64_t(1) << p) < x) ++p;
  return p;
}

// Row r, columns [c0, c1): dz = y > 0 ? dy : 0 stored, and each value added to a[c - c0].
template <typename T>
inline void mask_add_row(T* dz, const T* dy, int64_t ld_dy, const T* y, int64_t cols, int64_t r, int64_t c0,
                         int64_t c1, T* a) {
  const T* src = dy + r * ld_dy;
  const T* yr = y + r * cols;
  T* dst = dz + r * cols;
  for (int64_t c = c0; c < c1; ++c) {
    const T v = yr[c] <= T(0) ? T(0) : src[c];
    dst[c] = v;
    a[c - c0] += v;
  }
}

// One sweep over `steps` steps of `ilp` rows each (row = step * ilp + k goes to stream k), for the columns
// [c0, c1): dz = y > 0 ? dy : 0 stored, and the cascade sums of every stream and column (ATen's multi_row_sum).
// acc holds 4 levels x ilp streams x (c1 - c0) columns, zeroed by the caller; on return level 0 holds each sum.
template <typename T>
void sweep(T* dz, const T* dy, int64_t ld_dy, const T* y, int64_t cols, int64_t c0, int64_t c1, int64_t steps,
           int ilp, T* acc) {
  const int64_t w = c1 - c0, level_power = std::max<int64_t>(4, ceil_log2(steps) / 4);
  const int64_t level_step = int64_t(1) << level_power, level_mask = level_step - 1;
  auto level = [&](int j, int k) { return acc + (int64_t(j) * ilp + k) * w; };
  auto add_row = [&](int64_t r, T* a) { mask_add_row(dz, dy, ld_dy, y, cols, r, c0, c1, a); };
  int64_t i = 0;
  while (i + level_step <= steps) {
    for (int64_t s = 0; s < level_step; ++s, ++i)
      for (int k = 0; k < ilp; ++k) add_row(i * ilp + k, level(0, k));
    for (int j = 1; j < 4; ++j) {
      for (int k = 0; k < ilp; ++k) {
        T* up = level(j, k);
        T* down = level(j - 1, k);
        for (int64_t c = 0; c < w; ++c) {
          up[c] += down[c];
          down[c] = T(0);
        }
      }
      if ((i & (level_mask << (j * level_power))) != 0) break;
    }
  }
  for (; i < steps; ++i)
    for (int k = 0; k < ilp; ++k) add_row(i * ilp + k, level(0, k));
  for (int k = 0; k < ilp; ++k)
    for (int j = 1; j < 4; ++j) {
      T* a0 = level(0, k);
      const T* aj = level(j, k);
      for (int64_t c = 0; c < w; ++c) a0[c] += aj[c];
    }
}

// Columns [c0, c1) of one class: cascade (ilp 1 over all rows) or ATen's row_sum (4 interleaved streams over
// rows / 4, the left-over rows added to stream 0, then streams 1..3 added to it in order).
template <typename T>
void columns(T* dz, const T* dy, int64_t ld_dy, const T* y, int64_t rows, int64_t cols, int64_t c0, int64_t c1,
             bool interleaved, T* db) {
  if (c1 <= c0) return;
  const int ilp = interleaved ? 4 : 1;
  const int64_t w = c1 - c0, steps = rows / ilp;
  std::vector<T> acc(size_t(4 * ilp * w), T(0));
  sweep(dz, dy, ld_dy, y, cols, c0, c1, steps, ilp, acc.data());
  T* s0 = acc.data();
  for (int64_t r = steps * ilp; r < rows; ++r)  // the rows that fill no whole group of 4 (interleaved only)
    mask_add_row(dz, dy, ld_dy, y, cols, r, c0, c1, s0);
  for (int k = 1; k < ilp; ++k)
    for (int64_t c = 0; c < w; ++c) s0[c] += acc[size_t(k * w + c)];
  for (int64_t c = 0; c < w; ++c) db[c0 + c] = T(0) + s0[c];  // ATen stores into a zero-filled output
}

// dz (rows, cols) contiguous, may alias dy (then ld_dy == cols); dy rows ld_dy apart; y (rows, cols) contiguous;
// db (cols,). vec: ATen's vector length for T (16 floats / 8 doubles with AVX-512). Threads split the cascade
// columns in blocks of 4 vectors; the arithmetic of a column does not depend on the split.
template <typename T>
int relu_bias_grad(T* dz, const T* dy, int64_t ld_dy, const T* y, int64_t rows, int64_t cols, T* db, int vec,
                   int threads) {
  if (rows < 0 || cols < vec || vec < 1) return 1;
  const int64_t block = 4 * int64_t(vec), blocks = cols / block, split = blocks * block;
  const int parts = int(std::max<int64_t>(1, std::min<int64_t>(threads, blocks)));
#pragma omp parallel for schedule(static) num_threads(parts) if (parts > 1 && rows * cols >= (1 << 15))
  for (int t = 0; t < parts; ++t) {
    const int64_t b0 = blocks * t / parts, b1 = blocks * (t + 1) / parts;
    columns(dz, dy, ld_dy, y, rows, cols, b0 * block, b1 * block, false, db);
  }
  columns(dz, dy, ld_dy, y, rows, cols, split, cols, true, db);
  return 0;
}

}  // namespace

#define CTRKIT_RELU_BIAS_GRAD(T, SUFFIX)                                                                      \
  extern "C" int ctrkit_relu_bias_grad_##SUFFIX(T* dz, const T* dy, int64_t ld_dy, const T* y, int64_t rows,  \
                                                int64_t cols, T* db, int vec, int threads) {                  \
    return relu_bias_grad<T>(dz, dy, ld_dy, y, rows, cols, db, vec, threads);                               \
  }
CTRKIT_RELU_BIAS_GRAD(float, f32)
CTRKIT_RELU_BIAS_GRAD(double, f64)
