/* SPDX-License-Identifier: MIT */
/* The runner's JSON reading (config.json, safetensors headers and indexes, tokenizer.json):
 * cJSON's parse held to the rules it leaves out. */
#ifndef FA_MODEL_JSON_H
#define FA_MODEL_JSON_H

#include "model.h"

#include <cjson/cJSON.h>
#include <stddef.h>

/* A JSON object from n bytes of text, NULL with *st and err set otherwise. Refused, each
 * naming file (part, " header" or "", follows it in messages) and the byte: text that is not
 * JSON; anything but whitespace after the value; a control character inside a string or
 * between tokens (JSON's rule: cJSON takes them); an escaped NUL (\u0000, which cJSON's C
 * strings would cut a name or a token at) or a \u escape without four hex digits (which cJSON
 * reads as one); a number JSON does not write (064, 1., -.5: cJSON's strtod reads them); a
 * key twice in one object at any depth (cJSON keeps the first, Python's json, which Hugging
 * Face's tools write and read these files with, the last); more than max_values values
 * (counted before cJSON builds its tree of about 64 bytes a value, which would make a file of
 * small values take 40 times its size; each caller bounds them by what its file can hold). */
cJSON *fa_json_object(const char *text, size_t n, size_t max_values, const char *file, const char *part,
                      fa_status *st, char *err);

#endif
