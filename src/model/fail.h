/* SPDX-License-Identifier: MIT */
/* What the runner's files share: the error convention (the message into err, FA_MODEL_ERR_LEN
 * bytes; err may be NULL; the status back) and opening the files it reads. */
#ifndef FA_MODEL_FAIL_H
#define FA_MODEL_FAIL_H

#include "model.h"

fa_status fa_model_fail(char *err, fa_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Open path read-only as a regular file: *fd and its size in *bytes. Never blocks: a FIFO or a
 * device is opened without waiting and refused, as is a directory, with a message naming what
 * ("checkpoint", "tokenizer") and path. */
fa_status fa_model_open_file(const char *path, const char *what, int *fd, uint64_t *bytes, char *err);

/* The error of a write to path that failed with errno e (0: EIO), naming path and the
 * system's reason: FA_ERR_IO where the machine failed (a full disk, a failing device),
 * FA_ERR_OUT_OF_MEMORY, else FA_ERR_INVALID_ARGUMENT (the place: no permission, a read-only
 * file system). */
fa_status fa_model_write_failed(char *err, const char *path, int e);

/* The whole of that file (at most max bytes, else too_big naming it) in a malloc'd buffer with
 * a NUL after its *n bytes; *buf NULL on error. */
fa_status fa_model_read_file(const char *path, const char *what, uint64_t max, fa_status too_big,
                             unsigned char **buf, size_t *n, char *err);

#endif
