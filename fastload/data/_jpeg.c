/*
 * fastload.data._jpeg: decode only the pixels of a JPEG that a crop needs.
 *
 * A small CPython extension over libjpeg-turbo's libjpeg API (jpeglib.h, link -ljpeg).
 * For a region (x0, y0, x1, y1) of the image scaled by 1/denom it does what DALI's ROI
 * decoders do:
 *   - DCT-domain scaling (scale_num = 1, scale_denom in 1, 2, 4, 8): the IDCT itself
 *     makes the smaller image, far cheaper than decoding in full and resizing;
 *   - jpeg_crop_scanline: only the iMCU columns that cover [x0, x1) are IDCT'd and
 *     colour-converted (libjpeg widens to iMCU boundaries; we copy out just [x0, x1));
 *   - jpeg_skip_scanlines: the rows above y0 are entropy-decoded only (no IDCT, no
 *     colour conversion);
 *   - the rows below y1 are entropy-decoded only (skipped, then the last row read), and
 *     jpeg_finish_decompress reads on to EOI: the file is checked to its end, at a
 *     fraction of a full decode's cost (no IDCT, no colour conversion below the region).
 * Pixels go straight into the caller's buffer (row-major HWC RGB, exactly the region's
 * size), and the GIL is released around all libjpeg work so threads decode in parallel.
 *
 * Why C: no Python binding exposes jpeg_crop_scanline/jpeg_skip_scanlines. simplejpeg and
 * Pillow decode whole images; PyTurboJPEG 2.x needs libturbojpeg 3 (its partial-decode
 * API), which Debian 12 does not ship. FFCV and DALI also call libjpeg-turbo directly.
 *
 * NOTE [a clean decode or Pillow's verdict]
 * decode() returns pixels only for a file libjpeg reads from SOI to EOI without an error
 * *or a warning*, wherever in the file it is (above, inside or below the region). Any
 * libjpeg error or warning ("Premature end of JPEG file", "Corrupt JPEG data: ...", a
 * second scan where EOI belongs) is a ValueError: the caller (fastload.data.render) then
 * lets Pillow decode the whole file, and Pillow's verdict stands, pixels or error, as on
 * the torch engine. So a crop that misses the damage never decides whether a file is
 * corrupt, and both engines refuse the same files. header() reads the markers up to the
 * first scan and tolerates warnings (2 junk bytes before a DHT marker: Pillow decodes
 * those files); its errors make read_header ask Pillow. CMYK/YCCK JPEGs ->
 * UnsupportedError (a ValueError subclass): libjpeg cannot convert them to RGB, Pillow does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <jpeglib.h>

static PyObject *UnsupportedError;

enum status { OK = 0, JPEG_ERROR, UNSUPPORTED, BAD_ARGUMENT };
#define BATCH 16 /* rows per jpeg_read_scanlines call */

/* libjpeg reports errors by calling error_exit, which must not return: jump back. */
struct error_mgr {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int strict; /* warnings end the decode (decode), or are let pass (header) */
    char message[JMSG_LENGTH_MAX];
};

static void on_error(j_common_ptr cinfo) {
    struct error_mgr *err = (struct error_mgr *)cinfo->err;
    cinfo->err->format_message(cinfo, err->message);
    longjmp(err->jump, 1);
}

/* Ends the decode with our own message, like a libjpeg error. */
static void stop(j_decompress_ptr cinfo, const char *message) {
    struct error_mgr *err = (struct error_mgr *)cinfo->err;
    snprintf(err->message, sizeof err->message, "%s", message);
    longjmp(err->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    /* A warning: corrupt or truncated data that libjpeg would patch over. NOTE [a clean
     * decode or Pillow's verdict]: the decode stops, and Pillow decides. */
    if (level < 0 && ((struct error_mgr *)cinfo->err)->strict)
        on_error(cinfo);
    /* level >= 0: trace messages, silent; warnings while reading a header: let pass */
}

/* Everything a decode needs and reports, so the GIL-free part touches no Python object. */
struct job {
    const unsigned char *data;
    size_t size;
    unsigned char *out;
    size_t out_size;
    int denom, x0, y0, x1, y1;
    /* results */
    int width, height, components, colorspace;
    char message[JMSG_LENGTH_MAX + 160];
};

static enum status fail(struct job *job, enum status status, const char *message) {
    snprintf(job->message, sizeof job->message, "%s", message);
    return status;
}

/* Reads the header only (decode=0) or decodes job's region into job->out (decode=1). */
static enum status run(struct job *job, int decode) {
    struct jpeg_decompress_struct cinfo;
    struct error_mgr err;
    volatile enum status status = OK; /* volatile: set between setjmp and longjmp */
    JDIMENSION xoffset, width;
    JSAMPARRAY scratch, last;
    JSAMPROW rows[BATCH];
    JDIMENSION y, n, got, i;
    size_t skip, stride;

    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    err.strict = decode;
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        return fail(job, JPEG_ERROR, err.message);
    }
    jpeg_mem_src(&cinfo, job->data, (unsigned long)job->size);
    jpeg_read_header(&cinfo, TRUE);
    job->width = (int)cinfo.image_width;
    job->height = (int)cinfo.image_height;
    job->components = cinfo.num_components;
    job->colorspace = (int)cinfo.jpeg_color_space;
    if (!decode)
        goto done;
    if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
        status = fail(job, UNSUPPORTED, "CMYK/YCCK JPEG: libjpeg cannot convert it to RGB");
        goto done;
    }
    cinfo.out_color_space = JCS_RGB; /* grayscale becomes 3 equal channels */
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)job->denom;
    cinfo.dct_method = JDCT_ISLOW; /* the default, as Pillow: same pixels as Pillow */
    jpeg_calc_output_dimensions(&cinfo);
    if (job->x1 > (int)cinfo.output_width || job->y1 > (int)cinfo.output_height) {
        snprintf(job->message, sizeof job->message,
                 "region (%d, %d, %d, %d) is outside the %ux%u image (%dx%d at 1/%d)",
                 job->x0, job->y0, job->x1, job->y1, cinfo.output_width,
                 cinfo.output_height, job->width, job->height, job->denom);
        status = BAD_ARGUMENT;
        goto done;
    }
    jpeg_start_decompress(&cinfo);

    /* One more column each side than asked: fancy upsampling makes a column from its
     * neighbours' chroma, and treats the crop's edges as the image's edges. With the
     * margin the edge columns we return equal a full decode's. crop_scanline moves the
     * left edge down to an iMCU boundary and tells us where. */
    xoffset = (JDIMENSION)(job->x0 > 0 ? job->x0 - 1 : 0);
    width = (JDIMENSION)job->x1 + 1 - xoffset;
    if (width > cinfo.output_width - xoffset)
        width = cinfo.output_width - xoffset;
    if (width < cinfo.output_width)
        jpeg_crop_scanline(&cinfo, &xoffset, &width);
    if (job->y0 > 0 && jpeg_skip_scanlines(&cinfo, (JDIMENSION)job->y0) != (JDIMENSION)job->y0)
        stop(&cinfo, "could not skip to the region's first row");
    /* Full-width regions decode straight into out; narrower ones into scratch rows of the
     * widened width (freed with the decompressor), whose region columns are copied out. */
    skip = (size_t)(job->x0 - (int)xoffset) * 3;
    stride = (size_t)(job->x1 - job->x0) * 3;
    scratch = NULL;
    if (skip != 0 || width * 3 != stride)
        scratch = (*cinfo.mem->alloc_sarray)((j_common_ptr)&cinfo, JPOOL_IMAGE, width * 3, BATCH);
    for (y = 0; y < (JDIMENSION)(job->y1 - job->y0); y += got) {
        n = (JDIMENSION)(job->y1 - job->y0) - y;
        n = n < BATCH ? n : BATCH;
        for (i = 0; i < n; i++)
            rows[i] = scratch ? scratch[i] : job->out + (y + i) * stride;
        got = jpeg_read_scanlines(&cinfo, rows, n);
        if (got == 0)
            stop(&cinfo, "the image ended inside the region");
        for (i = 0; scratch && i < got; i++)
            memcpy(job->out + (y + i) * stride, scratch[i] + skip, stride);
    }
    /* NOTE [a clean decode or Pillow's verdict]: the rest of the file is read too, its
     * rows entropy-decoded only. Skipping to the very end would mark EOI reached without
     * reading a byte, so the rows below all but the last are skipped and the last one is
     * read (into a row of the decoder's pool); then finish reads on to EOI. */
    if (cinfo.output_scanline + 1 < cinfo.output_height)
        jpeg_skip_scanlines(&cinfo, cinfo.output_height - cinfo.output_scanline - 1);
    if (cinfo.output_scanline < cinfo.output_height) {
        last = (*cinfo.mem->alloc_sarray)((j_common_ptr)&cinfo, JPOOL_IMAGE, width * 3, 1);
        if (jpeg_read_scanlines(&cinfo, last, 1) != 1)
            stop(&cinfo, "the image ended in its last row");
    }
    jpeg_finish_decompress(&cinfo); /* to EOI: a second scan or data cut short stops it */
done:
    jpeg_abort_decompress(&cinfo); /* after finish: a no-op; after a header or a refusal: ends it */
    jpeg_destroy_decompress(&cinfo);
    return status;
}

static PyObject *raise_for(enum status status, const struct job *job) {
    PyObject *type = status == UNSUPPORTED ? UnsupportedError : PyExc_ValueError;
    if (status == JPEG_ERROR)
        PyErr_Format(type, "JPEG decode error: %s", job->message);
    else
        PyErr_SetString(type, job->message);
    return NULL;
}

static PyObject *header(PyObject *self, PyObject *args) {
    Py_buffer data;
    struct job job = {0};
    enum status status;
    if (!PyArg_ParseTuple(args, "y*:header", &data))
        return NULL;
    job.data = data.buf;
    job.size = (size_t)data.len;
    Py_BEGIN_ALLOW_THREADS
    status = run(&job, 0);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (status != OK)
        return raise_for(status, &job);
    return Py_BuildValue("(iiii)", job.width, job.height, job.components, job.colorspace);
}

static PyObject *decode(PyObject *self, PyObject *args) {
    Py_buffer data, out;
    struct job job = {0};
    enum status status = OK;
    PyObject *out_obj;
    if (!PyArg_ParseTuple(args, "y*Oi(iiii):decode", &data, &out_obj, &job.denom, &job.x0,
                          &job.y0, &job.x1, &job.y1))
        return NULL;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    job.data = data.buf;
    job.size = (size_t)data.len;
    job.out = out.buf;
    job.out_size = (size_t)out.len;
    if (job.denom != 1 && job.denom != 2 && job.denom != 4 && job.denom != 8) {
        status = fail(&job, BAD_ARGUMENT, "denom must be 1, 2, 4 or 8");
    } else if (job.x0 < 0 || job.y0 < 0 || job.x1 <= job.x0 || job.y1 <= job.y0) {
        snprintf(job.message, sizeof job.message,
                 "region (%d, %d, %d, %d) must have 0 <= x0 < x1 and 0 <= y0 < y1",
                 job.x0, job.y0, job.x1, job.y1);
        status = BAD_ARGUMENT;
    } else if (job.out_size != (size_t)(job.x1 - job.x0) * (size_t)(job.y1 - job.y0) * 3) {
        snprintf(job.message, sizeof job.message,
                 "out has %zu bytes; the %dx%d RGB region needs exactly %zu", job.out_size,
                 job.x1 - job.x0, job.y1 - job.y0,
                 (size_t)(job.x1 - job.x0) * (size_t)(job.y1 - job.y0) * 3);
        status = BAD_ARGUMENT;
    }
    if (status == OK) {
        Py_BEGIN_ALLOW_THREADS
        status = run(&job, 1);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&data);
    if (status != OK)
        return raise_for(status, &job);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"header", header, METH_VARARGS,
     "header(data) -> (width, height, components, jpeg_color_space)\n\n"
     "Reads only the JPEG header. jpeg_color_space is libjpeg's J_COLOR_SPACE code\n"
     "(1 grayscale, 2 RGB, 3 YCbCr, 4 CMYK, 5 YCCK)."},
    {"decode", decode, METH_VARARGS,
     "decode(data, out, denom, (x0, y0, x1, y1)) -> None\n\n"
     "Decodes the region [x0, x1) x [y0, y1) of the image scaled by 1/denom (denom in\n"
     "1, 2, 4, 8; scaled size ceil(width / denom) x ceil(height / denom)) as RGB into\n"
     "out, a writable C-contiguous buffer of exactly (y1-y0)*(x1-x0)*3 bytes (HWC).\n"
     "Raises ValueError for corrupt data or bad arguments, UnsupportedError for CMYK."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "fastload.data._jpeg",
    "Region decode of JPEGs over libjpeg-turbo (see fastload.data.decoders).", -1, methods,
};

PyMODINIT_FUNC PyInit__jpeg(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    UnsupportedError = PyErr_NewExceptionWithDoc(
        "fastload.data._jpeg.UnsupportedError",
        "libjpeg cannot decode this JPEG to RGB (CMYK/YCCK): use Pillow.",
        PyExc_ValueError, NULL);
    if (UnsupportedError == NULL || PyModule_AddObject(m, "UnsupportedError", UnsupportedError) < 0) {
        Py_XDECREF(UnsupportedError);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "LIBJPEG_VERSION", JPEG_LIB_VERSION);
    return m;
}
