// SPDX-License-Identifier: MIT
/*
 * The runner's decode GEMMs, each Llama-2-7B projection as the runner calls it (y [T, out] =
 * x [T, in] w [out, in]^T, bf16 in, float32 accumulation, float32 out with beta 1 for the
 * residual projections o and w2, bf16 out otherwise):
 *   (default)  at T = 1, 8 and 32 rows, every candidate of cublasLt's heuristic (up to 16);
 *              weights cycled through 262 MB so that none stays in L2 between calls; best of
 *              6 timed runs of 20 calls, after one;
 *   --chain    a batch-1 step's projections alone: qkv, o, w13, w2 of 32 layers (12.9 GB of
 *              distinct weights) queued back to back on one stream, through cublasGemmEx and
 *              through cuBLAS's bf16 GEMV, each with the weights as the runner keeps them
 *              ([out, in], "T") and transposed ([in, out], "N"); the chain's best of 5 after
 *              one, and each projection's mean when timed one by one; then each projection at
 *              8192 rows (a prefill step) in both layouts, best of 3 after one.
 *
 *   nvcc -O2 -o gemm_probe bench/gpu/gemm_probe.cu -lcublasLt -lcublas && ./gemm_probe [--chain]
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x)                                                                  \
    do {                                                                       \
        int e_ = (int)(x);                                                     \
        if (e_) {                                                              \
            fprintf(stderr, "%s failed (%d) at line %d\n", #x, e_, __LINE__); \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

typedef struct shape {
    const char *name;
    int out, in, residual;
} shape;
static const shape kShapes[] = {
    { "qkv", 12288, 4096, 0 }, { "o", 4096, 4096, 1 }, { "w13", 22016, 4096, 0 },
    { "w2", 4096, 11008, 1 },  { "classifier", 32000, 4096, 0 },
};
enum { kLayers = 32, kLayerShapes = 4 }; /* --chain: 32 layers of the first four */

/* --chain: projection i of a layer whose weights start at w ([out, in], or [in, out] with
 * trans), for T rows, through GemmEx or the GEMV (T = 1). */
static void project(cublasHandle_t h, const __nv_bfloat16 *w, const __nv_bfloat16 *x, __nv_bfloat16 *yb, float *yf,
                    int i, int gemv, int trans, int T)
{
    const shape *s = &kShapes[i];
    const float one = 1.0f, zero = 0.0f, *beta = s->residual ? &one : &zero;
    const cublasOperation_t op = trans ? CUBLAS_OP_N : CUBLAS_OP_T;
    const int lda = trans ? s->out : s->in;
    if (!gemv)
        CK(cublasGemmEx(h, op, CUBLAS_OP_N, s->out, T, s->in, &one, w, CUDA_R_16BF, lda, x, CUDA_R_16BF, s->in, beta,
                        s->residual ? (void *)yf : yb, s->residual ? CUDA_R_32F : CUDA_R_16BF, s->out,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else if (s->residual)
        CK(cublasTSSgemvStridedBatched(h, op, trans ? s->out : s->in, trans ? s->in : s->out, &one, w, lda, 0, x, 1,
                                       0, beta, yf, 1, 0, 1));
    else
        CK(cublasTSTgemvStridedBatched(h, op, trans ? s->out : s->in, trans ? s->in : s->out, &one, w, lda, 0, x, 1,
                                       0, beta, yb, 1, 0, 1));
}

static int chain(void)
{
    size_t per = 0; /* elements of one layer's four matrices */
    for (int i = 0; i < kLayerShapes; i++)
        per += (size_t)kShapes[i].out * kShapes[i].in;
    cublasHandle_t h;
    __nv_bfloat16 *w, *x, *yb;
    void *ws;
    float *yf;
    cudaStream_t st;
    cudaEvent_t e0, e1;
    CK(cudaMalloc((void **)&w, per * kLayers * 2));
    CK(cudaMemset(w, 0, per * kLayers * 2));
    const size_t P = 8192; /* the prefill rows */
    CK(cudaMalloc((void **)&x, P * 11008 * 2));
    CK(cudaMemset(x, 0, P * 11008 * 2));
    CK(cudaMalloc((void **)&yb, P * 22016 * 2));
    CK(cudaMalloc((void **)&yf, P * 22016 * 4));
    CK(cudaMemset(yf, 0, P * 22016 * 4));
    CK(cublasCreate(&h));
    CK(cudaMalloc(&ws, (size_t)32 << 20));
    CK(cublasSetWorkspace(h, ws, (size_t)32 << 20)); /* as the runner's engine */
    CK(cudaStreamCreate(&st));
    CK(cublasSetStream(h, st));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int variant = 0; variant < 4; variant++) {
        const int gemv = variant & 1, trans = variant >> 1;
        double one_by_one[kLayerShapes] = { 0 };
        float best = 1e30f, ms;
        for (int rep = 0; rep < 6; rep++) {
            for (int l = 0; l < kLayers; l++) {
                const __nv_bfloat16 *lw = w + per * l;
                for (int i = 0; i < kLayerShapes; lw += (size_t)kShapes[i].out * kShapes[i].in, i++) {
                    CK(cudaEventRecord(e0, st));
                    project(h, lw, x, yb, yf, i, gemv, trans, 1);
                    CK(cudaEventRecord(e1, st));
                    CK(cudaEventSynchronize(e1));
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    if (rep > 0)
                        one_by_one[i] += ms / (5.0 * kLayers);
                }
            }
            CK(cudaEventRecord(e0, st));
            for (int l = 0; l < kLayers; l++) {
                const __nv_bfloat16 *lw = w + per * l;
                for (int i = 0; i < kLayerShapes; lw += (size_t)kShapes[i].out * kShapes[i].in, i++)
                    project(h, lw, x, yb, yf, i, gemv, trans, 1);
            }
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (rep > 0 && ms < best)
                best = ms;
        }
        printf("%-6s %s chain %.3f ms (%.2f TB/s);", gemv ? "gemv" : "gemmEx", trans ? "N" : "T", best,
               (double)per * kLayers * 2 / (best * 1e-3) / 1e12);
        for (int i = 0; i < kLayerShapes; i++)
            printf(" %s %.1f us", kShapes[i].name, one_by_one[i] * 1e3);
        printf("\n");
    }
    for (int trans = 0; trans < 2; trans++) { /* a prefill step's rows */
        printf("gemmEx %s at %zu rows:", trans ? "N" : "T", P);
        for (int i = 0; i < kLayerShapes; i++) {
            float best = 1e30f, ms;
            for (int rep = 0; rep < 4; rep++) {
                CK(cudaEventRecord(e0, st));
                project(h, w, x, yb, yf, i, 0, trans, (int)P);
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                CK(cudaEventElapsedTime(&ms, e0, e1));
                if (rep > 0 && ms < best)
                    best = ms;
            }
            printf(" %s %.3f ms (%.0f TFLOP/s)", kShapes[i].name, best,
                   2.0 * P * kShapes[i].out * kShapes[i].in / (best * 1e-3) / 1e12);
        }
        printf("\n");
    }
    return 0;
}

int main(int argc, char **argv)
{
    const int chained = argc == 2 && strcmp(argv[1], "--chain") == 0;
    if (argc > 1 && !chained) {
        const int help = strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0;
        fprintf(help ? stdout : stderr,
                help ? "usage: %s [--chain]\n  times every cublasLt candidate of the Llama-2-7B decode GEMMs at "
                       "T = 1, 8, 32;\n  --chain: a batch-1 step's 128 projections back to back, through "
                       "cublasGemmEx and cuBLAS's bf16 GEMV\n"
                     : "%s: takes --chain or nothing (see --help)\n",
                argv[0]);
        return help ? 0 : 2;
    }
    if (chained)
        return chain();
    const shape *shapes = kShapes;
    const int rows[] = { 1, 8, 32 };
    const size_t pool = (size_t)32000 * 4096, wsz = (size_t)32 << 20;
    cublasLtHandle_t lt;
    void *ws, *w, *x, *y;
    cudaStream_t st;
    cudaEvent_t a, b;
    CK(cublasLtCreate(&lt));
    CK(cudaMalloc(&ws, wsz));
    CK(cudaMalloc(&w, pool * 2));
    CK(cudaMalloc(&x, (size_t)32 * 11008 * 2));
    CK(cudaMalloc(&y, (size_t)32 * 32000 * 4));
    CK(cudaMemset(w, 0, pool * 2));
    CK(cudaMemset(x, 0, (size_t)32 * 11008 * 2));
    CK(cudaMemset(y, 0, (size_t)32 * 32000 * 4));
    CK(cudaStreamCreate(&st));
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int ti = 0; ti < 3; ti++)
        for (int si = 0; si < 5; si++) {
            const int T = rows[ti], out = shapes[si].out, in = shapes[si].in;
            const int f32 = shapes[si].residual || si == 4, regions = (int)(pool / ((size_t)out * in));
            const float alpha = 1.0f, beta = shapes[si].residual ? 1.0f : 0.0f;
            const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
            cublasLtMatmulDesc_t op;
            cublasLtMatrixLayout_t la, lb, lc;
            cublasLtMatmulPreference_t pref;
            cublasLtMatmulHeuristicResult_t res[16];
            int n = 0;
            CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
            CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
            CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
            CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, in, out, in));
            CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, in, T, in));
            CK(cublasLtMatrixLayoutCreate(&lc, f32 ? CUDA_R_32F : CUDA_R_16BF, out, T, out));
            CK(cublasLtMatmulPreferenceCreate(&pref));
            CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz,
                                                    sizeof(wsz)));
            CK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 16, res, &n));
            printf("%s T=%d [%d x %d] y %s: %d candidates\n", shapes[si].name, T, out, in, f32 ? "f32" : "bf16", n);
            for (int i = 0; i < n; i++) {
                float best = 1e30f;
                for (int r = 0; r < 7; r++) {
                    float ms;
                    CK(cudaEventRecord(a, st));
                    for (int k = 0; k < 20; k++)
                        CK(cublasLtMatmul(lt, op, &alpha, (char *)w + (size_t)(k % regions) * out * in * 2, la, x,
                                          lb, &beta, y, lc, y, lc, &res[i].algo, ws, wsz, st));
                    CK(cudaEventRecord(b, st));
                    CK(cudaEventSynchronize(b));
                    CK(cudaEventElapsedTime(&ms, a, b));
                    if (r > 0 && ms / 20 < best)
                        best = ms / 20;
                }
                int splitk = 0, tile = 0;
                size_t got;
                cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                                     sizeof(splitk), &got);
                cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile),
                                                     &got);
                printf("  candidate %2d: %7.1f us %5.2f TB/s (split-K %d, tile %d)\n", i, best * 1e3,
                       (double)out * in * 2 / (best * 1e-3) / 1e12, splitk, tile);
            }
            cublasLtMatmulPreferenceDestroy(pref);
            cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(lc);
            cublasLtMatmulDescDestroy(op);
        }
    return 0;
}
