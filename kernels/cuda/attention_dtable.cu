// attention_dtable.cu: the bias-table gradient of the window-attention backward: the window
// sums of dS that either backward leaves, reduced per (h, i, j) and then per (table row, head),
// in a fixed order, with their launcher.
#include "kernels/cuda/attention.cuh"

// dtable needs a sum over all windows; no floating-point atomics (results must be bitwise
// reproducible), so the backward leaves partial window sums of dS (SIMT: every pair's dS, in
// att; tensor cores: one per block, in scratch) and two kernels reduce them in a fixed order:
// over the rows per (h, i, j), then over the (i, j) of each table row. (The flash path's dk/dv
// blocks leave one partial per window group, as the tensor-core path's blocks do.)

namespace swin_cuda::attention {
namespace {

// Window-sum kernel: a block covers 32 consecutive (h, i, j) and splits the windows between
// kSumRows thread rows. Fixed, so the summation order never depends on the device.
constexpr int kSumRows = 16;

// ds (BW, E), E = heads * N * N: sums ds over windows per element e in a fixed order and
// stores the sum in ds[e] (window 0's slot). Block (32, kSumRows): x picks e, thread row y
// sums windows y, y + kSumRows, ... in double; then the rows are added in order y = 0, 1, ...
// Every read of ds[e] (by this block only) happens before the barrier, the write after it.
__global__ void __launch_bounds__(32 * kSumRows)
    attention_ds_window_sum_kernel(float *ds, int64_t BW, int64_t E) {
  __shared__ double partial[kSumRows][32];
  const int64_t e = (int64_t)blockIdx.x * 32 + threadIdx.x;
  double s = 0.0;
  if (e < E)
    for (int64_t b = threadIdx.y; b < BW; b += kSumRows) s += ds[b * E + e];
  partial[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && e < E) {
    double total = 0.0;
    for (int y = 0; y < kSumRows; y++) total += partial[y][threadIdx.x];
    ds[e] = (float)total;
  }
}

// dtable[t][h] += sum of ds_sum[h][i][j] over the (i, j) with index[i][j] == t. Block (chunk,
// h) stages index and head h's N * N sums in shared memory, kStage entries at a time, and its
// warp w takes t = chunk * kTableRowsPerBlock + w < rows_bound: lane l sums the entries l, l + 32,
// ... of its row in order (kStage is a multiple of 32, so the order does not depend on the
// staging), then a fixed butterfly adds the lanes. (A warp per (t, h) reading global memory
// spent ~13 us per call on these 169 x 2401 compares.) A warp whose t appears nowhere in index
// writes nothing, so only rows max(index) + 1 of dtable are touched.
constexpr int kTableRowsPerBlock = 8;
constexpr int kStage = 4096;  // entries staged at once: a 64-token window's N * N in one go
static_assert(kStage % 32 == 0, "a lane's entries keep their order across stagings");

__global__ void __launch_bounds__(kTableRowsPerBlock * 32)
    attention_dtable_kernel(float *__restrict__ dtable, const float *__restrict__ ds_sum,
                            const int *__restrict__ index, int N, int heads, int rows_bound) {
  __shared__ int idx[kStage];
  __shared__ float ds_h[kStage];
  const int NN = N * N, h = blockIdx.y, lane = threadIdx.x % 32;
  const int t = blockIdx.x * kTableRowsPerBlock + threadIdx.x / 32;
  double s = 0.0;
  int hits = 0;
  for (int base = 0; base < NN; base += kStage) {
    const int n = NN - base < kStage ? NN - base : kStage;
    __syncthreads();  // the previous staging is consumed
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
      idx[e] = index[base + e];
      ds_h[e] = ds_sum[(int64_t)h * NN + base + e];
    }
    __syncthreads();
    if (t < rows_bound)
      for (int e = lane; e < n; e += 32)
        if (idx[e] == t) {
          s += ds_h[e];
          hits++;
        }
  }
  if (t >= rows_bound) return;  // whole warps, after the block's last barrier
  s = warp_sum(s);
  for (int o = 16; o > 0; o >>= 1) hits += __shfl_xor_sync(kFullMask, hits, o);
  if (lane == 0 && hits > 0) dtable[(int64_t)t * heads + h] += (float)s;
}

}  // namespace

void window_attention_dtable_backward(float *dtable, float *ds, int64_t rows, const int *index,
                                      int N, int heads, cudaStream_t stream) {
  // Sums of dS over the rows (windows, or the tensor-core path's window groups) per (h, i, j):
  // 32 elements per block.
  int64_t E = (int64_t)heads * N * N;
  unsigned sum_blocks = (unsigned)((E + 31) / 32);
  attention_ds_window_sum_kernel<<<sum_blocks, dim3(32, kSumRows), 0, stream>>>(ds, rows, E);
  CUDA_CHECK_LAUNCH();

  // One warp per (table row, head) up to the row bound, kTableRowsPerBlock rows per block.
  int rows_bound = table_rows_bound(N);
  dim3 table_grid((unsigned)((rows_bound + kTableRowsPerBlock - 1) / kTableRowsPerBlock),
                  (unsigned)heads);
  attention_dtable_kernel<<<table_grid, kTableRowsPerBlock * 32, 0, stream>>>(dtable, ds, index, N,
                                                                              heads, rows_bound);
  CUDA_CHECK_LAUNCH();
}

}  // namespace swin_cuda::attention
