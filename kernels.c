/* g * Norm(y) on a CPU, float32, in one pass forward and one backward (issue 23): DNP's
g_out * Norm(W x) (paper 3.2), OR's beta * Norm(alpha) (3.3), and Norm(x) itself with g = 1.

kernels.py compiles this file on first use (cc -O3, no other library) and calls it through
ctypes; _Norm and _ScaledNorm in kernels.py are the same math in 2-4 full-size passes per
direction, with a dozen small operations around them, and run wherever this does not (no C
compiler, a GPU, bf16, torch.compile). tests/test_kernels.py holds both to model.py's plain
definitions.

y and out are `rows` rows of D floats (one row per group of outputs: a head of q, k or v, a
branch gate or up); row i is scaled by row (i mod P) of g, the g_out rows of one token. */
#include <math.h>

#define BLOCK 64   /* rows whose statistics are computed together: independent work to overlap */

/* always_inline: called below with a constant D (a head of 32, 64 or 128), the inner loops are
   then unrolled vectors with no remainder */
static inline __attribute__((always_inline)) void forward_rows(
        const float *restrict y, const float *restrict g, float *restrict out,
        float *restrict r, long rows, long D, long P, float eps) {
    float s[BLOCK];
    for (long i0 = 0, p = 0; i0 < rows; i0 += BLOCK) {
        long n = rows - i0 < BLOCK ? rows - i0 : BLOCK;
        for (long i = 0; i < n; i++) {   /* s = sum(y^2) per row */
            const float *yi = y + (i0 + i) * D;
            float acc = 0.f;
            #pragma omp simd reduction(+:acc)
            for (long j = 0; j < D; j++) acc += yi[j] * yi[j];
            s[i] = acc;
        }
        #pragma omp simd
        for (long i = 0; i < n; i++)      /* r = 1 / sqrt(mean(y^2) + eps) */
            r[i0 + i] = 1.f / sqrtf(s[i] / (float)D + eps);
        for (long i = 0; i < n; i++, p = p + 1 == P ? 0 : p + 1) {   /* out = (y * r) * g */
            const float *yi = y + (i0 + i) * D, *gi = g + p * D;
            float *oi = out + (i0 + i) * D, ri = r[i0 + i];
            #pragma omp simd
            for (long j = 0; j < D; j++) oi[j] = yi[j] * ri * gi[j];
        }
    }
}

/* with n = out / g (Norm(y), recovered from the output):
   dg = sum over rows of dout * n,  dy = r * (g * dout - n * mean(dout * out));
   inv_g: P x D floats of scratch for 1 / g (1 where g is 0: that entry's gradient is lost, as in
   _ScaledNorm; a trained g never lands on exactly 0) */
static inline __attribute__((always_inline)) void backward_rows(
        const float *restrict dout, const float *restrict out, const float *restrict g,
        float *restrict inv_g, const float *restrict r, float *restrict dy,
        float *restrict dg, long rows, long D, long P) {
    for (long k = 0; k < P * D; k++) {
        inv_g[k] = g[k] != 0.f ? 1.f / g[k] : 1.f;
        dg[k] = 0.f;
    }
    for (long i = 0, p = 0; i < rows; i++, p = p + 1 == P ? 0 : p + 1) {
        const float *di = dout + i * D, *oi = out + i * D;
        const float *gi = g + p * D, *ig = inv_g + p * D;
        float *dgi = dg + p * D, *dyi = dy + i * D, acc = 0.f;
        #pragma omp simd reduction(+:acc)
        for (long j = 0; j < D; j++) acc += di[j] * oi[j];
        float m = acc / (float)D, ri = r[i];
        #pragma omp simd
        for (long j = 0; j < D; j++) {
            float nj = oi[j] * ig[j];
            dgi[j] += di[j] * nj;
            dyi[j] = ri * (gi[j] * di[j] - nj * m);
        }
    }
}

void scaled_norm_forward(const float *y, const float *g, float *out, float *r, long rows,
                         long D, long P, float eps) {
    if (D == 32) forward_rows(y, g, out, r, rows, 32, P, eps);
    else if (D == 64) forward_rows(y, g, out, r, rows, 64, P, eps);
    else if (D == 128) forward_rows(y, g, out, r, rows, 128, P, eps);
    else forward_rows(y, g, out, r, rows, D, P, eps);
}

void scaled_norm_backward(const float *dout, const float *out, const float *g,
                          float *inv_g, const float *r, float *dy, float *dg, long rows,
                          long D, long P) {
    if (D == 32) backward_rows(dout, out, g, inv_g, r, dy, dg, rows, 32, P);
    else if (D == 64) backward_rows(dout, out, g, inv_g, r, dy, dg, rows, 64, P);
    else if (D == 128) backward_rows(dout, out, g, inv_g, r, dy, dg, rows, 128, P);
    else backward_rows(dout, out, g, inv_g, r, dy, dg, rows, D, P);
}
