/* SPDX-License-Identifier: MIT */
#include "tok_json.h"

#include <cjson/cJSON.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

char *tok_json_with(const char *base, const char *path, const char *value)
{
    cJSON *j = cJSON_Parse(base), *o = j;
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", path);
    char *last = buf, *dot;
    while ((dot = strchr(last, '.'))) {
        *dot = 0;
        o = cJSON_IsArray(o) ? cJSON_GetArrayItem(o, atoi(last)) : cJSON_GetObjectItemCaseSensitive(o, last);
        assert_non_null(o);
        last = dot + 1;
    }
    cJSON *v = value ? cJSON_Parse(value) : NULL;
    assert_true(!value || v);
    if (cJSON_IsArray(o)) {
        assert_non_null(v);
        cJSON_ReplaceItemInArray(o, atoi(last), v);
    } else {
        cJSON_DeleteItemFromObjectCaseSensitive(o, last);
        if (v)
            cJSON_AddItemToObject(o, last, v);
    }
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return s;
}

void tok_json_expect_refused(const char *text, int32_t vocab, fa_status want, const char *a, const char *b)
{
    fa_tokenizer *t = (fa_tokenizer *)0x1;
    char err[FA_MODEL_ERR_LEN] = "";
    fa_status st = fa_tokenizer_from_json("bad.json", text, strlen(text), vocab, &t, err);
    if (st != want || !strstr(err, a) || (b && !strstr(err, b)))
        fail_msg("want %s naming '%s' and '%s', got %s: %s", fa_status_string(want), a, b ? b : "",
                 fa_status_string(st), err);
    assert_null(t);
}
