/* Direct 3x3 stride-2 convolution of few input channels (asymo/conv.h): the job's checks and
 * its task, a block of output rows with every output channel (kernels/conv_direct.h). */
#include "asymo/conv.h"
#include "asymo/isa.h"
#include "kernels/conv_direct.h"

int asymo_conv_direct_supported(const asymo_conv_direct_job *job)
{
#if defined(__x86_64__)
    const asymo_conv_geometry *g = &job->geom;
    return (asymo_isa_supported() & (1u << ASYMO_ISA_AVX512)) && g->channels >= 1
           && g->channels <= ASYMO_DIRECT_MAX_CHANNELS && g->kernel_h == 3 && g->kernel_w == 3
           && g->stride_h == 2 && g->stride_w == 2 && g->dilation_h == 1 && g->dilation_w == 1
           && g->pad_h >= 0 && g->pad_h < 3 && g->pad_w >= 0 && g->pad_w < 3 && g->height >= 1
           && g->width >= 1 && g->out_h >= 1 && g->out_w >= 1 && job->out_channels >= 1
           && (job->activation == ASYMO_ACT_NONE || job->activation == ASYMO_ACT_RELU
               || job->activation == ASYMO_ACT_RELU6);
#else
    (void)job;
    return 0;
#endif
}

void asymo_conv_direct_task(int64_t task, void *job_)
{
#if defined(__x86_64__)
    const asymo_conv_direct_job *job = (const asymo_conv_direct_job *)job_;
    /* (a job whose rows per task were left at zero runs a row a task) */
    const int64_t rows = job->rows_per_task > 0 ? job->rows_per_task : 1;
    const int64_t oy0 = task * rows;
    const int64_t oy1 = oy0 + rows < job->geom.out_h ? oy0 + rows : job->geom.out_h;
    asymo_conv_direct3x3s2_f32_avx512(job, oy0, oy1);
#else
    (void)task;
    (void)job_;
#endif
}
