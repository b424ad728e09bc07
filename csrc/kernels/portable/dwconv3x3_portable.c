/* Direct 3x3 depthwise kernels for the baseline ISA (conv/dwconv3x3_impl.h), float and
 * double: what every architecture without a hand-written variant runs. */
#include "conv/dwconv3x3.h"

#include <stddef.h>

#define DW3_ATTR
#define DW3_T float
#define DW3_FN(name) name##_f32_portable
#include "conv/dwconv3x3_impl.h"
#undef DW3_FN
#undef DW3_T
#define DW3_T double
#define DW3_FN(name) name##_f64_portable
#include "conv/dwconv3x3_impl.h"
#undef DW3_FN
#undef DW3_T
#undef DW3_ATTR
