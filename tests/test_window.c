// test_window.c: kernels/cpu/window.c against references built the way timm builds them: an
// explicit torch.roll then an explicit window partition, the relative position index from a
// coordinate grid, and the shift mask from a sliced region-label map; and the GPU kernels' row
// addressing (FastDiv, window_rows_row in kernels/window.h) against `/` and window_row.
#include "kernels/window.h"
#include "tests/util/test_util.h"

typedef struct {
  const char *what;
  int B, H, W, C, wh, ww, sh, sw;
} WindowCase;

// ---- references ---------------------------------------------------------------------------
// torch.roll(x, shifts=(dy, dx), dims=(1, 2)) on (B, H, W, C): out[i][j] = x[i - dy][j - dx].
static void roll_ref(float *out, const float *x, int B, int H, int W, int C, int dy, int dx) {
  for (int b = 0; b < B; b++)
    for (int i = 0; i < H; i++)
      for (int j = 0; j < W; j++) {
        int si = ((i - dy) % H + H) % H, sj = ((j - dx) % W + W) % W;
        for (int c = 0; c < C; c++)
          out[(((int64_t)b * H + i) * W + j) * C + c] = x[(((int64_t)b * H + si) * W + sj) * C + c];
      }
}

// timm's window_partition: x.view(B, H/wh, wh, W/ww, ww, C).permute(0, 1, 3, 2, 4, 5), as loops.
static void partition_ref(float *windows, const float *x, const WindowCase *k) {
  int nWh = k->H / k->wh, nWw = k->W / k->ww;
  int64_t o = 0;
  for (int b = 0; b < k->B; b++)
    for (int wi = 0; wi < nWh; wi++)
      for (int wj = 0; wj < nWw; wj++)
        for (int r = 0; r < k->wh; r++)
          for (int c = 0; c < k->ww; c++)
            for (int ch = 0; ch < k->C; ch++)
              windows[o++] =
                  x[(((int64_t)b * k->H + wi * k->wh + r) * k->W + wj * k->ww + c) * k->C + ch];
}

// timm's window_reverse (the inverse permutation), as loops.
static void unpartition_ref(float *x, const float *windows, const WindowCase *k) {
  int nWh = k->H / k->wh, nWw = k->W / k->ww;
  int64_t o = 0;
  for (int b = 0; b < k->B; b++)
    for (int wi = 0; wi < nWh; wi++)
      for (int wj = 0; wj < nWw; wj++)
        for (int r = 0; r < k->wh; r++)
          for (int c = 0; c < k->ww; c++)
            for (int ch = 0; ch < k->C; ch++)
              x[(((int64_t)b * k->H + wi * k->wh + r) * k->W + wj * k->ww + c) * k->C + ch] =
                  windows[o++];
}

// timm's relative_position_index: coords (2, N) from a meshgrid, pairwise differences shifted
// to start at 0, row difference scaled by (2ww - 1), summed.
static void index_ref(int *index, int wh, int ww) {
  int N = wh * ww;
  int *rows = malloc(N * sizeof(int)), *cols = malloc(N * sizeof(int));
  for (int r = 0; r < wh; r++)
    for (int c = 0; c < ww; c++) {
      rows[r * ww + c] = r;
      cols[r * ww + c] = c;
    }
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++) {
      int dr = rows[i] - rows[j] + wh - 1, dc = cols[i] - cols[j] + ww - 1;
      index[i * N + j] = dr * (2 * ww - 1) + dc;
    }
  free(rows);
  free(cols);
}

// A Python slice [start, stop) with negative bounds counted from the end; stop 0 means None.
typedef struct {
  int start, stop;
} Slice;

static int slice_bound(int v, int size) {
  return v < 0 ? size + v : v;
}

// timm's img_mask: label cnt over the slices (0, -w), (-w, -s), (-s, None) of each dimension;
// a dimension with shift 0 is one slice (0, None). Then partitioned like the tokens, and
// mask[w][i][j] = -100 where the labels differ.
static void mask_ref(float *mask, int H, int W, int wh, int ww, int sh, int sw) {
  Slice hs[3] = {{0, -wh}, {-wh, -sh}, {-sh, 0}}, ws[3] = {{0, -ww}, {-ww, -sw}, {-sw, 0}};
  Slice one[1] = {{0, 0}};
  Slice *hsl = sh ? hs : one, *wsl = sw ? ws : one;
  int nh = sh ? 3 : 1, nw = sw ? 3 : 1;
  float *img = malloc((size_t)H * W * sizeof(float));
  float cnt = 0;
  for (int a = 0; a < nh; a++)
    for (int b = 0; b < nw; b++) {
      int y0 = slice_bound(hsl[a].start, H), y1 = hsl[a].stop ? slice_bound(hsl[a].stop, H) : H;
      int x0 = slice_bound(wsl[b].start, W), x1 = wsl[b].stop ? slice_bound(wsl[b].stop, W) : W;
      for (int y = y0; y < y1; y++)
        for (int x = x0; x < x1; x++) img[y * W + x] = cnt;
      cnt += 1;
    }
  WindowCase k = {.B = 1, .H = H, .W = W, .C = 1, .wh = wh, .ww = ww};
  int N = wh * ww, nW = (H / wh) * (W / ww);
  float *labels = malloc((size_t)nW * N * sizeof(float));
  partition_ref(labels, img, &k);
  for (int w = 0; w < nW; w++)
    for (int i = 0; i < N; i++)
      for (int j = 0; j < N; j++)
        mask[((int64_t)w * N + i) * N + j] = labels[w * N + i] != labels[w * N + j] ? -100.0f : 0;
  free(img);
  free(labels);
}

static double dot_d(const float *a, const float *b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}

// ---- checks -------------------------------------------------------------------------------
static void check_case(TestRng *rng, const WindowCase *k) {
  int nW = (k->H / k->wh) * (k->W / k->ww), N = k->wh * k->ww;
  int64_t n = (int64_t)k->B * k->H * k->W * k->C;
  float *x = malloc(n * sizeof(float)), *rolled = malloc(n * sizeof(float));
  float *win = malloc(n * sizeof(float)), *want_win = malloc(n * sizeof(float));
  float *back = malloc(n * sizeof(float)), *want_back = malloc(n * sizeof(float));
  float *y = malloc(n * sizeof(float)), *unrolled = malloc(n * sizeof(float));
  test_fill_uniform(rng, x, n, -1.0f, 1.0f);
  test_fill_uniform(rng, y, n, -1.0f, 1.0f);
  printf("-- %s: B=%d H=%d W=%d C=%d window %dx%d shift (%d, %d), nW=%d\n", k->what, k->B, k->H,
         k->W, k->C, k->wh, k->ww, k->sh, k->sw, nW);

  // Partition: roll by (-sh, -sw), then cut into windows. A permutation: exact equality.
  roll_ref(rolled, x, k->B, k->H, k->W, k->C, -k->sh, -k->sw);
  partition_ref(want_win, rolled, k);
  test_poison(win, n);
  window_partition_cpu(win, x, k->B, k->H, k->W, k->C, k->wh, k->ww, k->sh, k->sw);
  test_close("partition vs roll + partition reference", win, want_win, n, 0.0);

  // Reverse: un-partition, then roll by (+sh, +sw).
  unpartition_ref(unrolled, y, k);
  roll_ref(want_back, unrolled, k->B, k->H, k->W, k->C, k->sh, k->sw);
  test_poison(back, n);
  window_reverse_cpu(back, y, k->B, k->H, k->W, k->C, k->wh, k->ww, k->sh, k->sw);
  test_close("reverse vs unpartition + roll reference", back, want_back, n, 0.0);

  // Each is the other's backward: <partition(x), y> = <x, reverse(y)>. Both sums add the
  // same products in different orders, so they agree to double rounding (~1e-15).
  double lhs = dot_d(win, y, n), rhs = dot_d(x, back, n);
  double e = fabs(lhs - rhs) / fabs(rhs);
  test_check(e <= 1e-6, "%-48s rel_err %.3e (tol 1.0e-06)", "adjoint <part(x), y> = <x, rev(y)>",
             e);

  test_poison(back, n);
  window_reverse_cpu(back, win, k->B, k->H, k->W, k->C, k->wh, k->ww, k->sh, k->sw);
  test_close("reverse(partition(x)) == x", back, x, n, 0.0);

  int *index = malloc((size_t)N * N * sizeof(int));
  int *want_index = malloc((size_t)N * N * sizeof(int));
  for (int i = 0; i < N * N; i++) index[i] = -1;
  index_ref(want_index, k->wh, k->ww);
  relative_position_index(index, k->wh, k->ww);
  int table_rows = (2 * k->wh - 1) * (2 * k->ww - 1), bad = 0;
  int *used = calloc(table_rows, sizeof(int));
  for (int i = 0; i < N * N; i++) {
    bad += index[i] != want_index[i];
    if (index[i] >= 0 && index[i] < table_rows) used[index[i]] = 1;
  }
  int unused = 0;
  for (int t = 0; t < table_rows; t++) unused += !used[t];
  test_check(bad == 0 && unused == 0,
             "relative_position_index: %d of %d entries differ, %d of %d table rows unused", bad,
             N * N, unused, table_rows);

  float *mask = malloc((size_t)nW * N * N * sizeof(float));
  float *want_mask = malloc((size_t)nW * N * N * sizeof(float));
  mask_ref(want_mask, k->H, k->W, k->wh, k->ww, k->sh, k->sw);
  test_poison(mask, (int64_t)nW * N * N);
  attention_mask_build(mask, k->H, k->W, k->wh, k->ww, k->sh, k->sw);
  int64_t masked = 0;
  for (int64_t i = 0; i < (int64_t)nW * N * N; i++) masked += want_mask[i] != 0;
  char name[96];
  snprintf(name, sizeof name, "shift mask vs timm img_mask (%lld of %lld masked)",
           (long long)masked, (long long)nW * N * N);
  test_close(name, mask, want_mask, (int64_t)nW * N * N, 0.0);
  // Unshifted maps need no mask: every entry 0. Shifted ones must mask something.
  test_check(k->sh || k->sw ? masked > 0 : masked == 0, "mask is %s",
             k->sh || k->sw ? "non-trivial for a shifted map" : "all zero without shift");

  free(x);
  free(rolled);
  free(win);
  free(want_win);
  free(back);
  free(want_back);
  free(y);
  free(unrolled);
  free(index);
  free(want_index);
  free(used);
  free(mask);
  free(want_mask);
}

// FastDiv against `/`: every n below 2^16 and random n up to 2^31 - 1, for every divisor below
// 2^12, powers of two and their neighbours, and random divisors up to 2^31 - 1.
static void check_fast_div(TestRng *rng) {
  int64_t bad = 0, checked = 0;
  for (int kind = 0; kind < 3; kind++)
    for (uint32_t k = 0; k < 4096; k++) {
      uint32_t d = kind == 0   ? k + 1
                   : kind == 1 ? (1u << (k % 31)) + (uint32_t)(k / 31 % 3) - 1u
                               : (uint32_t)(test_rng_u64(rng) % 0x7fffffffu) + 1u;
      if (d == 0) continue;
      FastDiv f = fast_div_make(d);
      for (uint32_t j = 0; j < 96; j++) {
        uint32_t n = j < 32   ? j
                     : j < 40 ? 0x7fffffffu - (j - 32)
                     : j < 48 ? d * (j - 40) + (j & 1 ? d - 1 : 0)
                              : (uint32_t)(test_rng_u64(rng) % 0x80000000u);
        if (n > 0x7fffffffu) continue;
        bad += fast_div(f, n) != n / d;
        checked++;
      }
    }
  for (uint32_t d = 1; d <= 64; d++) {
    FastDiv f = fast_div_make(d);
    for (uint32_t n = 0; n < 65536; n++, checked++) bad += fast_div(f, n) != n / d;
  }
  test_check(bad == 0, "fast_div == n / d on %lld (n, d) pairs (%lld wrong)", (long long)checked,
             (long long)bad);
}

// window_rows_row (the GPU kernels' row addressing) against window_row for every token.
static void check_window_rows(const WindowCase *k) {
  WindowMap m = {k->H, k->W, k->wh, k->ww, k->sh, k->sw};
  WindowRows r = window_rows_make(&m);
  int64_t bad = 0, L = (int64_t)k->H * k->W;
  for (int b = 0; b < k->B; b++)
    for (int y = 0; y < k->H; y++)
      for (int x = 0; x < k->W; x++) {
        uint32_t t = (uint32_t)(b * L + (int64_t)y * k->W + x);
        bad += (int64_t)window_rows_row(&r, t) != window_row(&m, b, y, x);
      }
  test_check(bad == 0, "%-48s window_rows_row == window_row (%lld wrong)", k->what, (long long)bad);
}

int main(void) {
  TestRng rng = {.state = 0x3141u};
  check_fast_div(&rng);
  const WindowCase cases[] = {
      {"square, unshifted", 2, 8, 8, 5, 4, 4, 0, 0},
      {"square, shifted", 2, 8, 8, 5, 4, 4, 2, 2},
      {"H != W, shifted", 2, 8, 12, 3, 4, 4, 2, 2},
      {"rectangular window, shifted", 2, 6, 8, 3, 3, 4, 1, 2},
      {"rectangular window 4x6, shift (2, 3)", 1, 8, 12, 2, 4, 6, 2, 3},
      {"shift along W only (H == window)", 2, 4, 8, 3, 4, 4, 0, 2},
      {"map no larger than the window (7x7)", 2, 7, 7, 4, 7, 7, 0, 0},
      {"rectangular map below the window (4x6)", 2, 4, 6, 3, 4, 6, 0, 0},
      {"Swin-T stage 1 geometry", 1, 56, 56, 2, 7, 7, 3, 3},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&rng, &cases[i]);
  // The row addressing at batch sizes the trainer meets (Swin-T's stages at batch 128).
  const WindowCase rows[] = {
      {"Swin-T stage 0, batch 128, shifted", 128, 56, 56, 1, 7, 7, 3, 3},
      {"Swin-T stage 2, batch 128, shifted", 128, 14, 14, 1, 7, 7, 3, 3},
      {"Swin-T stage 3, batch 128", 128, 7, 7, 1, 7, 7, 0, 0},
      {"rectangular window 4x6, shift (2, 3), batch 7", 7, 8, 12, 1, 4, 6, 2, 3},
      {"H != W, window 4x4, shift (2, 2), batch 5", 5, 8, 12, 1, 4, 4, 2, 2},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_window_rows(&cases[i]);
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) check_window_rows(&rows[i]);
  return test_finish();
}
