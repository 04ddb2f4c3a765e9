/* What a jansson value is, in words, for the messages of every parser of
 * outside JSON (the config, adapter_config.json, ...): one wording. */
#ifndef ZN_UTIL_JSON_IMPL_H
#define ZN_UTIL_JSON_IMPL_H

#include <jansson.h>

static inline const char *zn_json_kind(const json_t *v)
{
    if (!v)
        return "nothing (the key is missing)";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

#endif
