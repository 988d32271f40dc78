/* sysmem: how much more memory this process may use, from what bounds it:
 * the kernel's MemAvailable, the cgroup's limit less its usage (v2 or v1, a
 * container's), and the address-space limit (ulimit -v) less what is
 * mapped. Read when a context sizes its defaults; owns no state. */
#ifndef TL_SYSMEM_H
#define TL_SYSMEM_H

#include <stddef.h>
#include <stdint.h>

/* The smallest of the bounds that exist, in bytes, and which one it is
 * ("MemAvailable", "cgroup memory limit", "ulimit -v"); 0 when none could
 * be read. $TL_MEM_AVAILABLE (bytes) replaces the measurement, for tests. */
uint64_t tl_sysmem_available(const char **source);

#endif
