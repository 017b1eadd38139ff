/*
 * fastload.data._pixels: uint8 pixels to float through a per-channel table, in one pass.
 *
 * A training recipe's "PILToTensor, ToDtype(float32, scale=True), Normalize(mean, std)" is a
 * pure function of each pixel's value and channel: 256 possible inputs per channel. torch
 * runs it as four passes over the image (to float, / 255, - mean, / std), each a new
 * 600 KB buffer for a 224x224 image. fastload computes the 3 x 256 results once with the
 * user's own steps (so they are the very floats torchvision gives: NOTE [a float table] in
 * fastload.data.float_table) and looks each pixel up here: one read of the uint8 image,
 * one write of the float image, with the GIL released so pixel threads run in parallel.
 * The input may be HWC (a PIL image's bytes) or CHW (a tensor); the output is CHW.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static PyObject *lookup(PyObject *self, PyObject *args) {
    Py_buffer src, table;
    PyObject *out_obj;
    Py_buffer out;
    int channels, hwc;
    if (!PyArg_ParseTuple(args, "y*Oy*ip:lookup", &src, &out_obj, &table, &channels, &hwc))
        return NULL;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&table);
        return NULL;
    }
    const char *problem = NULL;
    if (channels < 1 || channels > 4)
        problem = "channels must be 1 to 4";
    else if (src.len % channels != 0)
        problem = "src's size is not a multiple of channels";
    else if (out.len != src.len * (Py_ssize_t)sizeof(float))
        problem = "out must hold exactly one float32 per byte of src";
    else if (table.len != (Py_ssize_t)(channels * 256 * sizeof(float)))
        problem = "table must hold channels x 256 float32";
    if (problem == NULL) {
        const uint8_t *s = (const uint8_t *)src.buf;
        const float *t = (const float *)table.buf;
        float *o = (float *)out.buf;
        Py_ssize_t n = src.len / channels; /* pixels */
        Py_BEGIN_ALLOW_THREADS
        if (hwc) {
            for (int c = 0; c < channels; c++) {
                const float *tc = t + 256 * c;
                float *oc = o + n * c;
                const uint8_t *sc = s + c;
                for (Py_ssize_t i = 0; i < n; i++)
                    oc[i] = tc[sc[i * channels]];
            }
        } else {
            for (int c = 0; c < channels; c++) {
                const float *tc = t + 256 * c;
                const uint8_t *sc = s + n * c;
                float *oc = o + n * c;
                for (Py_ssize_t i = 0; i < n; i++)
                    oc[i] = tc[sc[i]];
            }
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&src);
    PyBuffer_Release(&table);
    if (problem != NULL) {
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"lookup", lookup, METH_VARARGS,
     "lookup(src, out, table, channels, hwc) -> None\n\n"
     "out[c, i] = table[c, src[pixel i, channel c]] for every pixel i and channel c.\n"
     "src: uint8 bytes, HWC if hwc else CHW; out: a writable C-contiguous float32 buffer of\n"
     "len(src) floats (CHW); table: channels x 256 float32. ValueError on other sizes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "fastload.data._pixels",
    "uint8 pixels to float32 through a per-channel table (NOTE [a float table]).", -1, methods,
};

PyMODINIT_FUNC PyInit__pixels(void) { return PyModule_Create(&module); }
