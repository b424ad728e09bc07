/* Winograd F(m x m, 3 x 3) task body for the baseline ISA (conv/winograd_impl.h): on aarch64
 * each 8-float vector is two NEON q registers (Advanced SIMD is part of the base ISA). */
#define WINO_ATTR
#define WINO_SFX portable
#include "conv/winograd_impl.h"
