/* ojs_codec._speedups: the codec's hot path in C.
 *
 * Every public function here mirrors a pure-Python function (named in its comment) and
 * must give the same bytes, the same values and the same exceptions (type and message);
 * tests/codec runs the differential, round-trip, error and fuzz tests against both.
 *
 * Exact builtin types are handled natively.  Anything else goes back to the pure-Python
 * code, in one of two ways:
 *
 * - "bail out": the whole call is handed to the pure-Python function.  This is done
 *   only before anything observable has happened (the C code has no caches or other
 *   side effects a re-run could notice), so the result is exactly Python's.  A C
 *   function raises by itself only where every input it has looked at so far is of a
 *   native type, at the point where Python raises the same error.
 * - one value: a field-table value of a rare type (Decimal, the typed wrappers,
 *   subclasses, other mappings...) is encoded by _table._encode_value, the helper the
 *   pure-Python encoder calls at that point.
 *
 * Single-phase module init; all state is static and protected by the GIL.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <structmember.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* --- the Python side, looked up at import -------------------------------------------- */

static PyObject *UsageError;             /* ojs_codec._errors.UsageError */
static PyObject *py_syntax;              /* ojs_codec._table._syntax(message) -> ProtocolSyntaxError */
static PyObject *BasicProperties;        /* ojs_codec._properties.BasicProperties */
static PyObject *EMPTY_PROPERTIES;       /* ojs_codec._properties.EMPTY_PROPERTIES */
static PyObject *py_octet;               /* ojs_codec._properties._octet(value, what) */
static PyObject *py_short_cache_get;     /* ojs_codec._properties._short_cache_get(value) */
static PyObject *py_cached_short_string; /* ojs_codec._properties.cached_short_string(value, what) */
static PyObject *py_encode_short_string; /* ojs_codec._properties.encode_short_string(value, what) */
static PyObject *py_encode_value;        /* ojs_codec._table._encode_value(out, value, depth) */
static PyObject *Int32_type;             /* ojs_codec._table.Int32 (x-ojs-attempt and the like) */
static PyObject *str_value;              /* "value" */
static PyObject *py_encode_table_into;   /* ojs_codec._table.encode_table_into(out, table, depth) */
static PyObject *py_timestamp_seconds;   /* ojs_codec._table.timestamp_seconds(value) */
static PyObject *py_decode_timestamp;    /* ojs_codec._table.decode_timestamp(seconds) */
static PyObject *py_t_len_pack;          /* ojs_codec._table._T_LEN.pack(code, size) */
static PyObject *Mapping;                /* collections.abc.Mapping */
static PyObject *Decimal;                /* decimal.Decimal */
static PyObject *dec_context;            /* ojs_codec._table._DEC_CONTEXT */
static PyObject *str_scaleb;             /* "scaleb" */
static long MAX_DEPTH;                   /* ojs_codec._table.MAX_DEPTH */
static PyObject *NESTED_TOO_DEEP;        /* ojs_codec._table.NESTED_TOO_DEEP */
static PyObject *py_lenient_timestamp;   /* ojs_codec._table.lenient_timestamp(seconds, notes) */
static PyObject *py_malformed_reason;    /* ojs_codec._table.malformed_reason(notes) */

/* BasicProperties: its 14 fields in wire (flag) order; field i has flag 0x8000 >> i. */
#define N_FIELDS 14
static const char *const FIELD_NAMES[N_FIELDS] = {
    "content_type", "content_encoding", "headers", "delivery_mode", "priority",
    "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
    "type", "user_id", "app_id", "cluster_id",
};
enum {
    F_CONTENT_TYPE, F_CONTENT_ENCODING, F_HEADERS, F_DELIVERY_MODE, F_PRIORITY,
    F_CORRELATION_ID, F_REPLY_TO, F_EXPIRATION, F_MESSAGE_ID, F_TIMESTAMP,
    F_TYPE, F_USER_ID, F_APP_ID, F_CLUSTER_ID,
};
static PyObject *field_names[N_FIELDS];    /* the interned names from __struct_fields__ */
static Py_ssize_t field_offsets[N_FIELDS]; /* slot offsets of the fields in an instance */
/* keyword-name tuples for constructing BasicProperties, by present-field flags >> 2 */
static PyObject *kwnames_by_flags[1 << N_FIELDS];

/* --- pure-Python fallbacks ------------------------------------------------------------ */

typedef struct {
    const char *module;
    const char *name;
    PyObject *func; /* looked up on first use: ojs_codec._fast imports this module */
} Pure;

static Pure PURE_ENCODE_PUBLISH = {"ojs_codec._fast", "encode_publish", NULL};
static Pure PURE_DECODE_DELIVER = {"ojs_codec._fast", "decode_deliver", NULL};
static Pure PURE_DECODE_RETURN = {"ojs_codec._fast", "decode_return", NULL};
static Pure PURE_DECODE_GET_OK = {"ojs_codec._fast", "decode_get_ok", NULL};
static Pure PURE_DECODE_ACK = {"ojs_codec._fast", "decode_ack", NULL};
static Pure PURE_DECODE_NACK = {"ojs_codec._fast", "decode_nack", NULL};
static Pure PURE_DECODE_REJECT = {"ojs_codec._fast", "decode_reject", NULL};
static Pure PURE_DECODE_CONTENT_HEADER = {"ojs_codec._fast", "decode_content_header", NULL};
static Pure PURE_DECODE_CONTENT_HEADER_LENIENT = {"ojs_codec._fast", "decode_content_header_lenient", NULL};
static Pure PURE_ENCODE_PROPERTIES = {"ojs_codec._properties", "encode_properties", NULL};
static Pure PURE_DECODE_PROPERTIES = {"ojs_codec._properties", "decode_properties", NULL};
static Pure PURE_ENCODE_TABLE = {"ojs_codec._table", "encode_table", NULL};
static Pure PURE_ENCODE_ARRAY = {"ojs_codec._table", "encode_array", NULL};
static Pure PURE_DECODE_TABLE = {"ojs_codec._table", "decode_table", NULL};
static Pure PURE_DECODE_ARRAY = {"ojs_codec._table", "decode_array", NULL};

/* Hand the call to the pure-Python function. */
static PyObject *
bail(Pure *pure, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (pure->func == NULL) {
        PyObject *module = PyImport_ImportModule(pure->module);
        if (module == NULL) {
            return NULL;
        }
        PyObject *func = PyObject_GetAttrString(module, pure->name);
        Py_DECREF(module);
        if (func == NULL) {
            return NULL;
        }
        if (pure->func == NULL) { /* the import may have let another thread set it */
            pure->func = func;
        }
        else {
            Py_DECREF(func);
        }
    }
    return PyObject_Vectorcall(pure->func, args, (size_t)nargs, kwnames);
}

/* Map vectorcall arguments onto the parameters `names` (the first `required` of them
 * without a default).  Returns 0 if they do not fit (too many, unknown or repeated
 * names, a required one missing): the caller bails out and Python raises its TypeError. */
static int
bind(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *const *names,
     Py_ssize_t n, Py_ssize_t required, PyObject **out)
{
    if (nargs > n) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = i < nargs ? args[i] : NULL;
    }
    if (kwnames != NULL) {
        Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t k = 0; k < nkw; k++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, k);
            Py_ssize_t j = 0;
            while (j < n && PyUnicode_CompareWithASCIIString(name, names[j]) != 0) {
                j++;
            }
            if (j == n || out[j] != NULL) {
                return 0;
            }
            out[j] = args[nargs + k];
        }
    }
    for (Py_ssize_t i = 0; i < required; i++) {
        if (out[i] == NULL) {
            return 0;
        }
    }
    return 1;
}

/* --- errors ------------------------------------------------------------------------- */

/* Raise ProtocolSyntaxError(message, remote=False), built by the Python helper. */
static PyObject *
syntax(const char *format, ...)
{
    va_list va;
    va_start(va, format);
    PyObject *message = PyUnicode_FromFormatV(format, va);
    va_end(va);
    if (message == NULL) {
        return NULL;
    }
    PyObject *exc = PyObject_CallOneArg(py_syntax, message);
    Py_DECREF(message);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* Raise UsageError(message); returns -1. */
static int
usage(const char *format, ...)
{
    va_list va;
    va_start(va, format);
    PyObject *message = PyUnicode_FromFormatV(format, va);
    va_end(va);
    if (message != NULL) {
        PyErr_SetObject(UsageError, message);
        Py_DECREF(message);
    }
    return -1;
}

/* Replace the exception being raised by UsageError(prefix + str(exc)), as Python's
 * ``raise UsageError(f"...{exc}") from None`` does.  `key`, if given, is formatted
 * into `format` (with %R) before the exception (with %S). */
static void
rewrap_usage(const char *format, PyObject *key)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    PyObject *message = key != NULL ? PyUnicode_FromFormat(format, key, value)
                                    : PyUnicode_FromFormat(format, value);
    if (message != NULL) {
        PyObject *exc = PyObject_CallOneArg(UsageError, message);
        Py_DECREF(message);
        if (exc != NULL) {
            PyException_SetCause(exc, NULL); /* also sets __suppress_context__ */
            PyException_SetContext(exc, value);
            value = NULL;
            PyErr_SetObject(UsageError, exc);
            Py_DECREF(exc);
        }
    }
    Py_XDECREF(value);
}

static int
usage_depth(void)
{
    return usage("field tables and arrays nest deeper than %ld levels", MAX_DEPTH);
}

/* type(value).__name__, as the pure-Python messages show it. */
static PyObject *
type_name(PyObject *value)
{
    return PyType_GetName(Py_TYPE(value));
}

/* --- big-endian integers -------------------------------------------------------------- */

static inline uint16_t
rd16(const unsigned char *p)
{
    return (uint16_t)((p[0] << 8) | p[1]);
}

static inline uint32_t
rd32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint64_t
rd64(const unsigned char *p)
{
    return ((uint64_t)rd32(p) << 32) | rd32(p + 4);
}

static inline void
wr16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
}

static inline void
wr32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static inline void
wr64(unsigned char *p, uint64_t v)
{
    wr32(p, (uint32_t)(v >> 32));
    wr32(p + 4, (uint32_t)v);
}

/* --- an output buffer ----------------------------------------------------------------- */

typedef struct {
    unsigned char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
    unsigned char small[1024]; /* enough for typical content properties */
} Buf;

static void
buf_init(Buf *b)
{
    b->data = b->small;
    b->len = 0;
    b->cap = (Py_ssize_t)sizeof(b->small);
}

static void
buf_free(Buf *b)
{
    if (b->data != b->small) {
        PyMem_Free(b->data);
    }
}

/* Make room for `extra` more bytes; returns a pointer to where they go, or NULL. */
static unsigned char *
buf_grow(Buf *b, Py_ssize_t extra)
{
    if (b->cap - b->len < extra) {
        if (extra > PY_SSIZE_T_MAX / 2 - b->len) {
            PyErr_NoMemory();
            return NULL;
        }
        Py_ssize_t cap = b->cap * 2 > b->len + extra ? b->cap * 2 : b->len + extra;
        unsigned char *data;
        if (b->data == b->small) {
            data = PyMem_Malloc((size_t)cap);
            if (data != NULL) {
                memcpy(data, b->small, (size_t)b->len);
            }
        }
        else {
            data = PyMem_Realloc(b->data, (size_t)cap);
        }
        if (data == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        b->data = data;
        b->cap = cap;
    }
    unsigned char *at = b->data + b->len;
    b->len += extra;
    return at;
}

static int
put(Buf *b, const void *src, Py_ssize_t n)
{
    unsigned char *at = buf_grow(b, n);
    if (at == NULL) {
        return -1;
    }
    memcpy(at, src, (size_t)n);
    return 0;
}

static int
put_u8(Buf *b, unsigned int v)
{
    unsigned char *at = buf_grow(b, 1);
    if (at == NULL) {
        return -1;
    }
    *at = (unsigned char)v;
    return 0;
}

/* A type octet and a 32-bit length. */
static int
put_code_u32(Buf *b, unsigned char code, uint32_t v)
{
    unsigned char *at = buf_grow(b, 5);
    if (at == NULL) {
        return -1;
    }
    at[0] = code;
    wr32(at + 1, v);
    return 0;
}

/* A type octet and a 64-bit value. */
static int
put_code_u64(Buf *b, unsigned char code, uint64_t v)
{
    unsigned char *at = buf_grow(b, 9);
    if (at == NULL) {
        return -1;
    }
    at[0] = code;
    wr64(at + 1, v);
    return 0;
}

/* Append the bytes of a bytes or bytearray object (as returned by the Python helpers). */
static int
put_object(Buf *b, PyObject *obj)
{
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0) {
        return -1;
    }
    int rc = put(b, view.buf, view.len);
    PyBuffer_Release(&view);
    return rc;
}

/* Call func(out, value, depth) with a fresh bytearray ``out`` and append what it wrote. */
static int
put_from_python(Buf *b, PyObject *func, PyObject *value, long depth)
{
    PyObject *out = PyByteArray_FromStringAndSize(NULL, 0);
    if (out == NULL) {
        return -1;
    }
    PyObject *depth_obj = PyLong_FromLong(depth);
    if (depth_obj == NULL) {
        Py_DECREF(out);
        return -1;
    }
    PyObject *result = PyObject_CallFunctionObjArgs(func, out, value, depth_obj, NULL);
    Py_DECREF(depth_obj);
    int rc = -1;
    if (result != NULL) {
        Py_DECREF(result);
        rc = put(b, PyByteArray_AS_STRING(out), PyByteArray_GET_SIZE(out));
    }
    Py_DECREF(out);
    return rc;
}

/* --- encoding ------------------------------------------------------------------------- */

/* The UTF-8 bytes of an exact str: the str's own data when it is ASCII, else a new bytes
 * object left in *keep (the caller releases it).  Raises UnicodeEncodeError as
 * ``str.encode("utf-8")`` does. */
static const char *
utf8_of(PyObject *s, Py_ssize_t *size, PyObject **keep)
{
    *keep = NULL;
#if PY_VERSION_HEX < 0x030C0000 /* from 3.12 every str is ready */
    if (PyUnicode_READY(s) < 0) {
        return NULL;
    }
#endif
    if (PyUnicode_IS_ASCII(s)) {
        *size = PyUnicode_GET_LENGTH(s);
        return (const char *)PyUnicode_1BYTE_DATA(s);
    }
    PyObject *raw = PyUnicode_AsUTF8String(s);
    if (raw == NULL) {
        return NULL;
    }
    *keep = raw;
    *size = PyBytes_GET_SIZE(raw);
    return PyBytes_AS_STRING(raw);
}

/* A short string (length octet + UTF-8) from an exact str: encode_short_string(). */
static int
put_short_str(Buf *b, PyObject *s, const char *what)
{
    Py_ssize_t size;
    PyObject *keep;
    const char *raw = utf8_of(s, &size, &keep);
    if (raw == NULL) {
        return -1;
    }
    int rc;
    if (size > 255) {
        rc = usage("%s is %zd bytes of UTF-8; an AMQP short string holds at most 255 bytes", what,
                   size);
    }
    else {
        rc = put_u8(b, (unsigned int)size) < 0 ? -1 : put(b, raw, size);
    }
    Py_XDECREF(keep);
    return rc;
}

/* Seconds since the epoch of an exact datetime that is naive or in datetime.UTC, for
 * years 1970..2399: there int(value.timestamp()), which the pure-Python code computes
 * through a float, is exactly the floor (a float near 2**34 still resolves 1e-6 s).
 * Returns -1 for any other datetime, which goes to the Python helper. */
static int64_t
native_timestamp(PyObject *value)
{
    PyObject *tz = PyDateTime_DATE_GET_TZINFO(value);
    if (tz != Py_None && tz != PyDateTime_TimeZone_UTC) {
        return -1;
    }
    int year = PyDateTime_GET_YEAR(value);
    if (year < 1970 || year >= 2400) {
        return -1;
    }
    static const int days_before_month[13] = {0, 0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334};
    int month = PyDateTime_GET_MONTH(value);
    int64_t y = year - 1;
    int leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    /* days from 0001-01-01 to this date, less those to 1970-01-01 (719162) */
    int64_t days = y * 365 + y / 4 - y / 100 + y / 400 + days_before_month[month] +
                   (month > 2 && leap) + PyDateTime_GET_DAY(value) - 1 - 719162;
    return days * 86400 + PyDateTime_DATE_GET_HOUR(value) * 3600 +
           PyDateTime_DATE_GET_MINUTE(value) * 60 + PyDateTime_DATE_GET_SECOND(value);
}

static int enc_value(Buf *b, PyObject *value, long depth);

/* _table._encode_int: pamqp's choice, the smallest of b, s, u, I, i, l. */
static int
enc_int(Buf *b, PyObject *value)
{
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow) {
        return usage("integer %S does not fit a signed 64-bit field", value);
    }
    unsigned char *at;
    if (v >= -128 && v <= 127) {
        if ((at = buf_grow(b, 2)) == NULL) {
            return -1;
        }
        at[0] = 'b';
        at[1] = (unsigned char)(int8_t)v;
    }
    else if (v >= -32768 && v <= 32767) {
        if ((at = buf_grow(b, 3)) == NULL) {
            return -1;
        }
        at[0] = 's';
        wr16(at + 1, (uint16_t)(int16_t)v);
    }
    else if (v >= 0 && v <= 65535) {
        if ((at = buf_grow(b, 3)) == NULL) {
            return -1;
        }
        at[0] = 'u';
        wr16(at + 1, (uint16_t)v);
    }
    else if (v >= -2147483648LL && v <= 2147483647LL) {
        return put_code_u32(b, 'I', (uint32_t)(int32_t)v);
    }
    else if (v >= 0 && v <= 4294967295LL) {
        return put_code_u32(b, 'i', (uint32_t)v);
    }
    else {
        return put_code_u64(b, 'l', (uint64_t)v);
    }
    return 0;
}

/* One entry of a table being encoded: strong references, the key's UTF-8. */
typedef struct {
    PyObject *key;
    PyObject *value;
    const char *raw;
    Py_ssize_t size;
    PyObject *keep;
} Entry;

static int
entry_cmp(const void *a, const void *b)
{
    /* exact str keys: code point order, as sorted() gives; cannot fail */
    return PyUnicode_Compare(((const Entry *)a)->key, ((const Entry *)b)->key);
}

static void
sort_entries(Entry *e, Py_ssize_t n)
{
    if (n > 16) {
        qsort(e, (size_t)n, sizeof(Entry), entry_cmp);
        return;
    }
    for (Py_ssize_t i = 1; i < n; i++) { /* insertion sort: headers are small */
        Entry item = e[i];
        Py_ssize_t j = i;
        while (j > 0 && PyUnicode_Compare(e[j - 1].key, item.key) > 0) {
            e[j] = e[j - 1];
            j--;
        }
        e[j] = item;
    }
}

/* _table.encode_table_into for an exact dict: length prefix, then the entries in
 * pamqp's (sorted) key order. */
static int
enc_table(Buf *b, PyObject *table, long depth)
{
    if (depth > MAX_DEPTH) {
        return usage_depth();
    }
    Py_ssize_t start = b->len;
    if (buf_grow(b, 4) == NULL) {
        return -1;
    }
    Py_ssize_t n = PyDict_GET_SIZE(table);
    if (n == 0) {
        wr32(b->data + start, 0);
        return 0;
    }
    Entry small[16];
    Entry *entries = small;
    if (n > 16) {
        entries = PyMem_Malloc((size_t)n * sizeof(Entry));
        if (entries == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    Py_ssize_t count = 0, pos = 0;
    PyObject *key, *value;
    int plain_keys = 1;
    while (count < n && PyDict_Next(table, &pos, &key, &value)) {
        plain_keys &= PyUnicode_CheckExact(key);
        entries[count].key = Py_NewRef(key);
        entries[count].value = Py_NewRef(value);
        entries[count].keep = NULL;
        count++;
    }
    int rc = -1;
    Py_ssize_t i;
    if (!plain_keys) {
        /* a key that is not an exact str: the Python encoder sorts out what it means */
        b->len = start;
        rc = put_from_python(b, py_encode_table_into, table, depth);
        goto done;
    }
    sort_entries(entries, count);
    /* Every key is checked before any value is encoded, as _table_template() does. */
    for (i = 0; i < count; i++) {
        entries[i].raw = utf8_of(entries[i].key, &entries[i].size, &entries[i].keep);
        if (entries[i].raw == NULL) {
            goto done;
        }
        if (entries[i].size > 255) {
            PyObject *head = PyUnicode_Substring(entries[i].key, 0, 40);
            if (head != NULL) {
                usage("table key %R... is %zd bytes; the maximum is 255", head, entries[i].size);
                Py_DECREF(head);
            }
            goto done;
        }
    }
    for (i = 0; i < count; i++) {
        Entry *e = &entries[i];
        if (put_u8(b, (unsigned int)e->size) < 0 || put(b, e->raw, e->size) < 0) {
            goto done;
        }
        value = e->value;
        /* The same two inline cases as encode_table_into (their errors are not
         * prefixed with the key), then everything through _encode_value. */
        if (PyUnicode_CheckExact(value)) {
            Py_ssize_t size;
            PyObject *keep;
            const char *raw = utf8_of(value, &size, &keep);
            if (raw == NULL) {
                goto done;
            }
            int bad;
            if ((uint64_t)size > 0xFFFFFFFFu) {
                /* struct.error, as _T_LEN.pack raises it in the pure-Python code */
                PyObject *r = PyObject_CallFunction(py_t_len_pack, "in", 0x53, size);
                Py_XDECREF(r);
                bad = 1;
            }
            else {
                bad = put_code_u32(b, 'S', (uint32_t)size) < 0 || put(b, raw, size) < 0;
            }
            Py_XDECREF(keep);
            if (bad) {
                goto done;
            }
            continue;
        }
        if (PyLong_CheckExact(value)) {
            int overflow;
            long v = PyLong_AsLongAndOverflow(value, &overflow);
            if (!overflow && v >= -128 && v <= 127) {
                unsigned char *at = buf_grow(b, 2);
                if (at == NULL) {
                    goto done;
                }
                at[0] = 'b';
                at[1] = (unsigned char)(int8_t)v;
                continue;
            }
        }
        if (enc_value(b, value, depth) < 0) {
            if (PyErr_ExceptionMatches(UsageError)) {
                rewrap_usage("table key %R: %S", e->key);
            }
            goto done;
        }
    }
    Py_ssize_t size = b->len - start - 4;
    if ((uint64_t)size > 0xFFFFFFFFu) {
        usage("a field table is at most 4 GiB");
        goto done;
    }
    wr32(b->data + start, (uint32_t)size);
    rc = 0;
done:
    for (i = 0; i < count; i++) {
        Py_DECREF(entries[i].key);
        Py_DECREF(entries[i].value);
        Py_XDECREF(entries[i].keep);
    }
    if (entries != small) {
        PyMem_Free(entries);
    }
    return rc;
}

/* _table._encode_array_into for an exact list or tuple. */
static int
enc_array(Buf *b, PyObject *seq, long depth)
{
    if (depth > MAX_DEPTH) {
        return usage_depth();
    }
    Py_ssize_t start = b->len;
    if (buf_grow(b, 4) == NULL) {
        return -1;
    }
    /* the length is read again each time, as a list iterator does */
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *item = Py_NewRef(PySequence_Fast_GET_ITEM(seq, i));
        int rc = enc_value(b, item, depth);
        Py_DECREF(item);
        if (rc < 0) {
            return -1;
        }
    }
    Py_ssize_t size = b->len - start - 4;
    if ((uint64_t)size > 0xFFFFFFFFu) {
        return usage("a field array is at most 4 GiB");
    }
    wr32(b->data + start, (uint32_t)size);
    return 0;
}

/* _table._encode_value: one typed field value.  Exact builtin types are native (their
 * isinstance() checks in _encode_value cannot overlap); the rest goes to Python. */
static int
enc_value(Buf *b, PyObject *value, long depth)
{
    PyTypeObject *type = Py_TYPE(value);
    if (type == &PyBool_Type) {
        unsigned char *at = buf_grow(b, 2);
        if (at == NULL) {
            return -1;
        }
        at[0] = 't';
        at[1] = value == Py_True;
        return 0;
    }
    if (type == &PyLong_Type) {
        return enc_int(b, value);
    }
    if (type == &PyFloat_Type) {
        unsigned char *at = buf_grow(b, 9);
        if (at == NULL) {
            return -1;
        }
        at[0] = 'd';
        return PyFloat_Pack8(PyFloat_AS_DOUBLE(value), (char *)at + 1, 0);
    }
    if (type == &PyUnicode_Type) {
        Py_ssize_t size;
        PyObject *keep;
        const char *raw = utf8_of(value, &size, &keep);
        if (raw == NULL) {
            return -1;
        }
        int rc;
        if ((uint64_t)size > 0xFFFFFFFFu) {
            rc = usage("a long string is at most 4 GiB");
        }
        else {
            rc = put_code_u32(b, 'S', (uint32_t)size) < 0 ? -1 : put(b, raw, size);
        }
        Py_XDECREF(keep);
        return rc;
    }
    if (PyDateTime_CheckExact(value)) {
        int64_t seconds = native_timestamp(value);
        if (seconds >= 0) {
            return put_code_u64(b, 'T', (uint64_t)seconds);
        }
    }
    else if (type == &PyDict_Type) {
        return put_u8(b, 'F') < 0 ? -1 : enc_table(b, value, depth + 1);
    }
    else if (type == &PyList_Type || type == &PyTuple_Type) {
        return put_u8(b, 'A') < 0 ? -1 : enc_array(b, value, depth + 1);
    }
    else if (type == &PyBytes_Type || type == &PyByteArray_Type) {
        Py_ssize_t size = type == &PyBytes_Type ? PyBytes_GET_SIZE(value) : PyByteArray_GET_SIZE(value);
        if ((uint64_t)size > 0xFFFFFFFFu) {
            return usage("a byte array is at most 4 GiB");
        }
        const char *raw = type == &PyBytes_Type ? PyBytes_AS_STRING(value) : PyByteArray_AS_STRING(value);
        return put_code_u32(b, 'x', (uint32_t)size) < 0 ? -1 : put(b, raw, size);
    }
    else if (value == Py_None) {
        return put_u8(b, 'V');
    }
    else if ((PyObject *)type == Int32_type) {
        /* Int32 checked its range when it was built: its value fits. */
        PyObject *v = PyObject_GetAttr(value, str_value);
        if (v == NULL) {
            return -1;
        }
        long n = PyLong_AsLong(v);
        Py_DECREF(v);
        if (n == -1 && PyErr_Occurred()) {
            return -1;
        }
        return put_code_u32(b, 'I', (uint32_t)(int32_t)n);
    }
    return put_from_python(b, py_encode_value, value, depth);
}

/* One field of a BasicProperties instance (borrowed), or NULL with an exception. */
static PyObject *
field(PyObject *props, int i)
{
    PyObject *value = *(PyObject **)((char *)props + field_offsets[i]);
    if (value == NULL) { /* an unset slot: let getattr raise its AttributeError */
        PyObject *attr = PyObject_GetAttr(props, field_names[i]);
        Py_XDECREF(attr);
        return NULL;
    }
    return value;
}

/* A short-string property.  Python: ``if v: out += get(v) or cached_short_string(v,
 * what)`` (``encode_short_string(v, what)`` when not `cached`). */
static int
enc_short_property(Buf *b, PyObject *value, int i, int cached, unsigned int *flags)
{
    if (value == Py_None) {
        return 0;
    }
    const char *what = FIELD_NAMES[i];
    if (PyUnicode_CheckExact(value)) {
        if (PyUnicode_GET_LENGTH(value) == 0) {
            return 0;
        }
        *flags |= 0x8000u >> i;
        return put_short_str(b, value, what);
    }
    int truth = PyObject_IsTrue(value);
    if (truth <= 0) {
        return truth;
    }
    *flags |= 0x8000u >> i;
    PyObject *encoded = NULL;
    if (cached) {
        encoded = PyObject_CallOneArg(py_short_cache_get, value);
        if (encoded == NULL) {
            return -1;
        }
        truth = PyObject_IsTrue(encoded);
        if (truth < 0) {
            Py_DECREF(encoded);
            return -1;
        }
        if (truth) {
            int rc = put_object(b, encoded);
            Py_DECREF(encoded);
            return rc;
        }
        Py_DECREF(encoded);
    }
    PyObject *what_obj = PyUnicode_FromString(what);
    if (what_obj == NULL) {
        return -1;
    }
    encoded = PyObject_CallFunctionObjArgs(cached ? py_cached_short_string : py_encode_short_string,
                                           value, what_obj, NULL);
    Py_DECREF(what_obj);
    if (encoded == NULL) {
        return -1;
    }
    int rc = put_object(b, encoded);
    Py_DECREF(encoded);
    return rc;
}

/* delivery_mode or priority: _properties._octet(). */
static int
enc_octet_property(Buf *b, PyObject *value, int i, unsigned int *flags)
{
    if (value == Py_None) {
        return 0;
    }
    *flags |= 0x8000u >> i;
    if (PyLong_CheckExact(value) || PyBool_Check(value)) {
        int overflow;
        long v = PyLong_AsLongAndOverflow(value, &overflow);
        if (!overflow && v >= 0 && v <= 255) {
            return put_u8(b, (unsigned int)v);
        }
        return usage("%s must be an int from 0 to 255, got %R", FIELD_NAMES[i], value);
    }
    PyObject *encoded = PyObject_CallFunction(py_octet, "Os", value, FIELD_NAMES[i]);
    if (encoded == NULL) {
        return -1;
    }
    int rc = put_object(b, encoded);
    Py_DECREF(encoded);
    return rc;
}

/* headers: an exact dict natively; another mapping through encode_table_into. */
static int
enc_headers(Buf *b, PyObject *value, unsigned int *flags)
{
    if (value == Py_None) {
        return 0;
    }
    *flags |= 0x8000u >> F_HEADERS;
    if (PyDict_CheckExact(value)) {
        return enc_table(b, value, 1);
    }
    int is_mapping = PyObject_IsInstance(value, Mapping);
    if (is_mapping < 0) {
        return -1;
    }
    if (!is_mapping) {
        PyObject *name = type_name(value);
        if (name != NULL) {
            usage("headers must be a mapping, not %U", name);
            Py_DECREF(name);
        }
        return -1;
    }
    return put_from_python(b, py_encode_table_into, value, 1);
}

/* timestamp: 64-bit seconds; datetimes the C code does not compute go to
 * _table.timestamp_seconds(). */
static int
enc_timestamp(Buf *b, PyObject *value, unsigned int *flags)
{
    if (value == Py_None) {
        return 0;
    }
    *flags |= 0x8000u >> F_TIMESTAMP;
    int64_t seconds = PyDateTime_CheckExact(value) ? native_timestamp(value) : -1;
    uint64_t wire;
    if (seconds >= 0) {
        wire = (uint64_t)seconds;
    }
    else {
        PyObject *r = PyObject_CallOneArg(py_timestamp_seconds, value);
        if (r == NULL) {
            return -1;
        }
        wire = PyLong_AsUnsignedLongLong(r);
        Py_DECREF(r);
        if (wire == (uint64_t)-1 && PyErr_Occurred()) {
            return -1;
        }
    }
    unsigned char *at = buf_grow(b, 8);
    if (at == NULL) {
        return -1;
    }
    wr64(at, wire);
    return 0;
}

/* _properties._encode_properties_into for an exact BasicProperties. */
static int
enc_properties(Buf *b, PyObject *props)
{
    Py_ssize_t start = b->len;
    if (buf_grow(b, 2) == NULL) {
        return -1;
    }
    unsigned int flags = 0;
    for (int i = 0; i < N_FIELDS; i++) {
        PyObject *v = field(props, i);
        if (v == NULL) {
            return -1;
        }
        int rc;
        switch (i) {
        case F_CORRELATION_ID:
        case F_MESSAGE_ID:
            rc = enc_short_property(b, v, i, 0, &flags);
            break;
        case F_HEADERS:
            rc = enc_headers(b, v, &flags);
            break;
        case F_DELIVERY_MODE:
        case F_PRIORITY:
            rc = enc_octet_property(b, v, i, &flags);
            break;
        case F_TIMESTAMP:
            rc = enc_timestamp(b, v, &flags);
            break;
        default:
            rc = enc_short_property(b, v, i, 1, &flags);
            break;
        }
        if (rc < 0) {
            return -1;
        }
    }
    wr16(b->data + start, (uint16_t)flags);
    return 0;
}

/* Encode properties (flags + fields) into `b`; a TypeError becomes
 * UsageError("invalid message property: ..."), as encode_properties_into() does. */
static int
enc_properties_checked(Buf *b, PyObject *props)
{
    if (enc_properties(b, props) < 0) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            rewrap_usage("invalid message property: %S", NULL);
        }
        return -1;
    }
    return 0;
}

/* The UTF-8 of `value` for a short string argument, if it is an exact str: 1 when
 * done, -1 on error (too long: UsageError), 0 to bail out. */
static int
short_arg(PyObject *value, const char *what, const char **raw, Py_ssize_t *size, PyObject **keep)
{
    if (!PyUnicode_CheckExact(value)) {
        return 0;
    }
    *raw = utf8_of(value, size, keep);
    if (*raw == NULL) {
        return -1;
    }
    if (*size > 255) {
        Py_CLEAR(*keep);
        return usage("%s is %zd bytes of UTF-8; an AMQP short string holds at most 255 bytes", what,
                     *size);
    }
    return 1;
}

#define FRAME_MAX_DEFAULT 131072
#define FRAME_MIN_SIZE 4096

static const char *const PUBLISH_PARAMS[] = {
    "channel", "exchange", "routing_key", "properties", "body", "frame_max", "mandatory", "immediate",
};

PyDoc_STRVAR(encode_publish_doc,
"encode_publish($module, /, channel, exchange, routing_key, properties, body, frame_max,\n"
"               mandatory=False, immediate=False)\n"
"--\n\n"
"Basic.Publish, its content header and body frames, as one bytes object.");

/* _fast.encode_publish */
static PyObject *
encode_publish(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[8];
    if (!bind(args, nargs, kwnames, PUBLISH_PARAMS, 8, 6, a)) {
        return bail(&PURE_ENCODE_PUBLISH, args, nargs, kwnames);
    }
    PyObject *channel = a[0], *properties = a[3], *body = a[4], *frame_max = a[5];
    PyObject *mandatory = a[6] != NULL ? a[6] : Py_False;
    PyObject *immediate = a[7] != NULL ? a[7] : Py_False;
    const char *ex = NULL, *rk = NULL;
    Py_ssize_t ex_size = 0, rk_size = 0;
    PyObject *ex_keep = NULL, *rk_keep = NULL, *result = NULL;
    Buf props;
    buf_init(&props);

    /* the steps in the order of the Python function, each native or a bail-out */
    int ok = short_arg(a[1], "exchange", &ex, &ex_size, &ex_keep);
    if (ok == 1) {
        ok = short_arg(a[2], "routing_key", &rk, &rk_size, &rk_keep);
    }
    if (ok <= 0) {
        goto end;
    }
    if (!PyLong_CheckExact(frame_max)) {
        ok = 0;
        goto end;
    }
    int overflow;
    long long fm = PyLong_AsLongLongAndOverflow(frame_max, &overflow);
    uint64_t chunk;
    if (!overflow && fm == FRAME_MAX_DEFAULT) {
        chunk = FRAME_MAX_DEFAULT - 8;
    }
    else if (!overflow && fm == 0) {
        chunk = 0xFFFFFFFFu - 8;
    }
    else if (!overflow && fm >= FRAME_MIN_SIZE && fm <= 0xFFFFFFFFLL) {
        chunk = (uint64_t)fm - 8;
    }
    else {
        ok = usage("frame_max must be 0 or %d..%lu, got %R", FRAME_MIN_SIZE, 0xFFFFFFFFul, frame_max);
        goto end;
    }
    if (properties == Py_None) {
        props.data[0] = props.data[1] = 0;
        props.len = 2;
    }
    else if (Py_TYPE(properties) == (PyTypeObject *)BasicProperties) {
        if (enc_properties_checked(&props, properties) < 0) {
            ok = -1;
            goto end;
        }
    }
    else {
        ok = 0;
        goto end;
    }
    uint64_t header_size = 12 + (uint64_t)props.len;
    if (header_size > chunk) {
        ok = usage("the content header is %llu bytes, more than frame_max (%llu); "
                   "send fewer or smaller headers",
                   (unsigned long long)(header_size + 8), (unsigned long long)(chunk + 8));
        goto end;
    }
    const char *body_data;
    Py_ssize_t body_size;
    if (PyBytes_CheckExact(body)) {
        body_data = PyBytes_AS_STRING(body);
        body_size = PyBytes_GET_SIZE(body);
    }
    else if (PyByteArray_CheckExact(body)) {
        body_data = PyByteArray_AS_STRING(body);
        body_size = PyByteArray_GET_SIZE(body);
    }
    else {
        ok = 0;
        goto end;
    }
    long ch = PyLong_CheckExact(channel) ? PyLong_AsLongAndOverflow(channel, &overflow) : -1;
    if (ch < 0 || ch > 65535 || overflow || !PyBool_Check(mandatory) || !PyBool_Check(immediate)) {
        ok = 0; /* Python's struct.error message, or truthiness of other objects */
        goto end;
    }

    uint64_t frames = ((uint64_t)body_size + chunk - 1) / chunk;
    Py_ssize_t total = 13 + 1 + ex_size + 1 + rk_size + 21 + props.len + 1;
    if ((uint64_t)body_size > (uint64_t)(PY_SSIZE_T_MAX - total) - frames * 8) {
        PyErr_NoMemory();
        ok = -1;
        goto end;
    }
    total += (Py_ssize_t)(frames * 8) + body_size;
    result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) {
        ok = -1;
        goto end;
    }
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(result);
    /* method frame: header, class/method, ticket, exchange, routing key, bits */
    o[0] = 1;
    wr16(o + 1, (uint16_t)ch);
    wr32(o + 3, (uint32_t)(9 + ex_size + rk_size));
    wr32(o + 7, (60u << 16) | 40u);
    wr16(o + 11, 0);
    o += 13;
    *o++ = (unsigned char)ex_size;
    memcpy(o, ex, (size_t)ex_size);
    o += ex_size;
    *o++ = (unsigned char)rk_size;
    memcpy(o, rk, (size_t)rk_size);
    o += rk_size;
    *o++ = (unsigned char)((immediate == Py_True ? 2 : 0) | (mandatory == Py_True ? 1 : 0));
    *o++ = 0xCE;
    /* content header frame: header, class id, weight, body size, properties */
    *o++ = 2;
    wr16(o, (uint16_t)ch);
    wr32(o + 2, (uint32_t)header_size);
    wr16(o + 6, 60);
    wr16(o + 8, 0);
    wr64(o + 10, (uint64_t)body_size);
    o += 18;
    memcpy(o, props.data, (size_t)props.len);
    o += props.len;
    /* body frames of at most frame_max - 8 bytes; each begins with the end octet of
     * the frame before it */
    for (Py_ssize_t first = 0; first < body_size; first += (Py_ssize_t)chunk) {
        Py_ssize_t piece = body_size - first < (Py_ssize_t)chunk ? body_size - first : (Py_ssize_t)chunk;
        o[0] = 0xCE;
        o[1] = 3;
        wr16(o + 2, (uint16_t)ch);
        wr32(o + 4, (uint32_t)piece);
        memcpy(o + 8, body_data + first, (size_t)piece);
        o += 8 + piece;
    }
    *o = 0xCE;
    ok = 1;
end:
    Py_XDECREF(ex_keep);
    Py_XDECREF(rk_keep);
    buf_free(&props);
    if (ok == 0) {
        return bail(&PURE_ENCODE_PUBLISH, args, nargs, kwnames);
    }
    return ok < 0 ? NULL : result;
}

static const char *const PROPS_PARAM[] = {"props"};

PyDoc_STRVAR(encode_properties_doc,
"encode_properties($module, /, props)\n--\n\n"
"Encode the property flags and fields (as they follow the body size in a content header).");

/* _properties.encode_properties */
static PyObject *
encode_properties(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *props;
    if (!bind(args, nargs, kwnames, PROPS_PARAM, 1, 1, &props)) {
        return bail(&PURE_ENCODE_PROPERTIES, args, nargs, kwnames);
    }
    if (props == Py_None) {
        return PyBytes_FromStringAndSize("\0\0", 2);
    }
    if (Py_TYPE(props) != (PyTypeObject *)BasicProperties) {
        return bail(&PURE_ENCODE_PROPERTIES, args, nargs, kwnames);
    }
    Buf b;
    buf_init(&b);
    PyObject *result = NULL;
    if (enc_properties_checked(&b, props) == 0) {
        result = PyBytes_FromStringAndSize((const char *)b.data, b.len);
    }
    buf_free(&b);
    return result;
}

static const char *const TABLE_PARAM[] = {"table"};
static const char *const ARRAY_PARAM[] = {"values"};

PyDoc_STRVAR(encode_table_doc,
"encode_table($module, /, table)\n--\n\n"
"Encode a field table, with its 4-byte length prefix.  None and {} give four zero bytes.");

/* _table.encode_table */
static PyObject *
encode_table(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *table;
    if (!bind(args, nargs, kwnames, TABLE_PARAM, 1, 1, &table)) {
        return bail(&PURE_ENCODE_TABLE, args, nargs, kwnames);
    }
    if (table == Py_None) {
        return PyBytes_FromStringAndSize("\0\0\0\0", 4);
    }
    if (!PyDict_CheckExact(table)) {
        return bail(&PURE_ENCODE_TABLE, args, nargs, kwnames);
    }
    Buf b;
    buf_init(&b);
    PyObject *result = NULL;
    if (enc_table(&b, table, 1) == 0) {
        result = PyBytes_FromStringAndSize((const char *)b.data, b.len);
    }
    buf_free(&b);
    return result;
}

PyDoc_STRVAR(encode_array_doc,
"encode_array($module, /, values)\n--\n\n"
"Encode a field array, with its 4-byte length prefix.");

/* _table.encode_array */
static PyObject *
encode_array(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *values;
    if (!bind(args, nargs, kwnames, ARRAY_PARAM, 1, 1, &values)) {
        return bail(&PURE_ENCODE_ARRAY, args, nargs, kwnames);
    }
    if (!PyList_CheckExact(values) && !PyTuple_CheckExact(values)) {
        return bail(&PURE_ENCODE_ARRAY, args, nargs, kwnames);
    }
    Buf b;
    buf_init(&b);
    PyObject *result = NULL;
    if (enc_array(&b, values, 1) == 0) {
        result = PyBytes_FromStringAndSize((const char *)b.data, b.len);
    }
    buf_free(&b);
    return result;
}

/* --- decoding ------------------------------------------------------------------------- */

/* Decoded ASCII strings that repeat from message to message (header keys, content types,
 * exchange and queue names...) are shared through a small direct-mapped cache, which
 * saves the allocation and the hashing when they become dict keys.  str is immutable, so
 * sharing is invisible (but for ``is``). */
#define STR_CACHE_SIZE 1024 /* a power of two */
#define CACHE_KEYS 64       /* longest table key or short string kept */
#define CACHE_VALUES 24     /* longest header long-string value kept (as the encoder's cache) */
static PyObject *str_cache[STR_CACHE_SIZE];

/* ``raw.decode("utf-8")``; NULL with UnicodeDecodeError set if it is not UTF-8.  ASCII
 * strings of at most `cache_limit` bytes go through the cache. */
static PyObject *
decode_str(const unsigned char *p, Py_ssize_t n, Py_ssize_t cache_limit)
{
    if (n > 0 && n <= cache_limit) {
        /* hash 8 bytes at a time, and see whether any byte has its high bit set */
        uint64_t hash = (uint64_t)n, high = 0, word;
        Py_ssize_t i = 0;
        for (; i + 8 <= n; i += 8) {
            memcpy(&word, p + i, 8);
            high |= word;
            hash = (hash ^ word) * 0x9E3779B97F4A7C15u;
            hash ^= hash >> 29;
        }
        if (i < n) {
            word = 0;
            for (int shift = 0; i < n; i++, shift += 8) {
                word |= (uint64_t)p[i] << shift;
            }
            high |= word;
            hash = (hash ^ word) * 0x9E3779B97F4A7C15u;
            hash ^= hash >> 29;
        }
        if (!(high & 0x8080808080808080u)) {
            PyObject **slot = &str_cache[(hash >> 20) & (STR_CACHE_SIZE - 1)];
            PyObject *s = *slot;
            if (s != NULL && PyUnicode_GET_LENGTH(s) == n && memcmp(PyUnicode_1BYTE_DATA(s), p, (size_t)n) == 0) {
                return Py_NewRef(s);
            }
            s = PyUnicode_DecodeASCII((const char *)p, n, NULL);
            if (s != NULL) {
                Py_XSETREF(*slot, Py_NewRef(s));
            }
            return s;
        }
    }
    return PyUnicode_DecodeUTF8((const char *)p, n, NULL);
}

/* ``payload[start:stop].decode("utf-8")``, with Python's clamping of the slice. */
static PyObject *
slice_str(const unsigned char *p, Py_ssize_t len, Py_ssize_t start, Py_ssize_t stop, Py_ssize_t cache_limit)
{
    if (stop > len) {
        stop = len;
    }
    if (start > stop) {
        start = stop;
    }
    return decode_str(p + start, stop - start, cache_limit);
}

/* If the pending exception is a UnicodeDecodeError, clear it and return 1. */
static int
not_utf8(void)
{
    if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
        return 1;
    }
    return 0;
}

/* The last decoded timestamp (_table.decode_timestamp keeps the same cache): messages
 * published in the same second share one datetime. */
static uint64_t last_seconds;
static PyObject *last_timestamp;

/* _table.decode_timestamp: a miss goes to the Python function (the millisecond rule,
 * fromtimestamp's rounding and its range error stay there). */
static PyObject *
decode_timestamp(uint64_t seconds)
{
    if (last_timestamp != NULL && seconds == last_seconds) {
        return Py_NewRef(last_timestamp);
    }
    PyObject *arg = PyLong_FromUnsignedLongLong(seconds);
    if (arg == NULL) {
        return NULL;
    }
    PyObject *result = PyObject_CallOneArg(py_decode_timestamp, arg);
    Py_DECREF(arg);
    if (result != NULL) {
        Py_XSETREF(last_timestamp, Py_NewRef(result));
        last_seconds = seconds;
    }
    return result;
}

/* _table.lenient_timestamp: the cache, else the Python function (which keeps a value no
 * datetime can hold as its int, and notes it). */
static PyObject *
lenient_timestamp(uint64_t seconds, PyObject *notes)
{
    if (last_timestamp != NULL && seconds == last_seconds) {
        return Py_NewRef(last_timestamp);
    }
    PyObject *arg = PyLong_FromUnsignedLongLong(seconds);
    if (arg == NULL) {
        return NULL;
    }
    PyObject *result = PyObject_CallFunctionObjArgs(py_lenient_timestamp, arg, notes, NULL);
    Py_DECREF(arg);
    if (result != NULL && !PyLong_CheckExact(result)) {
        Py_XSETREF(last_timestamp, Py_NewRef(result));
        last_seconds = seconds;
    }
    return result;
}

/* Append `text` (a new reference, or NULL after an error) to the list `notes`. */
static int
note(PyObject *notes, PyObject *text)
{
    if (text == NULL) {
        return -1;
    }
    int rc = PyList_Append(notes, text);
    Py_DECREF(text);
    return rc;
}

/* The decoders below follow _table.py statement by statement: `buf` has `size` bytes,
 * `limit` is the end of the enclosing table, array or buffer, and on success *next is
 * the offset after what was decoded.  `notes`: NULL decodes strictly; a list decodes a
 * delivery's header leniently, as the Python functions do with their `notes` list. */

static PyObject *dec_table(const unsigned char *buf, Py_ssize_t size, Py_ssize_t pos, Py_ssize_t limit,
                           long depth, Py_ssize_t *next, PyObject *notes);
static PyObject *dec_array(const unsigned char *buf, Py_ssize_t size, Py_ssize_t pos, Py_ssize_t limit,
                           long depth, Py_ssize_t *next, PyObject *notes);

/* _table._skip_too_deep: a table or array that would nest deeper than MAX_DEPTH, skipped
 * (lenient only). */
static PyObject *
skip_too_deep(const unsigned char *buf, unsigned char kind, Py_ssize_t pos, Py_ssize_t end, PyObject *notes,
              Py_ssize_t *next)
{
    const char *what = kind == 'F' ? "table" : "array";
    if (pos + 4 > end) {
        return syntax("field %s length is truncated", what);
    }
    Py_ssize_t stop = pos + 4 + (Py_ssize_t)rd32(buf + pos);
    if (stop > end) {
        return syntax("field %s is longer than its buffer", what);
    }
    if (note(notes, PyUnicode_FromFormat("header tables and arrays nest deeper than %ld levels", MAX_DEPTH)) < 0) {
        return NULL;
    }
    *next = stop;
    return Py_NewRef(NESTED_TOO_DEEP);
}

/* The long string at buf[start:stop]: str if it is UTF-8, else bytes. */
static PyObject *
long_string(const unsigned char *buf, Py_ssize_t start, Py_ssize_t stop)
{
    PyObject *value = decode_str(buf + start, stop - start, CACHE_VALUES);
    if (value == NULL && not_utf8()) {
        value = PyBytes_FromStringAndSize((const char *)buf + start, stop - start);
    }
    return value;
}

/* _table._decode_value: one value of type `kind` whose data starts at `pos`. */
static PyObject *
dec_value(const unsigned char *buf, Py_ssize_t size, unsigned char kind, Py_ssize_t pos, Py_ssize_t end,
          long depth, Py_ssize_t *next, PyObject *notes)
{
    Py_ssize_t fixed;
    switch (kind) {
    case 't': case 'b': case 'B': fixed = 1; break;
    case 's': case 'u': fixed = 2; break;
    case 'I': case 'i': case 'f': fixed = 4; break;
    case 'D': fixed = 5; break;
    case 'l': case 'L': case 'd': case 'T': fixed = 8; break;
    default: fixed = 0; break;
    }
    if (fixed) {
        if (pos + fixed > end) {
            return syntax("field value of type '%c' is truncated", kind);
        }
        *next = pos + fixed;
        const unsigned char *p = buf + pos;
        switch (kind) {
        case 't': return PyBool_FromLong(p[0] != 0);
        case 'b': return PyLong_FromLong((int8_t)p[0]);
        case 'B': return PyLong_FromLong(p[0]);
        case 's': return PyLong_FromLong((int16_t)rd16(p));
        case 'u': return PyLong_FromLong(rd16(p));
        case 'I': return PyLong_FromLong((int32_t)rd32(p));
        case 'i': return PyLong_FromUnsignedLong(rd32(p));
        case 'l': case 'L': return PyLong_FromLongLong((int64_t)rd64(p));
        case 'f': {
            double v = PyFloat_Unpack4((const char *)p, 0);
            return v == -1.0 && PyErr_Occurred() ? NULL : PyFloat_FromDouble(v);
        }
        case 'd': {
            double v = PyFloat_Unpack8((const char *)p, 0);
            return v == -1.0 && PyErr_Occurred() ? NULL : PyFloat_FromDouble(v);
        }
        case 'T': return notes != NULL ? lenient_timestamp(rd64(p), notes) : decode_timestamp(rd64(p));
        default: { /* 'D': Decimal(mantissa).scaleb(-scale, _DEC_CONTEXT) */
            PyObject *mantissa = PyLong_FromLong((int32_t)rd32(p + 1));
            if (mantissa == NULL) {
                return NULL;
            }
            PyObject *number = PyObject_CallOneArg(Decimal, mantissa);
            Py_DECREF(mantissa);
            if (number == NULL) {
                return NULL;
            }
            PyObject *scale = PyLong_FromLong(-(long)p[0]);
            PyObject *value = scale == NULL ? NULL
                : PyObject_CallMethodObjArgs(number, str_scaleb, scale, dec_context, NULL);
            Py_XDECREF(scale);
            Py_DECREF(number);
            return value;
        }
        }
    }
    if (kind == 'S' || kind == 'x') {
        Py_ssize_t start = pos + 4;
        if (start > end) {
            return syntax("string length is truncated");
        }
        Py_ssize_t stop = start + (Py_ssize_t)rd32(buf + pos);
        if (stop > end) {
            return syntax("string runs past the end of its table or array");
        }
        *next = stop;
        if (kind == 'x') {
            return PyBytes_FromStringAndSize((const char *)buf + start, stop - start);
        }
        return long_string(buf, start, stop);
    }
    if (kind == 'F' || kind == 'A') {
        if (depth >= MAX_DEPTH && notes != NULL) {
            return skip_too_deep(buf, kind, pos, end, notes, next);
        }
        if (kind == 'F') {
            return dec_table(buf, size, pos, end, depth + 1, next, notes);
        }
        return dec_array(buf, size, pos, end, depth + 1, next, notes);
    }
    if (kind == 'V' || kind == 0) {
        *next = pos;
        Py_RETURN_NONE;
    }
    PyObject *code = PyBytes_FromStringAndSize((const char *)&kind, 1);
    if (code == NULL) {
        return NULL;
    }
    syntax("unknown field type %R", code);
    Py_DECREF(code);
    return NULL;
}

/* _table._decode_table */
static PyObject *
dec_table(const unsigned char *buf, Py_ssize_t size, Py_ssize_t pos, Py_ssize_t limit, long depth,
          Py_ssize_t *next, PyObject *notes)
{
    if (depth > MAX_DEPTH) {
        return syntax("field tables and arrays nest deeper than %ld levels", MAX_DEPTH);
    }
    if (pos < 0 || pos + 4 > limit) {
        return syntax("field table length is truncated");
    }
    Py_ssize_t end = pos + 4 + (Py_ssize_t)rd32(buf + pos);
    if (end > limit) {
        return syntax("field table is longer than its buffer");
    }
    pos += 4;
    PyObject *result = PyDict_New();
    if (result == NULL) {
        return NULL;
    }
    while (pos < end) {
        Py_ssize_t key_start = pos + 1;
        pos = key_start + buf[pos]; /* now at the type octet */
        if (pos >= end) {
            syntax("field table key runs past the end of the table");
            goto error;
        }
        PyObject *key = decode_str(buf + key_start, pos - key_start, CACHE_KEYS);
        if (key == NULL) {
            if (!not_utf8()) {
                goto error;
            }
            if (notes == NULL) {
                syntax("field table key is not UTF-8");
                goto error;
            }
            key = PyBytes_FromStringAndSize((const char *)buf + key_start, pos - key_start);
            if (key == NULL) {
                goto error;
            }
            if (note(notes, PyUnicode_FromFormat("header table key %R is not UTF-8", key)) < 0) {
                Py_DECREF(key);
                goto error;
            }
        }
        unsigned char kind = buf[pos];
        PyObject *value;
        if (kind == 'S') { /* inline, as in the Python decoder (its bounds included) */
            if (pos + 5 > size) {
                syntax("field table is truncated");
                value = NULL;
            }
            else {
                Py_ssize_t value_start = pos + 5;
                pos = value_start + (Py_ssize_t)rd32(buf + value_start - 4);
                value = pos > end ? syntax("long string runs past the end of its table")
                                  : long_string(buf, value_start, pos);
            }
        }
        else if (kind == 'b') {
            pos += 2;
            value = pos > end ? syntax("field value of type 'b' is truncated")
                              : PyLong_FromLong((int8_t)buf[pos - 1]);
        }
        else {
            value = dec_value(buf, size, kind, pos + 1, end, depth, &pos, notes);
        }
        if (value == NULL) {
            Py_DECREF(key);
            goto error;
        }
        int rc = PyDict_SetItem(result, key, value);
        Py_DECREF(key);
        Py_DECREF(value);
        if (rc < 0) {
            goto error;
        }
    }
    *next = end;
    return result;
error:
    Py_DECREF(result);
    return NULL;
}

/* _table._decode_array */
static PyObject *
dec_array(const unsigned char *buf, Py_ssize_t size, Py_ssize_t pos, Py_ssize_t limit, long depth,
          Py_ssize_t *next, PyObject *notes)
{
    if (depth > MAX_DEPTH) {
        return syntax("field tables and arrays nest deeper than %ld levels", MAX_DEPTH);
    }
    if (pos < 0 || pos + 4 > limit) {
        return syntax("field array length is truncated");
    }
    Py_ssize_t end = pos + 4 + (Py_ssize_t)rd32(buf + pos);
    if (end > limit) {
        return syntax("field array is longer than its buffer");
    }
    pos += 4;
    PyObject *result = PyList_New(0);
    if (result == NULL) {
        return NULL;
    }
    while (pos < end) {
        unsigned char kind = buf[pos];
        PyObject *value = dec_value(buf, size, kind, pos + 1, end, depth, &pos, notes);
        if (value == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        int rc = PyList_Append(result, value);
        Py_DECREF(value);
        if (rc < 0) {
            Py_DECREF(result);
            return NULL;
        }
    }
    *next = end;
    return result;
}

/* A short-string property at *pos.  `inline_style`: the truncation message of the fields
 * decode_properties() decodes inline (content_type, content_encoding, message_id,
 * app_id); otherwise that of its _short() helper.  Not UTF-8: an error, or (lenient,
 * `notes` a list) its bytes, noted, as _properties._not_utf8. */
static PyObject *
dec_short_property(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t end, int i, int inline_style,
                   Py_ssize_t cache_limit, PyObject *notes)
{
    const char *name = FIELD_NAMES[i];
    if (*pos >= end) {
        return inline_style ? syntax("content header properties are truncated")
                            : syntax("%s is truncated", name);
    }
    Py_ssize_t stop = *pos + 1 + buf[*pos];
    if (stop > end) {
        return syntax("%s runs past the end of the content header", name);
    }
    PyObject *value = decode_str(buf + *pos + 1, stop - *pos - 1, cache_limit);
    if (value == NULL) {
        if (!not_utf8()) {
            return NULL;
        }
        if (notes == NULL) {
            return syntax("%s is not UTF-8", name);
        }
        value = PyBytes_FromStringAndSize((const char *)buf + *pos + 1, stop - *pos - 1);
        if (value == NULL || note(notes, PyUnicode_FromFormat("%s is not UTF-8", name)) < 0) {
            Py_XDECREF(value);
            return NULL;
        }
    }
    *pos = stop;
    return value;
}

/* BasicProperties(**fields) for the present fields, through vectorcall with a keyword
 * name tuple kept per combination of flags.  Steals the references in `values`. */
static PyObject *
make_properties(PyObject **values, unsigned int flags)
{
    PyObject *args[N_FIELDS];
    Py_ssize_t n = 0;
    for (int i = 0; i < N_FIELDS; i++) {
        if (flags & (0x8000u >> i)) {
            args[n++] = values[i];
        }
    }
    PyObject *result = NULL;
    PyObject **kwnames = &kwnames_by_flags[(flags & 0xFFFCu) >> 2];
    if (*kwnames == NULL) {
        PyObject *names = PyTuple_New(n);
        if (names == NULL) {
            goto done;
        }
        Py_ssize_t k = 0;
        for (int i = 0; i < N_FIELDS; i++) {
            if (flags & (0x8000u >> i)) {
                PyTuple_SET_ITEM(names, k++, Py_NewRef(field_names[i]));
            }
        }
        *kwnames = names;
    }
    result = PyObject_Vectorcall(BasicProperties, args, 0, *kwnames);
done:
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_DECREF(args[k]);
    }
    return result;
}

/* _properties.decode_properties: the fields from buf[pos:] to buf[end]. */
static PyObject *
dec_properties(const unsigned char *buf, Py_ssize_t end, Py_ssize_t pos, PyObject *notes)
{
    if (pos < 0 || pos + 2 > end) {
        return syntax("content header property flags are truncated");
    }
    unsigned int flags = rd16(buf + pos);
    pos += 2;
    unsigned int more = flags;
    while (more & 1) { /* continuation: further flag words (none are defined; skip them) */
        if (pos + 2 > end) {
            return syntax("content header property flags are truncated");
        }
        more = rd16(buf + pos);
        pos += 2;
    }
    if (!(flags & 0xFFFCu)) {
        if (pos != end) {
            return syntax("unexpected bytes after the content header properties");
        }
        return Py_NewRef(EMPTY_PROPERTIES);
    }
    PyObject *values[N_FIELDS] = {NULL};
    int i;
    for (i = 0; i < N_FIELDS; i++) {
        if (!(flags & (0x8000u >> i))) {
            continue;
        }
        PyObject *v;
        switch (i) {
        case F_CONTENT_TYPE:
        case F_CONTENT_ENCODING:
        case F_APP_ID:
            v = dec_short_property(buf, &pos, end, i, 1, CACHE_KEYS, notes);
            break;
        case F_MESSAGE_ID: /* ids are unique: not cached */
            v = dec_short_property(buf, &pos, end, i, 1, 0, notes);
            break;
        case F_CORRELATION_ID:
            v = dec_short_property(buf, &pos, end, i, 0, 0, notes);
            break;
        case F_HEADERS:
            v = dec_table(buf, end, pos, end, 1, &pos, notes);
            break;
        case F_DELIVERY_MODE:
        case F_PRIORITY:
            if (pos >= end) {
                v = syntax("content header properties are truncated");
                break;
            }
            v = PyLong_FromLong(buf[pos++]);
            break;
        case F_TIMESTAMP:
            if (pos + 8 > end) {
                v = syntax("timestamp is truncated");
                break;
            }
            v = notes != NULL ? lenient_timestamp(rd64(buf + pos), notes) : decode_timestamp(rd64(buf + pos));
            pos += 8;
            break;
        default:
            v = dec_short_property(buf, &pos, end, i, 0, CACHE_KEYS, notes);
            break;
        }
        if (v == NULL) {
            goto error;
        }
        values[i] = v;
    }
    if (pos != end) {
        syntax("unexpected bytes after the content header properties");
        goto error;
    }
    return make_properties(values, flags);
error:
    for (i = 0; i < N_FIELDS; i++) {
        Py_XDECREF(values[i]);
    }
    return NULL;
}

/* An exact int offset: 1 and *out set; else 0 (bail out).  Offsets beyond +-2**60 go to
 * Python too, so that offset arithmetic here cannot overflow. */
static int
offset_arg(PyObject *value, Py_ssize_t *out)
{
    if (value == NULL) {
        *out = 0;
        return 1;
    }
    if (!PyLong_CheckExact(value)) {
        return 0;
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || v > (1LL << 60) || v < -(1LL << 60) || (Py_ssize_t)v != v) {
        return 0;
    }
    *out = (Py_ssize_t)v;
    return 1;
}

static const char *const BUF_OFFSET_PARAMS[] = {"buf", "offset"};

PyDoc_STRVAR(decode_properties_doc,
"decode_properties($module, /, buf, offset=0)\n--\n\n"
"Decode property flags and fields from buf[offset:] to the end of buf.");

/* _properties.decode_properties */
static PyObject *
decode_properties(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[2];
    Py_ssize_t offset;
    if (!bind(args, nargs, kwnames, BUF_OFFSET_PARAMS, 2, 1, a) || !PyBytes_CheckExact(a[0]) ||
        !offset_arg(a[1], &offset)) {
        return bail(&PURE_DECODE_PROPERTIES, args, nargs, kwnames);
    }
    return dec_properties((const unsigned char *)PyBytes_AS_STRING(a[0]), PyBytes_GET_SIZE(a[0]), offset, NULL);
}

/* (value, end) for decode_table / decode_array. */
static PyObject *
with_end(PyObject *value, Py_ssize_t end)
{
    if (value == NULL) {
        return NULL;
    }
    PyObject *end_obj = PyLong_FromSsize_t(end);
    if (end_obj == NULL) {
        Py_DECREF(value);
        return NULL;
    }
    PyObject *result = PyTuple_Pack(2, value, end_obj);
    Py_DECREF(value);
    Py_DECREF(end_obj);
    return result;
}

PyDoc_STRVAR(decode_table_doc,
"decode_table($module, /, buf, offset=0)\n--\n\n"
"Decode the field table that starts (with its length) at buf[offset]; returns the table\n"
"and the offset just past it.");

/* _table.decode_table */
static PyObject *
decode_table(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[2];
    Py_ssize_t offset, end = 0;
    if (!bind(args, nargs, kwnames, BUF_OFFSET_PARAMS, 2, 1, a) || !PyBytes_CheckExact(a[0]) ||
        !offset_arg(a[1], &offset)) {
        return bail(&PURE_DECODE_TABLE, args, nargs, kwnames);
    }
    Py_ssize_t size = PyBytes_GET_SIZE(a[0]);
    PyObject *table = dec_table((const unsigned char *)PyBytes_AS_STRING(a[0]), size, offset, size, 1, &end, NULL);
    return with_end(table, end);
}

PyDoc_STRVAR(decode_array_doc,
"decode_array($module, /, buf, offset=0)\n--\n\n"
"Decode the field array that starts (with its length) at buf[offset].");

/* _table.decode_array */
static PyObject *
decode_array(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[2];
    Py_ssize_t offset, end = 0;
    if (!bind(args, nargs, kwnames, BUF_OFFSET_PARAMS, 2, 1, a) || !PyBytes_CheckExact(a[0]) ||
        !offset_arg(a[1], &offset)) {
        return bail(&PURE_DECODE_ARRAY, args, nargs, kwnames);
    }
    Py_ssize_t size = PyBytes_GET_SIZE(a[0]);
    PyObject *array = dec_array((const unsigned char *)PyBytes_AS_STRING(a[0]), size, offset, size, 1, &end, NULL);
    return with_end(array, end);
}

/* --- method and content header payloads (_fast.py) ----------------------------------- */

/* A tuple of `n` new references (stolen, also on failure; none may be NULL). */
static PyObject *
tuple_of(Py_ssize_t n, PyObject **items)
{
    PyObject *result = PyTuple_New(n);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (result != NULL) {
            PyTuple_SET_ITEM(result, i, items[i]);
        }
        else {
            Py_DECREF(items[i]);
        }
    }
    return result;
}

static const char *const PAYLOAD_PARAM[] = {"payload"};

/* The payload argument as an exact bytes object, or NULL to bail out. */
static PyObject *
payload_arg(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *payload;
    if (!bind(args, nargs, kwnames, PAYLOAD_PARAM, 1, 1, &payload) || !PyBytes_CheckExact(payload)) {
        return NULL;
    }
    return payload;
}

#define METHOD_ID(class_id, method_id) (((uint32_t)(class_id) << 16) | (method_id))

/* Whether the payload starts with the given class and method ids. */
static int
is_method(const unsigned char *p, Py_ssize_t len, uint32_t id)
{
    return len >= 4 && rd32(p) == id;
}

/* The short string payload[start:stop], or NULL: not UTF-8 raises
 * "<name> has a short string that is not UTF-8". */
static PyObject *
method_str(const unsigned char *p, Py_ssize_t len, Py_ssize_t start, Py_ssize_t stop, const char *name)
{
    PyObject *value = slice_str(p, len, start, stop, CACHE_KEYS);
    if (value == NULL && not_utf8()) {
        syntax("%s has a short string that is not UTF-8", name);
    }
    return value;
}

PyDoc_STRVAR(decode_deliver_doc,
"decode_deliver($module, /, payload)\n--\n\n"
"Basic.Deliver -> (consumer_tag, delivery_tag, redelivered, exchange, routing_key).");

/* _fast.decode_deliver */
static PyObject *
decode_deliver(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *payload = payload_arg(args, nargs, kwnames);
    if (payload == NULL) {
        return bail(&PURE_DECODE_DELIVER, args, nargs, kwnames);
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(payload);
    Py_ssize_t len = PyBytes_GET_SIZE(payload);
    const char *name = "Basic.Deliver";
    PyObject *consumer_tag = NULL, *exchange = NULL, *routing_key = NULL;
    if (!is_method(p, len, METHOD_ID(60, 60))) {
        return syntax("not a Basic.Deliver payload");
    }
    if (len < 5) {
        return syntax("Basic.Deliver is truncated");
    }
    Py_ssize_t pos = 5 + p[4];
    if ((consumer_tag = method_str(p, len, 5, pos, name)) == NULL) {
        return NULL;
    }
    if (pos + 10 > len) {
        syntax("Basic.Deliver is truncated");
        goto error;
    }
    uint64_t delivery_tag = rd64(p + pos);
    unsigned char bits = p[pos + 8];
    Py_ssize_t stop = pos + 10 + p[pos + 9];
    pos += 10;
    if ((exchange = method_str(p, len, pos, stop, name)) == NULL) {
        goto error;
    }
    pos = stop + 1;
    if (stop >= len) {
        syntax("Basic.Deliver is truncated");
        goto error;
    }
    stop = pos + p[stop];
    if (stop != len) {
        syntax("Basic.Deliver has the wrong length");
        goto error;
    }
    if ((routing_key = method_str(p, len, pos, stop, name)) == NULL) {
        goto error;
    }
    PyObject *tag = PyLong_FromUnsignedLongLong(delivery_tag);
    if (tag == NULL) {
        goto error;
    }
    PyObject *result = PyTuple_New(5);
    if (result == NULL) {
        Py_DECREF(tag);
        goto error;
    }
    PyTuple_SET_ITEM(result, 0, consumer_tag);
    PyTuple_SET_ITEM(result, 1, tag);
    PyTuple_SET_ITEM(result, 2, PyBool_FromLong(bits & 1));
    PyTuple_SET_ITEM(result, 3, exchange);
    PyTuple_SET_ITEM(result, 4, routing_key);
    return result;
error:
    Py_XDECREF(consumer_tag);
    Py_XDECREF(exchange);
    Py_XDECREF(routing_key);
    return NULL;
}

PyDoc_STRVAR(decode_return_doc,
"decode_return($module, /, payload)\n--\n\n"
"Basic.Return -> (reply_code, reply_text, exchange, routing_key).");

/* _fast.decode_return */
static PyObject *
decode_return(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *payload = payload_arg(args, nargs, kwnames);
    if (payload == NULL) {
        return bail(&PURE_DECODE_RETURN, args, nargs, kwnames);
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(payload);
    Py_ssize_t len = PyBytes_GET_SIZE(payload);
    const char *name = "Basic.Return";
    PyObject *reply_text = NULL, *exchange = NULL, *routing_key = NULL;
    if (!is_method(p, len, METHOD_ID(60, 50))) {
        return syntax("not a Basic.Return payload");
    }
    if (len < 7) {
        return syntax("Basic.Return is truncated");
    }
    unsigned int reply_code = rd16(p + 4);
    Py_ssize_t stop = 7 + p[6];
    if ((reply_text = method_str(p, len, 7, stop, name)) == NULL) {
        return NULL;
    }
    Py_ssize_t pos = stop + 1;
    if (stop >= len) {
        syntax("Basic.Return is truncated");
        goto error;
    }
    stop = pos + p[stop];
    if ((exchange = method_str(p, len, pos, stop, name)) == NULL) {
        goto error;
    }
    pos = stop + 1;
    if (stop >= len) {
        syntax("Basic.Return is truncated");
        goto error;
    }
    stop = pos + p[stop];
    if (stop != len) {
        syntax("Basic.Return has the wrong length");
        goto error;
    }
    if ((routing_key = method_str(p, len, pos, stop, name)) == NULL) {
        goto error;
    }
    PyObject *code = PyLong_FromLong(reply_code);
    if (code == NULL) {
        goto error;
    }
    PyObject *result = PyTuple_New(4);
    if (result == NULL) {
        Py_DECREF(code);
        goto error;
    }
    PyTuple_SET_ITEM(result, 0, code);
    PyTuple_SET_ITEM(result, 1, reply_text);
    PyTuple_SET_ITEM(result, 2, exchange);
    PyTuple_SET_ITEM(result, 3, routing_key);
    return result;
error:
    Py_XDECREF(reply_text);
    Py_XDECREF(exchange);
    Py_XDECREF(routing_key);
    return NULL;
}

PyDoc_STRVAR(decode_get_ok_doc,
"decode_get_ok($module, /, payload)\n--\n\n"
"Basic.GetOk -> (delivery_tag, redelivered, exchange, routing_key, message_count).");

/* _fast.decode_get_ok */
static PyObject *
decode_get_ok(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *payload = payload_arg(args, nargs, kwnames);
    if (payload == NULL) {
        return bail(&PURE_DECODE_GET_OK, args, nargs, kwnames);
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(payload);
    Py_ssize_t len = PyBytes_GET_SIZE(payload);
    const char *name = "Basic.GetOk";
    PyObject *exchange = NULL, *routing_key = NULL;
    if (!is_method(p, len, METHOD_ID(60, 71))) {
        return syntax("not a Basic.GetOk payload");
    }
    if (len < 14) {
        return syntax("Basic.GetOk is truncated");
    }
    uint64_t delivery_tag = rd64(p + 4);
    unsigned char bits = p[12];
    Py_ssize_t stop = 14 + p[13];
    if ((exchange = method_str(p, len, 14, stop, name)) == NULL) {
        return NULL;
    }
    Py_ssize_t pos = stop + 1;
    if (stop >= len) {
        syntax("Basic.GetOk is truncated");
        goto error;
    }
    stop = pos + p[stop];
    if ((routing_key = method_str(p, len, pos, stop, name)) == NULL) {
        goto error;
    }
    if (stop + 4 != len) {
        syntax("Basic.GetOk has the wrong length");
        goto error;
    }
    PyObject *tag = PyLong_FromUnsignedLongLong(delivery_tag);
    PyObject *count = tag == NULL ? NULL : PyLong_FromUnsignedLong(rd32(p + stop));
    PyObject *result = count == NULL ? NULL : PyTuple_New(5);
    if (result == NULL) {
        Py_XDECREF(tag);
        Py_XDECREF(count);
        goto error;
    }
    PyTuple_SET_ITEM(result, 0, tag);
    PyTuple_SET_ITEM(result, 1, PyBool_FromLong(bits & 1));
    PyTuple_SET_ITEM(result, 2, exchange);
    PyTuple_SET_ITEM(result, 3, routing_key);
    PyTuple_SET_ITEM(result, 4, count);
    return result;
error:
    Py_XDECREF(exchange);
    Py_XDECREF(routing_key);
    return NULL;
}

/* _fast._tag_bits: Basic.Ack / Nack / Reject -> (delivery_tag, bits) */
static PyObject *
decode_tag_bits(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, Pure *pure, uint32_t id,
                const char *name, int with_second)
{
    PyObject *payload = payload_arg(args, nargs, kwnames);
    if (payload == NULL) {
        return bail(pure, args, nargs, kwnames);
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(payload);
    if (PyBytes_GET_SIZE(payload) != 13 || rd32(p) != id) {
        return syntax("not a %s payload of 13 bytes", name);
    }
    PyObject *items[3] = {PyLong_FromUnsignedLongLong(rd64(p + 4)), PyBool_FromLong(p[12] & 1),
                          PyBool_FromLong(p[12] & 2)};
    if (items[0] == NULL) {
        Py_DECREF(items[1]);
        Py_DECREF(items[2]);
        return NULL;
    }
    if (!with_second) {
        Py_DECREF(items[2]);
    }
    return tuple_of(with_second ? 3 : 2, items);
}

PyDoc_STRVAR(decode_ack_doc, "decode_ack($module, /, payload)\n--\n\nBasic.Ack -> (delivery_tag, multiple).");

static PyObject *
decode_ack(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return decode_tag_bits(args, nargs, kwnames, &PURE_DECODE_ACK, METHOD_ID(60, 80), "Basic.Ack", 0);
}

PyDoc_STRVAR(decode_nack_doc,
"decode_nack($module, /, payload)\n--\n\nBasic.Nack -> (delivery_tag, multiple, requeue).");

static PyObject *
decode_nack(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return decode_tag_bits(args, nargs, kwnames, &PURE_DECODE_NACK, METHOD_ID(60, 120), "Basic.Nack", 1);
}

PyDoc_STRVAR(decode_reject_doc,
"decode_reject($module, /, payload)\n--\n\nBasic.Reject -> (delivery_tag, requeue).");

static PyObject *
decode_reject(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return decode_tag_bits(args, nargs, kwnames, &PURE_DECODE_REJECT, METHOD_ID(60, 90), "Basic.Reject", 0);
}

/* _fast.decode_content_header, and with `lenient` _fast.decode_content_header_lenient. */
static PyObject *
content_header(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, int lenient)
{
    PyObject *payload = payload_arg(args, nargs, kwnames);
    if (payload == NULL) {
        return bail(lenient ? &PURE_DECODE_CONTENT_HEADER_LENIENT : &PURE_DECODE_CONTENT_HEADER, args, nargs,
                    kwnames);
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(payload);
    Py_ssize_t len = PyBytes_GET_SIZE(payload);
    if (len < 14) {
        return syntax("content header is truncated");
    }
    PyObject *items[4] = {PyLong_FromLong(rd16(p)), PyLong_FromUnsignedLongLong(rd64(p + 4)), NULL, NULL};
    if (items[0] == NULL || items[1] == NULL) {
        Py_XDECREF(items[0]);
        Py_XDECREF(items[1]);
        return NULL;
    }
    if (len == 14 && p[12] == 0 && p[13] == 0) {
        items[2] = Py_NewRef(EMPTY_PROPERTIES);
        items[3] = Py_NewRef(Py_None);
    }
    else if (!lenient) {
        items[2] = dec_properties(p, len, 12, NULL);
    }
    else {
        PyObject *notes = PyList_New(0);
        items[2] = notes == NULL ? NULL : dec_properties(p, len, 12, notes);
        if (items[2] != NULL) {
            items[3] = PyList_GET_SIZE(notes) ? PyObject_CallOneArg(py_malformed_reason, notes) : Py_NewRef(Py_None);
            if (items[3] == NULL) {
                Py_CLEAR(items[2]);
            }
        }
        Py_XDECREF(notes);
    }
    if (items[2] == NULL) {
        Py_DECREF(items[0]);
        Py_DECREF(items[1]);
        return NULL;
    }
    if (!lenient) {
        Py_XDECREF(items[3]);
    }
    return tuple_of(lenient ? 4 : 3, items);
}

PyDoc_STRVAR(decode_content_header_doc,
"decode_content_header($module, /, payload)\n--\n\n"
"A content header frame payload -> (class_id, body_size, properties).");

static PyObject *
decode_content_header(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return content_header(args, nargs, kwnames, 0);
}

PyDoc_STRVAR(decode_content_header_lenient_doc,
"decode_content_header_lenient($module, /, payload)\n--\n\n"
"A delivery's content header -> (class_id, body_size, properties, malformed): what is valid\n"
"AMQP but outside the strict rules is let through, and malformed says what (or is None).");

static PyObject *
decode_content_header_lenient(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return content_header(args, nargs, kwnames, 1);
}

/* --- frames (_frames.FrameReader.frames) --------------------------------------------- */

PyDoc_STRVAR(split_frames_doc,
"split_frames($module, result, data, max_payload, /)\n--\n\n"
"Append to result the complete, well-formed frames at the start of data, as\n"
"(frame_type, channel, payload); return the offset of the first byte not consumed.\n"
"Stops at an incomplete frame or anything wrong, which FrameReader.next_frame() handles.");

/* _frames._split_frames_py */
static PyObject *
split_frames(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyBytes_CheckExact(args[1]) ||
        !PyLong_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "split_frames(result: list, data: bytes, max_payload: int)");
        return NULL;
    }
    PyObject *result = args[0];
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(args[1]);
    Py_ssize_t total = PyBytes_GET_SIZE(args[1]);
    long long max_payload = PyLong_AsLongLong(args[2]);
    if (max_payload == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t pos = 0;
    while (total - pos >= 7) {
        unsigned char frame_type = p[pos];
        unsigned int channel = rd16(p + pos + 1);
        uint32_t size = rd32(p + pos + 3);
        Py_ssize_t end = pos + 7 + (Py_ssize_t)size;
        if (end >= total || (long long)size > max_payload ||
            !(frame_type == 1 || frame_type == 2 || frame_type == 3 || frame_type == 8) || p[end] != 0xCE ||
            (frame_type == 8 && (channel || size))) {
            break;
        }
        PyObject *items[3] = {PyLong_FromLong(frame_type), PyLong_FromLong((long)channel),
                              PyBytes_FromStringAndSize((const char *)p + pos + 7, (Py_ssize_t)size)};
        if (items[0] == NULL || items[1] == NULL || items[2] == NULL) {
            Py_XDECREF(items[0]);
            Py_XDECREF(items[1]);
            Py_XDECREF(items[2]);
            return NULL;
        }
        PyObject *frame = tuple_of(3, items);
        if (frame == NULL) {
            return NULL;
        }
        int rc = PyList_Append(result, frame);
        Py_DECREF(frame);
        if (rc < 0) {
            return NULL;
        }
        pos = end + 1;
    }
    return PyLong_FromSsize_t(pos);
}

/* --- the module ----------------------------------------------------------------------- */

#define FASTCALL_KW(name) {#name, (PyCFunction)(void (*)(void))name, METH_FASTCALL | METH_KEYWORDS, name##_doc}

static PyMethodDef methods[] = {
    FASTCALL_KW(encode_publish),
    FASTCALL_KW(encode_properties),
    FASTCALL_KW(decode_properties),
    FASTCALL_KW(decode_content_header),
    FASTCALL_KW(decode_content_header_lenient),
    FASTCALL_KW(decode_deliver),
    FASTCALL_KW(decode_return),
    FASTCALL_KW(decode_get_ok),
    FASTCALL_KW(decode_ack),
    FASTCALL_KW(decode_nack),
    FASTCALL_KW(decode_reject),
    FASTCALL_KW(encode_table),
    FASTCALL_KW(decode_table),
    FASTCALL_KW(encode_array),
    FASTCALL_KW(decode_array),
    {"split_frames", (PyCFunction)(void (*)(void))split_frames, METH_FASTCALL, split_frames_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "ojs_codec._speedups",
    "C versions of the codec's hot path; see codec/ojs_codec/_accel.py.  Each function gives exactly\n"
    "the bytes, values and exceptions of its pure-Python counterpart.",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

/* getattr(module, name) as a new reference stored in *out. */
static int
attr(PyObject *module, const char *name, PyObject **out)
{
    *out = PyObject_GetAttrString(module, name);
    return *out == NULL ? -1 : 0;
}

/* Find the slot offsets of BasicProperties' fields, and check they are the 14 fields in
 * the order this file assumes (else the import fails and the pure-Python code runs). */
static int
load_fields(void)
{
    PyObject *fields = PyObject_GetAttrString(BasicProperties, "__struct_fields__");
    if (fields == NULL) {
        return -1;
    }
    int rc = -1;
    if (!PyTuple_Check(fields) || PyTuple_GET_SIZE(fields) != N_FIELDS) {
        goto mismatch;
    }
    for (int i = 0; i < N_FIELDS; i++) {
        PyObject *name = PyTuple_GET_ITEM(fields, i);
        if (!PyUnicode_Check(name) || PyUnicode_CompareWithASCIIString(name, FIELD_NAMES[i]) != 0) {
            goto mismatch;
        }
        PyObject *descr = PyDict_GetItemWithError(((PyTypeObject *)BasicProperties)->tp_dict, name);
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            goto mismatch;
        }
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type != T_OBJECT_EX) {
            goto mismatch;
        }
        field_offsets[i] = member->offset;
        field_names[i] = Py_NewRef(name);
    }
    rc = 0;
    goto done;
mismatch:
    if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ImportError, "ojs_codec._speedups does not match ojs_codec._properties.BasicProperties");
    }
done:
    Py_DECREF(fields);
    return rc;
}

PyMODINIT_FUNC
PyInit__speedups(void)
{
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL) {
        return NULL;
    }
    PyObject *errors = NULL, *table = NULL, *properties = NULL, *abc = NULL, *decimal = NULL;
    PyObject *t_len = NULL, *depth = NULL, *module = NULL;
    if ((errors = PyImport_ImportModule("ojs_codec._errors")) == NULL ||
        (table = PyImport_ImportModule("ojs_codec._table")) == NULL ||
        (properties = PyImport_ImportModule("ojs_codec._properties")) == NULL ||
        (abc = PyImport_ImportModule("collections.abc")) == NULL ||
        (decimal = PyImport_ImportModule("decimal")) == NULL) {
        goto done;
    }
    if (attr(errors, "UsageError", &UsageError) < 0 || attr(table, "_syntax", &py_syntax) < 0 ||
        attr(table, "_encode_value", &py_encode_value) < 0 || attr(table, "Int32", &Int32_type) < 0 ||
        (str_value = PyUnicode_InternFromString("value")) == NULL ||
        attr(table, "encode_table_into", &py_encode_table_into) < 0 ||
        attr(table, "timestamp_seconds", &py_timestamp_seconds) < 0 ||
        attr(table, "decode_timestamp", &py_decode_timestamp) < 0 ||
        attr(table, "_DEC_CONTEXT", &dec_context) < 0 || attr(table, "_T_LEN", &t_len) < 0 ||
        attr(t_len, "pack", &py_t_len_pack) < 0 || attr(table, "MAX_DEPTH", &depth) < 0 ||
        attr(table, "NESTED_TOO_DEEP", &NESTED_TOO_DEEP) < 0 ||
        attr(table, "lenient_timestamp", &py_lenient_timestamp) < 0 ||
        attr(table, "malformed_reason", &py_malformed_reason) < 0 ||
        attr(properties, "BasicProperties", &BasicProperties) < 0 ||
        attr(properties, "EMPTY_PROPERTIES", &EMPTY_PROPERTIES) < 0 ||
        attr(properties, "_octet", &py_octet) < 0 ||
        attr(properties, "_short_cache_get", &py_short_cache_get) < 0 ||
        attr(properties, "cached_short_string", &py_cached_short_string) < 0 ||
        attr(properties, "encode_short_string", &py_encode_short_string) < 0 ||
        attr(abc, "Mapping", &Mapping) < 0 || attr(decimal, "Decimal", &Decimal) < 0) {
        goto done;
    }
    MAX_DEPTH = PyLong_AsLong(depth);
    if ((MAX_DEPTH == -1 && PyErr_Occurred()) || !PyType_Check(BasicProperties) || load_fields() < 0) {
        goto done;
    }
    if ((str_scaleb = PyUnicode_InternFromString("scaleb")) == NULL) {
        goto done;
    }
    module = PyModule_Create(&module_def);
done:
    Py_XDECREF(errors);
    Py_XDECREF(table);
    Py_XDECREF(properties);
    Py_XDECREF(abc);
    Py_XDECREF(decimal);
    Py_XDECREF(t_len);
    Py_XDECREF(depth);
    return module;
}
