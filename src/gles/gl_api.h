/* SPDX-License-Identifier: MIT */
/* The EGL and GLES entry points the backend calls, loaded at run time (loader.c): the library
 * links neither libEGL nor libGLESv2, so it loads, and its other backends run, where they are
 * missing; a GLES context then fails with FA_ERR_BACKEND_UNAVAILABLE saying what to install.
 * Included through gles.h: each name below is a call through gles_fn. */
#ifndef FA_GLES_API_H
#define FA_GLES_API_H

#include "../core/internal.h"

#include <EGL/egl.h>
#include <EGL/eglext.h>
#include <GLES3/gl31.h>
#include <GLES2/gl2ext.h> /* after gl31.h: GL_EXT_disjoint_timer_query's names */

#define GLES_EGL_FUNCS(X) \
    X(PFNEGLBINDAPIPROC, eglBindAPI) \
    X(PFNEGLCREATECONTEXTPROC, eglCreateContext) \
    X(PFNEGLDESTROYCONTEXTPROC, eglDestroyContext) \
    X(PFNEGLGETCURRENTCONTEXTPROC, eglGetCurrentContext) \
    X(PFNEGLGETCURRENTDISPLAYPROC, eglGetCurrentDisplay) \
    X(PFNEGLGETCURRENTSURFACEPROC, eglGetCurrentSurface) \
    X(PFNEGLGETERRORPROC, eglGetError) \
    X(PFNEGLGETPROCADDRESSPROC, eglGetProcAddress) \
    X(PFNEGLINITIALIZEPROC, eglInitialize) \
    X(PFNEGLMAKECURRENTPROC, eglMakeCurrent) \
    X(PFNEGLQUERYAPIPROC, eglQueryAPI) \
    X(PFNEGLQUERYSTRINGPROC, eglQueryString)

#define GLES_GL_FUNCS(X) \
    X(PFNGLACTIVETEXTUREPROC, glActiveTexture) \
    X(PFNGLATTACHSHADERPROC, glAttachShader) \
    X(PFNGLBEGINQUERYPROC, glBeginQuery) \
    X(PFNGLBINDBUFFERPROC, glBindBuffer) \
    X(PFNGLBINDBUFFERBASEPROC, glBindBufferBase) \
    X(PFNGLBINDTEXTUREPROC, glBindTexture) \
    X(PFNGLBUFFERDATAPROC, glBufferData) \
    X(PFNGLBUFFERSUBDATAPROC, glBufferSubData) \
    X(PFNGLCOMPILESHADERPROC, glCompileShader) \
    X(PFNGLCOPYBUFFERSUBDATAPROC, glCopyBufferSubData) \
    X(PFNGLCREATEPROGRAMPROC, glCreateProgram) \
    X(PFNGLCREATESHADERPROC, glCreateShader) \
    X(PFNGLDELETEBUFFERSPROC, glDeleteBuffers) \
    X(PFNGLDELETEPROGRAMPROC, glDeleteProgram) \
    X(PFNGLDELETEQUERIESPROC, glDeleteQueries) \
    X(PFNGLDELETESHADERPROC, glDeleteShader) \
    X(PFNGLDELETETEXTURESPROC, glDeleteTextures) \
    X(PFNGLDISPATCHCOMPUTEPROC, glDispatchCompute) \
    X(PFNGLENDQUERYPROC, glEndQuery) \
    X(PFNGLFINISHPROC, glFinish) \
    X(PFNGLGENBUFFERSPROC, glGenBuffers) \
    X(PFNGLGENQUERIESPROC, glGenQueries) \
    X(PFNGLGENTEXTURESPROC, glGenTextures) \
    X(PFNGLGETBUFFERPARAMETERI64VPROC, glGetBufferParameteri64v) \
    X(PFNGLGETERRORPROC, glGetError) \
    X(PFNGLGETINTEGERI_VPROC, glGetIntegeri_v) \
    X(PFNGLGETINTEGERVPROC, glGetIntegerv) \
    X(PFNGLGETPROGRAMBINARYPROC, glGetProgramBinary) \
    X(PFNGLGETPROGRAMINFOLOGPROC, glGetProgramInfoLog) \
    X(PFNGLGETPROGRAMIVPROC, glGetProgramiv) \
    X(PFNGLGETSHADERINFOLOGPROC, glGetShaderInfoLog) \
    X(PFNGLGETSHADERIVPROC, glGetShaderiv) \
    X(PFNGLGETSTRINGPROC, glGetString) \
    X(PFNGLGETSTRINGIPROC, glGetStringi) \
    X(PFNGLGETUNIFORMLOCATIONPROC, glGetUniformLocation) \
    X(PFNGLISBUFFERPROC, glIsBuffer) \
    X(PFNGLLINKPROGRAMPROC, glLinkProgram) \
    X(PFNGLMAPBUFFERRANGEPROC, glMapBufferRange) \
    X(PFNGLMEMORYBARRIERPROC, glMemoryBarrier) \
    X(PFNGLPROGRAMBINARYPROC, glProgramBinary) \
    X(PFNGLPROGRAMPARAMETERIPROC, glProgramParameteri) \
    X(PFNGLSHADERSOURCEPROC, glShaderSource) \
    X(PFNGLUNIFORM1FPROC, glUniform1f) \
    X(PFNGLUNIFORM1IPROC, glUniform1i) \
    X(PFNGLUNIFORM4IPROC, glUniform4i) \
    X(PFNGLUNMAPBUFFERPROC, glUnmapBuffer) \
    X(PFNGLUSEPROGRAMPROC, glUseProgram)

#define GLES_FN_FIELD(type, name) type name;
typedef struct gles_api {
    GLES_EGL_FUNCS(GLES_FN_FIELD)
    GLES_GL_FUNCS(GLES_FN_FIELD)
} gles_api;
#undef GLES_FN_FIELD

extern gles_api gles_fn;

/* Load libEGL.so.1 and libGLESv2.so.2 and resolve every entry point, once a process: FA_OK,
 * or FA_ERR_BACKEND_UNAVAILABLE naming what is missing (the same answer on every call). */
fa_status gles_load(fa_context_t ctx);

#ifndef GLES_LOADER /* loader.c fills the fields by these names */
#define eglBindAPI gles_fn.eglBindAPI
#define eglCreateContext gles_fn.eglCreateContext
#define eglDestroyContext gles_fn.eglDestroyContext
#define eglGetCurrentContext gles_fn.eglGetCurrentContext
#define eglGetCurrentDisplay gles_fn.eglGetCurrentDisplay
#define eglGetCurrentSurface gles_fn.eglGetCurrentSurface
#define eglGetError gles_fn.eglGetError
#define eglGetProcAddress gles_fn.eglGetProcAddress
#define eglInitialize gles_fn.eglInitialize
#define eglMakeCurrent gles_fn.eglMakeCurrent
#define eglQueryAPI gles_fn.eglQueryAPI
#define eglQueryString gles_fn.eglQueryString
#define glActiveTexture gles_fn.glActiveTexture
#define glAttachShader gles_fn.glAttachShader
#define glBeginQuery gles_fn.glBeginQuery
#define glBindBuffer gles_fn.glBindBuffer
#define glBindBufferBase gles_fn.glBindBufferBase
#define glBindTexture gles_fn.glBindTexture
#define glBufferData gles_fn.glBufferData
#define glBufferSubData gles_fn.glBufferSubData
#define glCompileShader gles_fn.glCompileShader
#define glCopyBufferSubData gles_fn.glCopyBufferSubData
#define glCreateProgram gles_fn.glCreateProgram
#define glCreateShader gles_fn.glCreateShader
#define glDeleteBuffers gles_fn.glDeleteBuffers
#define glDeleteProgram gles_fn.glDeleteProgram
#define glDeleteQueries gles_fn.glDeleteQueries
#define glDeleteShader gles_fn.glDeleteShader
#define glDeleteTextures gles_fn.glDeleteTextures
#define glDispatchCompute gles_fn.glDispatchCompute
#define glEndQuery gles_fn.glEndQuery
#define glFinish gles_fn.glFinish
#define glGenBuffers gles_fn.glGenBuffers
#define glGenQueries gles_fn.glGenQueries
#define glGenTextures gles_fn.glGenTextures
#define glGetBufferParameteri64v gles_fn.glGetBufferParameteri64v
#define glGetError gles_fn.glGetError
#define glGetIntegeri_v gles_fn.glGetIntegeri_v
#define glGetIntegerv gles_fn.glGetIntegerv
#define glGetProgramBinary gles_fn.glGetProgramBinary
#define glGetProgramInfoLog gles_fn.glGetProgramInfoLog
#define glGetProgramiv gles_fn.glGetProgramiv
#define glGetShaderInfoLog gles_fn.glGetShaderInfoLog
#define glGetShaderiv gles_fn.glGetShaderiv
#define glGetString gles_fn.glGetString
#define glGetStringi gles_fn.glGetStringi
#define glGetUniformLocation gles_fn.glGetUniformLocation
#define glIsBuffer gles_fn.glIsBuffer
#define glLinkProgram gles_fn.glLinkProgram
#define glMapBufferRange gles_fn.glMapBufferRange
#define glMemoryBarrier gles_fn.glMemoryBarrier
#define glProgramBinary gles_fn.glProgramBinary
#define glProgramParameteri gles_fn.glProgramParameteri
#define glShaderSource gles_fn.glShaderSource
#define glUniform1f gles_fn.glUniform1f
#define glUniform1i gles_fn.glUniform1i
#define glUniform4i gles_fn.glUniform4i
#define glUnmapBuffer gles_fn.glUnmapBuffer
#define glUseProgram gles_fn.glUseProgram
#endif

#endif
