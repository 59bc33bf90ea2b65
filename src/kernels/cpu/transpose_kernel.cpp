// A batch of small matrix transposes, dst[j][i] = src[i][j], each matrix small enough to stay in L1 (the
// cnn's last maps: [49, 32] a sample). ATen's strided copy (what flatten and contiguous run on permuted
// strides) moves one value per step of a generic loop; here the strided side is read with gathers
// (AVX512: 16 lanes; in bf16 each 32-bit lane carries two neighbouring values, so one gather fills two
// output rows) and the contiguous side written with vector stores. The other builds run the plain loop.
// Compiled once per CPU capability (CMakeLists.txt), as attention_kernel.cpp is.
#include "bodies.h"
#include "vectors.h"

namespace fasttrain::kernels::CPU_CAPABILITY {

namespace {

// Columns [first_col, cols) a value at a time.
template <typename T>
void transpose_plain(const T* src, T* dst, int64_t rows, int64_t cols, int64_t first_col = 0) {
  for (int64_t j = first_col; j < cols; ++j)
    for (int64_t i = 0; i < rows; ++i) dst[j * rows + i] = src[i * cols + j];
}

#if defined(CPU_CAPABILITY_AVX512)
// Lanes i of a gather at `base`: offsets i * cols elements of `bytes` each, for rows [i0, i0 + 16).
inline __m512i row_offsets(int64_t cols, int64_t bytes) {
  return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                            _mm512_set1_epi32(static_cast<int>(cols * bytes)));
}

inline __mmask16 lanes_left(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

void transpose_one(const float* src, float* dst, int64_t rows, int64_t cols) {
  const __m512i offsets = row_offsets(cols, sizeof(float));
  for (int64_t j = 0; j < cols; ++j) {
    for (int64_t i = 0; i < rows; i += 16) {
      const __mmask16 mask = lanes_left(rows - i);
      const __m512 column =
          _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mask, offsets, src + i * cols + j, 1);
      _mm512_mask_storeu_ps(dst + j * rows + i, mask, column);
    }
  }
}

// Columns j and j + 1 together: each lane's 32 bits hold src[i][j] (low half) and src[i][j + 1] (high).
void transpose_one(const uint16_t* src, uint16_t* dst, int64_t rows, int64_t cols) {
  const __m512i offsets = row_offsets(cols, sizeof(uint16_t));
  int64_t j = 0;
  for (; j + 2 <= cols; j += 2) {
    for (int64_t i = 0; i < rows; i += 16) {
      const __mmask16 mask = lanes_left(rows - i);
      const __m512i pairs =
          _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask, offsets, src + i * cols + j, 1);
      _mm256_mask_storeu_epi16(dst + j * rows + i, mask, _mm512_cvtepi32_epi16(pairs));
      _mm256_mask_storeu_epi16(dst + (j + 1) * rows + i, mask,
                               _mm512_cvtepi32_epi16(_mm512_srli_epi32(pairs, 16)));
    }
  }
  transpose_plain(src, dst, rows, cols, j);  // an odd last column
}
#else
void transpose_one(const float* src, float* dst, int64_t rows, int64_t cols) {
  transpose_plain(src, dst, rows, cols);
}
void transpose_one(const uint16_t* src, uint16_t* dst, int64_t rows, int64_t cols) {
  transpose_plain(src, dst, rows, cols);
}
#endif

template <typename T>
void transpose_each(const detail::TransposeBatch& b, int64_t begin, int64_t end) {
  const int64_t size = b.rows * b.cols;
  for (int64_t m = begin; m < end; ++m)
    transpose_one(static_cast<const T*>(b.src) + m * size, static_cast<T*>(b.dst) + m * size, b.rows, b.cols);
}

void transpose_batch(const detail::TransposeBatch& b, int64_t begin, int64_t end) {
  if (b.bf16) {
    transpose_each<uint16_t>(b, begin, end);
  } else {
    transpose_each<float>(b, begin, end);
  }
}

}  // namespace

detail::TransposeKernels transpose_kernels() {
  return {&transpose_batch};
}

}  // namespace fasttrain::kernels::CPU_CAPABILITY
