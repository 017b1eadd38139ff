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
 *
 * blur(): torchvision's GaussianBlur on uint8 pixels as two 1-D passes (NOTE [a separable
 * blur] in fastload.data.augment.blur). torchvision convolves with the full 2-D kernel
 * (23 x 23 = 529 multiply-adds a pixel for SimCLR's blur, about 27 ms for a 224x224 image);
 * the Gaussian is the outer product of the two 1-D kernels, so a row pass then a column pass
 * give the same sums with 2 x 23. Reflect padding and round-half-to-even as torchvision's;
 * the float sums are added in another order, so a pixel may differ by 1.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static inline Py_ssize_t reflect(Py_ssize_t i, Py_ssize_t n) {
    if (i < 0)
        return -i;
    if (i >= n)
        return 2 * n - 2 - i;
    return i;
}

/* One channel: src[y * sy + x * sx] -> dst (same strides), through tmp (h * w floats) and
 * row (w + kx - 1 floats). */
static void blur_plane(const uint8_t *src, uint8_t *dst, Py_ssize_t h, Py_ssize_t w,
                       Py_ssize_t sy, Py_ssize_t sx, const float *kx, int nx, const float *ky,
                       int ny, float *tmp, float *row) {
    int rx = nx / 2, ry = ny / 2;
    for (Py_ssize_t y = 0; y < h; y++) {
        const uint8_t *line = src + y * sy;
        for (Py_ssize_t i = 0; i < w + 2 * rx; i++)
            row[i] = (float)line[reflect(i - rx, w) * sx];
        float *out = tmp + y * w;
        for (Py_ssize_t x = 0; x < w; x++)
            out[x] = 0.0f;
        for (int k = 0; k < nx; k++) {
            float weight = kx[k];
            const float *in = row + k;
            for (Py_ssize_t x = 0; x < w; x++)
                out[x] += weight * in[x];
        }
    }
    for (Py_ssize_t y = 0; y < h; y++) {
        for (Py_ssize_t x = 0; x < w; x++)
            row[x] = 0.0f;
        for (int k = 0; k < ny; k++) {
            float weight = ky[k];
            const float *in = tmp + reflect(y + k - ry, h) * w;
            for (Py_ssize_t x = 0; x < w; x++)
                row[x] += weight * in[x];
        }
        uint8_t *line = dst + y * sy;
        for (Py_ssize_t x = 0; x < w; x++) {
            float v = nearbyintf(row[x]);
            line[x * sx] = (uint8_t)(v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v));
        }
    }
}

static PyObject *blur(PyObject *self, PyObject *args) {
    Py_buffer src, kx, ky;
    PyObject *out_obj;
    Py_buffer out;
    Py_ssize_t h, w;
    int channels, hwc;
    if (!PyArg_ParseTuple(args, "y*Oy*y*nnip:blur", &src, &out_obj, &kx, &ky, &h, &w, &channels, &hwc))
        return NULL;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&kx);
        PyBuffer_Release(&ky);
        return NULL;
    }
    const char *problem = NULL;
    int nx = (int)(kx.len / (Py_ssize_t)sizeof(float)), ny = (int)(ky.len / (Py_ssize_t)sizeof(float));
    if (channels < 1 || channels > 4 || h < 1 || w < 1)
        problem = "channels must be 1 to 4 and the image not empty";
    else if (src.len != h * w * channels || out.len != src.len)
        problem = "src and out must hold h x w x channels bytes each";
    else if (nx % 2 == 0 || ny % 2 == 0 || nx / 2 >= w || ny / 2 >= h)
        problem = "kernel sizes must be odd, with radii smaller than the image (reflect padding)";
    float *tmp = NULL, *row = NULL;
    if (problem == NULL) {
        tmp = (float *)malloc(sizeof(float) * (size_t)(h * w));
        row = (float *)malloc(sizeof(float) * (size_t)(w + nx + h + ny));
        if (tmp == NULL || row == NULL)
            problem = "out of memory";
    }
    if (problem == NULL) {
        const uint8_t *s = (const uint8_t *)src.buf;
        uint8_t *o = (uint8_t *)out.buf;
        Py_BEGIN_ALLOW_THREADS
        for (int c = 0; c < channels; c++) {
            if (hwc)
                blur_plane(s + c, o + c, h, w, w * channels, channels, kx.buf, nx, ky.buf, ny, tmp, row);
            else
                blur_plane(s + c * h * w, o + c * h * w, h, w, w, 1, kx.buf, nx, ky.buf, ny, tmp, row);
        }
        Py_END_ALLOW_THREADS
    }
    free(tmp);
    free(row);
    PyBuffer_Release(&out);
    PyBuffer_Release(&src);
    PyBuffer_Release(&kx);
    PyBuffer_Release(&ky);
    if (problem != NULL) {
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    Py_RETURN_NONE;
}

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
    {"blur", blur, METH_VARARGS,
     "blur(src, out, kx, ky, h, w, channels, hwc) -> None\n\n"
     "A Gaussian blur of uint8 pixels (HWC if hwc else CHW) into out (same size and layout):\n"
     "rows with the float32 kernel kx, then columns with ky (odd sizes, radii < w, h), reflect\n"
     "padding, rounded half to even. ValueError on other sizes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "fastload.data._pixels",
    "uint8 pixels to float32 through a per-channel table (NOTE [a float table]).", -1, methods,
};

PyMODINIT_FUNC PyInit__pixels(void) { return PyModule_Create(&module); }
