/* A stand-in for libnvidia-ml.so.1: the NVML entry points slurm-gpu calls, with the C
 * signatures and struct layouts of nvml.h, answering from a device table that the tests fill
 * through the fake_* control functions (tests/nvmlfake/driver.py loads a JSON driver profile
 * into it). Functions a driver branch lacks are left out of the symbol table by a linker
 * version script, so pynvml meets them exactly as on that driver (FUNCTION_NOT_FOUND).
 * Every nvml* entry point counts its calls, for the calls-per-reading benchmark, and each
 * nvmlDeviceGetFieldValues call also counts its batch (the field ids it asked, in order).
 * Not thread-safe: one reader at a time, like the sampler. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    OK = 0, E_UNINIT = 1, E_INVALID_ARG = 2, E_NOT_SUPPORTED = 3, E_NOT_FOUND = 6,
    E_INSUFFICIENT_SIZE = 7, E_TIMEOUT = 10, E_GPU_IS_LOST = 15, E_UNKNOWN = 999
};

#define MAXDEV 64
#define MAXFAIL 32
#define MAXPROC 64
#define MAXSAMPLES 128
#define MAXEVENTS 256
#define MAXSETS 16
#define MAXCALLS 128
#define MAXBATCHES 32
#define NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFULL

struct handle { int dev; unsigned gen; unsigned dgen; };
struct fail { char fn[64]; int code; };
struct proc { unsigned pid, gi, ci; unsigned long long mem; };
struct sample { unsigned long long ts; unsigned value; };

struct device {
    int used, parent, gi, ci, minor, lost_code, mig_mode, max_mig, gpm;
    unsigned dgen;
    char uuid[96], name[96], bus_id[32];
    long long v[64];                  /* numeric values, indexed by key (see keys[]) */
    struct fail fails[MAXFAIL]; int nfail;
    struct proc procs[MAXPROC]; int nproc;
    struct sample samples[MAXSAMPLES]; int nsample;
    struct handle *h;
};

static const char *keys[] = {
    "mem_total", "mem_used", "mem_reserved", "util_gpu", "util_mem", "power_mw", "energy_mj",
    "clock_sm", "clock_mem", "clocks_event_reasons", "temp_c", "pcie_tx_kbs", "pcie_rx_kbs",
    "pcie_tx_bytes", "pcie_rx_bytes", "nvlink_tx_kib", "nvlink_rx_kib", "ecc_sbe", "ecc_dbe",
    "cc_major", "cc_minor", "power_limit_mw", "violation_power_ns", "violation_thermal_ns",
    "gpm_sm_util", "gpm_sm_occupancy", "gpm_tensor_util", NULL
};
enum { K_MEM_TOTAL, K_MEM_USED, K_MEM_RESERVED, K_UTIL_GPU, K_UTIL_MEM, K_POWER, K_ENERGY,
    K_CLOCK_SM, K_CLOCK_MEM, K_REASONS, K_TEMP, K_PCIE_TX_KBS, K_PCIE_RX_KBS, K_PCIE_TX_BYTES,
    K_PCIE_RX_BYTES, K_NVL_TX, K_NVL_RX, K_ECC_SBE, K_ECC_DBE, K_CC_MAJOR, K_CC_MINOR,
    K_POWER_LIMIT, K_VIOL_POWER, K_VIOL_THERMAL, K_GPM_SM, K_GPM_OCC, K_GPM_TENSOR };

struct event { int dev; unsigned long long type, data; unsigned gi, ci; };
struct eventset { int alive; int reg[MAXDEV]; };
struct gpm_sample { int dev; unsigned gi; unsigned long long ts; int filled; };
struct call { const char *name; long long n; };
struct batch { char ids[160]; long long n; };

static struct device devs[MAXDEV];
static int ndev;
static unsigned gen = 1;
static int inited;
static int stale_code = E_GPU_IS_LOST;
static int init_code = OK;
static int proc_v3_bytes = 24;
static int event_wait_code = OK;
static unsigned long long now_us = 1700000000000000ULL;
static char driver_version[80] = "570.124.06";
static struct event events[MAXEVENTS];
static int nevents;
static struct eventset sets[MAXSETS];
static long long gpm_live;
static struct call calls[MAXCALLS];
static int ncalls;
static struct batch batches[MAXBATCHES];
static int nbatches;
static int samples_partial;  /* nvmlDeviceGetSamples fills what fits instead of failing */
static int absent_fields[64];
static int nabsent_fields;

static void count(const char *name) {
    for (int i = 0; i < ncalls; i++)
        if (calls[i].name == name || strcmp(calls[i].name, name) == 0) { calls[i].n++; return; }
    if (ncalls < MAXCALLS) { calls[ncalls].name = name; calls[ncalls].n = 1; ncalls++; }
}

/* Count one field batch by its ids ("83,185,..."), so tests see which fields were read. */
static void count_batch(int n, const unsigned *ids, size_t stride) {
    char key[160]; size_t len = 0; key[0] = 0;
    for (int i = 0; i < n && len + 12 < sizeof key; i++)
        len += (size_t)snprintf(key + len, sizeof key - len, i ? ",%u" : "%u",
                                *(const unsigned *)((const char *)ids + (size_t)i * stride));
    for (int i = 0; i < nbatches; i++)
        if (strcmp(batches[i].ids, key) == 0) { batches[i].n++; return; }
    if (nbatches < MAXBATCHES) { strcpy(batches[nbatches].ids, key); batches[nbatches].n = 1; nbatches++; }
}

static int find_fail(struct device *d, const char *fn) {
    for (int i = 0; i < d->nfail; i++)
        if (strcmp(d->fails[i].fn, fn) == 0 || strcmp(d->fails[i].fn, "*") == 0)
            return d->fails[i].code;
    return OK;
}

/* Resolve a handle to its device, or the error the driver would answer for it. */
static int dev_of(const struct handle *h, const char *fn, struct device **out) {
    if (!inited) return E_UNINIT;
    if (h == NULL || h->dev < 0 || h->dev >= ndev) return E_INVALID_ARG;
    if (h->gen != gen) return stale_code;                       /* driver reloaded */
    struct device *d = &devs[h->dev];
    if (h->dgen != d->dgen || !d->used) return E_INVALID_ARG;    /* MIG instance recreated */
    if (d->lost_code) return d->lost_code;
    if (d->parent >= 0 && devs[d->parent].lost_code) return devs[d->parent].lost_code;
    int code = find_fail(d, fn);
    if (code) return code;
    *out = d;
    return OK;
}

#define DEV(h) struct device *d = NULL; count(__func__); \
    { int _r = dev_of((const struct handle *)(h), __func__, &d); if (_r) return _r; }
#define LIB() count(__func__); if (!inited) return E_UNINIT;

static struct handle *handle_of(int i) {
    struct device *d = &devs[i];
    if (d->h == NULL || d->h->gen != gen || d->h->dgen != d->dgen) {
        d->h = calloc(1, sizeof *d->h);   /* old handles stay valid memory, but stale */
        d->h->dev = i; d->h->gen = gen; d->h->dgen = d->dgen;
    }
    return d->h;
}

static void copy_str(char *dst, unsigned len, const char *src) {
    if (len == 0) return;
    strncpy(dst, src, len - 1);
    dst[len - 1] = 0;
}

/* ------------------------------------------------------------------ control API */

API void fake_reset(void) {
    memset(devs, 0, sizeof devs); ndev = 0; gen = 1; inited = 0; stale_code = E_GPU_IS_LOST;
    init_code = OK; proc_v3_bytes = 24; event_wait_code = OK; nevents = 0;
    memset(sets, 0, sizeof sets); gpm_live = 0; ncalls = 0; nabsent_fields = 0; nbatches = 0;
    samples_partial = 0;
    now_us = 1700000000000000ULL; strcpy(driver_version, "570.124.06");
}
API void fake_set_driver(const char *version) { copy_str(driver_version, sizeof driver_version, version); }
API void fake_set_global(const char *key, long long value) {
    if (!strcmp(key, "stale_code")) stale_code = (int)value;
    else if (!strcmp(key, "init_code")) init_code = (int)value;
    else if (!strcmp(key, "proc_v3_bytes")) proc_v3_bytes = (int)value;
    else if (!strcmp(key, "event_wait_code")) event_wait_code = (int)value;
    else if (!strcmp(key, "now_us")) now_us = (unsigned long long)value;
    else if (!strcmp(key, "samples_partial")) samples_partial = (int)value;
    else if (!strcmp(key, "absent_field") && nabsent_fields < 64) absent_fields[nabsent_fields++] = (int)value;
}
API int fake_add_device(int parent, const char *uuid, const char *name, int minor, int gi, int ci) {
    if (ndev >= MAXDEV) return -1;
    struct device *d = &devs[ndev];
    memset(d, 0, sizeof *d);
    d->used = 1; d->parent = parent; d->gi = gi; d->ci = ci; d->minor = minor; d->dgen = 1;
    copy_str(d->uuid, sizeof d->uuid, uuid); copy_str(d->name, sizeof d->name, name);
    snprintf(d->bus_id, sizeof d->bus_id, "00000000:%02X:00.0", 0x18 + ndev);
    return ndev++;
}
API int fake_set(int i, const char *key, long long value) {
    if (i < 0 || i >= ndev) return -1;
    struct device *d = &devs[i];
    if (!strcmp(key, "lost_code")) { d->lost_code = (int)value; return 0; }
    if (!strcmp(key, "mig_mode")) { d->mig_mode = (int)value; return 0; }
    if (!strcmp(key, "max_mig")) { d->max_mig = (int)value; return 0; }
    if (!strcmp(key, "gpm")) { d->gpm = (int)value; return 0; }
    for (int k = 0; keys[k]; k++) if (!strcmp(keys[k], key)) { d->v[k] = value; return 0; }
    return -2;
}
API void fake_set_uuid(int i, const char *uuid) { copy_str(devs[i].uuid, sizeof devs[i].uuid, uuid); }
/* Destroy and recreate a MIG instance: its old handles answer INVALID_ARGUMENT. */
API void fake_recreate(int i, const char *uuid) { devs[i].dgen++; fake_set_uuid(i, uuid); }
API void fake_fail(int i, const char *fn, int code) {
    struct device *d = &devs[i];
    for (int k = 0; k < d->nfail; k++)
        if (!strcmp(d->fails[k].fn, fn)) { d->fails[k].code = code; return; }
    if (d->nfail < MAXFAIL) { copy_str(d->fails[d->nfail].fn, 64, fn); d->fails[d->nfail++].code = code; }
}
API void fake_add_process(int i, unsigned pid, unsigned long long mem, unsigned gi, unsigned ci) {
    struct device *d = &devs[i];
    if (d->nproc < MAXPROC) d->procs[d->nproc++] = (struct proc){pid, gi, ci, mem};
}
API void fake_clear_processes(int i) { devs[i].nproc = 0; }
API void fake_add_sample(int i, unsigned long long ts, unsigned value) {
    struct device *d = &devs[i];
    if (d->nsample == MAXSAMPLES) { memmove(d->samples, d->samples + 1, sizeof d->samples[0] * (MAXSAMPLES - 1)); d->nsample--; }
    d->samples[d->nsample++] = (struct sample){ts, value};
}
API void fake_push_event(int i, unsigned long long type, unsigned long long data, unsigned gi, unsigned ci) {
    if (nevents < MAXEVENTS) events[nevents++] = (struct event){i, type, data, gi, ci};
}
/* A driver reload: every handle handed out so far goes stale until nvmlInit runs again. */
API void fake_reload(void) { gen++; inited = 0; }
API long long fake_calls(const char *name) {
    long long total = 0;
    for (int i = 0; i < ncalls; i++) {
        if (name == NULL) total += calls[i].n;
        else if (!strcmp(calls[i].name, name)) return calls[i].n;
    }
    return total;
}
API int fake_call_name(int i, char *buf, unsigned len, long long *n) {
    if (i < 0 || i >= ncalls) return -1;
    copy_str(buf, len, calls[i].name); *n = calls[i].n; return 0;
}
API void fake_reset_calls(void) { ncalls = 0; nbatches = 0; }
API int fake_batch_name(int i, char *buf, unsigned len, long long *n) {
    if (i < 0 || i >= nbatches) return -1;
    copy_str(buf, len, batches[i].ids); *n = batches[i].n; return 0;
}
API long long fake_gpm_live(void) { return gpm_live; }
API int fake_registered(void) {
    int n = 0;
    for (int s = 0; s < MAXSETS; s++) if (sets[s].alive) for (int i = 0; i < ndev; i++) n += sets[s].reg[i];
    return n;
}
/* The driver breaks every event set handed out (e.g. after an Xid storm). */
API void fake_break_event_sets(void) { for (int s = 0; s < MAXSETS; s++) if (sets[s].alive) sets[s].alive = 2; }
API int fake_event_sets_alive(void) {
    int n = 0; for (int s = 0; s < MAXSETS; s++) n += sets[s].alive == 1; return n;
}

/* ------------------------------------------------------------------ library */

API nvmlReturn_t nvmlInitWithFlags(unsigned flags) {
    (void)flags; count(__func__);
    if (init_code) return init_code;
    inited++;
    return OK;
}
API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
API nvmlReturn_t nvmlShutdown(void) { count(__func__); if (!inited) return E_UNINIT; inited--; return OK; }
API const char *nvmlErrorString(nvmlReturn_t r) {
    static char buf[48]; snprintf(buf, sizeof buf, "fake NVML error %d", r); return buf;
}
API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned len) {
    LIB(); copy_str(version, len, driver_version); return OK;
}
static int physical_count(void) {
    int n = 0; for (int i = 0; i < ndev; i++) if (devs[i].parent < 0) n++; return n;
}
API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) { LIB(); *n = (unsigned)physical_count(); return OK; }
API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, struct handle **out) {
    LIB();
    unsigned k = 0;
    for (int i = 0; i < ndev; i++) {
        if (devs[i].parent >= 0) continue;
        if (k++ == index) {
            if (devs[i].lost_code) return devs[i].lost_code;
            *out = handle_of(i); return OK;
        }
    }
    return E_INVALID_ARG;
}

/* ------------------------------------------------------------------ identity */

API nvmlReturn_t nvmlDeviceGetUUID(void *h, char *buf, unsigned len) { DEV(h); copy_str(buf, len, d->uuid); return OK; }
API nvmlReturn_t nvmlDeviceGetName(void *h, char *buf, unsigned len) { DEV(h); copy_str(buf, len, d->name); return OK; }
API nvmlReturn_t nvmlDeviceGetMinorNumber(void *h, unsigned *m) {
    DEV(h); if (d->parent >= 0) return E_NOT_SUPPORTED; *m = (unsigned)d->minor; return OK;
}
API nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(void *h, unsigned *mw) {
    DEV(h); if (d->parent >= 0) return E_NOT_SUPPORTED; *mw = (unsigned)d->v[K_POWER_LIMIT]; return OK;
}
struct pci { char legacy[16]; unsigned domain, bus, device, dev_id, subsys; char bus_id[32]; };
API nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *h, struct pci *p) {
    DEV(h); memset(p, 0, sizeof *p); copy_str(p->bus_id, 32, d->bus_id); copy_str(p->legacy, 16, d->bus_id); return OK;
}
API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(void *h, int *major, int *minor) {
    DEV(h);
    struct device *p = d->parent >= 0 ? &devs[d->parent] : d;
    *major = (int)p->v[K_CC_MAJOR]; *minor = (int)p->v[K_CC_MINOR]; return OK;
}

/* ------------------------------------------------------------------ MIG */

API nvmlReturn_t nvmlDeviceGetMigMode(void *h, unsigned *current, unsigned *pending) {
    DEV(h); if (d->parent >= 0) return E_NOT_SUPPORTED; *current = *pending = (unsigned)d->mig_mode; return OK;
}
API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *h, unsigned *n) {
    DEV(h); *n = d->mig_mode ? (unsigned)d->max_mig : 0; return OK;
}
API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *h, unsigned index, struct handle **out) {
    DEV(h);
    int me = (int)(d - devs);
    unsigned k = 0;
    for (int i = 0; i < ndev; i++) {
        if (devs[i].parent != me) continue;
        if (k++ == index) { *out = handle_of(i); return OK; }
    }
    return index < (unsigned)d->max_mig ? E_NOT_FOUND : E_INVALID_ARG;
}
API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(void *h, unsigned *is) { DEV(h); *is = d->parent >= 0; return OK; }
API nvmlReturn_t nvmlDeviceGetGpuInstanceId(void *h, unsigned *id) {
    DEV(h); if (d->parent < 0) return E_NOT_SUPPORTED; *id = (unsigned)d->gi; return OK;
}
API nvmlReturn_t nvmlDeviceGetComputeInstanceId(void *h, unsigned *id) {
    DEV(h); if (d->parent < 0) return E_NOT_SUPPORTED; *id = (unsigned)d->ci; return OK;
}
API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(void *h, struct handle **out) {
    DEV(h); if (d->parent < 0) return E_INVALID_ARG; *out = handle_of(d->parent); return OK;
}

/* ------------------------------------------------------------------ metrics */

struct util { unsigned gpu, memory; };
API nvmlReturn_t nvmlDeviceGetUtilizationRates(void *h, struct util *u) {
    DEV(h); if (d->parent >= 0) return E_NOT_SUPPORTED;
    u->gpu = (unsigned)d->v[K_UTIL_GPU]; u->memory = (unsigned)d->v[K_UTIL_MEM]; return OK;
}
struct mem1 { unsigned long long total, free, used; };
struct mem2 { unsigned version; unsigned long long total, reserved, free, used; };
API nvmlReturn_t nvmlDeviceGetMemoryInfo(void *h, struct mem1 *m) {
    DEV(h);
    /* v1 counts the driver's reserved memory as used. */
    m->total = (unsigned long long)d->v[K_MEM_TOTAL];
    m->used = (unsigned long long)(d->v[K_MEM_USED] + d->v[K_MEM_RESERVED]);
    m->free = m->total - m->used; return OK;
}
API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *h, struct mem2 *m) {
    DEV(h);
    if (m->version != 0x02000028) return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    m->total = (unsigned long long)d->v[K_MEM_TOTAL]; m->reserved = (unsigned long long)d->v[K_MEM_RESERVED];
    m->used = (unsigned long long)d->v[K_MEM_USED]; m->free = m->total - m->used - m->reserved; return OK;
}
API nvmlReturn_t nvmlDeviceGetPowerUsage(void *h, unsigned *mw) { DEV(h); if (d->parent >= 0) return E_NOT_SUPPORTED; *mw = (unsigned)d->v[K_POWER]; return OK; }
API nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(void *h, unsigned long long *mj) {
    DEV(h); if (d->parent >= 0) return E_NOT_SUPPORTED; *mj = (unsigned long long)d->v[K_ENERGY]; return OK;
}
API nvmlReturn_t nvmlDeviceGetClockInfo(void *h, int type, unsigned *mhz) {
    DEV(h); if (d->parent >= 0) return E_NOT_SUPPORTED; *mhz = (unsigned)(type == 1 ? d->v[K_CLOCK_SM] : type == 2 ? d->v[K_CLOCK_MEM] : 0); return OK;
}
API nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(void *h, unsigned long long *r) {
    DEV(h); if (d->parent >= 0) return E_NOT_SUPPORTED; *r = (unsigned long long)d->v[K_REASONS]; return OK;
}
API nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(void *h, unsigned long long *r) {
    DEV(h); if (d->parent >= 0) return E_NOT_SUPPORTED; *r = (unsigned long long)d->v[K_REASONS]; return OK;
}
API nvmlReturn_t nvmlDeviceGetTemperature(void *h, int sensor, unsigned *c) {
    DEV(h); (void)sensor; if (d->parent >= 0) return E_INVALID_ARG; *c = (unsigned)d->v[K_TEMP]; return OK;
}
API nvmlReturn_t nvmlDeviceGetPcieThroughput(void *h, int counter, unsigned *kbs) {
    DEV(h); if (d->parent >= 0) return E_INVALID_ARG;
    *kbs = (unsigned)(counter == 0 ? d->v[K_PCIE_TX_KBS] : d->v[K_PCIE_RX_KBS]); return OK;
}
API nvmlReturn_t nvmlDeviceGetTotalEccErrors(void *h, int type, int counter, unsigned long long *n) {
    DEV(h); if (d->parent >= 0) return E_NOT_SUPPORTED; (void)counter; *n = (unsigned long long)(type == 0 ? d->v[K_ECC_SBE] : d->v[K_ECC_DBE]); return OK;
}
struct violation { unsigned long long reference, violation; };
API nvmlReturn_t nvmlDeviceGetViolationStatus(void *h, int policy, struct violation *v) {
    DEV(h); v->reference = now_us * 1000ULL;
    v->violation = (unsigned long long)(policy == 0 ? d->v[K_VIOL_POWER] : policy == 1 ? d->v[K_VIOL_THERMAL] : 0);
    return OK;
}

struct field_value {
    unsigned field_id, scope_id; long long timestamp, latency_us; int value_type; int ret;
    union { double d; unsigned ui; unsigned long ul; unsigned long long ull; long long sll; } value;
};
static int field(struct device *d, unsigned id, unsigned long long *out) {
    char name[16];
    snprintf(name, sizeof name, "FI_%u", id);
    int code = find_fail(d, name);
    if (code) return code;
    if (d->parent >= 0) return E_NOT_SUPPORTED;  /* counters belong to the whole GPU */
    for (int i = 0; i < nabsent_fields; i++) if (absent_fields[i] == (int)id) return E_NOT_SUPPORTED;
    switch (id) {
    case 3: *out = (unsigned long long)d->v[K_ECC_SBE]; return OK;
    case 4: *out = (unsigned long long)d->v[K_ECC_DBE]; return OK;
    case 74: *out = (unsigned long long)d->v[K_VIOL_POWER]; return OK;
    case 75: *out = (unsigned long long)d->v[K_VIOL_THERMAL]; return OK;
    case 83: *out = (unsigned long long)d->v[K_ENERGY]; return OK;
    case 138: *out = (unsigned long long)d->v[K_NVL_TX]; return OK;
    case 139: *out = (unsigned long long)d->v[K_NVL_RX]; return OK;
    case 185: case 186: *out = (unsigned long long)d->v[K_POWER]; return OK;
    case 197: if (d->parent >= 0) return E_NOT_SUPPORTED; *out = (unsigned long long)d->v[K_PCIE_TX_BYTES]; return OK;
    case 198: if (d->parent >= 0) return E_NOT_SUPPORTED; *out = (unsigned long long)d->v[K_PCIE_RX_BYTES]; return OK;
    default: return E_NOT_SUPPORTED;
    }
}
API nvmlReturn_t nvmlDeviceGetFieldValues(void *h, int n, struct field_value *values) {
    DEV(h);
    count_batch(n, &values[0].field_id, sizeof values[0]);
    for (int i = 0; i < n; i++) {
        struct field_value *f = &values[i];
        f->timestamp = (long long)now_us; f->latency_us = 0; f->value_type = 3; /* ULL */
        f->ret = field(d, f->field_id, &f->value.ull);
    }
    return OK;
}

/* Process lists: entries are written with the stride of the struct version the driver uses. */
static nvmlReturn_t procs(struct device *d, unsigned *n, unsigned char *out, int stride, int version) {
    int me = (int)(d - devs);
    struct proc *list[MAXPROC]; int k = 0;
    if (d->parent >= 0) {  /* a MIG handle sees its own instance's processes */
        struct device *p = &devs[d->parent];
        for (int i = 0; i < p->nproc; i++)
            if (p->procs[i].gi == (unsigned)d->gi && p->procs[i].ci == (unsigned)d->ci) list[k++] = &p->procs[i];
    } else {
        for (int i = 0; i < d->nproc; i++) list[k++] = &d->procs[i];
    }
    (void)me;
    if (out == NULL || *n < (unsigned)k) { *n = (unsigned)k; return k ? E_INSUFFICIENT_SIZE : OK; }
    for (int i = 0; i < k; i++) {
        unsigned char *e = out + (size_t)i * (size_t)stride;
        memset(e, 0, (size_t)stride);
        memcpy(e, &list[i]->pid, 4);
        unsigned long long mem = d->parent < 0 && d->mig_mode ? NOT_AVAILABLE : list[i]->mem;
        memcpy(e + 8, &mem, 8);
        if (version >= 2) { memcpy(e + 16, &list[i]->gi, 4); memcpy(e + 20, &list[i]->ci, 4); }
    }
    *n = (unsigned)k;
    return OK;
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(void *h, unsigned *n, void *out) { DEV(h); return procs(d, n, out, 16, 1); }
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(void *h, unsigned *n, void *out) { DEV(h); return procs(d, n, out, 24, 2); }
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned *n, void *out) { DEV(h); return procs(d, n, out, proc_v3_bytes, 3); }

struct nsample { unsigned long long ts; union { double d; unsigned ui; unsigned long long ull; } v; };
API nvmlReturn_t nvmlDeviceGetSamples(void *h, int type, unsigned long long since, int *vtype, unsigned *n, struct nsample *out) {
    DEV(h); (void)type;
    if (d->parent >= 0) return E_INVALID_ARG;
    unsigned k = 0;
    for (int i = 0; i < d->nsample; i++) if (d->samples[i].ts > since) k++;
    if (k == 0) return E_NOT_FOUND;
    *vtype = 1; /* NVML_VALUE_TYPE_UNSIGNED_INT */
    if (out == NULL) { *n = k; return OK; }
    if (*n < k && !samples_partial) return E_INSUFFICIENT_SIZE;
    unsigned j = 0;  /* with samples_partial: the oldest that fit (NVML: "the number of entries
                        which can be accommodated in the provided samples array") */
    for (int i = 0; i < d->nsample && j < *n; i++)
        if (d->samples[i].ts > since) { out[j].ts = d->samples[i].ts; out[j].v.ull = 0; out[j].v.ui = d->samples[i].value; j++; }
    *n = j;
    return OK;
}

/* ------------------------------------------------------------------ events */

struct event_data { struct handle *device; unsigned long long type, data; unsigned gi, ci; };
API nvmlReturn_t nvmlEventSetCreate(struct eventset **out) {
    LIB();
    for (int s = 0; s < MAXSETS; s++)
        if (!sets[s].alive) { memset(&sets[s], 0, sizeof sets[s]); sets[s].alive = 1; *out = &sets[s]; return OK; }
    return 20; /* NVML_ERROR_MEMORY */
}
API nvmlReturn_t nvmlDeviceRegisterEvents(void *h, unsigned long long types, struct eventset *set) {
    DEV(h); (void)types;
    if (d->parent >= 0) return E_NOT_SUPPORTED;
    if (set == NULL || !set->alive) return E_INVALID_ARG;
    set->reg[d - devs] = 1; return OK;
}
API nvmlReturn_t nvmlEventSetWait_v2(struct eventset *set, struct event_data *data, unsigned timeout_ms) {
    LIB(); (void)timeout_ms;
    if (set == NULL || !set->alive) return E_INVALID_ARG;
    if (set->alive == 2) return E_UNKNOWN;
    if (event_wait_code) return event_wait_code;
    for (int i = 0; i < nevents; i++) {
        if (!set->reg[events[i].dev]) continue;
        struct event e = events[i];
        memmove(&events[i], &events[i + 1], sizeof events[0] * (size_t)(nevents - i - 1)); nevents--;
        data->device = handle_of(e.dev); data->type = e.type; data->data = e.data; data->gi = e.gi; data->ci = e.ci;
        return OK;
    }
    return E_TIMEOUT;
}
API nvmlReturn_t nvmlEventSetFree(struct eventset *set) {
    LIB(); if (set == NULL || !set->alive) return E_INVALID_ARG; set->alive = 0; return OK;
}

/* ------------------------------------------------------------------ GPM */

struct gpm_support { unsigned version, supported; };
API nvmlReturn_t nvmlGpmQueryDeviceSupport(void *h, struct gpm_support *s) {
    DEV(h); if (s->version != 1) return 25; s->supported = d->parent < 0 && d->gpm; return OK;
}
API nvmlReturn_t nvmlGpmSampleAlloc(struct gpm_sample **out) {
    LIB(); *out = calloc(1, sizeof **out); (*out)->dev = -1; gpm_live++; return OK;
}
API nvmlReturn_t nvmlGpmSampleFree(struct gpm_sample *s) { LIB(); if (s == NULL) return E_INVALID_ARG; free(s); gpm_live--; return OK; }
API nvmlReturn_t nvmlGpmSampleGet(void *h, struct gpm_sample *s) {
    DEV(h);
    if (d->parent >= 0 || !d->gpm) return E_NOT_SUPPORTED;
    s->dev = (int)(d - devs); s->gi = 0xFFFFFFFFu; s->ts = now_us; s->filled = 1; return OK;
}
API nvmlReturn_t nvmlGpmMigSampleGet(void *h, unsigned gi, struct gpm_sample *s) {
    DEV(h);
    if (d->parent >= 0 || !d->gpm) return E_NOT_SUPPORTED;
    for (int i = 0; i < ndev; i++)
        if (devs[i].parent == d - devs && devs[i].gi == (int)gi) {
            s->dev = i; s->gi = gi; s->ts = now_us; s->filled = 1; return OK;
        }
    return E_NOT_FOUND;
}
struct metric_info { const char *short_name, *long_name, *unit; };
struct gpm_metric { unsigned id; int ret; double value; struct metric_info info; };
struct gpm_get { unsigned version, n; struct gpm_sample *s1, *s2; struct gpm_metric metrics[210]; };
API nvmlReturn_t nvmlGpmMetricsGet(struct gpm_get *g) {
    LIB();
    if (g->version != 1 || !g->s1 || !g->s2 || !g->s1->filled || !g->s2->filled) return E_INVALID_ARG;
    if (g->s1->dev != g->s2->dev) return E_INVALID_ARG;
    struct device *d = &devs[g->s2->dev];
    /* NVML needs the two samples at least 100 ms apart for a meaningful rate. */
    int too_close = g->s2->ts < g->s1->ts + 100000ULL;
    for (unsigned i = 0; i < g->n; i++) {
        struct gpm_metric *m = &g->metrics[i];
        int k = m->id == 2 ? K_GPM_SM : m->id == 3 ? K_GPM_OCC : m->id == 5 ? K_GPM_TENSOR : -1;
        if (k < 0) { m->ret = E_NOT_SUPPORTED; continue; }
        if (too_close) { m->ret = E_INVALID_ARG; continue; }
        m->ret = OK; m->value = (double)d->v[k] / 1000.0;
    }
    return OK;
}
