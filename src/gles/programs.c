/* SPDX-License-Identifier: MIT */
/* Shader programs: each shader compiled from its embedded .comp source after a #define
 * preamble of the tiles it reads, cached in the context, and where the driver offers binary
 * formats kept across processes as program binaries (glGetProgramBinary), so that a
 * process's first call for a head_dim does not compile again what an earlier one did. */
#include "gles.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gles_common.h"
#include "gles_decode_merge.h"
#include "gles_decode_split.h"
#include "gles_flash_forward.h"
#include "gles_flash_tiled.h"
#include "gles_pack.h"
#include "gles_std_pv.h"
#include "gles_std_scores.h"
#include "gles_std_softmax.h"
#include "gles_unpack.h"

static const char *const shader_src[SH_COUNT] = { fa_gles_flash_forward, fa_gles_flash_tiled,  fa_gles_std_scores,
                                                  fa_gles_std_softmax,   fa_gles_std_pv,       fa_gles_decode_split,
                                                  fa_gles_decode_merge,  fa_gles_pack,         fa_gles_unpack };
const char *const gles_shader_name[SH_COUNT] = { "flash_forward", "flash_tiled",  "std_scores",
                                                 "std_softmax",   "std_pv",       "decode_split",
                                                 "decode_merge",  "pack",         "unpack" };

/* The tiles a shader reads (its #defines, common.glsl's included), the rest zero: one program
 * serves every call that differs only in what the shader does not read. */
static tiles program_key(int shader, const tiles *t)
{
    tiles k = { 0 };
    k.d4 = t->d4;
    switch (shader) {
    case SH_FLASH:
        k = *t;
        k.tiled = k.tm = k.tn = k.nx = k.ny = k.dc4 = k.kc = k.sh_qk = k.sh_p = k.sh_r = 0;
        break;
    case SH_FLASH_TILED:
        k = *t;
        k.tex = 0;
        break;
    case SH_SCORES:
        k.f16 = t->f16;
        k.tex = t->tex;
        k.softcap = t->softcap;
        break;
    case SH_SOFTMAX: k.d4 = 0; break;
    case SH_PV:
        k.f16 = t->f16;
        k.tex = t->tex;
        k.o_f16 = t->o_f16;
        break;
    case SH_DEC_SPLIT:
        k.f16 = t->f16;
        k.softcap = t->softcap;
        break;
    case SH_DEC_MERGE: k.o_f16 = t->o_f16; break;
    case SH_PACK: k.f16 = t->f16; break;
    default: break; /* SH_UNPACK: head_dim alone */
    }
    return k;
}

/* 64-bit FNV-1a, continued from h. */
static uint64_t fnv1a(uint64_t h, const char *s)
{
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* 64-bit FNV-1a over n bytes, continued from h. */
static uint64_t fnv1a_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ c[i]) * 0x100000001b3ull;
    return h;
}

#define BINARY_MAGIC 0x32424146u /* "FAB2" */
#define BINARY_MAX ((size_t)64 << 20)

/* The cache file of a program and its key: its sources and the driver named in the hash, so
 * that another driver, version or source never reads it. */
static int binary_path(const gles_state *s, const char *const parts[3], char *path, size_t cap, uint64_t *key)
{
    uint64_t h = fnv1a(0xcbf29ce484222325ull, s->renderer);
    h = fnv1a(h, s->version);
    for (int i = 0; i < 3; i++)
        h = fnv1a(h, parts[i]);
    *key = h;
    const int n = snprintf(path, cap, "%s/gles-%016llx.bin", s->cache_dir, (unsigned long long)h);
    return n > 0 && (size_t)n < cap;
}

/* A program from its cached binary; 0 where there is none, it is another program's (its key)
 * or damaged (its checksum), or the driver refuses it (another driver build): the cache file is
 * then replaced by the compiled program's. The file is trusted for nothing: its header is
 * checked, and the driver validates the binary. */
static GLuint load_binary(const char *path, uint64_t key)
{
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return 0;
    struct stat st;
    uint32_t head[7]; /* magic, format, length, key (2 words), checksum of the binary (2 words) */
    GLuint prog = 0;
    void *bin = NULL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || read(fd, head, sizeof(head)) != (ssize_t)sizeof(head) ||
        head[0] != BINARY_MAGIC || head[2] == 0 || head[2] > BINARY_MAX || head[3] != (uint32_t)key ||
        head[4] != (uint32_t)(key >> 32) || (off_t)(sizeof(head) + head[2]) != st.st_size ||
        !(bin = malloc(head[2])) || read(fd, bin, head[2]) != (ssize_t)head[2])
        goto out;
    const uint64_t sum = fnv1a_bytes(0xcbf29ce484222325ull, bin, head[2]);
    if (head[5] != (uint32_t)sum || head[6] != (uint32_t)(sum >> 32))
        goto out;
    prog = glCreateProgram();
    glProgramBinary(prog, (GLenum)head[1], bin, (GLsizei)head[2]);
    GLint ok = 0;
    glGetProgramiv(prog, GL_LINK_STATUS, &ok);
    if (!ok) {
        glDeleteProgram(prog);
        prog = 0;
    }
    glGetError(); /* an unknown format is GL_INVALID_ENUM: not the call's error */
out:
    free(bin);
    close(fd);
    return prog;
}

/* Keep a linked program's binary for later processes: written to a temporary file and renamed,
 * so that a reader never sees half of one. Failing to keep it costs only a later compile. */
static void store_binary(GLuint prog, const char *path, uint64_t key)
{
    GLint len = 0;
    glGetProgramiv(prog, GL_PROGRAM_BINARY_LENGTH, &len);
    if (len <= 0 || (size_t)len > BINARY_MAX)
        return;
    void *bin = malloc((size_t)len);
    GLenum format = 0;
    GLsizei got = 0;
    if (bin)
        glGetProgramBinary(prog, len, &got, &format, bin);
    char tmp[640];
    const int n = snprintf(tmp, sizeof(tmp), "%s.%ld.tmp", path, (long)getpid());
    if (bin && got > 0 && glGetError() == GL_NO_ERROR && n > 0 && (size_t)n < sizeof(tmp)) {
        const uint64_t sum = fnv1a_bytes(0xcbf29ce484222325ull, bin, (size_t)got);
        const uint32_t head[7] = { BINARY_MAGIC,  (uint32_t)format,    (uint32_t)got,       (uint32_t)key,
                                   (uint32_t)(key >> 32), (uint32_t)sum, (uint32_t)(sum >> 32) };
        FILE *f = fopen(tmp, "wb");
        if (f) {
            const int ok = fwrite(head, sizeof(head), 1, f) == 1 && fwrite(bin, (size_t)got, 1, f) == 1;
            if (fclose(f) == 0 && ok && rename(tmp, path) == 0)
                tmp[0] = '\0';
            if (tmp[0])
                remove(tmp);
        }
    }
    free(bin);
}

static fa_status compile(fa_context_t ctx, const gles_state *s, int shader, const tiles *t,
                         const char *const parts[3], GLuint *out)
{
    GLuint sh = glCreateShader(GL_COMPUTE_SHADER);
    glShaderSource(sh, 3, parts, NULL);
    glCompileShader(sh);
    GLint ok = 0;
    glGetShaderiv(sh, GL_COMPILE_STATUS, &ok);
    if (!ok) {
        char log[512] = "";
        glGetShaderInfoLog(sh, sizeof(log), NULL, log);
        glDeleteShader(sh);
        return fa_error(ctx, FA_ERR_BACKEND, "compiling shader %s (D4 %d, BR %d, BC %d, f16 %d): %s",
                        gles_shader_name[shader], t->d4, t->br, t->bc, t->f16, log);
    }
    GLuint prog = glCreateProgram();
    glAttachShader(prog, sh);
    if (s->binaries)
        glProgramParameteri(prog, GL_PROGRAM_BINARY_RETRIEVABLE_HINT, GL_TRUE);
    glLinkProgram(prog);
    glDeleteShader(sh);
    glGetProgramiv(prog, GL_LINK_STATUS, &ok);
    if (!ok) {
        char log[512] = "";
        glGetProgramInfoLog(prog, sizeof(log), NULL, log);
        glDeleteProgram(prog);
        return fa_error(ctx, FA_ERR_BACKEND, "linking shader %s: %s", gles_shader_name[shader], log);
    }
    *out = prog;
    return FA_OK;
}

fa_status gles_program(fa_context_t ctx, gles_state *s, int shader, const tiles *tl, GLuint *out)
{
    const tiles key = program_key(shader, tl), *t = &key;
    for (int i = 0; i < s->n_programs; i++) {
        const program *p = &s->programs[i];
        if (p->shader == shader && memcmp(&p->t, t, sizeof(*t)) == 0) {
            *out = p->id;
            return FA_OK;
        }
    }
    char preamble[640], ext[64] = "";
    if (t->tex) /* only chosen where s->texbuf names the extension */
        snprintf(ext, sizeof(ext), "#extension %s : require\n", s->texbuf);
    snprintf(preamble, sizeof(preamble),
             "#version 310 es\n%s#define D4 %d\n#define BR %d\n#define BC %d\n#define NI %d\n"
             "#define ROWS %d\n#define STORE_F16 %d\n#define KV_TEX %d\n#define TM %d\n"
             "#define TN %d\n#define NX %d\n#define NY %d\n#define DC4 %d\n#define KC %d\n"
             "#define SH_P %d\n#define SH_R %d\n#define SH_TOTAL %d\n#define SOFTCAP %d\n#define O_F16 %d\n",
             ext, t->d4, t->br, t->bc, t->rows ? t->br / t->rows : 0, t->rows, t->f16, t->tex, t->tm, t->tn,
             t->nx, t->ny, t->dc4, t->kc, t->sh_qk, t->sh_qk + t->sh_p, t->sh_qk + t->sh_p + t->sh_r,
             t->softcap, t->o_f16);
    const char *const parts[3] = { preamble, fa_gles_common, shader_src[shader] };
    char path[600];
    uint64_t bin_key = 0;
    const int cached = s->binaries && s->cache_dir[0] && binary_path(s, parts, path, sizeof(path), &bin_key);
    GLuint prog = cached ? load_binary(path, bin_key) : 0;
    if (!prog) {
        fa_status st = compile(ctx, s, shader, t, parts, &prog);
        if (st != FA_OK)
            return st;
        if (cached)
            store_binary(prog, path, bin_key);
    }
    if (s->n_programs == GLES_MAX_PROGRAMS) { /* full: start over (rare: many head dims) */
        gles_programs_free(s);
    }
    s->programs[s->n_programs++] = (program){ shader, *t, prog };
    *out = prog;
    return FA_OK;
}

/* FLASHATTN_CACHE_DIR, else $XDG_CACHE_HOME/flashattn, else ~/.cache/flashattn; an empty
 * FLASHATTN_CACHE_DIR keeps nothing. The folder is made when missing. */
void gles_programs_init(gles_state *s)
{
    GLint formats = 0;
    glGetIntegerv(GL_NUM_PROGRAM_BINARY_FORMATS, &formats);
    s->binaries = formats > 0;
    s->cache_dir[0] = '\0';
    const char *dir = getenv("FLASHATTN_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n = -1, from_home = 0;
    if (dir)
        n = snprintf(s->cache_dir, sizeof(s->cache_dir), "%s", dir);
    else if (xdg && *xdg)
        n = snprintf(s->cache_dir, sizeof(s->cache_dir), "%s/flashattn", xdg);
    else if (home && *home && (from_home = 1))
        n = snprintf(s->cache_dir, sizeof(s->cache_dir), "%s/.cache/flashattn", home);
    if (n <= 0 || (size_t)n >= sizeof(s->cache_dir)) {
        s->cache_dir[0] = '\0';
        return;
    }
    if (from_home) { /* ~/.cache may not exist yet */
        char parent[sizeof(s->cache_dir)];
        snprintf(parent, sizeof(parent), "%s/.cache", home);
        mkdir(parent, 0755);
    }
    if (mkdir(s->cache_dir, 0755) != 0) {
        struct stat st;
        if (stat(s->cache_dir, &st) != 0 || !S_ISDIR(st.st_mode))
            s->cache_dir[0] = '\0';
    }
}

void gles_programs_free(gles_state *s)
{
    for (int i = 0; i < s->n_programs; i++)
        glDeleteProgram(s->programs[i].id);
    s->n_programs = 0;
}
