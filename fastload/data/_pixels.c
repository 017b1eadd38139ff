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
 *
 * affine_bilinear(): Pillow's Image.transform(size, AFFINE, matrix, BILINEAR, fillcolor) on an
 * RGB image (NOTE [a bilinear affine] in fastload.data.augment.affine), in Pillow's own 4 bytes
 * a pixel (RGBX). Pillow samples each output pixel through a filter called by pointer, all in
 * scalar doubles; this gathers a row's neighbours first, then runs the same double arithmetic
 * over the row in a loop the compiler vectorises: the same operations in the same order and
 * its truncation to uint8, so the same bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

static inline Py_ssize_t clip(Py_ssize_t i, Py_ssize_t n) { return i < 0 ? 0 : (i < n ? i : n - 1); }

/* One output row's samples: the 4 neighbours of each pixel (4 bytes each) and its fractions. */
typedef struct {
    double *ax, *ay;         /* a0 (x + 0.5), a3 (x + 0.5): the same products for every row */
    double *fx, *fy;         /* dx, dy per pixel */
    uint8_t *tl, *tr, *bl, *br; /* top-left ... bottom-right neighbour, 4 bytes per pixel */
} AffineRow;

enum { ROW_FLAT = 1, ROW_LEVEL = 2 }; /* every dy is 0 / every dx is 0 in the row */

/* Pillow's coordinates and bilinear head for output row y: xin = a0 X + a1 Y + a2 and
 * yin = a3 X + a4 Y + a5 (X = x + 0.5, Y = y + 0.5), the same products added in the same order;
 * outside [0, w) x [0, h) the fill (as all 4 neighbours, fractions 0: any blend gives it back);
 * inside, shifted by -0.5 and floored, the neighbours clipped to the edges (a missing row
 * below repeats the row above). Returns the ROW_ flags the row qualifies for. */
static int affine_gather(const uint8_t *src, Py_ssize_t h, Py_ssize_t w, const double *a,
                         const uint8_t *fill, Py_ssize_t y, AffineRow *r) {
    double yc = (double)y + 0.5, by = a[1] * yc, cy = a[4] * yc;
    int flags = ROW_FLAT | ROW_LEVEL;
    for (Py_ssize_t x = 0; x < w; x++) {
        double xin = r->ax[x] + by + a[2], yin = r->ay[x] + cy + a[5];
        uint8_t *tl = r->tl + 4 * x, *tr = r->tr + 4 * x, *bl = r->bl + 4 * x, *br = r->br + 4 * x;
        if (!(xin >= 0.0 && xin < (double)w && yin >= 0.0 && yin < (double)h)) {
            memcpy(tl, fill, 4);
            memcpy(tr, fill, 4);
            memcpy(bl, fill, 4);
            memcpy(br, fill, 4);
            r->fx[x] = r->fy[x] = 0.0;
            continue;
        }
        xin -= 0.5;
        yin -= 0.5;
        Py_ssize_t xi = xin < 0.0 ? -1 : (Py_ssize_t)xin; /* floor: both are >= -0.5 here */
        Py_ssize_t yi = yin < 0.0 ? -1 : (Py_ssize_t)yin;
        r->fx[x] = xin - (double)xi;
        r->fy[x] = yin - (double)yi;
        flags &= (r->fy[x] == 0.0 ? ROW_FLAT : 0) | (r->fx[x] == 0.0 ? ROW_LEVEL : 0);
        const uint8_t *top = src + clip(yi, h) * w * 4;
        const uint8_t *below = yi + 1 < h ? src + (yi + 1) * w * 4 : top;
        Py_ssize_t left = clip(xi, w) * 4, right = clip(xi + 1, w) * 4;
        memcpy(tl, top + left, 4);
        memcpy(tr, top + right, 4);
        memcpy(bl, below + left, 4);
        memcpy(br, below + right, 4);
    }
    return flags;
}

/* Pillow's bilinear body on a gathered row: a + (b - a) * d in double along x in both rows,
 * then along y, truncated to uint8; in loops without branches, which the compiler vectorises. */
static void blend_xy(const AffineRow *r, Py_ssize_t w, uint8_t *o) {
    const uint8_t *tl = r->tl, *tr = r->tr, *bl = r->bl, *br = r->br;
    for (Py_ssize_t x = 0; x < w; x++) {
        double dx = r->fx[x], dy = r->fy[x];
        for (int c = 0; c < 4; c++) {
            Py_ssize_t i = 4 * x + c;
            double v1 = tl[i] + (tr[i] - tl[i]) * dx, v2 = bl[i] + (br[i] - bl[i]) * dx;
            o[i] = (uint8_t)(int)(v1 + (v2 - v1) * dy);
        }
    }
}

/* A row where every dy is 0: v1 + (v2 - v1) * 0 is v1, so the y step is left out (same bytes;
 * ShearX and TranslateX give such rows). */
static void blend_x(const AffineRow *r, Py_ssize_t w, uint8_t *o) {
    const uint8_t *tl = r->tl, *tr = r->tr;
    for (Py_ssize_t x = 0; x < w; x++) {
        double dx = r->fx[x];
        for (int c = 0; c < 4; c++) {
            Py_ssize_t i = 4 * x + c;
            o[i] = (uint8_t)(int)(tl[i] + (tr[i] - tl[i]) * dx);
        }
    }
}

/* A row where every dx is 0: the x step gives the neighbours themselves (ShearY, TranslateY). */
static void blend_y(const AffineRow *r, Py_ssize_t w, uint8_t *o) {
    const uint8_t *tl = r->tl, *bl = r->bl;
    for (Py_ssize_t x = 0; x < w; x++) {
        double dy = r->fy[x];
        for (int c = 0; c < 4; c++) {
            Py_ssize_t i = 4 * x + c;
            o[i] = (uint8_t)(int)(tl[i] + (bl[i] - tl[i]) * dy);
        }
    }
}

/* The whole image, row by row, through one row's scratch (4 w doubles and 16 w bytes). */
static int affine_rgbx(const uint8_t *src, uint8_t *dst, Py_ssize_t h, Py_ssize_t w,
                       const double *a, const uint8_t *fill) {
    double *d = (double *)malloc(sizeof(double) * (size_t)(4 * w) + (size_t)(16 * w));
    if (d == NULL)
        return -1;
    AffineRow r = {d, d + w, d + 2 * w, d + 3 * w, NULL, NULL, NULL, NULL};
    r.tl = (uint8_t *)(d + 4 * w);
    r.tr = r.tl + 4 * w;
    r.bl = r.tr + 4 * w;
    r.br = r.bl + 4 * w;
    for (Py_ssize_t x = 0; x < w; x++) {
        double xc = (double)x + 0.5;
        r.ax[x] = a[0] * xc;
        r.ay[x] = a[3] * xc;
    }
    for (Py_ssize_t y = 0; y < h; y++) {
        int flags = affine_gather(src, h, w, a, fill, y, &r);
        uint8_t *o = dst + y * w * 4;
        if (flags & ROW_FLAT)
            blend_x(&r, w, o);
        else if (flags & ROW_LEVEL)
            blend_y(&r, w, o);
        else
            blend_xy(&r, w, o);
    }
    free(d);
    return 0;
}

static PyObject *affine_bilinear(PyObject *self, PyObject *args) {
    Py_buffer src, fill;
    PyObject *out_obj;
    Py_buffer out;
    Py_ssize_t h, w;
    double a[6];
    if (!PyArg_ParseTuple(args, "y*Onn(dddddd)y*:affine_bilinear", &src, &out_obj, &h, &w, &a[0], &a[1],
                          &a[2], &a[3], &a[4], &a[5], &fill))
        return NULL;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&fill);
        return NULL;
    }
    const char *problem = NULL;
    if (h < 1 || w < 1)
        problem = "the image must not be empty";
    else if (src.len != h * w * 4 || out.len != src.len)
        problem = "src and out must hold h x w x 4 bytes each";
    else if (fill.len != 4)
        problem = "fill must hold 4 bytes";
    for (int i = 0; i < 6 && problem == NULL; i++)
        if (!isfinite(a[i]))
            problem = "the matrix must be finite";
    if (problem == NULL) {
        const uint8_t *s = (const uint8_t *)src.buf, *f = (const uint8_t *)fill.buf;
        uint8_t *o = (uint8_t *)out.buf;
        int failed;
        Py_BEGIN_ALLOW_THREADS
        failed = affine_rgbx(s, o, h, w, a, f);
        Py_END_ALLOW_THREADS
        if (failed)
            problem = "out of memory";
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&src);
    PyBuffer_Release(&fill);
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
    {"affine_bilinear", affine_bilinear, METH_VARARGS,
     "affine_bilinear(src, out, h, w, matrix, fill) -> None\n\n"
     "Pillow's AFFINE transform with the BILINEAR filter of an RGB image (h x w pixels of 4 bytes,\n"
     "RGBX as Pillow keeps RGB: src) into out (the same size): out[y, x] samples src at\n"
     "(a0 X + a1 Y + a2, a3 X + a4 Y + a5) with X = x + 0.5, Y = y + 0.5; where that falls\n"
     "outside src, the 4 bytes of fill. matrix: 6 finite floats. ValueError on other sizes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "fastload.data._pixels",
    "fastload's pixel kernels: a float table, a separable blur, a bilinear affine.", -1, methods,
};

PyMODINIT_FUNC PyInit__pixels(void) { return PyModule_Create(&module); }
