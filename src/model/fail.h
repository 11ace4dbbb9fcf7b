/* SPDX-License-Identifier: MIT */
/* The runner's error convention, shared by its files: the message into err (FA_MODEL_ERR_LEN
 * bytes; err may be NULL), the status back. */
#ifndef FA_MODEL_FAIL_H
#define FA_MODEL_FAIL_H

#include "model.h"

fa_status fa_model_fail(char *err, fa_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
