/* A fake of the NVIDIA Management Library (libnvidia-ml.so.1) for tests and benchmarks.
 *
 * It exports the real NVML ABI (function names, argument types, struct layouts from nvml.h, as
 * nvidia-ml-py's ctypes structs define them), so pynvml, gputop's NVML backend and nvitop load it
 * through LD_LIBRARY_PATH exactly as they load the real library. The GPUs and the processes holding
 * them (real PIDs) come from the file named by $FAKE_NVML_CONFIG, re-read whenever it changes.
 *
 * Config: one record per line, tab-separated key=value fields after a record kind ('#' comments):
 *   opt   driver=550.54.15  cuda=12040  nvml=12.550.54.15  init_error=DRIVER_NOT_LOADED
 *   gpu   name=..  uuid=..  pci=00000000:17:00.0  mem_total=BYTES  mem_used=BYTES|auto
 *         mem_reserved=BYTES  util=PCT|auto  mem_util=PCT  temp=C  power_mw=MW  power_limit_mw=MW
 *         fan=PCT  clock_sm=MHZ  clock_mem=MHZ  max_clock_sm=MHZ  max_clock_mem=MHZ  pstate=N
 *         lost=0|1|2 (1: calls on the device return GPU_IS_LOST; 2: getting its handle fails too)
 *         display=0|1 (nvmlDeviceGetDisplayActive: a display is initialised on it)
 *         display_mode=0|1 (nvmlDeviceGetDisplayMode; default 1: a headless H200 answers 1, seen 2026-12-04)
 *         errors=FIELD:CODE,FIELD:CODE (force an NVML error code for one field)
 *         minor=N (nvmlDeviceGetMinorNumber; absent: the device's index)
 *         mig=0|1 (MIG-capable, mode disabled|enabled; absent: not capable)  mig_pending=0|1
 *         mig_denied=1 (MIG on: the parent's process lists answer NO_PERMISSION, as to an unprivileged user)
 *         mig_procs_error=CODE (MIG handles' process lists answer CODE, as in vGPU host mode: NOT_SUPPORTED)
 *   mig   gpu=N  gi=ID  ci=ID  profile=1g.18gb  uuid=MIG-..  mem_total=BYTES  mem_used=BYTES|auto
 *         (one MIG device, a compute instance of a GPU instance, in MigDeviceHandleByIndex order)
 *   proc  gpu=N  pid=PID  mem=BYTES|na  type=C|G|C+G  sm=PCT|none  ghost=0|1  gi=ID  ci=ID
 * A numeric gpu field that is absent reads as NVML_ERROR_NOT_SUPPORTED. A holder whose PID has exited
 * (or is a zombie) is not listed (within 0.1 s), as the driver frees a dead process's contexts, unless
 * ghost=1 (a PID from another PID namespace, or memory the driver still holds).
 *
 * MIG, as nvml.h says: a MIG device handle answers its name ("<parent> MIG <profile>"), UUID, memory, process
 * lists and GPU/compute instance ids; utilisation (device and per process) is NOT_SUPPORTED on a MIG handle
 * and on a MIG-enabled parent, and so is every board-level field on a MIG handle. On a MIG-enabled parent the
 * process records carry gpuInstanceId/computeInstanceId (0xFFFFFFFF otherwise).
 * Environment: FAKE_NVML_CONFIG (the file; unset -> nvmlInit fails with DRIVER_NOT_LOADED),
 * FAKE_NVML_INIT_ERROR (a code or name: nvmlInit returns it).
 * Build variants: -DNO_V3 leaves out the _v3 process-list symbols; -DNO_V2 the _v2 ones and the other
 * newer calls (nvmlDeviceGetMemoryInfo_v2, nvmlDeviceGetTemperatureV), like an old driver. The
 * unversioned calls are always there.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NO_PERMISSION = 4, NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_INSUFFICIENT_SIZE = 7, NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9, NVML_ERROR_TIMEOUT = 10, NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12, NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14, NVML_ERROR_GPU_IS_LOST = 15, NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17, NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18, NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20, NVML_ERROR_NO_DATA = 21, NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

/* ---- structs, laid out as in nvml.h ---- */
typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;

typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t; /* nvmlProcessInfo_v2_t; the _v3 calls use the same layout */

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct { unsigned long long total, free, used; } nvmlBAR1Memory_t;

#define NOT_AVAILABLE_ULL 0xFFFFFFFFFFFFFFFFULL
#define NO_ID 0xFFFFFFFFu

/* ---- configuration ---- */
enum field {
    F_MEM_TOTAL, F_MEM_USED, F_MEM_RESERVED, F_UTIL, F_MEM_UTIL, F_TEMP, F_POWER, F_POWER_LIMIT, F_FAN,
    F_CLOCK_SM, F_CLOCK_MEM, F_MAX_CLOCK_SM, F_MAX_CLOCK_MEM, F_PSTATE,
    /* pseudo-fields: only for errors=, e.g. errors=procs:999 */
    F_NAME, F_UUID, F_PCI, F_MEMORY, F_UTILIZATION, F_PROCS, F_GRAPHICS_PROCS, F_PROC_UTIL, F_DISPLAY,
    F_INDEX, NFIELDS
};
static const char *field_names[NFIELDS] = {
    "mem_total", "mem_used", "mem_reserved", "util", "mem_util", "temp", "power_mw", "power_limit_mw",
    "fan", "clock_sm", "clock_mem", "max_clock_sm", "max_clock_mem", "pstate",
    "name", "uuid", "pci", "memory", "utilization", "procs", "graphics_procs", "proc_util", "display",
    "index",
};
#define NUMERIC_FIELDS F_NAME
#define AUTO_VALUE (-2LL)

#define MAXGPUS 64
#define CTX_C 1
#define CTX_G 2

struct gpu {
    char name[96], uuid[96], pci[32];
    long long f[NUMERIC_FIELDS];
    int has[NUMERIC_FIELDS];
    int err[NFIELDS];
    int lost, display, display_mode;
    int mig_capable, mig_mode, mig_pending, mig_denied, mig_procs_err;
    int has_minor;       /* minor=N: nvmlDeviceGetMinorNumber answers N; absent: the index */
    unsigned int minor;
};

/* One MIG device: compute instance ``ci`` of GPU instance ``gi`` on GPU ``gpu``. */
struct mig {
    int gpu;
    unsigned int gi, ci;
    char profile[32], uuid[96];
    long long mem_total, mem_used; /* mem_used AUTO_VALUE: the sum of its live holders' memory */
};
#define MAXMIG 256
#define MAX_MIG_PER_GPU 7 /* nvmlDeviceGetMaxMigDeviceCount on an A100/H100/H200 */

struct proc {
    int gpu;
    unsigned int pid;
    unsigned long long mem; /* NOT_AVAILABLE_ULL: not available (WDDM, MIG) */
    int ctx;                /* CTX_C | CTX_G */
    int sm;                 /* -1: no samples */
    int ghost;
    unsigned int gi, ci; /* NO_ID: not on a MIG instance */
};

struct config {
    int ngpus;
    struct gpu gpus[MAXGPUS];
    int nprocs;
    struct proc *procs;
    int nmigs;
    struct mig migs[MAXMIG];
    char driver[80], nvml[80];
    int cuda;
    int init_error;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct config *cfg;
static struct timespec cfg_mtime;
static ino_t cfg_ino;
static off_t cfg_size;
static int init_count;
static struct nvmlDevice_st { int index; } slots[MAXGPUS], mig_slots[MAXMIG];

static const struct { const char *name; int code; } error_names[] = {
    {"UNINITIALIZED", 1}, {"INVALID_ARGUMENT", 2}, {"NOT_SUPPORTED", 3}, {"NO_PERMISSION", 4},
    {"ALREADY_INITIALIZED", 5}, {"NOT_FOUND", 6}, {"INSUFFICIENT_SIZE", 7}, {"INSUFFICIENT_POWER", 8},
    {"DRIVER_NOT_LOADED", 9}, {"TIMEOUT", 10}, {"IRQ_ISSUE", 11}, {"LIBRARY_NOT_FOUND", 12},
    {"FUNCTION_NOT_FOUND", 13}, {"CORRUPTED_INFOROM", 14}, {"GPU_IS_LOST", 15}, {"RESET_REQUIRED", 16},
    {"OPERATING_SYSTEM", 17}, {"LIB_RM_VERSION_MISMATCH", 18}, {"IN_USE", 19}, {"MEMORY", 20},
    {"NO_DATA", 21}, {"ARGUMENT_VERSION_MISMATCH", 25}, {"UNKNOWN", 999},
};

static int parse_error_code(const char *s) {
    if (!s || !*s) return 0;
    if (isdigit((unsigned char)*s)) return atoi(s);
    if (strncmp(s, "NVML_ERROR_", 11) == 0) s += 11;
    for (size_t i = 0; i < sizeof error_names / sizeof *error_names; i++)
        if (strcasecmp(s, error_names[i].name) == 0) return error_names[i].code;
    return NVML_ERROR_UNKNOWN;
}

static void copy_str(char *dst, size_t n, const char *src) {
    snprintf(dst, n, "%s", src);
}

static int field_index(const char *key) {
    for (int i = 0; i < NFIELDS; i++)
        if (strcmp(key, field_names[i]) == 0) return i;
    return -1;
}

static void parse_gpu(struct config *c, char *rest) {
    if (c->ngpus >= MAXGPUS) return;
    int i = c->ngpus++;
    struct gpu *g = &c->gpus[i];
    memset(g, 0, sizeof *g);
    g->display_mode = 1; /* a headless data-centre GPU answers Enabled (a real H200, driver 580) */
    snprintf(g->name, sizeof g->name, "Fake GPU %d", i);
    snprintf(g->uuid, sizeof g->uuid, "GPU-fa4e0000-0000-4000-8000-%012d", i);
    snprintf(g->pci, sizeof g->pci, "00000000:%02X:00.0", 0x10 + i);
    char *save = NULL;
    for (char *tok = strtok_r(rest, "\t", &save); tok; tok = strtok_r(NULL, "\t", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) continue;
        *eq = 0;
        const char *k = tok, *v = eq + 1;
        if (strcmp(k, "name") == 0) copy_str(g->name, sizeof g->name, v);
        else if (strcmp(k, "uuid") == 0) copy_str(g->uuid, sizeof g->uuid, v);
        else if (strcmp(k, "pci") == 0) copy_str(g->pci, sizeof g->pci, v);
        else if (strcmp(k, "lost") == 0) g->lost = atoi(v);
        else if (strcmp(k, "display") == 0) g->display = atoi(v);
        else if (strcmp(k, "display_mode") == 0) g->display_mode = atoi(v);
        else if (strcmp(k, "mig") == 0) { g->mig_capable = 1; g->mig_mode = atoi(v); g->mig_pending = g->mig_mode; }
        else if (strcmp(k, "mig_pending") == 0) g->mig_pending = atoi(v);
        else if (strcmp(k, "mig_denied") == 0) g->mig_denied = atoi(v);
        else if (strcmp(k, "mig_procs_error") == 0) g->mig_procs_err = parse_error_code(v);
        else if (strcmp(k, "minor") == 0) { g->has_minor = 1; g->minor = (unsigned int)strtoul(v, NULL, 10); }
        else if (strcmp(k, "errors") == 0) {
            char buf[512];
            copy_str(buf, sizeof buf, v);
            char *s2 = NULL;
            for (char *e = strtok_r(buf, ",", &s2); e; e = strtok_r(NULL, ",", &s2)) {
                char *colon = strchr(e, ':');
                if (!colon) continue;
                *colon = 0;
                int fi = field_index(e);
                if (fi >= 0) g->err[fi] = parse_error_code(colon + 1);
            }
        } else {
            int fi = field_index(k);
            if (fi < 0 || fi >= NUMERIC_FIELDS) continue;
            g->has[fi] = 1;
            g->f[fi] = strcmp(v, "auto") == 0 ? AUTO_VALUE : strtoll(v, NULL, 10);
        }
    }
}

static void parse_proc(struct config *c, char *rest, int *cap) {
    struct proc p = {.gpu = 0, .pid = 0, .mem = NOT_AVAILABLE_ULL, .ctx = CTX_C, .sm = -1, .ghost = 0,
                     .gi = NO_ID, .ci = NO_ID};
    char *save = NULL;
    for (char *tok = strtok_r(rest, "\t", &save); tok; tok = strtok_r(NULL, "\t", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) continue;
        *eq = 0;
        const char *k = tok, *v = eq + 1;
        if (strcmp(k, "gpu") == 0) p.gpu = atoi(v);
        else if (strcmp(k, "pid") == 0) p.pid = (unsigned int)strtoul(v, NULL, 10);
        else if (strcmp(k, "mem") == 0)
            p.mem = (strcmp(v, "na") == 0) ? NOT_AVAILABLE_ULL : strtoull(v, NULL, 10);
        else if (strcmp(k, "type") == 0)
            p.ctx = strcmp(v, "C+G") == 0 ? (CTX_C | CTX_G) : strcmp(v, "G") == 0 ? CTX_G : CTX_C;
        else if (strcmp(k, "sm") == 0) p.sm = strcmp(v, "none") == 0 ? -1 : atoi(v);
        else if (strcmp(k, "ghost") == 0) p.ghost = atoi(v);
        else if (strcmp(k, "gi") == 0) p.gi = (unsigned int)strtoul(v, NULL, 10);
        else if (strcmp(k, "ci") == 0) p.ci = (unsigned int)strtoul(v, NULL, 10);
    }
    if (p.pid == 0) return;
    if (c->nprocs == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        c->procs = realloc(c->procs, (size_t)*cap * sizeof *c->procs);
    }
    c->procs[c->nprocs++] = p;
}

static void parse_mig(struct config *c, char *rest) {
    if (c->nmigs >= MAXMIG) return;
    struct mig *m = &c->migs[c->nmigs];
    memset(m, 0, sizeof *m);
    m->mem_used = AUTO_VALUE;
    m->mem_total = 10LL << 30;
    copy_str(m->profile, sizeof m->profile, "1g.10gb");
    char *save = NULL;
    for (char *tok = strtok_r(rest, "\t", &save); tok; tok = strtok_r(NULL, "\t", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) continue;
        *eq = 0;
        const char *k = tok, *v = eq + 1;
        if (strcmp(k, "gpu") == 0) m->gpu = atoi(v);
        else if (strcmp(k, "gi") == 0) m->gi = (unsigned int)strtoul(v, NULL, 10);
        else if (strcmp(k, "ci") == 0) m->ci = (unsigned int)strtoul(v, NULL, 10);
        else if (strcmp(k, "profile") == 0) copy_str(m->profile, sizeof m->profile, v);
        else if (strcmp(k, "uuid") == 0) copy_str(m->uuid, sizeof m->uuid, v);
        else if (strcmp(k, "mem_total") == 0) m->mem_total = strtoll(v, NULL, 10);
        else if (strcmp(k, "mem_used") == 0) m->mem_used = strcmp(v, "auto") == 0 ? AUTO_VALUE : strtoll(v, NULL, 10);
    }
    if (!m->uuid[0])
        snprintf(m->uuid, sizeof m->uuid, "MIG-fa4e%04x-%04x-4000-8000-%012u", m->gpu, c->nmigs, m->gi * 100 + m->ci);
    c->nmigs++;
}

static struct config *parse_config(FILE *f) {
    struct config *c = calloc(1, sizeof *c);
    int cap = 0;
    copy_str(c->driver, sizeof c->driver, "550.54.15");
    copy_str(c->nvml, sizeof c->nvml, "12.550.54.15");
    c->cuda = 12040;
    char *line = NULL;
    size_t n = 0;
    ssize_t len;
    while ((len = getline(&line, &n, f)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0 || line[0] == '#') continue;
        char *tab = strchr(line, '\t');
        char *rest = tab ? tab + 1 : line + len;
        if (tab) *tab = 0;
        if (strcmp(line, "gpu") == 0) parse_gpu(c, rest);
        else if (strcmp(line, "proc") == 0) parse_proc(c, rest, &cap);
        else if (strcmp(line, "mig") == 0) parse_mig(c, rest);
        else if (strcmp(line, "opt") == 0) {
            char *save = NULL;
            for (char *tok = strtok_r(rest, "\t", &save); tok; tok = strtok_r(NULL, "\t", &save)) {
                char *eq = strchr(tok, '=');
                if (!eq) continue;
                *eq = 0;
                if (strcmp(tok, "driver") == 0) copy_str(c->driver, sizeof c->driver, eq + 1);
                else if (strcmp(tok, "nvml") == 0) copy_str(c->nvml, sizeof c->nvml, eq + 1);
                else if (strcmp(tok, "cuda") == 0) c->cuda = atoi(eq + 1);
                else if (strcmp(tok, "init_error") == 0) c->init_error = parse_error_code(eq + 1);
            }
        }
    }
    free(line);
    return c;
}

static void free_config(struct config *c) {
    if (c) free(c->procs);
    free(c);
}

/* Re-read the config when the file changed (by mtime, inode or size). Called with the lock held.
 * Returns 0 when a config is loaded. A file that vanished keeps the last good config. */
static int reload(void) {
    const char *path = getenv("FAKE_NVML_CONFIG");
    if (!path || !*path) return -1;
    struct stat st;
    if (stat(path, &st) != 0) return cfg ? 0 : -1;
    if (cfg && st.st_mtim.tv_sec == cfg_mtime.tv_sec && st.st_mtim.tv_nsec == cfg_mtime.tv_nsec &&
        st.st_ino == cfg_ino && st.st_size == cfg_size)
        return 0;
    FILE *f = fopen(path, "r");
    if (!f) return cfg ? 0 : -1;
    struct config *c = parse_config(f);
    fclose(f);
    free_config(cfg);
    cfg = c;
    cfg_mtime = st.st_mtim;
    cfg_ino = st.st_ino;
    cfg_size = st.st_size;
    return 0;
}

/* Is the process alive (not exited, not a zombie)? */
static int pid_alive(unsigned int pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *rp = strrchr(buf, ')');
    if (!rp || rp[1] != ' ') return 1;
    return rp[2] != 'Z' && rp[2] != 'X';
}

/* The driver drops a dead process's contexts at once; the fake notices within LIVE_TTL_NS. The cache
 * keeps the fake's own cost (a /proc read per holder per call) out of what benchmarks measure. */
#define LIVE_TTL_NS 100000000LL
#define LIVE_SLOTS 16384
static struct { unsigned int pid; int alive; long long at; } live_cache[LIVE_SLOTS];

static long long mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int holder_live(const struct proc *p) {
    if (p->ghost) return 1;
    long long now = mono_ns();
    unsigned int slot = p->pid % LIVE_SLOTS;
    if (live_cache[slot].pid == p->pid && now - live_cache[slot].at < LIVE_TTL_NS) return live_cache[slot].alive;
    int alive = pid_alive(p->pid);
    live_cache[slot].pid = p->pid;
    live_cache[slot].alive = alive;
    live_cache[slot].at = now;
    return alive;
}

/* ---- entry/exit helpers ---- */
/* Every entry point runs under the lock and adds its time to spent_ns, which benchmarks read through
 * fakeNvmlSpentNs(): the library's own time, measured inside it (a Python wrapper around each call
 * would add its own overhead to the caller's share). */
static unsigned long long spent_ns;
#define LOCKED(expr)                           \
    do {                                       \
        long long t0_ = mono_ns();             \
        pthread_mutex_lock(&lock);             \
        nvmlReturn_t r_ = (expr);              \
        spent_ns += (unsigned long long)(mono_ns() - t0_); \
        pthread_mutex_unlock(&lock);           \
        return r_;                             \
    } while (0)

/* Not an NVML function: nanoseconds spent inside this library's entry points so far. */
API unsigned long long fakeNvmlSpentNs(void) {
    pthread_mutex_lock(&lock);
    unsigned long long v = spent_ns;
    pthread_mutex_unlock(&lock);
    return v;
}

static nvmlReturn_t ready(void) {
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    reload();
    return cfg ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

/* Resolve a handle; checks init, handle validity, a lost GPU and a forced error for ``field``. */
static nvmlReturn_t dev(nvmlDevice_t h, int field, struct gpu **out) {
    nvmlReturn_t r = ready();
    if (r) return r;
    if (h >= mig_slots && h < mig_slots + MAXMIG) { /* a board-level field asked of a MIG device */
        int m = (int)(h - mig_slots);
        if (m >= cfg->nmigs) return NVML_ERROR_INVALID_ARGUMENT;
        return cfg->gpus[cfg->migs[m].gpu].lost ? NVML_ERROR_GPU_IS_LOST : NVML_ERROR_NOT_SUPPORTED;
    }
    if (!h || h < slots || h >= slots + MAXGPUS) return NVML_ERROR_INVALID_ARGUMENT;
    int i = (int)(h - slots);
    if (i >= cfg->ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    struct gpu *g = &cfg->gpus[i];
    if (g->lost) return NVML_ERROR_GPU_IS_LOST;
    if (field >= 0 && g->err[field]) return g->err[field];
    *out = g;
    return NVML_SUCCESS;
}

/* A MIG device handle: its record and its parent GPU. NOT_A_MIG: ``h`` is not a MIG handle (a GPU's, or none). */
#define NOT_A_MIG (-1)
static nvmlReturn_t mig_dev(nvmlDevice_t h, struct mig **m, struct gpu **g) {
    if (!(h >= mig_slots && h < mig_slots + MAXMIG)) return NOT_A_MIG;
    nvmlReturn_t r = ready();
    if (r) return r;
    int i = (int)(h - mig_slots);
    if (i >= cfg->nmigs || cfg->migs[i].gpu < 0 || cfg->migs[i].gpu >= cfg->ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    *m = &cfg->migs[i];
    *g = &cfg->gpus[(*m)->gpu];
    return (*g)->lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
}

static int on_instance(const struct proc *p, const struct mig *m) {
    return !m || (p->gi == m->gi && p->ci == m->ci);
}

static unsigned long long mig_holders_memory(const struct mig *m) {
    unsigned long long sum = 0;
    for (int i = 0; i < cfg->nprocs; i++) {
        const struct proc *p = &cfg->procs[i];
        if (p->gpu == m->gpu && on_instance(p, m) && p->mem != NOT_AVAILABLE_ULL && holder_live(p)) sum += p->mem;
    }
    return sum;
}

static unsigned long long holders_memory(int gi) {
    unsigned long long sum = 0;
    for (int i = 0; i < cfg->nprocs; i++) {
        const struct proc *p = &cfg->procs[i];
        if (p->gpu == gi && p->mem != NOT_AVAILABLE_ULL && holder_live(p)) sum += p->mem;
    }
    return sum;
}

static unsigned int holders_sm(int gi) {
    long sum = 0;
    for (int i = 0; i < cfg->nprocs; i++) {
        const struct proc *p = &cfg->procs[i];
        if (p->gpu == gi && p->sm >= 0 && holder_live(p)) sum += p->sm;
    }
    return sum > 100 ? 100 : (unsigned int)sum;
}

static nvmlReturn_t get_num(nvmlDevice_t h, int field, unsigned int *out) {
    struct gpu *g;
    nvmlReturn_t r = dev(h, field, &g);
    if (r) return r;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->has[field]) return NVML_ERROR_NOT_SUPPORTED;
    long long v = g->f[field];
    if (v == AUTO_VALUE && field == F_UTIL) v = holders_sm((int)(h - slots));
    *out = (unsigned int)v;
    return NVML_SUCCESS;
}

static nvmlReturn_t put_str(char *buf, unsigned int len, const char *s) {
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

/* ---- init / system ---- */
static nvmlReturn_t do_init(void) {
    const char *forced = getenv("FAKE_NVML_INIT_ERROR");
    if (forced && *forced) return parse_error_code(forced);
    if (reload() != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    if (cfg->init_error) return cfg->init_error;
    init_count++;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInit_v2(void) { LOCKED(do_init()); }
API nvmlReturn_t nvmlInit(void) { LOCKED(do_init()); }
API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; LOCKED(do_init()); }

static nvmlReturn_t do_shutdown(void) {
    if (init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    init_count--;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlShutdown(void) { LOCKED(do_shutdown()); }

API const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t sys_driver(char *buf, unsigned int len) {
    nvmlReturn_t r = ready();
    return r ? r : put_str(buf, len, cfg->driver);
}
API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    LOCKED(sys_driver(version, length));
}

static nvmlReturn_t sys_nvml(char *buf, unsigned int len) {
    nvmlReturn_t r = ready();
    return r ? r : put_str(buf, len, cfg->nvml);
}
API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    LOCKED(sys_nvml(version, length));
}

static nvmlReturn_t sys_cuda(int *v) {
    nvmlReturn_t r = ready();
    if (r) return r;
    if (!v) return NVML_ERROR_INVALID_ARGUMENT;
    *v = cfg->cuda;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { LOCKED(sys_cuda(v)); }
API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { LOCKED(sys_cuda(v)); }

/* ---- devices ---- */
static nvmlReturn_t count(unsigned int *n) {
    nvmlReturn_t r = ready();
    if (r) return r;
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = (unsigned int)cfg->ngpus;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { LOCKED(count(n)); }
API nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { LOCKED(count(n)); }

static nvmlReturn_t by_index(unsigned int i, nvmlDevice_t *out) {
    nvmlReturn_t r = ready();
    if (r) return r;
    if (!out || i >= (unsigned int)cfg->ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    if (cfg->gpus[i].lost >= 2) return NVML_ERROR_GPU_IS_LOST;
    slots[i].index = (int)i;
    *out = &slots[i];
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *out) { LOCKED(by_index(i, out)); }
API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *out) { LOCKED(by_index(i, out)); }

static nvmlReturn_t by_string(const char *s, int which, nvmlDevice_t *out) {
    nvmlReturn_t r = ready();
    if (r) return r;
    if (!s || !out) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < cfg->ngpus; i++) {
        const char *v = which ? cfg->gpus[i].pci : cfg->gpus[i].uuid;
        if (strcasecmp(s, v) == 0) return by_index((unsigned int)i, out);
    }
    return NVML_ERROR_NOT_FOUND;
}
API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *out) { LOCKED(by_string(uuid, 0, out)); }
API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *id, nvmlDevice_t *out) { LOCKED(by_string(id, 1, out)); }
API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *id, nvmlDevice_t *out) { LOCKED(by_string(id, 1, out)); }

static nvmlReturn_t get_index(nvmlDevice_t h, unsigned int *out) {
    struct gpu *g;
    nvmlReturn_t r = dev(h, F_INDEX, &g);
    if (r) return r;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    *out = (unsigned int)(h - slots);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t h, unsigned int *out) { LOCKED(get_index(h, out)); }

static nvmlReturn_t get_name(nvmlDevice_t h, char *buf, unsigned int len) {
    struct gpu *g;
    struct mig *m;
    nvmlReturn_t r = mig_dev(h, &m, &g);
    if (r != NOT_A_MIG) { /* "NVIDIA H100 80GB HBM3 MIG 1g.10gb", as the driver names a MIG device */
        if (r) return r;
        char s[160];
        snprintf(s, sizeof s, "%s MIG %s", g->name, m->profile);
        return put_str(buf, len, s);
    }
    r = dev(h, F_NAME, &g);
    return r ? r : put_str(buf, len, g->name);
}
API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t h, char *buf, unsigned int len) { LOCKED(get_name(h, buf, len)); }

static nvmlReturn_t get_uuid(nvmlDevice_t h, char *buf, unsigned int len) {
    struct gpu *g;
    struct mig *m;
    nvmlReturn_t r = mig_dev(h, &m, &g);
    if (r != NOT_A_MIG) return r ? r : put_str(buf, len, m->uuid);
    r = dev(h, F_UUID, &g);
    return r ? r : put_str(buf, len, g->uuid);
}
API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *buf, unsigned int len) { LOCKED(get_uuid(h, buf, len)); }

static nvmlReturn_t get_serial(nvmlDevice_t h, char *buf, unsigned int len) {
    struct gpu *g;
    nvmlReturn_t r = dev(h, -1, &g);
    if (r) return r;
    char s[32];
    snprintf(s, sizeof s, "%013d", (int)(h - slots) + 1320000000);
    return put_str(buf, len, s);
}
API nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t h, char *buf, unsigned int len) { LOCKED(get_serial(h, buf, len)); }

static nvmlReturn_t get_pci(nvmlDevice_t h, nvmlPciInfo_t *p) {
    struct gpu *g;
    nvmlReturn_t r = dev(h, F_PCI, &g);
    if (r) return r;
    if (!p) return NVML_ERROR_INVALID_ARGUMENT;
    memset(p, 0, sizeof *p);
    unsigned int domain = 0, bus = 0, device = 0, function = 0;
    sscanf(g->pci, "%x:%x:%x.%x", &domain, &bus, &device, &function);
    p->domain = domain;
    p->bus = bus;
    p->device = device;
    p->pciDeviceId = 0x233010DE;
    p->pciSubSystemId = 0x16C110DE;
    copy_str(p->busId, sizeof p->busId, g->pci);
    /* the legacy field holds the short form "0000:17:00.0" */
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%04x:%02x:%02x.%x", domain & 0xffff, bus, device, function);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t h, nvmlPciInfo_t *p) { LOCKED(get_pci(h, p)); }
API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t h, nvmlPciInfo_t *p) { LOCKED(get_pci(h, p)); }
API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t h, nvmlPciInfo_t *p) { LOCKED(get_pci(h, p)); }

static nvmlReturn_t memory(nvmlDevice_t h, unsigned long long *total, unsigned long long *reserved,
                           unsigned long long *used) {
    struct gpu *g;
    struct mig *m;
    nvmlReturn_t r = mig_dev(h, &m, &g);
    if (r != NOT_A_MIG) { /* the instance's own memory */
        if (r) return r;
        *total = (unsigned long long)m->mem_total;
        *reserved = 0;
        *used = m->mem_used == AUTO_VALUE ? mig_holders_memory(m) : (unsigned long long)m->mem_used;
        if (*used > *total) *used = *total;
        return NVML_SUCCESS;
    }
    r = dev(h, F_MEMORY, &g);
    if (r) return r;
    if (!g->has[F_MEM_TOTAL]) return NVML_ERROR_NOT_SUPPORTED;
    *total = (unsigned long long)g->f[F_MEM_TOTAL];
    *reserved = g->has[F_MEM_RESERVED] ? (unsigned long long)g->f[F_MEM_RESERVED] : 0;
    if (!g->has[F_MEM_USED] || g->f[F_MEM_USED] == AUTO_VALUE)
        *used = holders_memory((int)(h - slots));
    else
        *used = (unsigned long long)g->f[F_MEM_USED];
    if (*used + *reserved > *total) *used = *total - *reserved;
    return NVML_SUCCESS;
}

static nvmlReturn_t mem_v1(nvmlDevice_t h, nvmlMemory_t *m) {
    unsigned long long total, reserved, used;
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = memory(h, &total, &reserved, &used);
    if (r) return r;
    m->total = total;
    m->used = used + reserved; /* v1 counts the reserved memory as used */
    m->free = total - m->used;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m) { LOCKED(mem_v1(h, m)); }

#ifndef NO_V2
static nvmlReturn_t mem_v2(nvmlDevice_t h, nvmlMemory_v2_t *m) {
    unsigned long long total, reserved, used;
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != NVML_MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlReturn_t r = memory(h, &total, &reserved, &used);
    if (r) return r;
    m->total = total;
    m->reserved = reserved;
    m->used = used;
    m->free = total - reserved - used;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t *m) { LOCKED(mem_v2(h, m)); }
#endif

static nvmlReturn_t bar1(nvmlDevice_t h, nvmlBAR1Memory_t *m) {
    struct gpu *g;
    struct mig *mi;
    nvmlReturn_t r = mig_dev(h, &mi, &g); /* a MIG device has its own BAR1 share, as nvidia-smi shows */
    if (r == NOT_A_MIG) r = dev(h, -1, &g);
    if (r) return r;
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    m->total = 256ULL << 20;
    m->used = 8ULL << 20;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t h, nvmlBAR1Memory_t *m) { LOCKED(bar1(h, m)); }

static nvmlReturn_t utilization(nvmlDevice_t h, nvmlUtilization_t *u) {
    struct gpu *g;
    nvmlReturn_t r = dev(h, F_UTILIZATION, &g);
    if (r) return r;
    if (!u) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->mig_mode) return NVML_ERROR_NOT_SUPPORTED; /* no GPU-wide utilisation with MIG on */
    unsigned int gpu, mem;
    if ((r = get_num(h, F_UTIL, &gpu)) || (r = get_num(h, F_MEM_UTIL, &mem))) return r;
    u->gpu = gpu;
    u->memory = mem;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t h, nvmlUtilization_t *u) { LOCKED(utilization(h, u)); }

static nvmlReturn_t temperature(nvmlDevice_t h, int sensor, unsigned int *t) {
    if (sensor != 0) {
        struct gpu *g;
        nvmlReturn_t r = dev(h, -1, &g);
        return r ? r : NVML_ERROR_INVALID_ARGUMENT;
    }
    return get_num(h, F_TEMP, t);
}
API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t h, int sensor, unsigned int *t) { LOCKED(temperature(h, sensor, t)); }

#ifndef NO_V2 /* an older driver has neither this nor nvmlDeviceGetMemoryInfo_v2 */
typedef struct { unsigned int version; int sensorType; int temperature; } nvmlTemperature_v1_t;
#define NVML_TEMPERATURE_V1 ((unsigned int)(sizeof(nvmlTemperature_v1_t) | (1u << 24)))
static nvmlReturn_t temperature_v(nvmlDevice_t h, nvmlTemperature_v1_t *t) {
    if (!t) return NVML_ERROR_INVALID_ARGUMENT;
    if (t->version != NVML_TEMPERATURE_V1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned int v;
    nvmlReturn_t r = temperature(h, t->sensorType, &v);
    if (r) return r;
    t->temperature = (int)v;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t h, nvmlTemperature_v1_t *t) { LOCKED(temperature_v(h, t)); }
#endif

API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t h, unsigned int *mw) { LOCKED(get_num(h, F_POWER, mw)); }
API nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t h, unsigned int *mw) { LOCKED(get_num(h, F_POWER_LIMIT, mw)); }
API nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t h, unsigned int *mw) { LOCKED(get_num(h, F_POWER_LIMIT, mw)); }
API nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t h, unsigned int *pct) { LOCKED(get_num(h, F_FAN, pct)); }

static nvmlReturn_t fan_v2(nvmlDevice_t h, unsigned int fan, unsigned int *pct) {
    if (fan != 0) {
        struct gpu *g;
        nvmlReturn_t r = dev(h, -1, &g);
        return r ? r : NVML_ERROR_INVALID_ARGUMENT;
    }
    return get_num(h, F_FAN, pct);
}
API nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t h, unsigned int fan, unsigned int *pct) { LOCKED(fan_v2(h, fan, pct)); }

static nvmlReturn_t num_fans(nvmlDevice_t h, unsigned int *n) {
    struct gpu *g;
    nvmlReturn_t r = dev(h, -1, &g);
    if (r) return r;
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = g->has[F_FAN] ? 1 : 0;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetNumFans(nvmlDevice_t h, unsigned int *n) { LOCKED(num_fans(h, n)); }

/* nvmlClockType_t: 0 GRAPHICS, 1 SM, 2 MEM, 3 VIDEO */
static nvmlReturn_t clock_info(nvmlDevice_t h, int type, unsigned int *mhz, int max) {
    int field;
    switch (type) {
    case 0: case 1: field = max ? F_MAX_CLOCK_SM : F_CLOCK_SM; break;
    case 2: field = max ? F_MAX_CLOCK_MEM : F_CLOCK_MEM; break;
    default: {
        struct gpu *g;
        nvmlReturn_t r = dev(h, -1, &g);
        return r ? r : NVML_ERROR_NOT_SUPPORTED;
    }
    }
    return get_num(h, field, mhz);
}
API nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t h, int type, unsigned int *mhz) { LOCKED(clock_info(h, type, mhz, 0)); }
API nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t h, int type, unsigned int *mhz) { LOCKED(clock_info(h, type, mhz, 1)); }

static nvmlReturn_t pstate(nvmlDevice_t h, int *p) {
    unsigned int v;
    nvmlReturn_t r = get_num(h, F_PSTATE, &v);
    if (r) return r;
    *p = (int)v;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t h, int *p) { LOCKED(pstate(h, p)); }
API nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t h, int *p) { LOCKED(pstate(h, p)); }

/* Active: a display is initialised on the GPU (an X server or console on it). Mode: whether one may be; a
 * headless H200 answered 1 (Enabled) with no display attached (nvidia-smi: "Disp.A Off"). */
static nvmlReturn_t display(nvmlDevice_t h, int *state, int mode) {
    struct gpu *g;
    nvmlReturn_t r = dev(h, F_DISPLAY, &g);
    if (r) return r;
    if (!state) return NVML_ERROR_INVALID_ARGUMENT;
    *state = mode ? (g->display_mode || g->display ? 1 : 0) : (g->display ? 1 : 0);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t h, int *state) { LOCKED(display(h, state, 0)); }
API nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t h, int *state) { LOCKED(display(h, state, 1)); }

static nvmlReturn_t const_state(nvmlDevice_t h, int *state, int value) {
    struct gpu *g;
    nvmlReturn_t r = dev(h, -1, &g);
    if (r) return r;
    if (!state) return NVML_ERROR_INVALID_ARGUMENT;
    *state = value;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t h, int *state) { LOCKED(const_state(h, state, 1)); }
API nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t h, int *mode) { LOCKED(const_state(h, mode, 0)); }

static nvmlReturn_t cuda_cc(nvmlDevice_t h, int *major, int *minor) {
    nvmlReturn_t r = const_state(h, major, 9);
    if (r) return r;
    return const_state(h, minor, 0);
}
API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t h, int *major, int *minor) { LOCKED(cuda_cc(h, major, minor)); }

static nvmlReturn_t codec_util(nvmlDevice_t h, unsigned int *util, unsigned int *period) {
    struct gpu *g;
    nvmlReturn_t r = dev(h, -1, &g);
    if (r) return r;
    if (!util || !period) return NVML_ERROR_INVALID_ARGUMENT;
    *util = 0;
    *period = 167000;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t h, unsigned int *u, unsigned int *p) { LOCKED(codec_util(h, u, p)); }
API nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t h, unsigned int *u, unsigned int *p) { LOCKED(codec_util(h, u, p)); }

static nvmlReturn_t not_supported(nvmlDevice_t h) {
    struct gpu *g;
    nvmlReturn_t r = dev(h, -1, &g);
    return r ? r : NVML_ERROR_NOT_SUPPORTED;
}
/* ---- MIG ---- */
static nvmlReturn_t mig_mode(nvmlDevice_t h, unsigned int *cur, unsigned int *pend) {
    struct gpu *g;
    nvmlReturn_t r = dev(h, -1, &g); /* a MIG handle: NOT_SUPPORTED */
    if (r) return r;
    if (!cur || !pend) return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    *cur = (unsigned int)g->mig_mode;
    *pend = (unsigned int)g->mig_pending;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t h, unsigned int *cur, unsigned int *pend) { LOCKED(mig_mode(h, cur, pend)); }

static nvmlReturn_t max_mig(nvmlDevice_t h, unsigned int *n) {
    struct gpu *g;
    nvmlReturn_t r = dev(h, -1, &g);
    if (r) return r;
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = g->mig_capable ? MAX_MIG_PER_GPU : 0; /* 0, not an error, on a GPU without MIG */
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t h, unsigned int *n) { LOCKED(max_mig(h, n)); }

static nvmlReturn_t mig_by_index(nvmlDevice_t h, unsigned int index, nvmlDevice_t *out) {
    struct gpu *g;
    nvmlReturn_t r = dev(h, -1, &g);
    if (r) return r;
    if (!g->mig_capable || !g->mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    if (!out || index >= MAX_MIG_PER_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    int parent = (int)(h - slots);
    unsigned int k = 0;
    for (int i = 0; i < cfg->nmigs; i++) {
        if (cfg->migs[i].gpu != parent) continue;
        if (k++ == index) {
            mig_slots[i].index = i;
            *out = &mig_slots[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}
API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t h, unsigned int index, nvmlDevice_t *out) {
    LOCKED(mig_by_index(h, index, out));
}

static nvmlReturn_t instance_id(nvmlDevice_t h, int compute, unsigned int *id) {
    struct gpu *g;
    struct mig *m;
    nvmlReturn_t r = mig_dev(h, &m, &g);
    if (r == NOT_A_MIG) { /* a GPU's handle has no instance id */
        r = dev(h, -1, &g);
        return r ? r : NVML_ERROR_NOT_SUPPORTED;
    }
    if (r) return r;
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    *id = compute ? m->ci : m->gi;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t h, unsigned int *id) { LOCKED(instance_id(h, 0, id)); }
API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t h, unsigned int *id) { LOCKED(instance_id(h, 1, id)); }

static nvmlReturn_t parent_of(nvmlDevice_t h, nvmlDevice_t *out) {
    struct gpu *g;
    struct mig *m;
    nvmlReturn_t r = mig_dev(h, &m, &g);
    if (r == NOT_A_MIG) {
        r = ready();
        return r ? r : NVML_ERROR_INVALID_ARGUMENT; /* not a MIG device handle */
    }
    if (r) return r;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    slots[m->gpu].index = m->gpu;
    *out = &slots[m->gpu];
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t h, nvmlDevice_t *out) { LOCKED(parent_of(h, out)); }

API nvmlReturn_t nvmlDeviceGetDriverModel(nvmlDevice_t h, int *cur, int *pend) {
    (void)cur; (void)pend; LOCKED(not_supported(h));
}
API nvmlReturn_t nvmlDeviceGetDriverModel_v2(nvmlDevice_t h, int *cur, int *pend) {
    (void)cur; (void)pend; LOCKED(not_supported(h));
}
API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t h, int type, int counter, unsigned long long *n) {
    (void)type; (void)counter; (void)n; LOCKED(not_supported(h));
}
API nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t h, int counter, unsigned int *v) {
    (void)counter; (void)v; LOCKED(not_supported(h));
}

/* The minor number of the device's node (/dev/nvidiaN is char 195:N), as nvml.h declares it. */
static nvmlReturn_t minor_number(nvmlDevice_t h, unsigned int *minor) {
    struct gpu *g;
    nvmlReturn_t r = dev(h, -1, &g);
    if (r) return r;
    if (!minor) return NVML_ERROR_INVALID_ARGUMENT;
    *minor = g->has_minor ? g->minor : (unsigned int)(h - slots);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t h, unsigned int *minor) { LOCKED(minor_number(h, minor)); }

static nvmlReturn_t is_mig(nvmlDevice_t h, unsigned int *is) {
    struct gpu *g;
    struct mig *m;
    nvmlReturn_t r = mig_dev(h, &m, &g);
    if (r == NOT_A_MIG) r = dev(h, -1, &g);
    if (r) return r;
    if (!is) return NVML_ERROR_INVALID_ARGUMENT;
    *is = h >= mig_slots && h < mig_slots + MAXMIG;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t h, unsigned int *is) { LOCKED(is_mig(h, is)); }

/* ---- processes ----
 * The size-query protocol of the real library: with *count smaller than the number of processes
 * (for example 0 with a NULL buffer), return INSUFFICIENT_SIZE and set *count to the number needed.
 * With 0 processes, a 0 count is a SUCCESS. */
static nvmlReturn_t running(nvmlDevice_t h, int ctx, unsigned int *count, void *buf, size_t stride) {
    struct gpu *g;
    struct mig *m = NULL;
    int gi;
    nvmlReturn_t r = mig_dev(h, &m, &g);
    if (r == NOT_A_MIG) {
        m = NULL;
        r = dev(h, ctx == CTX_C ? F_PROCS : F_GRAPHICS_PROCS, &g);
        if (r) return r;
        /* MIG on: the aggregate list over every instance is for privileged callers only */
        if (g->mig_mode && g->mig_denied) return NVML_ERROR_NO_PERMISSION;
        gi = (int)(h - slots);
    } else {
        if (r) return r;
        if (g->mig_procs_err) return g->mig_procs_err;
        gi = m->gpu;
    }
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = 0;
    /* one liveness check per holder: the list must be the same between the count and the copy */
    unsigned char *live = malloc((size_t)cfg->nprocs + 1);
    for (int i = 0; i < cfg->nprocs; i++) {
        const struct proc *p = &cfg->procs[i];
        live[i] = p->gpu == gi && (p->ctx & ctx) && on_instance(p, m) && holder_live(p);
        n += live[i];
    }
    if (*count < n || (n > 0 && !buf)) {
        *count = n;
        free(live);
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned int k = 0;
    for (int i = 0; i < cfg->nprocs; i++) {
        if (!live[i]) continue;
        const struct proc *p = &cfg->procs[i];
        char *slot = (char *)buf + (size_t)k * stride;
        if (stride == sizeof(nvmlProcessInfo_v1_t)) {
            nvmlProcessInfo_v1_t *o = (nvmlProcessInfo_v1_t *)slot;
            o->pid = p->pid;
            o->usedGpuMemory = p->mem;
        } else {
            nvmlProcessInfo_t *o = (nvmlProcessInfo_t *)slot;
            o->pid = p->pid;
            o->usedGpuMemory = p->mem;
            o->gpuInstanceId = g->mig_mode ? p->gi : NO_ID;
            o->computeInstanceId = g->mig_mode ? p->ci : NO_ID;
        }
        k++;
    }
    *count = k;
    free(live);
    return NVML_SUCCESS;
}

#define PROC_API(name, ctx, type) \
    API nvmlReturn_t name(nvmlDevice_t h, unsigned int *count, type *infos) { \
        LOCKED(running(h, ctx, count, infos, sizeof(type))); \
    }

PROC_API(nvmlDeviceGetComputeRunningProcesses, CTX_C, nvmlProcessInfo_v1_t)
PROC_API(nvmlDeviceGetGraphicsRunningProcesses, CTX_G, nvmlProcessInfo_v1_t)
#ifndef NO_V2
PROC_API(nvmlDeviceGetComputeRunningProcesses_v2, CTX_C, nvmlProcessInfo_t)
PROC_API(nvmlDeviceGetGraphicsRunningProcesses_v2, CTX_G, nvmlProcessInfo_t)
#endif
#ifndef NO_V3
PROC_API(nvmlDeviceGetComputeRunningProcesses_v3, CTX_C, nvmlProcessInfo_t)
PROC_API(nvmlDeviceGetGraphicsRunningProcesses_v3, CTX_G, nvmlProcessInfo_t)
#endif

/* No MPS server on the fake: an empty list. */
static nvmlReturn_t mps(nvmlDevice_t h, unsigned int *count) {
    struct gpu *g;
    nvmlReturn_t r = dev(h, -1, &g);
    if (r) return r;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t h, unsigned int *c, void *i) { (void)i; LOCKED(mps(h, c)); }
#ifndef NO_V2
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t h, unsigned int *c, void *i) { (void)i; LOCKED(mps(h, c)); }
#endif
#ifndef NO_V3
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t h, unsigned int *c, void *i) { (void)i; LOCKED(mps(h, c)); }
#endif

/* Per-process utilisation: one sample per holder with an sm value, stamped now (in microseconds);
 * only samples newer than lastSeenTimeStamp are returned. No sample at all: NVML_ERROR_NOT_FOUND. */
static nvmlReturn_t proc_util(nvmlDevice_t h, nvmlProcessUtilizationSample_t *out, unsigned int *count,
                              unsigned long long last_seen) {
    struct gpu *g;
    nvmlReturn_t r = dev(h, F_PROC_UTIL, &g); /* a MIG handle: NOT_SUPPORTED */
    if (r) return r;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->mig_mode) return NVML_ERROR_NOT_SUPPORTED; /* no per-process utilisation with MIG on */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned long long now = (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000;
    int gi = (int)(h - slots);
    unsigned int n = 0, k = 0;
    for (int pass = 0; pass < 2; pass++) {
        k = 0;
        for (int i = 0; i < cfg->nprocs; i++) {
            const struct proc *p = &cfg->procs[i];
            if (p->gpu != gi || p->sm < 0 || now <= last_seen || !holder_live(p)) continue;
            if (pass == 1) {
                if (k >= n) break;
                out[k].pid = p->pid;
                out[k].timeStamp = now;
                out[k].smUtil = (unsigned int)p->sm;
                out[k].memUtil = 0;
                out[k].encUtil = 0;
                out[k].decUtil = 0;
            }
            k++;
        }
        if (pass == 0) {
            n = k;
            if (n == 0) return NVML_ERROR_NOT_FOUND;
            if (!out || *count < n) {
                *count = n;
                return NVML_ERROR_INSUFFICIENT_SIZE;
            }
        }
    }
    *count = k;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t h, nvmlProcessUtilizationSample_t *s,
                                                 unsigned int *count, unsigned long long last_seen) {
    LOCKED(proc_util(h, s, count, last_seen));
}
