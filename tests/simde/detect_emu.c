/* tests/simde/detect_emu: reports AVX-512 VNNI whatever the CPU, for the
 * emulated build only (dispatch.c's own detector is renamed away there). */
#include "cpu/kernels.h"

tl_cpu_level tl_cpu_detect(void) { return TL_CPU_AVX512VNNI; }
