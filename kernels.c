/* g * Norm(y) on a CPU, float32, in one pass forward and one backward (issue 23): DNP's
g_out * Norm(W x) (paper 3.2), OR's beta * Norm(alpha) (3.3), and Norm(x) itself with g = 1.

kernels.py compiles this file on first use (cc -O3 -fopenmp, no other library) and calls it
through ctypes; _Norm and _ScaledNorm in kernels.py are the same math in 2-4 full-size passes per
direction, with a dozen small operations around them, and run wherever this does not (no C
compiler, a GPU, bf16, torch.compile). tests/test_kernels.py holds both to model.py's plain
definitions.

y and out are `rows` rows of D floats (one row per group of outputs: a head of q, k or v, a
branch gate or up); row i is scaled by row (i mod P) of g, the g_out rows of one token.

Threads: PyTorch's own OpenMP runtime (libgomp.so.1, which PyTorch has loaded before this file's
library, so the loader shares it), as many as torch.get_num_threads(). The split of the work does
not depend on their number, so neither do the values. Without OpenMP (-fopenmp-simd alone) the
pragmas below that say "parallel" are ignored: one thread, the same values. */
#include <math.h>
#include <stdlib.h>

#define BLOCK 64         /* rows whose statistics are computed together: independent work */
#define CHUNKS 16        /* backward: dg as at most CHUNKS partial sums, added in a fixed order */
#define PARALLEL 16384   /* floats: a smaller call runs on one thread (a parallel region costs
                            microseconds, which OR's vectors of a few hundred floats never repay) */

/* always_inline: called below with a constant D (a head of 32, 64 or 128), the inner loops are
   then unrolled vectors with no remainder. Rows i0 .. i0 + n - 1, n <= BLOCK. */
static inline __attribute__((always_inline)) void forward_block(
        const float *restrict y, const float *restrict g, float *restrict out,
        float *restrict r, long i0, long n, long D, long P, float eps) {
    float s[BLOCK];
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
    for (long i = 0, p = i0 % P; i < n; i++, p = p + 1 == P ? 0 : p + 1) {   /* out = y r g */
        const float *yi = y + (i0 + i) * D, *gi = g + p * D;
        float *oi = out + (i0 + i) * D, ri = r[i0 + i];
        #pragma omp simd
        for (long j = 0; j < D; j++) oi[j] = yi[j] * ri * gi[j];
    }
}

/* with n = out / g (Norm(y), recovered from the output), rows i0 .. i1 - 1 (i0 a multiple of P):
   dg += sum over the rows of dout * n,  dy = r * (g * dout - n * mean(dout * out)) */
static inline __attribute__((always_inline)) void backward_rows(
        const float *restrict dout, const float *restrict out, const float *restrict g,
        const float *restrict inv_g, const float *restrict r, float *restrict dy,
        float *restrict dg, long i0, long i1, long D, long P) {
    for (long i = i0, p = 0; i < i1; i++, p = p + 1 == P ? 0 : p + 1) {
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
    long blocks = (rows + BLOCK - 1) / BLOCK;
    #pragma omp parallel for schedule(static) if (rows * D >= PARALLEL)
    for (long b = 0; b < blocks; b++) {
        long i0 = b * BLOCK, n = rows - i0 < BLOCK ? rows - i0 : BLOCK;
        if (D == 32) forward_block(y, g, out, r, i0, n, 32, P, eps);
        else if (D == 64) forward_block(y, g, out, r, i0, n, 64, P, eps);
        else if (D == 128) forward_block(y, g, out, r, i0, n, 128, P, eps);
        else forward_block(y, g, out, r, i0, n, D, P, eps);
    }
}

/* The rows are rows / P periods of P (one token's g_out rows each); chunk c of `chunks` takes a
   fixed share of the periods and sums its dg into its own P x D partial, and the partials are
   added in order after. One period (MoE: a g row per row of y) is one chunk. inv_g: P x D
   floats of scratch for 1 / g. */
void scaled_norm_backward(const float *dout, const float *out, const float *g,
                          float *inv_g, const float *r, float *dy, float *dg, long rows, long D,
                          long P) {
    long PD = P * D, periods = rows / P, chunks = periods < CHUNKS ? periods : CHUNKS;
    float *part = NULL;
    if (chunks > 1 && !(part = calloc(chunks * PD, sizeof(float))))
        chunks = 1;   /* no memory for the partials: one chunk, into dg directly */
    for (long k = 0; k < PD; k++) {   /* 1 where g is 0: that entry's gradient is lost, as in
                                         _ScaledNorm; a trained g never lands on exactly 0 */
        inv_g[k] = g[k] != 0.f ? 1.f / g[k] : 1.f;
        dg[k] = 0.f;
    }
    #pragma omp parallel for schedule(static) if (rows * D >= PARALLEL)
    for (long c = 0; c < chunks; c++) {
        long i0 = c * periods / chunks * P, i1 = (c + 1) * periods / chunks * P;
        float *dgc = chunks > 1 ? part + c * PD : dg;
        if (D == 32) backward_rows(dout, out, g, inv_g, r, dy, dgc, i0, i1, 32, P);
        else if (D == 64) backward_rows(dout, out, g, inv_g, r, dy, dgc, i0, i1, 64, P);
        else if (D == 128) backward_rows(dout, out, g, inv_g, r, dy, dgc, i0, i1, 128, P);
        else backward_rows(dout, out, g, inv_g, r, dy, dgc, i0, i1, D, P);
    }
    for (long c = 0; c < chunks && chunks > 1; c++)
        for (long k = 0; k < PD; k++) dg[k] += part[c * PD + k];
    free(part);
}
