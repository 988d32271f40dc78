/* sysmem: the memory a process may still take (see sysmem.h). */
#include "base/sysmem.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* The first unsigned number in a file, or 0 ("max" and unreadable alike). */
static uint64_t read_u64(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    unsigned long long v = 0;
    if (fscanf(f, "%llu", &v) != 1) v = 0;
    fclose(f);
    return (uint64_t)v;
}

static uint64_t meminfo_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    uint64_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %" SCNu64 " kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

/* limit - usage of the cgroup at dir (v2 names, else v1's); 0 when it has
 * no limit (v1 writes one near 2^63 for none). */
static uint64_t cgroup_room(const char *dir) {
    char lim[512], use[512];
    snprintf(lim, sizeof lim, "%s/memory.max", dir);
    snprintf(use, sizeof use, "%s/memory.current", dir);
    uint64_t l = read_u64(lim), u = read_u64(use);
    if (!l) {
        snprintf(lim, sizeof lim, "%s/memory.limit_in_bytes", dir);
        snprintf(use, sizeof use, "%s/memory.usage_in_bytes", dir);
        l = read_u64(lim), u = read_u64(use);
    }
    if (!l || l >= ((uint64_t)1 << 60)) return 0;
    return l > u ? l - u : 1;
}

/* The process's own cgroup (its path in /proc/self/cgroup under the v2 or
 * v1 memory hierarchy), and the hierarchy's root as a container sees it. */
static uint64_t cgroup_available(void) {
    uint64_t best = 0;
    const char *roots[] = {"/sys/fs/cgroup", "/sys/fs/cgroup/memory"};
    FILE *f = fopen("/proc/self/cgroup", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        char *path = strrchr(line, ':');
        if (!path || (strncmp(line, "0::", 3) && !strstr(line, ":memory:"))) continue;
        path++;
        path[strcspn(path, "\n")] = 0;
        char dir[1024];
        snprintf(dir, sizeof dir, "%s%s", roots[strncmp(line, "0::", 3) != 0], path);
        const uint64_t r = cgroup_room(dir);
        if (r && (!best || r < best)) best = r;
    }
    if (f) fclose(f);
    for (int i = 0; i < 2; i++) {
        const uint64_t r = cgroup_room(roots[i]);
        if (r && (!best || r < best)) best = r;
    }
    return best;
}

/* RLIMIT_AS less the address space already mapped. */
static uint64_t as_available(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) || rl.rlim_cur == RLIM_INFINITY) return 0;
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long pages = 0;
    if (f) {
        if (fscanf(f, "%llu", &pages) != 1) pages = 0;
        fclose(f);
    }
    const uint64_t used = (uint64_t)pages * (uint64_t)sysconf(_SC_PAGESIZE);
    return (uint64_t)rl.rlim_cur > used ? (uint64_t)rl.rlim_cur - used : 1;
}

uint64_t tl_sysmem_available(const char **source) {
    const char *env = getenv("TL_MEM_AVAILABLE");
    if (env && *env) {
        if (source) *source = "TL_MEM_AVAILABLE";
        return strtoull(env, NULL, 10);
    }
    uint64_t best = meminfo_available();
    const char *src = "MemAvailable";
    const uint64_t cg = cgroup_available(), as = as_available();
    if (cg && (!best || cg < best)) best = cg, src = "the cgroup's memory limit";
    if (as && (!best || as < best)) best = as, src = "ulimit -v";
    if (source) *source = best ? src : "nothing";
    return best;
}
