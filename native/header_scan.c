/* exl3tool.io._header_scan: the compact safetensors header scan of io/safetensors.py in C.
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

static PyMethodDef methods[] = {
    {"scan_entries", scan_entries, METH_VARARGS, scan_entries_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_header_scan",
    .m_doc = "The compact safetensors header scan in C (see io/safetensors.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__header_scan(void) { return PyModule_Create(&module); }
