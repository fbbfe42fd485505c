/* exl3tool.io._spans: the two per-span loops of the R7 read-ahead in C (issue 17).
 *
 * `validate` forks a worker that reads, for every layer shard, the 4-byte markers and the
 * F16/F32 vectors of each routed expert (checks/payload.py: `fact_reads`, `read_facts`). On a
 * GLM-5.2 checkpoint that is 57,600 spans in 75 shards; the worker ends last, and two Python loops
 * over those spans were most of its time:
 *
 *   fact_spans  the spans a shard's header lists, as `checks/payload._SPAN.findall` and its
 *               filter find them;
 *   gather      the spans' bytes read into one packed buffer, as `io/views.TensorReader.gather`
 *               packs them (the same bytes, the same positions);
 *   special     which F16/F32 vectors of that buffer hold a NaN/Inf word, as
 *               `checks/payload._scan_ints` finds them (numpy, which scans as fast, costs the
 *               worker ~0.1 s to import; Python integers take ~3 ms a MB).
 *
 * Each returns exactly what the Python code returns (tests/io/test_spans_native.py), or None
 * where it declines (an argument the Python code would treat differently, a size past its
 * limits); the caller then runs the Python code. Every read of the inputs is bounds-checked:
 * headers are hostile.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_DIGITS 15              /* `[0-9]{1,15}` of the pattern */
#define MAX_OFFSET (1LL << 62)     /* spans past this are declined (Python ints are unbounded) */
#define MAX_GATHER (1LL << 40)     /* bytes of one packed buffer, at most */
#define ALIGN 16                   /* a packed position keeps its begin's offset mod ALIGN */

/* ---- fact_spans ------------------------------------------------------------------------ */

static PyObject *dtype_names[3]; /* "I32", "F16", "F32", interned */

static const char KEY_DTYPE[] = "\"dtype\":\"";
static const char KEY_SHAPE[] = "\",\"shape\":[";
static const char KEY_OFFSETS[] = "],\"data_offsets\":[";

static int literal(const char *s, Py_ssize_t n, Py_ssize_t *p, const char *lit, Py_ssize_t len) {
    if (n - *p < len || memcmp(s + *p, lit, (size_t)len) != 0) {
        return 0;
    }
    *p += len;
    return 1;
}

#define LITERAL(s, n, p, lit) literal((s), (n), (p), (lit), (Py_ssize_t)(sizeof(lit) - 1))

/* 1-15 decimal digits (leading zeros allowed) then `stop`; the cursor ends past `stop`. */
static int digits_then(const char *s, Py_ssize_t n, Py_ssize_t *p, char stop, long long *out) {
    Py_ssize_t q = *p;
    long long v = 0;
    while (q < n && s[q] >= '0' && s[q] <= '9') {
        if (q - *p == MAX_DIGITS) {
            return 0; /* a 16th digit: no `,` or `]` can follow 1-15 of them */
        }
        v = v * 10 + (s[q] - '0');
        q++;
    }
    if (q == *p || q >= n || s[q] != stop) {
        return 0;
    }
    *out = v;
    *p = q + 1;
    return 1;
}

/* The pattern anchored at `q` (where KEY_DTYPE starts): its dtype index, offsets and end. */
static int match_at(const char *s, Py_ssize_t n, Py_ssize_t q, int *dtype, long long *begin,
                    long long *end, Py_ssize_t *after) {
    Py_ssize_t p = q;
    if (!LITERAL(s, n, &p, KEY_DTYPE) || n - p < 3) {
        return 0;
    }
    if (memcmp(s + p, "I32", 3) == 0) {
        *dtype = 0;
    } else if (memcmp(s + p, "F16", 3) == 0) {
        *dtype = 1;
    } else if (memcmp(s + p, "F32", 3) == 0) {
        *dtype = 2;
    } else {
        return 0;
    }
    p += 3;
    if (!LITERAL(s, n, &p, KEY_SHAPE)) {
        return 0;
    }
    while (p < n && ((s[p] >= '0' && s[p] <= '9') || s[p] == ',')) {
        p++;
    }
    if (!LITERAL(s, n, &p, KEY_OFFSETS) || !digits_then(s, n, &p, ',', begin) ||
        !digits_then(s, n, &p, ']', end)) {
        return 0;
    }
    *after = p;
    return 1;
}

/* The next KEY_DTYPE at or after `from`, or -1. */
static Py_ssize_t find_key(const char *s, Py_ssize_t n, Py_ssize_t from) {
    const Py_ssize_t len = (Py_ssize_t)(sizeof(KEY_DTYPE) - 1);
    while (n - from >= len) {
        const char *hit = memchr(s + from, '"', (size_t)(n - from - len + 1));
        if (hit == NULL) {
            return -1;
        }
        from = hit - s;
        if (memcmp(hit, KEY_DTYPE, (size_t)len) == 0) {
            return from;
        }
        from++;
    }
    return -1;
}

static int append_span(PyObject *spans, PyObject *dtypes, long long b, long long e, int dtype) {
    PyObject *pair = Py_BuildValue("(LL)", b, e);
    if (pair == NULL) {
        return -1;
    }
    int bad = PyList_Append(spans, pair) < 0 || PyList_Append(dtypes, dtype_names[dtype]) < 0;
    Py_DECREF(pair);
    return bad ? -1 : 0;
}

PyDoc_STRVAR(fact_spans_doc,
             "fact_spans(raw, room, max_vector) -> (spans, dtypes)\n\n"
             "The spans `checks.payload.fact_reads` keeps from the header `raw`: every match of "
             "its _SPAN pattern, in order, with 0 < end - begin <= max_vector, end <= room, and "
             "a 4-byte length or a dtype other than I32.");

static PyObject *fact_spans(PyObject *self, PyObject *args) {
    Py_buffer raw;
    PyObject *room_obj, *most_obj;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*O!O!", &raw, &PyLong_Type, &room_obj, &PyLong_Type, &most_obj)) {
        return NULL;
    }
    /* offsets are < 10^15: a bound past the long long range compares as its end */
    int o1 = 0, o2 = 0;
    long long room = PyLong_AsLongLongAndOverflow(room_obj, &o1);
    long long max_vector = PyLong_AsLongLongAndOverflow(most_obj, &o2);
    room = o1 > 0 ? LLONG_MAX : o1 < 0 ? LLONG_MIN : room;
    max_vector = o2 > 0 ? LLONG_MAX : o2 < 0 ? LLONG_MIN : max_vector;
    const char *s = raw.buf;
    Py_ssize_t n = raw.len;
    PyObject *spans = PyList_New(0);
    PyObject *dtypes = PyList_New(0);
    PyObject *out = NULL;
    if (spans == NULL || dtypes == NULL) {
        goto done;
    }
    Py_ssize_t p = 0;
    for (;;) {
        Py_ssize_t q = find_key(s, n, p);
        if (q < 0) {
            break;
        }
        int dtype;
        long long b, e;
        Py_ssize_t after;
        if (!match_at(s, n, q, &dtype, &b, &e, &after)) {
            p = q + 1; /* as the regex: the next start position */
            continue;
        }
        p = after; /* matches do not overlap */
        long long len = e - b; /* both < 10^15: no overflow */
        if (len > 0 && len <= max_vector && e <= room && (len == 4 || dtype != 0)) {
            if (append_span(spans, dtypes, b, e, dtype) < 0) {
                goto done;
            }
        }
    }
    out = PyTuple_Pack(2, spans, dtypes);
done:
    Py_XDECREF(spans);
    Py_XDECREF(dtypes);
    PyBuffer_Release(&raw);
    return out;
}

/* ---- gather ---------------------------------------------------------------------------- */

typedef struct {
    long long begin, end;
    Py_ssize_t index;
} Span;

static int by_span(const void *a, const void *b) {
    const Span *x = a, *y = b;
    if (x->begin != y->begin) {
        return x->begin < y->begin ? -1 : 1;
    }
    if (x->end != y->end) {
        return x->end < y->end ? -1 : 1;
    }
    return x->index < y->index ? -1 : (x->index > y->index); /* sorted() is stable */
}

/* Python's `a % ALIGN` (never negative). */
static long long mod_align(long long a) {
    long long r = a % ALIGN;
    return r < 0 ? r + ALIGN : r;
}

/* The spans as C values; 0 (declined, no error set) for anything but (int, int) pairs with
 * 0 <= begin <= end <= MAX_OFFSET; -1 with an error set. */
static int read_spans(PyObject *seq, Span *out, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) {
            return 0;
        }
        PyObject *pb = PyTuple_GET_ITEM(pair, 0), *pe = PyTuple_GET_ITEM(pair, 1);
        if (!PyLong_CheckExact(pb) || !PyLong_CheckExact(pe)) {
            return 0;
        }
        int ob = 0, oe = 0;
        long long b = PyLong_AsLongLongAndOverflow(pb, &ob);
        long long e = PyLong_AsLongLongAndOverflow(pe, &oe);
        if ((b == -1 || e == -1) && PyErr_Occurred()) {
            return -1;
        }
        if (ob || oe || b < 0 || e < b || e > MAX_OFFSET) {
            return 0;
        }
        out[i].begin = b;
        out[i].end = e;
        out[i].index = i;
    }
    return 1;
}

/* Fill buf[0:len) from fd at `offset`; 0 when the file gave fewer bytes (EOF, an error, or a
 * signal: the caller reads the run again from Python, which runs the signal's handler). */
static int read_fully(int fd, char *buf, long long len, long long offset) {
    while (len > 0) {
        ssize_t got = pread(fd, buf, (size_t)len, (off_t)offset);
        if (got <= 0) {
            return 0;
        }
        buf += got;
        len -= got;
        offset += got;
    }
    return 1;
}

PyDoc_STRVAR(gather_doc,
             "gather(fd, base, spans, gap) -> (data, pos, short) or None\n\n"
             "The packing of `io.views.TensorReader.gather`: spans [begin, end) of the data "
             "section at file offset `base` merged into runs (spans closer than `gap` share one), "
             "each run at a position with its begin's offset mod 16, read with pread into the "
             "zero-filled bytearray `data`; `pos[i]` is span i's position. `short` lists "
             "(file offset, length, position) of the runs the file did not fill, for the caller "
             "to read again (and report). None: declined, for the Python code.");

static PyObject *gather(PyObject *self, PyObject *args) {
    int fd;
    long long base, gap;
    PyObject *spans_obj;
    (void)self;
    if (!PyArg_ParseTuple(args, "iLOL", &fd, &base, &spans_obj, &gap)) {
        return NULL;
    }
    if (base < 0 || base > MAX_OFFSET || gap < 0 || gap > MAX_OFFSET) {
        Py_RETURN_NONE;
    }
    /* Python indexes `spans` (len, __getitem__, zip): only an exact list or tuple is read
     * the same way here; anything else (generator, set, dict, subclass) is Python's. */
    if (!PyList_CheckExact(spans_obj) && !PyTuple_CheckExact(spans_obj)) {
        Py_RETURN_NONE;
    }
    PyObject *seq = Py_NewRef(spans_obj);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Span *sp = PyMem_Malloc(sizeof(Span) * (size_t)(n ? n : 1));
    long long *run_begin = PyMem_Malloc(sizeof(long long) * (size_t)(n ? n : 1));
    long long *run_end = PyMem_Malloc(sizeof(long long) * (size_t)(n ? n : 1));
    long long *shift = PyMem_Malloc(sizeof(long long) * (size_t)(n ? n : 1));
    Py_ssize_t *run_of = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n ? n : 1));
    char *missed = PyMem_Calloc((size_t)(n ? n : 1), 1);
    PyObject *data = NULL, *pos = NULL, *shorts = NULL, *out = NULL;
    if (!sp || !run_begin || !run_end || !shift || !run_of || !missed) {
        PyErr_NoMemory();
        goto done;
    }
    int ok = read_spans(seq, sp, n);
    if (ok < 0) {
        goto done;
    }
    if (ok == 0) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    qsort(sp, (size_t)n, sizeof(Span), by_span);
    Py_ssize_t runs = 0;
    for (Py_ssize_t k = 0; k < n; k++) { /* begin >= 0: the first span opens a run */
        if (runs > 0 && sp[k].begin - run_end[runs - 1] <= gap) {
            if (sp[k].end > run_end[runs - 1]) {
                run_end[runs - 1] = sp[k].end;
            }
        } else {
            run_begin[runs] = sp[k].begin;
            run_end[runs] = sp[k].end;
            runs++;
        }
        run_of[sp[k].index] = runs - 1;
    }
    long long total = 0, at = 0;
    for (Py_ssize_t r = 0; r < runs; r++) {
        total += run_end[r] - run_begin[r] + ALIGN;
        if (total > MAX_GATHER) {
            out = Py_NewRef(Py_None);
            goto done;
        }
    }
    for (Py_ssize_t r = 0; r < runs; r++) {
        at += mod_align(run_begin[r] - at);
        shift[r] = at - run_begin[r];
        at += run_end[r] - run_begin[r];
    }
    data = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (data == NULL) {
        goto done;
    }
    char *buf = PyByteArray_AS_STRING(data);
    Py_BEGIN_ALLOW_THREADS /* `data` is ours alone until returned */
    long long filled = 0;  /* bytes of buf set so far: the pads between runs are zeroed */
    for (Py_ssize_t r = 0; r < runs; r++) {
        long long start = run_begin[r] + shift[r], len = run_end[r] - run_begin[r];
        memset(buf + filled, 0, (size_t)(start - filled));
        if (len > 0 && !read_fully(fd, buf + start, len, base + run_begin[r])) {
            memset(buf + start, 0, (size_t)len);
            missed[r] = 1;
        }
        filled = start + len;
    }
    memset(buf + filled, 0, (size_t)(total - filled));
    Py_END_ALLOW_THREADS
    pos = PyList_New(n);
    shorts = PyList_New(0);
    if (pos == NULL || shorts == NULL) {
        goto done;
    }
    for (Py_ssize_t k = 0; k < n; k++) { /* from the values read, not the list (it may change) */
        Py_ssize_t i = sp[k].index;
        PyObject *v = PyLong_FromLongLong(sp[k].begin + shift[run_of[i]]);
        if (v == NULL) {
            goto done; /* a list with unset items is freed safely */
        }
        PyList_SET_ITEM(pos, i, v);
    }
    for (Py_ssize_t r = 0; r < runs; r++) {
        if (missed[r]) {
            PyObject *t = Py_BuildValue("(LLL)", base + run_begin[r], run_end[r] - run_begin[r],
                                        run_begin[r] + shift[r]);
            if (t == NULL || PyList_Append(shorts, t) < 0) {
                Py_XDECREF(t);
                goto done;
            }
            Py_DECREF(t);
        }
    }
    out = PyTuple_Pack(3, data, pos, shorts);
done:
    Py_XDECREF(data);
    Py_XDECREF(pos);
    Py_XDECREF(shorts);
    PyMem_Free(sp);
    PyMem_Free(run_begin);
    PyMem_Free(run_end);
    PyMem_Free(shift);
    PyMem_Free(run_of);
    PyMem_Free(missed);
    Py_DECREF(seq);
    return out;
}

/* ---- special --------------------------------------------------------------------------- */

/* Whether any of the `count` little-endian words of `size` bytes at `p` has every exponent
 * bit set (F16: 0x7C00, F32: 0x7F800000), read byte by byte (any alignment, any host). */
static int has_special(const unsigned char *p, Py_ssize_t count, int size) {
    if (size == 2) {
        for (Py_ssize_t k = 0; k < count; k++) {
            if ((p[2 * k + 1] & 0x7C) == 0x7C) {
                return 1;
            }
        }
        return 0;
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        if ((p[4 * k + 3] & 0x7F) == 0x7F && (p[4 * k + 2] & 0x80)) {
            return 1;
        }
    }
    return 0;
}

PyDoc_STRVAR(special_doc,
             "special(data, placed) -> list[int] or None\n\n"
             "The indices, ascending, of the vectors of `placed` ((dtype, nbytes, position) "
             "triples, dtype 'F16' or 'F32') whose payload in `data` holds a word with every "
             "exponent bit set: nbytes // size words from the position, as "
             "`checks.payload._has_nonfinite` tests them (`data`: a contiguous buffer, as the "
             "gather's bytearray; BufferError for any other). None: declined (a triple of another "
             "form, or a payload past the end of `data`), for the Python code.");

static PyObject *special(PyObject *self, PyObject *args) {
    Py_buffer view;
    PyObject *placed;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*O", &view, &placed)) {
        return NULL;
    }
    PyObject *out = NULL, *hits = NULL;
    if (!PyList_CheckExact(placed) && !PyTuple_CheckExact(placed)) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    hits = PyList_New(0);
    if (hits == NULL) {
        goto done;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(placed);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PySequence_Fast_GET_ITEM(placed, i);
        if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 3) {
            out = Py_NewRef(Py_None);
            goto done;
        }
        PyObject *d = PyTuple_GET_ITEM(t, 0), *pn = PyTuple_GET_ITEM(t, 1);
        PyObject *pp = PyTuple_GET_ITEM(t, 2);
        int size = 0;
        if (PyUnicode_CheckExact(d)) {
            size = PyUnicode_CompareWithASCIIString(d, "F16") == 0   ? 2
                   : PyUnicode_CompareWithASCIIString(d, "F32") == 0 ? 4
                                                                      : 0;
        }
        if (size == 0 || !PyLong_CheckExact(pn) || !PyLong_CheckExact(pp)) {
            out = Py_NewRef(Py_None);
            goto done;
        }
        int on = 0, op = 0;
        long long nbytes = PyLong_AsLongLongAndOverflow(pn, &on);
        long long pos = PyLong_AsLongLongAndOverflow(pp, &op);
        if ((nbytes == -1 || pos == -1) && PyErr_Occurred()) {
            goto done;
        }
        if (on || op || nbytes < 0 || pos < 0 || pos > view.len || nbytes > view.len - pos) {
            out = Py_NewRef(Py_None);
            goto done;
        }
        const unsigned char *at = (const unsigned char *)view.buf + pos;
        if (has_special(at, (Py_ssize_t)(nbytes / size), size)) {
            PyObject *v = PyLong_FromSsize_t(i);
            if (v == NULL || PyList_Append(hits, v) < 0) {
                Py_XDECREF(v);
                goto done;
            }
            Py_DECREF(v);
        }
    }
    out = Py_NewRef(hits);
done:
    Py_XDECREF(hits);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"fact_spans", fact_spans, METH_VARARGS, fact_spans_doc},
    {"gather", gather, METH_VARARGS, gather_doc},
    {"special", special, METH_VARARGS, special_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_spans",
    .m_doc = "The R7 read-ahead's per-span loops and NaN/Inf scan in C "
             "(see checks/payload.py, io/views.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__spans(void) {
    static const char *names[3] = {"I32", "F16", "F32"};
    for (int i = 0; i < 3; i++) {
        if (dtype_names[i] == NULL) {
            dtype_names[i] = PyUnicode_InternFromString(names[i]);
            if (dtype_names[i] == NULL) {
                return NULL;
            }
        }
    }
    return PyModule_Create(&module);
}
