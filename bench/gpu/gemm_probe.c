/* SPDX-License-Identifier: MIT */
/*
 * The runner's decode GEMMs through cublasLt: for each Llama-2-7B projection (qkv, o, w13, w2,
 * the classifier) at T = 1, 8 and 32 rows, every candidate of cublasLt's heuristic (up to 16)
 * timed as the runner calls it (y [T, out] = x [T, in] w [out, in]^T, bf16 in, float32 out with
 * beta 1 for the residual projections, bf16 out otherwise). Weights are cycled through 262 MB
 * so that none stays in L2 between calls. Best of 6 timed runs of 20 calls, after one.
 *
 *   nvcc -O2 -o gemm_probe bench/gpu/gemm_probe.c -lcublasLt && ./gemm_probe
 */
#include <cublasLt.h>
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

int main(int argc, char **argv)
{
    if (argc > 1) {
        const int help = strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0;
        fprintf(help ? stdout : stderr,
                help ? "usage: %s\n  times every cublasLt candidate of the Llama-2-7B decode GEMMs at T = 1, 8, 32 "
                       "(no options)\n"
                     : "%s: takes no options (see --help)\n",
                argv[0]);
        return help ? 0 : 2;
    }
    const struct { const char *name; int out, in, residual; } shapes[] = {
        { "qkv", 12288, 4096, 0 }, { "o", 4096, 4096, 1 }, { "w13", 22016, 4096, 0 },
        { "w2", 4096, 11008, 1 },  { "classifier", 32000, 4096, 0 },
    };
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
