/* SPDX-License-Identifier: MIT */
/* Memory on the GLES backend: GL buffers handed out by fa_memory_alloc or wrapped by
 * fa_gles_buffer_wrap, each named by a reserved address range so that views, offsets and
 * strides work as with device pointers; views of a call's tensors inside them; the call's
 * working buffers. */
#include "gles.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Room for one more record (fa_memory_alloc, fa_gles_buffer_wrap). */
static fa_status mem_room(fa_context_t ctx, gles_state *s)
{
    if (s->n_mem < s->cap_mem)
        return FA_OK;
    const int cap = s->cap_mem ? 2 * s->cap_mem : 16;
    gl_mem *m = realloc(s->mem, sizeof(*m) * (size_t)cap);
    if (!m)
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "out of memory recording a GL buffer");
    s->mem = m;
    s->cap_mem = cap;
    return FA_OK;
}

/* Address space that stands for a buffer: no access, no memory behind it. */
static void *reserve(fa_context_t ctx, size_t bytes, size_t *reserved)
{
    *reserved = bytes ? bytes : 1;
    void *base = mmap(NULL, *reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
        fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "reserving %zu bytes of address space for a GL buffer failed",
                 *reserved);
        return NULL;
    }
    return base;
}

fa_status gles_mem_alloc(fa_context_t ctx, void *state, size_t bytes, void **ptr)
{
    gles_state *s = state;
    if (bytes > (size_t)INT32_MAX * 4)
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "bytes (%zu): GLES shaders index buffers with 32-bit integers (at most %zu "
                        "bytes a buffer)", bytes, (size_t)INT32_MAX * 4);
    fa_status st = mem_room(ctx, s);
    if (st != FA_OK)
        return st;
    size_t reserved;
    void *base = reserve(ctx, bytes, &reserved);
    if (!base)
        return FA_ERR_OUT_OF_MEMORY;
    if ((st = gles_make_current(ctx, s)) != FA_OK) {
        munmap(base, reserved);
        return st;
    }
    /* whole 16-byte words: the shaders reach 16-bit elements through the 32-bit word holding them */
    const size_t gl_bytes = bytes ? (bytes + 15) / 16 * 16 : 16;
    GLuint name = 0;
    glGenBuffers(1, &name);
    glBindBuffer(GL_SHADER_STORAGE_BUFFER, name);
    glBufferData(GL_SHADER_STORAGE_BUFFER, (GLsizeiptr)gl_bytes, NULL, GL_DYNAMIC_COPY);
    if (glGetError() != GL_NO_ERROR) {
        glDeleteBuffers(1, &name);
        gles_release_current(s);
        munmap(base, reserved);
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "creating a GL buffer of %zu bytes failed", bytes);
    }
    gles_release_current(s);
    s->mem[s->n_mem++] = (gl_mem){ base, bytes, reserved, gl_bytes, name, 1 };
    *ptr = base;
    return FA_OK;
}

fa_status gles_mem_import(fa_context_t ctx, void *state, uint64_t handle, size_t bytes, void **ptr)
{
    gles_state *s = state;
    if (!s->shared)
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "fa_gles_buffer_wrap needs a context from fa_gles_context_create (this "
                        "one is a 'gles' context of its own, sharing no objects with yours)");
    if (handle > UINT32_MAX)
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT, "buffer (%llu) is not a GL buffer name",
                        (unsigned long long)handle);
    const GLuint buffer = (GLuint)handle;
    fa_status st = mem_room(ctx, s);
    if (st != FA_OK || (st = gles_make_current(ctx, s)) != FA_OK)
        return st;
    GLint64 size = -1;
    const int is_buffer = glIsBuffer(buffer) == GL_TRUE;
    if (is_buffer) {
        glBindBuffer(GL_SHADER_STORAGE_BUFFER, buffer);
        glGetBufferParameteri64v(GL_SHADER_STORAGE_BUFFER, GL_BUFFER_SIZE, &size);
        glBindBuffer(GL_SHADER_STORAGE_BUFFER, 0);
    }
    gles_release_current(s);
    if (!is_buffer)
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                        "buffer (%u) is not a buffer object of the shared context (made with "
                        "glGenBuffers and given storage with glBufferData?)", (unsigned)buffer);
    if (size < 0 || (uint64_t)size < bytes)
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT, "bytes (%zu) exceeds buffer %u's size (%lld bytes)",
                        bytes, (unsigned)buffer, (long long)size);
    for (int i = 0; i < s->n_mem; i++) /* two views of one buffer would defeat the overlap checks */
        if (!s->mem[i].owned && s->mem[i].name == buffer)
            return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                            "buffer (%u) is already wrapped on this context (at %p): use that pointer, "
                            "or free it first", (unsigned)buffer, (void *)s->mem[i].base);
    size_t reserved;
    void *base = reserve(ctx, bytes, &reserved);
    if (!base)
        return FA_ERR_OUT_OF_MEMORY;
    s->mem[s->n_mem++] = (gl_mem){ base, bytes, reserved, (size_t)size, buffer, 0 };
    *ptr = base;
    return FA_OK;
}

fa_status gles_mem_free(fa_context_t ctx, void *state, void *ptr)
{
    gles_state *s = state;
    for (int i = 0; i < s->n_mem; i++) {
        if (s->mem[i].base != ptr)
            continue;
        if (s->mem[i].owned && gles_make_current(ctx, s) == FA_OK) {
            glDeleteBuffers(1, &s->mem[i].name);
            gles_release_current(s);
        }
        munmap(s->mem[i].base, s->mem[i].reserved);
        s->mem[i] = s->mem[--s->n_mem];
        return FA_OK;
    }
    return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                    "ptr (%p) is not a buffer fa_memory_alloc or fa_gles_buffer_wrap returned on "
                    "this GLES context", ptr);
}

const gl_mem *gles_find_mem(const gles_state *s, const void *p, size_t bytes, size_t *off)
{
    const unsigned char *c = p;
    for (int i = 0; i < s->n_mem; i++) {
        const gl_mem *m = &s->mem[i];
        if (c >= m->base && c < m->base + m->reserved) {
            *off = (size_t)(c - m->base);
            return *off + bytes <= m->bytes || (bytes == 0 && *off <= m->bytes) ? m : NULL;
        }
    }
    return NULL;
}

/* [p, +bytes) inside one GL buffer of s, or an error naming it. */
static const gl_mem *mem_of(fa_context_t ctx, const gles_state *s, const void *p, size_t bytes,
                            const char *name, size_t *off)
{
    const gl_mem *m = gles_find_mem(s, p, bytes, off);
    if (!m)
        fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                 "%s: [%p, +%zu bytes) is not inside one buffer from fa_memory_alloc on this GLES "
                 "context", name, p, bytes);
    return m;
}

/* Whether [p, +bytes) meets a buffer address of s: a host pointer there is the context's own
 * reservation, which faults when touched. */
static int meets_mem(const gles_state *s, const void *p, size_t bytes)
{
    const uintptr_t a = (uintptr_t)p, n = bytes ? bytes : 1;
    for (int i = 0; i < s->n_mem; i++) {
        const uintptr_t b = (uintptr_t)s->mem[i].base;
        if (a < b + s->mem[i].reserved && b < a + n)
            return 1;
    }
    return 0;
}

fa_status gles_mem_copy(fa_context_t ctx, void *state, void *dst, const void *src, size_t bytes,
                        fa_copy_kind kind)
{
    gles_state *s = state;
    size_t off = 0, src_off = 0;
    if (kind != FA_COPY_WITHIN && meets_mem(s, kind == FA_COPY_DOWNLOAD ? dst : src, bytes))
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                        "%s (%p) is in a buffer of this GLES context, where host memory goes "
                        "(fa_memory_copy copies between buffers)",
                        kind == FA_COPY_DOWNLOAD ? "dst" : "src", kind == FA_COPY_DOWNLOAD ? dst : src);
    const gl_mem *m = kind == FA_COPY_DOWNLOAD ? mem_of(ctx, s, src, bytes, "src", &off)
                                               : mem_of(ctx, s, dst, bytes, "dst", &off);
    const gl_mem *from = m && kind == FA_COPY_WITHIN ? mem_of(ctx, s, src, bytes, "src", &src_off) : NULL;
    if (!m || (kind == FA_COPY_WITHIN && !from))
        return FA_ERR_INVALID_ARGUMENT;
    fa_status st = gles_make_current(ctx, s);
    if (st != FA_OK)
        return st;
    if (kind == FA_COPY_WITHIN) { /* on the GPU, after the shaders that wrote src */
        glMemoryBarrier(GL_BUFFER_UPDATE_BARRIER_BIT);
        glBindBuffer(GL_COPY_READ_BUFFER, from->name);
        glBindBuffer(GL_COPY_WRITE_BUFFER, m->name);
        glCopyBufferSubData(GL_COPY_READ_BUFFER, GL_COPY_WRITE_BUFFER, (GLintptr)src_off, (GLintptr)off,
                            (GLsizeiptr)bytes);
        st = gles_gl_check(ctx, "copying between GL buffers");
        if (st == FA_OK)
            glFinish();
    } else if (kind == FA_COPY_UPLOAD) {
        glBindBuffer(GL_SHADER_STORAGE_BUFFER, m->name);
        glBufferSubData(GL_SHADER_STORAGE_BUFFER, (GLintptr)off, (GLsizeiptr)bytes, src);
        st = gles_gl_check(ctx, "uploading into a GL buffer");
    } else {
        glBindBuffer(GL_SHADER_STORAGE_BUFFER, m->name);
        glMemoryBarrier(GL_BUFFER_UPDATE_BARRIER_BIT);
        const void *map = glMapBufferRange(GL_SHADER_STORAGE_BUFFER, (GLintptr)off, (GLsizeiptr)bytes,
                                           GL_MAP_READ_BIT);
        if (map) {
            memcpy(dst, map, bytes);
            glUnmapBuffer(GL_SHADER_STORAGE_BUFFER);
        } else if ((st = gles_gl_check(ctx, "mapping a GL buffer")) == FA_OK) {
            st = fa_error(ctx, FA_ERR_BACKEND, "mapping a GL buffer for reading failed");
        }
    }
    gles_release_current(s);
    return st;
}

fa_status gles_view_of(fa_context_t ctx, const gles_state *s, const void *data, fa_dtype dt,
                       int64_t sb, int64_t ss, int64_t sh, int64_t nb, int64_t rows, int64_t heads,
                       int64_t dim, const char *name, gl_view *v)
{
    const int64_t esz = dt == FA_DTYPE_F32 ? 4 : 2;
    size_t off = 0;
    const gl_mem *m = gles_find_mem(s, data, 0, &off);
    if (!m)
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                        "%s is not in a GL buffer while q.data is: pass q, k, v, o (and lse) all in "
                        "buffers from fa_memory_alloc, or all in host memory", name);
    if (off % (size_t)esz)
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                        "%s: its byte offset in the GL buffer (%zu) is not a multiple of the element "
                        "size (%d)", name, off, (int)esz);
    /* the last element the view reaches (strides are positive after validation) */
    const int64_t first = (int64_t)off / esz;
    const int empty = nb <= 0 || rows <= 0 || heads <= 0 || dim <= 0;
    const int64_t last = empty ? first : first + (nb - 1) * sb + (rows - 1) * ss + (heads - 1) * sh + (dim - 1);
    if (!empty && (size_t)((last + 1) * esz) > m->bytes)
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                        "%s: the view reaches byte %lld of its GL buffer of %zu bytes", name,
                        (long long)((last + 1) * esz), m->bytes);
    /* 16-bit elements are reached through the 32-bit word that holds them */
    if (esz == 2 && !empty && (size_t)(last / 2 + 1) * 4 > m->gl_bytes)
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                        "%s: its last 16-bit element shares a 32-bit word with the byte past its GL "
                        "buffer's end (%zu bytes): give the buffer a size that is a multiple of 4",
                        name, m->gl_bytes);
    if (last > INT32_MAX / 2 || sb > INT32_MAX || ss > INT32_MAX || sh > INT32_MAX)
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "%s: element offsets past 2^30 exceed the GLES shaders' 32-bit indexing", name);
    *v = (gl_view){ m,
                    (int32_t)first,
                    (int32_t)sb,
                    (int32_t)ss,
                    (int32_t)sh,
                    dt == FA_DTYPE_F32 ? 0 : dt == FA_DTYPE_F16 ? 1 : 2,
                    empty ? 0 : (size_t)((last + 1) * esz) };
    return FA_OK;
}

fa_status gles_scratch(fa_context_t ctx, gles_state *s, int slot, const void *data, size_t bytes,
                       GLuint *out)
{
    /* GL buffers are never empty; a call with nothing to upload uploads nothing */
    const size_t want = bytes ? bytes : 16;
    if (!s->scratch[slot])
        glGenBuffers(1, &s->scratch[slot]);
    glBindBuffer(GL_SHADER_STORAGE_BUFFER, s->scratch[slot]);
    if (s->scratch_bytes[slot] < want) {
        s->scratch_bytes[slot] = 0; /* until the allocation is known to have worked */
        glBufferData(GL_SHADER_STORAGE_BUFFER, (GLsizeiptr)want, NULL, GL_DYNAMIC_COPY);
        const GLenum e = glGetError();
        if (e != GL_NO_ERROR)
            return fa_error(ctx, e == GL_OUT_OF_MEMORY ? FA_ERR_OUT_OF_MEMORY : FA_ERR_BACKEND,
                            "allocating a %zu-byte GL buffer for the call failed (OpenGL ES error 0x%x)",
                            want, (unsigned)e);
        s->scratch_bytes[slot] = want;
    }
    if (data && bytes)
        glBufferSubData(GL_SHADER_STORAGE_BUFFER, 0, (GLsizeiptr)bytes, data);
    *out = s->scratch[slot];
    return FA_OK;
}

fa_status gles_read_back(fa_context_t ctx, GLuint buf, size_t bytes, void *out)
{
    if (bytes == 0)
        return FA_OK;
    glBindBuffer(GL_SHADER_STORAGE_BUFFER, buf);
    const void *m = glMapBufferRange(GL_SHADER_STORAGE_BUFFER, 0, (GLsizeiptr)bytes, GL_MAP_READ_BIT);
    if (!m) {
        const fa_status st = gles_gl_check(ctx, "mapping a result buffer");
        return st != FA_OK ? st : fa_error(ctx, FA_ERR_BACKEND, "mapping a result buffer failed");
    }
    memcpy(out, m, bytes);
    glUnmapBuffer(GL_SHADER_STORAGE_BUFFER);
    return FA_OK;
}
