/* The one sequential step of raylog's fast record decoder (pipelines/fast_records.py), in C.

   record_ends(blob, counts, sizes) -> bytes

     blob    the records sections of several v2 batches, joined (any bytes-like object; only read)
     counts  list of int: recordsCount of each section
     sizes   list of int: byte size of each section, in blob order

   Returns the end position in blob of every record, sum(counts) native int64 values as bytes.
   A record is a zigzag varint length then that many bytes; this walks the lengths only.
   Raises ValueError when the framing is not well formed (a length that is not positive, a
   varint of more than 10 bytes or past 64 bits, a record past its section, a section not
   ended by its last record): the caller then runs the reference decoder, which reports the
   precise error. fast_records.record_ends_python is the same function in Python; tests check
   that the two agree on valid and corrupt input.

   Every byte is read at an index checked against its section's end (never past blob). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define VARINT_BYTES_MAX 10

static int read_sizes(PyObject *list, Py_ssize_t n, Py_ssize_t *out) {
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t v = PyLong_AsSsize_t(PyList_GET_ITEM(list, i));
        if (v == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (v < 0) {
            PyErr_SetString(PyExc_ValueError, "negative count or size");
            return -1;
        }
        out[i] = v;
    }
    return 0;
}

/* Fills out[0 .. sum(counts)); returns NULL or the reason the framing is not well formed. */
static const char *scan(const uint8_t *blob, Py_ssize_t nsections, const Py_ssize_t *counts,
                        const Py_ssize_t *sizes, int64_t *out) {
    Py_ssize_t pos = 0;
    Py_ssize_t section_end = 0;
    Py_ssize_t k = 0;
    for (Py_ssize_t s = 0; s < nsections; s++) {
        section_end += sizes[s]; /* the caller checked: sum(sizes) <= len(blob) */
        for (Py_ssize_t i = 0; i < counts[s]; i++) {
            uint64_t n = 0;
            int shift = 0;
            for (int j = 0;; j++) {
                if (j == VARINT_BYTES_MAX) {
                    return "varint longer than 10 bytes";
                }
                if (pos >= section_end) {
                    return "record past its section";
                }
                uint8_t b = blob[pos++];
                if (shift == 63 && b > 1) {
                    return "varint past 64 bits";
                }
                n |= (uint64_t)(b & 0x7F) << shift;
                if (b < 0x80) {
                    break;
                }
                shift += 7;
            }
            if ((n & 1) || n == 0) { /* zigzag: odd is negative; a record is never empty */
                return "record length not positive";
            }
            n >>= 1;
            if (n > (uint64_t)(section_end - pos)) {
                return "record past its section";
            }
            pos += (Py_ssize_t)n;
            out[k++] = (int64_t)pos;
        }
        if (pos != section_end) {
            return "records do not end their section";
        }
    }
    return NULL;
}

static PyObject *record_ends(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer blob;
    PyObject *counts_list, *sizes_list;
    PyObject *result = NULL;
    Py_ssize_t *counts = NULL, *sizes = NULL;
    if (!PyArg_ParseTuple(args, "y*O!O!", &blob, &PyList_Type, &counts_list, &PyList_Type,
                          &sizes_list)) {
        return NULL;
    }
    Py_ssize_t nsections = PyList_GET_SIZE(counts_list);
    if (PyList_GET_SIZE(sizes_list) != nsections) {
        PyErr_SetString(PyExc_ValueError, "counts and sizes differ in length");
        goto done;
    }
    counts = PyMem_New(Py_ssize_t, nsections + 1);
    sizes = PyMem_New(Py_ssize_t, nsections + 1);
    if (counts == NULL || sizes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (read_sizes(counts_list, nsections, counts) || read_sizes(sizes_list, nsections, sizes)) {
        goto done;
    }
    Py_ssize_t total = 0, bytes = 0;
    for (Py_ssize_t s = 0; s < nsections; s++) {
        /* A record takes at least 2 bytes, so more records than bytes is not well formed. */
        if (counts[s] > blob.len - total || sizes[s] > blob.len - bytes) {
            PyErr_SetString(PyExc_ValueError, "more records or bytes than the buffer holds");
            goto done;
        }
        total += counts[s];
        bytes += sizes[s];
    }
    result = PyBytes_FromStringAndSize(NULL, total * (Py_ssize_t)sizeof(int64_t));
    if (result == NULL) {
        goto done;
    }
    const char *error;
    Py_BEGIN_ALLOW_THREADS;
    error = scan((const uint8_t *)blob.buf, nsections, counts, sizes,
                 (int64_t *)PyBytes_AS_STRING(result));
    Py_END_ALLOW_THREADS;
    if (error != NULL) {
        PyErr_SetString(PyExc_ValueError, error);
        Py_CLEAR(result);
    }
done:
    PyMem_Free(counts);
    PyMem_Free(sizes);
    PyBuffer_Release(&blob);
    return result;
}

static PyMethodDef methods[] = {
    {"record_ends", record_ends, METH_VARARGS,
     "record_ends(blob, counts, sizes) -> bytes: the end of every record, as native int64."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_record_scan",
    "The sequential step of the fast record decoder (see fast_records.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__record_scan(void) { return PyModule_Create(&module); }
