/* The rows path (asymo/conv.h): a convolution through the pointwise path's pixel-row
 * micro-kernels, in their taps form (kernels/conv_pointwise.h), over the image read where it
 * is or over a zero-padded copy of it. */
#include "asymo/conv.h"
#include "asymo/isa.h"
#include "conv/padded_plane.h"
#include "kernels/conv_pointwise.h"

#include <stddef.h>

static inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* The image the taps are read from: x itself, or the padded copy at the start of scratch,
 * `rows` rows of `row` floats per channel (the rows and columns the windows span). */
typedef struct {
    int padded;
    int64_t rows, row, plane;
    int64_t copy_floats; /* the padded copy's floats in scratch (64-byte multiple), or 0 */
} image_layout;

static image_layout image_of(const asymo_conv_rows_job *job)
{
    const asymo_conv_geometry *g = &job->geom;
    const int64_t hp = (g->out_h - 1) * g->stride_h + g->kernel_h;
    const int64_t wp = (g->out_w - 1) * g->stride_w + g->kernel_w;
    image_layout L;
    L.padded = g->pad_h > 0 || g->pad_w > 0 || hp > g->height || wp > g->width;
    L.rows = L.padded ? hp : g->height;
    L.row = L.padded ? wp : g->width;
    L.plane = L.rows * L.row;
    L.copy_floats = L.padded ? cdiv(g->channels * L.plane, 16) * 16 : 0;
    return L;
}

static int64_t taps(const asymo_conv_rows_job *job)
{
    return job->geom.channels * job->geom.kernel_h * job->geom.kernel_w;
}

#if defined(__x86_64__)
/* The kernels for the job's stride and panel width, or NULL */
static const asymo_pixel_rows_family *family(const asymo_conv_rows_job *job)
{
    const int64_t s = job->geom.stride_h;
    return s == 1 || s == 2 ? asymo_pixel_rows_for((int)job->panel_rows, (int)s) : NULL;
}
#endif

int asymo_conv_rows_supported(const asymo_conv_rows_job *job)
{
#if defined(__x86_64__)
    const asymo_conv_geometry *g = &job->geom;
    return family(job) != NULL
           && g->stride_w == g->stride_h && g->dilation_h == 1 && g->dilation_w == 1
           && g->channels >= 1 && g->height >= 1 && g->width >= 1 && g->kernel_h >= 1
           && g->kernel_w >= 1 && g->pad_h >= 0 && g->pad_w >= 0 && g->out_h >= 1
           && g->out_w >= 1 && job->out_channels >= 1
           /* every window starts inside the padded image */
           && (g->out_h - 1) * g->stride_h < g->height + g->pad_h
           && (g->out_w - 1) * g->stride_w < g->width + g->pad_w;
#else
    (void)job;
    return 0;
#endif
}

int asymo_conv_rows_padded(const asymo_conv_rows_job *job) { return image_of(job).padded; }

int64_t asymo_conv_rows_plane(const asymo_conv_rows_job *job) { return image_of(job).plane; }

int64_t asymo_conv_rows_scratch(const asymo_conv_rows_job *job)
{
    /* the panels' part is never touched when apack is set */
    return image_of(job).copy_floats + cdiv(job->out_channels, job->panel_rows)
                                           * job->panel_rows * taps(job);
}

int64_t asymo_conv_rows_tiles(const asymo_conv_rows_job *job)
{
#if defined(__x86_64__)
    const asymo_pixel_rows_family *f = family(job);
    return f ? job->geom.out_h * cdiv(job->geom.out_w, f->max_rows) : 0;
#else
    (void)job;
    return 0;
#endif
}

#if defined(__x86_64__)
/* The layer over the image the taps are read from (x, or the padded copy in scratch): output
 * pixel (oy, ox) at oy * s rows and ox * s values into it, each row cut into the fewest tiles
 * of the family's rows (a tile's taps are a few lines of each channel, shared with the next
 * tile's). */
static asymo_pixel_rows_layer layer_of(const asymo_conv_rows_job *job,
                                       const asymo_pixel_rows_family *f)
{
    const asymo_conv_geometry *g = &job->geom;
    const image_layout I = image_of(job);
    const int64_t s = g->stride_h;
    const asymo_pixel_rows_layer L = {
        taps(job), job->out_channels, g->out_h, g->out_w, cdiv(g->out_w, f->max_rows),
        job->panels_per_task, job->tiles_per_task,
        I.padded ? (const float *)job->scratch : (const float *)job->x, s * I.row, s, 0,
        job->offsets,
        job->apack ? (const float *)job->apack : (const float *)job->scratch + I.copy_floats,
        (const float *)job->bias, (const float *)job->residual, (float *)job->y,
        job->activation};
    return L;
}
#endif

int64_t asymo_conv_rows_tasks(const asymo_conv_rows_job *job)
{
#if defined(__x86_64__)
    const asymo_pixel_rows_family *f = family(job);
    if (f) {
        const asymo_pixel_rows_layer L = layer_of(job, f);
        return asymo_pixel_rows_tasks(f, &L);
    }
#endif
    (void)job;
    return 0;
}

/* How the padded copy is cut. With copy_bands, where the layer's tasks are bands of output
 * rows, every output channel (one group of panels, more than one of tiles), it goes by the
 * same bands: its task t copies every channel's rows from band t's first window row to band
 * t + 1's, so the worker that runs task t of both jobs reads the rows it wrote but for its
 * band's last kernel_h - stride (the next band's first ones). Else by channels,
 * copy_channels a task. */
typedef struct {
    int64_t tasks;         /* the copy's tasks (0: no copy) */
    int64_t bands;         /* the layer's bands, or 0: by channels */
    int64_t band_tiles;    /* tiles per band (tiles_per_task) */
    int64_t tiles_per_row;
} copy_split;

static copy_split split_of(const asymo_conv_rows_job *job)
{
    copy_split s = {0, 0, 1, 1};
    if (!image_of(job).padded)
        return s;
#if defined(__x86_64__)
    const asymo_pixel_rows_family *f = family(job);
    if (f && job->copy_bands) {
        const asymo_pixel_rows_layer L = layer_of(job, f);
        const int64_t ppt = max64(1, L.panels_per_task), tpt = max64(1, L.tiles_per_task);
        const int64_t tgroups = cdiv(L.out_h * L.tiles_per_row, tpt);
        if (cdiv(cdiv(L.m, f->cb), ppt) == 1 && tgroups > 1) {
            s.tasks = s.bands = tgroups;
            s.band_tiles = tpt;
            s.tiles_per_row = L.tiles_per_row;
            return s;
        }
    }
#endif
    s.tasks = cdiv(job->geom.channels, max64(1, job->copy_channels));
    return s;
}

/* The first padded row band b copies (b == bands: the end of the last) */
static int64_t band_row(const asymo_conv_rows_job *job, const copy_split *s, int64_t b)
{
    return b >= s->bands ? image_of(job).rows
                         : b * s->band_tiles / s->tiles_per_row * job->geom.stride_h;
}

int64_t asymo_conv_rows_prepare_tasks(const asymo_conv_rows_job *job)
{
    return split_of(job).tasks + (job->apack ? 0 : 1);
}

void asymo_conv_rows_offsets(const asymo_conv_rows_job *job, int64_t *off)
{
    const asymo_conv_geometry *g = &job->geom;
    const image_layout L = image_of(job);
    for (int64_t p = 0; p < taps(job); p++) {
        const int64_t kx = p % g->kernel_w, ky = p / g->kernel_w % g->kernel_h;
        const int64_t c = p / (g->kernel_w * g->kernel_h);
        off[p] = c * L.plane + ky * L.row + kx;
    }
}

/* Task t below the copy's tasks: band t of the padded copy's rows (split_of), or channels
 * [t * copy_channels, ...) of it; the next (when apack is NULL): the weights' micro-panels,
 * after the copy. */
void asymo_conv_rows_prepare_task(int64_t t, void *job_)
{
    const asymo_conv_rows_job *job = (const asymo_conv_rows_job *)job_;
    const asymo_conv_geometry *g = &job->geom;
    const image_layout L = image_of(job);
    float *scratch = (float *)job->scratch;
    const copy_split s = split_of(job);
    if (t >= s.tasks) {
        asymo_conv_pack_panels((const float *)job->weight, job->out_channels, taps(job),
                               job->panel_rows, scratch + L.copy_floats);
        return;
    }
    const int64_t cc = max64(1, job->copy_channels);
    const int64_t c0 = s.bands ? 0 : t * cc;
    const int64_t c1 = s.bands ? g->channels : min64(g->channels, c0 + cc);
    const int64_t r0 = s.bands ? band_row(job, &s, t) : 0;
    const int64_t r1 = s.bands ? band_row(job, &s, t + 1) : L.rows;
    if (r1 <= r0)
        return;
    for (int64_t c = c0; c < c1; c++)
        asymo_copy_plane_padded(scratch + c * L.plane + r0 * L.row, r1 - r0, L.row,
                                (const float *)job->x + c * g->height * g->width, g->height,
                                g->width, 1, r0 - g->pad_h, -g->pad_w);
}

/* Task t (asymo_pixel_rows_task: panels of output channels by tiles of output rows). */
void asymo_conv_rows_task(int64_t t, void *job_)
{
#if defined(__x86_64__)
    const asymo_conv_rows_job *job = (const asymo_conv_rows_job *)job_;
    /* (asymo_conv_rows_supported accepts a job only where family() has its kernels) */
    const asymo_pixel_rows_family *f = family(job);
    const asymo_pixel_rows_layer L = layer_of(job, f);
    asymo_pixel_rows_task(f, t, &L);
#else
    (void)t;
    (void)job_;
#endif
}
