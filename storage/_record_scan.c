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

   record_fields(blob, counts, sizes) -> bytes

     The same walk, reading every field of each record up to its headers: 8 native int64
     values per record, in this order: end (as record_ends), timestampDelta, offsetDelta,
     key position, key length, value position, value length, and the position after the
     value (where the header count is). Varints are zigzag-decoded; a negative length is a
     null field and takes no bytes. Raises ValueError for what record_ends refuses, and for a
     field or varint that runs past its record. fast_records.record_fields_numpy is the same
     function in numpy; tests check that the two agree.

   gather(blob, positions, lengths) -> (offsets, data)

     Copies the fields at positions (native int64 values, as a bytes-like object) of lengths
     (the same; negative: null, no bytes) out of blob, one after another: data holds them,
     offsets (native int32, one more than the fields) where each starts. The buffers of an
     Arrow binary array. Raises ValueError for a field outside blob or 2 GiB or more of data.

   check_records(section, count) -> None

     The walk of record_fields over one records section, headers included (a count that is
     not negative, keys that are not null, every header inside its record, the headers ending
     it); raises ValueError saying what is not well formed. The broker's check of a produced
     batch (storage/records.py's check_records, which has its Python twin).

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

/* The zigzag varint at *pos, which must end before end; advances *pos past it. */
static const char *read_varint(const uint8_t *blob, Py_ssize_t *pos, Py_ssize_t end,
                               int64_t *out) {
    uint64_t n = 0;
    int shift = 0;
    Py_ssize_t p = *pos;
    for (int j = 0;; j++) {
        if (j == VARINT_BYTES_MAX) {
            return "varint longer than 10 bytes";
        }
        if (p >= end) {
            return "varint past its record";
        }
        uint8_t b = blob[p++];
        if (shift == 63 && b > 1) {
            return "varint past 64 bits";
        }
        n |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            break;
        }
        shift += 7;
    }
    *pos = p;
    *out = (int64_t)((n >> 1) ^ (~(n & 1) + 1));
    return NULL;
}

/* A field of length bytes at *pos (negative: null, no bytes) inside the record; past it. */
static const char *skip_field(Py_ssize_t *pos, int64_t length, Py_ssize_t end) {
    if (length > (int64_t)(end - *pos)) {
        return "field past its record";
    }
    if (length > 0) {
        *pos += (Py_ssize_t)length;
    }
    return NULL;
}

/* The record at pos: its length varint, then that many bytes inside the section. Sets *body
   to where its attributes start and *end to where it ends. */
static const char *next_record(const uint8_t *blob, Py_ssize_t pos, Py_ssize_t section_end,
                               Py_ssize_t *body, Py_ssize_t *end) {
    int64_t length;
    const char *error = read_varint(blob, &pos, section_end, &length);
    if (error != NULL) {
        return error;
    }
    if (length <= 0) { /* a record is never empty */
        return "record length not positive";
    }
    if (length > (int64_t)(section_end - pos)) {
        return "record past its section";
    }
    *body = pos;
    *end = pos + (Py_ssize_t)length;
    return NULL;
}

/* Fills out[0 .. sum(counts)); returns NULL or the reason the framing is not well formed. */
static const char *scan(const uint8_t *blob, Py_ssize_t nsections, const Py_ssize_t *counts,
                        const Py_ssize_t *sizes, int64_t *out) {
    Py_ssize_t pos = 0;
    Py_ssize_t section_end = 0;
    Py_ssize_t k = 0;
    const char *error;
    for (Py_ssize_t s = 0; s < nsections; s++) {
        section_end += sizes[s]; /* the caller checked: sum(sizes) <= len(blob) */
        for (Py_ssize_t i = 0; i < counts[s]; i++) {
            Py_ssize_t body;
            if ((error = next_record(blob, pos, section_end, &body, &pos)) != NULL) {
                return error;
            }
            out[k++] = (int64_t)pos;
        }
        if (pos != section_end) {
            return "records do not end their section";
        }
    }
    return NULL;
}

#define FIELDS 8

/* The record at pos of a section ending at section_end: its FIELDS values into o (see
   record_fields); returns NULL or why it is not well formed. */
static const char *read_record(const uint8_t *blob, Py_ssize_t pos, Py_ssize_t section_end,
                               int64_t *o) {
    Py_ssize_t p, end;
    const char *error;
    if ((error = next_record(blob, pos, section_end, &p, &end)) != NULL) {
        return error;
    }
    p += 1; /* attributes: unused */
    if (p > end) {
        return "field past its record";
    }
    o[0] = (int64_t)end;
    if ((error = read_varint(blob, &p, end, &o[1])) != NULL ||  /* timestampDelta */
        (error = read_varint(blob, &p, end, &o[2])) != NULL ||  /* offsetDelta */
        (error = read_varint(blob, &p, end, &o[4])) != NULL) {  /* keyLength */
        return error;
    }
    o[3] = (int64_t)p;
    if ((error = skip_field(&p, o[4], end)) != NULL ||
        (error = read_varint(blob, &p, end, &o[6])) != NULL) { /* valueLength */
        return error;
    }
    o[5] = (int64_t)p;
    if ((error = skip_field(&p, o[6], end)) != NULL) {
        return error;
    }
    o[7] = (int64_t)p;
    return NULL;
}

/* Fills out[0 .. FIELDS * sum(counts)); returns NULL or why the input is not well formed. */
static const char *walk_fields(const uint8_t *blob, Py_ssize_t nsections, const Py_ssize_t *counts,
                               const Py_ssize_t *sizes, int64_t *out) {
    Py_ssize_t pos = 0;
    Py_ssize_t section_end = 0;
    const char *error;
    for (Py_ssize_t s = 0; s < nsections; s++) {
        section_end += sizes[s]; /* the caller checked: sum(sizes) <= len(blob) */
        for (Py_ssize_t i = 0; i < counts[s]; i++) {
            if ((error = read_record(blob, pos, section_end, out)) != NULL) {
                return error;
            }
            pos = (Py_ssize_t)out[0];
            out += FIELDS;
        }
        if (pos != section_end) {
            return "records do not end their section";
        }
    }
    return NULL;
}

typedef const char *(*Walker)(const uint8_t *, Py_ssize_t, const Py_ssize_t *, const Py_ssize_t *,
                              int64_t *);

/* Parses (blob, counts, sizes), checks them, and runs walk over them into per_record int64
   values for every record. */
static PyObject *walk_records(PyObject *args, Walker walk, Py_ssize_t per_record) {
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
    result = PyBytes_FromStringAndSize(NULL, total * per_record * (Py_ssize_t)sizeof(int64_t));
    if (result == NULL) {
        goto done;
    }
    const char *error;
    Py_BEGIN_ALLOW_THREADS;
    error = walk((const uint8_t *)blob.buf, nsections, counts, sizes,
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

static PyObject *record_ends(PyObject *self, PyObject *args) {
    (void)self;
    return walk_records(args, scan, 1);
}

static PyObject *record_fields(PyObject *self, PyObject *args) {
    (void)self;
    return walk_records(args, walk_fields, FIELDS);
}

static PyObject *gather(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer blob, positions, lengths;
    PyObject *offsets = NULL, *data = NULL, *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*", &blob, &positions, &lengths)) {
        return NULL;
    }
    Py_ssize_t n = positions.len / (Py_ssize_t)sizeof(int64_t);
    if (positions.len % (Py_ssize_t)sizeof(int64_t) || lengths.len != positions.len) {
        PyErr_SetString(PyExc_ValueError, "positions and lengths must be int64 of one size");
        goto done;
    }
    const int64_t *pos = (const int64_t *)positions.buf;
    const int64_t *len = (const int64_t *)lengths.buf;
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (len[i] <= 0) {
            continue;
        }
        if (pos[i] < 0 || pos[i] > (int64_t)blob.len || len[i] > (int64_t)blob.len - pos[i]) {
            PyErr_SetString(PyExc_ValueError, "field outside the buffer");
            goto done;
        }
        total += len[i];
        if (total > INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "2 GiB or more of fields");
            goto done;
        }
    }
    offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * (Py_ssize_t)sizeof(int32_t));
    data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (offsets == NULL || data == NULL) {
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    int32_t *off = (int32_t *)PyBytes_AS_STRING(offsets);
    char *out = PyBytes_AS_STRING(data);
    const char *src = (const char *)blob.buf;
    int32_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        off[i] = at;
        if (len[i] > 0) {
            memcpy(out + at, src + pos[i], (size_t)len[i]);
            at += (int32_t)len[i];
        }
    }
    off[n] = at;
    Py_END_ALLOW_THREADS;
    result = PyTuple_Pack(2, offsets, data);
done:
    Py_XDECREF(offsets);
    Py_XDECREF(data);
    PyBuffer_Release(&blob);
    PyBuffer_Release(&positions);
    PyBuffer_Release(&lengths);
    return result;
}

/* Why the count records of one records section are not well formed (NULL: they are): each
   record read as record_fields reads it (read_record), then its headers: a count that is not
   negative, keys that are not null, values null or inside the record, and the headers ending
   it. */
static const char *check_walk(const uint8_t *blob, Py_ssize_t size, Py_ssize_t count) {
    Py_ssize_t pos = 0;
    const char *error;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t fields[FIELDS], length, headers;
        if ((error = read_record(blob, pos, size, fields)) != NULL) {
            return error;
        }
        Py_ssize_t end = (Py_ssize_t)fields[0], p = (Py_ssize_t)fields[7];
        if ((error = read_varint(blob, &p, end, &headers)) != NULL) {
            return error;
        }
        if (headers < 0 || headers > (int64_t)(end - p)) { /* a header takes two bytes or more */
            return "header count out of range";
        }
        for (int64_t h = 0; h < headers; h++) {
            if ((error = read_varint(blob, &p, end, &length)) != NULL) {
                return error;
            }
            if (length < 0) {
                return "null header key";
            }
            if ((error = skip_field(&p, length, end)) != NULL ||
                (error = read_varint(blob, &p, end, &length)) != NULL ||
                (error = skip_field(&p, length, end)) != NULL) {
                return error;
            }
        }
        if (p != end) {
            return "bytes after the headers";
        }
        pos = end;
    }
    if (pos != size) {
        return "records do not end their section";
    }
    return NULL;
}

static PyObject *check_records(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer section;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "y*n", &section, &count)) {
        return NULL;
    }
    const char *error = NULL;
    if (count < 0 || count > section.len) { /* a record takes two bytes or more */
        error = "more records than the section holds";
    } else {
        Py_BEGIN_ALLOW_THREADS;
        error = check_walk((const uint8_t *)section.buf, section.len, count);
        Py_END_ALLOW_THREADS;
    }
    PyBuffer_Release(&section);
    if (error != NULL) {
        PyErr_SetString(PyExc_ValueError, error);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"check_records", check_records, METH_VARARGS,
     "check_records(section, count) -> None: ValueError unless count well-formed records fill "
     "the records section, headers included."},
    {"record_ends", record_ends, METH_VARARGS,
     "record_ends(blob, counts, sizes) -> bytes: the end of every record, as native int64."},
    {"record_fields", record_fields, METH_VARARGS,
     "record_fields(blob, counts, sizes) -> bytes: 8 native int64 fields of every record."},
    {"gather", gather, METH_VARARGS,
     "gather(blob, positions, lengths) -> (offsets, data): fields copied out, Arrow-style."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_record_scan",
    "The sequential step of the fast record decoder (see fast_records.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__record_scan(void) { return PyModule_Create(&module); }
