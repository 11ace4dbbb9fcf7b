/* SPDX-License-Identifier: MIT */
/* fa_json_object (json.h): cJSON's parse, then the rules it does not enforce. */
#include "json.h"

#include "fail.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The decimal digits of text from *j (< n), *j moved past them; how many. */
static size_t digits(const char *text, size_t n, size_t *j)
{
    const size_t from = *j;
    while (*j < n && text[*j] >= '0' && text[*j] <= '9')
        (*j)++;
    return *j - from;
}

/* Whether the number at text[i, n) is one JSON writes, -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?,
 * with no byte after it that could continue one (what cJSON's strtod went on to read); *len:
 * the bytes up to the first that cannot. */
static int json_number(const char *text, size_t n, size_t i, size_t *len)
{
    size_t j = i;
    if (j < n && text[j] == '-')
        j++;
    const size_t first = j, whole = digits(text, n, &j);
    int ok = whole > 0 && !(text[first] == '0' && whole > 1);
    if (j < n && text[j] == '.') {
        j++;
        ok &= digits(text, n, &j) > 0;
    }
    if (j < n && (text[j] == 'e' || text[j] == 'E')) {
        j++;
        if (j < n && (text[j] == '+' || text[j] == '-'))
            j++;
        ok &= digits(text, n, &j) > 0;
    }
    for (; j < n && text[j] != '\0' && strchr("0123456789+-.eE", text[j]); j++)
        ok = 0;
    *len = j - i;
    return ok;
}

static int is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* What cJSON takes and JSON does not, byte by byte over text[0, n) (valid JSON to cJSON): the
 * first byte that is a control character (inside a string, or between tokens where only
 * space, tab, line feed and carriage return may stand), starts an escaped NUL or a \u escape
 * without four hex digits (cJSON reads those as NUL too), or starts a number JSON does not
 * write (a leading zero, a point without digits on both sides); -1 if none. *why: 0 a
 * control character in a string, 3 one between tokens, 1 an escaped NUL, 2 a broken \u
 * escape, 4 a number. */
static long bad_byte(const char *text, size_t n, int *why)
{
    int in = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)text[i];
        if (c < 0x20 && (in || (c != '\t' && c != '\n' && c != '\r'))) {
            *why = in ? 0 : 3;
            return (long)i;
        }
        if (!in) {
            in = c == '"';
            if (c == '-' || c == '+' || c == '.' || (c >= '0' && c <= '9')) {
                size_t len;
                if (!json_number(text, n, i, &len)) {
                    *why = 4;
                    return (long)i;
                }
                i += len - 1;
            }
        } else if (c == '"') {
            in = 0;
        } else if (c == '\\') {
            if (i + 1 < n && text[i + 1] == 'u') {
                if (i + 6 > n || !is_hex(text[i + 2]) || !is_hex(text[i + 3]) || !is_hex(text[i + 4]) ||
                    !is_hex(text[i + 5])) {
                    *why = 2;
                    return (long)i;
                }
                if (memcmp(text + i + 2, "0000", 4) == 0) {
                    *why = 1;
                    return (long)i;
                }
            }
            i++; /* the escaped character, a quote or a backslash included */
        }
    }
    return -1;
}

static int cmp_key(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* A key that appears twice in one object of j (at any depth), or NULL; *oom set where the
 * sort's memory was not there. Each object's keys sorted: n log n. */
static const char *twice_in(const cJSON *j, int *oom)
{
    int n = 0;
    for (const cJSON *a = j->child; a; a = a->next)
        n++;
    if (cJSON_IsObject(j) && n > 1) {
        const char **keys = malloc(sizeof(char *) * (size_t)n);
        if (!keys) {
            *oom = 1;
            return NULL;
        }
        int k = 0;
        for (const cJSON *a = j->child; a; a = a->next)
            keys[k++] = a->string;
        qsort(keys, (size_t)n, sizeof(char *), cmp_key);
        const char *dup = NULL;
        for (int i = 1; i < n && !dup; i++)
            if (strcmp(keys[i - 1], keys[i]) == 0)
                dup = keys[i];
        free(keys);
        if (dup)
            return dup;
    }
    for (const cJSON *a = j->child; a && !*oom; a = a->next) {
        const char *in = cJSON_IsObject(a) || cJSON_IsArray(a) ? twice_in(a, oom) : NULL;
        if (in)
            return in;
    }
    return NULL;
}

/* fa_json_object's checks on text[0, n), NUL-terminated past n. */
static cJSON *checked_object(const char *text, size_t n, const char *file, const char *part, fa_status *st,
                             char *err)
{
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, n, &end, 0);
    if (!j) {
        *st = fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "'%s'%s is not valid JSON (error near byte %ld)", file,
                            part, end ? (long)(end - text) : 0l);
        return NULL;
    }
    const char *tail = end;
    for (; tail < text + n; tail++)
        if (*tail != ' ' && *tail != '\t' && *tail != '\n' && *tail != '\r') {
            *st = fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "'%s'%s has data after its JSON value (byte %ld)",
                                file, part, (long)(tail - text));
            goto bad;
        }
    int why = 0;
    const long at = bad_byte(text, (size_t)(end - text), &why);
    if (at >= 0) {
        *st = fa_model_fail(err, why == 1 ? FA_ERR_INVALID_VALUE : FA_ERR_INVALID_ARGUMENT,
                            why == 1   ? "'%s'%s escapes a NUL character (\\u0000) at byte %ld: no name, token or "
                                         "pattern may hold one"
                            : why == 2 ? "'%s'%s has a \\u escape without four hex digits at byte %ld"
                            : why == 3 ? "'%s'%s has a control character between tokens at byte %ld (JSON allows "
                                         "only space, tab and line breaks there)"
                            : why == 4 ? "'%s'%s has a number JSON does not write at byte %ld (a leading zero, or a "
                                         "point without digits on both sides)"
                                       : "'%s'%s has a control character inside a string at byte %ld (JSON escapes "
                                         "them)",
                            file, part, at);
        goto bad;
    }
    if (!cJSON_IsObject(j)) {
        *st = fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "'%s'%s is not a JSON object", file, part);
        goto bad;
    }
    int oom = 0;
    const char *twice = twice_in(j, &oom);
    if (twice || oom) {
        *st = oom ? fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory for '%s'%s's keys", file, part)
                  : fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "'%s'%s: key '%.80s' appears twice in one object",
                                  file, part, twice);
        goto bad;
    }
    *st = FA_OK;
    return j;
bad:
    cJSON_Delete(j);
    return NULL;
}

/* An upper bound of the values in text[0, n): one, and one more at each '[', '{' or ',' outside
 * strings. */
static size_t count_values(const char *text, size_t n)
{
    size_t v = 1;
    int in_string = 0;
    for (size_t i = 0; i < n; i++) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_string = 0;
        } else if (c == '"') {
            in_string = 1;
        } else if (c == '[' || c == '{' || c == ',') {
            v++;
        }
    }
    return v;
}

/* cJSON parses a NUL-terminated copy: releases before 1.7.18 read a byte past the length
 * given on text cut after a comma, and a safetensors header lies in the mapped file. */
cJSON *fa_json_object(const char *text, size_t n, size_t max_values, const char *file, const char *part,
                      fa_status *st, char *err)
{
    const size_t values = count_values(text, n);
    if (values > max_values) {
        *st = fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                            "'%s'%s holds about %zu JSON values; what it describes needs at most %zu", file, part,
                            values, max_values);
        return NULL;
    }
    char *copy = n < SIZE_MAX ? malloc(n + 1) : NULL;
    if (!copy) {
        *st = fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory for a copy of '%s'%s (%zu bytes)", file,
                            part, n);
        return NULL;
    }
    memcpy(copy, text, n);
    copy[n] = '\0';
    cJSON *j = checked_object(copy, n, file, part, st, err);
    free(copy);
    return j;
}
