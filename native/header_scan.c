/* exl3tool.io._header_scan: the compact safetensors header scan of io/safetensors.py in C, and
 * the scan of a checkpoint's index by its weight_map's groups (io/index_scan.py; at the end).
 *
 * A GLM-5.2 checkpoint lists 176,812 tensors; `validate` spends ~0.33 s of its ~1.2 s building
 * their entries with regex groups in Python (issue 17). This module walks the same grammar once
 * and builds the same objects. What it accepts, the full checks accept without a finding and
 * read the same way (tests/io/test_header_scan_native.py); it takes every header the Python
 * scan takes, and a few more (the Python scan gives up where its 1 MiB chunks cut a name that
 * holds `]},`). Anything else returns None and the caller's other paths report every finding.
 *
 * One entry:  "NAME":{"dtype":"DT","shape":[INT,...],"data_offsets":[INT,INT]}
 * followed by `,` or, for the last one, the `}` that ends the header.
 *   NAME  any ASCII but `"`, `\`, `/`, 0x00-0x1f, 0x7f (possibly empty)
 *   DT    1-16 of A-Z 0-9 _
 *   INT   0 or 1-9 then at most 14 digits (< 10^15, no sign, no leading zero)
 * The text is a str whose characters are all ASCII (the caller tests it; one byte each).
 * Every read is bounds-checked against the text's length: the input is hostile.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <assert.h>
#include <stdint.h>
#include <string.h>

#define MAX_INT48 ((1LL << 48) - 1)
#define MAX_DIGITS 15
#define MAX_DTYPE 16
#define RECENT 8

typedef struct {
    const char *s;
    Py_ssize_t n;
    Py_ssize_t p;
    /* the kinds of the last entries (a projection's trellis, marker and vectors repeat): text
     * spans, and a strong reference to the kind (`kind_of` is arbitrary code: it, or a
     * destructor or `__eq__` it sets off, may remove or replace any item of `kinds`) */
    Py_ssize_t kind0[RECENT], kind1[RECENT];
    PyObject *kind[RECENT];
    int next; /* the slot the next new kind takes */
} Cursor;

static int expect(Cursor *c, const char *lit, Py_ssize_t len) {
    if (c->n - c->p < len || memcmp(c->s + c->p, lit, (size_t)len) != 0) {
        return 0;
    }
    c->p += len;
    return 1;
}

#define EXPECT(c, lit) expect((c), (lit), (Py_ssize_t)(sizeof(lit) - 1))

/* A JSON integer of the compact grammar into *out; 0 when there is none at the cursor. */
static int integer(Cursor *c, long long *out) {
    Py_ssize_t start = c->p;
    long long v = 0;
    if (c->p >= c->n || c->s[c->p] < '0' || c->s[c->p] > '9') {
        return 0;
    }
    if (c->s[c->p] == '0') {
        c->p++;
        *out = 0;
        return 1;
    }
    while (c->p < c->n && c->s[c->p] >= '0' && c->s[c->p] <= '9') {
        if (c->p - start == MAX_DIGITS) {
            return 0;
        }
        v = v * 10 + (c->s[c->p] - '0');
        c->p++;
    }
    *out = v;
    return 1;
}

static int name_char(unsigned char ch) {
    return ch >= 0x20 && ch != 0x7f && ch != '"' && ch != '\\' && ch != '/' && ch < 0x80;
}

static int dtype_char(unsigned char ch) {
    return (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
}

static int valid_kind(PyObject *kind) {
    if (!PyTuple_CheckExact(kind) || PyTuple_GET_SIZE(kind) != 3 ||
        !PyLong_Check(PyTuple_GET_ITEM(kind, 2))) {
        PyErr_SetString(PyExc_TypeError, "kind_of must return (dtype, shape, bits)");
        return 0;
    }
    return 1;
}

/* The (dtype, shape, bits) of one `DT","shape":[dims` text: from `kinds` (keyed by that text)
 * or from `kind_of(dtype, dims)`, whose answer is kept there. New reference (an exact 3-tuple
 * whose last item is an int, whatever `kinds` held); NULL on error. */
static PyObject *kind_for(PyObject *body, Py_ssize_t dt0, Py_ssize_t dt1, Py_ssize_t dims0,
                          Py_ssize_t dims1, PyObject *kinds, PyObject *kind_of) {
    PyObject *key = PyUnicode_Substring(body, dt0, dims1);
    if (key == NULL) {
        return NULL;
    }
    PyObject *kind = PyDict_GetItemWithError(kinds, key);  /* borrowed */
    if (kind != NULL) {
        Py_INCREF(kind);
        Py_DECREF(key);
        if (!valid_kind(kind)) {
            Py_DECREF(kind);
            return NULL;
        }
        return kind;
    }
    if (PyErr_Occurred()) {
        Py_DECREF(key);
        return NULL;
    }
    PyObject *dtype = PyUnicode_Substring(body, dt0, dt1);
    PyObject *dims = dtype ? PyUnicode_Substring(body, dims0, dims1) : NULL;
    PyObject *made = dims ? PyObject_CallFunctionObjArgs(kind_of, dtype, dims, NULL) : NULL;
    Py_XDECREF(dtype);
    Py_XDECREF(dims);
    if (made == NULL) {
        Py_DECREF(key);
        return NULL;
    }
    if (!valid_kind(made)) {
        Py_DECREF(made);
        Py_DECREF(key);
        return NULL;
    }
    int failed = PyDict_SetItem(kinds, key, made);
    Py_DECREF(key);
    if (failed) {
        Py_DECREF(made);
        return NULL;
    }
    return made;  /* ours: `kinds` may drop its reference at any time */
}

/* The payload bits of a kind as a C integer; -1 when no entry may have them (negative, or
 * beyond what 8 * (end - begin) of 15-digit offsets can reach). */
static long long kind_bits(PyObject *kind) {
    int overflow = 0;
    long long bits = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(kind, 2), &overflow);
    if (overflow || bits < 0) {
        return -1;
    }
    return bits;
}

/* One TensorInfo(name, dtype, shape, begin, end). New reference; NULL on error.
 *
 * Before 3.14 it is allocated and filled as `tuple.__new__(info_type, fields)` does it
 * (tuple_subtype_new: tp_alloc, then the items). From 3.14 a tuple also caches its hash, which
 * only the tuple code resets: there it goes through `tuple.__new__` itself. */
static PyObject *make_info(PyTypeObject *info_type, PyObject *name, PyObject *kind, long long b,
                           long long e) {
    PyObject *begin = PyLong_FromLongLong(b);
    PyObject *end = begin ? PyLong_FromLongLong(e) : NULL;
    if (end == NULL) {
        Py_XDECREF(begin);
        return NULL;
    }
    PyObject *dtype = PyTuple_GET_ITEM(kind, 0), *shape = PyTuple_GET_ITEM(kind, 1);
#if PY_VERSION_HEX < 0x030E0000
    PyObject *info = info_type->tp_alloc(info_type, 5);
    if (info == NULL) {
        Py_DECREF(begin);
        Py_DECREF(end);
        return NULL;
    }
    Py_INCREF(name);
    Py_INCREF(dtype);
    Py_INCREF(shape);
    PyTuple_SET_ITEM(info, 0, name);
    PyTuple_SET_ITEM(info, 1, dtype);
    PyTuple_SET_ITEM(info, 2, shape);
    PyTuple_SET_ITEM(info, 3, begin);  /* the references made above */
    PyTuple_SET_ITEM(info, 4, end);
    return info;
#else
    PyObject *fields = PyTuple_Pack(5, name, dtype, shape, begin, end);
    Py_DECREF(begin);
    Py_DECREF(end);
    PyObject *args = fields ? PyTuple_Pack(1, fields) : NULL;
    Py_XDECREF(fields);
    if (args == NULL) {
        return NULL;
    }
    PyObject *info = PyTuple_Type.tp_new(info_type, args, NULL);
    Py_DECREF(args);
    return info;
#endif
}

/* 1: one entry read and stored; 0: the text is not the compact grammar (or a name repeats);
 * -1: a Python error is set. `*last` tells whether it ended the header. */
static int one_entry(Cursor *c, PyObject *body, PyObject *out, PyObject *kinds,
                     PyObject *kind_of, PyTypeObject *info_type, int *last) {
    long long b, e, dim;
    if (!EXPECT(c, "\"")) {
        return 0;
    }
    Py_ssize_t name0 = c->p;
    while (c->p < c->n && name_char((unsigned char)c->s[c->p])) {
        c->p++;
    }
    Py_ssize_t name1 = c->p;
    if (!EXPECT(c, "\":{\"dtype\":\"")) {
        return 0;
    }
    Py_ssize_t dt0 = c->p;
    while (c->p < c->n && c->p - dt0 < MAX_DTYPE && dtype_char((unsigned char)c->s[c->p])) {
        c->p++;
    }
    Py_ssize_t dt1 = c->p;
    if (dt1 == dt0 || !EXPECT(c, "\",\"shape\":[")) {
        return 0;
    }
    Py_ssize_t dims0 = c->p;
    if (c->p < c->n && c->s[c->p] != ']') {
        do {
            if (!integer(c, &dim)) {
                return 0;
            }
        } while (EXPECT(c, ","));
    }
    Py_ssize_t dims1 = c->p;
    if (!EXPECT(c, "],\"data_offsets\":[") || !integer(c, &b) || !EXPECT(c, ",") ||
        !integer(c, &e) || !EXPECT(c, "]}")) {
        return 0;
    }
    if (c->p >= c->n || (c->s[c->p] != ',' && c->s[c->p] != '}')) {
        return 0;
    }
    *last = c->s[c->p] == '}';
    c->p++;
    if (*last != (c->p == c->n)) {  /* `}` ends the header; nothing may follow it */
        return 0;
    }
    if (e > MAX_INT48 || e < b) {
        return 0;
    }
    if (name1 - name0 == 12 && memcmp(c->s + name0, "__metadata__", 12) == 0) {
        return 0;
    }
    PyObject *kind = NULL;  /* borrowed from the cache, which holds a reference */
    for (int i = 0; i < RECENT && kind == NULL; i++) {
        if (c->kind[i] != NULL && c->kind1[i] - c->kind0[i] == dims1 - dt0 &&
            memcmp(c->s + c->kind0[i], c->s + dt0, (size_t)(dims1 - dt0)) == 0) {
            kind = c->kind[i];
        }
    }
    if (kind == NULL) {
        kind = kind_for(body, dt0, dt1, dims0, dims1, kinds, kind_of);
        if (kind == NULL) {
            return -1;
        }
        Py_XSETREF(c->kind[c->next], kind);  /* the cache takes kind_for's reference */
        c->kind0[c->next] = dt0;
        c->kind1[c->next] = dims1;
        c->next = (c->next + 1) % RECENT;
    }
    if ((e - b) * 8 != kind_bits(kind)) {
        return 0;
    }
    PyObject *name = PyUnicode_Substring(body, name0, name1);
    if (name == NULL) {
        return -1;
    }
    PyObject *info = make_info(info_type, name, kind, b, e);
    if (info == NULL) {
        Py_DECREF(name);
        return -1;
    }
    PyObject *held = PyDict_SetDefault(out, name, info);  /* borrowed */
    int ok = held == NULL ? -1 : held == info;
    Py_DECREF(name);
    Py_DECREF(info);
    return ok;
}

PyDoc_STRVAR(scan_entries_doc,
"scan_entries(text, pos, kinds, kind_of, info_type) -> dict | None\n\n"
"The entries of the ASCII header `text` from `pos` to its end as {name: info_type(name, dtype,\n"
"shape, begin, end)}; None unless they are the compact grammar, tile the rest of the text\n"
"exactly, end with `}`, name no tensor twice and each hold the bytes its dtype and shape need.\n"
"`kind_of(dtype, dims)` gives (dtype, shape, bits), kept in `kinds` by their text.");

static PyObject *scan_entries(PyObject *self, PyObject *args) {
    PyObject *text, *kinds, *kind_of;
    PyTypeObject *info_type;
    Py_ssize_t pos;
    (void)self;
    if (!PyArg_ParseTuple(args, "UnO!OO!:scan_entries", &text, &pos, &PyDict_Type, &kinds,
                          &kind_of, &PyType_Type, &info_type)) {
        return NULL;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(text) < 0) {
        return NULL;
    }
#endif
    if (!PyUnicode_IS_ASCII(text)) {
        PyErr_SetString(PyExc_ValueError, "text must be ASCII");
        return NULL;
    }
    if (!PyType_IsSubtype(info_type, &PyTuple_Type) ||
        info_type->tp_itemsize != PyTuple_Type.tp_itemsize ||
        info_type->tp_basicsize != PyTuple_Type.tp_basicsize) {
        PyErr_SetString(PyExc_TypeError, "info_type must be a tuple subclass without fields");
        return NULL;
    }
    Cursor c = {.s = (const char *)PyUnicode_DATA(text), .n = PyUnicode_GET_LENGTH(text), .p = pos};
    if (pos < 0 || pos >= c.n) {
        Py_RETURN_NONE;
    }
    PyObject *out = PyDict_New();
    if (out == NULL) {
        return NULL;
    }
    int last = 0, got = 1;
    while (!last && got > 0) {
        got = one_entry(&c, text, out, kinds, kind_of, info_type, &last);
    }
    for (int i = 0; i < RECENT; i++) {
        Py_XDECREF(c.kind[i]);
    }
    if (got <= 0) {
        Py_DECREF(out);
        if (got < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    return out;
}

/* ---- index_scan ------------------------------------------------------------------------ */

/* The index `model.safetensors.index.json` of a GLM-5.2 checkpoint is 16 MB naming 176,812
 * tensors; `json.loads` builds two strings and a dict slot for each (~0.1 s), and the loader
 * only compares them with the shards' headers. `index_scan` reads the same text once and gives,
 * per shard file, how many names the weight_map maps to it and the sum of their str hashes: the
 * loader compares those with each header's names (io/index_scan.py). */

typedef struct {
    const unsigned char *s;
    Py_ssize_t n;
    Py_ssize_t p;
} Text;

static void skip_ws(Text *t) {
    while (t->p < t->n) {
        unsigned char ch = t->s[t->p];
        if (ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r') {
            return;
        }
        t->p++;
    }
}

/* A string of ASCII from space to DEL, without escapes, at the cursor: [*b, *e) is its content
 * and the cursor ends past its closing quote; 0 when the text holds anything else there. */
static int plain_string(Text *t, Py_ssize_t *b, Py_ssize_t *e) {
    if (t->p >= t->n || t->s[t->p] != '"') {
        return 0;
    }
    Py_ssize_t q = t->p + 1;
    while (q < t->n) {
        unsigned char ch = t->s[q];
        if (ch == '"') {
            *b = t->p + 1;
            *e = q;
            t->p = q + 1;
            return 1;
        }
        if (ch < 0x20 || ch >= 0x80 || ch == '\\') {
            return 0;
        }
        q++;
    }
    return 0;
}

/* An object member's key at the cursor and the `:` after it: [*b, *e) is the key, the cursor
 * ends at its value; 0 when the text holds anything else there. */
static int member_key(Text *t, Py_ssize_t *b, Py_ssize_t *e) {
    if (!plain_string(t, b, e)) {
        return 0;
    }
    skip_ws(t);
    if (t->p >= t->n || t->s[t->p] != ':') {
        return 0;
    }
    t->p++;
    skip_ws(t);
    return 1;
}

/* After a member's value: 1 past the `}` that ends the object, 0 past the `,` before the next
 * member (and its blanks), -1 when the text holds anything else there. */
static int member_end(Text *t) {
    skip_ws(t);
    if (t->p >= t->n || (t->s[t->p] != '}' && t->s[t->p] != ',')) {
        return -1;
    }
    int last = t->s[t->p] == '}';
    t->p++;
    if (!last) {
        skip_ws(t);
    }
    return last;
}

/* Past one JSON value's extent at the cursor, found by its brackets and strings (the caller
 * parses that span strictly, which is what validates it); 0 when the text ends first or holds
 * a non-ASCII byte. */
static int skip_value(Text *t) {
    long long depth = 0;
    Py_ssize_t start = t->p;
    while (t->p < t->n) {
        unsigned char ch = t->s[t->p];
        if (ch >= 0x80) {
            return 0;
        }
        if (ch == '"') {
            t->p++;
            while (t->p < t->n && t->s[t->p] != '"') {
                if (t->s[t->p] >= 0x80) {
                    return 0;
                }
                t->p += t->s[t->p] == '\\' ? 2 : 1;
            }
            if (t->p >= t->n) {
                return 0;
            }
            t->p++;
            if (depth == 0) {
                return 1;
            }
            continue;
        }
        if (ch == '{' || ch == '[') {
            depth++;
        } else if (ch == '}' || ch == ']') {
            if (depth == 0) { /* a scalar ends here */
                return t->p > start;
            }
            if (--depth == 0) {
                t->p++;
                return 1;
            }
        } else if (depth == 0 && (ch == ',' || ch == ' ' || ch == '\t' || ch == '\n' ||
                                  ch == '\r')) {
            return t->p > start;
        }
        t->p++;
    }
    return depth == 0 && t->p > start;
}

typedef struct {
    Py_ssize_t count; /* names mapped to the file */
    uint64_t sum;     /* of their str hashes, mod 2**64 */
} Group;

typedef struct {
    Group *items;
    Py_ssize_t n, cap;
    PyObject *index; /* file name (str) -> its item's index: a dict, whose keyed hash no input
                      * can flood (an unkeyed table of our own could be: 2^17 names in one chain) */
} Groups;

/* The group of the file name [b, e) (ASCII); -1 with an error set. */
static Py_ssize_t group_of(Groups *g, const unsigned char *s, Py_ssize_t b, Py_ssize_t e) {
    PyObject *label = PyUnicode_DecodeASCII((const char *)s + b, e - b, NULL);
    if (label == NULL) {
        return -1;
    }
    PyObject *known = PyDict_GetItemWithError(g->index, label); /* borrowed */
    if (known != NULL) {
        Py_DECREF(label);
        return PyLong_AsSsize_t(known);
    }
    if (PyErr_Occurred()) {
        Py_DECREF(label);
        return -1;
    }
    if (g->n == g->cap) {
        Py_ssize_t cap = g->cap ? 2 * g->cap : 16;
        Group *items = PyMem_Realloc(g->items, sizeof(Group) * (size_t)cap);
        if (items == NULL) {
            Py_DECREF(label);
            PyErr_NoMemory();
            return -1;
        }
        g->items = items;
        g->cap = cap;
    }
    PyObject *at = PyLong_FromSsize_t(g->n);
    int failed = at == NULL || PyDict_SetItem(g->index, label, at) < 0;
    Py_XDECREF(at);
    Py_DECREF(label);
    if (failed) {
        return -1;
    }
    g->items[g->n].count = 0;
    g->items[g->n].sum = 0;
    return g->n++;
}

/* The weight_map object at the cursor into `g`; 1, 0 (not the plain form), -1 (error). */
static int weight_map(Text *t, Groups *g, Py_ssize_t *entries) {
    Py_ssize_t nb, ne, lb, le, last = -1, last_b = 0, last_e = 0;
    if (t->p >= t->n || t->s[t->p] != '{') {
        return 0;
    }
    t->p++;
    skip_ws(t);
    if (t->p < t->n && t->s[t->p] == '}') {
        t->p++;
        return 1;
    }
    for (;;) {
        if (!member_key(t, &nb, &ne) || !plain_string(t, &lb, &le)) {
            return 0;
        }
        /* a run of names of one file (the usual index) looks its group up once */
        if (last < 0 || last_e - last_b != le - lb ||
            memcmp(t->s + last_b, t->s + lb, (size_t)(le - lb)) != 0) {
            last = group_of(g, t->s, lb, le);
            if (last < 0) {
                return -1;
            }
            last_b = lb;
            last_e = le;
        }
        PyObject *name = PyUnicode_New(ne - nb, 127);
        if (name == NULL) {
            return -1;
        }
        memcpy(PyUnicode_DATA(name), t->s + nb, (size_t)(ne - nb));
        Py_hash_t h = PyObject_Hash(name);
        Py_DECREF(name);
        if (h == -1 && PyErr_Occurred()) {
            return -1;
        }
        g->items[last].count++;
        g->items[last].sum += (uint64_t)h;
        (*entries)++;
        int end = member_end(t);
        if (end != 0) {
            return end > 0;
        }
    }
}

PyDoc_STRVAR(index_scan_doc,
"index_scan(data) -> (meta_begin, meta_end, entries, groups) | None\n\n"
"The index document `data` (bytes) when it is an object of a `weight_map` and at most one\n"
"`metadata` member, whose weight_map keys and values are strings of ASCII from space to DEL\n"
"without escapes, and which holds no other byte past ASCII: `entries` weight_map members (repeats\n"
"counted), `groups` {file: (names mapped to it, sum of their str hashes mod 2**64)}, and the\n"
"span of the metadata value (-1, -1 when absent), found by its brackets only: the caller\n"
"parses it. None for any other text (the caller parses the whole document).");

static PyObject *index_scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*:index_scan", &view)) {
        return NULL;
    }
    Text t = {.s = view.buf, .n = view.len, .p = 0};
    Groups g = {.index = PyDict_New()};
    Py_ssize_t entries = 0, mb = -1, me = -1, kb, ke;
    int seen_map = 0, ok = 0;
    PyObject *out = NULL, *groups = NULL;
    if (g.index == NULL) {
        ok = -1;
        goto done;
    }
    skip_ws(&t);
    if (t.p >= t.n || t.s[t.p] != '{') {
        goto done;
    }
    t.p++;
    skip_ws(&t);
    for (;;) {
        if (!member_key(&t, &kb, &ke)) {
            goto done;
        }
        if (ke - kb == 10 && memcmp(t.s + kb, "weight_map", 10) == 0 && !seen_map) {
            seen_map = 1;
            int got = weight_map(&t, &g, &entries);
            if (got <= 0) {
                if (got < 0) {
                    ok = -1;
                }
                goto done;
            }
        } else if (ke - kb == 8 && memcmp(t.s + kb, "metadata", 8) == 0 && mb < 0) {
            mb = t.p;
            if (!skip_value(&t)) {
                goto done;
            }
            me = t.p;
        } else {
            goto done;
        }
        int end = member_end(&t);
        if (end < 0) {
            goto done;
        }
        if (end > 0) {
            break;
        }
    }
    skip_ws(&t);
    if (t.p != t.n || !seen_map) {
        goto done;
    }
    groups = PyDict_New();
    if (groups == NULL) {
        ok = -1;
        goto done;
    }
    PyObject *label, *at;
    Py_ssize_t pos = 0;
    while (PyDict_Next(g.index, &pos, &label, &at)) { /* in the order the files came */
        Group *x = &g.items[PyLong_AsSsize_t(at)];
        PyObject *value = Py_BuildValue("(nK)", x->count, (unsigned long long)x->sum);
        if (value == NULL || PyDict_SetItem(groups, label, value) < 0) {
            Py_XDECREF(value);
            ok = -1;
            goto done;
        }
        Py_DECREF(value);
    }
    out = Py_BuildValue("(nnnO)", mb, me, entries, groups);
    if (out == NULL) {
        ok = -1;
    }
done:
    Py_XDECREF(groups);
    PyMem_Free(g.items);
    Py_XDECREF(g.index);
    PyBuffer_Release(&view);
    if (out == NULL && ok == 0) {
        assert(!PyErr_Occurred()); /* declined, nothing raised */
        Py_RETURN_NONE;
    }
    return out;
}

static PyMethodDef methods[] = {
    {"scan_entries", scan_entries, METH_VARARGS, scan_entries_doc},
    {"index_scan", index_scan, METH_VARARGS, index_scan_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_header_scan",
    .m_doc = "The compact safetensors header and index scans in C (see io/safetensors.py, "
             "io/index_scan.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__header_scan(void) { return PyModule_Create(&module); }
